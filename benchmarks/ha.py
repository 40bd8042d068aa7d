"""HA cluster takeover time and link throughput on the shared store; prints JSON.

    PYTHONPATH=. .venv/bin/python benchmarks/ha.py [--kills K] [--messages N] [--rate R]

Real processes: a PostgreSQL server of the Debian package (tests/pgserver.py), `serve`
instances of one HA cluster (tests/ha_support.py: heart-beat 1 s, monitor 3 s) and a plain
`serve` M (SQLite store) whose queues the takeover run's link moves between.

- takeover: two instances A and B; bridge jb1 (a transacted link, batchSize 1, M:ha.in ->
  M:ha.out) runs on one of them while a paced producer sends --rate msg/s to ha.in and a
  receiver takes ha.out. --kills times: SIGKILL the owner, time from the kill to the first
  message that arrives on ha.out more than 0.1 s after it (moved by the new owner), then
  start the killed instance again (it joins as a standby). p50 and max of those times, with
  the intervals they depend on (a lease expires a monitor interval after its last renewal;
  live instances look at every heart-beat). At the end every sent message must have
  arrived once: lost and duplicates are counted.
- throughput: --messages persistent 1 KiB messages waiting in the host broker's queue,
  then the bridge started; msg/s until the last one arrived, for a non-transacted link
  (host -> host: the store's batches, each fenced on the lease row in an HA instance) and
  a transacted link (host -> M: two-phase commit, the XA log in the database), on an HA
  instance and on a single (non-HA) instance of the same PostgreSQL server, side by side;
  ratio = HA / single.
- queues (cluster-wide queues): two instances A and B; --messages persistent 1 KiB
  messages waiting in A's queue, drained by a consumer on A (one instance) and on B (each
  message handed off to B through the shared store): msg/s, ratio = B / A; then
  --flow-messages sent to A flat out (transactions of 500) while that consumer takes
  them: msg/s from the first send to the last arrival, flow_ratio = B / A; then a fifth
  of --messages sent at --rate msg/s: p50 and p99 latency; each message is numbered,
  lost and duplicates are counted. --rounds rounds (default 2), A alone and B taking
  turns to go first (single runs moved with the order: flow_ratio 0.64-0.92 with A alone
  first, 0.80-1.05 with B first); each figure is the median over the rounds, lost and
  duplicates their sum.
- topics (cluster-wide topics, --only topics): three instances A, B, C; a publisher on A
  publishes --messages persistent 1 KiB messages (transactions of 500) to a topic with
  one subscriber on each instance (B's and C's copies stored once per instance on A,
  handed off through the shared store), against three subscribers all on A: msg/s until
  the last subscriber has them all, ratio = across / one instance; then a fifth as many
  at --rate msg/s: p50 and p99 latency of each subscriber.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from benchcommon import postgresql

from bridgemgr import connect
from bridgemgr.jms import BytesMessage, DeliveryMode, Queue, TextMessage, Topic
from ha_support import HEARTBEAT, MONITOR, PASSWORD, Cluster, Instance, link_xml
from service_support import Daemon, cli, one_bridge_files
from waiting import wait_for

EMPTY = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb"/>
"""


class Arrivals:
    """Receives a queue of broker M on a thread, keeping (time, text) of each message."""

    def __init__(self, address: str, queue: str) -> None:
        self.seen: list[tuple[float, str]] = []
        self._halt = threading.Event()
        self._conn = connect(f"mq://{address}", username="admin", password=PASSWORD)
        self._consumer = self._conn.create_session().create_consumer(Queue(queue))
        self._conn.start()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._halt.is_set():
            m = self._consumer.receive(0.2)
            if m is not None:
                self.seen.append((time.monotonic(), m.text if isinstance(m, TextMessage) else ""))

    def close(self) -> None:
        self._halt.set()
        self._thread.join(5)
        self._conn.close()


