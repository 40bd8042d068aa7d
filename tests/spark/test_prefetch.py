"""The driver's process receives into a Spark link's source log while the query starts,
and hands the log over to the query's own receiver: one writer at a time, every message
logged once, in order, acknowledged at the source only once logged."""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from bridgemgr.providers.embedded import Broker
from bridgemgr.spark.log import SourceLog, SourceLogError
from bridgemgr.spark.receiver import Receiver
from bridgemgr.spark.runner import link_options

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS / "remote")]
from support import Harness  # noqa: E402

from jmsbridge_support import bridge_xml, link_xml, send, wait_until  # noqa: E402

BATCH = 1000  # messages per batch: a prefetcher logs up to two batches, in segments of 500


@pytest.fixture
def host(tmp_path):
    broker = Broker(tmp_path / "store")
    harness = Harness(broker)
    yield broker, harness
    harness.close()
    broker.close()


def options_for(tmp_path, harness, links: str, dests: str = ""):
    tmp_path.mkdir(exist_ok=True)
    xml = tmp_path / "b.xml"
    xml.write_bytes(bridge_xml(links, dests=dests))
    return link_options(
        tmp_path / "checkpoint",
        xmlurl=str(xml),
        bridge="b",
        link="l",
        broker_url=harness.url,
        max_per_batch=BATCH,
        receive_wait=0.5,
    )


def depth(broker, name: str) -> int:
    found = broker.destinations().get(f"queue:{name}")
    return found["pending"] + found["unacked"] if found else 0


def test_the_prefetcher_hands_the_log_over_and_every_message_is_logged_once_in_order(tmp_path, host):
    broker, harness = host
    sent = send(broker, "src", [f"m{i}" for i in range(3000)])
    options = options_for(tmp_path, harness, link_xml("l"))
    prefetcher = Receiver.prefetching(options)
    assert prefetcher is not None
    assert Receiver.prefetching(options) is None  # one writer at a time
    thread = threading.Thread(target=prefetcher.prefetch, args=(lambda: True,), daemon=True)
    thread.start()
    log = SourceLog(options.source_log)
    # two batches beyond the log's start, then it waits (flow control)
    wait_until(lambda: (log.bounds() or (0, 0))[1] == 2 * BATCH, 20, "the prefetch")
    time.sleep(3 * 0.2)
    assert log.bounds() == (0, 2 * BATCH) and depth(broker, "src") == 1000  # acknowledged

    receiver = Receiver(options)  # the source runner's: asks for the log and gets it
    thread.join(5)
    assert not thread.is_alive() and receiver.end == 2 * BATCH
    receiver.until_empty = True
    while receiver.end < 3000:
        receiver.logged_beyond(receiver.end - BATCH, 5.0)  # Spark plans the next batch
    assert depth(broker, "src") == 0
    receiver.stop()  # the query ended: its thread must not go on reconnecting to the source
    assert receiver._thread is not None and not receiver._thread.is_alive()
    again = Receiver.prefetching(options)
    assert again is not None  # the log was let go
    again.log.let_go()

    records = [r for r, _ in log.read(0, 3000)]
    assert [r.offset for r in records] == list(range(3000))
    assert [r.message_id for r in records] == [m.message_id for m in sent]


def test_a_prefetcher_lets_go_when_the_query_ends_and_skips_a_non_durable_topic(tmp_path, host):
    broker, harness = host
    send(broker, "src", [f"m{i}" for i in range(100)])
    options = options_for(tmp_path, harness, link_xml("l"))
    active = threading.Event()
    active.set()
    prefetcher = Receiver.prefetching(options)
    thread = threading.Thread(target=prefetcher.prefetch, args=(active.is_set,), daemon=True)
    thread.start()
    wait_until(lambda: depth(broker, "src") == 0, 20, "the prefetch")
    active.clear()  # the query ended before its receiver came
    thread.join(5)
    assert not thread.is_alive()
    assert Receiver.prefetching(options) is not None  # the log is free again

    topic = options_for(
        tmp_path / "t",
        harness,
        link_xml("l", src="news"),
        dests='<destination ref-name="news" name="news" type="topic"/>',
    )
    prefetcher = Receiver.prefetching(topic)
    started = time.monotonic()
    prefetcher.prefetch(lambda: True)  # returns at once: a handover would leave a gap
    assert time.monotonic() - started < 5 and prefetcher._handle is None


def test_a_writer_that_does_not_hand_over_is_named(tmp_path):
    log = SourceLog(tmp_path / "sourcelog")
    assert log.own(wait=None)
    other = SourceLog(tmp_path / "sourcelog")
    assert not other.own(wait=None)
    with pytest.raises(SourceLogError, match=f"process {os.getpid()} still writes it"):
        other.own(wait=0.3)
    assert log.handover_requested()
    log.let_go()
    assert other.own(wait=1.0) and not other.handover_requested()


def test_a_prefetcher_that_cannot_reach_the_source_gives_up_at_once(tmp_path):
    """The factory retries without limit; a prefetch tries once and lets go (the query's
    own receiver keeps trying), so no thread of the service keeps dialling a gone broker."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    xml = tmp_path / "b.xml"
    xml.write_bytes(bridge_xml(link_xml("l")))
    options = link_options(
        tmp_path / "checkpoint",
        xmlurl=str(xml),
        bridge="b",
        link="l",
        broker_url=f"mq://127.0.0.1:{port}",
        max_per_batch=BATCH,
    )
    prefetcher = Receiver.prefetching(options)
    thread = threading.Thread(target=prefetcher.prefetch, args=(lambda: True,), daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    assert Receiver.prefetching(options) is not None  # the log is free again


@pytest.mark.parametrize(
    "window_bytes,xml_bytes,segment_bytes", [(64 * 1024, None, 64 * 1024), (-1, "32k", 32 * 1024), (-1, None, -1)]
)
def test_a_segment_ends_once_its_records_hold_the_links_window_bytes(
    tmp_path, host, window_bytes, xml_bytes, segment_bytes
):
    """Big messages: the receiver logs several segments of about windowBytes (the last
    record may cross it) instead of one of a tenth of a batch; the XML link's windowBytes
    wins; -1 leaves the count alone (one segment)."""
    broker, harness = host
    sent = send(broker, "src", [f"{i:02d}" + "x" * 10_000 for i in range(60)])
    prop = f'<property name="windowBytes" value="{xml_bytes}"/></link>' if xml_bytes else "</link>"
    options = options_for(tmp_path, harness, link_xml("l").replace("</link>", prop))
    receiver = Receiver(dataclasses.replace(options, window_bytes=window_bytes))
    receiver.until_empty = True
    while receiver.logged_beyond(receiver.end, 5.0) < 60:
        pass
    # what the source sends ahead is bounded likewise: three segments' worth (mq://)
    assert receiver._session.prefetch_bytes == (3 * segment_bytes if segment_bytes > 0 else 0)
    receiver.stop()
    assert depth(broker, "src") == 0
    log = SourceLog(options.source_log)
    records = [r for r, _ in log.read(0, 60)]
    assert [r.message_id for r in records] == [m.message_id for m in sent]
    size = len(records[0].blob)
    segments = log.segments()
    if segment_bytes < 0:
        assert len(segments) == 1
        return
    per_segment = -(-segment_bytes // size)  # the record that reaches the bound ends it
    assert [s.end - s.start for s in segments[:-1]] == [per_segment] * (len(segments) - 1)
    assert len(segments) == -(-60 // per_segment)
    assert all(s.path.stat().st_size < segment_bytes + size + 1024 for s in segments)
