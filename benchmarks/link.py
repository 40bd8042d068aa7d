"""JMS bridge link throughput and latency against the raw broker ceiling; prints JSON.

    .venv/bin/python benchmarks/link.py [--messages N] [--rounds R] [--ack-batch B]
                                        [--only transacted|non-transacted] [--broker-sync]
                                        [--store file|jdbc]

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
  INFO line per message into the bridge's log file); cpu_us_per_msg is the process's CPU
  time per message during the drain (the link's thread and the store's writer: steadier
  than msg/s on a loaded machine);
- flat_out_produce_consume (reference): one producer thread and one consumer thread on
  one queue at once. Messages consumed before the store writes them never touch the disk,
  so this shape does less store work per message than either of the above;
- end_to_end: a producer thread into src, the link, a consumer thread on dst at once;
- latency: a paced producer (1,000 msg/s) into src; p50/p99 from send to receive on dst;
- transacted (issue 5): the same drain on a transacted link, one XA transaction of the
  bridge's coordinator per unit of transaction.batchSize messages (1 and 100), msg/s
  (median of --rounds, interleaved) and p50/p99 send-to-receive latency (a paced producer
  at a quarter of that drain rate, at most 1,000 msg/s: the producer and the receiver
  share the link's process), in two topologies:
  ``two_rm``: the target queue on a second embedded broker (its own store, reached by a
  connection-factory lookup), so each transaction is a genuine two-phase commit across two
  resource managers: a prepare at each broker, the commit record in txlog.<bridge>
  (fsynced with txlogSync=true, the default; run with txlogSync on and off), a commit at
  each broker; ``one_rm``: both ends on this link's broker, one resource manager, so the
  target joins the source's branch and it commits in one phase, nothing logged (txlogSync
  does not apply). --broker-sync fsyncs the brokers' stores too (off by default, as above).
  --store jdbc puts the host broker (the source, and the target of one_rm) and with it the
  bridge's XA log in PostgreSQL (imq.persist.store=jdbc, a server started for the run;
  every commit waits for the database, as the service does); the second broker stays SQLite.

ratio_to_ceiling = link msg/s / raw_move msg/s; target_met says, per ceiling, whether the
better link run reaches >= 60% of it and >= 10,000 msg/s. transacted_target_met compares
with issue 5's targets: >= 1,500 msg/s at batchSize 1 with txlogSync on, >= 8,000 msg/s at
batchSize 100, per topology.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchcommon import jdbc_broker, paced_latency, percentiles, postgresql

from bridgemgr.jms import AckMode, BytesMessage, DeliveryMode, Queue
from bridgemgr.jmsbridge.bridge import JMSBridge
from bridgemgr.jmsbridge.config import parse_bridge_config
from bridgemgr.jmsbridge.link import LinkTuning
from bridgemgr.props import load_properties
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory
from bridgemgr.providers.embedded.host import EmbeddedHostBroker

SRC, DST = Queue("src"), Queue("dst")


def bridge_xml(log_transfers: bool, transacted: bool = False, far: bool = False) -> bytes:
    """The bench bridge; ``far``: the target is the second broker (factory "far", a lookup)."""
    return f"""<jmsbridge name="bench" log-message-transfer="{str(log_transfers).lower()}">
      <link name="l" transacted="{str(transacted).lower()}">
        <source connection-factory-ref="host" destination-ref="src"/>
        <target connection-factory-ref="{"far" if far else "host"}" destination-ref="dst"/>
      </link>
      <connection-factory ref-name="host"/>
      <connection-factory ref-name="far" lookup-name="XAConnectionFactory">
        <property name="java.naming.factory.initial" value="bench"/>
      </connection-factory>
      <destination ref-name="src" name="src"/><destination ref-name="dst" name="dst"/>
    </jmsbridge>""".encode()


def make_bridge(
    broker: Broker,
    var: Path,
    ack_batch: int,
    log_transfers: bool,
    tx_batch: int = 0,
    far: Broker | None = None,
    txlog_sync: bool = True,
) -> JMSBridge:
    """The bench bridge; tx_batch > 0: a transacted link committing every tx_batch messages,
    to ``far`` (a second broker, a second resource manager) when given. A host broker on
    PostgreSQL keeps the XA log in its database."""
    settings = [f"imq.varhome={var}"]
    if tx_batch:
        settings += [
            "imq.bridge.bench.type=jms",
            "imq.bridge.bench.xmlurl=unused.xml",
            f"imq.bridge.bench.transaction.batchSize={tx_batch}",
            f"imq.bridge.bench.tm.props=txlogSync={str(txlog_sync).lower()}",
        ]
    host = EmbeddedHostBroker(broker)
    if host.txlog_sql() is not None:
        settings += ["imq.persist.store=jdbc", "imq.persist.jdbc.postgresql.property.url=jdbc:postgresql://bench/bench"]
    props = load_properties([], settings, environ={})
    target = far if far is not None else broker
    return JMSBridge(
        parse_bridge_config(bridge_xml(log_transfers, tx_batch > 0, far is not None)),
        props,
        host=host,
        lookup=lambda name, env: EmbeddedConnectionFactory(target),
        tuning=LinkTuning(ack_batch=ack_batch),
    )


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


def link_drain(
    broker: Broker,
    var: Path,
    n: int,
    body: bytes,
    ack_batch: int,
    log_transfers: bool,
    tx_batch: int = 0,
    far: Broker | None = None,
    txlog_sync: bool = True,
) -> dict:
    """n messages waiting in src; the (started, then paused) bridge resumes and moves
    them all to dst; the time from resume to the last one on dst."""
    bridge = make_bridge(broker, var, ack_batch, log_transfers, tx_batch, far, txlog_sync)
    bridge.start()
    bridge.pause()
    produce(broker, n, body)
    if broker.store is not None:
        broker.store.flush()
    target = far if far is not None else broker
    start, cpu = time.perf_counter(), time.process_time()
    bridge.resume()
    while target.queue_depth("dst") < n:  # coarse: a busy poller would slow the link
        time.sleep(0.005)
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu  # the link's thread and the store's writer: nothing else runs
    counts = dict(bridge._xa.coordinator.counts) if bridge._xa is not None else None
    bridge.stop()
    consume(target, n, DST)  # empty it for the next run
    run = {
        "messages": n,
        "seconds": round(elapsed, 3),
        "msg_per_s": round(n / elapsed),
        "cpu_us_per_msg": round(cpu / n * 1e6, 1),
    }
    if tx_batch:
        return {
            "batch_size": tx_batch,
            "resource_managers": 2 if far is not None else 1,
            "txlog_sync": txlog_sync if far is not None else None,
            **run,
            "transactions": counts,
        }
    return {"ack_batch": ack_batch, "log_message_transfer": log_transfers, **run}


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
    return {"ack_batch": ack_batch, "messages": n, "seconds": round(elapsed, 3), "msg_per_s": round(n / elapsed)}


def latency(
    broker: Broker,
    var: Path,
    n: int,
    body: bytes,
    ack_batch: int,
    rate: int = 1000,
    tx_batch: int = 0,
    far: Broker | None = None,
    txlog_sync: bool = True,
) -> dict:
    bridge = make_bridge(broker, var, ack_batch, False, tx_batch, far, txlog_sync)
    bridge.start()
    receiver_conn = EmbeddedConnectionFactory(far if far is not None else broker).create_connection()
    receiver_conn.start()
    receiver = receiver_conn.create_session().create_consumer(DST)
    conn = EmbeddedConnectionFactory(broker).create_connection()
    producer = conn.create_session().create_producer(SRC)
    producer.delivery_mode = DeliveryMode.PERSISTENT
    samples = paced_latency(producer, receiver, n, body, rate)
    conn.close()
    receiver_conn.close()
    bridge.stop()
    kind = {"transacted_batch": tx_batch} if tx_batch else {"ack_batch": ack_batch}
    return {**kind, "rate_msg_per_s": rate, **percentiles(samples)}


def median_run(runs: list[dict]) -> dict:
    ordered = sorted(runs, key=lambda r: r["msg_per_s"])
    return {**ordered[len(ordered) // 2], "all_msg_per_s": [r["msg_per_s"] for r in runs]}


TX_RUNS = (  # label, resource managers, transaction.batchSize, txlogSync
    ("two_rm_batch_1_sync_on", 2, 1, True),
    ("two_rm_batch_1_sync_off", 2, 1, False),
    ("two_rm_batch_100_sync_on", 2, 100, True),
    ("two_rm_batch_100_sync_off", 2, 100, False),
    ("one_rm_batch_1", 1, 1, True),
    ("one_rm_batch_100", 1, 100, True),
)


def transacted(tmp: Path, args: argparse.Namespace, body: bytes, pg: Any = None) -> dict:
    """The transacted runs (see the module comment): drains interleaved over --rounds,
    then one paced latency run per configuration."""
    var = tmp / "var-tx"
    broker = jdbc_broker(pg, "imq_bench_link", True) if pg is not None else Broker(tmp / "tx-a", sync=args.broker_sync)
    far = Broker(tmp / "tx-b", sync=args.broker_sync)
    runs: dict[str, list[dict]] = {label: [] for label, *_ in TX_RUNS}
    for _ in range(args.rounds):
        for label, rms, batch, sync in TX_RUNS:
            n = args.tx_messages if batch > 1 else args.tx_batch1_messages
            runs[label].append(link_drain(broker, var, n, body, 1, False, batch, far if rms == 2 else None, sync))
    out: dict = {
        "broker_store": "persistent, " + ("fsync" if args.broker_sync else "no fsync"),
        "host_store": "PostgreSQL (jdbc), XA log in it" if pg is not None else "SQLite",
    }
    for label, rms, batch, sync in TX_RUNS:
        run = median_run(runs[label])
        rate = max(10, min(1000, run["msg_per_s"] // 4))
        run["latency"] = latency(
            broker, var, args.tx_latency_messages, body, 1, rate, batch, far if rms == 2 else None, sync
        )
        out[label] = run
    rate = lambda label: out[label]["msg_per_s"]  # noqa: E731
    out["target_met"] = {  # issue 5: >= 1,500 msg/s at batchSize 1 with txlogSync on, >= 8,000 at 100
        "two_rm": {
            "batch_1_sync_on_1500": rate("two_rm_batch_1_sync_on") >= 1500,
            "batch_100_8000": rate("two_rm_batch_100_sync_on") >= 8000,
        },
        "one_rm": {"batch_1_1500": rate("one_rm_batch_1") >= 1500, "batch_100_8000": rate("one_rm_batch_100") >= 8000},
    }
    broker.close()
    far.close()
    return out


def non_transacted(tmp: Path, args: argparse.Namespace, body: bytes) -> dict:
    n = args.messages
    out: dict = {"messages": n, "store": "persistent, no fsync"}
    var = tmp / "var"
    broker = Broker(tmp / "store")
    ceiling, client, link_1, link_b, flat = [], [], [], [], []
    for _ in range(args.rounds):
        ceiling.append(raw_move(broker, n, body, AckMode.AUTO_ACKNOWLEDGE))
        link_1.append(link_drain(broker, var, n, body, 1, False))
        client.append(raw_move(broker, n, body, AckMode.CLIENT_ACKNOWLEDGE))
        link_b.append(link_drain(broker, var, n, body, args.ack_batch, False))
        flat.append(flat_out(broker, n, body))
    out["ceiling_raw_move"] = median_run(ceiling)
    out["raw_move_client_ack"] = median_run(client)
    out["link"] = [median_run(link_1), median_run(link_b), link_drain(broker, var, n // 2, body, 1, True)]
    out["flat_out_produce_consume"] = median_run(flat)
    out["end_to_end"] = [end_to_end(broker, var, n, body, 1), end_to_end(broker, var, n, body, args.ack_batch)]
    out["latency"] = [
        latency(broker, var, args.latency_messages, body, 1),
        latency(broker, var, args.latency_messages, body, args.ack_batch),
    ]
    broker.close()
    ceil = out["ceiling_raw_move"]["msg_per_s"]
    out["ratio_to_ceiling"] = {f"ack_batch_{r['ack_batch']}": round(r["msg_per_s"] / ceil, 2) for r in out["link"][:2]}
    out["ratio_to_raw_client_ack"] = round(out["link"][0]["msg_per_s"] / out["raw_move_client_ack"]["msg_per_s"], 2)
    out["ratio_to_flat_out"] = round(out["link"][0]["msg_per_s"] / out["flat_out_produce_consume"]["msg_per_s"], 2)
    best = max(r["msg_per_s"] for r in out["link"][:2])
    out["target_met"] = {  # >= 10,000 msg/s and >= 60% of each ceiling
        name: best >= 10_000 and best >= 0.6 * out[name]["msg_per_s"]
        for name in ("ceiling_raw_move", "raw_move_client_ack", "flat_out_produce_consume")
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=30_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--latency-messages", type=int, default=3000)
    ap.add_argument("--ack-batch", type=int, default=100)
    ap.add_argument("--tx-messages", type=int, default=20_000, help="per transacted drain, batchSize 100")
    ap.add_argument("--tx-batch1-messages", type=int, default=3_000, help="per transacted drain, batchSize 1")
    ap.add_argument("--tx-latency-messages", type=int, default=600)
    ap.add_argument("--broker-sync", action="store_true", help="the transacted runs' brokers fsync")
    ap.add_argument("--only", choices=("non-transacted", "transacted"))
    ap.add_argument(
        "--store",
        choices=("file", "jdbc"),
        default="file",
        help="the transacted runs' host broker and XA log: SQLite or PostgreSQL",
    )
    args = ap.parse_args()
    body = bytes(range(256)) * (args.size // 256) + b"x" * (args.size % 256)
    out: dict = {"message_bytes": args.size, "rounds": args.rounds}
    with tempfile.TemporaryDirectory() as tmp, postgresql(args.store) as pg:
        if args.only != "transacted":
            out["non_transacted"] = non_transacted(Path(tmp), args, body)
        if args.only != "non-transacted":
            out["transacted"] = transacted(Path(tmp), args, body, pg)
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
