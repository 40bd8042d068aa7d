"""The broker's paging hooks (queues.Pager): messages beyond the memory window.

Memory: a destination or subscription keeps a window of its waiting messages in memory
(``memory_window``, imq.destination.memory.window); persistent messages beyond it stay
only in the store, non-persistent ones go to the swap file (swap.py), and both are paged
back in seq order (queues.py, "Paging"). Opening the store reads per-destination counts,
not messages. Each queue counts the bytes of its messages (encoded size; estimated for one
not encoded: held in memory only, or a lazy row, see ``_route``) for its limits and
/metrics, an int add per put and take; those recovered at open only where a byte limit
is set (their sizes are a table scan). A store row that is not a message (damaged, or
written by a newer version) is set aside into the store's table ``rejected`` as it is
paged in, with an ERROR line; the messages after it are delivered.
"""

from __future__ import annotations

from ...jms import codec
from ...jms.errors import JMSException, MessageCodecError
from ...jms.message import Message
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
            try:
                return (
                    [
                        Envelope(seq, mq, decode(blob), True, len(blob) if seq >= counted else 0, dcount)
                        for seq, dcount, blob in stored
                        if seq not in skip
                    ],
                    stored[-1][0],
                )
            except MessageCodecError:  # (rare: the rows again, one by one, below)
                rows = [(seq, dcount, blob, True) for seq, dcount, blob in stored]
        else:
            rows = sorted(
                [(seq, dcount, blob, True) for seq, dcount, blob in stored]
                + [(seq, 0, blob, False) for seq, blob in self.swap.page(mq.key, after, limit)]
            )[:limit]
            if not rows:
                return [], None
        envs = []
        for seq, dcount, blob, kept in rows:
            if kept and seq in skip:
                continue
            message = self._stored_message(mq, seq, blob) if kept else decode(blob)  # (the swap file: ours)
            if message is not None:
                envs.append(Envelope(seq, mq, message, kept, len(blob) if seq >= counted else 0, dcount))
        return envs, rows[-1][0]

    def _stored_message(self, mq: MessageQueue, seq: int, blob: bytes) -> Message | None:
        """The message of a row paged in; None when it is not one: the row is set aside
        (moved to the table ``rejected`` in the store's next batch, with the reason) and
        leaves the queue's counts."""
        try:
            return codec.decode(blob)
        except MessageCodecError as exc:
            assert self.store is not None  # (a stored row)
            log.error(
                "store %s: row %d of %s is not a message (%s); it is kept in the store's table "
                "rejected, the messages after it are delivered",
                self.store.path,
                seq,
                mq.destination,
                exc,
            )
            self.store.set_aside(seq, str(exc))
            mq.paged -= 1
            mq.count -= 1
            mq.dequeued += 1
            if seq >= mq.counted_from:
                mq.bytes -= len(blob)
            return None

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
