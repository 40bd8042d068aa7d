"""A Spark link's executor side without Spark: a Transfer sends a log slice in chunks on
two sessions, one committing while the other fills, and the target sees them in order."""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from bridgemgr.jms import TextMessage, codec
from bridgemgr.jms.destination import Queue
from bridgemgr.jms.errors import TransportException
from bridgemgr.jmsbridge.dmq import DMQ_REASON
from bridgemgr.providers.embedded import Broker
from bridgemgr.providers.embedded.broker import DestinationLimits
from bridgemgr.spark import transfer as transfer_module
from bridgemgr.spark.log import SourceLog
from bridgemgr.spark.options import SOURCE_ID_PROPERTY
from bridgemgr.spark.runner import link_options
from bridgemgr.spark.transfer import Transfer

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS / "remote")]
from support import Harness  # noqa: E402

from jmsbridge_support import BUILTIN_DMQ, bridge_xml, drain, link_xml  # noqa: E402

LIMIT = 400  # bytes: the target refuses a message larger than this


@pytest.fixture
def link(tmp_path, monkeypatch):
    """A persistent broker whose `dst` refuses big messages, a link src -> dst, its options
    and source log; chunks of 4 messages."""
    monkeypatch.setattr(transfer_module, "CHUNK", 4)
    broker = Broker(tmp_path / "store")
    broker.configure_destination(Queue("dst"), DestinationLimits(max_bytes_per_msg=LIMIT))
    harness = Harness(broker)
    xml = tmp_path / "b.xml"
    xml.write_bytes(bridge_xml(link_xml("l")))
    options = link_options(tmp_path / "checkpoint", xmlurl=str(xml), bridge="b", link="l",
                           broker_url=harness.url)
    yield broker, options, SourceLog(options.source_log).open()
    harness.close()
    broker.close()


def logged(log: SourceLog, start: int, texts: list[str]) -> int:
    records = []
    for i, text in enumerate(texts, start):
        m = TextMessage(text)
        m.message_id = f"ID:src-{i}"
        records.append((m.message_id, codec.encode(m)))
    return log.append(start, records, "imqbridge embedded broker")


def offsets(lo: int, hi: int) -> list[pa.RecordBatch]:
    return [pa.record_batch([pa.array(range(lo, hi), pa.int64())], names=["offset"])]


def test_chunks_commit_while_the_next_fills_in_log_order_and_a_refused_one_goes_singly(link):
    broker, options, log = link
    texts = [f"m{i}" for i in range(23)]
    texts[10] = "big " + "x" * 2 * LIMIT  # its chunk (8 .. 11) is refused at commit
    end = logged(log, 0, texts)
    transfer = Transfer(options)
    committers: set[str] = set()
    commit = transfer._committer.submit

    def spy(fn, *args):  # which thread commits
        return commit(lambda: (committers.add(threading.current_thread().name), fn(*args))[1])
    transfer._committer.submit = spy  # type: ignore[method-assign]

    counts = transfer.write(iter(offsets(0, end)))

    assert (counts.rows, counts.transferred, counts.to_dmq) == (23, 22, 1)
    assert counts.reasons == {"SEND_FAILURE": 1}
    assert committers == {"commit l_0"}  # six chunks, each committed by the committer
    # everything committed before write() returned, in the order of the log
    got = drain(broker, "dst")
    assert [m.text for m in got] == [t for t in texts if not t.startswith("big")]
    assert [m.get_string_property(SOURCE_ID_PROPERTY) for m in got[:3]] == [
        "ID:src-0", "ID:src-1", "ID:src-2"]
    dead = drain(broker, BUILTIN_DMQ)
    assert [m.get_string_property(DMQ_REASON) for m in dead] == ["SEND_FAILURE"]

    # the worker's next task (worker reuse) finds the Transfer and its connection
    end2 = logged(log, end, ["n0", "n1", "n2", "n3", "n4"])
    counts = transfer.write(iter(offsets(end, end2)))
    assert (counts.rows, counts.transferred) == (5, 5)
    assert [m.text for m in drain(broker, "dst")] == ["n0", "n1", "n2", "n3", "n4"]


def test_a_target_lost_mid_task_fails_it_and_the_batch_runs_again_at_least_once(link):
    """The connection drops while a chunk is in commit: the task fails (Spark runs the
    batch again), the next task starts on a new connection, and the target ends with every
    message, the ones committed before the loss twice, with the same source id."""
    broker, options, log = link
    end = logged(log, 0, [f"m{i}" for i in range(10)])
    transfer = Transfer(options)
    submit, submitted = transfer._committer.submit, []

    def drop_at_second(fn, *args):  # chunk 0-3 is committed; 4-7's commit meets a dead line
        submitted.append(fn)
        if len(submitted) == 2:
            transfer._target.connection.channel._sock.shutdown(socket.SHUT_RDWR)
        return submit(fn, *args)
    transfer._committer.submit = drop_at_second  # type: ignore[method-assign]

    with pytest.raises(TransportException):
        transfer.write(iter(offsets(0, end)))
    counts = transfer.write(iter(offsets(0, end)))
    assert (counts.rows, counts.transferred) == (10, 10)
    got = drain(broker, "dst")
    assert sorted(m.text for m in got) == sorted([f"m{i}" for i in range(10)]
                                                 + ["m0", "m1", "m2", "m3"])
    ids = {(m.text, m.get_string_property(SOURCE_ID_PROPERTY)) for m in got}
    assert len(ids) == 10  # a duplicate carries its original's source id
