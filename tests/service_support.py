"""A real `imqbridgemgr serve` process and the CLI as a process, for end-to-end tests
(tests/test_service_e2e.py, tests/test_jobs.py, tests/spark/)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class Daemon:
    """`imqbridgemgr serve -props PROPS`, up once it printed "Running" and (unless
    ``settle`` is false) every bridge's start has ended: serve prints "bridge NAME (TYPE):
    STATE" for each, again when a STARTING one is done. ``address`` is its port mapper
    (what -b takes); ``bridges`` the last state printed per bridge."""

    def __init__(self, props: Path, *args: str, settle: bool = True) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen([sys.executable, "-m", "bridgemgr.cli", "serve", "-props", str(props),
                                      *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
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
    """`imqbridgemgr ARGS -b <daemon> -u admin -passfile PASSFILE -f` as a process."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "bridgemgr.cli", *args, "-b", daemon.address,
                           "-u", "admin", "-passfile", str(passfile), "-f"],
                          capture_output=True, text=True, env=env, timeout=timeout)


def one_bridge_files(base: Path, instance: str, xml: str, password: str, *extra: str,
                     activelist: str = "jb") -> tuple[Path, Path]:
    """A service's files under ``base``: jb.xml (``xml``, the JMS bridge jb), broker
    properties with an admin login (``extra`` lines appended) and the admin passfile.
    Returns (properties file, passfile)."""
    (base / "jb.xml").write_text(xml)
    props = base / "broker.properties"
    lines = [f"imq.varhome={base / 'var'}", f"imq.instancename={instance}", "imq.portmapper.port=0",
             "imq.bridge.enabled=true", "imq.bridge.admin.user=admin",
             f"imq.bridge.admin.password={password}", f"imq.bridge.activelist={activelist}",
             "imq.bridge.jb.type=jms", "imq.bridge.jb.xmlurl=jb.xml", *extra]
    props.write_text("\n".join(lines) + "\n")
    passfile = base / "pw.properties"
    passfile.write_text(f"imq.imqbridgemgr.password={password}\n")
    return props, passfile
