"""Moving persistent messages between two queues of a real broker: our bridge through the
external providers beside each broker's own forwarding; prints JSON.

    .venv/bin/python benchmarks/providers.py [--messages 50000] [--ack-batch 1]
                                             [--window 100] [--xa-batch 1,10,100]
                                             [--xa-local true|false]
                                             [--only activemq|rabbitmq]

Each case preloads N persistent 1 KiB BytesMessages into a source queue (in local
transactions of 1,000, so preloading is not what is measured), then times the move of all
N to the target queue. The servers are the Debian packages, started here on 127.0.0.1 with
temporary data directories (tests/real/servers.py), with their default (fsyncing) stores.

- activemq_bridge_jms: our JMS bridge, one non-transacted link, ActiveMQ -> ActiveMQ
  through the Java provider (JPype, ActiveMQ's own JMS client over OpenWire): receive
  CLIENT_ACKNOWLEDGE, persistent sends with a confirm window of --window
  (imq.bridge.<name>.link.window; ActiveMQ's JMS 1.1 client sends synchronously, so the
  window acknowledges once per window) and at least every --ack-batch messages (window 1,
  ack batch 1: the chapter's acknowledge after each send). msg/s = N / (bridge start ..
  the link has acknowledged N).
- activemq_bridge_xa_batch_<B>: the same link transacted (XAConnectionFactory at both
  ends), once per B of --xa-batch (a list): each unit of B messages
  (imq.bridge.<name>.transaction.batchSize, 1 by default as in the chapter) one
  transaction. Both ends are the same resource manager (one broker, one JNDI environment),
  so by default each unit is one local transaction of one session holding the consumer and
  the producer (the row's "transaction" says "local transaction (one resource manager)");
  with --xa-local false (imq.bridge.<name>.transaction.local=false) it is one XA
  transaction of our coordinator, the target joining the source's branch (its association
  ended at the same time as the source's), committed in one phase (transaction log in a
  temporary var directory; "transaction": "XA"). Each row's target is counted,
  then emptied before the next row (ActiveMQ's default memory limit would stall the next
  preload behind 4 x N messages).
- activemq_own: ActiveMQ's jmsBridgeConnector (a JmsQueueConnector with an outbound queue
  bridge to itself) moving the same queue. It starts with the broker, so the broker is
  restarted with it after preloading, and it may move some before the first sample: msg/s =
  (N - count at the first sample that sees any) / (that sample .. N there), sampled every
  50 ms through ActiveMQ's statistics plugin.
- rabbitmq_bridge_stomp: our bridge, one non-transacted link RabbitMQ -> RabbitMQ through the
  STOMP provider (client-individual acks, a receipt per persistent send; up to --window
  receipts outstanding, the source acknowledged once they came; prefetch-count at least
  three windows).
- rabbitmq_bridge_amqp: the same link through the AMQP 0-9-1 provider (imq.amqp, pika's
  connection with our framing): basic.qos prefetch at least three windows, publisher
  confirms, up to --window unconfirmed; a full window slides (the source acknowledged with
  basic.ack multiple up to the last confirmed send while later sends are out).
- rabbitmq_amqp_send_window: that provider's producer alone, N persistent sends into a
  queue with 1, 16 and 256 unconfirmed (pipelined publisher confirms, publish()).
- rabbitmq_own: RabbitMQ's Shovel plugin, a dynamic shovel with ack-mode on-confirm over the
  node's direct connection; msg/s from the first message on the target to the Nth, the
  target's depth read every 10 ms by queue.declare passive (not rabbitmqctl, whose Erlang
  VM per sample took a core from the node).
ratios: ours / theirs per broker. dead/redelivered counts show nothing went wrong meanwhile.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# benchmarks/stomp.py would shadow the stomp.py package the STOMP provider imports.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks"]
sys.path.insert(0, str(ROOT / "tests" / "real"))

import pika  # noqa: E402
from servers import ActiveMQ, RabbitMQ, missing_package  # noqa: E402

from bridgemgr import gcpolicy  # noqa: E402
from bridgemgr.jms import naming  # noqa: E402
from bridgemgr.jms.destination import Queue  # noqa: E402
from bridgemgr.jms.message import BytesMessage, MapMessage, TextMessage  # noqa: E402
from bridgemgr.jmsbridge.bridge import JMSBridge  # noqa: E402
from bridgemgr.jmsbridge.config import parse_bridge_config  # noqa: E402
from bridgemgr.jmsbridge.link import LinkTuning  # noqa: E402
from bridgemgr.props import LINK_WINDOW, load_properties  # noqa: E402
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory  # noqa: E402

PAYLOAD = bytes(range(256)) * 4  # 1 KiB
STATISTICS = "<plugins><statisticsBrokerPlugin/></plugins>"
JMS_BRIDGE_CONNECTOR = """<jmsBridgeConnectors>
  <jmsQueueConnector outboundQueueConnectionFactory="#self">
    <outboundQueueBridges>
      <outboundQueueBridge outboundQueueName="own.dst" localQueueName="own.src"/>
    </outboundQueueBridges>
  </jmsQueueConnector>
