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
    """`imqbridgemgr serve -props PROPS`, up once it printed "Running"; ``address`` is its
    port mapper (what -b takes)."""

    def __init__(self, props: Path, *args: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen([sys.executable, "-m", "bridgemgr.cli", "serve", "-props", str(props),
                                      *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[str] = []
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if m := re.match(r"port mapper: (\S+):(\d+)", line):
                self.address = f"{m.group(1)}:{m.group(2)}"
            if "Running" in line:
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
