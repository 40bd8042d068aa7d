"""The built-in XA transaction coordinator of a JMS bridge: Xids, 2PC, branch states.

A Coordinator belongs to one JMS bridge; begin() gives a Transaction with a fresh gtrid of
our Xid format, one branch per resource manager, which end() and commit() complete: one
branch commits in one phase, two or more are prepared, the CommitRecord is logged and they
are committed (or handed to the link's Completer). Branch and transaction states change
only through BRANCH_TRANSITIONS and TX_TRANSITIONS.

Rules: presumed abort: nothing but the commit decision is ever logged, so recovery rolls
back every in-doubt branch without a live CommitRecord; a failure before the decision is a
TransactionRolledBackException (nothing committed), after it a HeuristicMixedException.

Design notes: docs/jms-bridges.md#internals-xacoordinatorpy.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, TypeVar

from ..jms import xa
from ..jms.errors import (
    HeuristicMixedException,
    IllegalStateException,
    JMSException,
    TransactionRolledBackException,
    TransportException,
    XAException,
)
from ..jms.spi import XAResource
from ..jms.xa import Xid
from .txlog import CommitRecord, Participant, TxLog, TxLogError

if TYPE_CHECKING:
    from .completer import Completer

log = logging.getLogger(__name__)

FORMAT_ID = 0x494D5142  # "IMQB"
TAG_MAX = 32  # bytes of the bridge name kept in a gtrid
FAULT_ENV = "IMQBRIDGE_XA_FAULT"
FORGET_BATCH = 256  # finished transactions forgotten at the latest after this many
POOL_THREADS = 8  # prepares and commits of remote RMs' second and further branches
T = TypeVar("T")
Item = TypeVar("Item")


# --- our Xid format ---------------------------------------------------------------------------------


def name_tag(name: str, limit: int = TAG_MAX) -> bytes:
    """``name`` as bytes of at most ``limit``: itself, or a prefix and a hash of the rest."""
    raw = name.encode("utf-8")
    if len(raw) <= limit:
        return raw
    digest = hashlib.sha256(raw).hexdigest()[:8].encode()
    return raw[: limit - 9] + b"~" + digest


def make_gtrid(tag: bytes, boot: bytes, seq: int) -> bytes:
    return tag + b"|" + boot + b"." + format(seq, "x").encode()


def gtrid_owner(gtrid: bytes) -> tuple[bytes, bytes] | None:
    """(bridge tag, boot id) of one of our gtrids; None for anything else."""
    tag, bar, rest = gtrid.partition(b"|")
    boot, dot, seq = rest.partition(b".")
    if not (bar and dot and tag and boot and seq):
        return None
    return tag, boot


def is_ours(xid: Xid, tag: bytes) -> bool:
    """An Xid this bridge's coordinator made (in any run)."""
    owner = gtrid_owner(xid.gtrid) if xid.format_id == FORMAT_ID else None
    return owner is not None and owner[0] == tag


def branch_qualifier(rm_tag: str, number: int) -> bytes:
    suffix = b"#" + str(number).encode()
    return name_tag(rm_tag, xa.MAXBQUALSIZE - len(suffix)) + suffix


# --- state tables ----------------------------------------------------------------------------------


class BranchState(str, Enum):
    ACTIVE = "ACTIVE"  # associated with one or more resources
    ENDED = "ENDED"  # every association ended with TMSUCCESS
    ROLLBACK_ONLY = "ROLLBACK_ONLY"  # an association ended with TMFAIL or failed to end
    PREPARED = "PREPARED"  # voted yes: durable and in doubt at the RM
    READ_ONLY = "READ_ONLY"  # voted read-only: finished, nothing to commit
    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"
    IN_DOUBT = "IN_DOUBT"  # commit decided, the RM unreachable: recovery's now


class BranchEvent(str, Enum):
    JOIN = "join"
    END = "end"
    FAIL = "fail"
    VOTE_OK = "vote ok"
    VOTE_READ_ONLY = "vote read-only"
    VOTE_ROLLBACK = "vote rollback"
    COMMIT_ONE_PHASE = "commit one-phase"
    COMMIT = "commit"
    ROLLBACK = "rollback"
    UNREACHABLE = "unreachable"