def takeover(base: Path, pg: Any, m: Daemon, kills: int, rate: int) -> dict:
    cluster = Cluster(base / "takeover", pg, {"jb1": link_xml("jb1", m.address, "ha.in", "ha.out")})
    arrivals = Arrivals(m.address, "ha.out")
    halt, sent = threading.Event(), [0]

    def produce() -> None:
        with connect(f"mq://{m.address}", username="admin", password=PASSWORD) as conn:
            producer = conn.create_session().create_producer(Queue("ha.in"))
            start = time.monotonic()
            while not halt.is_set():
                while time.monotonic() < start + sent[0] / rate:
                    time.sleep(0.001)
                producer.send(TextMessage(f"m{sent[0]:07d}"), delivery_mode=DeliveryMode.PERSISTENT)
                sent[0] += 1

    producer = threading.Thread(target=produce, daemon=True)
    times: list[float] = []
    try:
        owner, standby = cluster.start("A", "jb1"), cluster.start("B", "")
        producer.start()
        for _ in range(kills):
            before = len(arrivals.seen)
            wait_for(lambda b=before: len(arrivals.seen) >= b + rate, 120)  # flowing through the owner
            killed = time.monotonic()
            owner.kill()
            owner.stop()
            first = wait_for(
                lambda b=before, k=killed: next((t for t, _ in arrivals.seen[b:] if t > k + 0.1), None), 60, 0.01
            )
            times.append(first - killed)
            restarted = cluster.start(owner.brokerid, "")
            owner, standby = standby, restarted
        halt.set()
        producer.join(10)
        wait_for(lambda: len(arrivals.seen) >= sent[0], 120)
        time.sleep(2)
    finally:
        halt.set()
        arrivals.close()
        cluster.stop()
    texts = [text for _, text in arrivals.seen]
    return {
        "kills": kills,
        "heartbeat_interval_s": HEARTBEAT,
        "monitor_interval_s": MONITOR,
        "producer_rate_msg_s": rate,
        "takeover_s": {
            "p50": round(statistics.median(times), 2),
            "max": round(max(times), 2),
            "each": [round(t, 2) for t in times],
        },
        "sent": sent[0],
        "lost": sent[0] - len(set(texts)),
        "duplicates": len(texts) - len(set(texts)),
    }


def throughput_xml(m_address: str) -> dict[str, str]:
    """jbn: non-transacted link host -> host; jbt: transacted link host -> M."""
    head = '<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">\n'
    jbn = (
        head
        + """<jmsbridge name="jbn">
  <link name="l1" transacted="false">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host"/>
  <destination ref-name="src" name="n.in"/>
  <destination ref-name="dst" name="n.out"/>
</jmsbridge>
"""
    )
    jbt = (
        head
        + f"""<jmsbridge name="jbt">
  <link name="l1" transacted="true">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="m" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host"/>
  <connection-factory ref-name="m" username="admin" password="{PASSWORD}">
    <property name="imqAddressList" value="mq://{m_address}"/>
  </connection-factory>
  <destination ref-name="src" name="t.in"/>
  <destination ref-name="dst" name="t.out"/>
</jmsbridge>
"""
    )
    return {"jbn": jbn, "jbt": jbt}


def drain_rate(instance: Daemon, passfile: Path, bridge: str, source: str, target: Daemon, queue: str, n: int) -> float:
    """msg/s of ``bridge`` moving ``n`` waiting messages from ``source`` to ``queue`` of ``target``."""
    body = bytes(range(256)) * 4
    with connect(f"mq://{instance.address}", username="admin", password=PASSWORD) as conn:
        producer = conn.create_session().create_producer(Queue(source))
        for _ in range(n):
            producer.send(BytesMessage(body), delivery_mode=DeliveryMode.PERSISTENT)
    arrivals = Arrivals(target.address, queue)
    try:
        start = time.monotonic()
        r = cli(instance, passfile, "start", "bridge", "-bn", bridge)
        assert r.returncode == 0, r.stdout + r.stderr
        wait_for(lambda: len(arrivals.seen) >= n, 600, interval=0.05)
        return n / (arrivals.seen[n - 1][0] - start)
    finally:
        arrivals.close()


