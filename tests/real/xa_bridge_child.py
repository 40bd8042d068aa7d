"""A JMS bridge with one transacted (XA) link from an embedded broker to ActiveMQ, run in a
subprocess by test_xa_bridges.py and killed there with SIGKILL.

Usage: xa_bridge_child.py SOURCE_STORE VARHOME JNDI BATCH [LOCAL [SRC DST [LEFT]]], JNDI being the repr of the
ActiveMQ lookup environment. The source store is fsynced and is the host broker; the target
is ActiveMQ's XAConnectionFactory through the Java provider. The XA fault hook
(IMQBRIDGE_XA_FAULT) may kill the process between two protocol steps. Prints "ready" once
the bridge runs (recovery is done by then); when the source is empty it stops the bridge
cleanly and prints "done".

SOURCE_STORE "activemq" moves ActiveMQ's queue src to its queue dst instead (two factories
of the one broker: with LOCAL "true" each unit is one local transaction of one session,
else XA with the target joining the source's branch, one phase; the host broker, for
the DMQ, lives in VARHOME; the backout threshold is off: ActiveMQ counts a kill as a
delivery of every message it had prefetched); "done" then comes once the link has moved
LEFT messages (what the source holds) or, without LEFT, nothing for 3 s, saying what the
link's units were ("done (XA)"). It prints "moved N" each time the link's count of
transferred messages grows (the test kills it on that)."""

from __future__ import annotations

import ast
import sys
import time
from html import escape
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bridgemgr.jmsbridge.bridge import JMSBridge
from bridgemgr.jmsbridge.config import parse_bridge_config
from bridgemgr.props import load_properties
from bridgemgr.providers.embedded import Broker
from bridgemgr.providers.embedded.host import EmbeddedHostBroker
from jmsbridge_support import FAST, bridge_xml

LINK = (
    '<link name="l" transacted="true">'
    '<source connection-factory-ref="host" destination-ref="src"/>'
    '<target connection-factory-ref="amq" destination-ref="dst"/></link>'
)


def amq_factory(env: dict[str, str]) -> str:
    props = "".join(f'<property name="{escape(k)}" value="{escape(v)}"/>' for k, v in env.items())
    return (
        f'<connection-factory ref-name="amq" lookup-name="XAConnectionFactory" '
        f'connect-attempt-interval-in-seconds="1">{props}</connection-factory>'
    )


AMQ_LINK = (
    '<link name="l" transacted="true">'
    '<source connection-factory-ref="amq" destination-ref="src"/>'
    '<target connection-factory-ref="amq2" destination-ref="dst"/></link>'
)


def main() -> None:
    source_store, varhome, jndi, batch = sys.argv[1:5]
    if source_store == "activemq":
        rest = sys.argv[5:]
        local = rest[0] if rest else "false"
        src, dst = rest[1:3] if len(rest) >= 3 else ("src", "dst")
        left = int(rest[3]) if len(rest) >= 4 else None
        activemq_to_activemq(varhome, ast.literal_eval(jndi), batch, local, src, dst, left)
        return
    broker = Broker(source_store, sync=True)
    props = load_properties(
        [],
        [
            f"imq.varhome={varhome}",
            "imq.bridge.crash.type=jms",
            "imq.bridge.crash.xmlurl=crash.xml",
            f"imq.bridge.crash.transaction.batchSize={batch}",
        ],
        environ={},
    )
    xml = bridge_xml(LINK, cfs=amq_factory(ast.literal_eval(jndi)), name="crash", log_message_transfer="false")
    bridge = JMSBridge(parse_bridge_config(xml), props, host=EmbeddedHostBroker(broker), tuning=FAST)
    bridge.start()
    print("ready", flush=True)
    while broker.queue_depth("src") > 0:
        time.sleep(0.01)
    bridge.stop()
    broker.close()
    print("done", flush=True)


def activemq_to_activemq(
    varhome: str, jndi: dict[str, str], batch: str, local: str, src: str, dst: str, left: int | None = None
) -> None:
    broker = Broker(Path(varhome) / "host", sync=True)
    props = load_properties(
        [],
        [
            f"imq.varhome={varhome}",
            "imq.bridge.crash.type=jms",
            "imq.bridge.crash.xmlurl=crash.xml",
            f"imq.bridge.crash.transaction.batchSize={batch}",
            f"imq.bridge.crash.transaction.local={local}",
            "imq.bridge.crash.backoutThreshold=0",
        ],
        environ={},
    )
    cfs = amq_factory(jndi) + amq_factory(jndi).replace('ref-name="amq"', 'ref-name="amq2"')
    xml = bridge_xml(
        AMQ_LINK,
        cfs=cfs,
        name="crash",
        log_message_transfer="false",
        dests=f'<destination ref-name="src" name="{src}"/><destination ref-name="dst" name="{dst}"/>',
    )
    bridge = JMSBridge(parse_bridge_config(xml), props, host=EmbeddedHostBroker(broker), tuning=FAST)
    bridge.start()
    print("ready", flush=True)
    counters = bridge.links[0].counters
    moved, still = -1, time.monotonic()
    while time.monotonic() - still < 3 and (left is None or counters.transferred < left):
        if counters.transferred != moved:
            moved, still = counters.transferred, time.monotonic()
            print(f"moved {moved}", flush=True)  # (the test kills on progress, not time)
        time.sleep(0.05)
    kind = bridge.links[0].info()["transaction"]
    bridge.stop()
    broker.close()
    print(f"done ({kind})", flush=True)


if __name__ == "__main__":
    main()
