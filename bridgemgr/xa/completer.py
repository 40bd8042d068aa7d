"""The commit phase of a link's two-phase transactions, in order, behind the link.

A Completer takes a link's transactions once every branch voted yes and, in its own thread,
logs the commit records of all queued ones in one write and one sync, then commits them
one after the other, while the link already moves the next message. Only transactions of
in-process resource managers are deferred.

Rules: the commits keep source order, and so do failures: when a transaction cannot be
logged or committed, every transaction queued after it is rolled back until the link has
seen the failure (outcomes()) and reset() the completer.

Design notes: docs/jms-bridges.md#internals-xacompleterpy.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..jms.errors import TransactionRolledBackException

if TYPE_CHECKING:
    from .coordinator import Branch, Coordinator, Transaction

log = logging.getLogger(__name__)
DEPTH = 64  # transactions a link may have prepared and not yet completed


@dataclass(frozen=True)
class Outcome:
    """How a deferred transaction ended: error None when committed; behind: rolled back
    only because an earlier one failed (its messages come back, nothing of its own failed)."""

    error: BaseException | None = None
    behind: bool = False


class Completer:
    """Finishes one link's prepared transactions in order (see the module comment)."""

    def __init__(self, coordinator: Coordinator, name: str, depth: int = DEPTH) -> None:
        self.coordinator = coordinator
        self.name = name
        self.depth = depth
        self._cond = threading.Condition()
        self._queue: deque[tuple[Transaction, list[Branch]]] = deque()
        self._working = 0  # transactions taken by the thread, not yet finished
        self._outcomes: deque[Outcome] = deque()
        self._failure: BaseException | None = None  # until reset(): roll back the rest
        self._thread: threading.Thread | None = None

    @property
    def behind(self) -> int:
        """Transactions handed over whose outcome the link has not taken yet."""
        with self._cond:
            return len(self._queue) + self._working + len(self._outcomes)

    def submit(self, tx: Transaction, prepared: list[Branch]) -> None:
        """Queue a transaction whose branches all voted yes; waits while DEPTH are queued."""
        with self._cond:
            while len(self._queue) + self._working >= self.depth:
                self._cond.wait()
            self._queue.append((tx, prepared))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name=f"xa completer {self.name}")
                self._thread.start()
            self._cond.notify_all()

    def outcomes(self, wait: bool = False) -> list[Outcome]:
        """The outcomes finished so far, in submission order (taken); with ``wait``, of
        everything submitted."""
        with self._cond:
            while wait and (self._queue or self._working):
                self._cond.wait()
            taken = list(self._outcomes)
            self._outcomes.clear()
            return taken

    def reset(self) -> None:
        """The link has handled a failure: transactions submitted from now on complete."""
        with self._cond:
            self._failure = None

    def close(self) -> None:
        """Finish what is queued and stop the thread."""
        self.outcomes(wait=True)
        with self._cond:
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                while not self._queue and self._thread is me:
                    self._cond.wait()
                if not self._queue:
                    return
                group = list(self._queue)
                self._queue.clear()
                self._working = len(group)
            outcomes = self._complete(group)
            with self._cond:
                self._outcomes.extend(outcomes)
                self._working = 0
                self._cond.notify_all()

    def _complete(self, group: list[tuple[Transaction, list[Branch]]]) -> list[Outcome]:
        if self._failure is None:
            try:
                self.coordinator.log_commits([tx.commit_record(prepared) for tx, prepared in group])
            except Exception as exc:  # nothing decided: presumed abort holds
                self._failure = exc
                return [self._roll_back(tx, exc, behind=i > 0) for i, (tx, _) in enumerate(group)]
        outcomes = []
        for tx, prepared in group:
            if self._failure is not None:
                outcomes.append(self._roll_back(tx, self._failure, behind=True))
                continue
            tx.durable = []
            try:
                tx.decided(prepared, logged=True)
            except Exception as exc:  # a heuristic outcome: what follows waits for the link
                self._failure = exc
                outcomes.append(Outcome(exc))
                continue
            outcomes.append(Outcome())
        self._forget_durable([tx for tx, _ in group])
        return outcomes

    def _forget_durable(self, txs: list[Transaction]) -> None:
        """Wait for the RMs' records of the group's commits (one store batch per RM for
        all of them), then let the log forget those transactions."""
        try:
            for tx in txs:
                for wait in tx.durable or ():
                    wait()
        except Exception as exc:  # the records stay: recovery commits those branches again
            log.error("completer %s: a resource manager did not confirm its commits: %s", self.name, exc)
            self.coordinator.durable(txs, confirmed=False)
            return
        self.coordinator.durable(txs)

    @staticmethod
    def _roll_back(tx: Transaction, cause: BaseException, behind: bool) -> Outcome:
        tx.undecided()
        if not behind:
            return Outcome(cause)
        error = TransactionRolledBackException(
            f"transaction {tx.gtrid.decode(errors='replace')}: rolled back after an earlier "
            f"transaction of the link failed ({cause}), to keep the messages in order"
        )
        error.__cause__ = cause  # what the link judges it by (a database outage excuses it)
        return Outcome(error, behind=True)