def throughput(base: Path, pg: Any, m: Daemon, n: int) -> dict:
    xml = throughput_xml(m.address)
    central = ["imq.bridge.jbn.autostart=false", "imq.bridge.jbt.autostart=false"]
    out: dict[str, dict[str, float]] = {}
    cluster = Cluster(base / "ha", pg, xml, *central)
    try:
        ha = cluster.start("A", "jbn,jbt")
        out["ha_instance"] = {
            "non_transacted_msg_s": drain_rate(ha, ha.passfile, "jbn", "n.in", ha, "n.out", n),
            "transacted_msg_s": drain_rate(ha, ha.passfile, "jbt", "t.in", m, "t.out", n),
        }
    finally:
        cluster.stop()
    single_base = base / "single"
    single_base.mkdir()
    for name, text in xml.items():
        (single_base / f"{name}.xml").write_text(text)
    props, passfile = one_bridge_files(
        single_base,
        "single",
        EMPTY,
        PASSWORD,
        "imq.bridge.jbn.type=jms",
        "imq.bridge.jbn.xmlurl=jbn.xml",
        "imq.bridge.jbt.type=jms",
        "imq.bridge.jbt.xmlurl=jbt.xml",
        *central,
        "imq.persist.store=jdbc",
        f"imq.persist.jdbc.postgresql.property.url={pg.url(cluster.database)}",
        activelist="jbn,jbt",
    )
    single = Instance(props, passfile, "single")
    try:
        out["single_instance"] = {
            "non_transacted_msg_s": drain_rate(single, passfile, "jbn", "n.in", single, "n.out", n),
            "transacted_msg_s": drain_rate(single, passfile, "jbt", "t.in", m, "t.out", n),
        }
    finally:
        single.stop()
    ratio = {
        kind.removesuffix("_msg_s"): round(out["ha_instance"][kind] / out["single_instance"][kind], 2)
        for kind in ("non_transacted_msg_s", "transacted_msg_s")
    }
    rounded = {side: {k: round(v) for k, v in rates.items()} for side, rates in out.items()}
    return {**rounded, "ratio_ha_to_single": ratio, "messages": n, "message_bytes": 1024}