</jmsBridgeConnectors>"""
SELF_FACTORY = """<bean id="self" class="org.apache.activemq.ActiveMQConnectionFactory">
  <property name="brokerURL" value="{url}"/></bean>"""


def preload(factory: Any, queue: str, n: int) -> float:
    """N persistent 1 KiB messages into ``queue``, committed every 1,000; msg/s."""
    started = time.monotonic()
    with factory.create_connection() as conn:
        session = conn.create_session(True)
        producer = session.create_producer(Queue(queue))
        for i in range(n):
            producer.send(BytesMessage(PAYLOAD))
            if i % 1000 == 999:
                session.commit()
        session.commit()
    return n / (time.monotonic() - started)


def bridge_xml(src_env: dict[str, str], dst_env: dict[str, str], src: str, dst: str, xa: bool = False) -> bytes:
    lookup = "XAConnectionFactory" if xa else "ConnectionFactory"

    def cf(ref: str, env: dict[str, str]) -> str:
        props = "".join(f'<property name="{k}" value="{v}"/>' for k, v in env.items())
        return f'<connection-factory ref-name="{ref}" lookup-name="{lookup}">{props}</connection-factory>'

    return f"""<jmsbridge name="bench" log-message-transfer="false">
      <link name="move" transacted="{str(xa).lower()}">
        <source connection-factory-ref="src" destination-ref="src"/>
        <target connection-factory-ref="dst" destination-ref="dst"/>
      </link>
      {cf("src", src_env)}{cf("dst", dst_env)}<connection-factory ref-name="host"/>
      <destination ref-name="src" name="{src}"/><destination ref-name="dst" name="{dst}"/>
    </jmsbridge>""".encode()


def run_bridge(
    xml: bytes, n: int, ack_batch: int, window: int, workdir: Path, xa_batch: int | None = None, xa_local: bool = True
) -> dict[str, Any]:
    """Start the bridge on preloaded messages; time until the link completed N."""
    host = Broker(workdir / "host")  # the built-in DMQ lives on the host broker
    props = load_properties(
        [],
        [
            f"imq.varhome={workdir / 'var'}",
            "imq.bridge.bench.type=jms",
            "imq.bridge.bench.xmlurl=bench.xml",
            f"imq.bridge.bench.transaction.batchSize={xa_batch or 1}",
            f"imq.bridge.bench.transaction.local={str(xa_local).lower()}",
            f"imq.bridge.bench.link.window={window}",
        ],
        environ={},
    )
    bridge = JMSBridge(
        parse_bridge_config(xml, "bench.xml"),
        props,
        host_factory=lambda env: EmbeddedConnectionFactory(host),
        tuning=LinkTuning(ack_batch=ack_batch, start_timeout=60),
    )
    started = time.monotonic()
    bridge.start()
    try:
        counters = bridge.links[0].counters
        while counters.transferred < n:
            time.sleep(0.01)
            if bridge.links[0].state.value == "STOPPED":
                raise RuntimeError(f"the link stopped: {counters.snapshot()}")
        elapsed = time.monotonic() - started
        batch = (
            {"transaction_batch_size": xa_batch, "transaction": bridge.links[0].info()["transaction"]}
            if xa_batch
            else {"ack_batch": ack_batch, "window": window}
        )
        return {
            "messages": n,
            "seconds": round(elapsed, 2),
            "msg_per_s": round(n / elapsed),
            **batch,
            "to_dmq": counters.to_dmq,
            "redelivered": counters.redelivered,
        }
    finally:
        bridge.stop()
        host.close()


def activemq_depth(factory: Any, queue: str) -> int:
    """Messages on ``queue`` by ActiveMQ's statistics plugin (a request/reply over JMS)."""
    with factory.create_connection() as conn:
        conn.start()
        session = conn.create_session()
        replies = session.create_temporary_queue()
        request = TextMessage("")
        request.reply_to = replies
        consumer = session.create_consumer(replies)
        session.create_producer(Queue(f"ActiveMQ.Statistics.Destination.{queue}")).send(request)
        reply = consumer.receive(2)
        # The plugin answers for existing destinations only: no answer, no messages yet.
        return int(reply.get_long("size")) if isinstance(reply, MapMessage) else 0


