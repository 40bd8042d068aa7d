"""The broker's XA resource manager: its branches, their states and outcomes.

XA branches are :class:`Work` with an Xid and a state (ACTIVE, IDLE, PREPARED,
ROLLBACK_ONLY; ``_XA_ALLOWED`` says which call is legal in which state). A prepared
branch is written to the store and survives a crash: at open it comes back with its
sends held back and the messages it consumed locked until ``commit`` or ``rollback``.
On an HA instance ``cluster_xa`` (clusterxa.py) completes and lists the branches another
instance's store holds: a branch started on one instance is the cluster's.
"""

from __future__ import annotations

from typing import Any, Protocol

from ...jms import xa
from ...jms.errors import JMSException, StoreFull, StoreUnavailable, XAException
from ...jms.xa import Xid
from .localtx import LocalTransactions
from .state import _NULL, Work, WorkState

# Which XA call is legal in which branch state (anything else: XAER_PROTO).
_XA_ALLOWED: dict[str, frozenset[WorkState]] = {
    "join": frozenset({WorkState.ACTIVE, WorkState.IDLE}),
    "end": frozenset({WorkState.ACTIVE}),
    "prepare": frozenset({WorkState.IDLE, WorkState.ROLLBACK_ONLY}),
    "commit_one_phase": frozenset({WorkState.IDLE, WorkState.ROLLBACK_ONLY}),
    "commit_two_phase": frozenset({WorkState.PREPARED}),
    "rollback": frozenset({WorkState.IDLE, WorkState.ROLLBACK_ONLY, WorkState.PREPARED}),
}


class ClusterBranches(Protocol):
    """The branches of an HA cluster that other instances' stores hold (clusterxa.py)."""

    def commit(self, xid: Xid) -> None: ...

    def rollback(self, xid: Xid) -> None: ...

    def recover(self) -> list[Xid]: ...


