"""Memory of a real `serve` holding a backlog, or of a link moving big messages; prints JSON.

    .venv/bin/python benchmarks/memory.py [--messages N] [--check] [--window W]
    .venv/bin/python benchmarks/memory.py --link-size BYTES [--messages N] [--window-bytes SIZE]
                                          [--link-source host|mq|URL] [--first-run K]

--link-size: a JMS bridge link moving a backlog of N persistent messages of BYTES each
(BytesMessages) from src to dst on one embedded broker in a process of its own, its
destinations keeping 16 waiting messages in memory (the rest stays in the store), so the
process's peak RSS while the link runs (VmHWM, reset once the backlog is in: /proc's
clear_refs) is what the link holds: its open unit and what it has received. The link
runs with the defaults (imq.bridge.<name>.link.window 1000) and --window-bytes as
imq.bridge.<name>.link.windowBytes (default: the property's default). With
--link-source mq the source queue is on a second embedded broker in a child process
(the same 16 in memory), reached over mq:// as a link's remote source is: what the
link's consumer prefetches is then in the link's process too. --link-source URL, an
amqp:// or stomp:// URL with user:password@ (a RabbitMQ, say), puts the source queue on
that broker, whose prefetch counts messages (the link bounds it with the size of its
largest message). --first-run K moves K messages with a bridge that is then stopped, and
measures a new bridge over the same folder, as after a restart of the service.
--target-rate R makes the target the slow side, as a slow or held target is: dst holds
at most 16 messages (FLOW_CONTROL) and is consumed at R messages/s, so what the link's
consumer prefetches meanwhile (all of a backlog, without a bound) is in the peak. Reported:
peak_rss_mb_filling, peak_rss_mb_linking, messages_per_s (the link's), in_order.

One STOMP producer (a raw socket, STOMP 1.2) sends N persistent 1 KiB messages to a queue
nobody consumes, a receipt every 1,000 to keep up with the broker. The service's RSS is read
from /proc/<pid>/status: VmHWM (peak) and VmRSS. Then serve is stopped (SIGTERM) and started
again on the same store; "restart_to_first_delivery_s" runs from starting the process to the
first MESSAGE a subscriber gets. With --check the subscriber takes every message (auto ack)
and checks each carries the next number; without it, only the first.

Reported: messages_per_s while flooding, peak_rss_mb flooding (the first process's VmHWM)
and after the restart (the second process's VmHWM, at the end), restart_to_first_delivery_s,
and delivered_in_order (null without --check).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[0] = str(ROOT)  # not benchmarks/, whose stomp.py would hide the stomp library

PASSWORD = "memory-bench-secret"
QUEUE = "/queue/backlog"
BODY_SIZE = 1024
RECEIPT_EVERY = 1000


def rss_mb(pid: int) -> dict[str, float]:
    """VmHWM and VmRSS of ``pid`` in MB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            out[key] = round(int(value.split()[0]) / 1024, 1)
    return out


class Serve:
    """`imqbridgemgr serve` with the STOMP bridge only, up once it says the bridge started
    (its output goes to a file: nobody has to keep reading it)."""

    def __init__(self, props: Path, log: Path) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.started = time.monotonic()
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bridgemgr.cli", "serve", "-props", str(props)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        try:
            self.port = self._wait(log)
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            raise

    def _wait(self, log: Path) -> int:
        """The STOMP port, once the bridge started."""
        address = None
        while True:
            text = log.read_text()
            if m := re.search(r"^port mapper: (\S+):(\d+)", text, re.M):
                address = (m.group(1), int(m.group(2)))
            if address and re.search(r"^bridge stomp \(\w+\): STARTED$", text, re.M):
                break
            if self.proc.poll() is not None or time.monotonic() - self.started > 600:
                raise RuntimeError("serve did not come up:\n" + text)
            time.sleep(0.02)
        from bridgemgr.admin.portmapper import find_service

        return find_service(address[0], address[1], ("stomp",)).port

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=300)


