"""Transacted (XA) link throughput and latency between two embedded brokers, against the
non-transacted link in the same run; prints JSON.

    .venv/bin/python benchmarks/xa.py [--messages N] [--batch1-messages M] [--broker-sync]

Two embedded brokers, each with its own persistent store (imq.persist.file.sync.enabled
false by default, as in benchmarks/link.py; --broker-sync fsyncs every store batch too),
persistent 1 KiB BytesMessages, one link from src on broker A (the host broker) to dst on
broker B (reached by a connection-factory lookup), all in this process. So a transacted
link is a genuine two-phase commit across two resource managers: per transaction, a
prepare at each broker, the commit record in txlog.<bridge> (fsynced when txlogSync is
true, the default), a commit at each broker.

- drain: N messages waiting in src, the (started, then paused) bridge resumes; msg/s =
  N / (resume .. the last one on dst). Non-transacted (CLIENT_ACKNOWLEDGE per message, the
  chapter's link), and transacted with transaction.batchSize 1 and 100, txlogSync on and
  off; also a transacted link within one broker (one resource manager: one-phase commit,
  nothing logged) for reference. Each drain runs --rounds times, interleaved (this
  machine is shared and noisy), and the median is reported.
- latency: a paced producer into src (at half the drain rate of that configuration, at
  most 1,000 msg/s); p50/p99 from send to receive on dst.

target_met compares with the issue's targets (>= 1,500 msg/s at batchSize 1 with txlogSync
on; >= 8,000 msg/s at batchSize 100).
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

from bridgemgr.jms import BytesMessage, DeliveryMode, Queue
from bridgemgr.jmsbridge.bridge import JMSBridge
from bridgemgr.jmsbridge.config import parse_bridge_config
from bridgemgr.jmsbridge.link import LinkTuning
from bridgemgr.props import load_properties
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory

from benchcommon import paced_latency, percentiles

SRC, DST = Queue("src"), Queue("dst")


def bridge_xml(transacted: bool, same_broker: bool) -> bytes:
    target = "host" if same_broker else "far"
    return f"""<jmsbridge name="bench" log-message-transfer="false">
      <link name="l" transacted="{str(transacted).lower()}">
        <source connection-factory-ref="host" destination-ref="src"/>
        <target connection-factory-ref="{target}" destination-ref="dst"/>
      </link>
      <connection-factory ref-name="host"/>
      <connection-factory ref-name="far" lookup-name="XAConnectionFactory">
        <property name="java.naming.factory.initial" value="bench"/>
      </connection-factory>
      <destination ref-name="src" name="src"/><destination ref-name="dst" name="dst"/>
    </jmsbridge>""".encode()


class Setup:
    """The two brokers and how a run's bridge is made."""

    def __init__(self, tmp: Path, broker_sync: bool) -> None:
        self.var = tmp / "var"
        self.a = Broker(tmp / "a", sync=broker_sync)
        self.b = Broker(tmp / "b", sync=broker_sync)

    def bridge(self, transacted: bool, batch: int = 1, txlog_sync: bool = True,
               same_broker: bool = False) -> JMSBridge:
        props = load_properties([], [
            f"imq.varhome={self.var}", "imq.bridge.bench.type=jms",
            "imq.bridge.bench.xmlurl=unused.xml",
            f"imq.bridge.bench.transaction.batchSize={batch}",
            f"imq.bridge.bench.tm.props=txlogSync={str(txlog_sync).lower()}"], environ={})
        return JMSBridge(parse_bridge_config(bridge_xml(transacted, same_broker)), props,
                         host_factory=lambda env: EmbeddedConnectionFactory(self.a),
                         lookup=lambda name, env: EmbeddedConnectionFactory(self.b),
                         tuning=LinkTuning())

    def target(self, same_broker: bool) -> Broker:
        return self.a if same_broker else self.b

    def close(self) -> None:
        self.a.close()
        self.b.close()


def produce(broker: Broker, n: int, body: bytes) -> None:
    conn = EmbeddedConnectionFactory(broker).create_connection()
    session = conn.create_session(True)
    producer = session.create_producer(SRC)
    producer.delivery_mode = DeliveryMode.PERSISTENT
    for i in range(n):
        producer.send(BytesMessage(body))
        if i % 1000 == 999:
            session.commit()
    session.commit()
    conn.close()


def empty(broker: Broker, n: int) -> None:
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    consumer = conn.create_session().create_consumer(DST)
    for got in range(n):
        if consumer.receive(10) is None:
            raise RuntimeError(f"stalled after {got} messages on dst")
    conn.close()


