"""JMS bridge link throughput and latency against the raw broker ceiling; prints JSON.

    .venv/bin/python benchmarks/link.py [--messages N] [--rounds R] [--ack-batch B]

One embedded broker with a persistent store (imq.persist.file.sync.enabled=false, the
default: each batch is handed to the OS, not fsynced), persistent 1 KiB BytesMessages,
one non-transacted link src -> dst, all in this process. Each measurement runs --rounds
times, interleaved, and the median is reported (this machine is shared and noisy):

- ceiling (raw_move): the same queues without the bridge: N messages waiting in src, one
  plain JMS client thread receives each (AUTO_ACKNOWLEDGE, the cheapest) and sends it to
  dst, flat out. It does the broker work the link does (N receives from src, N
  persistent sends to dst), so link / ceiling is the bridge's own cost plus that of
  CLIENT_ACKNOWLEDGE, which the chapter requires of a non-transacted link;
  raw_move_client_ack is the same client with CLIENT_ACKNOWLEDGE (the link minus the bridge);
- link: N messages waiting in src, the bridge started; msg/s = N / (start .. the last
  one on dst); with an acknowledge per message (the chapter's rule) and with acknowledge
  batches (--ack-batch, still at-least-once); log-message-transfer off, and once on (an
  INFO line per message into the bridge's log file);
- flat_out_produce_consume (reference): one producer thread and one consumer thread on
  one queue at once. Messages consumed before the store writes them never touch the disk,
  so this shape does less store work per message than either of the above;
- end_to_end: a producer thread into src, the link, a consumer thread on dst at once;
- latency: a paced producer (1,000 msg/s) into src; p50/p99 from send to receive on dst;
- transacted: the same drain on a transacted link (an XA transaction of the bridge's
  coordinator per unit; both ends are one embedded broker, one resource manager, so it
  commits in one phase), committing every 1 and every 100 messages (transaction.batchSize).

ratio_to_ceiling = link msg/s / raw_move msg/s; target_met says, per ceiling, whether the
better link run reaches >= 60% of it and >= 10,000 msg/s.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import threading
import time
from pathlib import Path

from bridgemgr.jms import AckMode, BytesMessage, DeliveryMode, Queue
from bridgemgr.jmsbridge.bridge import JMSBridge
from bridgemgr.jmsbridge.config import parse_bridge_config
from bridgemgr.jmsbridge.link import LinkTuning
from bridgemgr.props import load_properties
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory

from benchcommon import paced_latency, percentiles

SRC, DST = Queue("src"), Queue("dst")


def bridge_xml(log_transfers: bool, transacted: bool = False) -> bytes:
    return f"""<jmsbridge name="bench" log-message-transfer="{str(log_transfers).lower()}">
      <link name="l" transacted="{str(transacted).lower()}">
        <source connection-factory-ref="host" destination-ref="src"/>
        <target connection-factory-ref="host" destination-ref="dst"/>
      </link>
      <connection-factory ref-name="host"/>
      <destination ref-name="src" name="src"/><destination ref-name="dst" name="dst"/>
    </jmsbridge>""".encode()


def make_bridge(broker: Broker, var: Path, ack_batch: int, log_transfers: bool,
                tx_batch: int = 0) -> JMSBridge:
    """The bench bridge; tx_batch > 0: a transacted link committing every tx_batch messages."""
    settings = [f"imq.varhome={var}"]
    if tx_batch:
        settings += ["imq.bridge.bench.type=jms", "imq.bridge.bench.xmlurl=unused.xml",
                     f"imq.bridge.bench.transaction.batchSize={tx_batch}"]
    props = load_properties([], settings)
    return JMSBridge(parse_bridge_config(bridge_xml(log_transfers, tx_batch > 0)), props,
                     host_factory=lambda env: EmbeddedConnectionFactory(broker),
                     tuning=LinkTuning(ack_batch=ack_batch))


def produce(broker: Broker, n: int, body: bytes, dest: Queue = SRC) -> None:
    conn = EmbeddedConnectionFactory(broker).create_connection()
    producer = conn.create_session().create_producer(dest)
    producer.delivery_mode = DeliveryMode.PERSISTENT
    for _ in range(n):
        producer.send(BytesMessage(body))
    conn.close()


def consume(broker: Broker, n: int, dest: Queue) -> float:
    """Receive n messages; the time of the last one."""
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    consumer = conn.create_session().create_consumer(dest)
    for got in range(n):
        if consumer.receive(10) is None:
            raise RuntimeError(f"stalled after {got} messages on {dest}")
    conn.close()
    return time.perf_counter()


def flat_out(broker: Broker, n: int, body: bytes) -> dict:
    """One producer thread and one consumer thread on src, no bridge."""
    done: list[float] = []
    consumer = threading.Thread(target=lambda: done.append(consume(broker, n, SRC)))
    consumer.start()
    start = time.perf_counter()
    produce(broker, n, body)
    consumer.join()
    elapsed = done[0] - start
    return {"messages": n, "seconds": round(elapsed, 3), "msg_per_s": round(n / elapsed)}


def raw_move(broker: Broker, n: int, body: bytes, ack_mode: AckMode) -> dict:
    """n messages waiting in src; a plain client moves them to dst (no bridge)."""
    produce(broker, n, body)
    if broker.store is not None:
        broker.store.flush()
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    session = conn.create_session(ack_mode=ack_mode)
    consumer, producer = session.create_consumer(SRC), session.create_producer(DST)
    client_ack = ack_mode is AckMode.CLIENT_ACKNOWLEDGE
    start = time.perf_counter()
    for _ in range(n):
        m = consumer.receive(10)
        producer.send(m, delivery_mode=m.delivery_mode, priority=m.priority)
        if client_ack:
            session.acknowledge()
    elapsed = time.perf_counter() - start
    conn.close()
    consume(broker, n, DST)
    return {"messages": n, "seconds": round(elapsed, 3), "msg_per_s": round(n / elapsed)}


def link_drain(broker: Broker, var: Path, n: int, body: bytes, ack_batch: int,
               log_transfers: bool, tx_batch: int = 0) -> dict:
    """n messages waiting in src; the (started, then paused) bridge resumes and moves
    them all to dst; the time from resume to the last one on dst."""
    bridge = make_bridge(broker, var, ack_batch, log_transfers, tx_batch)
    bridge.start()
    bridge.pause()
    produce(broker, n, body)
    if broker.store is not None:
        broker.store.flush()
    start = time.perf_counter()
    bridge.resume()
    while broker.queue_depth("dst") < n:  # coarse: a busy poller would slow the link
        time.sleep(0.005)
    elapsed = time.perf_counter() - start
    bridge.stop()
    consume(broker, n, DST)  # empty it for the next run
    kind = {"transacted_batch": tx_batch} if tx_batch else {"ack_batch": ack_batch}
    return {**kind, "log_message_transfer": log_transfers, "messages": n,
            "seconds": round(elapsed, 3), "msg_per_s": round(n / elapsed)}


def end_to_end(broker: Broker, var: Path, n: int, body: bytes, ack_batch: int) -> dict:
    bridge = make_bridge(broker, var, ack_batch, False)
    bridge.start()
    done: list[float] = []
    consumer = threading.Thread(target=lambda: done.append(consume(broker, n, DST)))
    consumer.start()
    start = time.perf_counter()
    produce(broker, n, body)
    consumer.join()
    bridge.stop()
    elapsed = done[0] - start
    return {"ack_batch": ack_batch, "messages": n, "seconds": round(elapsed, 3),
            "msg_per_s": round(n / elapsed)}


def latency(broker: Broker, var: Path, n: int, body: bytes, ack_batch: int,
            rate: int = 1000) -> dict:
    bridge = make_bridge(broker, var, ack_batch, False)
    bridge.start()
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    receiver = conn.create_session().create_consumer(DST)
    producer = conn.create_session().create_producer(SRC)
    producer.delivery_mode = DeliveryMode.PERSISTENT
    samples = paced_latency(producer, receiver, n, body, rate)
    conn.close()
    bridge.stop()
    return {"ack_batch": ack_batch, "rate_msg_per_s": rate, **percentiles(samples)}


def median_run(runs: list[dict]) -> dict:
    ordered = sorted(runs, key=lambda r: r["msg_per_s"])
    return {**ordered[len(ordered) // 2], "all_msg_per_s": [r["msg_per_s"] for r in runs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=30_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--latency-messages", type=int, default=3000)
    ap.add_argument("--ack-batch", type=int, default=100)
    args = ap.parse_args()
    body = bytes(range(256)) * (args.size // 256) + b"x" * (args.size % 256)
    n = args.messages
    out: dict = {"message_bytes": args.size, "messages": n, "rounds": args.rounds,
                 "store": "persistent, no fsync"}
    with tempfile.TemporaryDirectory() as tmp:
        var = Path(tmp) / "var"
        broker = Broker(Path(tmp) / "store")
        ceiling, client, link_1, link_b, flat = [], [], [], [], []
        for _ in range(args.rounds):
            ceiling.append(raw_move(broker, n, body, AckMode.AUTO_ACKNOWLEDGE))
            link_1.append(link_drain(broker, var, n, body, 1, False))
            client.append(raw_move(broker, n, body, AckMode.CLIENT_ACKNOWLEDGE))
            link_b.append(link_drain(broker, var, n, body, args.ack_batch, False))
            flat.append(flat_out(broker, n, body))
        out["ceiling_raw_move"] = median_run(ceiling)
        out["raw_move_client_ack"] = median_run(client)
        out["link"] = [median_run(link_1), median_run(link_b),
                       link_drain(broker, var, n // 2, body, 1, True)]
        out["transacted"] = [link_drain(broker, var, n, body, 1, False, tx_batch=1),
                                   link_drain(broker, var, n, body, 1, False, tx_batch=100)]
        out["flat_out_produce_consume"] = median_run(flat)
        out["end_to_end"] = [end_to_end(broker, var, n, body, 1),
                             end_to_end(broker, var, n, body, args.ack_batch)]
        out["latency"] = [latency(broker, var, args.latency_messages, body, 1),
                          latency(broker, var, args.latency_messages, body, args.ack_batch)]
        broker.close()
    ceil = out["ceiling_raw_move"]["msg_per_s"]
    out["ratio_to_ceiling"] = {f"ack_batch_{r['ack_batch']}": round(r["msg_per_s"] / ceil, 2)
                               for r in out["link"][:2]}
    out["ratio_to_raw_client_ack"] = round(out["link"][0]["msg_per_s"]
                                           / out["raw_move_client_ack"]["msg_per_s"], 2)
    out["ratio_to_flat_out"] = round(out["link"][0]["msg_per_s"]
                                     / out["flat_out_produce_consume"]["msg_per_s"], 2)
    best = max(r["msg_per_s"] for r in out["link"][:2])
    out["target_met"] = {  # >= 10,000 msg/s and >= 60% of each ceiling
        name: best >= 10_000 and best >= 0.6 * out[name]["msg_per_s"]
        for name in ("ceiling_raw_move", "raw_move_client_ack", "flat_out_produce_consume")}
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
