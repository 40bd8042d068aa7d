"""Link counters and the runners' locks: a restarted bridge counts into the counters it
shows, a runner keeps counters of its own kind only, counters that several threads
write count every write, a Spark link's snapshot changes nothing, and a parallel link
whose worker fails does not hold its start command for the whole start timeout; a
link's history keeps an hour of rates and latencies in a ring of fixed length."""

from __future__ import annotations

import logging
import sys
import threading
import time

import pytest

from bridgemgr.jms.destination import Queue
from bridgemgr.jmsbridge.config import parse_bridge_config
from bridgemgr.jmsbridge.connections import ConnectionKind
from bridgemgr.jmsbridge.counters import LinkCounters, LinkHistory, SharedCounters
from bridgemgr.jmsbridge.runners import LinkSetup, LinkTuning
from bridgemgr.jmsbridge.states import State
from bridgemgr.jmsbridge.transfer import ClientAcknowledge
from bridgemgr.parallel.runner import ParallelCounters, ParallelLink
from bridgemgr.parallel.worker import WorkerOptions
from bridgemgr.spark.counts import BatchCounts
from bridgemgr.spark.runner import SparkCounters
from bridgemgr.spark.sink import record_batch
from jmsbridge_support import bridge_xml, drain, link_xml, make_bridge, send, wait_until

pytestmark = pytest.mark.timeout(60)


def counters_of(bridge, link="l"):
    return next(row["counters"] for row in bridge.info()["links"] if row["name"] == link)


@pytest.mark.slow
def test_a_restarted_bridge_counts_transfers_in_the_counters_it_shows(broker):
    bridge = make_bridge(broker, bridge_xml(link_xml("l")))
    try:
        bridge.start()
        send(broker, "src", ["a", "b"])
        assert len(drain(broker, "dst", expect=2)) == 2
        wait_until(lambda: counters_of(bridge)["transferred"] == 2, what="2 transferred")
        bridge.stop()
        bridge.start()
        send(broker, "src", ["c", "d", "e"])
        assert len(drain(broker, "dst", expect=3)) == 3
        # the link's thread counts a unit once its acknowledgement is done, after the drain
        wait_until(lambda: counters_of(bridge)["transferred"] == 5, what="5 transferred")
        assert counters_of(bridge)["received"] == 5
    finally:
        bridge.stop()


def _setup(counters: LinkCounters | None = None, parallelism: int = 2) -> LinkSetup:
    config = parse_bridge_config(bridge_xml(link_xml("l")), "test.xml")
    return LinkSetup(
        config=config.links[0],
        bridge=config,
        source=Queue("src"),
        target=Queue("dst"),
        target_kind=ConnectionKind.DEDICATED,
        transaction=ClientAcknowledge,
        parallelism=parallelism,
        counters=counters,
    )


def _parallel(
    counters: LinkCounters | None = None, xmlurl: str = "", tuning: LinkTuning = LinkTuning()
) -> ParallelLink:
    base = WorkerOptions(
        xmlurl=xmlurl,
        bridge="b",
        link="l",
        broker_url="mq://127.0.0.1:1",
        broker_user="u",
        broker_password="p",
        dmq_secret="00",
        transformer_path="",
        backout_threshold=0,
        window=1,
        window_bytes=-1,
        index=0,
    )
    return ParallelLink(_setup(counters), base, logging.getLogger("test.parallel"), tuning)


def test_a_runner_keeps_the_counters_of_its_own_kind_only():
    plain = LinkCounters(received=7)
    link = _parallel(plain)  # the link ran locally before: its workers' reports must count
    assert isinstance(link.counters, ParallelCounters) and link.counters is not plain
    link.totals.report(0, {**LinkCounters(received=3, transferred=3).snapshot()})
    assert link.counters.snapshot()["transferred"] == 3
    again = _parallel(link.counters)  # restarted with the same runner: the same counters
    assert again.counters is link.counters


def test_an_ended_workers_counts_stay_but_not_its_rate():
    counters = ParallelCounters()
    report = {**LinkCounters(transferred=120).snapshot(), "rate": 2.0}
    counters.report(0, report)
    counters.report(1, {**report, "transferred": 60, "rate": 1.0})
    assert (counters.snapshot()["transferred"], counters.snapshot()["rate"]) == (180, 3.0)
    counters.worker_ended(0)  # stopped: it transfers nothing any more
    assert (counters.snapshot()["transferred"], counters.snapshot()["rate"]) == (180, 1.0)


