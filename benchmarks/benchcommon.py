"""What the benchmarks share: a paced send-to-receive latency run and its percentiles."""

from __future__ import annotations

import statistics
import threading
import time

from bridgemgr.jms import BytesMessage
from bridgemgr.jms.spi import MessageConsumer, MessageProducer


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50, p99 and mean of latencies in seconds, as milliseconds."""
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50_ms": round(pick(0.50) * 1e3, 3), "p99_ms": round(pick(0.99) * 1e3, 3),
            "mean_ms": round(statistics.fmean(ordered) * 1e3, 3)}


def paced_latency(producer: MessageProducer, consumer: MessageConsumer, n: int, body: bytes,
                  rate: int = 1000, timeout: float = 10.0) -> list[float]:
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
