"""`imqbridgemgr dmq redrive` resends only what the bridge itself dead-lettered: a real
`serve` whose link dead-letters a message its transformer fails on (TRANSFORM_FAILURE), and
two forged dead messages a plain user put in the built-in DMQ (one without the DMQ marker,
one marked with a key of her own). The redrive (the CLI as a process, no Spark needed)
resends the real one, skips the forged ones as unverified, says so in its output and JSON,
and leaves them in the DMQ."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bridgemgr import connect
from bridgemgr.jms import Queue, TextMessage
from bridgemgr.jms.errors import JMSSecurityException
from bridgemgr.jmsbridge.config import BUILTIN_DMQ_DESTINATION
from bridgemgr.jmsbridge.dmq import DMQ_MARKER, DeadLetter, dmq_message
from bridgemgr.jmsbridge.pipeline import DMQReason
from bridgemgr.users import UserRepository
from service_support import FAIL_ON_BAD, ROOT, Daemon, fail_on_bad_bridge, one_bridge_files, send, take
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

PASSWORD = "Redrive-Secret-1"
MALLORY = ("mallory", "Mallory-Pw-1")
XML = fail_on_bad_bridge("rd")


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    base: Path = tmp_path_factory.mktemp("redrive")
    (base / "plugins").mkdir()
    (base / "plugins" / "failonbad.py").write_text(FAIL_ON_BAD)
    props, passfile = one_bridge_files(base, "redrive", XML, PASSWORD)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IMQ_BRIDGE_TRANSFORMER_PATH", str(base / "plugins"))  # serve inherits it
        daemon = Daemon(props)
    try:
        assert daemon.bridges == {"jb": "STARTED"}, daemon.lines
        UserRepository(base / "var" / "instances" / "redrive" / "etc" / "passwd").add(*MALLORY)
        yield daemon, passfile
    finally:
        daemon.stop()


def dmq_texts(daemon: Daemon) -> list[str]:
    """The texts of the originals in the built-in DMQ, browsed (nothing consumed)."""
    with connect(f"mq://{daemon.address}", "admin", PASSWORD) as conn:
        browser = conn.create_session().create_browser(Queue(BUILTIN_DMQ_DESTINATION))
        return sorted(m.get_body().text for m in browser)


def forge(daemon: Daemon, text: str, key: bytes | None) -> None:
    """A dead message as the bridge would write it, from a plain user (with the access
    control file's defaults the DMQ is admin-only: then an admin forges it, which the
    marker must catch just the same)."""
    original = TextMessage(text)
    letter = DeadLetter(
        original,
        DMQReason.TRANSFORM_FAILURE,
        "bad message",
        "jb",
        "l1",
        "rd.src",
        "rd.dst",
        None,
        "imqbridge embedded broker",
        "imqbridge embedded broker",
    )
    dead = dmq_message(letter, original, int(time.time() * 1000), key)
    for user, password in (MALLORY, ("admin", PASSWORD)):
        try:
            with connect(f"mq://{daemon.address}", user, password) as conn:
                conn.create_session().create_producer(Queue(BUILTIN_DMQ_DESTINATION)).send(dead)
            return
        except JMSSecurityException:
            continue
    raise AssertionError("nobody could put a message in the DMQ")


def redrive(daemon: Daemon, passfile: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "bridgemgr.cli",
            "dmq",
            "redrive",
            "-bn",
            "jb",
            "--reason",
            "TRANSFORM_FAILURE",
            "--since",
            "1h",
            *args,
            "-b",
            daemon.address,
            "-u",
            "admin",
            "-passfile",
            str(passfile),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_redrive_resends_the_bridges_dead_message_and_skips_forged_ones(service):
    daemon, passfile = service
    send(daemon, PASSWORD, "rd.src", "bad but real")
    wait_for(lambda: dmq_texts(daemon) == ["bad but real"], 30, "the dead message in the DMQ", interval=0.2)
    assert dmq_texts(daemon) == ["bad but real"]
    forge(daemon, "forged, no marker", None)
    forge(daemon, "forged, her own key", b"mallory's key".ljust(32, b"."))

    result = redrive(daemon, passfile, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert (data["chosen"], data["sent"], data["unverified"]) == (3, 1, 2), data
    assert all("marker" in m["detail"] for m in data["messages"] if m["status"] == "unverified")
    assert [m.text for m in take(daemon, PASSWORD, "rd.dst", expect=1)] == ["bad but real"]
    assert dmq_texts(daemon) == ["forged, her own key", "forged, no marker"]  # left in place

    dry = redrive(daemon, passfile, "--dry-run")  # a line per destination and status, not per message
    assert dry.returncode == 0, dry.stdout + dry.stderr
    rows = [line.split() for line in dry.stdout.splitlines()]
    assert rows[:2] == [["status", "messages", "destination", "link"], ["unverified", "2", "queue:rd.dst", "l1"]], (
        dry.stdout
    )
    assert "dry run: 2 chosen: 2 unverified" in dry.stdout
    verbose = redrive(daemon, passfile, "--dry-run", "-v")
    assert sum(line.startswith("unverified ") for line in verbose.stdout.splitlines()) == 2, verbose.stdout

    again = redrive(daemon, passfile)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "2 chosen: 2 unverified" in again.stdout
    assert "skipped 2 message(s) the bridge did not dead-letter" in again.stdout
    assert take(daemon, PASSWORD, "rd.dst", quiet=0.5) == []


def test_the_dmq_marker_is_on_what_the_bridge_dead_letters(service):
    daemon, _ = service
    send(daemon, PASSWORD, "rd.src", "bad again")
    got = take(daemon, PASSWORD, BUILTIN_DMQ_DESTINATION, expect=1)
    real = [m for m in got if m.get_body().text == "bad again"]
    assert real and len(real[0].get_string_property(DMQ_MARKER)) == 64
