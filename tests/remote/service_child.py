"""A broker with its jms service and port mapper in a child process, for the tests that
kill or restart the service under connected clients.

Usage: service_child.py STORE_DIR PORTMAPPER_PORT [SYNC]. Prints "ready <jms port>" and
serves until killed (SIGKILL) or terminated (SIGTERM: a clean stop).
"""

from __future__ import annotations

import signal
import sys
import threading

from bridgemgr.admin.portmapper import PortMapper
from bridgemgr.netloop import NetLoop
from bridgemgr.providers.embedded import Broker
from bridgemgr.providers.embedded.jmsservice import JmsService


def main() -> None:
    store, pm_port = sys.argv[1], int(sys.argv[2])
    sync = len(sys.argv) > 3 and sys.argv[3] == "sync"
    broker = Broker(store, sync=sync)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with NetLoop() as netloop:
        service = JmsService(broker, netloop, "127.0.0.1", 0, heartbeat=1.0).start()
        portmapper = PortMapper(netloop, "127.0.0.1", pm_port, "childbroker").start()
        portmapper.register(service.service_entry())
        print(f"ready {service.port}", flush=True)
        stop.wait()
        service.stop()
        portmapper.stop()
    broker.close()


if __name__ == "__main__":
    main()
