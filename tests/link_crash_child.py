"""A JMS bridge run in a subprocess by test_jmsbridge_crash.py, to be killed with SIGKILL.

Usage: link_crash_child.py STORE_DIR. Opens the persistent embedded broker of STORE_DIR
(fsync on), makes it the host broker and starts bridge `crash` with one non-transacted
link src -> dst. Prints "ready" once the link runs; when src is empty it stops the bridge
cleanly and prints "done". The parent kills it at random moments in between.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bridgemgr.providers.embedded import Broker, connection_factory, set_host_broker  # noqa: E402

from jmsbridge_support import FAST, bridge_xml, link_xml  # noqa: E402


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    from bridgemgr.jmsbridge.bridge import JMSBridge
    from bridgemgr.jmsbridge.config import parse_bridge_config

    broker = Broker(sys.argv[1], sync=True)
    set_host_broker(broker)
    bridge = JMSBridge(parse_bridge_config(bridge_xml(link_xml(), name="crash",
                                                      log_message_transfer="false")),
                       host_factory=lambda env: connection_factory(), tuning=FAST)
    bridge.start()
    say("ready")
    while broker.queue_depth("src") > 0:
        time.sleep(0.01)
    bridge.stop()
    broker.close()
    say("done")


if __name__ == "__main__":
    main()
