"""The broker's paging hooks (queues.Pager): messages beyond the memory window.

Memory: a destination or subscription keeps a window of its waiting messages in memory
(``memory_window``, imq.destination.memory.window); persistent messages beyond it stay
only in the store, non-persistent ones go to the swap file (swap.py), and both are paged
back in seq order (queues.py, "Paging"). Opening the store reads per-destination counts,
not messages. Each queue counts the bytes of its messages (encoded size; estimated for one
not encoded: held in memory only, or a lazy row, see ``_route``) for its limits and
/metrics, an int add per put and take; those recovered at open only where a byte limit
is set (their sizes are a table scan).
"""

from __future__ import annotations

from ...jms import codec
from ...jms.errors import JMSException
from .queues import Envelope, MessageQueue
from .state import BrokerState, log


class Paging(BrokerState):
    """queues.Pager for the broker's queues: the store and the swap file."""

    def page(self, mq: MessageQueue, after: int, limit: int) -> tuple[list[Envelope], int | None]:
        """Paged-out messages of ``mq`` read back from the store (queues.Pager)."""
        stored = self.store.page(mq.key, after, limit) if self.store is not None and mq.durable else []
        skip, decode, counted = mq.skip, codec.decode, mq.counted_from
        if not (mq.swapped and self.swap is not None):  # the common case: the store alone
            if not stored:
                return [], None
            return (
                [
                    Envelope(seq, mq, decode(blob), True, len(blob) if seq >= counted else 0, dcount)
                    for seq, dcount, blob in stored
                    if seq not in skip
                ],
                stored[-1][0],
            )
        rows = sorted(
            [(seq, dcount, blob, True) for seq, dcount, blob in stored]
            + [(seq, 0, blob, False) for seq, blob in self.swap.page(mq.key, after, limit)]
        )[:limit]
        if not rows:
            return [], None
        return (
            [
                Envelope(seq, mq, decode(blob), kept, len(blob) if seq >= counted else 0, dcount)
                for seq, dcount, blob, kept in rows
                if not (kept and seq in skip)
            ],
            rows[-1][0],
        )

    def page_out(self, env: Envelope) -> bool:
        """(queues.Pager) A stored message is in the store already; a non-persistent one
        goes to the swap file, or stays in memory when there is none or it failed."""
        if env.stored:
            return True
        if self.swap is None:
            return False
        blob = env.wire or codec.encode(env.message)
        try:
            self.swap.put(env.seq, env.queue.key, blob)
        except JMSException as exc:
            log.warning("%s: keeping a message in memory: %s", env.queue.destination, exc)
            return False
        mq = env.queue
        mq.swapped += 1
        mq.bytes += len(blob) - env.size  # an estimated size becomes the one it pages in with
        return True

    def paged_in(self, envs: list[Envelope]) -> None:
        """(queues.Pager)"""
        if self.swap is not None:
            swapped = [env.seq for env in envs if not env.stored]
            if swapped:
                self.swap.forget(swapped)
                envs[0].queue.swapped -= len(swapped)

    def drop(self, mq: MessageQueue) -> None:
        """(queues.Pager)"""
        if self.swap is not None:
            self.swap.drop(mq.key)

    def _pages(self, mq: MessageQueue) -> MessageQueue:
        """``mq`` paged beyond the memory window, when there is a store or a swap file."""
        if (self.store is not None and mq.durable) or self.swap is not None:
            mq.pager = self
            mq.window = self.memory_window
        return mq
