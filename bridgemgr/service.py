"""The Bridge Service Manager process: broker properties -> the host broker (and, as
later parts land, its bridges), run until told to stop, then stop cleanly.

How it works: ``start()`` takes an exclusive lock on the instance directory (a second
service on the same var directory refuses to start instead of sharing the store),
opens the embedded host broker there with the properties' persistence and
auto-create settings, and makes it the process's host broker (what a bridge XML
connection factory without lookup-name means). ``run()`` blocks until SIGTERM or
SIGINT; ``stop()`` closes the broker, which writes what is pending and closes the store.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import threading
from typing import IO

from .props import BrokerProperties
from .providers.embedded import (
    Broker,
    DestinationLimits,
    LimitBehavior,
    set_host_broker,
)

log = logging.getLogger(__name__)


class ServiceError(Exception):
    """The service cannot start (the instance is locked, the store cannot open)."""


class BridgeServiceManager:
    def __init__(self, props: BrokerProperties) -> None:
        self.props = props
        self.instance_dir = props.instance_dir
        self.broker: Broker | None = None
        self._lock_file: IO[str] | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        self.instance_dir.mkdir(parents=True, exist_ok=True)
        self._lock_instance()
        auto = self.props.autocreate
        try:
            self.broker = Broker(
                self.instance_dir / "store",
                sync=self.props.get("imq.persist.file.sync.enabled"),
                instance_name=self.props.get("imq.instancename"),
                autocreate_queue=auto.autocreate_queue, autocreate_topic=auto.autocreate_topic,
                limits=DestinationLimits(auto.max_num_msgs, auto.max_total_msg_bytes,
                                         auto.max_bytes_per_msg, LimitBehavior(auto.limit_behavior),
                                         auto.use_dmq))
        except Exception:
            self._unlock_instance()
            raise
        set_host_broker(self.broker)
        log.info("host broker %s started, store %s (fsync %s)", self.broker.instance_name,
                 self.broker.store.path if self.broker.store else "-",
                 "on" if self.broker.sync else "off")

    def _lock_instance(self) -> None:
        path = self.instance_dir / "lock"
        handle = open(path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise ServiceError(f"{self.instance_dir} is in use by {holder}; "
                               "stop that service or give this one another imq.varhome / imq.instancename") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        self._lock_file = handle

    def _unlock_instance(self) -> None:
        if self._lock_file is not None:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None

    def request_stop(self, *_: object) -> None:
        self._stop.set()

    def handle_signals(self) -> None:
        """SIGTERM and SIGINT ask ``run()`` to stop (call from the main thread)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.request_stop)

    def run(self) -> None:
        """Block until request_stop (a signal, once handle_signals was called), then stop."""
        try:
            while not self._stop.wait(0.5):
                pass
        finally:
            self.stop()

    def stop(self) -> None:
        if self.broker is not None:
            log.info("stopping the host broker")
            set_host_broker(None)
            self.broker.close()
            self.broker = None
        self._unlock_instance()

    def __enter__(self) -> "BridgeServiceManager":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