def test_restarts_from_many_threads_are_counted_exactly():
    counters = SharedCounters()
    threads, each = 8, 5000
    barrier = threading.Barrier(threads)
    interval = sys.getswitchinterval()

    def restart(i: int) -> None:
        barrier.wait()
        for _ in range(each):
            counters.restarted(f"worker {i} ended")

    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        workers = [threading.Thread(target=restart, args=(i,)) for i in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    snap = counters.snapshot()
    assert snap["reconnects"] == threads * each
    assert snap["last_error"] in {f"worker {i} ended" for i in range(threads)}


def test_a_write_waits_for_a_snapshot_under_way():
    counters = ParallelCounters()
    done = threading.Event()
    with counters.lock:  # as snapshot() holds it
        writer = threading.Thread(target=lambda: (counters.restarted("worker 0 ended"), done.set()))
        writer.start()
        assert not done.wait(0.2) and counters.reconnects == 0
    assert done.wait(10) and counters.snapshot()["reconnects"] == 1
    writer.join()


def _stats(tmp_path):
    stats = tmp_path / "stats"
    record_batch(stats, 0, BatchCounts(rows=5, transferred=3, to_dmq=2, reasons={"TRANSFORMER_FAILURE": 2}))
    return stats


def test_a_spark_snapshot_changes_nothing_that_other_threads_read(tmp_path):
    counters = SparkCounters(str(_stats(tmp_path)))
    reasons = counters.dmq_reasons
    snap = counters.snapshot()
    assert (snap["received"], snap["transferred"], snap["to_dmq"]) == (5, 3, 2)
    assert snap["dmq_reasons"] == {"TRANSFORMER_FAILURE": 2}
    # the counters' own fields are as they were: only the runner's threads write them
    assert (counters.received, counters.transferred, counters.to_dmq) == (0, 0, 0)
    assert counters.dmq_reasons is reasons and not reasons


def test_a_spark_snapshot_that_cannot_read_the_stats_answers_with_the_last_totals(tmp_path):
    stats = _stats(tmp_path)
    counters = SparkCounters(str(stats))
    first = counters.snapshot()
    stats.unlink()
    stats.mkdir()  # reading it fails (IsADirectoryError)
    again = counters.snapshot()
    assert (
        (again["received"], again["dmq_reasons"])
        == (first["received"], first["dmq_reasons"])
        == (5, {"TRANSFORMER_FAILURE": 2})
    )


@pytest.mark.slow
def test_a_failed_worker_does_not_hold_the_start_for_the_start_timeout(tmp_path):
    tuning = LinkTuning(start_timeout=10)
    link = _parallel(xmlurl=str(tmp_path / "missing.xml"), tuning=tuning)  # every worker fails
    started = time.monotonic()
    state = link.start()
    took = time.monotonic() - started
    try:
        assert state is State.STOPPED, state
        assert took < tuning.start_timeout / 2, took  # was the whole start timeout (10 s)
        assert "worker" in (link.counters.snapshot()["last_error"] or "")
    finally:
        link.stop()


def test_a_links_history_gives_rate_and_latency_per_interval_and_stays_an_hour_long():
    counters, history = LinkCounters(), LinkHistory(step=10, span=3600)
    start = 1_000_000.0
    assert history.due(start) and history.intervals() == []
    history.sample(counters.snapshot(), start)
    assert not history.due(start + 9.9) and history.due(start + 10)
    counters.transferred_unit(50, [int(start * 1000) + 9_000] * 50, int(start * 1000) + 9_020)  # 20 ms each
    history.sample(counters.snapshot(), start + 10)
    history.sample(counters.snapshot(), start + 20)  # idle
    assert history.intervals() == [
        {"end": start + 10, "seconds": 10, "transferred": 50, "rate": 5.0, "latency_ms": 20.0},
        {"end": start + 20, "seconds": 10, "transferred": 0, "rate": 0.0, "latency_ms": None},
    ]
    fresh = LinkCounters()  # a restart with new counters: they count from zero, not negative
    fresh.transferred_unit(10, [0] * 10, 40)
    history.sample(fresh.snapshot(), start + 30)
    assert history.intervals()[-1]["transferred"] == 10 and history.intervals()[-1]["latency_ms"] == 40.0
    for i in range(4, 10_000):  # days of samples: still an hour of intervals
        history.sample(fresh.snapshot(), start + 10 * i)
    intervals = history.intervals()
    assert len(intervals) == 360 and intervals[0]["end"] == start + 10 * (10_000 - 360)