_B, _BE = BranchState, BranchEvent
BRANCH_TRANSITIONS: Mapping[BranchState, Mapping[BranchEvent, BranchState]] = {
    _B.ACTIVE: {_BE.JOIN: _B.ACTIVE, _BE.END: _B.ENDED, _BE.FAIL: _B.ROLLBACK_ONLY, _BE.ROLLBACK: _B.ROLLED_BACK},
    _B.ENDED: {
        _BE.JOIN: _B.ACTIVE,
        _BE.VOTE_OK: _B.PREPARED,
        _BE.VOTE_READ_ONLY: _B.READ_ONLY,
        _BE.VOTE_ROLLBACK: _B.ROLLED_BACK,
        _BE.COMMIT_ONE_PHASE: _B.COMMITTED,
        _BE.ROLLBACK: _B.ROLLED_BACK,
    },
    _B.ROLLBACK_ONLY: {_BE.FAIL: _B.ROLLBACK_ONLY, _BE.END: _B.ROLLBACK_ONLY, _BE.ROLLBACK: _B.ROLLED_BACK},
    _B.PREPARED: {_BE.COMMIT: _B.COMMITTED, _BE.ROLLBACK: _B.ROLLED_BACK, _BE.UNREACHABLE: _B.IN_DOUBT},
}


class TxState(str, Enum):
    ACTIVE = "ACTIVE"  # resources enlist, messages move
    ENDED = "ENDED"  # every association ended: ready to complete
    PREPARING = "PREPARING"
    COMMITTING = "COMMITTING"  # decided (logged if it had to be)
    COMMITTED = "COMMITTED"
    ROLLING_BACK = "ROLLING_BACK"
    ROLLED_BACK = "ROLLED_BACK"
    IN_DOUBT = "IN_DOUBT"  # decided commit, a branch unreachable: recovery finishes
    UNKNOWN = "UNKNOWN"  # a one-phase commit's answer was lost: all or nothing


class TxEvent(str, Enum):
    ENLIST = "enlist"
    END = "end"
    PREPARE = "prepare"
    DECIDE = "decide commit"
    COMMITTED = "committed"
    ROLLBACK = "roll back"
    ROLLED_BACK = "rolled back"
    UNREACHABLE = "unreachable"
    LOST = "lose the answer"


_T, _TE = TxState, TxEvent
TX_TRANSITIONS: Mapping[TxState, Mapping[TxEvent, TxState]] = {
    _T.ACTIVE: {_TE.ENLIST: _T.ACTIVE, _TE.END: _T.ENDED, _TE.ROLLBACK: _T.ROLLING_BACK},
    _T.ENDED: {_TE.PREPARE: _T.PREPARING, _TE.DECIDE: _T.COMMITTING, _TE.ROLLBACK: _T.ROLLING_BACK},
    _T.PREPARING: {_TE.DECIDE: _T.COMMITTING, _TE.ROLLBACK: _T.ROLLING_BACK},
    _T.COMMITTING: {
        _TE.COMMITTED: _T.COMMITTED,
        _TE.ROLLED_BACK: _T.ROLLED_BACK,
        _TE.UNREACHABLE: _T.IN_DOUBT,
        _TE.LOST: _T.UNKNOWN,
    },
    _T.ROLLING_BACK: {_TE.ROLLED_BACK: _T.ROLLED_BACK},
}
FINISHED = frozenset({TxState.COMMITTED, TxState.ROLLED_BACK, TxState.IN_DOUBT, TxState.UNKNOWN})


def rolled_back(exc: BaseException) -> bool:
    """An XA error saying the RM rolled the branch back (XA_RB*)."""
    return isinstance(exc, XAException) and xa.XA_RBROLLBACK <= exc.errorcode <= 107


def unreachable(exc: BaseException) -> bool:
    """A failure to reach the RM (the outcome of the call is unknown)."""
    return isinstance(exc, TransportException) or (isinstance(exc, XAException) and exc.errorcode == xa.XAER_RMFAIL)


# --- the fault hook (tests) --------------------------------------------------------------------------


class FaultPoint(str, Enum):
    PREPARED = "prepared"  # every branch prepared, the decision not logged
    LOGGED = "logged"  # after the commit record, before any commit
    COMMITTED_ONE = "committed-one"  # after the first commit of a logged transaction


