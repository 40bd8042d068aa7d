"""A link's excused redeliveries (a database outage's rollbacks) kept on disk: a restart of
the link, or of the service after kill -9, reads them again, as the source broker keeps
the delivery counts they offset (before, they lived in memory and a restart after an
outage sent healthy messages to the DMQ as backed out)."""

from __future__ import annotations

import json
import logging
import stat

from bridgemgr.jms import TextMessage
from bridgemgr.jmsbridge import excuses
from bridgemgr.jmsbridge.batch import Batch
from bridgemgr.jmsbridge.counters import LinkCounters
from bridgemgr.jmsbridge.excuses import Excuses, excuses_path
from bridgemgr.jmsbridge.pipeline import ProcessingContext


def ctx(message_id: str) -> ProcessingContext:
    message = TextMessage("x")
    message.message_id = message_id
    return ProcessingContext(message, 0)


def test_excuses_outlive_the_batch_that_made_them(tmp_path):
    path = excuses_path(tmp_path / "bridges" / "jb", "l1")
    batch = Batch(10, LinkCounters(), Excuses(path))
    batch.restart()
    batch.excuse([ctx("ID:1"), ctx("ID:2")])
    batch.excuse_id("ID:1")
    again = Batch(10, LinkCounters(), Excuses(path))  # a new process: the link starts
    again.restart()
    assert (again.excused.get("ID:1"), again.excused.get("ID:2")) == (2, 1)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_a_final_unit_forgets_its_excuses_on_disk(tmp_path):
    path = tmp_path / "excused.l1"
    batch = Batch(10, LinkCounters(), Excuses(path))
    batch.excuse([ctx("ID:1"), ctx("ID:2")])
    batch.final([ctx("ID:1")])
    assert json.loads(path.read_text()) == {"ID:2": 1}
    batch.final([ctx("ID:3")])  # nothing of it excused: nothing to write
    assert json.loads(path.read_text()) == {"ID:2": 1}


def test_a_message_without_an_id_is_not_excused(tmp_path):
    path = tmp_path / "excused.l1"
    excused = Excuses(path)
    excused.add(["", ""])
    assert not excused and not path.exists()


def test_without_a_file_a_restart_forgets_them():
    batch = Batch(10, LinkCounters())
    batch.excuse([ctx("ID:1")])
    batch.restart()
    assert not batch.excused


def test_an_unreadable_file_is_reported_and_left_out(tmp_path, caplog):
    path = tmp_path / "excused.l1"
    for text in ("{not json", '["ID:1"]', '{"ID:1": "two"}', '{"ID:1": 0}', '{"ID:1": true}'):
        path.write_text(text)
        excused = Excuses(path, logging.getLogger("t"))
        with caplog.at_level(logging.WARNING):
            excused.load()
        assert not excused, text
        assert str(path) in caplog.text and "cannot be read" in caplog.text
        caplog.clear()


def test_a_failed_write_keeps_them_in_memory(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    excused = Excuses(blocker / "excused.l1")  # its folder cannot be made
    with caplog.at_level(logging.WARNING):
        excused.add(["ID:1"])
    assert excused.get("ID:1") == 1
    assert "cannot be written" in caplog.text


def test_at_most_limit_ids_are_kept_the_oldest_go_first(tmp_path, monkeypatch):
    monkeypatch.setattr(excuses, "LIMIT", 3)
    path = tmp_path / "excused.l1"
    excused = Excuses(path)
    for i in range(5):
        excused.add([f"ID:{i}"])
    excused.add(["ID:2"])  # excused again: now the newest
    excused.add(["ID:5"])
    assert json.loads(path.read_text()) == {"ID:4": 1, "ID:2": 2, "ID:5": 1}
    again = Excuses(path)
    again.load()
    assert [again.get(f"ID:{i}") for i in range(6)] == [0, 0, 2, 0, 1, 1]
