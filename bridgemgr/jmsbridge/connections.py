"""Dedicated, pooled and shared connections to the providers of a JMS bridge.

A Connector wraps one <connection-factory> and makes connections the way the element says
(login, connect-attempts, connect-attempt-interval, interruptible by a stop event, each
failed attempt told to the caller's `failed` callback), each a Handle whose `broken` event
the provider's exception listener sets. BridgeConnections hands
them out as Leases by the chapter's rules (connection_kind): DEDICATED for a link source
and for a target or DMQ that stays connected or names a clientid, POOLED for one that does
not stay connected and has no client id, SHARED otherwise.

Rules: pools close connections idle past the factory's idle-timeout (reap()); a shared
connection is reference-counted and replaced when it breaks; close() waits until every
lease is back before closing (the chapter's stop steps 2 and 3).

Design notes: docs/jms-bridges.md#internals-jmsbridgeconnectionspy.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from ..jms.errors import TransportException
from ..jms.naming import PROVIDER_URL
from ..jms.spi import Connection, ConnectionFactory, XAConnectionFactory
from ..props import clip
from .config import ConnectionFactoryConfig
from .imqcf import ADDRESS_LIST
from .pipeline import Interrupted

# Told of each failed connect attempt: what failed, naming the factory, its broker and why.
AttemptFailed = Callable[[str], None]


class ConnectionKind(str, Enum):
    """How a connection is held; the value is the letter `list link` shows."""

    DEDICATED = "D"
    POOLED = "P"
    SHARED = "S"


def configured_client_id(config: ConnectionFactoryConfig, factory: object = None) -> str | None:
    """The client id a <connection-factory> gives its connections (a factory with one
    cannot pool them): imqConfiguredClientID of a factory without lookup-name, or a
    looked-up factory's ``client_id``."""
    if config.lookup_name is None:
        return config.imq.client_id
    return getattr(factory, "client_id", None) or None


def connection_kind(
    role: str, stay_connected: bool = True, clientid: str | None = None, factory_client_id: str | None = None
) -> ConnectionKind:
    """The chapter's rules ("Pooled, Shared, and Dedicated Connections")."""
    if role == "source" or stay_connected or clientid:
        return ConnectionKind.DEDICATED
    if not factory_client_id:
        return ConnectionKind.POOLED
    return ConnectionKind.SHARED


class ConnectError(TransportException, code="BRIDGE_CONNECT"):
    """Every connect attempt a <connection-factory> allows has failed."""


def broker_address(config: ConnectionFactoryConfig) -> str:
    """The broker a <connection-factory> reaches, for messages: its provider URL or
    imqAddressList without user names and passwords, else the host broker."""
    env = config.environment
    url = env.get(PROVIDER_URL) or env.get(ADDRESS_LIST)
    if not url:
        return "the host broker" if config.lookup_name is None else "its provider's default broker"
    return clip(re.sub(r"(//)[^/@,\s]*@", r"\1", url), 200)


class Handle:
    """A physical connection and whether its provider has reported it broken."""

    def __init__(self, connection: Connection, connector: Connector) -> None:
        self.connection = connection
        self.connector = connector
        self.broken = threading.Event()
        self.failure: str | None = None  # what the provider reported when it broke
        self.idle_since = time.monotonic()
        self.closed = False
        connection.set_exception_listener(self._on_exception)

    def _on_exception(self, exc: Exception) -> None:
        self.failure = f"{type(exc).__name__}: {clip(str(exc), 300)}"
        self.broken.set()
        self.connector.log.warning("connection of connection-factory %s failed: %s", self.connector.ref_name, exc)

    def describe_failure(self) -> str:
        """The broken connection, its factory, its broker and what the provider reported."""
        cfg = self.connector.config
        return f"the connection of connection-factory {cfg.ref_name} to {broker_address(cfg)} failed" + (
            f": {self.failure}" if self.failure else ""
        )

    @property
    def provider_name(self) -> str:
        """ConnectionMetaData's provider name, else the factory's class name (the chapter)."""
        try:
            return self.connection.metadata.provider_name
        except Exception:
            return type(self.connector.factory).__name__

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.connection.close()
        except Exception as exc:  # a broken connection may fail to close; it is gone anyway
            self.connector.log.debug("closing a connection of %s: %s", self.connector.ref_name, exc)


