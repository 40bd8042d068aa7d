"""The unit of work around a link's transfers: CLIENT_ACKNOWLEDGE, an XA transaction, or a
local transaction when both ends are one resource manager.

The link loop (link.py) is the same for every delivery guarantee; a TransferTransaction
supplies the sessions, what "complete" and "abort" mean and whether a failed send goes to
the DMQ. ClientAcknowledge: the non-transacted link, at-least-once. XATransaction: the
transacted link, both ends enlisted in one transaction of the bridge's coordinator
(bridgemgr/xa), once-and-only-once; between in-process resource managers the commit phase
runs behind the link in a Completer. LocalTransaction: a transacted link whose two ends are
one resource manager runs each unit as one local JMS transaction on one session
(imq.bridge.<name>.transaction.local=false keeps XA). transaction_for() picks the class.

Rules: every receive belongs to a transaction (begin() before a unit's first receive); a
transaction is completed before the next starts on the same sessions; a link with an
in-doubt transaction moves nothing new until recovery has committed it everywhere.

Design notes: docs/jms-bridges.md#internals-jmsbridgetransferpy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from ..jms.errors import TransactionRolledBackException, TransportException, XAException
from ..jms.spi import (
    AckMode,
    Connection,
    ConnectionFactory,
    Session,
    XAConnection,
    XAResource,
    XASession,
    is_xa_capable,
)
from ..xa.completer import Completer, Outcome
from ..xa.coordinator import Coordinator, Transaction, TxState, unreachable
from ..xa.recovery import Recovery, Report
from ..xa.registry import BridgeTransactions
from ..xa.txlog import TxLogUnavailable
from .config import ConnectionFactoryConfig
from .pipeline import DMQReason, Stage


class TransferTransaction(ABC):
    """Where a link's unit of work begins and ends.

    The link calls begin() before it receives the first message of a unit, complete() or
    abort() to end a unit with messages, and idle() to end one in which the source had
    nothing to give; a unit may hold several messages (the link's batch)."""

    transacted: bool
    completion_stage: Stage  # ACKNOWLEDGE or COMMIT (tolerance, logs)
    failure_reason: DMQReason  # what a failed completion sends to the DMQ
    xa: bool = False  # the link's connections must be XA connections
    kind = "CLIENT_ACKNOWLEDGE"  # what the link's log and `list link` call it

    source_session: Session | None = None
    target_session: Session | None = None

    @abstractmethod
    def open_source(self, source: Connection) -> Session:
        """The session the link consumes on."""

    @abstractmethod
    def open_target(self, target: Connection) -> Session:
        """The session the link produces on."""

    def close_target(self) -> None:
        """Close the target session (before its connection goes back to a pool)."""
        if self.target_session is not None and self.target_session is not self.source_session:
            _close(self.target_session)
        self.target_session = None

    def begin(self) -> None:
        """A unit of work starts (before the receive that opens it)."""

    def idle(self) -> None:
        """The open unit ended without a message (nothing to complete)."""

    @abstractmethod
    def complete(self) -> bool:
        """Make everything handled since the last completion final: True when it is now;
        False when it is handed over and becomes final behind the link (outcomes())."""

    def outcomes(self, wait: bool = False) -> list[Outcome]:
        """How the units handed over by complete() ended, in order (taken); ``wait``: of
        all of them."""
        return []

    def slides(self) -> bool:
        """Whether complete_oldest() can work on these sessions."""
        return False

    def complete_oldest(self, count: int) -> bool:
        """Make only the ``count`` oldest messages of the unit final (the others stay in
        it); False when this cannot be done (nothing happened)."""
        return False

    def all_or_nothing(self, error: BaseException) -> bool:
        """Whether a completion that failed with ``error`` left the unit all undone (its
        messages come back from the source) or possibly all done, never half: then none
        of its messages goes to the DMQ. Else it is the chapter's acknowledge or commit
        failure."""
        return False

    def reset(self) -> None:
        """The link has handled a failed outcome: later units complete again."""

    @abstractmethod
    def abort(self) -> None:
        """Undo what was not completed: those messages come back from the source."""

    def close(self) -> None:
        self.close_target()
        if self.source_session is not None:
            _close(self.source_session)
        self.source_session = None


def _close(session: Session) -> None:
    try:
        session.close()
    except Exception:  # the connection may already be gone
        pass


class ClientAcknowledge(TransferTransaction):
    """Non-transacted link: CLIENT_ACKNOWLEDGE after the send (at-least-once)."""

    transacted = False
    completion_stage = Stage.ACKNOWLEDGE
    failure_reason = DMQReason.ACK_FAILURE

    def open_source(self, source: Connection) -> Session:
        self.source_session = source.create_session(False, AckMode.CLIENT_ACKNOWLEDGE)
        return self.source_session

    def open_target(self, target: Connection) -> Session:
        self.target_session = target.create_session(False, AckMode.AUTO_ACKNOWLEDGE)
        return self.target_session

    def complete(self) -> bool:
        assert self.source_session is not None
        self.source_session.acknowledge()
        return True

    def slides(self) -> bool:
        return self.source_session is not None and self.source_session.acknowledges_oldest

    def complete_oldest(self, count: int) -> bool:
        """Acknowledge the ``count`` oldest messages of the unit only; False when the
        source's provider cannot (then the unit completes as a whole)."""
        assert self.source_session is not None
        return self.source_session.acknowledge_oldest(count)

    def abort(self) -> None:
        if self.source_session is not None:
            self.source_session.recover()


class XATransaction(TransferTransaction):
    """Transacted link: each unit of work is one XA transaction of the bridge's coordinator,
    the source and target sessions' XA resources enlisted (once-and-only-once)."""

    transacted = True
    xa = True
    kind = "XA"
    completion_stage = Stage.COMMIT
    failure_reason = DMQReason.COMMIT_FAILURE
    # bound per link by bind(): the link calls its transaction class without arguments
    coordinator: ClassVar[Coordinator]
    recovery: ClassVar[Recovery]
    unresolved: ClassVar[set[bytes]]  # the link's transactions left in doubt (across reconnects)
    source_rm: ClassVar[str]
    target_rm: ClassVar[str]
    source_ref: ClassVar[str]
    target_ref: ClassVar[str]

    @classmethod
    def bind(cls, xa: BridgeTransactions, source_ref: str, target_ref: str) -> type[XATransaction]:
        """This class for one link: its coordinator and the RMs of its two ends."""
        return type(
            cls.__name__,
            (cls,),
            {
                "coordinator": xa.coordinator,
                "recovery": xa.recovery,
                "unresolved": set(),
                "source_ref": source_ref,
                "target_ref": target_ref,
                "source_rm": xa.rm_name(source_ref),
                "target_rm": xa.rm_name(target_ref),
            },
        )

    def __init__(self) -> None:
        self.tx: Transaction | None = None  # the open unit's transaction, between begin()
        self._source: XAResource | None = None  # and complete(), abort() or idle()
        self._target: XAResource | None = None
        self.completer = Completer(self.coordinator, f"{self.source_ref}->{self.target_ref}")

    def open_source(self, source: Connection) -> Session:
        self.settle_in_doubt()
        session = _xa_session(source, self.source_ref)
        self.source_session, self._source = session, session.xa_resource
        return session

    def open_target(self, target: Connection) -> Session:
        session = _xa_session(target, self.target_ref)
        self.target_session, self._target = session, session.xa_resource
        if self.tx is not None:  # a target (re)opened within a unit joins its transaction
            _enlist(self.tx, self._target, self.target_rm, self.target_ref)
        return session

    def close_target(self) -> None:
        # only between units, or within one before anything was sent (a pooled target
        # going back while the link is idle): the target did no work in a transaction
        if self._target is not None and self.tx is not None and self.tx.state is TxState.ACTIVE:
            try:
                self.tx.release(self._target)
            except Exception:
                pass  # an empty branch: the RM drops it with the session
        self._target = None
        super().close_target()

    def begin(self) -> None:
        """A new transaction, the link's sessions enlisted, before the unit's first receive
        (an XA session outside a transaction would acknowledge what it receives)."""
        self.settle_in_doubt()
        tx = self.coordinator.begin()
        try:
            assert self._source is not None
            _enlist(tx, self._source, self.source_rm, self.source_ref)
            if self._target is not None:
                _enlist(tx, self._target, self.target_rm, self.target_ref)
        except BaseException:
            tx.rollback()
            raise
        self.tx = tx

    def complete(self) -> bool:
        """Commit (two phases, or one); when this raises the transaction is rolled back.
        A two-phase commit of in-process RMs is finished by the completer (False)."""
        tx, self.tx = self.tx, None
        assert tx is not None
        try:
            return tx.commit(defer=self.completer)
        except TxLogUnavailable as exc:  # rolled back; the log's database is back later
            raise _log_lost(exc) from exc
        finally:
            if tx.state is TxState.IN_DOUBT:
                self.unresolved.add(tx.gtrid)

    def settle_in_doubt(self) -> None:
        """Before the link moves new messages: its transactions a commit phase left in
        doubt are committed first (a recovery pass now, not at its next retry), so the
        target gets them in order; TransportException while an RM or the XA log's database
        still cannot be reached (the link stays STARTING and tries again when it
        reconnects)."""
        if not self.unresolved:
            return
        live = self.coordinator.txlog.live()
        self.unresolved.intersection_update(live)
        if self.unresolved:
            try:
                self.recovery.run_pass()
            except TxLogUnavailable as exc:  # the log's database is down: not a link bug
                raise TransportException(f"recovery cannot write the transaction log: {exc}") from exc
            reports = {r.rm: r for r in self.recovery.last}
            for gtrid in list(self.unresolved):
                record = live[gtrid]
                if all(_finished_at(reports.get(p.rm), gtrid) for p in record.participants):
                    self.unresolved.discard(gtrid)
        if self.unresolved:
            names = ", ".join(sorted(g.decode(errors="replace") for g in self.unresolved))
            raise TransportException(
                f"transaction(s) {names} of this link decided to commit "
                "but not yet committed at every resource manager; new "
                "messages wait until recovery has committed them"
            )

    def outcomes(self, wait: bool = False) -> list[Outcome]:
        """The completer's outcomes; one whose commit decision could not be logged because
        the log's database is down was rolled back (presumed abort) and is a lost
        connection to the link (it reconnects with backoff), as in complete()."""
        return [
            Outcome(_log_lost(o.error), o.behind) if isinstance(o.error, TxLogUnavailable) else o
            for o in self.completer.outcomes(wait)
        ]

    def reset(self) -> None:
        self.completer.reset()

    def all_or_nothing(self, error: BaseException) -> bool:
        """A failure before the commit decision (ending, a prepare voting no or failing, a
        rollback-only branch, a one-phase commit the RM rolled back, an RM lost meanwhile)
        rolled every branch back; a one-phase commit whose answer was lost did all or
        nothing. Only a failed commit phase (HeuristicMixedException: some branch did not
        commit) is the chapter's commit failure."""
        return isinstance(error, (TransactionRolledBackException, TransportException))

    def abort(self) -> None:
        tx, self.tx = self.tx, None
        if tx is not None:
            tx.rollback()

    def idle(self) -> None:
        """The unit ended without a message: its empty transaction goes."""
        self.abort()

    def close(self) -> None:
        try:
            self.abort()
        except Exception:
            pass  # unprepared branches: the RMs drop them with the sessions
        self.completer.close()  # what was handed over completes before the sessions go
        super().close()


class LocalTransaction(TransferTransaction):
    """Transacted link between two ends that are one resource manager: each unit is one
    local transaction of one transacted session, the consumer's and the producer's
    (once-and-only-once, one commit round trip)."""

    transacted = True
    kind = "local transaction (one resource manager)"
    completion_stage = Stage.COMMIT
    failure_reason = DMQReason.COMMIT_FAILURE

    def open_source(self, source: Connection) -> Session:
        self.source_session = source.create_session(True, AckMode.SESSION_TRANSACTED)
        return self.source_session

    def open_target(self, target: Connection) -> Session:
        """The source's session: its sends are in the unit's transaction."""
        assert self.source_session is not None
        self.target_session = self.source_session
        return self.source_session

    def complete(self) -> bool:
        assert self.source_session is not None
        self.source_session.commit()
        return True

    def all_or_nothing(self, error: BaseException) -> bool:
        """One resource manager commits a local transaction as a whole or not at all."""
        return True

    def abort(self) -> None:
        if self.source_session is not None:
            self.source_session.rollback()


def one_resource_manager(
    source: ConnectionFactoryConfig, target: ConnectionFactoryConfig, target_clientid: str | None
) -> bool:
    """Whether a link's two connection-factory elements reach one resource manager as one
    user: the same JNDI lookup with the same environment and credentials (a broker's
    factory; not the host broker's or an address list's, which may name several brokers),
    and no target clientid that the source's connection would not carry."""
    return (
        source.lookup_name is not None
        and not source.multi_rm
        and not target.multi_rm
        and target_clientid is None
        and (source.lookup_name, source.environment, source.username, source.password)
        == (target.lookup_name, target.environment, target.username, target.password)
    )


def _log_lost(exc: TxLogUnavailable) -> TransportException:
    error = TransportException(f"transaction rolled back: {exc}")
    error.__cause__ = exc
    return error


def _finished_at(report: Report | None, gtrid: bytes) -> bool:
    """The last recovery pass asked this RM and left no branch of ``gtrid`` there."""
    return (
        report is not None
        and report.error is None
        and all(xid.gtrid != gtrid for xid, _why in report.failed)
        and all(xid.gtrid != gtrid for xid in report.in_flight)
    )


def _xa_session(connection: Connection, ref: str) -> XASession:
    if not isinstance(connection, XAConnection):
        raise TransactedLinkUnsupported(
            f"connection-factory {ref} gave a {type(connection).__name__}, which has no XA "
            "sessions; a transacted link needs XA connections"
        )
    return connection.create_xa_session()


def _enlist(tx: Transaction, resource: XAResource, rm: str, ref: str) -> None:
    """Enlist; an RM that cannot be reached is a lost connection to the link."""
    try:
        tx.enlist(resource, rm, ref)
    except XAException as exc:
        if unreachable(exc):
            raise TransportException(f"connection-factory {ref}: XA start failed: {exc}") from exc
        raise


class TransactedLinkUnsupported(Exception):
    """A transacted link that cannot run (its factories are not XA-capable)."""


def transaction_for(
    transacted: bool,
    source: ConnectionFactory,
    target: ConnectionFactory,
    xa: BridgeTransactions | None = None,
    source_ref: str = "",
    target_ref: str = "",
    local: bool = False,
) -> type[TransferTransaction]:
    """The transaction class a link runs with; TransactedLinkUnsupported when none fits.
    ``local``: the ends are one resource manager and local transactions are allowed."""
    if not transacted:
        return ClientAcknowledge
    not_xa = [ref for ref, f in ((source_ref, source), (target_ref, target)) if not is_xa_capable(f)]
    if not_xa:
        raise TransactedLinkUnsupported(
            f"connection-factory {' and '.join(dict.fromkeys(not_xa))} is not an "
            "XAConnectionFactory; a transacted link needs XA connection factories at both "
            'ends (the chapter). Set transacted="false" for at-least-once transfer'
        )
    if local and source.local_transactions:
        return LocalTransaction
    if xa is None:
        raise TransactedLinkUnsupported("the bridge has no XA coordinator running")
    return XATransaction.bind(xa, source_ref, target_ref)
