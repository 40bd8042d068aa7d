"""The broker's local transactions and CLIENT_ACKNOWLEDGE work: a session's sends and
acks applied together (one store batch) or given back."""

from __future__ import annotations

from ...jms.errors import IllegalStateException, JMSException, TransactionRolledBackException
from .delivery import Delivery
from .queues import Envelope
from .state import _NULL, Work


class LocalTransactions(Delivery):
    """A session's :class:`Work`: commit, acknowledge, rollback."""

    # --- transactions -----------------------------------------------------------------------------
    def commit(self, work: Work) -> int | None:
        """Apply a local transaction atomically; the store ticket that makes it durable."""
        with self.lock:
            if self.closed:
                raise IllegalStateException("the broker is closed")
            try:
                return self._commit_work(work)
            except JMSException as exc:  # a destination refused a send: nothing was applied
                self._rollback_locked(work)
                raise TransactionRolledBackException(f"the transaction was rolled back: {exc}") from exc

    def _commit_work(self, work: Work) -> int | None:
        envs = self._route_all(work.sends)
        self._admit(envs)
        with self.store.lock if self.store is not None else _NULL:
            self._commit_envelopes(envs)
            self._ack(work.acks)
        work.sends, work.acks = [], []
        return self.store.ticket() if self.store is not None else None

    def acknowledge_work(self, work: Work, env: Envelope | None = None, oldest: int | None = None) -> int | None:
        """CLIENT_ACKNOWLEDGE (everything delivered; ``oldest``: only that many of the
        oldest, in delivery order) or INDIVIDUAL (just ``env``); the store ticket that makes
        the removal durable, when a stored message was acknowledged: a consumer that waits
        for it is not handed an acknowledged message again after a crash (a bridge link
        would copy it twice)."""
        with self.lock:
            if oldest is not None:
                acks, work.acks = work.acks[:oldest], work.acks[oldest:]
            elif env is None:
                acks, work.acks = work.acks, []
            elif env in work.acks:
                work.acks.remove(env)
                acks = [env]
            else:
                return None
            self._ack(acks)
            if self.store is not None and any(e.stored for e in acks):
                return self.store.ticket()
        return None

    def rollback(self, work: Work) -> None:
        with self.lock:
            self._rollback_locked(work)

    def _rollback_locked(self, work: Work) -> None:
        acks, work.sends, work.acks = work.acks, [], []
        for env in acks:
            env.owner = None
        self._redeliver(acks)
