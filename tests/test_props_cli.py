"""Broker properties through the CLI as a process: `imqbridgemgr check` reports, and
`serve` logs, a key under imq. that no component knows with the nearest known key (a
misspelt imq.persist.file.sync.enabled used to pass silently and leave fsync off); and
both refuse a file that is not a properties file (binary, UTF-16, XML, prose), naming
the file and line, where it used to be read as a pile of odd keys.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from service_support import ROOT, Daemon, one_bridge_files

pytestmark = pytest.mark.timeout(120)


def imqbridgemgr(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "bridgemgr.cli", *args], capture_output=True, text=True, env=env, timeout=60
    )


TYPO = "imq.persist.file.sync.enabeld"
HINT = f"warning: unknown property {TYPO}; did you mean imq.persist.file.sync.enabled?"


@pytest.mark.slow
def test_check_reports_an_unknown_imq_key_with_the_nearest_known_key(tmp_path):
    props = tmp_path / "broker.properties"
    props.write_text(f"imq.instancename=x\n{TYPO}=true\n")
    r = imqbridgemgr("check", "-props", str(props))
    assert r.returncode == 0, r.stderr  # a warning does not fail the check
    assert f"{props}:2: {HINT}" in r.stderr, r.stderr


@pytest.mark.slow
def test_serve_logs_an_unknown_imq_key_with_the_nearest_known_key(tmp_path):
    props, _ = one_bridge_files(tmp_path, "typo", "", "Secret-1", f"{TYPO}=true", activelist="")
    daemon = Daemon(props)
    try:
        assert any(f"{props}:" in line and HINT in line for line in daemon.lines), daemon.lines
        assert any("fsync off" in line for line in daemon.lines)  # the typo changes nothing
    finally:
        daemon.stop()


NOT_PROPERTIES = {
    "xml": (b'<?xml version="1.0"?>\n<jmsbridge name="b1"/>\n', 1, "it starts like XML"),
    "commented-xml": (b"# a bridge\n\n<jmsbridge name='b1'>\n</jmsbridge>\n", 3, "it starts like XML"),
    "binary": (b"imq.instancename=x\nimq.hostname=h\n\x7fELF\x02\x01\x00\x00", 3, "it holds a NUL byte"),
    "utf16": ("imq.instancename=x\n".encode("utf-16"), 1, "saved as UTF-16"),
    "prose": (b"# notes\nthe bridge runs on host h\nand moves orders\n", 2, "no line is key=value"),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(NOT_PROPERTIES))
def test_check_and_serve_refuse_a_file_that_is_not_a_properties_file(tmp_path, kind):
    data, line, reason = NOT_PROPERTIES[kind]
    path = tmp_path / f"broker-{kind}.properties"
    path.write_bytes(data)
    expected = f"{path}:{line}: not a properties file: "
    r = imqbridgemgr("check", "-props", str(path))
    assert r.returncode == 1 and expected in r.stderr and reason in r.stderr, r.stderr
    r = imqbridgemgr("serve", "-props", str(path), f"-Dimq.varhome={tmp_path / 'var'}", "-Dimq.portmapper.port=0")
    assert r.returncode == 1 and expected in r.stderr and reason in r.stderr, r.stdout + r.stderr
    assert not (tmp_path / "var").exists()  # refused before anything started


@pytest.mark.parametrize(
    "text",
    [
        "",
        "# only a comment\n",
        "imq.instancename x\nimq.hostname:h\n",
        "imq.bridge.enabled=false\n<not-xml-inside-a-value>=1\n",
    ],
)
@pytest.mark.slow
def test_properties_files_of_every_legal_shape_are_still_read(tmp_path, text):
    path = tmp_path / "broker.properties"
    path.write_text(text)
    r = imqbridgemgr("check", "-props", str(path))
    assert "not a properties file" not in r.stderr, r.stderr