class Stomp:
    """A STOMP 1.2 client on a raw socket: frames out, frames in (headers and body)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.sock.sendall(f"CONNECT\naccept-version:1.2\nhost:bench\nlogin:admin\npasscode:{PASSWORD}\n\n\0".encode())
        command, _, _ = self.frame()
        if command != "CONNECTED":
            raise RuntimeError(f"STOMP login refused: {command}")

    def frame(self) -> tuple[str, dict[str, str], bytes]:
        while True:
            while self.buf[:1] in (b"\n", b"\r"):
                del self.buf[:1]
            end = self.buf.find(b"\n\n")
            if end >= 0:
                head = self.buf[:end].decode().split("\n")
                headers = dict(h.split(":", 1) for h in head[1:])
                start = end + 2
                if "content-length" in headers:
                    stop = start + int(headers["content-length"])
                    if len(self.buf) > stop:
                        body = bytes(self.buf[start:stop])
                        del self.buf[: stop + 1]
                        return head[0], headers, body
                else:
                    stop = self.buf.find(b"\0", start)
                    if stop >= 0:
                        body = bytes(self.buf[start:stop])
                        del self.buf[: stop + 1]
                        return head[0], headers, body
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise RuntimeError("the service closed the STOMP connection")
            self.buf += chunk

    def close(self) -> None:
        self.sock.close()


def flood(port: int, count: int) -> float:
    """Send ``count`` persistent messages numbered 0.. ; seconds taken (all receipted)."""
    client = Stomp(port)
    pad = b"x" * BODY_SIZE
    begin = time.monotonic()
    outstanding = 0
    batch = bytearray()
    for i in range(count):
        body = (b"%012d" % i + pad)[:BODY_SIZE]
        receipt = f"receipt:r{i}\n" if (i + 1) % RECEIPT_EVERY == 0 or i == count - 1 else ""
        batch += (
            (f"SEND\ndestination:{QUEUE}\npersistent:true\n{receipt}content-length:{BODY_SIZE}\n\n").encode()
            + body
            + b"\0"
        )
        if receipt:
            client.sock.sendall(batch)
            batch.clear()
            outstanding += 1
            while outstanding > 1:  # one batch in flight while the next is sent
                command, headers, body = client.frame()
                if command != "RECEIPT":
                    raise RuntimeError(f"{command} {headers} {body[:200]!r}")
                outstanding -= 1
    while outstanding:
        command, headers, body = client.frame()
        if command != "RECEIPT":
            raise RuntimeError(f"{command} {headers} {body[:200]!r}")
        outstanding -= 1
    seconds = time.monotonic() - begin
    client.close()
    return seconds


def drain(port: int, count: int, check: bool) -> tuple[float, bool | None]:
    """Subscribe; the time the first message arrived (monotonic) and, with ``check``, whether
    all ``count`` came in order."""
    client = Stomp(port)
    client.sock.sendall(f"SUBSCRIBE\nid:1\ndestination:{QUEUE}\nack:auto\n\n\0".encode())
    first = None
    expected = 0
    in_order = True
    while True:
        command, headers, body = client.frame()
        if command != "MESSAGE":
            raise RuntimeError(f"{command} {headers} {body[:200]!r}")
        if first is None:
            first = time.monotonic()
            if not check:
                break
        if int(body[:12]) != expected:
            in_order = False
        expected += 1
        if expected == count:
            break
    client.close()
    return first, (in_order and expected == count) if check else None


LINK_XML = """<jmsbridge name="mem">
<link name="big" transacted="false">
<source connection-factory-ref="{source}" destination-ref="src"/>
<target connection-factory-ref="host" destination-ref="dst"/></link>
<dmq name="built-in-dmq" connection-factory-ref="host" destination-ref="dst"/>
<connection-factory ref-name="host"/>
<connection-factory ref-name="far" lookup-name="ConnectionFactory">{far}</connection-factory>
<destination ref-name="src" name="{src}"/><destination ref-name="dst" name="dst"/>
</jmsbridge>"""


def far_environment(url: str) -> dict[str, str]:
    """The JNDI environment of a source at ``url`` (mq://, amqp://, stomp://; a stomp://
    URL's user:password@ become the principal and credentials)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    initial = {"mq": "imq.embedded", "amqp": "imq.amqp", "stomp": "imq.stomp"}[parts.scheme]
    env = {"java.naming.factory.initial": initial, "java.naming.provider.url": url}
    if parts.scheme == "stomp" and parts.username:
        env.update(
            {
                "java.naming.provider.url": f"stomp://{parts.hostname}:{parts.port}",
                "java.naming.security.principal": parts.username,
                "java.naming.security.credentials": parts.password or "",
            }
        )
    return env


def serve_source(store: str) -> None:
    """--serve-source: a broker keeping 16 waiting messages in memory, its jms service
    and port mapper on 127.0.0.1; prints the port mapper's port, runs until stdin ends."""
    from bridgemgr.admin.portmapper import PortMapper
    from bridgemgr.netloop import NetLoop
    from bridgemgr.providers.embedded import Broker
    from bridgemgr.providers.embedded.jmsservice import JmsService

    broker = Broker(store, memory_window=16)
    netloop = NetLoop().start()
    service = JmsService(broker, netloop, "127.0.0.1", 0).start()
    portmapper = PortMapper(netloop, "127.0.0.1", 0, broker.instance_name).start()
    portmapper.register(service.service_entry())
    print(portmapper.port, flush=True)
    sys.stdin.read()
    service.stop()
    portmapper.stop()
    netloop.stop()
    broker.close()


def link_big(
    messages: int, size: int, window_bytes: str | None, source: str, first_run: int = 0, target_rate: float = 0
) -> dict[str, object]:
    """The --link-size run (one per process: VmHWM is the process's)."""
    import threading
    import uuid
    from xml.sax.saxutils import quoteattr

    from bridgemgr.jms import BytesMessage, Queue, naming
    from bridgemgr.jmsbridge.bridge import JMSBridge
    from bridgemgr.jmsbridge.config import parse_bridge_config
    from bridgemgr.props import load_properties
    from bridgemgr.providers.embedded import Broker, DestinationLimits, EmbeddedConnectionFactory
    from bridgemgr.providers.embedded.queues import LimitBehavior

    tmp = Path(tempfile.mkdtemp(prefix="memory-link-"))
    broker = Broker(tmp / "store", memory_window=16)
    child = None
    far = (
        '<property name="java.naming.factory.initial" value="imq.embedded"/>'  # (unused)
        '<property name="java.naming.provider.url" value="mq://127.0.0.1:0"/>'
    )
    src = f"memory.{uuid.uuid4().hex[:8]}"
    try:
        factory = EmbeddedConnectionFactory(broker)
        source_factory: Any = factory
        if source != "host":
            url = source
            if source == "mq":
                child = subprocess.Popen(
                    [sys.executable, __file__, "--serve-source", str(tmp / "source")],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    env=dict(os.environ, PYTHONPATH=str(ROOT)),
                )
                assert child.stdout is not None
                url = f"mq://127.0.0.1:{int(child.stdout.readline())}"
            env = far_environment(url)
            source_factory = naming.lookup("ConnectionFactory", env)
            far = "".join(f"<property name={quoteattr(k)} value={quoteattr(v)}/>" for k, v in env.items())

        def fill(first: int, count: int) -> None:
            conn = source_factory.create_connection()
            producer = conn.create_session().create_producer(Queue(src))
            for i in range(first, first + count):
                producer.send(BytesMessage(i.to_bytes(4, "big") + os.urandom(size - 4)))
            conn.close()

        xml = LINK_XML.format(source="far" if source != "host" else "host", far=far, src=src).encode()
        (tmp / "memory.xml").write_bytes(xml)
        overrides = [
            f"imq.varhome={tmp / 'var'}",
            "imq.bridge.mem.type=jms",
            f"imq.bridge.mem.xmlurl={tmp / 'memory.xml'}",
        ] + ([f"imq.bridge.mem.link.windowBytes={window_bytes}"] if window_bytes else [])
        props = load_properties([], overrides, environ={})

        def run(count: int) -> float:
            bridge = JMSBridge(parse_bridge_config(xml, "memory.xml"), props, host_factory=lambda env: factory)
            started = time.monotonic()
            bridge.start()
            link = bridge.links[0]
            while link.counters.transferred < count:
                time.sleep(0.05)
            seconds = time.monotonic() - started
            bridge.stop()
            return seconds

        if first_run:  # a service that ran the link before: it knows the messages' size
            fill(0, first_run)
            run(first_run)
        fill(first_run, messages)
        got: list[int] = []
        conn = factory.create_connection()
        conn.start()
        consumer = conn.create_session().create_consumer(Queue("dst"))
        for _ in range(first_run):
            m = consumer.receive(5)
            assert m is not None
            got.append(int.from_bytes(m.get_body()[:4], "big"))
        slow = None
        if target_rate:
            broker.configure_destination(
                Queue("dst"), DestinationLimits(max_num_msgs=16, limit_behavior=LimitBehavior.FLOW_CONTROL)
            )

            def consume_slowly() -> None:
                while len(got) < first_run + messages and (m := consumer.receive(10)) is not None:
                    got.append(int.from_bytes(m.get_body()[:4], "big"))
                    time.sleep(1 / target_rate)

            slow = threading.Thread(target=consume_slowly, daemon=True)
        filled = rss_mb(os.getpid())
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here on
        if slow is not None:
            slow.start()
        seconds = run(messages)
        linking = rss_mb(os.getpid())
        if slow is not None:
            slow.join()
        while (m := consumer.receive(1)) is not None:
            got.append(int.from_bytes(m.get_body()[:4], "big"))
        conn.close()
        return {
            "messages": messages,
            "body_bytes": size,
            "source": source.split("://")[0] if "://" in source else source,
            "first_run": first_run,
            "target_rate": target_rate or None,
            "window_bytes": window_bytes or "default",
            "peak_rss_mb_filling": filled["VmHWM"],
            "peak_rss_mb_linking": linking["VmHWM"],
            "messages_per_s": round(messages / seconds),
            "in_order": got == list(range(first_run + messages)),
        }
    finally:
        if child is not None:
            child.communicate("")
        broker.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=500_000)
    ap.add_argument("--check", action="store_true", help="consume everything back, checking the order")
    ap.add_argument("--window", type=int, help="imq.destination.memory.window (default: the service's)")
    ap.add_argument("--link-size", type=int, help="bytes per message: the link case (see above)")
    ap.add_argument("--window-bytes", help="imq.bridge.<name>.link.windowBytes of the link case")
    ap.add_argument(
        "--link-source",
        default="host",
        help="the link case's source: host (this process's broker), mq (another's, "
        "over mq://), or an amqp:// or stomp:// URL with user:password@",
    )
    ap.add_argument(
        "--first-run", type=int, default=0, help="the link case: messages moved by an earlier bridge (a restart) first"
    )
    ap.add_argument(
        "--target-rate",
        type=float,
        default=0,
        help="the link case: dst holds 16 and is consumed at this many messages/s",
    )
    ap.add_argument("--serve-source", help=argparse.SUPPRESS)  # the mq source's child process
    args = ap.parse_args()
    if args.serve_source:
        serve_source(args.serve_source)
        return
    if args.link_size:
        print(
            json.dumps(
                link_big(
                    args.messages, args.link_size, args.window_bytes, args.link_source, args.first_run, args.target_rate
                ),
                indent=2,
            )
        )
        return
    tmp = Path(tempfile.mkdtemp(prefix="memory-bench-"))
    try:
        props = tmp / "broker.properties"
        lines = [
            f"imq.varhome={tmp / 'var'}",
            "imq.instancename=membench",
            "imq.portmapper.port=0",
            "imq.bridge.enabled=true",
            "imq.bridge.admin.user=admin",
            f"imq.bridge.admin.password={PASSWORD}",
            "imq.bridge.activelist=stomp",
            "imq.bridge.stomp.tcp.port=0",
        ]
        if args.window:
            lines.append(f"imq.destination.memory.window={args.window}")
        props.write_text("\n".join(lines) + "\n")
        serve = Serve(props, tmp / "serve.log")
        try:
            idle = rss_mb(serve.proc.pid)
            seconds = flood(serve.port, args.messages)
            flooded = rss_mb(serve.proc.pid)
        finally:
            serve.stop()
        serve = Serve(props, tmp / "serve.log")
        try:
            first, in_order = drain(serve.port, args.messages, args.check)
            restarted = rss_mb(serve.proc.pid)
            restart_s = first - serve.started
        finally:
            serve.stop()
        print(
            json.dumps(
                {
                    "messages": args.messages,
                    "body_bytes": BODY_SIZE,
                    "messages_per_s": round(args.messages / seconds),
                    "flood_seconds": round(seconds, 1),
                    "rss_mb_idle": idle["VmRSS"],
                    "peak_rss_mb_flooding": flooded["VmHWM"],
                    "peak_rss_mb_after_restart": restarted["VmHWM"],
                    "restart_to_first_delivery_s": round(restart_s, 2),
                    "delivered_in_order": in_order,
                    "store_mb": round(sum(f.stat().st_size for f in (tmp / "var").rglob("store.db*")) / 2**20),
                },
                indent=2,
            )
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
