"""File modes of a real `imqbridgemgr serve` under a permissive umask (022 and 000): after
the demo and a transacted link have moved messages, every file under the instance's var
folder (store and its -wal/-shm, the XA transaction log, bridge logs, etc/passwd, the
demo's etc/ files, the lock file while it runs) is 0600 and every folder 0700. A passfile that others
can read gets a warning naming it and its mode, from the admin CLI, `user add` and
`serve`; one that only its owner can read gets none.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from service_support import ROOT, Daemon, cli, one_bridge_files, send, take

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

PASSWORD = "Secret-1"
XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb">
  <link name="tx" transacted="true">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host"/>
  <destination ref-name="src" name="modes.src"/>
  <destination ref-name="dst" name="modes.dst"/>
</jmsbridge>
"""


def modes(root: Path) -> dict[str, str]:
    """Every folder and file under ``root`` (itself included) and its mode, octal."""
    found = {".": f"{stat.S_IMODE(root.stat().st_mode):04o}"}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            found[str(path.relative_to(root))] = f"{stat.S_IMODE(path.lstat().st_mode):04o}"
    return found


def with_umask(mask: int, fn, *args, **kwargs):
    """``fn`` run with the process umask ``mask`` (children it starts inherit it)."""
    old = os.umask(mask)
    try:
        return fn(*args, **kwargs)
    finally:
        os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o000])
def test_every_file_the_service_writes_is_0600_in_0700_folders(tmp_path, mask):
    # the demo's bridges (its etc/ files) and jb (a transacted link: the XA log)
    props, _ = one_bridge_files(
        tmp_path, "modes", XML, PASSWORD, "imq.bridge.demo.type=jms", "imq.bridge.demo.xmlurl=jb.xml", activelist="jb"
    )
    daemon = with_umask(
        mask, Daemon, props, "--demo", "-Dimq.bridge.activelist=stomp,demo,jb", "-Dimq.bridge.stomp.tcp.port=0"
    )
    try:
        assert daemon.bridges == {"stomp": "STARTED", "demo": "STARTED", "jb": "STARTED"}, daemon.lines
        assert any("demo: sent" in line and "moved" in line for line in daemon.lines), daemon.lines
        demo_passfile = tmp_path / "var" / "instances" / "modes" / "etc" / "demo-admin.properties"
        password = demo_passfile.read_text().split("=", 1)[1].strip()  # the demo's admin password wins
        send(daemon, password, "modes.src", *[f"m{i}" for i in range(20)])
        assert len(take(daemon, password, "modes.dst", expect=20)) == 20
        r = cli(daemon, demo_passfile, "list", "link", "-bn", "jb")
        assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
        lock = tmp_path / "var" / "instances" / "modes" / "lock"  # removed at the clean stop
        assert f"{stat.S_IMODE(lock.stat().st_mode):04o}" == "0600"
    finally:
        daemon.stop()
    instance = tmp_path / "var" / "instances" / "modes"
    found = modes(instance)
    for must in ("store/store.db", "etc/passwd", "etc/demo-admin.properties"):
        assert must in found, sorted(found)
    assert any("txlog" in name for name in found), sorted(found)
    assert any(name.startswith("bridges/jb/") and "log" in name for name in found), sorted(found)
    wrong = {name: mode for name, mode in found.items() if mode != ("0700" if (instance / name).is_dir() else "0600")}
    assert wrong == {}, wrong


def test_a_passfile_others_can_read_gets_a_warning_naming_it(tmp_path):
    props, passfile = one_bridge_files(tmp_path, "pwmodes", "", PASSWORD, activelist="")
    os.chmod(passfile, 0o644)
    daemon = Daemon(props, "-passfile", str(passfile))
    try:
        warning = f"the password file {passfile} has mode 0644"
        assert any(warning in line for line in daemon.lines), daemon.lines
        r = cli(daemon, passfile, "list", "bridge")
        assert r.returncode == 0 and f"warning: {warning}" in r.stderr, r.stderr
    finally:
        daemon.stop()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "bridgemgr.cli",
            "user",
            "add",
            "-props",
            str(props),
            "-u",
            "alice",
            "-passfile",
            str(passfile),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert f"warning: {warning}" in r.stderr, r.stdout + r.stderr
