# How it works: BridgeTransactions is what a JMS bridge with transacted links holds while
# it runs (the chapter's start steps 4-6): the coordinator with its log, the registered
# resource managers and recovery. start() opens the log (txlog.<bridge> in the bridge's
# var directory, tm.props settings; the SQL log when the host broker's store gives one),
# registers the RMs by the chapter's rule (registration(): every <connection-factory>
# whose factory is an XAConnectionFactory and whose multi-rm is "false" is an RM named
# <bridge>:<ref-name>, stable across restarts as long as the ref-name is; a multi-rm="true"
# factory is not registered: each RM it reaches must be identified by a multi-rm="false"
# factory of the bridge to take part in recovery), and runs the first recovery pass before
# it returns, so links start only after it. An RM connects for recovery on its own XA
# connection (no client id: the links' connections may hold it), opened when first asked.
"""Resource manager registration and the XA parts of a running JMS bridge."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..jms.spi import (
    Connection,
    ConnectionFactory,
    XAConnection,
    XAConnectionFactory,
    XAResource,
    is_xa_capable,
)
from .coordinator import Coordinator
from .recovery import Recovery, RecoverySource
from .sqllog import DBAPIConnect, SqlTxLog
from .txlog import FileTxLog, MemoryTxLog, TxLog, TxLogSettings, txlog_path

log = logging.getLogger(__name__)


def open_txlog(bridge: str, directory: str | Path | None, tm_props: Mapping[str, str],
               sql: tuple[DBAPIConnect, str] | None = None) -> TxLog:
    """The log a bridge's coordinator uses, opened: SQL when ``sql`` (connect function,
    paramstyle) is given (imq.persist.store=jdbc), else txlog.<bridge> in ``directory``,
    else in memory."""
    txlog: TxLog
    if sql is not None:
        txlog = SqlTxLog(sql[0], bridge, sql[1])
    elif directory is not None:
        txlog = FileTxLog(txlog_path(directory, bridge), TxLogSettings.from_tm_props(tm_props))
    else:
        txlog = MemoryTxLog()
    txlog.open()
    return txlog


def rm_name(bridge: str, ref_name: str) -> str:
    """The registered name of the RM a bridge reaches through connection factory ``ref_name``."""
    return f"{bridge}:{ref_name}"


def registration(multi_rm: bool, factory: object) -> str | None:
    """Why a connection factory is not registered as an RM (None: it is)."""
    if not is_xa_capable(factory):
        return "not an XAConnectionFactory"
    if multi_rm:
        return ('multi-rm="true": not registered; recovery reaches each of its resource '
                'managers through a connection-factory with multi-rm="false" that identifies it')
    return None


@dataclass(eq=False)
class ResourceManager(RecoverySource):
    """A registered RM: its name and an XA connection of its own for recovery."""

    name: str
    ref_name: str
    factory: XAConnectionFactory
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    _connection: Connection | None = field(default=None, repr=False)
    _resource: XAResource | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def resource(self) -> XAResource:
        with self._lock:
            if self._resource is None:
                conn = self.factory.create_xa_connection(self.username, self.password)
                try:
                    if not isinstance(conn, XAConnection):
                        raise TypeError(f"connection-factory {self.ref_name} gave a "
                                        f"{type(conn).__name__}, not an XA connection")
                    self._resource = conn.create_xa_session().xa_resource
                except BaseException:
                    _close(conn)
                    raise
                self._connection = conn
            return self._resource

    def reset(self) -> None:
        with self._lock:
            conn, self._connection, self._resource = self._connection, None, None
        if conn is not None:
            _close(conn)

    close = reset


def _close(conn: Any) -> None:
    try:
        conn.close()
    except Exception:
        pass


@dataclass(frozen=True)
class FactoryEntry:
    """A <connection-factory> as the bridge resolved it."""

    ref_name: str
    multi_rm: bool
    factory: ConnectionFactory
    username: str | None = None
    password: str | None = field(default=None, repr=False)


class BridgeTransactions:
    """The coordinator, its log, the registered RMs and recovery of one running bridge."""

    def __init__(self, bridge: str, coordinator: Coordinator, rms: list[ResourceManager],
                 recovery: Recovery) -> None:
        self.bridge = bridge
        self.coordinator = coordinator
        self.rms = rms
        self.recovery = recovery

    @classmethod
    def start(cls, bridge: str, factories: list[FactoryEntry], directory: str | Path | None,
              tm_props: Mapping[str, str], logger: logging.Logger,
              store: str = "file", sql: tuple[DBAPIConnect, str] | None = None,
              retry_interval: float = 2.0) -> BridgeTransactions:
        """Steps 4-6 of a bridge start: coordinator and log, RM registration, recovery.
        ``store`` is imq.persist.store; with "jdbc" the log goes to the host broker's
        database through ``sql`` (a DB-API connect function and its paramstyle)."""
        if store == "jdbc" and sql is None:
            logger.warning("imq.persist.store=jdbc, but the host broker's store offers no SQL "
                           "connection for the transaction log; bridge %s logs to the file "
                           "txlog.%s instead", bridge, bridge)
        txlog: TxLog = open_txlog(bridge, directory, tm_props, sql)
        if directory is None and sql is None:
            logger.warning("bridge %s has no var directory: its XA transaction log is kept "
                           "in memory and decisions do not survive a crash", bridge)
        coordinator = Coordinator(bridge, txlog)
        rms = []
        for entry in factories:
            factory = entry.factory
            why = registration(entry.multi_rm, factory)
            if why is not None or not is_xa_capable(factory):  # (registration says why not)
                logger.info("connection-factory %s: %s", entry.ref_name, why)
                continue
            rms.append(ResourceManager(rm_name(bridge, entry.ref_name), entry.ref_name,
                                       factory, entry.username, entry.password))
        logger.info("XA coordinator of bridge %s: log %s, %d live commit record(s); resource "
                    "managers %s", bridge, txlog.description, len(txlog.live()),
                    ", ".join(rm.name for rm in rms) or "none")
        recovery = Recovery(coordinator, rms, logger, interval=retry_interval)
        try:
            recovery.start()
        except BaseException:
            recovery.close()
            coordinator.close()
            raise
        return cls(bridge, coordinator, rms, recovery)

    def rm_name(self, ref_name: str) -> str:
        return rm_name(self.bridge, ref_name)

    def close(self) -> None:
        """After the links stopped: stop recovery, write pending forgets, close the log
        and the recovery connections."""
        self.recovery.close()
        try:
            self.coordinator.close()
        finally:
            for rm in self.rms:
                rm.close()
