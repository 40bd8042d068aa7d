"""`imqbridgemgr serve`: the Quick start's first command, as a process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bridgemgr.jms import Queue, TextMessage
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[1]


def start_serve(varhome: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, IMQ_VARHOME=str(varhome), PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bridgemgr.cli",
            "serve",
            "-Dimq.portmapper.port=0",
            "-Dimq.bridge.stomp.tcp.port=0",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def read_until(proc: subprocess.Popen, marker: str) -> list[str]:
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip())
        if marker in line:
            return lines
    raise AssertionError(f"{marker!r} never printed; output: {lines}")


@pytest.mark.slow
def test_serve_runs_the_demo_refuses_a_second_instance_and_stops_on_sigterm(tmp_path):
    first = start_serve(tmp_path)
    out = read_until(first, "Running")
    assert "bridge stomp (STOMP): STARTED" in out and "bridge demo (JMS): STARTED" in out
    assert any("demo: sent 1000" in line and "moved 1000 to demo.out (last: 'ORDER 999')" in line for line in out)
    passfile = tmp_path / "instances" / "imqbroker" / "etc" / "demo-admin.properties"
    assert any(f"-passfile {passfile}" in line for line in out)
    assert not any(passfile.read_text().split("=", 1)[1].strip() in line for line in out)  # never printed
    second = start_serve(tmp_path)
    text, _ = second.communicate(timeout=60)
    assert second.returncode == 1
    assert "in use by pid" in text
    first.send_signal(signal.SIGTERM)
    rest, _ = first.communicate(timeout=60)
    assert first.returncode == 0
    assert "Stopped cleanly." in rest
    # The store was closed cleanly and holds nothing but what the demo left (nothing).
    broker = Broker(tmp_path / "instances" / "imqbroker" / "store")
    assert broker.queue_depth("demo.in") == 0 and broker.queue_depth("demo.out") == 0
    broker.close()


@pytest.mark.slow
def test_serve_with_properties_keeps_messages_across_restarts(tmp_path):
    props = tmp_path / "broker.properties"
    props.write_text(f"imq.varhome={tmp_path / 'var'}\nimq.instancename=b1\nimq.persist.file.sync.enabled=true\n")
    store = tmp_path / "var" / "instances" / "b1" / "store"
    broker = Broker(store)
    session = EmbeddedConnectionFactory(broker).create_connection().create_session()
    session.create_producer(Queue("kept")).send(TextMessage("x"))
    broker.close()
    proc = start_serve(tmp_path, "-props", str(props))
    out = read_until(proc, "Running")
    assert not any("demo:" in line for line in out)  # no demo when properties are given
    assert any("fsync on" in line for line in out)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 0
    broker = Broker(store)
    assert broker.queue_depth("kept") == 1
    broker.close()


@pytest.mark.slow
def test_serve_reports_bad_properties_with_file_and_line(tmp_path):
    props = tmp_path / "bad.properties"
    props.write_text("imq.persist.file.sync.enabled=maybe\n")
    proc = start_serve(tmp_path, "-props", str(props))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "bad.properties" in out and "imq.persist.file.sync.enabled" in out
