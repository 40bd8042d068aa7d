"""The broker's delivery: consumers take envelopes, acknowledge or give them back;
poison messages, expiry, browsing.

Poison messages: a destination's ``backout_threshold`` counts a message's deliveries that
were not acknowledged (``dcount``, kept in the store; where a threshold is set the store
writes it as the message is delivered). A message that reaches it, as it comes back
(rollback, recover, close) or is taken again after a restart, moves to ``backout_queue``,
else goes by ``backout_disposition`` (the DMQ or discarded). A consumer with ``retain``
off (message retention off) that finds nothing to take sweeps the messages no active
consumer of its queue selects out by the same disposition.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

from ...jms.destination import Queue
from ...jms.errors import IllegalStateException, InvalidDestinationException, JMSException
from ...jms.message import Message
from ...jms.selector import Selector
from .queues import PACE_LOW, Envelope, MessageQueue
from .routing import Routing
from .state import _NULL, log, now_ms


class Delivery(Routing):
    """Takes, acknowledgements, redeliveries and browsers of the broker's queues."""

    # --- consuming --------------------------------------------------------------------------
    def receive(self, consumer: Any, timeout: float | None, ack_now: bool) -> Envelope | None:
        """Take the next envelope for ``consumer``, waiting up to ``timeout`` seconds.

        With ``ack_now`` (AUTO/DUPS_OK) it is acknowledged as it is taken; otherwise its
        delivery count is recorded so a crash still reports it redelivered.
        """
        mq: MessageQueue = consumer.queue
        with self.lock:  # first the common case: one ready for a consumer that may take it
            if (
                consumer.connection.started
                and not (consumer.closed or self.closed or mq.deleted or self.paused)
                and mq.limits.max_num_active_consumers < 0
            ):
                marks: list[tuple[int, int]] = []
                env = self._take_next(consumer, mq, now_ms(), ack_now, marks)
                if env is not None:
                    self._record_deliveries(mq, marks)
                    self._took(consumer, mq)
                    return env
        envs = self._take(consumer, 1, timeout, 0, ack_now)
        return envs[0] if envs else None

    def receive_many(self, consumer: Any, limit: int, timeout: float | None, max_bytes: int = 0) -> list[Envelope]:
        """Up to ``limit`` envelopes for ``consumer`` under one lock: waits up to
        ``timeout`` seconds for the first as :meth:`receive` does (not acknowledged), then
        takes those ready now, stopping once their bodies reach ``max_bytes`` (0: no byte
        bound). Each is taken as receive takes one; [] when there is none. A front end
        moving a batch so pays one lock, one wake-up and one clock read for it."""
        return self._take(consumer, limit, timeout, max_bytes, False)

    def _take(self, consumer: Any, limit: int, timeout: float | None, max_bytes: int, ack_now: bool) -> list[Envelope]:
        deadline = None if timeout is None else time.monotonic() + timeout
        mq: MessageQueue = consumer.queue
        with self.lock:
            while True:
                if consumer.closed or self.closed or mq.deleted:
                    return []
                # pause dst: messages stay, resume wakes it; a backup consumer takes nothing
                lim = mq.limits
                paused = self.consumers_paused(mq) or (lim.max_num_active_consumers >= 0 and not mq.is_active(consumer))
                if consumer.connection.started and not paused:
                    if 0 < lim.consumer_flow_limit < limit:  # a batch is at most consumerFlowLimit
                        limit = lim.consumer_flow_limit
                    now = now_ms()
                    marks: list[tuple[int, int]] = []  # recorded in one store call, not one each
                    try:
                        env = self._take_next(consumer, mq, now, ack_now, marks)
                        envs = [] if env is None else [env]
                        size = env.message.body_size() if max_bytes and env is not None else 0
                        while envs and len(envs) < limit and not (max_bytes and size >= max_bytes):
                            env = self._take_next(consumer, mq, now, ack_now, marks)
                            if env is None:
                                break
                            envs.append(env)
                            if max_bytes:
                                size += env.message.body_size()
                    finally:
                        self._record_deliveries(mq, marks)
                    if envs:
                        self._took(consumer, mq)
                        return envs
                    if not consumer.retain and len(mq):
                        self._sweep_unwanted(mq)
                remaining = None
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return []
                mq.waiters.append(consumer)
                if consumer.selector is None and consumer.connection.started and not paused:
                    mq.last_take = time.monotonic()  # (pacing) ready to take any: not stalled
                consumer.cond.wait(remaining)
                try:
                    mq.waiters.remove(consumer)
                except ValueError:
                    pass

    def _record_deliveries(self, mq: MessageQueue, marks: list[tuple[int, int]]) -> None:
        """The delivery counts of what was taken, in one store call (not one each)."""
        if marks:
            assert self.store is not None  # stored envelopes: there is a store
            self.store.mark_delivered_all(marks, bool(mq.limits.backout_threshold))

    @staticmethod
    def _took(consumer: Any, mq: MessageQueue) -> None:
        """(pacing) ``consumer`` took: one that takes any message is not stalled."""
        if consumer.selector is None:
            mq.last_take = time.monotonic()
            if mq.pace_waiters and len(mq) <= PACE_LOW:
                mq.unpace()

    def _take_next(
        self, consumer: Any, mq: MessageQueue, now: int, ack_now: bool, marks: list[tuple[int, int]]
    ) -> Envelope | None:
        """The next envelope of ``mq`` for ``consumer``, counted as delivered (and
        acknowledged with ``ack_now``, else, when stored, its (seq, count) added to
        ``marks`` for the caller to record before it hands the envelope out, so a crash
        still reports it redelivered); None when none is ready (under the lock)."""
        while True:
            env = mq.take(consumer.selector, now, self._expire, consumer)
            if env is None:
                return None
            if mq.limits.backout_threshold and self._backed_out(env):
                continue  # delivered unacknowledged too often before a restart
            env.dcount += 1
            if ack_now:
                self._ack((env,))
            elif env.stored:
                marks.append((env.seq, env.dcount))
            return env

    def acknowledge(self, envs: Iterable[Envelope]) -> None:
        """Consumed for good: drop from queues' accounting and from the store."""
        with self.lock:
            self._ack(envs)

    def _ack(self, envs: Iterable[Envelope]) -> None:
        stored = []
        for env in envs:
            env.owner = None
            env.queue.release(env)
            if env.stored:
                stored.append(env.seq)
        if stored:
            assert self.store is not None  # a stored envelope: there is a store
            self.store.remove_all(stored)

    def redeliver(self, envs: list[Envelope]) -> None:
        """Return unacknowledged messages to their queues (recover, rollback, close)."""
        with self.lock:
            self._redeliver(envs)

    def _redeliver(self, envs: list[Envelope]) -> None:
        by_queue: dict[int, list[Envelope]] = {}
        for env in envs:
            if env.queue.deleted:
                env.queue.release(env)  # its queue went away while it was out
                continue
            if env.queue.limits.backout_threshold and self._backed_out(env):
                continue
            if env.stored:
                assert self.store is not None  # a stored envelope: there is a store
                self.store.mark_delivered(env.seq, env.dcount)
            by_queue.setdefault(id(env.queue), []).append(env)
        for group in by_queue.values():
            group[0].queue.push_back(group)

    def _backed_out(self, env: Envelope) -> bool:
        """A message taken out of (or returning to) its queue that has been delivered
        backoutThreshold times without an acknowledgement (its delivery count, which the
        store keeps across restarts): requeued on the destination's backoutQueue; if there
        is none or it refuses the message, backoutDisposition (the DMQ, or discarded).
        True when the message left its queue (under the lock)."""
        mq = env.queue
        limits = mq.limits
        if env.dcount < limits.backout_threshold:
            return False
        if limits.backout_queue:
            try:
                target = self._queue(limits.backout_queue)
                if target is mq:
                    raise InvalidDestinationException("it is the queue the message backed out of")
                moved = env.message.copy()
                moved.set_int_property("JMS_IMQ_BACKOUT_COUNT", env.dcount)
                moved.set_string_property("JMS_IMQ_BACKOUT_DESTINATION", str(mq.destination))
                moved.destination = target.destination
                envs = self._route(moved, [target], hold=False)
                self._admit(envs)
                with self.store.lock if self.store is not None else _NULL:
                    self._commit_envelopes(envs)
                    self._ack((env,))
            except JMSException as exc:
                log.warning(
                    "%s: message %s reached backoutThreshold=%d; backoutQueue %s refused it: %s",
                    mq.destination,
                    env.message.message_id,
                    limits.backout_threshold,
                    limits.backout_queue,
                    exc,
                )
            else:
                log.info(
                    "%s: message %s backed out %d times, requeued on %s",
                    mq.destination,
                    env.message.message_id,
                    env.dcount,
                    limits.backout_queue,
                )
                return True
        self._dispose(env, "BACKOUT_THRESHOLD_REACHED")
        return True

    def _dispose(self, env: Envelope, reason: str) -> None:
        """Remove a message by its destination's backoutDisposition: dmq (the DMQ, as
        _discard) or discard."""
        if env.queue.limits.backout_disposition == "discard":
            env.queue.release(env)
            if env.stored:
                assert self.store is not None  # a stored envelope: there is a store
                self.store.remove(env.seq)
            log.warning("%s: message %s discarded (%s)", env.queue.destination, env.message.message_id, reason)
        else:
            self._discard(env, reason)

    def _sweep_unwanted(self, mq: MessageQueue) -> None:
        """Message retention off: the waiting messages (in memory) that no active
        consumer of ``mq`` selects go by the disposition rule (reason MSG_NOT_MATCHED), so
        they do not pile up. Only while one of its active consumers is a connection
        consumer's with retention off (under the lock)."""
        active = [c for c in mq.consumers if not c.closed and c.connection.started]
        if not any(not c.retain for c in active):
            return
        selectors = [c.selector for c in active]
        if any(sel is None for sel in selectors):
            return
        for env in mq.browse():
            if not any(sel.matches(env.message) for sel in selectors if sel is not None):
                mq.remove(env)
                self._dispose(env, "MSG_NOT_MATCHED")

    def _expire(self, env: Envelope) -> None:
        self._discard(env, "EXPIRED")

    def browsable(self, queue: Queue) -> None:
        """InvalidDestinationException unless ``queue`` can be browsed now (a browser's
        creation: it fails there, not when first iterated)."""
        with self.lock:
            self._browsed_queue(queue)

    def _browsed_queue(self, queue: Queue) -> MessageQueue:
        if queue.is_temporary:
            mq = self.temporary.get(queue.name)
            if mq is None:
                raise InvalidDestinationException(f"{queue} no longer exists")
            return mq
        return self._queue(queue.name)

    def browse(self, queue: Queue, selector: Selector | None) -> Iterator[Message]:
        """The queue's waiting messages: those in memory (a snapshot taken now), then
        the paged-out ones, read a chunk at a time as the caller iterates."""
        with self.lock:
            mq = self._browsed_queue(queue)
            now = now_ms()
            window = [
                _browsed(env)
                for env in mq.browse()
                if not env.expired(now) and (selector is None or selector.matches(env.message))
            ]
            after = mq.high
        return self._browse(mq, selector, window, after)

    def _browse(
        self, mq: MessageQueue, selector: Selector | None, window: list[Message], after: int
    ) -> Iterator[Message]:
        yield from window
        while True:
            with self.lock:
                if mq.deleted or self.closed:
                    return
                envs, last = mq.browse_paged(after, mq.window)
                now = now_ms()
                chunk = [
                    _browsed(env)
                    for env in envs
                    if not env.expired(now) and (selector is None or selector.matches(env.message))
                ]
            if last is None:
                return
            after = last
            yield from chunk

    def browse_queue(self, name: str, limit: int, after: str | None = None) -> list[Message] | None:
        """Read-only copies of the first ``limit`` waiting messages of queue ``name`` in
        delivery order (paged-out ones included), or of those after the one whose
        JMSMessageID is ``after`` (IllegalStateException when it is no longer waiting);
        None when the queue does not exist."""
        with self.lock:
            if name not in self.queues:
                return None
        out: list[Message] = []
        found = after is None
        for message in self.browse(Queue(name), None):
            if len(out) >= limit:
                break
            if found:
                out.append(message)
            else:
                found = message.message_id == after
        if not found:
            raise IllegalStateException(
                f"message {after} is no longer waiting on queue {name} (consumed, expired or removed): "
                "browse again from the first page"
            )
        return out


def _browsed(env: Envelope) -> Message:
    """A browser's read-only copy of a waiting message."""
    msg = env.message.copy()
    msg.delivery_count = env.dcount
    msg.redelivered = env.dcount > 0
    msg.set_read_only()
    return msg
