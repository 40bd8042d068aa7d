"""What the benchmarks share: a paced send-to-receive latency run and its percentiles."""

from __future__ import annotations

import contextlib
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bridgemgr.jms import BytesMessage
from bridgemgr.jms.spi import MessageConsumer, MessageProducer


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50, p99 and mean of latencies in seconds, as milliseconds."""
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {
        "p50_ms": round(pick(0.50) * 1e3, 3),
        "p99_ms": round(pick(0.99) * 1e3, 3),
        "mean_ms": round(statistics.fmean(ordered) * 1e3, 3),
    }


def paced_latency(
    producer: MessageProducer, consumer: MessageConsumer, n: int, body: bytes, rate: int = 1000, timeout: float = 10.0
) -> list[float]:
    """Send ``n`` messages at ``rate`` msg/s (flat-out latency is only backlog) while a
    thread receives them; each sample is send-to-receive time in seconds."""
    samples: list[float] = []

    def receive() -> None:
        for _ in range(n):
            m = consumer.receive(timeout)
            samples.append(time.perf_counter() - m.get_double_property("t"))

    t = threading.Thread(target=receive)
    t.start()
    start = time.perf_counter()
    for i in range(n):
        due = start + i / rate
        while (now := time.perf_counter()) < due:
            time.sleep(min(due - now, 0.0005))
        m = BytesMessage(body)
        m.set_double_property("t", time.perf_counter())
        producer.send(m)
    t.join()
    return samples


@contextlib.contextmanager
def postgresql(store: str) -> Iterator[Any]:
    """For --store jdbc a PostgreSQL server of the Debian package on 127.0.0.1 in a
    temporary directory (tests/pgserver.py), stopped and removed after; None for file."""
    if store != "jdbc":
        yield None
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from pgserver import PostgreSQL, missing_postgresql

    reason = missing_postgresql()
    if reason:
        raise SystemExit(reason)
    base = Path(tempfile.mkdtemp(prefix="imqbridge-bench-postgresql-"))
    server = PostgreSQL(base)
    try:
        yield server.start()
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


def jdbc_broker(server: Any, schema: str, sync: bool) -> Any:
    """An embedded broker whose store is ``schema`` of the PostgreSQL ``server``."""
    from bridgemgr.providers.embedded import Broker
    from bridgemgr.providers.embedded.pgstore import JdbcSettings, PostgresDatabase

    return Broker(None, sync=sync, database=PostgresDatabase(JdbcSettings(server.conninfo(), schema), sync))
