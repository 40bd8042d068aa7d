"""The broker's routing (a post office): a send's target queues, its envelopes, the
limits they meet, pacing, the DMQ, and recording them in the store.

A destination's limits apply its limitBehavior when full (FLOW_CONTROL: the producer waits
for room, ``on_room``); the system-wide limits refuse messages held in memory only;
pacing holds a queue's producers while its consumers are behind (``on_pace``); a
destination whose producers are paused (pause dst) holds them until resumed (``on_resumed``).

Design notes: docs/embedded-broker.md#internals-providersembeddedbrokerpy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

from ...jms import codec
from ...jms.destination import Destination
from ...jms.errors import (
    IllegalStateException,
    InvalidDestinationException,
    JMSException,
    ProducerFlowControl,
    ResourceAllocationException,
    StoreFull,
)
from ...jms.message import BytesMessage, Message, TextMessage
from ...logfiles import COUNTED
from .dstcontrol import DestinationControl
from .queues import PACE_HIGH, PACE_LOW, PACE_STALL, Envelope, LimitBehavior, MessageQueue
from .state import PERSISTENT, Sent, log, now_ms
from .store import Row

WIRE_KEEP = 1024  # a queue this long or longer keeps no remote sender's blob (re-encoded at delivery)
_LAZY_KINDS = (TextMessage, BytesMessage)  # encoded for the store only when still pending (_route)


def _newest(tickets: Sequence[int | Sent]) -> int:
    """The newest store batch of ``tickets`` (batches are written in order: it covers them all)."""
    return max(t.ticket if isinstance(t, Sent) else t for t in tickets)


class Routing(DestinationControl):
    """Sends: routed, admitted, committed to their queues and recorded."""

    # --- sending ----------------------------------------------------------------------------
    def _targets(self, dest: Destination, sender: Any, message: Message) -> list[MessageQueue]:
        """The message queues a message sent to ``dest`` goes to (under the lock)."""
        if dest.is_temporary:
            mq = self.temporary.get(dest.name)
            if mq is None and self.remote_temporary is not None:  # HA: another instance's
                mq = self.remote_temporary(dest)
            if mq is None:
                raise InvalidDestinationException(f"{dest} no longer exists (its connection closed)")
            if not dest.is_topic or mq.key.startswith("x:"):
                return [mq]
        elif not dest.is_topic:
            return [self._queue(dest.name)]
        elif dest.name not in self.known_topics:
            if not self.autocreate_topic and f"t:{dest.name}" not in self.configured:
                raise InvalidDestinationException(f"topic {dest.name!r} does not exist and auto-create is off")
            self._know_topic(dest)
        out = []
        for sub in self.topics.get(dest.name, ()):
            if sub.no_local and sender is not None and _same_origin(sub, sender):
                continue
            if sub.selector is not None and not sub.selector.matches(message):
                continue
            out.append(sub)
        return out

    def _route(
        self,
        message: Message,
        targets: list[MessageQueue],
        blob: bytes | None = None,
        hold: bool = True,
        lazy: bool = False,
    ) -> list[Envelope]:
        """Envelopes for ``message`` in each target, limits applied and room taken (under
        the lock); on a refusal nothing stays taken. ``blob``: ``message`` encoded as a
        remote sender sent it; stored as it is and kept for deliveries over the wire while
        the queue is short (a backlog would hold every message twice). ``hold``: a full
        FLOW_CONTROL target raises ProducerFlowControl (else it takes the message).
        ``lazy``: a persistent text or bytes message is encoded for the store only if its
        row is still pending when its batch is cut (or at once when it is paged out): one
        consumed before is never encoded (its headers are checked now, so a bad one is
        refused here)."""
        wire = blob
        persistent = message.delivery_mode == PERSISTENT and self.store is not None
        if lazy and not (persistent and blob is None and type(message) in _LAZY_KINDS):
            lazy = False
        if lazy:
            codec.check_headers(message)
        body = -1
        if self.max_message_size >= 0:
            body = message.body_size()
            if body > self.max_message_size:
                raise ResourceAllocationException(
                    f"{message.destination}: a message body of {body} bytes is larger than "
                    f"imq.message.max_size={self.max_message_size}"
                )
        usage = self.usage
        system = usage.max_count >= 0 or usage.max_size >= 0  # imq.system.max_count/max_size
        envs: list[Envelope] = []
        try:
            for i, mq in enumerate(targets):
                stored = persistent and mq.durable
                limits = mq.limits
                if blob is None and ((stored and not lazy) or limits.counts_bytes):
                    blob = codec.encode(message)
                size = len(blob) if blob is not None else 0  # (an int add in admit: metrics)
                if not limits.unlimited:
                    self._make_room(mq, size, hold)
                if not size:  # not encoded: estimated (as the store estimates a lazy row)
                    if body < 0:
                        body = message.body_size()
                    size = body + 200
                if system and not stored:  # held in memory only: the system-wide limits apply
                    self._check_system(mq, size)
                msg = message if i == 0 else message.copy()
                env = Envelope(
                    next(self._seq),
                    mq,
                    msg,
                    stored,
                    size,
                    0,
                    blob if stored else None,
                    wire if mq.count < WIRE_KEEP else None,
                )
                mq.admit(env)
                envs.append(env)
        except BaseException:
            self._unroute(envs)
            raise
        return envs

    @staticmethod
    def _unroute(envs: Iterable[Envelope]) -> None:
        """Give back the room of routed envelopes that will not be committed."""
        for env in envs:
            env.queue.release(env)

    def _route_all(self, sends: list[tuple[Message, Destination, Any, bytes | None]]) -> list[Envelope]:
        """Route every send of a transaction; all or none (room included). A remote send's
        blob is stored as it came, not encoded again at the commit."""
        envs: list[Envelope] = []
        try:
            for message, dest, sender, blob in sends:
                envs.extend(self._route(message, self._targets(dest, sender, message), blob, hold=False))
        except BaseException:
            self._unroute(envs)
            raise
        return envs

    def _check_system(self, mq: MessageQueue, size: int) -> None:
        """imq.system.max_count / max_size: refuse one more message held in memory only."""
        usage = self.usage
        if 0 <= usage.max_count <= usage.count:
            raise ResourceAllocationException(
                f"{mq.destination}: the broker holds {usage.count} messages in memory, its limit "
                f"imq.system.max_count={usage.max_count}; the message is refused"
            )
        if 0 <= usage.max_size < usage.bytes + size:
            raise ResourceAllocationException(
                f"{mq.destination}: the broker holds {usage.bytes} bytes of messages in memory; "
                f"{size} more would pass its limit imq.system.max_size={usage.max_size}; the message is refused"
            )

    def _make_room(self, mq: MessageQueue, size: int, hold: bool = True) -> None:
        lim = mq.limits
        name = mq.destination
        if 0 <= lim.max_bytes_per_msg < size:
            raise ResourceAllocationException(
                f"{name}: message of {size} bytes exceeds maxBytesPerMsg={lim.max_bytes_per_msg}"
            )
        if not mq.full(size):
            return
        behavior = lim.limit_behavior
        if behavior is LimitBehavior.FLOW_CONTROL:
            if not hold:
                return  # a commit: its producer waited at send time
            if mq.count or mq.bytes:  # an empty queue that is "full" would never make room
                raise ProducerFlowControl(self._full_text(mq, size), partial(self.on_room, mq))
        elif behavior is not LimitBehavior.REJECT_NEWEST:
            pick = mq.oldest if behavior is LimitBehavior.REMOVE_OLDEST else mq.lowest_priority
            while mq.full(size):
                victim = pick()
                if victim is None:
                    break
                mq.remove(victim)
                self._discard(victim, behavior.value)
        if mq.full(size):
            raise ResourceAllocationException(self._full_text(mq, size))

    @staticmethod
    def _full_text(mq: MessageQueue, size: int) -> str:
        lim = mq.limits
        return (
            f"{mq.destination} is full (maxNumMsgs={lim.max_num_msgs}, maxTotalMsgBytes="
            f"{lim.max_total_msg_bytes}, {mq.count} messages, {mq.bytes} bytes"
            + (f", this one {size} bytes" if size else "")
            + f"); limitBehavior={lim.limit_behavior.value}"
        )

    def on_room(self, mq: MessageQueue, callback: Callable[[], None]) -> None:
        """Call ``callback`` (once, without blocking) when ``mq`` may have room again: at
        once if it has now, when a release makes room, its limits change, it goes away or
        the broker closes."""
        with self.lock:
            if mq.full() and not (mq.deleted or self.closed):
                mq.room_waiters.append(callback)
                return
        callback()

    def _pace(self, targets: list[MessageQueue]) -> None:
        """Pacing (module comment): ProducerFlowControl when a target's consumers are
        behind by more than PACE_HIGH messages."""
        for mq in targets:
            if len(mq) > PACE_HIGH and self._paced(mq, PACE_HIGH):
                raise ProducerFlowControl(
                    f"{mq.destination}: {len(mq)} messages wait for its consumers; the producer "
                    f"waits until they have taken all but {PACE_LOW}",
                    partial(self.on_pace, mq),
                )

    def _paced(self, mq: MessageQueue, level: int) -> bool:
        """Are producers of ``mq`` to wait: more than ``level`` messages wait, and
        consumers are there and took one (or waited for one) within PACE_STALL seconds
        (under the lock)?"""
        return (
            len(mq) > level
            and bool(mq.consumers)
            and not (mq.deleted or self.closed or self.consumers_paused(mq))
            and time.monotonic() - mq.last_take < PACE_STALL
        )

    def on_pace(self, mq: MessageQueue, callback: Callable[[], None]) -> None:
        """Call ``callback`` (once, without blocking) when a paced producer of ``mq`` may
        send again: at once if it may now."""
        with self.lock:
            if self._paced(mq, PACE_LOW):
                mq.pace_waiters.append(callback)
                if mq.pace_timer is None:
                    self._check_pace_later(mq, PACE_STALL)
                return
        callback()

    def _check_pace_later(self, mq: MessageQueue, delay: float) -> None:
        timer = threading.Timer(delay, self._check_pace, (mq,))
        timer.daemon = True
        mq.pace_timer = timer
        timer.start()

    def _check_pace(self, mq: MessageQueue) -> None:
        """The stall check: paced producers go on once the consumers have taken nothing
        for PACE_STALL seconds (or went away); else look again when that could be."""
        with self.lock:
            mq.pace_timer = None
            if not mq.pace_waiters:
                return
            if self._paced(mq, PACE_LOW):
                self._check_pace_later(mq, mq.last_take + PACE_STALL - time.monotonic() + 0.001)
            else:
                mq.unpace()

    def _throttle(self, sender: Any) -> None:
        """The memory state's batch: ProducerFlowControl when ``sender`` has sent its batch."""
        memory = self.memory
        if memory is not None and sender is not None and not memory.admit(sender):
            raise ProducerFlowControl(
                f"the broker's memory state is {memory.state_name} ({memory.percent:.0f}% of "
                f"{memory.budget >> 20} MB); producers may send {memory.batch} messages per batch",
                memory.on_sample,
            )

    def check_room(self, sender: Any, message: Message, dest: Destination) -> None:
        """Before a send into a transaction: ProducerFlowControl when the producer must
        wait now (a full FLOW_CONTROL target, or the memory state); nothing is taken."""
        with self.lock:
            if self.closed:
                raise IllegalStateException("the broker is closed")
            if self.paused:
                self.hold_paused(dest)
            self._throttle(sender)
            for mq in self._targets(dest, sender, message):
                if mq.limits.limit_behavior is LimitBehavior.FLOW_CONTROL and mq.count and mq.full():
                    raise ProducerFlowControl(self._full_text(mq, 0), partial(self.on_room, mq))

    def _admit(self, envs: list[Envelope]) -> None:
        """StoreFull, the envelopes' room given back, when a persistent one meets a full
        store: a producer's message is refused, not kept in memory only (the DMQ's are kept)."""
        if self.store is not None and self.store.full and any(env.stored for env in envs):
            self._unroute(envs)
            self.store.check_room()

    def _commit_envelopes(self, envs: Iterable[Envelope], rows: list[Row] | None = None) -> int | None:
        """Make routed envelopes durable (recorded) and visible (under the lock); the store
        ticket of the batch that holds them, or None when none is stored. Their rows go to
        the store in one call (a push never reads the store; a take waits for the lock),
        or, with ``rows``, are left there for the caller to record (send_many)."""
        out: list[Row] = [] if rows is None else rows
        for env in envs:
            mq = env.queue
            if mq.deleted:
                continue
            if env.stored:
                blob: bytes | Message | None = env.blob
                if blob is None:  # routed lazily (_route)
                    if mq.beyond_window(env):  # paged out: read back encoded, so encoded now
                        blob = codec.encode(env.message)
                        mq.bytes += len(blob) - env.size  # the size it pages in with
                        env.size = len(blob)
                    else:
                        blob = env.message
                out.append((env.seq, mq.key, blob, 0))
                env.blob = None
            mq.push(env)
        return self._record(out) if rows is None and out else None

    def _record(self, rows: list[Row]) -> int:
        """Record routed rows in the store in one call; its ticket (rows is emptied)."""
        assert self.store is not None  # a row is stored: there is a store
        ticket = self.store.add_many(rows)
        rows.clear()
        return ticket

    def send(
        self,
        sender: Any,
        message: Message,
        dest: Destination,
        blob: bytes | None = None,
        pace: bool = False,
        lazy: bool = True,
    ) -> Sent | None:
        """Route and enqueue now; what to wait on (wait_all) for a stored send, or None.
        ``blob``: ``message`` as a remote client encoded it (see ``_route``); ``pace``: the
        producer is paced to a queue's consumers (module comment); ``lazy`` off: its row is
        encoded now, for a caller that waits for it at once (so it is written at once: the
        header check of a lazy row would only be paid on top)."""
        with self.lock:
            if self.closed:
                raise IllegalStateException("the broker is closed")
            if self.paused:
                self.hold_paused(dest)
            envs = self._admit_send(sender, message, dest, self._targets(dest, sender, message), blob, pace, lazy)
            ticket = self._commit_envelopes(envs)
            return None if ticket is None else Sent(ticket, envs)

    def _admit_send(
        self,
        sender: Any,
        message: Message,
        dest: Destination,
        targets: list[MessageQueue],
        blob: bytes | None,
        pace: bool,
        lazy: bool = True,
    ) -> list[Envelope]:
        """One send's envelopes, routed (lazily) to ``targets`` and admitted, not yet
        committed: the producer paced and throttled first (under the lock)."""
        if pace and not dest.is_topic:
            self._pace(targets)
        self._throttle(sender)
        envs = self._route(message, targets, blob, lazy=lazy)
        self._admit(envs)
        return envs

    def send_many(
        self, sender: Any, sends: Sequence[tuple[Message, Destination]], pace: bool = False
    ) -> tuple[Sent | None, int, JMSException | None]:
        """send() of each of ``sends`` in order under one taking of the lock, their rows
        recorded in one store call, stopping at the first refused (ProducerFlowControl
        among the refusals): (what to wait on for those sent, or None; how many were sent;
        why the next was refused, None when none was). A send into a destination with
        limits records the rows before it first (making room may remove one of them)."""
        with self.lock:
            if self.closed:
                return None, 0, IllegalStateException("the broker is closed")
            rows: list[Row] = []
            ticket = None
            sent: list[Envelope] = []
            last: Destination | None = None  # a queue's targets serve the sends after to it
            targets: list[MessageQueue] = []
            limited = False
            for i, (message, dest) in enumerate(sends):
                try:
                    if self.paused:
                        self.hold_paused(dest)
                    if dest is not last or dest.is_topic or dest.is_temporary:
                        targets = self._targets(dest, sender, message)
                        last = dest
                        limited = any(not mq.limits.unlimited for mq in targets)
                    if rows and limited:  # recorded before making room may remove one
                        ticket = self._record(rows)
                    envs = self._admit_send(sender, message, dest, targets, None, pace)
                except JMSException as exc:
                    return self._sent(rows, ticket, sent), i, exc
                self._commit_envelopes(envs, rows)
                sent += envs
            return self._sent(rows, ticket, sent), len(sends), None

    def _sent(self, rows: list[Row], ticket: int | None, envs: list[Envelope]) -> Sent | None:
        """send_many's answer: its rows recorded; None when nothing was stored."""
        if rows:
            ticket = self._record(rows)
        return None if ticket is None else Sent(ticket, envs)

    def wait_all(self, tickets: Sequence[int | Sent]) -> None:
        """Wait for the newest of ``tickets`` (batches are written in order, so it covers
        the others). If the store cannot write it (StoreFull: no space, the database
        unreachable) the sends among them are withdrawn before their producers hear the
        error: a refused send is in no queue, and never written later. A message of theirs
        already delivered to a consumer, or paged out, stays (written once the store can)."""
        if not tickets or self.store is None:
            return
        try:
            self.store.wait(_newest(tickets))
        except StoreFull:
            self._withdraw([env for t in tickets if isinstance(t, Sent) for env in t.envs])
            raise

    def write_now(self, tickets: Sequence[int | Sent]) -> bool:
        """Write what ``tickets`` wait for on this thread if that cannot block
        (``Store.write_now``); True when ``wait_all`` will then return at once."""
        if not tickets or self.store is None:
            return True
        return self.store.write_now(_newest(tickets))

    def _withdraw(self, envs: list[Envelope]) -> None:
        """Take sent envelopes that still wait in their queues out again (wait_all)."""
        removed: list[int] = []
        with self.lock:
            for env in envs:
                if env.owner is None and env.queue.remove(env):
                    env.queue.release(env)
                    if env.stored:
                        removed.append(env.seq)
            if removed:
                assert self.store is not None  # a stored envelope: there is a store
                self.store.remove_all(removed)

    def _discard(self, env: Envelope, reason: str) -> None:
        """Remove a message the broker will never deliver; to the DMQ if the destination says so."""
        mq = env.queue
        mq.release(env)
        if env.stored:
            assert self.store is not None  # a stored envelope: there is a store
            self.store.remove(env.seq)
        if mq.limits.use_dmq and mq is not getattr(self, "dmq", None) and not mq.destination.is_temporary:
            dead = env.message.copy()
            dead.expiration = 0
            dead.set_string_property("JMS_SUN_DMQ_UNDELIVERED_REASON", reason)
            dead.set_long_property("JMS_SUN_DMQ_UNDELIVERED_TIMESTAMP", now_ms())
            dead.set_string_property("JMS_SUN_DMQ_DESTINATION", str(mq.destination))
            dead.set_int_property("JMS_SUN_DMQ_DELIVERY_COUNT", env.dcount)
            dead.destination = self.dmq.destination
            try:
                self._commit_envelopes(self._route(dead, [self.dmq]))
            except JMSException as exc:
                log.warning(
                    "%s: message %s dropped (%s); the DMQ refused it: %s",
                    mq.destination,
                    env.message.message_id,
                    reason,
                    exc,
                )
        else:
            log.info(
                "%s: message %s dropped (%s)", mq.destination, env.message.message_id, reason, extra=COUNTED
            )  # a flood of them: counted lines in the service log


def _same_origin(sub: MessageQueue, sender: Any) -> bool:
    """no_local: did the subscriber's own connection (or client id, when durable) publish it?"""
    if sub.owner is not None:
        return sub.owner is sender
    client_id = getattr(sender, "client_id_value", None)
    return client_id is not None and sub.key.startswith(f"d:{client_id}\0")