@dataclass
class Connector:
    """Makes connections for one <connection-factory>."""

    config: ConnectionFactoryConfig
    factory: ConnectionFactory
    log: logging.Logger

    @property
    def ref_name(self) -> str:
        return self.config.ref_name

    @property
    def configured_client_id(self) -> str | None:
        return configured_client_id(self.config, self.factory)

    def connect(
        self,
        clientid: str | None = None,
        stop: threading.Event | None = None,
        attempts: int | None = None,
        xa: bool = False,
        failed: AttemptFailed | None = None,
    ) -> Handle:
        """A started-later connection (client id set), trying as often as the factory's
        connect-attempts say (or ``attempts``), connect-attempt-interval apart; each failed
        attempt goes to ``failed``; ConnectError when every attempt failed, Interrupted
        when ``stop`` is set while waiting between attempts."""
        cfg = self.config
        allowed = cfg.connect_attempts if attempts is None else attempts
        # A host-broker factory is configured by its <property> elements: its client id too.
        if clientid is None and cfg.lookup_name is None:
            clientid = self.configured_client_id
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._connect_once(clientid, xa)
            except Exception as exc:  # provider code: any failure is a failed attempt
                error = exc
            of = "unlimited" if allowed < 0 else str(allowed)
            cause = f"{type(error).__name__}: {clip(str(error), 300)}"
            self.log.warning(
                "connect attempt %d (of %s) with connection-factory %s failed: %s", attempt, of, cfg.ref_name, cause
            )
            if failed is not None:
                failed(
                    f"cannot connect with connection-factory {cfg.ref_name} to {broker_address(cfg)} "
                    f"(attempt {attempt} of {of}, every {cfg.connect_attempt_interval_in_seconds} s): {cause}"
                )
            if 0 <= allowed <= attempt:
                raise ConnectError(
                    f"cannot connect with connection-factory {cfg.ref_name} after "
                    f"{attempt} attempt(s): {type(error).__name__}: "
                    f"{clip(str(error), 300)}"
                ) from error
            if stop is not None and stop.wait(cfg.connect_attempt_interval_in_seconds):
                raise Interrupted(f"stopped while connecting with {cfg.ref_name}")
            if stop is None:
                time.sleep(cfg.connect_attempt_interval_in_seconds)

    def _connect_once(self, clientid: str | None, xa: bool) -> Handle:
        cfg = self.config
        username, password = cfg.login
        if xa:
            if not isinstance(self.factory, XAConnectionFactory):
                raise TransportException(f"connection-factory {cfg.ref_name} is not an XA connection factory")
            conn: Connection = self.factory.create_xa_connection(username, password)
        else:
            conn = self.factory.create_connection(username, password)
        try:
            if clientid:
                conn.client_id = clientid
            return Handle(conn, self)
        except BaseException:
            conn.close()
            raise


class Lease:
    """A connection handed out by BridgeConnections; give it back with release()."""

    def __init__(
        self,
        handle: Handle,
        kind: ConnectionKind,
        owner: BridgeConnections,
        holder: ConnectionPool | SharedConnection | None,
    ) -> None:
        self.handle = handle
        self.kind = kind
        self._owner = owner
        self._holder = holder
        self.released = False

    @property
    def connection(self) -> Connection:
        return self.handle.connection

    @property
    def broken(self) -> bool:
        return self.handle.broken.is_set()

    def release(self, broken: bool = False) -> None:
        """Give the connection back; ``broken``: it failed and must not be reused."""
        if self.released:
            return
        self.released = True
        broken = broken or self.broken
        if self._holder is None:
            self.handle.close()
        else:
            self._holder.give_back(self.handle, broken)
        self._owner._returned()


@dataclass
class ConnectionPool:
    """Connections of one factory for targets and DMQs that do not stay connected."""

    connector: Connector
    idle: list[Handle] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(
        self, stop: threading.Event | None, attempts: int | None, xa: bool, failed: AttemptFailed | None = None
    ) -> Handle:
        with self.lock:
            while self.idle:
                handle = self.idle.pop()  # the most recently used: likeliest to be alive
                if not handle.broken.is_set():
                    return handle
                handle.close()
        return self.connector.connect(None, stop, attempts, xa, failed)

    def give_back(self, handle: Handle, broken: bool) -> None:
        if broken:
            handle.close()
            return
        handle.idle_since = time.monotonic()
        with self.lock:
            self.idle.append(handle)

    def reap(self, now: float) -> int:
        """Close connections idle longer than idle-timeout-in-seconds (0: never)."""
        timeout = self.connector.config.idle_timeout_in_seconds
        if not timeout:
            return 0
        with self.lock:
            old = [h for h in self.idle if now - h.idle_since >= timeout or h.broken.is_set()]
            self.idle = [h for h in self.idle if h not in old]
        for handle in old:
            handle.close()
        return len(old)

    def close(self) -> None:
        with self.lock:
            idle, self.idle = self.idle, []
        for handle in idle:
            handle.close()