@dataclass(frozen=True)
class Fault:
    action: str  # kill | pause | hold
    argument: float  # kill: probability; pause: seconds
    path: str = ""  # hold: wait while this file exists (creating <path>.held first)


class Faults:
    """IMQBRIDGE_XA_FAULT="point:action[:argument],...": lets crash tests stop the process
    exactly between two protocol steps (kill: SIGKILL, with a probability) or hold it
    there (pause: seconds; hold: while the file named by the argument exists, which a
    test creates, waits for <file>.held, does its damage and removes)."""

    def __init__(self, spec: str = "") -> None:
        self.faults: dict[FaultPoint, Fault] = {}
        for item in filter(None, (i.strip() for i in spec.split(","))):
            point, action, *arg = item.split(":")
            if action not in ("kill", "pause", "hold"):
                raise ValueError(f"{FAULT_ENV}: unknown action {action!r} in {item!r}")
            if action == "hold":
                self.faults[FaultPoint(point)] = Fault(action, 0.0, ":".join(arg))
            else:
                self.faults[FaultPoint(point)] = Fault(action, float(arg[0]) if arg else 1.0)

    @classmethod
    def from_env(cls) -> Faults:
        return cls(os.environ.get(FAULT_ENV, ""))

    def hit(self, point: FaultPoint) -> None:
        fault = self.faults.get(point)
        if fault is None:
            return
        if fault.action == "pause":
            time.sleep(fault.argument)
        elif fault.action == "hold":
            if os.path.exists(fault.path):
                with open(fault.path + ".held", "w"):
                    pass
            while os.path.exists(fault.path):
                time.sleep(0.02)
        elif random.random() < fault.argument:
            os.kill(os.getpid(), signal.SIGKILL)


# --- branches and transactions ----------------------------------------------------------------------


@dataclass(eq=False)
class Branch:
    """One branch of a transaction: its Xid, resource manager, and who is associated."""

    xid: Xid
    rm: str
    resource: XAResource  # completes the branch (prepare/commit/rollback)
    associated: list[XAResource] = field(default_factory=list)
    state: BranchState = BranchState.ACTIVE

    def fire(self, event: BranchEvent) -> None:
        new = BRANCH_TRANSITIONS.get(self.state, {}).get(event)
        if new is None:
            raise IllegalStateException(
                f"branch {self.xid} of {self.rm}: cannot {event.value} while {self.state.value}"
            )
        self.state = new


