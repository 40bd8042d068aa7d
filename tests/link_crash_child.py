"""A JMS bridge run in a subprocess by test_jmsbridge_crash.py, to be killed with SIGKILL.

Usage: link_crash_child.py SOURCE_STORE [TARGET_STORE]. Opens the persistent embedded
broker of SOURCE_STORE (fsync on) as the host broker and starts bridge `crash` with one
non-transacted link src -> dst; dst is on the same broker, or, given TARGET_STORE, on a
second broker (fsync on too), reached by a JNDI lookup. The link's transformer pauses on
every 25th message, as a slow transformer or target would: a link that consumed before
sending would lose the messages caught there by a kill. Prints "ready" once the link
runs; when src is empty it stops the bridge cleanly and prints "done". The parent kills
it at random moments in between. With WINDOW=N in the environment the link has a confirm
window of N (imq.bridge.crash.link.window; the transformer then cannot halt the link) and
"ready" is followed by the window the link took; without it the window is 1: the chapter's
acknowledgement after each send (a link whose transformer can halt it keeps the default
window where the source can acknowledge its oldest messages, as the host broker can).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bridgemgr.providers.embedded import Broker, open_broker
from bridgemgr.providers.embedded.host import EmbeddedHostBroker
from bridgemgr.transform import MessageTransformer
from jmsbridge_support import FAST, bridge_xml, link_xml


class SlowEvery25th(MessageTransformer):
    def __init__(self) -> None:
        super().__init__()
        self.seen = 0

    def transform(self, message, read_only, charset_name, source, target, properties):
        self.seen += 1
        if self.seen % 25 == 0:
            time.sleep(0.05)
        return message


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    from bridgemgr.jmsbridge.bridge import JMSBridge
    from bridgemgr.jmsbridge.config import parse_bridge_config

    broker = Broker(sys.argv[1], sync=True)
    from bridgemgr.props import load_properties

    window = os.environ.get("WINDOW")
    attrs = 'message-transformer-class="link_crash_child.SlowEvery25th"'
    if window:
        attrs += ' consume-no-transfer-on-transform-error="true"'
    links = link_xml(target_attrs=attrs)
    cfs, target = "", None
    if len(sys.argv) > 2:
        target = open_broker(sys.argv[2], sync=True)  # the one the lookup below finds
        links = links.replace('<target connection-factory-ref="host"', '<target connection-factory-ref="remote"')
        cfs = (
            '<connection-factory ref-name="remote" lookup-name="ConnectionFactory">'
            '<property name="java.naming.factory.initial" value="imq.embedded"/>'
            f'<property name="java.naming.provider.url" value="{sys.argv[2]}"/>'
            "</connection-factory>"
        )
    bridge = JMSBridge(
        parse_bridge_config(bridge_xml(links, cfs=cfs, name="crash", log_message_transfer="false")),
        load_properties([], [f"imq.bridge.crash.link.window={window or 1}"], environ={}),
        host=EmbeddedHostBroker(broker),
        tuning=FAST,
    )
    bridge.start()
    say("ready" + (f" {bridge.links[0].window}" if window else ""))  # type: ignore[attr-defined]
    while broker.queue_depth("src") > 0:
        time.sleep(0.01)
    bridge.stop()
    broker.close()
    if target is not None:
        target.close()
    say("done")


if __name__ == "__main__":
    main()