class XABranches(LocalTransactions):
    """The XA branches of the broker (``branches``, ``committing``)."""

    # HA: where a commit or rollback of a branch not ours goes, and what recover adds
    cluster_xa: ClusterBranches | None = None

    # --- XA -------------------------------------------------------------------------------------------
    def xa_start(self, session: Any, xid: Xid, flags: int) -> Work:
        with self.lock:
            work = self.branches.get(xid)
            if flags & (xa.TMJOIN | xa.TMRESUME):
                if work is None:
                    raise XAException(f"start: unknown branch {xid}", xa.XAER_NOTA)
                self._xa_check(work, "join", "start(TMJOIN/TMRESUME)")
            elif flags == xa.TMNOFLAGS:
                if work is not None:
                    raise XAException(f"start: branch {xid} already exists", xa.XAER_DUPID)
                work = Work(xid, WorkState.ACTIVE, session.connection)
                self.branches[xid] = work
            else:
                raise XAException(f"start: invalid flags {flags:#x}", xa.XAER_INVAL)
            work.state = WorkState.ACTIVE
            work.sessions.add(session)
            return work

    def xa_end(self, session: Any, xid: Xid, flags: int) -> None:
        with self.lock:
            work = self._branch(xid, "end")
            if session not in work.sessions:
                raise XAException(f"end: branch {xid} is not associated with this session", xa.XAER_PROTO)
            self._xa_check(work, "end", "end")
            work.sessions.discard(session)
            if flags & xa.TMFAIL:
                work.state = WorkState.ROLLBACK_ONLY
            elif flags & xa.TMSUSPEND or work.sessions:
                work.state = WorkState.ACTIVE if work.sessions else WorkState.IDLE
            elif flags & xa.TMSUCCESS:
                work.state = WorkState.IDLE
            else:
                raise XAException(f"end: invalid flags {flags:#x}", xa.XAER_INVAL)

    def xa_prepare(self, xid: Xid) -> int:
        with self.lock:
            work = self._branch(xid, "prepare")
            self._xa_check(work, "prepare", "prepare")
            if work.state is WorkState.ROLLBACK_ONLY:
                self._xa_forget_rollback(work)
                raise XAException(
                    f"prepare: branch {xid} was marked rollback-only and is rolled back", xa.XA_RBROLLBACK
                )
            if work.empty:
                del self.branches[xid]
                work.state = WorkState.DONE
                return xa.XA_RDONLY
            try:
                if self.store is not None:
                    self.store.check_room()  # a prepared branch is written: it needs room
                envs = self._route_all(work.sends)
            except JMSException as exc:
                self._xa_forget_rollback(work)
                raise XAException(
                    f"prepare: branch {xid} cannot be prepared and is rolled back: {exc}",
                    xa.XAER_RMFAIL if isinstance(exc, StoreUnavailable) else xa.XA_RBROLLBACK,
                ) from exc
            work.sends = []
            work.prepared_sends = envs
            work.state = WorkState.PREPARED
            ticket = None
            if self.store is not None:
                sends: list[tuple[int, str, bytes]] = []
                for env in envs:
                    if env.stored:
                        assert env.blob is not None  # a send not written yet: encoded
                        sends.append((env.seq, env.queue.key, env.blob))
                        env.blob = None
                self.store.prepare_xa(str(xid), sends, [e.seq for e in work.acks if e.stored], waited=True)
                ticket = self.store.ticket()
        self._xa_durable("prepare", ticket)
        return xa.XA_OK

    def xa_commit(self, xid: Xid, one_phase: bool, wait: bool = True) -> int | None:
        """Commit branch ``xid``; returns the store ticket that makes it durable, waited
        for here (xa_commit_written) unless ``wait`` is false (the caller waits later). A
        branch committed already whose commit is not written yet is waited for again."""
        with self.lock:
            ticket = self.committing.get(xid)
            elsewhere = self._elsewhere(xid) if ticket is None and not one_phase else None
            if ticket is None and elsewhere is None:
                ticket = self._xa_commit(xid, one_phase)
        if elsewhere is not None:  # prepared in another instance's store: done once applied
            elsewhere.commit(xid)
            return None
        if wait:
            self.xa_commit_written(xid, ticket)
        return ticket

    def xa_commit_written(self, xid: Xid, ticket: int | None) -> None:
        """Wait until the store wrote the commit of branch ``xid`` (``ticket``); it stays in
        doubt until then (XAER_RMFAIL while the store cannot write)."""
        self._xa_durable("commit", ticket)
        if ticket is not None:
            with self.lock:
                if self.committing.get(xid) == ticket:
                    del self.committing[xid]

    def _xa_commit(self, xid: Xid, one_phase: bool) -> int | None:
        """xa_commit's work in memory, under the lock: the store ticket that writes it."""
        work = self._branch(xid, "commit")
        self._xa_check(work, "commit_one_phase" if one_phase else "commit_two_phase", "commit")
        if one_phase and work.state is WorkState.ROLLBACK_ONLY:
            self._xa_forget_rollback(work)
            raise XAException(f"commit: branch {xid} was marked rollback-only and is rolled back", xa.XA_RBROLLBACK)
        del self.branches[xid]
        work.state = WorkState.DONE
        if one_phase:
            try:
                ticket = self._commit_work(work)
            except JMSException as exc:
                self._xa_forget_rollback(work)
                raise XAException(f"commit: branch {xid} was rolled back: {exc}", xa.XA_RBROLLBACK) from exc
        else:
            with self.store.lock if self.store is not None else _NULL:
                if self.store is not None:
                    self.store.op("xa_commit", str(xid), waited=True)  # moves the prepared rows
                for env in work.prepared_sends:  # their room was taken at prepare
                    if not env.queue.deleted:
                        env.queue.push(env)
                for env in work.acks:
                    env.owner = None
                    env.queue.release(env)
            ticket = self.store.ticket() if self.store is not None else None
            if ticket is not None:
                self.committing[xid] = ticket
        return ticket

    def _elsewhere(self, xid: Xid) -> ClusterBranches | None:
        """(under the lock) The cluster's branches, when ``xid`` is no branch of ours."""
        if xid in self.branches or xid in self.committing:
            return None
        return self.cluster_xa

    def xa_rollback(self, xid: Xid) -> None:
        with self.lock:
            elsewhere = self._elsewhere(xid)
        if elsewhere is not None:
            elsewhere.rollback(xid)
            return
        with self.lock:
            if xid in self.committing:
                raise XAException(f"rollback: branch {xid} is committed (its commit is being written)", xa.XA_HEURCOM)
            work = self._branch(xid, "rollback")
            self._xa_check(work, "rollback", "rollback")
            prepared = work.state is WorkState.PREPARED
            self._xa_forget_rollback(work)
            ticket = None
            if prepared and self.store is not None:
                self.store.op("xa_rollback", str(xid), waited=True)
                ticket = self.store.ticket()
        self.wait_durable(ticket)

    def _xa_forget_rollback(self, work: Work) -> None:
        if work.xid is not None:  # always, for a branch
            self.branches.pop(work.xid, None)
        work.state = WorkState.DONE
        self._unroute(work.prepared_sends)
        acks, work.acks, work.sends, work.prepared_sends = work.acks, [], [], []
        for env in acks:
            env.owner = None
        self._redeliver(acks)

    def xa_recover(self) -> list[Xid]:
        with self.lock:
            ours = [*(xid for xid, w in self.branches.items() if w.state is WorkState.PREPARED), *self.committing]
            cluster = self.cluster_xa
        if cluster is None:
            return ours
        return [*ours, *(xid for xid in cluster.recover() if xid not in ours)]  # (XAER_RMFAIL: unreachable)

    def xa_forget(self, xid: Xid) -> None:
        with self.lock:
            if xid not in self.branches:
                raise XAException(f"forget: unknown branch {xid}", xa.XAER_NOTA)
            raise XAException(f"forget: branch {xid} has no heuristic outcome to forget", xa.XAER_PROTO)

    def xa_abandon(self, session: Any) -> None:
        """A session closed: branches it was still associated with fail (rollback-only)."""
        with self.lock:
            for work in list(self.branches.values()):
                if session in work.sessions:
                    work.sessions.discard(session)
                    if not work.sessions and work.state is WorkState.ACTIVE:
                        work.state = WorkState.ROLLBACK_ONLY

    def _branch(self, xid: Xid, call: str) -> Work:
        work = self.branches.get(xid)
        if work is None:
            raise XAException(f"{call}: unknown branch {xid}", xa.XAER_NOTA)
        return work

    @staticmethod
    def _xa_check(work: Work, what: str, call: str) -> None:
        if work.state not in _XA_ALLOWED[what]:
            raise XAException(f"{call}: not allowed while branch {work.xid} is {work.state.value}", xa.XAER_PROTO)

    def _xa_durable(self, what: str, ticket: int | None) -> None:
        """Wait for an XA step's batch; a store that cannot write it now (its disk full, its
        database unreachable) is an RM that failed (XAER_RMFAIL: the outcome is the
        coordinator's recovery's), not a vote."""
        try:
            self.wait_durable(ticket)
        except StoreFull as exc:
            raise XAException(f"{what}: {exc}", xa.XAER_RMFAIL) from exc