class Transaction:
    """One global transaction; used by one link thread at a time."""

    def __init__(self, coordinator: Coordinator, gtrid: bytes) -> None:
        self.coordinator = coordinator
        self.gtrid = gtrid
        self.state = TxState.ACTIVE
        self.branches: list[Branch] = []
        self.logged = False
        # commit_logged's waits, when the caller (a Completer) waits for a group at once
        self.durable: list[Callable[[], None]] | None = None

    def __repr__(self) -> str:
        return f"Transaction({self.gtrid!r}, {self.state.value}, {len(self.branches)} branch(es))"

    def _fire(self, event: TxEvent) -> None:
        new = TX_TRANSITIONS.get(self.state, {}).get(event)
        if new is None:
            raise IllegalStateException(
                f"transaction {self.gtrid.decode(errors='replace')}: cannot {event.value} while {self.state.value}"
            )
        self.state = new
        if new in FINISHED:
            self.coordinator._finished(self)

    # --- enlisting ------------------------------------------------------------------------------
    def enlist(self, resource: XAResource, rm: str, rm_tag: str | None = None) -> Branch:
        """Associate ``resource`` (of resource manager ``rm``): it joins a branch of the same
        RM, or starts a new branch; its work belongs to this transaction from now on."""
        self._fire(TxEvent.ENLIST)
        for branch in self.branches:
            if branch.state in (BranchState.ACTIVE, BranchState.ENDED) and _same_rm(branch, resource):
                try:
                    resource.start(branch.xid, xa.TMJOIN)
                except XAException:
                    break  # this RM does not join: a branch of its own then
                branch.fire(BranchEvent.JOIN)
                branch.associated.append(resource)
                return branch
        xid = Xid(FORMAT_ID, self.gtrid, branch_qualifier(rm_tag or rm, len(self.branches) + 1))
        resource.start(xid, xa.TMNOFLAGS)
        branch = Branch(xid, rm, resource, [resource])
        self.branches.append(branch)
        return branch

    def release(self, resource: XAResource) -> None:
        """``resource`` leaves the transaction having done no work in it (a pooled target
        going back while the link is idle): its association ends, and a branch of its own
        is rolled back (it is empty) and dropped."""
        for branch in self.branches:
            if resource not in branch.associated:
                continue
            branch.associated.remove(resource)
            resource.end(branch.xid, xa.TMSUCCESS)
            if branch.associated:
                if branch.resource is resource:  # the others complete it from now on
                    branch.resource = branch.associated[0]
                return
            if branch.state is BranchState.ACTIVE:
                branch.fire(BranchEvent.END)
            if branch.resource is resource:  # a branch of its own, empty: drop it
                self.branches.remove(branch)
                try:
                    resource.rollback(branch.xid)
                except XAException as exc:
                    if exc.errorcode != xa.XAER_NOTA:
                        raise
            return

    # --- completion --------------------------------------------------------------------------------
    def end(self) -> None:
        """End every association (TMSUCCESS); on a failure roll everything back and raise."""
        failure: BaseException | None = None
        associations = [(branch, resource) for branch in self.branches for resource in branch.associated]
        ended = self.coordinator.fan_out(
            associations, lambda a: a[1].end(a[0].xid, xa.TMSUCCESS), lambda a: a[1].in_process
        )
        for (branch, resource), _, exc in ended:
            branch.associated.remove(resource)
            if exc is not None:
                failure = failure or exc
                if branch.state is BranchState.ACTIVE:
                    branch.fire(BranchEvent.FAIL)
        for branch in self.branches:
            if branch.state is BranchState.ACTIVE:
                branch.fire(BranchEvent.END)
        if failure is not None:
            self._fire(TxEvent.ROLLBACK)
            self._rollback_all()
            raise _failure("ending", self, failure)
        self._fire(TxEvent.END)

    def commit(self, defer: Completer | None = None) -> bool:
        """Commit an ended transaction (see the module comment); raises after rolling back.
        With ``defer``, a two-phase transaction of in-process RMs is handed to that
        completer once prepared (False: its outcome comes from there); True: complete."""
        if self.state not in (TxState.ACTIVE, TxState.ENDED):
            raise IllegalStateException(f"transaction {self._name}: cannot commit while {self.state.value}")
        if self.state is TxState.ACTIVE:
            self.end()
        live = [b for b in self.branches if b.state is BranchState.ENDED]
        if len(live) != len(self.branches):  # a branch failed to end: cannot commit
            self._fire(TxEvent.ROLLBACK)
            self._rollback_all()
            raise TransactionRolledBackException(f"transaction {self._name}: a branch is rollback-only; rolled back")
        if len(live) <= 1:
            self._commit_one_phase(live)
            return True
        self._fire(TxEvent.PREPARE)
        prepared = self._prepare(live)
        self.coordinator.faults.hit(FaultPoint.PREPARED)
        if defer is not None and len(prepared) >= 2 and all(b.resource.in_process for b in prepared):
            defer.submit(self, prepared)
            return False
        if len(prepared) >= 2:
            self._log_decision(prepared)
        self.decided(prepared, self.logged)
        return True

    def commit_record(self, prepared: list[Branch]) -> CommitRecord:
        return CommitRecord(self.gtrid, tuple(Participant(b.rm, b.xid) for b in prepared))

    def decided(self, prepared: list[Branch], logged: bool) -> None:
        """The commit phase, once the decision is made (logged when it had to be)."""
        self.logged = logged
        self._fire(TxEvent.DECIDE)
        if logged:
            self.coordinator.faults.hit(FaultPoint.LOGGED)
        self._commit_prepared(prepared)

    def undecided(self) -> None:
        """Prepared, but the decision could not be logged: presumed abort, roll back."""
        self._fire(TxEvent.ROLLBACK)
        self._rollback_all()

    def _commit_one_phase(self, live: list[Branch]) -> None:
        self._fire(TxEvent.DECIDE)
        if not live:
            self._fire(TxEvent.COMMITTED)
            return
        branch = live[0]
        try:
            branch.resource.commit(branch.xid, True)
        except Exception as exc:
            if rolled_back(exc):
                branch.fire(BranchEvent.ROLLBACK)
                self._fire(TxEvent.ROLLED_BACK)
                raise TransactionRolledBackException(
                    f"transaction {self._name}: {branch.rm} rolled the one-phase commit back: {exc}"
                ) from exc
            # The outcome is the RM's; with one branch it is all or nothing, never half.
            self._fire(TxEvent.LOST)
            raise _failure("one-phase commit", self, exc) from exc
        branch.fire(BranchEvent.COMMIT_ONE_PHASE)
        self._fire(TxEvent.COMMITTED)

    def _prepare(self, live: list[Branch]) -> list[Branch]:
        """Every branch prepares (see Coordinator.each); any "no" or failure rolls all back."""
        prepared: list[Branch] = []
        failed: tuple[Branch, BaseException] | None = None
        for branch, vote, exc in self.coordinator.each(live, lambda b: b.resource.prepare(b.xid)):
            if exc is not None:
                if rolled_back(exc):
                    branch.fire(BranchEvent.VOTE_ROLLBACK)
                # else the vote is unknown: the branch stays ENDED and is rolled back below
                failed = failed or (branch, exc)
            elif vote == xa.XA_RDONLY:
                branch.fire(BranchEvent.VOTE_READ_ONLY)
            else:
                branch.fire(BranchEvent.VOTE_OK)
                prepared.append(branch)
        if failed is not None:
            self._fire(TxEvent.ROLLBACK)
            self._rollback_all()
            raise _failure(f"prepare of {failed[0].rm}", self, failed[1])
        return prepared

    def _log_decision(self, prepared: list[Branch]) -> None:
        try:
            self.coordinator.log_commits([self.commit_record(prepared)])
        except BaseException:
            self.undecided()  # nothing decided: presumed abort holds
            raise
        self.logged = True

    def _commit_prepared(self, prepared: list[Branch]) -> None:
        heuristic: list[str] = []
        in_doubt: list[Branch] = []

        def commit(branch: Branch) -> None:
            if self.durable is not None and self.logged:
                self.durable.append(branch.resource.commit_logged(branch.xid))
            else:
                branch.resource.commit(branch.xid, False)
            if branch is prepared[0] and self.logged:  # the others may be committing now
                self.coordinator.faults.hit(FaultPoint.COMMITTED_ONE)

        for branch, _, exc in self.coordinator.each(prepared, commit):
            if exc is not None:
                code = exc.errorcode if isinstance(exc, XAException) else None
                if code in (xa.XAER_NOTA, xa.XA_HEURCOM):
                    branch.fire(BranchEvent.COMMIT)  # already committed (or forgotten)
                elif code in (xa.XA_HEURRB, xa.XA_HEURMIX) or rolled_back(exc):
                    heuristic.append(f"{branch.rm}: {exc}")
                    branch.fire(BranchEvent.ROLLBACK)
                    if not rolled_back(exc):
                        _forget(branch)
                else:  # unreachable, or an answer we cannot read: still prepared, maybe
                    log.warning("transaction %s: commit at %s failed: %s", self._name, branch.rm, exc)
                    branch.fire(BranchEvent.UNREACHABLE)
                    in_doubt.append(branch)
            else:
                branch.fire(BranchEvent.COMMIT)
        if in_doubt:
            self._fire(TxEvent.UNREACHABLE)
            log.warning(
                "transaction %s: decided to commit, but %s did not confirm; recovery retries",
                self._name,
                ", ".join(b.rm for b in in_doubt),
            )
            self.coordinator.in_doubt(self, [b.rm for b in in_doubt])
        else:
            self._fire(TxEvent.COMMITTED)
        if heuristic:
            raise HeuristicMixedException(
                f"transaction {self._name}: some branches did not commit: {'; '.join(heuristic)}"
            )

    def rollback(self) -> None:
        """Roll back (from ACTIVE or ENDED): the messages consumed come back to the source.
        Failures are logged, not raised: an unprepared branch is the RM's to drop."""
        if self.state in FINISHED:
            return
        self._fire(TxEvent.ROLLBACK)
        self._rollback_all()

    def _rollback_all(self) -> None:
        unconfirmed: list[str] = []  # RMs that may still hold a prepared branch
        for branch in self.branches:
            for resource in list(branch.associated):
                try:
                    # TMSUCCESS, not TMFAIL: the rollback follows anyway, and some RMs refuse
                    # to end a second association of a branch another one failed
                    resource.end(branch.xid, xa.TMSUCCESS)
                except Exception:
                    pass  # ending rolled it back, or the session is gone
                branch.associated.remove(resource)
                if branch.state is BranchState.ACTIVE:
                    branch.fire(BranchEvent.FAIL)
            if branch.state in (BranchState.ENDED, BranchState.ROLLBACK_ONLY, BranchState.PREPARED, BranchState.ACTIVE):
                try:
                    branch.resource.rollback(branch.xid)
                except Exception as exc:
                    if not (isinstance(exc, XAException) and (exc.errorcode == xa.XAER_NOTA or rolled_back(exc))):
                        # prepared, or a prepare whose answer was lost: recovery's to roll back
                        log.warning(
                            "transaction %s: rolling back %s failed: %s; recovery rolls it back",
                            self._name,
                            branch.rm,
                            exc,
                        )
                        unconfirmed.append(branch.rm)
                branch.fire(BranchEvent.ROLLBACK)
        if self.state is TxState.ROLLING_BACK:
            self._fire(TxEvent.ROLLED_BACK)
        if unconfirmed:  # a pass soon, not at the next start (presumed abort: no record)
            self.coordinator.in_doubt(self, unconfirmed)

    @property
    def _name(self) -> str:
        return self.gtrid.decode(errors="replace")


