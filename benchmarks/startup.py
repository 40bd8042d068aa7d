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
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from ha_support import host_xml  # noqa: E402
from service_support import Daemon, one_bridge_files  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


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
    """Start serve, measure it once it runs with jb STARTED, stop it cleanly."""
    began = time.perf_counter()
    daemon = Daemon(props)  # (returns at "Running", every bridge's start ended)
    wall = time.perf_counter() - began
    if daemon.bridges != {"jb": "STARTED"}:
        raise SystemExit("serve did not start jb:\n" + "\n".join(daemon.lines))
    cpu, rss = process_cost(daemon.proc.pid)
    daemon.stop()
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
            props, _ = one_bridge_files(Path(tmp), "startup", host_xml("jb"), "Startup-Bench-1")
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
