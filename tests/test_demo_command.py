"""The demo prints the command to operate the service as the user started it: a clone's
./imqbridgemgr script as typed, an installed console script by its name when the PATH
finds it (the wheel case: test_packaging serves the demo from a fresh venv and checks
its line), else by its path, and ``python -m bridgemgr`` as that."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from bridgemgr.demo import INVOKED_AS, how_to_reach, invoked_as

ROOT = Path(__file__).resolve().parent.parent


def test_the_clone_script_passes_on_how_it_was_called(tmp_path):
    """./imqbridgemgr against a stand-in venv (its python prints what it was given), whose
    stamp matches pyproject.toml so nothing is installed."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\necho "${INVOKED_AS}|$*"\n')
    python.chmod(0o755)
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    (venv / ".imqbridge-installed").write_text(f"{want} \n")
    env = {**os.environ, "IMQBRIDGE_VENV": str(venv)}
    env.pop(INVOKED_AS, None)
    out = subprocess.run(
        ["./imqbridgemgr", "serve", "--demo"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30, check=True
    ).stdout
    assert out == "./imqbridgemgr|-m bridgemgr.cli serve --demo\n"


def test_a_console_script_is_named_as_the_path_finds_it(tmp_path, monkeypatch):
    monkeypatch.delenv(INVOKED_AS, raising=False)
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "imqbridgemgr"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin")
    assert invoked_as(str(script)) == "imqbridgemgr"
    monkeypatch.setenv("PATH", "/usr/bin")  # installed somewhere off the PATH: its path
    assert invoked_as(str(script)) == str(script)
    assert invoked_as("/somewhere/bridgemgr/__main__.py") == "python -m bridgemgr"
    monkeypatch.setenv(INVOKED_AS, "../clone/imqbridgemgr")
    assert invoked_as(str(script)) == "../clone/imqbridgemgr"
    line = how_to_reach(tmp_path, "127.0.0.1:7676", None)[-1]
    assert line.startswith("Operate it:  ../clone/imqbridgemgr list bridge -b 127.0.0.1:7676 -u admin")
