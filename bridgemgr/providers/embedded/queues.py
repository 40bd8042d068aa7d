"""Physical message queues of the embedded broker, and their limits.

How it works: every place messages wait is a :class:`MessageQueue` — a queue
destination, a durable subscription, a non-durable subscriber, a temporary queue.
Messages are :class:`Envelope` records in a sorted list keyed by (-priority, seq):
highest priority first, FIFO within a priority, and a message put back (recover,
rollback, a closed consumer) returns to its old place because it keeps its seq. A
consumer with a selector walks the list in that order to the first match.

Waiting consumers register in ``waiters``; each put wakes exactly one eligible waiter
(round robin over competing consumers, no lost wake-ups). Producers held by a full
FLOW_CONTROL queue register a callback in ``room_waiters``; a release that leaves room
calls them all (each tries again, and waits again if another took the room). Messages
that live only in memory (not in the store) are also counted in the broker's
:class:`SystemUsage`, for imq.system.max_count and max_size. All methods run under the
broker lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from typing import TYPE_CHECKING, Any

from sortedcontainers import SortedList

from ...jms.destination import Destination
from ...jms.message import Message

if TYPE_CHECKING:
    from ...jms.selector import Selector


class LimitBehavior(str, Enum):
    """What a full destination does with the next message (the broker chapter's four)."""

    FLOW_CONTROL = "FLOW_CONTROL"                # its producer waits until there is room
    REMOVE_OLDEST = "REMOVE_OLDEST"              # the oldest waiting message goes (to the DMQ)
    REJECT_NEWEST = "REJECT_NEWEST"              # the send fails
    REMOVE_LOW_PRIORITY = "REMOVE_LOW_PRIORITY"  # the lowest-priority, oldest waiting one goes


@dataclass(frozen=True)
class DestinationLimits:
    """The broker chapter's physical destination limits; -1 means unlimited."""

    max_num_msgs: int = -1
    max_total_msg_bytes: int = -1
    max_bytes_per_msg: int = -1
    limit_behavior: LimitBehavior = LimitBehavior.REJECT_NEWEST
    use_dmq: bool = True

    @cached_property
    def counts_bytes(self) -> bool:
        return self.max_total_msg_bytes >= 0 or self.max_bytes_per_msg >= 0

    @cached_property
    def unlimited(self) -> bool:
        return self.max_num_msgs < 0 and not self.counts_bytes


UNLIMITED = DestinationLimits()


class SystemUsage:
    """Messages the broker holds in memory only (not in the store), over all destinations,
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

    def __init__(self, seq: int, queue: MessageQueue, message: Message, stored: bool,
                 size: int, dcount: int = 0, blob: bytes | None = None,
                 wire: bytes | None = None) -> None:
        self.seq = seq
        self.queue = queue
        self.message = message          # the broker's snapshot; never handed out writable
        self.stored = stored            # has (or will have) a row in the store
        self.size = size                # bytes counted against limits (0 when not counted)
        self.dcount = dcount            # deliveries so far
        self.owner: Any = None          # the session holding it unacknowledged, or an XA branch
        self.blob = blob                # encoded form while it may still need writing
        self.wire = wire                # encoded form as a remote sender sent it (deliveries reuse it)

    @property
    def delivery_count(self) -> int:
        """Deliveries so far (a HostBroker Delivery's count)."""
        return self.dcount

    def expired(self, now_ms: int) -> bool:
        exp = self.message.expiration
        return bool(exp) and exp <= now_ms


class MessageQueue:
    """Messages waiting in one queue, subscription or temporary destination."""

    def __init__(self, key: str, destination: Destination, *, durable: bool,
                 limits: DestinationLimits = UNLIMITED, owner: Any = None,
                 selector: Selector | None = None, no_local: bool = False,
                 topic: Destination | None = None, usage: SystemUsage = NO_USAGE) -> None:
        self.key = key                  # store key: q:NAME, d:CLIENT\0NAME, or in-memory
        self.destination = destination  # what consumers see as JMSDestination
        self.durable = durable          # persistent messages get a row in the store
        self.limits = limits
        self.owner = owner              # owning connection (temporary destinations, subscribers)
        self.selector = selector        # subscription selector (topics filter at publish)
        self.no_local = no_local
        self.topic = topic              # the topic a subscription listens to
        self._list: SortedList = SortedList()  # of (-priority, seq, Envelope)
        self.count = 0                  # unacknowledged messages (queued + in flight)
        self.bytes = 0
        self.waiters: deque[Any] = deque()
        self.room_waiters: list[Callable[[], None]] = []  # producers held by FLOW_CONTROL
        self.usage = usage
        self.epoch = 0                  # bumped when a message lands before the end (see take)
        self.consumers: list[Any] = []
        self.deleted = False

    def __len__(self) -> int:
        return len(self._list)

    # --- putting -------------------------------------------------------------
    def admit(self, env: Envelope) -> None:
        """Account for a new message (limits are checked by the broker first)."""
        self.count += 1
        self.bytes += env.size
        if not env.stored:
            usage = self.usage
            usage.count += 1
            usage.bytes += env.size

    def release(self, env: Envelope) -> None:
        """Forget an acknowledged or removed message; held producers try again if that
        made room."""
        self.count -= 1
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
        return ((0 <= lim.max_num_msgs <= self.count)
                or (0 <= lim.max_total_msg_bytes < self.bytes + size))

    def wake_producers(self) -> None:
        """Let every held producer try again (room, new limits, or the queue is gone)."""
        waiters, self.room_waiters = self.room_waiters, []
        for callback in waiters:
            callback()

    def push(self, env: Envelope) -> None:
        item = (-env.message.priority, env.seq, env)
        items = self._list
        if items and item < items[-1]:
            self.epoch += 1
        items.add(item)
        self.wake(env.message)

    def push_back(self, envs: list[Envelope]) -> None:
        """Return unacknowledged messages to their old places."""
        self.epoch += 1
        for env in envs:
            env.owner = None
            self._list.add((-env.message.priority, env.seq, env))
        if envs:
            for _ in range(min(len(envs), len(self.waiters))):
                self.wake(envs[0].message)

    def wake(self, message: Message | None) -> None:
        """Wake the first waiter that can take ``message`` (any message when None)."""
        waiters = self.waiters
        for _ in range(len(waiters)):
            consumer = waiters.popleft()
            if consumer.can_take(message):
                consumer.notify()
                return
            waiters.append(consumer)

    def wake_all(self) -> None:
        while self.waiters:
            self.waiters.popleft().notify()

    # --- taking --------------------------------------------------------------
    def take(self, selector: Selector | None, now_ms: int,
             on_expired: Callable[[Envelope], None], cursor: Any = None) -> Envelope | None:
        """The next message for a consumer, dropping expired ones on the way.

        A selector consumer passes a ``cursor`` object: its ``scan`` attribute remembers
        (epoch, key) of the last message it skipped, so the next take starts after it
        unless something has since been put before it. Without that, a backlog of
        non-matching messages makes every receive walk the whole queue.
        """
        items = self._list
        if selector is None:
            while items:
                env = items.pop(0)[2]
                if env.message.expiration and env.expired(now_ms):
                    on_expired(env)
                    continue
                return env
            return None
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

    def remove(self, env: Envelope) -> bool:
        item = (-env.message.priority, env.seq, env)
        if item in self._list:
            self._list.remove(item)
            return True
        return False

    def oldest(self) -> Envelope | None:
        """The waiting message with the smallest seq (REMOVE_OLDEST)."""
        return min(self._list, key=lambda item: item[1])[2] if self._list else None

    def lowest_priority(self) -> Envelope | None:
        """The oldest waiting message of the lowest priority (REMOVE_LOW_PRIORITY): the
        first item of the last priority band in (-priority, seq) order."""
        items = self._list
        if not items:
            return None
        return items[items.bisect_left((items[-1][0],))][2]

    def drain(self) -> list[Envelope]:
        envs = [item[2] for item in self._list]
        self._list = SortedList()
        return envs

    def browse(self) -> list[Envelope]:
        """Waiting messages in delivery order (a snapshot)."""
        return [item[2] for item in self._list]
