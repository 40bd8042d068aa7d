"""The service log, black box: a real `serve`, its console output and the files under
<var>/instances/<instance>/. The console and log/log.txt carry the lines about the service
(start, stop, states, errors), never a line per message: those are in the bridge's own
log. log.txt is 0600 in a 0700 folder, rolls over by imq.log.file.rolloverbytes, is JSON
lines with imq.log.format=json, and a DMQ flood leaves a handful of counted lines in it.
The STOMP bridge writes bridges/stomp/log.txt at imq.bridge.stomp.level."""

from __future__ import annotations

import json
import os
import re
import socket
import stat
from pathlib import Path

import pytest

from bridgemgr.jms import DeliveryMode
from service_support import Daemon, cli, one_bridge_files, send, stomp_port, take
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

PASSWORD = "Logs-Secret-1"
XML = """<?xml version="1.0" encoding="UTF-8"?>
<jmsbridge name="jb">
  <link name="l1">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst"{target}/>
  </link>
  <connection-factory ref-name="host"/>
  <destination ref-name="src" name="logs.src"/>
  <destination ref-name="dst" name="logs.dst"/>
</jmsbridge>
"""
FAIL_ALL = """
from bridgemgr.transform import MessageTransformer


class FailAll(MessageTransformer):
    def transform(self, message, *args):
        raise ValueError("no good")
"""


def serve(base: Path, *extra: str, target: str = "", args: tuple[str, ...] = ()) -> Daemon:
    props, _ = one_bridge_files(base, "logs", XML.format(target=target), PASSWORD, *extra)
    return Daemon(props, *args)


def stopped(daemon: Daemon) -> list[str]:
    """Stop ``daemon``; every line it printed."""
    daemon.proc.terminate()
    rest, _ = daemon.proc.communicate(timeout=60)
    return daemon.lines + rest.splitlines()


def instance(base: Path) -> Path:
    return base / "var" / "instances" / "logs"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_per_message_lines_go_to_the_bridge_log_only(tmp_path):
    """Before: every transfer was an INFO line on the console, and no service log file."""
    daemon = serve(tmp_path)
    try:
        send(daemon, PASSWORD, "logs.src", *[(f"m{i}", DeliveryMode.NON_PERSISTENT) for i in range(50)])
        assert len(take(daemon, PASSWORD, "logs.dst", expect=50, quiet=0.2)) == 50
    finally:
        console = stopped(daemon)
    service_log = instance(tmp_path) / "log" / "log.txt"
    bridge_log = instance(tmp_path) / "bridges" / "jb" / "log.txt"
    assert not [line for line in console if "transferred message" in line], console
    assert bridge_log.read_text().count("transferred message") == 50
    text = service_log.read_text()
    assert "transferred message" not in text
    for line in (
        "host broker logs started",
        "link l1 connected",
        "bridge jb started with 1 link",
        "bridge jb stopped",
        "stopping the host broker",
    ):
        assert line in text, text
        assert any(line in c for c in console), console
    assert mode(service_log) == 0o600 and mode(service_log.parent) == 0o700


def test_the_service_log_rolls_over_by_size_and_loglevel_quietens_the_console(tmp_path):
    """A tiny imq.log.file.rolloverbytes: log.txt and the nine before it, none much past the
    limit, all 0600. -loglevel WARNING leaves the console without INFO lines."""
    daemon = serve(tmp_path, "imq.log.file.rolloverbytes=200", args=("-loglevel", "INFO"))
    console = stopped(daemon)
    folder = instance(tmp_path) / "log"
    files = sorted(folder.iterdir())
    assert [f.name for f in files][:3] == ["log.txt", "log.txt.1", "log.txt.2"], files
    assert len(files) <= 10
    for f in files:
        assert mode(f) == 0o600
        lines = f.read_text().splitlines()
        assert len(lines) == 1 or f.stat().st_size <= 200, (f, lines)
    assert any(" INFO " in line for line in console)

    quiet = tmp_path / "quiet"
    quiet.mkdir()
    console = stopped(serve(quiet, args=("-loglevel", "WARNING")))
    assert not [line for line in console if " INFO " in line], console
    assert "host broker logs started" not in (instance(quiet) / "log" / "log.txt").read_text()