@dataclass
class SharedConnection:
    """One connection of a factory with a configured client id, shared by reference."""

    connector: Connector
    current: Handle | None = None
    refs: dict[Handle, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(
        self, stop: threading.Event | None, attempts: int | None, xa: bool, failed: AttemptFailed | None = None
    ) -> Handle:
        with self.lock:
            if self.current is not None and not self.current.broken.is_set():
                self.refs[self.current] += 1
                return self.current
        # Connect outside the lock (it may retry for long); a racing taker may connect too,
        # and the later one replaces the current connection when it is free.
        handle = self.connector.connect(None, stop, attempts, xa, failed)
        with self.lock:
            old = self.current
            self.current = handle
            self.refs[handle] = 1
            if old is not None and self.refs.get(old) == 0:
                del self.refs[old]
                old.close()
        return handle

    def give_back(self, handle: Handle, broken: bool) -> None:
        with self.lock:
            self.refs[handle] -= 1
            if broken and handle is self.current:
                self.current = None
            if self.refs[handle] == 0 and handle is not self.current:
                del self.refs[handle]
                handle.close()

    def reap(self, now: float) -> int:
        return 0

    def close(self) -> None:
        with self.lock:
            handles, self.refs, self.current = list(self.refs), {}, None
        for handle in handles:
            handle.close()


class BridgeConnections:
    """The connections of one bridge, handed out by the chapter's rules."""

    def __init__(self, connectors: Mapping[str, Connector]) -> None:
        self.connectors = dict(connectors)
        self._pools: dict[str, ConnectionPool] = {}
        self._shared: dict[str, SharedConnection] = {}
        self._cond = threading.Condition()
        self._out = 0  # leases not yet released

    def kind(self, role: str, cf_ref: str, stay_connected: bool = True, clientid: str | None = None) -> ConnectionKind:
        return connection_kind(role, stay_connected, clientid, self.connectors[cf_ref].configured_client_id)

    def prepare(self) -> None:
        """Start step 7: the pool and shared-connection holders of every factory."""
        with self._cond:
            for ref, connector in self.connectors.items():
                self._pools.setdefault(ref, ConnectionPool(connector))
                self._shared.setdefault(ref, SharedConnection(connector))

    def lease(
        self,
        cf_ref: str,
        kind: ConnectionKind,
        clientid: str | None = None,
        stop: threading.Event | None = None,
        attempts: int | None = None,
        xa: bool = False,
        failed: AttemptFailed | None = None,
    ) -> Lease:
        """A connection of ``cf_ref`` held as ``kind`` says (see Connector.connect)."""
        connector = self.connectors[cf_ref]
        holder: ConnectionPool | SharedConnection | None = None
        if kind is ConnectionKind.POOLED:
            holder = self._pools.setdefault(cf_ref, ConnectionPool(connector))
        elif kind is ConnectionKind.SHARED:
            holder = self._shared.setdefault(cf_ref, SharedConnection(connector))
        handle = (
            holder.take(stop, attempts, xa, failed)
            if holder is not None
            else connector.connect(clientid, stop, attempts, xa, failed)
        )
        with self._cond:
            self._out += 1
        return Lease(handle, kind, self, holder)

    def _returned(self) -> None:
        with self._cond:
            self._out -= 1
            self._cond.notify_all()

    @property
    def outstanding(self) -> int:
        with self._cond:
            return self._out

    def reap(self, now: float | None = None) -> int:
        """Close pooled connections past their idle timeout; how many were closed."""
        now = time.monotonic() if now is None else now
        return sum(pool.reap(now) for pool in list(self._pools.values()))

    def pooled_idle(self, cf_ref: str) -> int:
        pool = self._pools.get(cf_ref)
        return len(pool.idle) if pool is not None else 0

    def close(self, timeout: float | None = None) -> bool:
        """Wait until every lease is back (or ``timeout``), then close every pooled and
        shared connection; False if some lease was still out."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._out > 0:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self._cond.wait(remaining)
            all_back = self._out == 0
        holders: list[ConnectionPool | SharedConnection] = [*self._pools.values(), *self._shared.values()]
        for holder in holders:
            holder.close()
        return all_back
