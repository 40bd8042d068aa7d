"""What `imqbridgemgr serve` and a CLI call cost to start; prints one JSON object.

    .venv/bin/python benchmarks/startup.py [--starts N]

Each round starts `serve` on an instance of its own with one JMS bridge between two host
queues (the embedded broker, its default SQLite store, no Java): ``first_start`` on a new
instance (it writes its users, keys and access control file), ``restart`` on the same one
after a clean stop. Figures at the line "Running" with the bridge STARTED: ``wall_s`` since
the spawn, ``cpu_s`` of the process (user + system, /proc) and ``rss_mib``. ``cli``: one
`python -m bridgemgr.cli --version` process (a script calling the CLI pays it per call).
Medians and maxima over N rounds; CPU seconds are the steadier figure on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
XML = """<?xml version="1.0" encoding="UTF-8"?>
<jmsbridge name="jb">
  <link name="l1" transacted="false">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host"/>
  <destination ref-name="src" name="start.src"/>
  <destination ref-name="dst" name="start.dst"/>
</jmsbridge>
"""
TICK = os.sysconf("SC_CLK_TCK")


def instance(base: Path) -> Path:
    """The properties of an instance under ``base`` with bridge jb."""
    (base / "jb.xml").write_text(XML)
    props = base / "broker.properties"
    props.write_text(
        "\n".join(
            [
                f"imq.varhome={base / 'var'}",
                "imq.instancename=startup",
                "imq.portmapper.port=0",
                "imq.bridge.enabled=true",
                "imq.bridge.admin.user=admin",
                "imq.bridge.admin.password=Startup-Bench-1",
                "imq.bridge.activelist=jb",
                "imq.bridge.jb.type=jms",
                "imq.bridge.jb.xmlurl=jb.xml",
            ]
        )
        + "\n"
    )
    return props


def process_cost(pid: int) -> tuple[float, float]:
    """(CPU seconds, RSS MiB) of a running process."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(stat[11]) + int(stat[12])) / TICK
    rss = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    return cpu, rss / 1024


def serve(props: Path) -> dict[str, float]:
    """Start serve, measure it at "Running" with jb STARTED, stop it cleanly."""
    began = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bridgemgr.cli", "serve", "-props", str(props)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert proc.stdout is not None
    running = started = False
    lines = []
    for line in proc.stdout:
        lines.append(line)
        running = running or "Running" in line
        started = started or line.startswith("bridge jb (JMS): STARTED")
        if running and started:
            break
    else:
        raise SystemExit("serve did not come up:\n" + "".join(lines))
    wall = time.perf_counter() - began
    cpu, rss = process_cost(proc.pid)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    return {"wall_s": wall, "cpu_s": cpu, "rss_mib": rss}


def cli() -> dict[str, float]:
    """One `--version` process: wall and CPU (of the child, from rusage)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "bridgemgr.cli", "--version"],
        check=True,
        capture_output=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall_s": wall, "cpu_s": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime}


def summary(samples: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {
        key: {
            "median": round(statistics.median(s[key] for s in samples), 3),
            "max": round(max(s[key] for s in samples), 3),
        }
        for key in samples[0]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=5, help="rounds (default 5)")
    args = parser.parse_args()
    first, again, calls = [], [], []
    for _ in range(args.starts):
        with tempfile.TemporaryDirectory(prefix="imqbridge-startup-") as tmp:
            props = instance(Path(tmp))
            first.append(serve(props))
            again.append(serve(props))
        calls.append(cli())
    print(
        json.dumps(
            {
                "starts": args.starts,
                "first_start": summary(first),
                "restart": summary(again),
                "cli": summary(calls),
                "load_average": round(os.getloadavg()[0], 2),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