def test_json_format_is_one_object_per_line_with_bridge_and_link(tmp_path):
    """Every log the service writes: log.txt, the console and the bridges' own files (before,
    a bridge's file, with its per-message lines, stayed text)."""
    daemon = serve(tmp_path, "imq.log.format=json")
    try:
        send(daemon, PASSWORD, "logs.src", "one")
        assert len(take(daemon, PASSWORD, "logs.dst", expect=1, quiet=0.2)) == 1
    finally:
        console = stopped(daemon)
    in_bridge_log = [json.loads(line) for line in (instance(tmp_path) / "bridges" / "jb" / "log.txt").open()]
    moved = next(e for e in in_bridge_log if "transferred message" in e["message"])
    assert moved["bridge"] == "jb" and moved["link"] == "l1" and moved["logger"].startswith("imq.bridge.jb")
    entries = [json.loads(line) for line in (instance(tmp_path) / "log" / "log.txt").read_text().splitlines()]
    assert entries and all({"time", "level", "logger", "message"} <= e.keys() for e in entries)
    connected = next(e for e in entries if "connected" in e["message"])
    assert connected["bridge"] == "jb" and connected["link"] == "l1" and connected["level"] == "INFO"
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00$", connected["time"])
    # the console's log lines are JSON too; serve's own status lines stay text
    assert any(line.startswith("{") and json.loads(line)["logger"] for line in console)
    assert "Stopped cleanly." in console


def test_a_dmq_flood_leaves_a_handful_of_counted_lines(tmp_path, monkeypatch):
    """3,000 TRANSFORM_FAILUREs: before, 3,000 WARNING lines (and 3,000 INFO lines) on the
    console; now the first, then one line per 10 s with the count, in the console and in
    log.txt alike. The bridge's own log keeps every one."""
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "failall.py").write_text(FAIL_ALL)
    monkeypatch.setenv("IMQ_BRIDGE_TRANSFORMER_PATH", str(tmp_path / "plugins"))
    daemon = serve(
        tmp_path, target=' message-transformer-class="failall.FailAll" consume-no-transfer-on-transform-error="true"'
    )
    bridge_log = instance(tmp_path) / "bridges" / "jb" / "log.txt"
    n = 3000
    try:
        send(daemon, PASSWORD, "logs.src", *[(f"m{i}", DeliveryMode.NON_PERSISTENT) for i in range(n)])
        wait_for(lambda: bridge_log.read_text().count("goes to the DMQ") >= n, 90, "the DMQ flood")
    finally:
        console = stopped(daemon)
    service_log = (instance(tmp_path) / "log" / "log.txt").read_text().splitlines()
    for lines in (console, service_log):
        flood = [line for line in lines if "goes to the DMQ" in line]
        assert 2 <= len(flood) <= 20, flood
        counts = [
            int(m.group(1).replace(",", ""))
            for line in flood
            if (m := re.search(r"\(repeated ([\d,]+) times in the last \d+ s\)$", line))
        ]
        assert counts and len(flood) - len(counts) + sum(counts) == n, flood
        assert not [line for line in lines if "went to DMQ" in line]
        assert len(lines) < 60, lines


