"""SIGHUP to a real `imqbridgemgr serve`: the service lives on, keeps its lock, and reads
the properties and the XML of its stopped JMS bridges again. An edited XML takes effect at
the next `start bridge`; a broken one is logged with its file and line and the bridge keeps
the configuration it had."""

from __future__ import annotations

import json
import re
import signal
import time

import pytest

from service_support import Daemon, cli, one_bridge_files, send, take
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

PASSWORD = "Secret-1"

XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb">
  <link name="l1" transacted="false">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host"/>
  <destination ref-name="src" name="hup.src"/>
  <destination ref-name="dst" name="{target}"/>
</jmsbridge>
"""


def wait_line(daemon: Daemon, pattern: str, timeout: float = 30) -> str:
    """The next line serve prints that matches ``pattern`` (regex)."""
    deadline = time.monotonic() + timeout
    assert daemon.proc.stdout is not None
    for line in daemon.proc.stdout:
        daemon.lines.append(line.rstrip())
        if re.search(pattern, line):
            return line
        assert time.monotonic() < deadline, f"no line matching {pattern!r}: {daemon.lines[-20:]}"
    raise AssertionError(f"serve ended before a line matching {pattern!r}: {daemon.lines[-20:]}")


def test_sighup_reloads_the_xml_of_a_stopped_bridge_and_a_broken_file_changes_nothing(tmp_path):
    props, passfile = one_bridge_files(
        tmp_path, "hup", XML.format(target="hup.first"), PASSWORD, "imq.bridge.jb.autostart=false"
    )
    daemon = Daemon(props)
    try:
        assert daemon.bridges == {"jb": "UNINITIALIZED"}, daemon.lines
        (tmp_path / "jb.xml").write_text(XML.format(target="hup.second"))
        daemon.proc.send_signal(signal.SIGHUP)
        line = wait_line(daemon, r"SIGHUP: bridge jb (reloaded|keeps)")
        assert "reloaded" in line and "destinations changed" in line, line
        assert daemon.proc.poll() is None  # alive

        assert cli(daemon, passfile, "start", "bridge", "-bn", "jb").returncode == 0
        send(daemon, PASSWORD, "hup.src", "one")
        assert [m.text for m in take(daemon, PASSWORD, "hup.second", expect=1)] == ["one"]
        assert cli(daemon, passfile, "stop", "bridge", "-bn", "jb").returncode == 0

        (tmp_path / "jb.xml").write_text(XML.format(target="hup.third").replace("</link>", "", 1))
        daemon.proc.send_signal(signal.SIGHUP)
        wait_line(daemon, r"SIGHUP: bridge jb keeps its configuration")
        error = wait_line(daemon, r"jb\.xml")
        assert re.search(r"jb\.xml:\d+", error), error  # file and line
        assert daemon.proc.poll() is None

        r = cli(daemon, passfile, "start", "bridge", "-bn", "jb")  # the last good configuration
        assert r.returncode == 0, r.stdout + r.stderr
        send(daemon, PASSWORD, "hup.src", "two")
        assert [m.text for m in take(daemon, PASSWORD, "hup.second", expect=1)] == ["two"]
    finally:
        daemon.proc.send_signal(signal.SIGTERM)
        out, _ = daemon.proc.communicate(timeout=60)
    assert daemon.proc.returncode == 0 and "Stopped cleanly." in out, out


def test_sighup_applies_the_activelist_and_log_levels_and_ignores_unknown_keys(tmp_path):
    """Before, a bridge new to imq.bridge.activelist and a new imq.log.level waited for a
    restart, and a misspelt key was listed among the changed properties. Now SIGHUP starts
    jb2 and stops jb (gone from the list), the service log and jb2's log take their new
    levels at once, and imq.bridge.jb2.backoutTreshold is warned about by name only."""
    props, passfile = one_bridge_files(tmp_path, "hup", XML.format(target="hup.jb"), PASSWORD)
    (tmp_path / "jb2.xml").write_text(XML.format(target="hup.jb2").replace('name="jb"', 'name="jb2"'))
    jb2 = ["imq.bridge.jb2.type=jms", "imq.bridge.jb2.xmlurl=jb2.xml"]
    daemon = Daemon(props)
    instance = tmp_path / "var" / "instances" / "hup"
    try:
        assert daemon.bridges == {"jb": "STARTED"}, daemon.lines
        text = props.read_text().replace("imq.bridge.activelist=jb", "imq.bridge.activelist=jb2")
        props.write_text(text + "\n".join([*jb2, "imq.bridge.jb2.backoutTreshold=3"]) + "\n")
        daemon.proc.send_signal(signal.SIGHUP)
        wait_line(daemon, r"^bridge jb2 \(JMS\): STARTED$")
        listed = json.loads(cli(daemon, passfile, "list", "bridge", "--json").stdout)["data"]["bridges"]
        assert [(row["name"], row["state"]) for row in listed] == [("jb2", "STARTED")]
        send(daemon, PASSWORD, "hup.src", "one")
        assert [m.text for m in take(daemon, PASSWORD, "hup.jb2", expect=1)] == ["one"]
        jb2_log = instance / "bridges" / "jb2" / "log.txt"
        wait_for(lambda: "transferred message" in jb2_log.read_text(), 10, "jb2's line about message one")

        props.write_text(props.read_text() + "imq.log.level=WARNING\nimq.bridge.jb2.level=WARNING\n")
        daemon.proc.send_signal(signal.SIGHUP)
        wait_line(daemon, r"SIGHUP: the service log is at level WARNING now")
        send(daemon, PASSWORD, "hup.src", "two")  # jb2, still running, logs at WARNING now
        assert [m.text for m in take(daemon, PASSWORD, "hup.jb2", expect=1)] == ["two"]
        assert cli(daemon, passfile, "stop", "bridge", "-bn", "jb2").returncode == 0
    finally:
        daemon.proc.send_signal(signal.SIGTERM)
        out, _ = daemon.proc.communicate(timeout=60)
    lines = daemon.lines + out.splitlines()
    assert "Stopped cleanly." in lines, lines
    assert any("bridge jb is no longer in imq.bridge.activelist: stopped and unloaded" in x for x in lines), lines
    assert any("unknown property imq.bridge.jb2.backoutTreshold" in x for x in lines), lines
    assert not [x for x in lines if "changed properties" in x and "backoutTreshold" in x], lines
    service_log = (instance / "log" / "log.txt").read_text()
    after = service_log[service_log.index("the service log is at level WARNING now") :]
    assert "bridge jb2 stopped" not in after and " INFO " not in after, after  # INFO lines no more
    assert "bridge jb2 started" in service_log  # (at INFO, after the first SIGHUP)
    assert (instance / "bridges" / "jb2" / "log.txt").read_text().count("transferred message") == 1
