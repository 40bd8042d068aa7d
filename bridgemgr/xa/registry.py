"""Resource manager registration and the XA parts of a running JMS bridge.

BridgeTransactions is what a JMS bridge with transacted links holds while it runs (the
chapter's start steps 4-6): the coordinator with its log, the registered resource managers
and recovery. start() opens the log (txlog.<bridge> in the bridge's var directory, tm.props
settings; the SQL log when the host broker's store gives one), registers the RMs by the
chapter's rule (registration(): every <connection-factory> whose factory is an
XAConnectionFactory and whose multi-rm is "false" is an RM named <bridge>:<ref-name>, stable
across restarts as long as the ref-name is; a multi-rm="true" factory is not registered:
each RM it reaches must be identified by a multi-rm="false" factory of the bridge to take
part in recovery), and runs the first recovery pass before it returns, so links start only
after it. An RM connects for recovery on its own XA connection (no client id: the links'
connections may hold it), opened when first asked. in_doubt() and resolve() are the
operator's `imqbridgemgr list|commit|rollback txn`: the bridge's prepared branches at its
RMs by transaction, with what the log says (read without changing it when the bridge is not
running: salvage() of a damaged file), and a heuristic commit or rollback of every branch of
one transaction.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..jms import xa
from ..jms.spi import (
    Connection,
    ConnectionFactory,
    XAConnection,
    XAConnectionFactory,
    XAResource,
    is_xa_capable,
)
from ..jms.xa import Xid
from .coordinator import Coordinator, is_ours
from .recovery import Recovery, RecoverySource, commit_branch, rollback_branch
from .sqllog import DBAPIConnect, SqlTxLog
from .txlog import (
    FILE_MAGIC,
    CommitRecord,
    FileTxLog,
    MemoryTxLog,
    TxLog,
    TxLogError,
    TxLogSettings,
    salvage,
    txlog_path,
)

log = logging.getLogger(__name__)


def open_txlog(
    bridge: str, directory: str | Path | None, tm_props: Mapping[str, str], sql: tuple[DBAPIConnect, str] | None = None
) -> TxLog:
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
        return (
            'multi-rm="true": not registered; recovery reaches each of its resource '
            'managers through a connection-factory with multi-rm="false" that identifies it'
        )
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
                        raise TypeError(
                            f"connection-factory {self.ref_name} gave a {type(conn).__name__}, not an XA connection"
                        )
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

    def __init__(self, bridge: str, coordinator: Coordinator, rms: list[ResourceManager], recovery: Recovery) -> None:
        self.bridge = bridge
        self.coordinator = coordinator
        self.rms = rms
        self.recovery = recovery

    @classmethod
    def start(
        cls,
        bridge: str,
        factories: list[FactoryEntry],
        directory: str | Path | None,
        tm_props: Mapping[str, str],
        logger: logging.Logger,
        store: str = "file",
        sql: tuple[DBAPIConnect, str] | None = None,
        retry_interval: float = 2.0,
    ) -> BridgeTransactions:
        """Steps 4-6 of a bridge start: coordinator and log, RM registration, recovery.
        ``store`` is imq.persist.store; with "jdbc" the log goes to the host broker's
        database through ``sql`` (a DB-API connect function and its paramstyle)."""
        if store == "jdbc" and sql is None:
            logger.warning(
                "imq.persist.store=jdbc, but the host broker's store offers no SQL "
                "connection for the transaction log; bridge %s logs to the file "
                "txlog.%s instead",
                bridge,
                bridge,
            )
        txlog: TxLog = open_txlog(bridge, directory, tm_props, sql)
        if directory is None and sql is None:
            logger.warning(
                "bridge %s has no var directory: its XA transaction log is kept "
                "in memory and decisions do not survive a crash",
                bridge,
            )
        coordinator = Coordinator(bridge, txlog)
        rms = []
        for entry in factories:
            factory = entry.factory
            why = registration(entry.multi_rm, factory)
            if why is not None or not is_xa_capable(factory):  # (registration says why not)
                logger.info("connection-factory %s: %s", entry.ref_name, why)
                continue
            rms.append(
                ResourceManager(
                    rm_name(bridge, entry.ref_name), entry.ref_name, factory, entry.username, entry.password
                )
            )
        logger.info(
            "XA coordinator of bridge %s: log %s, %d live commit record(s); resource managers %s",
            bridge,
            txlog.description,
            len(txlog.live()),
            ", ".join(rm.name for rm in rms) or "none",
        )
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


# --- in-doubt transactions by hand (imqbridgemgr list|commit|rollback txn) -----------------------


def transaction_id(gtrid: bytes) -> str:
    """How a transaction is named to the operator: our gtrids are text (<bridge>|<boot>.<n>)."""
    return gtrid.decode("utf-8", "backslashreplace")


@dataclass
class InDoubt:
    """One global transaction of this bridge with branches prepared at its RMs."""

    gtrid: bytes
    branches: list[tuple[str, Xid]] = field(default_factory=list)  # (rm name, xid)
    logged: str = "unknown"  # commit | none | unknown (the log cannot be read)
    in_flight: bool = False  # a link of this run is still completing it

    def to_json(self) -> dict[str, Any]:
        return {
            "id": transaction_id(self.gtrid),
            "gtrid": self.gtrid.hex(),
            "branches": [{"rm": rm, "xid": str(xid)} for rm, xid in self.branches],
            "logged": self.logged,
            "in_flight": self.in_flight,
        }


def in_doubt(
    rms: Sequence[RecoverySource],
    tag: bytes,
    decisions: Mapping[bytes, CommitRecord] | None,
    in_flight: Callable[[bytes], bool] = lambda gtrid: False,
) -> tuple[list[InDoubt], dict[str, str]]:
    """The bridge's prepared branches at every RM, by transaction, with what the log says
    (``decisions`` None: unreadable); and the RMs that could not be asked, with why."""
    found: dict[bytes, InDoubt] = {}
    errors: dict[str, str] = {}
    for rm in rms:
        try:
            xids = rm.resource().recover(xa.TMSTARTRSCAN | xa.TMENDRSCAN)
        except Exception as exc:
            rm.reset()
            errors[rm.name] = f"{type(exc).__name__}: {exc}"
            continue
        for xid in xids:
            if is_ours(xid, tag):
                entry = found.setdefault(xid.gtrid, InDoubt(xid.gtrid))
                entry.branches.append((rm.name, xid))
    for entry in found.values():
        entry.in_flight = in_flight(entry.gtrid)
        if decisions is not None:
            entry.logged = "commit" if entry.gtrid in decisions else "none"
    return sorted(found.values(), key=lambda e: e.gtrid), errors


def resolve(
    rms: Sequence[RecoverySource],
    tag: bytes,
    txn: str,
    commit: bool,
    in_flight: Callable[[bytes], bool],
    logger: logging.Logger,
) -> InDoubt:
    """Commit or roll back every prepared branch of transaction ``txn`` (its id, gtrid in
    hex or one branch's Xid) by hand: a heuristic outcome the operator chose. ValueError
    when there is no such transaction in doubt or a link is still completing it;
    RuntimeError when a branch could not be finished."""
    found, errors = in_doubt(rms, tag, None, in_flight)
    match = [
        e
        for e in found
        if txn in (transaction_id(e.gtrid), e.gtrid.hex()) or any(txn == str(xid) for _rm, xid in e.branches)
    ]
    if not match:
        unreachable = "; ".join(f"{rm}: {why}" for rm, why in errors.items())
        raise ValueError(
            f"no transaction {txn} is in doubt"
            + (f" at the reachable resource managers (unreachable: {unreachable})" if unreachable else "")
        )
    entry = match[0]
    if entry.in_flight:
        raise ValueError(f"transaction {txn} is being completed by a link; it is not in doubt")
    what = "commit" if commit else "rollback"
    by_name = {rm.name: rm for rm in rms}
    failed = []
    for rm_name_, xid in entry.branches:
        resource = by_name[rm_name_].resource()
        try:
            (commit_branch if commit else rollback_branch)(resource, xid, logger)
        except Exception as exc:
            failed.append(f"{rm_name_}: {type(exc).__name__}: {exc}")
    logger.warning(
        "XA: transaction %s %s by hand (heuristic %s) at %s%s",
        transaction_id(entry.gtrid),
        "committed" if commit else "rolled back",
        what,
        ", ".join(rm for rm, _xid in entry.branches),
        f"; failed at {'; '.join(failed)}" if failed else "",
    )
    if failed:
        raise RuntimeError(f"{what} of transaction {txn} failed at {'; '.join(failed)}")
    return entry


def temporary_rms(bridge: str, factories: list[FactoryEntry]) -> list[ResourceManager]:
    """The RMs a bridge registers, for resolving transactions while it is not running."""
    return [
        ResourceManager(rm_name(bridge, e.ref_name), e.ref_name, e.factory, e.username, e.password)
        for e in factories
        if registration(e.multi_rm, e.factory) is None and is_xa_capable(e.factory)
    ]


def logged_decisions(
    directory: str | Path | None, bridge: str, sql: tuple[DBAPIConnect, str] | None
) -> dict[bytes, CommitRecord] | None:
    """What the log of a bridge that is not running says, read without changing it (the
    good records of a damaged file: a hint, not a decision); None when it cannot be read."""
    if sql is not None:
        try:
            return SqlTxLog(sql[0], bridge, sql[1]).peek()
        except TxLogError:
            return None
    if directory is None:
        return None
    path = txlog_path(directory, bridge)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError:
        return None
    if not data.startswith(FILE_MAGIC):
        return None
    return salvage(data, len(FILE_MAGIC))
