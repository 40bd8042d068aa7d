"""A Spark link's executor side without Spark: a Transfer sends a log slice within the
link's confirm window (send_async, a flush per window and at the end of the task), and the
target sees every message in order before write() returns."""

from __future__ import annotations

import dataclasses
import shutil
import socket
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from bridgemgr.jms import TextMessage, codec
from bridgemgr.jms.destination import Queue
from bridgemgr.jms.errors import TransportException
from bridgemgr.jmsbridge.dmq import DMQ_REASON
from bridgemgr.props import LINK_WINDOW_BYTES, load_properties
from bridgemgr.providers.embedded import Broker
from bridgemgr.providers.embedded.broker import DestinationLimits
from bridgemgr.spark.log import SourceLog
from bridgemgr.spark.options import SOURCE_ID_PROPERTY
from bridgemgr.spark.runner import link_options, spark_link_options
from bridgemgr.spark.slices import spill, spill_folder
from bridgemgr.spark.transfer import Transfer

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS / "remote")]
from support import Harness  # noqa: E402

from jmsbridge_support import BUILTIN_DMQ, bridge_xml, drain, link_xml  # noqa: E402

LIMIT = 400  # bytes: the target refuses a message larger than this


@pytest.fixture
def link(tmp_path, monkeypatch):
    """A persistent broker whose `dst` refuses big messages, a link src -> dst, its options
    and source log; a window of 4 messages."""
    broker = Broker(tmp_path / "store")
    broker.configure_destination(Queue("dst"), DestinationLimits(max_bytes_per_msg=LIMIT))
    harness = Harness(broker)
    xml = tmp_path / "b.xml"
    xml.write_bytes(bridge_xml(link_xml("l")))
    options = link_options(
        tmp_path / "checkpoint", xmlurl=str(xml), bridge="b", link="l", broker_url=harness.url, window=4
    )
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


class Flushes:
    """Counts the sends and flushes of the Transfer's producers."""

    def __init__(self, transfer: Transfer, at_flush=None) -> None:
        self.sends, self.waiting_sends, self.flushes = 0, 0, 0
        open_target = transfer.open_target

        def spying():
            session, producer = open_target()
            send_async, send, flush = producer.send_async, producer.send, producer.flush

            def counted_send_async(*args, **kwargs):
                self.sends += 1
                return send_async(*args, **kwargs)

            def counted_send(*args, **kwargs):
                self.waiting_sends += 1
                return send(*args, **kwargs)

            def counted_flush():
                self.flushes += 1
                if at_flush is not None:
                    at_flush(self.flushes)
                return flush()

            producer.send_async, producer.send, producer.flush = counted_send_async, counted_send, counted_flush
            return session, producer

        transfer.open_target = spying  # type: ignore[method-assign]


def test_sends_flush_once_per_window_in_log_order_and_a_refused_one_goes_alone(link):
    broker, options, log = link
    texts = [f"m{i}" for i in range(23)]
    texts[10] = "big " + "x" * 2 * LIMIT  # refused by the target: that message alone
    end = logged(log, 0, texts)
    transfer = Transfer(options)
    spy = Flushes(transfer)

    counts = transfer.write(iter(offsets(0, end)))

    assert (counts.rows, counts.transferred, counts.to_dmq) == (23, 22, 1)
    assert counts.reasons == {"SEND_FAILURE": 1}
    assert (spy.sends, spy.waiting_sends, spy.flushes) == (23, 0, 6)  # windows of 4, and the rest
    # everything confirmed before write() returned, in the order of the log
    got = drain(broker, "dst")
    assert [m.text for m in got] == [t for t in texts if not t.startswith("big")]
    assert [m.get_string_property(SOURCE_ID_PROPERTY) for m in got[:3]] == ["ID:src-0", "ID:src-1", "ID:src-2"]
    dead = drain(broker, BUILTIN_DMQ)
    assert [m.get_string_property(DMQ_REASON) for m in dead] == ["SEND_FAILURE"]

    # the worker's next task (worker reuse) finds the Transfer and its connection
    end2 = logged(log, end, ["n0", "n1", "n2", "n3", "n4"])
    counts = transfer.write(iter(offsets(end, end2)))
    assert (counts.rows, counts.transferred) == (5, 5)
    assert [m.text for m in drain(broker, "dst")] == ["n0", "n1", "n2", "n3", "n4"]


