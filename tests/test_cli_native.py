"""imqbridgemgr feels like one command: its name in usage whatever started it, a help line
for every subcommand, the original's top-level -H, -javahome DIR anywhere on the line,
and --json on every command, failures included (a JSON error object on stdout with the
exit status of the text form)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from bridgemgr.cli import main

ROOT = Path(__file__).resolve().parents[1]


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT))
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "bridgemgr"],
        ["-m", "bridgemgr.cli"],
        ["-c", "import sys; sys.argv[0] = '/opt/bin/imqbridgemgr-wrapper'; from bridgemgr.cli import main; main()"],
    ],
)
def test_usage_says_imqbridgemgr_however_it_is_started(argv):
    r = run(*argv, "list", "queue")
    assert r.returncode == 2
    assert r.stderr.startswith("Usage: imqbridgemgr list ") and "Try 'imqbridgemgr list --help'" in r.stderr, r.stderr


def _commands(group: click.Group, path: str = ""):
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # (the lazy ones too: dmq, drain)
        command = group.get_command(ctx, name)
        assert command is not None, name
        yield f"{path}{name}", command
        if isinstance(command, click.Group):
            yield from _commands(command, f"{path}{name} ")


def test_every_subcommand_has_a_help_line():
    missing = [name for name, command in _commands(main) if not command.get_short_help_str().strip()]
    assert missing == []
    listing = CliRunner().invoke(main, ["-h"]).output
    assert re.search(r"\n  purge +Remove every waiting message", listing), listing
    assert re.search(r"\n  browse +Show the first messages", listing), listing
    assert re.search(r"\n  commit +Commit an in-doubt XA transaction", listing), listing


def test_top_level_capital_h_shows_the_help_with_examples():
    r = CliRunner().invoke(main, ["-H"])
    assert r.exit_code == 0
    assert "Usage: imqbridgemgr [OPTIONS] COMMAND" in r.output and "Examples:" in r.output
    assert "imqbridgemgr purge dst -t q -n orders -f" in r.output


def _java_home() -> Path | None:
    java = Path(os.environ.get("JAVA_HOME") or "/nonexistent") / "bin" / "java"
    if not java.exists():
        import shutil

        found = shutil.which("java")
        if found is None:
            return None
        java = Path(found).resolve()
    return java.parent.parent


def test_javahome_anywhere_sets_the_jvm_jpype_starts_and_a_wrong_one_is_refused(tmp_path, monkeypatch):
    home = _java_home()
    if home is None:
        pytest.skip("no Java installed")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    props = tmp_path / "broker.properties"
    props.write_text(f"imq.varhome={tmp_path / 'var'}\n")
    for args in (
        ["-javahome", str(home), "user", "list", "-props", str(props)],
        ["user", "list", "-props", str(props), "-javahome", str(home)],
    ):
        os.environ.pop("JAVA_HOME", None)
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, r.output
        assert os.environ["JAVA_HOME"] == str(home.resolve())
        import jpype

        assert jpype.getDefaultJVMPath().startswith(str(home.resolve()))
    os.environ.pop("JAVA_HOME", None)
    r = CliRunner().invoke(main, ["-javahome", str(tmp_path), "user", "list", "-props", str(props)])
    assert r.exit_code == 2 and "holds no JVM" in r.output
    assert "JAVA_HOME" not in os.environ


@pytest.mark.parametrize(
    "args, status, code",
    [
        (["list", "bridge", "-b", "nocolon", "-u", "a", "-passfile", "/dev/null"], 2, 400),
        (["list", "bridge", "-b", "127.0.0.1:1", "-u", "a", "-passfile", "{pw}"], 1, 503),
        (["check"], 2, 400),
        (["purge", "dst", "-t", "x", "-n", "q"], 2, 400),
        (["user", "delete", "-props", "{props}", "-u", "nobody"], 1, 500),
        (["drain", "-bn", "b", "-ln", "l", "-b", "127.0.0.1:1", "-u", "a", "-passfile", "{pw}"], 1, 503),
    ],
)
@pytest.mark.slow
def test_json_failures_are_one_error_object_on_stdout_with_the_same_exit_status(tmp_path, args, status, code):
    pw = tmp_path / "pw"
    pw.write_text("imq.imqbridgemgr.password=x\n")
    pw.chmod(0o600)
    props = tmp_path / "broker.properties"
    props.write_text(f"imq.varhome={tmp_path / 'var'}\n")
    args = [a.format(pw=pw, props=props) for a in args]
    text = run("-m", "bridgemgr", *args)
    r = run("-m", "bridgemgr", *args, "--json")
    assert text.returncode == r.returncode == status, (text.stderr, r.stdout, r.stderr)
    error = json.loads(r.stdout)["error"]
    assert error["code"] == code and error["message"], error
    assert error["message"].split(": ")[-1] in text.stderr


def test_user_list_json(tmp_path):
    props = tmp_path / "broker.properties"
    props.write_text(f"imq.varhome={tmp_path / 'var'}\n")
    pw = tmp_path / "pw"
    pw.write_text("imq.imqusermgr.password=Bob-secret1\n")
    pw.chmod(0o600)
    added = CliRunner().invoke(
        main, ["user", "add", "-props", str(props), "-u", "bob", "-g", "admin", "-passfile", str(pw), "--json"]
    )
    assert added.exit_code == 0 and json.loads(added.output)["user"] == "bob", added.output
    r = CliRunner().invoke(main, ["user", "list", "-props", str(props), "--json"])
    assert r.exit_code == 0
    assert json.loads(r.output)["users"] == [{"name": "bob", "group": "admin"}]
    assert "Bob-secret1" not in r.output and "scrypt" not in r.output


@pytest.mark.slow  # (three Python processes)
def test_a_command_loads_no_spark_module_unless_it_is_one_of_sparks():
    """dmq and drain load when asked for: their modules (the broker properties, Spark's log
    pipe) were 80 ms of every other command's start."""
    probe = (
        "import sys; from bridgemgr.cli import main; main(sys.argv[1:], standalone_mode=False); "
        "print(sorted(m for m in sys.modules if m.startswith('bridgemgr.spark.')))"
    )
    assert run("-c", probe, "--version").stdout.splitlines()[-1] == "[]"
    assert "'bridgemgr.spark.dmqcli'" in run("-c", probe, "dmq", "--help").stdout
    assert "Did you mean 'dmq'?" in run("-m", "bridgemgr.cli", "dqm").stderr
    listing = CliRunner().invoke(main, ["-h"]).output
    assert re.search(r"\n  dmq +Archive, report and redrive", listing), listing
    assert re.search(r"\n  drain +Move", listing), listing
