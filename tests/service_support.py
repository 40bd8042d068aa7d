"""A real `imqbridgemgr serve` process, the CLI (in this process, or as one), and messages sent to and taken
from a service's queues over mq://, for end-to-end tests."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

from bridgemgr import connect
from bridgemgr.admin.portmapper import find_service
from bridgemgr.jms import DeliveryMode, Message, Queue, TextMessage

ROOT = Path(__file__).resolve().parents[1]


class Daemon:
    """`imqbridgemgr serve -props PROPS`, up once it printed "Running" and (unless
    ``settle`` is false) every bridge's start has ended: serve prints "bridge NAME (TYPE):
    STATE" for each, again when a STARTING one is done. ``address`` is its port mapper
    (what -b takes); ``bridges`` the last state printed per bridge."""

    def __init__(self, props: Path, *args: str, settle: bool = True) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bridgemgr.cli", "serve", "-props", str(props), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self.bridges: dict[str, str] = {}
        running = False
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if m := re.match(r"port mapper: (\S+):(\d+)", line):
                self.address = f"{m.group(1)}:{m.group(2)}"
            if m := re.match(r"bridge (\S+) \(\w+\): (\w+)$", line):
                self.bridges[m.group(1)] = m.group(2)
            running = running or "Running" in line
            if running and not (settle and "STARTING" in self.bridges.values()):
                return
        raise AssertionError(f"serve did not come up: {self.lines}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.communicate(timeout=60)


def cli(daemon: Daemon, passfile: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`imqbridgemgr ARGS -b <daemon> -u admin -passfile PASSFILE -f`, run in this process
    (click's runner: the same command code, exit status, stdout and stderr as the process
    gives, without a Python start per call, which made every wait that polls the service
    through the CLI cost a core; ``timeout`` is pytest-timeout's here). tests/test_cli_native.py
    and cli_process() run the command as a process."""
    from click.testing import CliRunner

    from bridgemgr.cli import PROG, main

    argv = [*args, "-b", daemon.address, "-u", "admin", "-passfile", str(passfile), "-f"]
    result = CliRunner().invoke(main, argv, prog_name=PROG)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess([PROG, *argv], result.exit_code, result.stdout, result.stderr)


