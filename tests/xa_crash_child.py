"""A JMS bridge with one transacted link between two embedded brokers, run in a subprocess
by test_xa_crash.py and killed there with SIGKILL.

Usage: xa_crash_child.py SOURCE_STORE TARGET_STORE VARHOME BATCH. SOURCE_STORE may be a
jdbc spec (tests/stores.py): the host broker and the bridge's XA log are then in PostgreSQL.
Opens both brokers with fsync on (two stores: the link is a genuine two-phase commit across resource managers),
the source one as the host broker, and starts bridge `crash` (its transaction log under
VARHOME) with the transacted link src -> dst, transaction.batchSize BATCH. The target is
reached by a JNDI lookup of the second store. The XA fault hook (IMQBRIDGE_XA_FAULT in the
environment) may kill the process between two protocol steps. Prints "ready" once the
bridge runs (recovery is done by then); when src is empty it stops the bridge cleanly and
prints "done".
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bridgemgr.jmsbridge.bridge import JMSBridge
from bridgemgr.jmsbridge.config import parse_bridge_config
from bridgemgr.props import load_properties
from bridgemgr.providers.embedded import open_broker
from bridgemgr.providers.embedded.host import EmbeddedHostBroker
from jmsbridge_support import FAST, bridge_xml
from stores import jdbc, open_at

LINK = (
    '<link name="l" transacted="true">'
    '<source connection-factory-ref="host" destination-ref="src"/>'
    '<target connection-factory-ref="target" destination-ref="dst"/></link>'
)


def target_factory(store: str) -> str:
    return (
        '<connection-factory ref-name="target" lookup-name="XAConnectionFactory">'
        '<property name="java.naming.factory.initial" value="imq.embedded"/>'
        f'<property name="java.naming.provider.url" value="{store}"/>'
        "</connection-factory>"
    )


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    source_store, target_store, varhome, batch = sys.argv[1:5]
    broker = open_at(source_store, sync=True)
    target = open_broker(target_store, sync=True)  # the one the lookup finds
    store = (
        ["imq.persist.store=jdbc", f"imq.persist.jdbc.postgresql.property.url={source_store.split('#')[0]}"]
        if jdbc(source_store)
        else []
    )
    props = load_properties(
        [],
        [
            f"imq.varhome={varhome}",
            "imq.bridge.crash.type=jms",
            "imq.bridge.crash.xmlurl=crash.xml",
            f"imq.bridge.crash.transaction.batchSize={batch}",
            *store,
        ],
        environ={},
    )
    xml = bridge_xml(LINK, cfs=target_factory(target_store), name="crash", log_message_transfer="false")
    bridge = JMSBridge(parse_bridge_config(xml), props, host=EmbeddedHostBroker(broker), tuning=FAST)
    bridge.start()
    say("ready")
    while broker.queue_depth("src") > 0:
        time.sleep(0.01)
    bridge.stop()
    broker.close()
    target.close()
    say("done")


if __name__ == "__main__":
    main()