def _same_rm(branch: Branch, resource: XAResource) -> bool:
    try:
        return branch.resource.is_same_rm(resource)
    except Exception:
        return False


def _attempt(call: Callable[[Item], T], item: Item) -> tuple[T | None, BaseException | None]:
    try:
        return call(item), None
    except Exception as exc:
        return None, exc


def _forget(branch: Branch) -> None:
    try:
        branch.resource.forget(branch.xid)
    except Exception as exc:
        log.warning("forgetting the heuristic outcome of %s at %s failed: %s", branch.xid, branch.rm, exc)


def _failure(what: str, tx: Transaction, exc: BaseException) -> JMSException:
    """What a link sees: a TransportException when an RM was unreachable (it reconnects),
    else a TransactionRolledBackException (rolled back before any commit: the messages come
    back, the link backs them out; not the chapter's commit failure)."""
    text = f"transaction {tx._name}: {what} failed ({type(exc).__name__}: {exc}); rolled back"
    error: JMSException = TransportException(text) if unreachable(exc) else TransactionRolledBackException(text)
    error.__cause__ = exc
    return error


# --- the coordinator ------------------------------------------------------------------------------------


class Coordinator:
    """The XA transaction coordinator of one bridge: Xids, the log, transactions in flight."""

    def __init__(self, bridge: str, txlog: TxLog, faults: Faults | None = None) -> None:
        self.bridge = bridge
        self.tag = name_tag(bridge)
        self.boot = os.urandom(8).hex().encode()
        self.txlog = txlog
        self.faults = faults if faults is not None else Faults.from_env()
        self._seq = itertools.count(1)
        self._lock = threading.Lock()
        self._in_flight: set[bytes] = set()
        self._forget: list[bytes] = []
        self.on_in_doubt: Callable[[list[str]], None] | None = None  # recovery's retry
        self._pool: ThreadPoolExecutor | None = None
        self.counts = dict.fromkeys(["committed", "rolled_back", "in_doubt", "unknown", "logged"], 0)

    def begin(self) -> Transaction:
        gtrid = make_gtrid(self.tag, self.boot, next(self._seq))
        with self._lock:
            self._in_flight.add(gtrid)
        return Transaction(self, gtrid)

    def each(
        self, branches: list[Branch], call: Callable[[Branch], T]
    ) -> list[tuple[Branch, T | None, BaseException | None]]:
        """``call`` for every branch: (branch, result, error) in order (see fan_out)."""
        return self.fan_out(branches, call, lambda b: b.resource.in_process)

    def fan_out(
        self, items: list[Item], call: Callable[[Item], T], in_process: Callable[[Item], bool]
    ) -> list[tuple[Item, T | None, BaseException | None]]:
        """``call`` for every item (a branch, or a resource's association with one):
        (item, result, error) in order. Items of remote resource managers after the first
        run at the same time in the coordinator's pool (each RM its own machine, each
        association its own connection: the round trips overlap); the first and every
        in-process one run in this thread (a hand-off to the pool would cost more than the
        call). Each resource is still used by one thread at a time: the link's thread
        waits here."""
        remote = [i for i in items[1:] if not in_process(i)]
        pool = self._pool
        if remote and pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(POOL_THREADS, f"xa {self.bridge}")
                pool = self._pool
        futures = {id(i): pool.submit(_attempt, call, i) for i in remote} if remote and pool is not None else {}
        here = {id(i): _attempt(call, i) for i in items if id(i) not in futures}
        return [(i, *(here[id(i)] if id(i) in here else futures[id(i)].result())) for i in items]

    def in_flight(self, gtrid: bytes) -> bool:
        """Recovery leaves a transaction alone while a link is still completing it."""
        with self._lock:
            return gtrid in self._in_flight

    def is_ours(self, xid: Xid) -> bool:
        return is_ours(xid, self.tag)

    def log_commits(self, records: list[CommitRecord]) -> None:
        """Log commit decisions (one write, one sync), with the forgets pending."""
        with self._lock:
            forget, self._forget = self._forget, []
        try:
            self.txlog.log_commits(records, forget)
        except BaseException:
            with self._lock:
                self._forget[:0] = forget
            raise
        with self._lock:
            self.counts["logged"] += len(records)

    def forget(self, gtrids: Iterable[bytes]) -> None:
        """Finished transactions whose commit records may go (written with the next one)."""
        with self._lock:
            self._forget.extend(gtrids)
            if len(self._forget) < FORGET_BATCH:
                return
            forget, self._forget = self._forget, []
        self._log_done(forget)

    def flush(self) -> None:
        """Write pending forgets (at stop)."""
        with self._lock:
            forget, self._forget = self._forget, []
        self._log_done(forget)

    def _log_done(self, forget: list[bytes]) -> None:
        """Forgetting is never urgent: a record left live only makes recovery find its
        transaction finished and forget it then. So a log that cannot be written now (its
        database down) keeps them pending for the next write instead of failing whoever
        finished a transaction (a link's commit, the completer's thread)."""
        try:
            self.txlog.log_done(forget)
        except TxLogError as exc:
            with self._lock:
                self._forget[:0] = forget
            log.warning(
                "bridge %s: forgetting %d finished transaction(s) in the log failed "
                "(%s); tried again with the next write",
                self.bridge,
                len(forget),
                exc,
            )

    def _finished(self, tx: Transaction) -> None:
        waits = tx.state is TxState.COMMITTED and tx.logged and tx.durable is not None
        with self._lock:
            if not waits:  # a Completer's commits are in memory only: see durable()
                self._in_flight.discard(tx.gtrid)
            self.counts[tx.state.value.lower()] += 1
        if tx.state is TxState.COMMITTED and tx.logged and not waits:
            self.forget([tx.gtrid])

    def durable(self, txs: Iterable[Transaction], confirmed: bool = True) -> None:
        """A Completer's transactions after its waits for their commits' store writes: no
        longer in flight, and (``confirmed``) their records may go. Until then recovery
        leaves them alone: a commit made in memory is not in the RM's store yet (the
        embedded broker keeps such a branch in its recover() list until it is written,
        so a pass would only commit it again; a record forgotten before the write would
        let a crash roll back a branch whose partner committed). A wait that failed
        leaves the records for recovery, which commits those branches once they can be
        written."""
        txs = list(txs)
        with self._lock:
            for tx in txs:
                self._in_flight.discard(tx.gtrid)
        if confirmed:
            self.forget([tx.gtrid for tx in txs if tx.state is TxState.COMMITTED and tx.logged])

    def in_doubt(self, tx: Transaction, rms: list[str]) -> None:
        """A transaction some RM did not confirm finishing (a decided commit, or a
        rollback): recovery's to finish."""
        if self.on_in_doubt is not None:
            self.on_in_doubt(rms)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        try:
            self.flush()
        finally:
            self.txlog.close()