def queue_run(producer_at: Instance, consumer_at: Instance, queue: str, n: int, rate: int, flow: int) -> dict:
    """A queue produced on one instance and consumed on another (or the same): msg/s of
    a consumer draining n waiting messages (sent in transactions of 500); msg/s of the
    queue fed and drained at once (``flow`` messages sent flat out in transactions of
    500 while the consumer takes them: from the first send to the last arrival); then
    p50/p99 latency (send to arrival) of n // 5 messages sent at ``rate`` msg/s; each
    message is numbered: lost and duplicates are counted."""
    body = b"x" * 1024
    with (
        connect(f"mq://{producer_at.address}", username="admin", password=PASSWORD) as pconn,
        connect(f"mq://{consumer_at.address}", username="admin", password=PASSWORD) as cconn,
    ):
        tx = pconn.create_session(transacted=True)
        bulk = tx.create_producer(Queue(queue))
        for i in range(n):
            message = BytesMessage(body)
            message.set_int_property("n", i)
            bulk.send(message, delivery_mode=DeliveryMode.PERSISTENT)
            if i % 500 == 499 or i == n - 1:
                tx.commit()
        consumer = cconn.create_session().create_consumer(Queue(queue))
        numbers: list[int] = []
        started = time.monotonic()
        cconn.start()
        while len(numbers) < n and (m := consumer.receive(30)) is not None:
            numbers.append(m.get_int_property("n"))
        drain_s = time.monotonic() - started
        drained = len(numbers)

        def fill(first: int) -> None:  # n more, in transactions of 500, flat out
            for i in range(first, first + flow):
                message = BytesMessage(body)
                message.set_int_property("n", i)
                bulk.send(message, delivery_mode=DeliveryMode.PERSISTENT)
                if i % 500 == 499 or i == first + flow - 1:
                    tx.commit()

        filler = threading.Thread(target=fill, args=(n,), daemon=True)
        flow_started = time.monotonic()
        filler.start()
        flowed = 0
        while flowed < flow and (m := consumer.receive(30)) is not None:
            numbers.append(m.get_int_property("n"))
            flowed += 1
        flow_s = time.monotonic() - flow_started
        filler.join(60)
        started = flow_started + flow_s - drain_s  # (the paced sends' schedule below starts now)
        arrived: list[tuple[float, float]] = []  # (sent, arrived)

        def take(count: int) -> None:
            while len(arrived) < count:
                m = consumer.receive(30)
                if m is None:
                    return
                arrived.append((m.get_double_property("sent"), time.monotonic()))
                numbers.append(m.get_int_property("n"))

        paced = n // 5
        taker = threading.Thread(target=take, args=(paced,), daemon=True)
        taker.start()
        producer = pconn.create_session().create_producer(Queue(queue))
        for i in range(paced):
            due = started + drain_s + i / rate
            message = BytesMessage(body)
            message.set_int_property("n", n + flow + i)
            time.sleep(max(0.0, due - time.monotonic()))
            message.set_double_property("sent", time.monotonic())
            producer.send(message, delivery_mode=DeliveryMode.PERSISTENT)
        taker.join(120)
        while (m := consumer.receive(0.5)) is not None:  # (none: nothing was duplicated)
            numbers.append(m.get_int_property("n"))
    latencies = sorted(a - s for s, a in arrived)
    return {
        "drained": drained,
        "drain_msg_per_s": round(drained / drain_s, 1),
        "flow_msg_per_s": round(flowed / flow_s, 1),
        "paced_rate": rate,
        "latency_messages": len(latencies),
        "latency_p50_ms": round(1000 * latencies[len(latencies) // 2], 2) if latencies else None,
        "latency_p99_ms": round(1000 * latencies[int(len(latencies) * 0.99) - 1], 2) if latencies else None,
        "lost": n + flow + paced - len(set(numbers)),
        "duplicates": len(numbers) - len(set(numbers)),
    }


def merged(runs: list[dict]) -> dict:
    """One side's rounds as one: the median of each figure (the mean of two), lost and
    duplicates summed, every round's drain and flow rates beside."""
    out = {
        key: round(statistics.median(run[key] for run in runs), 2)
        for key in runs[0]
        if key not in ("lost", "duplicates")
    }
    out.update({key: sum(run[key] for run in runs) for key in ("lost", "duplicates")})
    out["all_drain_msg_per_s"] = [run["drain_msg_per_s"] for run in runs]
    out["all_flow_msg_per_s"] = [run["flow_msg_per_s"] for run in runs]
    return out


def cluster_queues(base: Path, pg: Any, n: int, rate: int, flow: int, rounds: int) -> dict:
    """A queue produced on A and consumed on B vs both on A, the same PostgreSQL; the two
    take turns going first (the module comment)."""
    cluster = Cluster(base / "queues", pg, {}, "imq.bridge.enabled=false")
    runs: dict[str, list[dict]] = {"one": [], "cross": []}
    try:
        a, b = cluster.start("A", ""), cluster.start("B", "")
        for round_ in range(rounds):
            for side in ("one", "cross") if round_ % 2 == 0 else ("cross", "one"):
                consumer_at, queue = (a, "bench.local") if side == "one" else (b, "bench.cross")
                runs[side].append(queue_run(a, consumer_at, queue, n, rate, flow))
    finally:
        cluster.stop()
    one, cross = merged(runs["one"]), merged(runs["cross"])
    return {
        "rounds": rounds,
        "one_instance": one,
        "across_instances": cross,
        "ratio": round(cross["drain_msg_per_s"] / one["drain_msg_per_s"], 2) if one["drain_msg_per_s"] else None,
        "flow_ratio": round(cross["flow_msg_per_s"] / one["flow_msg_per_s"], 2) if one["flow_msg_per_s"] else None,
    }


class Subscriber:
    """A topic's subscriber on one instance, on a thread: (sent, arrived) of each message."""

    def __init__(self, at: Instance, topic: str) -> None:
        self.seen: list[tuple[float, float]] = []
        self._halt = threading.Event()
        self._conn = connect(f"mq://{at.address}", username="admin", password=PASSWORD)
        self._consumer = self._conn.create_session().create_consumer(Topic(topic))
        self._conn.start()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._halt.is_set():
            m = self._consumer.receive(0.2)
            if m is not None:
                self.seen.append((m.get_double_property("sent"), time.monotonic()))

    def close(self) -> None:
        self._halt.set()
        self._thread.join(5)
        self._conn.close()


def topic_run(publisher_at: Instance, subscriber_ats: list[Instance], topic: str, n: int, rate: int) -> dict:
    """msg/s until every subscriber has n messages published on ``publisher_at``, then
    p50/p99 latency of n // 5 published at ``rate`` msg/s, per subscriber."""
    body = b"x" * 1024
    subscribers = [Subscriber(at, topic) for at in subscriber_ats]
    try:
        with connect(f"mq://{publisher_at.address}", username="admin", password=PASSWORD) as conn:
            probe = conn.create_session().create_producer(Topic(topic))

            def everyone_hears() -> bool:  # (another instance sees a new subscriber within 0.2 s)
                message = BytesMessage(b"")
                message.set_double_property("sent", 0.0)
                probe.send(message, delivery_mode=DeliveryMode.NON_PERSISTENT)
                return all(s.seen for s in subscribers)

            wait_for(everyone_hears, 60, interval=0.1)
            time.sleep(0.5)  # stragglers of the probe
            for s in subscribers:
                s.seen.clear()
            tx = conn.create_session(transacted=True)
            bulk = tx.create_producer(Topic(topic))
            started = time.monotonic()
            for i in range(n):
                message = BytesMessage(body)
                message.set_double_property("sent", time.monotonic())
                bulk.send(message, delivery_mode=DeliveryMode.PERSISTENT)
                if i % 500 == 499 or i == n - 1:
                    tx.commit()
            wait_for(lambda: all(len(s.seen) >= n for s in subscribers), 600, interval=0.05)
            drain_s = max(s.seen[n - 1][1] for s in subscribers) - started
            for s in subscribers:
                s.seen.clear()
            paced = n // 5
            for i in range(paced):
                time.sleep(max(0.0, started + drain_s + 1 + i / rate - time.monotonic()))
                message = BytesMessage(body)
                message.set_double_property("sent", time.monotonic())
                probe.send(message, delivery_mode=DeliveryMode.PERSISTENT)
            wait_for(lambda: all(len(s.seen) >= paced for s in subscribers), 120, interval=0.05)
    finally:
        for s in subscribers:
            s.close()

    def latency(s: Subscriber) -> dict:
        ms = sorted(1000 * (a - t) for t, a in s.seen)
        return {"p50_ms": round(ms[len(ms) // 2], 2), "p99_ms": round(ms[int(len(ms) * 0.99) - 1], 2)}

    return {
        "published": n,
        "msg_per_s": round(n / drain_s, 1),
        "paced_rate": rate,
        "latency": {f"{at.brokerid}#{i}": latency(s) for i, (at, s) in enumerate(zip(subscriber_ats, subscribers))},
    }


def cluster_topics(base: Path, pg: Any, n: int, rate: int) -> dict:
    """A topic published on A with a subscriber on A, B and C vs three on A."""
    cluster = Cluster(base / "topics", pg, {}, "imq.bridge.enabled=false")
    try:
        a, b, c = cluster.start("A", ""), cluster.start("B", ""), cluster.start("C", "")
        one = topic_run(a, [a, a, a], "bench.local", n, rate)
        across = topic_run(a, [a, b, c], "bench.cross", n, rate)
    finally:
        cluster.stop()
    return {
        "one_instance": one,
        "across_instances": across,
        "ratio": round(across["msg_per_s"] / one["msg_per_s"], 2) if one["msg_per_s"] else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--rate", type=int, default=200, help="msg/s the takeover run's producer sends")
    ap.add_argument("--messages", type=int, default=3000, help="per throughput drain")
    ap.add_argument(
        "--flow-messages", type=int, default=10000, help="queues: sent while consumed (a flow needs a longer run)"
    )
    ap.add_argument(
        "--rounds", type=int, default=2, help="queues: rounds, one instance and across taking turns to go first"
    )
    ap.add_argument("--only", choices=("takeover", "throughput", "queues", "topics"))
    args = ap.parse_args()
    out: dict = {"load_average": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory() as tmp, postgresql("jdbc") as pg:
        base = Path(tmp)
        (base / "m").mkdir()
        m_props, m_passfile = one_bridge_files(base / "m", "M", EMPTY, PASSWORD, activelist="")
        m = Instance(m_props, m_passfile, "M")
        try:
            if args.only in (None, "takeover"):
                out["takeover"] = takeover(base, pg, m, args.kills, args.rate)
            if args.only in (None, "throughput"):
                out["throughput"] = throughput(base, pg, m, args.messages)
            if args.only in (None, "queues"):
                out["queues"] = cluster_queues(base, pg, args.messages, args.rate, args.flow_messages, args.rounds)
            if args.only in (None, "topics"):
                out["topics"] = cluster_topics(base, pg, args.messages, args.rate)
        finally:
            m.stop()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
