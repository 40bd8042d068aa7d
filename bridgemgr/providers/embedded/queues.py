"""Physical message queues of the embedded broker, and their limits.

Every place messages wait is a :class:`MessageQueue` — a queue destination, a durable
subscription, a non-durable subscriber, a temporary queue. Messages are :class:`Envelope`
records in a sorted list keyed by (-priority, seq): highest priority first, FIFO within a
priority, and a message put back (recover, rollback, a closed consumer) returns to its old
place because it keeps its seq. A consumer with a selector walks the list in that order to
the first match.

Rules: all methods run under the broker lock; each put wakes exactly one eligible waiter
(round robin, no lost wake-ups); a queue with a ``pager`` keeps at most ``window`` waiting
messages in memory and pages the rest out (a stored one stays only in the store, a
non-persistent one goes to the swap file), reading them back in seq order.

Design notes: docs/embedded-broker.md#internals-providersembeddedqueuespy.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

from sortedcontainers import SortedList

from ...jms.destination import Destination
from ...jms.errors import ResourceAllocationException
from ...jms.message import Message

if TYPE_CHECKING:
    from ...jms.selector import Selector


class LimitBehavior(str, Enum):
    """What a full destination does with the next message (the broker chapter's four)."""

    FLOW_CONTROL = "FLOW_CONTROL"  # its producer waits until there is room
    REMOVE_OLDEST = "REMOVE_OLDEST"  # the oldest waiting message goes (to the DMQ)
    REJECT_NEWEST = "REJECT_NEWEST"  # the send fails
    REMOVE_LOW_PRIORITY = "REMOVE_LOW_PRIORITY"  # the lowest-priority, oldest waiting one goes


@dataclass(frozen=True)
class DestinationLimits:
    """The broker chapter's physical destination limits; -1 means unlimited."""

    max_num_msgs: int = -1
    max_total_msg_bytes: int = -1
    max_bytes_per_msg: int = -1
    limit_behavior: LimitBehavior = LimitBehavior.REJECT_NEWEST
    use_dmq: bool = True
    # Poison messages: once delivered this many times without an acknowledgement (0: off),
    # a message moves to backout_queue, else (none, or it refused it) by backout_disposition:
    # "dmq" (the DMQ, unless use_dmq is off) or "discard". Unwanted messages of
    # connection consumers with retention off go by the same disposition (broker.py).
    backout_threshold: int = 0
    backout_queue: str = ""
    backout_disposition: str = "dmq"
    # An HA cluster's queues (clusterdst.py, the original's Table 4-1): messages go to
    # consumers on other instances only while this one has none active; or never.
    local_delivery_preferred: bool = False
    is_local_only: bool = False
    # Producers and consumers (docs/embedded-broker.md, "Producers and consumers"): a
    # producer beyond max_num_producers is refused; a queue's first max_num_active_consumers
    # consumers receive, the next max_num_backup_consumers wait to take over, one more is
    # refused; a consumer is handed at most consumer_flow_limit messages ahead. -1: unlimited.
    max_num_producers: int = 100
    max_num_active_consumers: int = -1
    max_num_backup_consumers: int = 0
    consumer_flow_limit: int = 1000

    @cached_property
    def counts_bytes(self) -> bool:
        return self.max_total_msg_bytes >= 0 or self.max_bytes_per_msg >= 0

    @cached_property
    def unlimited(self) -> bool:
        return self.max_num_msgs < 0 and not self.counts_bytes


UNLIMITED = DestinationLimits()
WINDOW = 30000  # waiting messages a destination keeps in memory (imq.destination.memory.window)
# Pacing (broker.py, "Pacing"): a front end's producers wait while more than PACE_HIGH
# messages wait for a destination's consumers, until PACE_LOW are left or its consumers
# have taken nothing for PACE_STALL seconds.
PACE_HIGH, PACE_LOW, PACE_STALL = 300, 150, 1.0
PAGE_CHUNK = 1000  # paged-out messages read back at a time


class Pager(Protocol):
    """Keeps a queue's messages beyond its window in the store or the swap file and
    reads them back (the broker)."""

    def page(self, mq: MessageQueue, after: int, limit: int) -> tuple[list[Envelope], int | None]:
        """Envelopes of up to ``limit`` paged-out messages of ``mq`` with seq > ``after``,
        in seq order, leaving out ``mq.skip``; and the last seq read (None: none left)."""
        ...

    def page_out(self, env: Envelope) -> bool:
        """Keep ``env`` out of memory (a non-persistent one in the swap file); False
        when it has to stay in memory."""
        ...

    def paged_in(self, envs: list[Envelope]) -> None:
        """These paged-out messages are in memory now (or gone): off the swap file."""
        ...

    def drop(self, mq: MessageQueue) -> None:
        """``mq`` went away: its swapped messages with it."""
        ...


class SystemUsage:
    """Messages the broker holds in memory only (not in the store, nor in the swap file),
    against imq.system.max_count and imq.system.max_size (-1: no limit)."""

    __slots__ = ("bytes", "count", "max_count", "max_size")

    def __init__(self, max_count: int = -1, max_size: int = -1) -> None:
        self.count = 0
        self.bytes = 0
        self.max_count = max_count
        self.max_size = max_size


NO_USAGE = SystemUsage()  # for queues outside a broker (tests)


class Envelope:
    """The broker's record of one message in one queue."""

    __slots__ = ("blob", "dcount", "message", "owner", "queue", "seq", "size", "stored", "wire")

    def __init__(
        self,
        seq: int,
        queue: MessageQueue,
        message: Message,
        stored: bool,
        size: int,
        dcount: int = 0,
        blob: bytes | None = None,
        wire: bytes | None = None,
    ) -> None:
        self.seq = seq
        self.queue = queue
        self.message = message  # the broker's snapshot; never handed out writable
        self.stored = stored  # has (or will have) a row in the store
        self.size = size  # bytes in its queue's ``bytes`` (0 when not counted)
        self.dcount = dcount  # deliveries so far
        self.owner: Any = None  # the session holding it unacknowledged, or an XA branch
        self.blob = blob  # encoded form while it may still need writing
        self.wire = wire  # encoded form as a remote sender sent it (deliveries reuse it)

    @property
    def delivery_count(self) -> int:
        """Deliveries so far (a HostBroker Delivery's count)."""
        return self.dcount

    def expired(self, now_ms: int) -> bool:
        exp = self.message.expiration
        return bool(exp) and exp <= now_ms


class MessageQueue:
    """Messages waiting in one queue, subscription or temporary destination."""

    def __init__(
        self,
        key: str,
        destination: Destination,
        *,
        durable: bool,
        limits: DestinationLimits = UNLIMITED,
        owner: Any = None,
        selector: Selector | None = None,
        no_local: bool = False,
        topic: Destination | None = None,
        usage: SystemUsage = NO_USAGE,
    ) -> None:
        self.key = key  # store key: q:NAME, d:CLIENT\0NAME, or in-memory
        self.destination = destination  # what consumers see as JMSDestination
        self.durable = durable  # persistent messages get a row in the store
        self.limits = limits
        self.owner = owner  # owning connection (temporary destinations, subscribers)
        self.selector = selector  # subscription selector (topics filter at publish)
        self.no_local = no_local
        self.topic = topic  # the topic a subscription listens to
        self._list: SortedList = SortedList()  # of (-priority, seq, Envelope)
        self.pager: Pager | None = None  # see "Paging" above
        self.window = WINDOW
        self.paged = 0  # waiting messages only in the store or the swap file
        self.swapped = 0  # ...of which in the swap file
        self.high = 0  # messages above this seq are paged out...
        self.skip: set[int] = set()  # ...except these, which are in memory
        self.paged_epoch = 0  # bumped when a message is paged out behind others
        self._paged_last = 0  # the highest seq paged out
        self.count = 0  # unacknowledged messages (queued + in flight)
        self.bytes = 0  # ...their bytes: encoded size (estimated in memory only)
        self.counted_from = 0  # seqs below are not in bytes (recovered, see the broker)
        self.waiters: deque[Any] = deque()
        self.room_waiters: list[Callable[[], None]] = []  # producers held by FLOW_CONTROL
        self.pace_waiters: list[Callable[[], None]] = []  # producers paced to the consumers
        self.last_take = 0.0  # time.monotonic() a consumer last took or waited (pacing)
        self.pace_timer: Any = None  # the stall check while producers are paced
        self.usage = usage
        self.epoch = 0  # bumped when a message lands before the end (see take)
        self.consumers: list[Any] = []
        # an HA cluster's queue with maxNumActiveConsumers (clusterdst.py): our consumers
        # that are active cluster-wide (None: decided here), and the other instances' count
        self.cluster_active: list[Any] | None = None
        self.elsewhere = 0
        self.deleted = False
        self.enqueued = 0  # messages admitted, ever (metrics)
        self.dequeued = 0  # ... and released: acknowledged, expired, removed

    def __len__(self) -> int:
        """Waiting messages, in memory and paged out."""
        return len(self._list) + self.paged

    # --- putting -------------------------------------------------------------
    def admit(self, env: Envelope) -> None:
        """Account for a new message (limits are checked by the broker first)."""
        self.count += 1
        self.enqueued += 1
        self.bytes += env.size
        if not env.stored:
            usage = self.usage
            usage.count += 1
            usage.bytes += env.size

    def release(self, env: Envelope) -> None:
        """Forget an acknowledged or removed message; held producers try again if that
        made room."""
        self.count -= 1
        self.dequeued += 1
        self.bytes -= env.size
        if not env.stored:
            usage = self.usage
            usage.count -= 1
            usage.bytes -= env.size
        if self.room_waiters and not self.full():
            self.wake_producers()

    def full(self, size: int = 0) -> bool:
        """Would a message of ``size`` bytes go over maxNumMsgs or maxTotalMsgBytes?"""
        lim = self.limits
        return (0 <= lim.max_num_msgs <= self.count) or (0 <= lim.max_total_msg_bytes < self.bytes + size)

    def wake_producers(self) -> None:
        """Let every held producer try again (room, new limits, or the queue is gone)."""
        waiters, self.room_waiters = self.room_waiters, []
        for callback in waiters:
            callback()
        self.unpace()

    def unpace(self) -> None:
        """Let every paced producer send again (the backlog fell, or pacing ends)."""
        waiters, self.pace_waiters = self.pace_waiters, []
        for callback in waiters:
            callback()

    def beyond_window(self, env: Envelope) -> bool:
        """Would ``push`` page ``env`` out: its window is full, or older messages are?"""
        return self.pager is not None and env.seq > self.high and self._window_full()

    def _window_full(self) -> bool:
        """Paging has begun or the in-memory window is full: a newer message waits on disk."""
        return bool(self.paged or len(self._list) >= self.window)

    def push(self, env: Envelope) -> None:
        items = self._list
        pager = self.pager
        seq = env.seq
        if pager is not None and seq > self.high:
            if not self._window_full():
                self.high = seq
            elif pager.page_out(env):
                self._page_out(env)
                return
        item = (-env.message.priority, seq, env)
        if items and item < items[-1]:
            self.epoch += 1
        items.add(item)
        if self.waiters:
            self.wake(env.message)

    def _page_out(self, env: Envelope) -> None:
        """Count a message the pager keeps out of memory (a stored one's row is recorded;
        it may still be pending: ``Store.page`` writes it before reading)."""
        self.paged += 1
        if not env.stored:  # swapped: no longer in memory, so not the system's to count
            self.usage.count -= 1
            self.usage.bytes -= env.size
        if env.seq < self._paged_last:
            self.paged_epoch += 1  # selector cursors past it must look again
        self._paged_last = max(self._paged_last, env.seq)
        self.wake(env.message)

    def page_in(self) -> None:
        """Read the next paged-out messages into the (empty) window, in seq order, a
        chunk of up to PAGE_CHUNK."""
        assert self.pager is not None
        fill = min(self.window, PAGE_CHUNK)  # a chunk, not a whole large window: no pause
        while self.paged and len(self._list) < fill:
            envs, last = self.pager.page(self, self.high, fill - len(self._list))
            if last is None:  # nothing more after all: never loop on a wrong count
                self.paged = 0
                break
            self.high = last
            if self.skip:
                self.skip = {seq for seq in self.skip if seq > last}
            self.epoch += 1
            usage = self.usage
            for env in envs:
                self.paged -= 1
                if not env.stored:  # back in memory from the swap file
                    usage.count += 1
                    usage.bytes += env.size
                self._list.add((-env.message.priority, env.seq, env))
            self.pager.paged_in(envs)

    def push_back(self, envs: list[Envelope]) -> None:
        """Return unacknowledged messages to their old places."""
        self.epoch += 1
        for env in envs:
            env.owner = None
            self._list.add((-env.message.priority, env.seq, env))
        if envs:
            for _ in range(min(len(envs), len(self.waiters))):
                self.wake(envs[0].message)

    def check_consumers(self) -> None:
        """ResourceAllocationException when this queue has maxNumActiveConsumers plus
        maxNumBackupConsumers consumers already (an HA cluster's: on all its instances)."""
        active, backup = self.limits.max_num_active_consumers, self.limits.max_num_backup_consumers
        if active >= 0 and backup >= 0 and len(self.consumers) + self.elsewhere >= active + backup:
            elsewhere = f" ({self.elsewhere} on other instances of the HA cluster)" if self.elsewhere else ""
            raise ResourceAllocationException(
                f"{self.destination} has {len(self.consumers) + self.elsewhere} consumer(s){elsewhere}, "
                f"its maxNumActiveConsumers={active} "
                f"plus maxNumBackupConsumers={backup}: no more may be made"
            )

    def is_active(self, consumer: Any) -> bool:
        """May ``consumer`` receive: one of a queue's first max_num_active_consumers (the
        others are backups, in the order they came; an HA cluster's: cluster_active)?"""
        most = self.limits.max_num_active_consumers
        if most < 0 or self.topic is not None:
            return True
        ranked = self.cluster_active
        return consumer in (self.consumers[:most] if ranked is None else ranked)

    def wake(self, message: Message | None) -> None:
        """Wake the first active waiter that can take ``message`` (any message when None)."""
        waiters = self.waiters
        every = self.limits.max_num_active_consumers < 0
        for _ in range(len(waiters)):
            consumer = waiters.popleft()
            if consumer.can_take(message) and (every or self.is_active(consumer)):
                consumer.notify()
                return
            waiters.append(consumer)

    def wake_all(self) -> None:
        while self.waiters:
            self.waiters.popleft().notify()

    # --- taking --------------------------------------------------------------
    def take(
        self, selector: Selector | None, now_ms: int, on_expired: Callable[[Envelope], None], cursor: Any = None
    ) -> Envelope | None:
        """The next message for a consumer, dropping expired ones on the way.

        A selector consumer passes a ``cursor`` object: its ``scan`` attribute remembers
        (epoch, key) of the last message it skipped, so the next take starts after it
        unless something has since been put before it. Without that, a backlog of
        non-matching messages makes every receive walk the whole queue.
        """
        items = self._list
        if selector is None:
            while True:
                if not items:
                    if not self.paged:
                        return None
                    self.page_in()
                    if not items:
                        return None
                env = items.pop(0)[2]
                if env.message.expiration and env.expired(now_ms):
                    on_expired(env)
                    continue
                return env
        env = self._take_window(selector, now_ms, on_expired, cursor)
        if env is None and self.paged:
            env = self._take_paged(selector, now_ms, on_expired, cursor)
        return env

    def _take_window(
        self, selector: Selector, now_ms: int, on_expired: Callable[[Envelope], None], cursor: Any
    ) -> Envelope | None:
        items = self._list
        scan = getattr(cursor, "scan", None)
        i = items.bisect_right(scan[1]) if scan is not None and scan[0] == self.epoch else 0
        skipped = None
        try:
            while i < len(items):
                item = items[i]
                env = item[2]
                if env.expired(now_ms):
                    del items[i]
                    on_expired(env)
                elif selector.matches(env.message):
                    del items[i]
                    return env
                else:
                    skipped = item
                    i += 1
            return None
        finally:
            if cursor is not None:
                if skipped is not None:
                    cursor.scan = (self.epoch, skipped)
                elif scan is not None and scan[0] != self.epoch:
                    cursor.scan = None

    def _take_paged(
        self, selector: Selector, now_ms: int, on_expired: Callable[[Envelope], None], cursor: Any
    ) -> Envelope | None:
        """The first paged-out message ``selector`` matches, in seq order, read chunk by
        chunk; it stays in memory (``skip``) until acknowledged. The cursor's
        ``paged_scan`` (paged_epoch, seq) remembers what was read without a match."""
        assert self.pager is not None
        pos = self.high
        done = getattr(cursor, "paged_scan", None)
        if done is not None and done[0] == self.paged_epoch and done[1] > pos:
            pos = done[1]
        found = None
        while found is None and self.paged:
            envs, last = self.pager.page(self, pos, max(min(self.window, PAGE_CHUNK), 100))
            if last is None:
                break
            for env in envs:
                if env.expired(now_ms):
                    self.paged -= 1
                    self.pager.paged_in([env])
                    on_expired(env)
                elif selector.matches(env.message):
                    self.paged -= 1
                    self.pager.paged_in([env])
                    if env.stored:
                        self.skip.add(env.seq)
                    found, last = env, env.seq
                    break
            pos = last
        if cursor is not None:
            cursor.paged_scan = (self.paged_epoch, pos)
        return found

    def remove(self, env: Envelope) -> bool:
        item = (-env.message.priority, env.seq, env)
        if item in self._list:
            self._list.remove(item)
            return True
        return False

    def oldest(self) -> Envelope | None:
        """The waiting message with the smallest seq (REMOVE_OLDEST)."""
        if not self._list and self.paged:
            self.page_in()
        return min(self._list, key=lambda item: item[1])[2] if self._list else None

    def lowest_priority(self) -> Envelope | None:
        """The oldest waiting message of the lowest priority (REMOVE_LOW_PRIORITY): the
        first item of the last priority band in (-priority, seq) order."""
        if not self._list and self.paged:
            self.page_in()
        items = self._list
        if not items:
            return None
        return items[items.bisect_left((items[-1][0],))][2]

    def drain(self) -> list[Envelope]:
        """Empty the queue: the envelopes in memory (paged-out ones are only counted
        off; the caller purges their rows)."""
        envs = [item[2] for item in self._list]
        self._list = SortedList()
        if self.paged:
            assert self.pager is not None
            self.pager.drop(self)
            self.count -= self.paged
            self.dequeued += self.paged
            self.paged = self.swapped = 0
        return envs

    def browse(self) -> list[Envelope]:
        """Waiting messages in memory in delivery order (a snapshot; see ``browse_paged``)."""
        return [item[2] for item in self._list]

    def head(self, limit: int) -> list[Envelope]:
        """The first ``limit`` of :meth:`browse`, without copying the rest of the window."""
        return [item[2] for item in self._list.islice(0, limit)]

    def browse_paged(self, after: int, limit: int) -> tuple[list[Envelope], int | None]:
        """Stored messages after seq ``after`` (start at ``high``), for a browser: paged
        out, or paged in since the browser took its snapshot of the window."""
        if self.pager is None or (not self.paged and after >= self.high):
            return [], None
        return self.pager.page(self, after, limit)
