"""Shell completion as docs/operations.md#shell-completion documents it: each command the
page gives prints its shell's script, and bash, having evaluated the documented line,
completes `imqbridgemgr li` to `list` and `imqbridgemgr list ` to its subcommands."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]
ROOT = Path(__file__).resolve().parents[1]
SECTION = re.search(r"^### Shell completion\n(.*?)^## ", (ROOT / "docs" / "operations.md").read_text(), re.S | re.M)
COMMANDS = re.findall(r"_IMQBRIDGEMGR_COMPLETE=(\w+) imqbridgemgr", SECTION.group(1) if SECTION else "")


def environment(tmp_path: Path) -> dict[str, str]:
    """PATH with an `imqbridgemgr` that runs this tree's CLI with this interpreter."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    program = bin_dir / "imqbridgemgr"
    program.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m bridgemgr.cli "$@"\n')
    program.chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=str(ROOT))


def test_the_page_documents_bash_zsh_and_fish():
    assert {"bash_source", "zsh_source", "fish_source"} <= set(COMMANDS), COMMANDS


@pytest.mark.parametrize(
    "shell, first_line",
    [("bash_source", "_imqbridgemgr_completion() {"), ("zsh_source", "#compdef imqbridgemgr")],
)
def test_the_documented_command_prints_a_completion_script(tmp_path, shell, first_line):
    assert shell in COMMANDS
    out = subprocess.run(
        ["imqbridgemgr"],
        env={**environment(tmp_path), "_IMQBRIDGEMGR_COMPLETE": shell},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == first_line and "imqbridgemgr" in out.stdout


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completes_after_the_documented_eval(tmp_path):
    line = next(x for x in SECTION.group(1).splitlines() if "bash_source" in x and x.startswith("eval"))
    complete = '_imqbridgemgr_completion imqbridgemgr; echo "${COMPREPLY[*]}"'
    script = (
        f"{line}\n"
        f"COMP_WORDS=(imqbridgemgr li); COMP_CWORD=1; {complete}\n"
        f"COMP_WORDS=(imqbridgemgr list ''); COMP_CWORD=2; {complete}\n"
    )
    out = subprocess.run(
        ["bash", "--norc", "-c", script], env=environment(tmp_path), capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()
    assert first == "list"
    assert {"bridge", "link", "dst", "txn"} <= set(second.split())
