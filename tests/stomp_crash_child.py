"""A STOMP bridge over an embedded broker whose store syncs, run in a subprocess by
test_stomp_crash.py to be killed with SIGKILL.

Usage: stomp_crash_child.py STORE_DIR PASSWD; prints the bridge's TCP port (flushed), then
serves until killed.
"""

from __future__ import annotations

import sys
import time

from bridgemgr.netloop import NetLoop
from bridgemgr.providers.embedded import Broker
from bridgemgr.providers.embedded.host import EmbeddedHostBroker
from bridgemgr.stompbridge import StompBridge, StompConfig
from bridgemgr.users import UserRepository


def main() -> None:
    broker = Broker(sys.argv[1], sync=True)
    loop = NetLoop().start()
    bridge = StompBridge(
        StompConfig(hostname="127.0.0.1", tcp_port=0), EmbeddedHostBroker(broker), UserRepository(sys.argv[2]), loop
    )
    bridge.start()
    sys.stdout.write(f"{bridge.tcp_port}\n")
    sys.stdout.flush()
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