def drain(setup: Setup, n: int, body: bytes, transacted: bool, batch: int = 1,
          txlog_sync: bool = True, same_broker: bool = False) -> dict:
    bridge = setup.bridge(transacted, batch, txlog_sync, same_broker)
    bridge.start()
    bridge.pause()
    produce(setup.a, n, body)
    target = setup.target(same_broker)
    start = time.perf_counter()
    bridge.resume()
    while target.queue_depth("dst") < n:  # coarse: a busy poller would slow the link
        time.sleep(0.005)
    elapsed = time.perf_counter() - start
    counts = dict(bridge._xa.coordinator.counts) if bridge._xa is not None else None
    bridge.stop()
    empty(target, n)
    run = {"transacted": transacted, "messages": n, "seconds": round(elapsed, 3),
           "msg_per_s": round(n / elapsed)}
    if transacted:
        run.update(batch_size=batch, txlog_sync=txlog_sync,
                   resource_managers=1 if same_broker else 2, transactions=counts)
    return run


def latency(setup: Setup, n: int, body: bytes, rate: int, transacted: bool,
            batch: int = 1) -> dict:
    bridge = setup.bridge(transacted, batch)
    bridge.start()
    receiver_conn = EmbeddedConnectionFactory(setup.b).create_connection()
    receiver_conn.start()
    receiver = receiver_conn.create_session().create_consumer(DST)
    conn = EmbeddedConnectionFactory(setup.a).create_connection()
    producer = conn.create_session().create_producer(SRC)
    producer.delivery_mode = DeliveryMode.PERSISTENT
    samples = paced_latency(producer, receiver, n, body, rate)
    conn.close()
    receiver_conn.close()
    bridge.stop()
    return {"transacted": transacted, **({"batch_size": batch} if transacted else {}),
            "rate_msg_per_s": rate, **percentiles(samples)}


def median_run(runs: list[dict]) -> dict:
    ordered = sorted(runs, key=lambda r: r["msg_per_s"])
    return {**ordered[len(ordered) // 2], "all_msg_per_s": [r["msg_per_s"] for r in runs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--batch1-messages", type=int, default=1_500)
    ap.add_argument("--latency-messages", type=int, default=600)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--broker-sync", action="store_true")
    args = ap.parse_args()
    body = bytes(range(256)) * (args.size // 256) + b"x" * (args.size % 256)
    n, n1 = args.messages, args.batch1_messages
    out: dict = {"message_bytes": args.size, "brokers": 2,
                 "broker_store": "persistent, " + ("fsync" if args.broker_sync else "no fsync")}
    with tempfile.TemporaryDirectory() as tmp:
        setup = Setup(Path(tmp), args.broker_sync)
        runs: dict[str, list[dict]] = {}
        for _ in range(args.rounds):
            for key, m, kw in (("plain", n, {}), ("b1", n1, {"batch": 1}),
                               ("b1_nosync", n1, {"batch": 1, "txlog_sync": False}),
                               ("b100", n, {"batch": 100}),
                               ("b100_nosync", n, {"batch": 100, "txlog_sync": False}),
                               ("one", n1, {"batch": 1, "same_broker": True})):
                runs.setdefault(key, []).append(drain(setup, m, body, key != "plain", **kw))
        out["non_transacted"] = median_run(runs["plain"])
        out["transacted"] = [median_run(runs[k]) for k in ("b1", "b1_nosync", "b100",
                                                           "b100_nosync")]
        out["transacted_one_broker"] = median_run(runs["one"])
        rate = lambda r: max(10, min(1000, r["msg_per_s"] // 2))  # noqa: E731
        out["latency"] = [
            latency(setup, args.latency_messages, body, rate(out["non_transacted"]), False),
            latency(setup, args.latency_messages, body, rate(out["transacted"][0]), True, 1),
            latency(setup, args.latency_messages, body, rate(out["transacted"][2]), True, 100),
        ]
        setup.close()
    plain = out["non_transacted"]["msg_per_s"]
    out["ratio_to_non_transacted"] = {
        f"batch_{r['batch_size']}_sync_{str(r['txlog_sync']).lower()}":
            round(r["msg_per_s"] / plain, 3) for r in out["transacted"]}
    out["target_met"] = {"batch_1_sync_on_1500": out["transacted"][0]["msg_per_s"] >= 1500,
                         "batch_100_8000": out["transacted"][2]["msg_per_s"] >= 8000}
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