def cli_process(daemon: Daemon, passfile: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`imqbridgemgr ARGS -b <daemon> -u admin -passfile PASSFILE -f` as a process."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "bridgemgr.cli",
            *args,
            "-b",
            daemon.address,
            "-u",
            "admin",
            "-passfile",
            str(passfile),
            "-f",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def one_bridge_files(
    base: Path, instance: str, xml: str, password: str, *extra: str, activelist: str = "jb"
) -> tuple[Path, Path]:
    """A service's files under ``base``: jb.xml (``xml``, the JMS bridge jb), broker
    properties with an admin login (``extra`` lines appended) and the admin passfile.
    Returns (properties file, passfile)."""
    (base / "jb.xml").write_text(xml)
    props = base / "broker.properties"
    lines = [
        f"imq.varhome={base / 'var'}",
        f"imq.instancename={instance}",
        "imq.portmapper.port=0",
        "imq.bridge.enabled=true",
        "imq.bridge.admin.user=admin",
        f"imq.bridge.admin.password={password}",
        f"imq.bridge.activelist={activelist}",
        "imq.bridge.jb.type=jms",
        "imq.bridge.jb.xmlurl=jb.xml",
        *extra,
    ]
    props.write_text("\n".join(lines) + "\n")
    passfile = base / "pw.properties"
    passfile.write_text(f"imq.imqbridgemgr.password={password}\n")
    return props, passfile


def send(daemon: Daemon, password: str, queue: str, *messages: str | tuple[str, DeliveryMode]) -> list[str]:
    """Send each text (persistent) or (text, delivery mode) to ``queue`` of the service, as
    admin; their message ids."""
    with connect(f"mq://{daemon.address}", username="admin", password=password) as conn:
        producer = conn.create_session().create_producer(Queue(queue))
        ids = []
        for item in messages:
            text, mode = (item, DeliveryMode.PERSISTENT) if isinstance(item, str) else item
            message = TextMessage(text)
            producer.send(message, delivery_mode=mode)
            ids.append(message.message_id)
        return ids


def take(
    daemon: Daemon, password: str, queue: str, expect: int = 0, wait: float = 30.0, quiet: float = 1.0
) -> list[Message]:
    """Consume ``queue`` of the service: ``expect`` messages (waiting up to ``wait`` s),
    then whatever else comes within ``quiet`` seconds."""
    got: list[Message] = []
    with connect(f"mq://{daemon.address}", username="admin", password=password) as conn:
        conn.start()
        consumer = conn.create_session().create_consumer(Queue(queue))
        deadline = time.monotonic() + wait
        while len(got) < expect and time.monotonic() < deadline:
            if (m := consumer.receive(0.5)) is not None:
                got.append(m)
        while (m := consumer.receive(quiet)) is not None:
            got.append(m)
    return got


def link_row(daemon: Daemon, passfile: Path, link: str, bridge: str = "jb") -> list[str]:
    """The row of ``link`` in `imqbridgemgr list link -bn BRIDGE`, split into words."""
    r = cli(daemon, passfile, "list", "link", "-bn", bridge, "-v")
    assert r.returncode == 0, r.stdout + r.stderr
    return next(line.split() for line in r.stdout.splitlines() if line.startswith(link + " "))


class Stomp:
    """A STOMP 1.2 client on a socket: frames as (command, headers, body)."""

    def __init__(self, port: int, login: str, passcode: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""
        self.write("CONNECT", {"accept-version": "1.2", "login": login, "passcode": passcode})
        assert self.frame()[0] == "CONNECTED"

    def write(self, command: str, headers: dict[str, str], body: str = "") -> None:
        head = "".join(f"{k}:{v}\n" for k, v in headers.items())
        self.sock.sendall(f"{command}\n{head}\n{body}\0".encode())

    def frame(self) -> tuple[str, dict[str, str], str]:
        while b"\0" not in self.buf.lstrip(b"\r\n"):
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed; got {self.buf!r}")
            self.buf += chunk
        self.buf = self.buf.lstrip(b"\r\n")
        raw, self.buf = self.buf.split(b"\0", 1)
        head, _, body = raw.decode().partition("\n\n")
        command, *lines = head.split("\n")
        return command, dict(line.split(":", 1) for line in lines), body

    def send(
        self, destination: str, body: str, receipt: str, persistent: bool = True
    ) -> tuple[str, dict[str, str], str]:
        self.write(
            "SEND",
            {"destination": destination, "receipt": receipt, "persistent": "true" if persistent else "false"},
            body,
        )
        return self.frame()

    def close(self) -> None:
        self.sock.close()


def stomp_port(daemon: Daemon) -> int:
    host, port = daemon.address.split(":")
    return find_service(host, int(port), ("stomp",)).port


# A transformer that fails a message whose text starts with "bad" (module failonbad, for a
# plugin folder), and a bridge jb whose link l1 moves PREFIX.src to PREFIX.dst through it,
# a transform failure consumed without transfer: the DMQ gets the bad ones.
FAIL_ON_BAD = """
from bridgemgr.transform import MessageTransformer


class FailOnBad(MessageTransformer):
    def transform(self, message, *args):
        if message.text.startswith("bad"):
            raise ValueError("bad message")
        return message
"""


def fail_on_bad_bridge(prefix: str) -> str:
    """The bridge XML of jb: link l1 from ``prefix``.src to ``prefix``.dst through FailOnBad."""
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb">
  <link name="l1" transacted="false">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst"
            message-transformer-class="failonbad.FailOnBad" consume-no-transfer-on-transform-error="true"/>
  </link>
  <connection-factory ref-name="host"/>
  <destination ref-name="src" name="{prefix}.src"/>
  <destination ref-name="dst" name="{prefix}.dst"/>
</jmsbridge>
"""


def console_service_overrides(base: Path, xml: str, password: str, *extra: str) -> list[str]:
    """Broker properties (for load_properties(overrides=...)) of an in-process service in
    ``base`` with bridge jb (``xml``, FailOnBad in its plugin folder), admin ``password``,
    free ports and the management port on a free port; ``extra`` is added."""
    (base / "jb.xml").write_text(xml)
    (base / "plugins").mkdir()
    (base / "plugins" / "failonbad.py").write_text(FAIL_ON_BAD)
    return [
        f"imq.varhome={base / 'var'}",
        "imq.portmapper.port=0",
        "imq.jms.tcp.port=0",
        "imq.bridge.enabled=true",
        "imq.bridge.activelist=jb",
        "imq.bridge.jb.type=jms",
        f"imq.bridge.jb.xmlurl={base / 'jb.xml'}",
        "imq.bridge.admin.user=admin",
        f"imq.bridge.admin.password={password}",
        "imq.bridge.admin.port=0",
        f"imq.bridge.transformer.path={base / 'plugins'}",
        "imq.console.port=0",
        *extra,
    ]