def test_a_target_lost_mid_task_fails_it_and_the_batch_runs_again_at_least_once(link):
    """The connection drops at the second window's flush: the task fails (Spark runs the
    batch again), the next task starts on a new connection, and the target ends with every
    message; only those of the first two windows (sent before the loss) come twice, with
    the same source id."""
    broker, options, log = link
    end = logged(log, 0, [f"m{i}" for i in range(10)])
    transfer = Transfer(options)

    def drop_at_second(flushes: int) -> None:
        if flushes == 2:
            transfer._target.connection.channel._sock.shutdown(socket.SHUT_RDWR)

    Flushes(transfer, drop_at_second)

    with pytest.raises(TransportException):
        transfer.write(iter(offsets(0, end)))
    counts = transfer.write(iter(offsets(0, end)))
    assert (counts.rows, counts.transferred) == (10, 10)
    messages = drain(broker, "dst")
    got = [m.text for m in messages]
    assert sorted(set(got)) == sorted(f"m{i}" for i in range(10))
    twice = [t for t in set(got) if got.count(t) > 1]
    assert set(twice) <= {f"m{i}" for i in range(8)} and all(got.count(t) == 2 for t in twice)
    assert got[-10:] == [f"m{i}" for i in range(10)]  # the rerun, in order
    ids = {(m.text, m.get_string_property(SOURCE_ID_PROPERTY)) for m in messages}
    assert len(ids) == 10  # a duplicate carries its original's source id


def test_the_links_window_property_in_the_xml_is_the_transfers_window(link, tmp_path):
    _, options, _ = link
    xml = tmp_path / "w.xml"
    xml.write_bytes(bridge_xml(link_xml("l").replace("</link>", '<property name="window" value="7"/></link>')))
    assert Transfer(options).window == 4
    assert Transfer(dataclasses.replace(options, xmlurl=str(xml))).window == 7


def test_a_task_confirms_when_its_outstanding_records_hold_window_bytes(link, tmp_path):
    """windowBytes bounds a window of big messages: a flush once the records handled since
    the last one hold that many bytes, however few; -1 leaves the count alone; the XML
    link's windowBytes wins over the option."""
    broker, options, log = link
    texts = [f"{i:03d}" + "x" * 200 for i in range(20)]  # records of 281-282 bytes
    end = logged(log, 0, texts)
    sizes = [len(record.blob) for record, _ in log.read(0, end)]
    assert max(sizes) < 300

    def flushes(opts) -> int:
        transfer = Transfer(opts)
        spy = Flushes(transfer)
        counts = transfer.write(iter(offsets(0, end)))
        assert (counts.rows, counts.transferred) == (20, 20)
        assert [m.text for m in drain(broker, "dst")] == texts
        return spy.flushes

    counted = dataclasses.replace(options, window=1000)
    assert flushes(dataclasses.replace(counted, window_bytes=3 * 281)) == 7  # 6 x 3, and 2
    assert flushes(dataclasses.replace(counted, window_bytes=1)) == 20  # a message alone
    assert flushes(dataclasses.replace(counted, window_bytes=-1)) == 1  # the count alone
    xml = tmp_path / "wb.xml"
    xml.write_bytes(bridge_xml(link_xml("l").replace("</link>", '<property name="windowBytes" value="1k"/></link>')))
    assert flushes(dataclasses.replace(counted, xmlurl=str(xml), window_bytes=-1)) == 5  # 4 x 4


@pytest.mark.parametrize(
    "lines,window_bytes",
    [
        ([], LINK_WINDOW_BYTES),
        (["imq.bridge.b.link.windowBytes=512k"], 512 * 1024),
        (["imq.bridge.b.link.windowBytes=-1"], -1),
    ],
)
def test_a_service_links_options_carry_the_bridges_link_window_bytes(tmp_path, lines, window_bytes):
    file = tmp_path / "broker.properties"
    file.write_text(
        "\n".join(
            [
                f"imq.varhome={tmp_path / 'var'}",
                "imq.bridge.b.type=jms",
                "imq.bridge.b.xmlurl=/b.xml",
                "imq.bridge.b.runner=spark",
                *lines,
            ]
        )
        + "\n"
    )
    options, _ = spark_link_options(load_properties([file], environ={}), "b", "l", "mq://127.0.0.1:1")
    assert options.window_bytes == window_bytes


def test_a_transfer_sends_shipped_records_with_the_source_log_gone(link):
    """Transfer.write with ship_log: the records come from the spill, the target gets
    each once, in log order, stamped with the source message id."""
    broker, options, log = link
    options = dataclasses.replace(options, ship_log=True)
    texts = [f"s{i}" for i in range(10)]
    end = logged(log, 0, texts)
    spill(options, 0, end, log.pack(0, end))
    shutil.rmtree(options.source_log)
    counts = Transfer(options).write(iter(offsets(0, end)))
    assert (counts.rows, counts.transferred) == (10, 10)
    got = drain(broker, "dst")
    assert [m.text for m in got] == texts
    assert [m.get_string_property(SOURCE_ID_PROPERTY) for m in got] == [f"ID:src-{i}" for i in range(10)]
    assert not spill_folder(options, 0, end).exists()