def test_a_flood_of_messages_the_broker_drops_is_counted_in_the_service_log(tmp_path):
    """A queue that keeps one message, drops the oldest and has no DMQ: 400 sends drop 399.
    Before, 399 INFO lines "message ... dropped" in the console and log.txt; now the first
    and one counted line."""
    props, passfile = one_bridge_files(tmp_path, "logs", XML.format(target=""), PASSWORD)
    daemon = Daemon(props)
    n = 400
    try:
        made = cli(
            daemon,
            passfile,
            "create",
            "dst",
            "-t",
            "q",
            "-n",
            "flood",
            "-o",
            "maxNumMsgs=1",
            "-o",
            "limitBehavior=REMOVE_OLDEST",
            "-o",
            "useDMQ=false",
        )
        assert made.returncode == 0, made.stderr
        send(daemon, PASSWORD, "flood", *[(f"m{i}", DeliveryMode.NON_PERSISTENT) for i in range(n)])
    finally:
        console = stopped(daemon)
    service_log = (instance(tmp_path) / "log" / "log.txt").read_text().splitlines()
    for lines in (console, service_log):
        dropped = [line for line in lines if "dropped (REMOVE_OLDEST)" in line]
        counts = [
            int(m.group(1).replace(",", ""))
            for line in dropped
            if (m := re.search(r"\(repeated ([\d,]+) times in the last \d+ s\)$", line))
        ]
        assert 2 <= len(dropped) <= 10 and len(dropped) - len(counts) + sum(counts) == n - 1, dropped


def test_the_stomp_bridge_logs_to_its_own_file(tmp_path):
    """bridges/stomp/log.txt (0600) at imq.bridge.stomp.level, rolled over by
    imq.bridge.stomp.logfile.limit/count; a client's ERROR frame is in it, not on the
    console. Before: the STOMP bridge had no file."""
    daemon = serve(
        tmp_path,
        "imq.bridge.activelist=jb,stomp",
        "imq.bridge.stomp.tcp.port=0",
        "imq.bridge.stomp.level=FINE",
        "imq.bridge.stomp.logfile.limit=400",
        "imq.bridge.stomp.logfile.count=2",
    )
    try:
        port = int(
            next(
                m.group(1)
                for line in daemon.lines
                if (m := re.search(r"STOMP bridge listening on tcp \S+:(\d+)", line))
            )
        )
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(b"NOT-A-FRAME\n\n\x00")
                assert sock.recv(4096).startswith(b"ERROR")
    finally:
        console = stopped(daemon)
    folder = instance(tmp_path) / "bridges" / "stomp"
    assert sorted(f.name for f in folder.iterdir()) == ["log.txt", "log.txt.1"]
    text = "".join(f.read_text() for f in folder.iterdir())
    assert "ERROR" in text and "STOMP session" in text
    assert re.search(r" DEBUG STOMP session stomp-\d+: connection from 127\.0\.0\.1", text)  # FINE
    assert all(mode(f) == 0o600 for f in folder.iterdir()) and os.stat(folder).st_mode & 0o077 == 0
    assert not [line for line in console if "STOMP session" in line], console


def test_the_stomp_bridge_log_is_written_again_after_stop_and_start(tmp_path):
    """stop bridge -t STOMP, start bridge -t STOMP: the bridge's lines go on to
    bridges/stomp/log.txt. Before, the file took no line after the restart."""
    props, passfile = one_bridge_files(
        tmp_path,
        "logs",
        XML.format(target=""),
        PASSWORD,
        "imq.bridge.activelist=jb,stomp",
        "imq.bridge.stomp.tcp.port=0",
        "imq.bridge.stomp.level=FINE",
    )
    daemon = Daemon(props)
    stomp_log = instance(tmp_path) / "bridges" / "stomp" / "log.txt"
    try:
        for step in ("stop", "start"):
            r = cli(daemon, passfile, step, "bridge", "-t", "STOMP")
            assert r.returncode == 0, r.stdout + r.stderr
        with socket.create_connection(("127.0.0.1", stomp_port(daemon)), timeout=10) as sock:
            sock.sendall(b"NOT-A-FRAME\n\n\x00")
            assert sock.recv(4096).startswith(b"ERROR")
        wait_for(lambda: "connection from 127.0.0.1" in stomp_log.read_text(), 10, "the STOMP log after a restart")
    finally:
        stopped(daemon)
