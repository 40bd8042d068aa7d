"""Run benchmarks on a git ref and on the working tree, interleaved; print both side by side.

    .venv/bin/python benchmarks/compare.py REF [BENCH ...] [--rounds N]
                                           [--args BENCH=ARGS ...] [--json-only]

REF is any commit-ish (``main``, ``HEAD~3``, ``3b24687``); BENCH names scripts of this
folder (default: broker.py link.py stomp_path.py). REF is checked out into a temporary
git worktree; each round runs every benchmark once on REF and once on the working tree,
alternating which goes first, with this same interpreter, each tree's own script and its
own ``bridgemgr`` (PYTHONPATH and the working folder are that tree; a script REF lacks is
copied from the working tree). Every number in a benchmark's JSON is a figure, named by
its path (``persistent_no_sync.flat_out.msg_per_s``); the median over the rounds of each
side is reported with ``ratio`` = working tree / REF. Both trees are compiled to bytecode
first (``bridgemgr``, ``benchmarks``, ``tests``): where PYTHONDONTWRITEBYTECODE is set,
REF's fresh worktree would otherwise compile every module in every process (0.3-0.6 s more
CPU for each `serve`). Prints a table on stderr and the JSON on stdout. Run it before any
change to the broker, the store, the STOMP bridge or a link, and quote it in the closing
note (docs/benchmarks.md says how to read it).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT = ("broker.py", "link.py", "stomp_path.py")


def figures(value: object, path: str = "") -> dict[str, float]:
    """Every number in a benchmark's JSON, by its dotted path (booleans are not figures)."""
    if isinstance(value, bool):
        return {}
    if isinstance(value, int | float):
        return {path: float(value)}
    out: dict[str, float] = {}
    if isinstance(value, dict):
        for key, item in value.items():
            out.update(figures(item, f"{path}.{key}" if path else str(key)))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out.update(figures(item, f"{path}[{i}]"))
    return out


def run(tree: Path, bench: str, args: list[str]) -> dict[str, float]:
    """One run of ``bench`` on ``tree``: its figures (the last JSON object it printed)."""
    script = tree / "benchmarks" / bench
    if not script.exists():
        script.write_bytes((HERE / bench).read_bytes())
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        cwd=tree,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tree)},
    )
    if proc.returncode != 0:
        raise SystemExit(f"{bench} on {tree} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    start = proc.stdout.find("{")
    return figures(json.loads(proc.stdout[start:]))


def compare(ref_runs: list[dict[str, float]], work_runs: list[dict[str, float]]) -> dict[str, dict]:
    """Medians per figure on each side, and their ratio (working tree / ref)."""
    out: dict[str, dict] = {}
    for key in sorted(set().union(*ref_runs, *work_runs)):
        ref = [r[key] for r in ref_runs if key in r]
        work = [r[key] for r in work_runs if key in r]
        row: dict = {"ref": statistics.median(ref) if ref else None, "work": statistics.median(work) if work else None}
        if row["ref"] and row["work"] is not None:
            row["ratio"] = round(row["work"] / row["ref"], 3)
        out[key] = row
    return out


def table(result: dict[str, dict[str, dict]]) -> str:
    lines = []
    for bench, rows in result.items():
        lines.append(f"{bench}")
        width = max((len(k) for k in rows), default=10)
        for key, row in rows.items():
            ratio = f"{row['ratio']:.2f}x" if "ratio" in row else "-"
            ref = "-" if row["ref"] is None else f"{row['ref']:g}"
            work = "-" if row["work"] is None else f"{row['work']:g}"
            lines.append(f"  {key:<{width}}  {ref:>12}  {work:>12}  {ratio:>7}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ref", help="the commit-ish to compare the working tree with")
    ap.add_argument("benches", nargs="*", default=list(DEFAULT), help="benchmark scripts of this folder")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each benchmark on each side, interleaved")
    ap.add_argument(
        "--args",
        action="append",
        default=[],
        metavar="BENCH=ARGS",
        help="extra arguments for one benchmark, e.g. 'broker.py=--messages 5000 --rounds 1'",
    )
    ap.add_argument("--json-only", action="store_true", help="no table on stderr")
    opts = ap.parse_args()
    extra: dict[str, list[str]] = {}
    for item in opts.args:
        bench, _, args = item.partition("=")
        extra[bench] = shlex.split(args)
    for bench in opts.benches:
        if not (HERE / bench).exists():
            ap.error(f"no benchmark {bench} in {HERE}")
    sha = subprocess.run(
        ["git", "rev-parse", "--verify", f"{opts.ref}^{{commit}}"], cwd=ROOT, capture_output=True, text=True
    )
    if sha.returncode != 0:
        ap.error(f"{opts.ref}: not a commit ({sha.stderr.strip()})")
    with tempfile.TemporaryDirectory(prefix="compare-") as tmp:
        ref_tree = Path(tmp) / "ref"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "--quiet", str(ref_tree), sha.stdout.strip()], cwd=ROOT, check=True
        )
        try:
            for tree in (ref_tree, ROOT):  # both with bytecode (see the module's docstring)
                folders = [str(tree / name) for name in ("bridgemgr", "benchmarks", "tests") if (tree / name).is_dir()]
                subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", *folders], check=True)
            runs: dict[str, tuple[list, list]] = {bench: ([], []) for bench in opts.benches}
            for i in range(opts.rounds):
                for bench in opts.benches:
                    sides = [(ref_tree, 0), (ROOT, 1)]
                    for tree, side in sides if i % 2 == 0 else sides[::-1]:
                        print(f"round {i + 1}: {bench} on {'ref' if side == 0 else 'work'}", file=sys.stderr)
                        runs[bench][side].append(run(tree, bench, extra.get(bench, [])))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(ref_tree)], cwd=ROOT, check=False)
    result = {bench: compare(*runs[bench]) for bench in opts.benches}
    if not opts.json_only:
        print(table(result), file=sys.stderr)
    print(
        json.dumps(
            {
                "ref": opts.ref,
                "ref_commit": sha.stdout.strip(),
                "rounds": opts.rounds,
                "python": sys.executable,
                "benchmarks": result,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
