"""Embedded broker throughput and latency; prints one JSON object.

    .venv/bin/python benchmarks/broker.py [--messages N] [--size BYTES]

Workloads (1 KiB BytesMessages through one queue, AUTO_ACKNOWLEDGE):
- flat-out produce+consume: one producer thread and one consumer thread at once;
  msg/s = messages / (first send .. last receive);
- backlog: produce everything, then consume everything (every persistent message
  is written to and deleted from the store);
- sync: persistent with fsync per group commit, 8 producer threads (group commit
  needs concurrent writers) and one consumer;
- latency: a paced producer at 1,000 msg/s; send-to-receive p50/p99.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import threading
import time
from pathlib import Path

from bridgemgr.jms import BytesMessage, DeliveryMode, Queue
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory

from benchcommon import paced_latency, percentiles

Q = Queue("bench")


def flat_out(broker: Broker, n: int, body: bytes, mode: DeliveryMode, producers: int = 1) -> dict:
    factory = EmbeddedConnectionFactory(broker)
    conn = factory.create_connection()
    conn.start()
    consumer = conn.create_session().create_consumer(Q)
    per = n // producers

    def produce() -> None:
        p = conn.create_session().create_producer(Q)
        p.delivery_mode = mode
        for _ in range(per):
            p.send(BytesMessage(body))

    threads = [threading.Thread(target=produce) for _ in range(producers)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    got = 0
    while got < per * producers:
        if consumer.receive(5) is None:
            raise RuntimeError(f"stalled after {got} messages")
        got += 1
    elapsed = time.perf_counter() - start
    for t in threads:
        t.join()
    conn.close()
    return {"messages": got, "seconds": round(elapsed, 3), "msg_per_s": round(got / elapsed)}


def backlog(broker: Broker, n: int, body: bytes, mode: DeliveryMode) -> dict:
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    session = conn.create_session()
    producer = session.create_producer(Q)
    producer.delivery_mode = mode
    t0 = time.perf_counter()
    for _ in range(n):
        producer.send(BytesMessage(body))
    if broker.store is not None:
        broker.store.flush()
    t1 = time.perf_counter()
    consumer = session.create_consumer(Q)
    for _ in range(n):
        consumer.receive(5)
    if broker.store is not None:
        broker.store.flush()
    t2 = time.perf_counter()
    conn.close()
    return {"produce_msg_per_s": round(n / (t1 - t0)), "consume_msg_per_s": round(n / (t2 - t1)),
            "msg_per_s": round(n / (t2 - t0))}


def latency(broker: Broker, n: int, body: bytes, mode: DeliveryMode, rate: int = 1000) -> dict:
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    consumer = conn.create_session().create_consumer(Q)
    producer = conn.create_session().create_producer(Q)
    producer.delivery_mode = mode
    samples = paced_latency(producer, consumer, n, body, rate, timeout=5)
    conn.close()
    return {"rate_msg_per_s": rate, **percentiles(samples)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--latency-messages", type=int, default=3000)
    args = ap.parse_args()
    body = bytes(range(256)) * (args.size // 256) + b"x" * (args.size % 256)
    n = args.messages
    out: dict = {"message_bytes": args.size, "messages": n}
    with tempfile.TemporaryDirectory() as tmp:
        runs = {
            "non_persistent": (None, False, DeliveryMode.NON_PERSISTENT),
            "persistent_no_sync": (Path(tmp) / "nosync", False, DeliveryMode.PERSISTENT),
            "persistent_sync": (Path(tmp) / "sync", True, DeliveryMode.PERSISTENT),
        }
        for name, (path, sync, mode) in runs.items():
            broker = Broker(path, sync=sync)
            result: dict = {}
            if sync:
                result["flat_out_8_producers"] = flat_out(broker, n // 2, body, mode, producers=8)
                result["flat_out_1_producer"] = flat_out(broker, n // 20, body, mode)
            else:
                result["flat_out"] = flat_out(broker, n, body, mode)
                result["backlog"] = backlog(broker, n, body, mode)
            result["latency_at_1000_msg_per_s"] = latency(broker, args.latency_messages, body, mode)
            if broker.store is not None:
                result["store"] = broker.store.stats()
            broker.close()
            out[name] = result
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