def drain_queue(factory: Any, queue: str) -> None:
    """Consume a counted target queue: ActiveMQ's default memory limit stalls the next
    preload when several rows' targets hold N messages each."""
    with factory.create_connection() as conn:
        conn.start()
        consumer = conn.create_session().create_consumer(Queue(queue))
        while consumer.receive(1) is not None:
            pass


def rate_until(
    count: Callable[[], int], n: int, interval: float, from_now: bool, timeout: float = 900
) -> dict[str, Any]:
    """Sample ``count()`` until it reaches N: the rate from the first sample that sees any
    (or from now, counting from 0) to the one that sees N."""
    started = time.monotonic()
    first: tuple[float, int] | None = (started, 0) if from_now else None
    while time.monotonic() - started < timeout:
        seen = count()
        now = time.monotonic()
        if first is None and seen > 0:
            first = (now, seen)
        if seen >= n and first is not None and now > first[0]:
            moved, elapsed = n - first[1], now - first[0]
            return {
                "messages": n,
                "measured_messages": moved,
                "seconds": round(elapsed, 2),
                "msg_per_s": round(moved / elapsed),
            }
        time.sleep(interval)
    raise RuntimeError(f"not done within {timeout} s")


def bench_activemq(
    n: int, ack_batch: int, window: int, xa_batches: tuple[int, ...], workdir: Path, xa_local: bool = True
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    amq = ActiveMQ(workdir / "activemq", name="bench", extra=STATISTICS).start()
    try:
        env = amq.jndi()
        factory = naming.lookup("ConnectionFactory", env)
        out["activemq_preload_msg_per_s"] = round(preload(factory, "ours.src", n))
        out["activemq_bridge_jms"] = run_bridge(
            bridge_xml(env, env, "ours.src", "ours.dst"), n, ack_batch, window, workdir / "jms"
        )
        assert activemq_depth(factory, "ours.dst") == n
        drain_queue(factory, "ours.dst")
        for batch in xa_batches:
            src, dst = f"xa{batch}.src", f"xa{batch}.dst"
            preload(factory, src, n)
            out[f"activemq_bridge_xa_batch_{batch}"] = run_bridge(
                bridge_xml(env, env, src, dst, xa=True), n, ack_batch, window, workdir / f"xa{batch}", batch, xa_local
            )
            assert activemq_depth(factory, dst) == n
            drain_queue(factory, dst)
        preload(factory, "own.src", n)
    finally:
        amq.stop()
    # ActiveMQ's own forwarding starts with the broker: restart the broker with it.
    amq = ActiveMQ(
        workdir / "activemq",
        name="bench",
        extra=STATISTICS + JMS_BRIDGE_CONNECTOR,
        beans=SELF_FACTORY,
        openwire_port=amq.openwire_port,
        stomp_port=amq.stomp_port,
    ).start()
    try:
        factory = naming.lookup("ConnectionFactory", amq.jndi())
        out["activemq_own"] = {
            "forwarder": "jmsBridgeConnector (JmsQueueConnector)",
            **rate_until(lambda: activemq_depth(factory, "own.dst"), n, 0.05, from_now=False),
        }
    finally:
        amq.stop()
    for kind in ("jms", *(f"xa_batch_{batch}" for batch in xa_batches)):
        out[f"activemq_ratio_ours_{kind}_to_own"] = round(
            out[f"activemq_bridge_{kind}"]["msg_per_s"] / out["activemq_own"]["msg_per_s"], 3
        )
    return out


def rabbit_depth(node: RabbitMQ, queue: str) -> int:
    for line in node.ctl("list_queues", "-q", "--no-table-headers", "name", "messages").splitlines():
        name, _, count = line.strip().partition("\t")
        if name == queue:
            return int(count)
    return 0


def shovel_rate(node: RabbitMQ, src: str, dst: str, n: int) -> dict[str, Any]:
    """Declare a dynamic shovel src -> dst and time it: from the first sample that sees a
    message on ``dst`` to the one that sees N. The depth is read with queue.declare
    passive over one AMQP connection every 10 ms: a rabbitmqctl sample starts an Erlang
    VM, which took most of a core from the node while the shovel ran (on 2 cores Shovel
    read ~12,000 msg/s that way, ~17,000 this way)."""
    params = pika.URLParameters(node.amqp_env()["java.naming.provider.url"])
    with pika.BlockingConnection(params) as probe:
        channel = probe.channel()
        channel.queue_declare(dst, durable=True)  # as the shovel declares it; 0 until it moves

        def depth() -> int:
            return channel.queue_declare(dst, passive=True).method.message_count

        shovel = {
            "src-protocol": "amqp091",
            "src-uri": "amqp://",
            "src-queue": src,
            "dest-protocol": "amqp091",
            "dest-uri": "amqp://",
            "dest-queue": dst,
            "ack-mode": "on-confirm",
            "src-delete-after": "never",
        }
        declare = threading.Thread(target=node.ctl, args=("set_parameter", "shovel", "bench", json.dumps(shovel)))
        declare.start()
        try:
            return rate_until(depth, n, 0.01, from_now=False)
        finally:
            declare.join()


def bench_rabbitmq(n: int, ack_batch: int, window: int, xa_batch: int, workdir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    base = Path(tempfile.mkdtemp(prefix="imqbridge-rabbitmq-"))  # user rabbitmq must reach it
    node = RabbitMQ(base).start()
    try:
        env = node.stomp_env()
        factory = naming.lookup("ConnectionFactory", env)
        out["rabbitmq_preload_msg_per_s"] = round(preload(factory, "ours.src", n))
        out["rabbitmq_bridge_stomp"] = run_bridge(
            bridge_xml(env, env, "ours.src", "ours.dst"), n, ack_batch, window, workdir / "stomp"
        )
        assert rabbit_depth(node, "ours.dst") == n
        amqp_env = node.amqp_env()
        amqp = naming.lookup("ConnectionFactory", amqp_env)
        preload(amqp, "amqp.src", n)
        out["rabbitmq_bridge_amqp"] = run_bridge(
            bridge_xml(amqp_env, amqp_env, "amqp.src", "amqp.dst"), n, ack_batch, window, workdir / "amqp"
        )
        assert rabbit_depth(node, "amqp.dst") == n
        out["rabbitmq_amqp_send_window"] = send_window(amqp, "window", n)
        preload(factory, "own.src", n)
        out["rabbitmq_own"] = {
            "forwarder": "shovel, ack-mode on-confirm, direct connection",
            **shovel_rate(node, "own.src", "own.dst", n),
        }
    finally:
        node.stop()
        shutil.rmtree(base, ignore_errors=True)
    for kind in ("stomp", "amqp"):
        out[f"rabbitmq_ratio_ours_{kind}_to_own"] = round(
            out[f"rabbitmq_bridge_{kind}"]["msg_per_s"] / out["rabbitmq_own"]["msg_per_s"], 3
        )
    return out


def send_window(factory: Any, queue: str, n: int, windows: tuple[int, ...] = (1, 16, 256)) -> dict[str, Any]:
    """The AMQP provider's producer alone: N persistent 1 KiB sends, each waiting for its
    publisher confirm (window 1), or pipelined with up to W
    unconfirmed (publish() + the oldest confirm when W are out); msg/s per window."""
    rates = {}
    with factory.create_connection() as conn:
        producer = conn.create_session().create_producer(Queue(queue))
        for window in windows:
            started = time.monotonic()
            outstanding: list[Any] = []
            for _ in range(n):
                outstanding.append(producer.publish(BytesMessage(PAYLOAD)))
                if len(outstanding) >= window:
                    outstanding.pop(0).result(30)
            producer.flush()
            rates[f"window_{window}"] = round(n / (time.monotonic() - started))
    return {"messages": n, "msg_per_s": rates}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--ack-batch", type=int, default=1)
    parser.add_argument("--window", type=int, default=LINK_WINDOW)
    parser.add_argument(
        "--xa-batch",
        type=lambda text: tuple(int(b) for b in text.split(",")),
        default=(1, 10, 100),
        help="transaction.batchSize of each XA row (ActiveMQ)",
    )
    parser.add_argument(
        "--xa-local",
        choices=["true", "false"],
        default="true",
        help="imq.bridge.<name>.transaction.local of the XA rows (ActiveMQ)",
    )
    parser.add_argument("--only", choices=["activemq", "rabbitmq"])
    args = parser.parse_args()
    gcpolicy.tune()  # the links run here as `serve` runs them
    result: dict[str, Any] = {"messages": args.messages, "message_bytes": len(PAYLOAD)}
    with tempfile.TemporaryDirectory(prefix="imqbridge-bench-") as tmp:
        activemq = partial(bench_activemq, xa_local=args.xa_local == "true")
        for name, bench in (("activemq", activemq), ("rabbitmq", bench_rabbitmq)):
            if args.only not in (None, name):
                continue
            reason = missing_package("activemq" if name == "activemq" else "rabbitmq-server")
            if reason:
                result[name] = {"skipped": reason}
                continue
            result.update(bench(args.messages, args.ack_batch, args.window, args.xa_batch, Path(tmp) / name))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
