"""Physical message queues of the embedded broker, and their limits.

How it works: every place messages wait is a :class:`MessageQueue` — a queue
destination, a durable subscription, a non-durable subscriber, a temporary queue.
Messages are :class:`Envelope` records in a heap ordered by (-priority, seq): highest
priority first, FIFO within a priority, and a message put back (recover, rollback,
a closed consumer) returns to its old place because it keeps its seq.

Waiting consumers register in ``waiters``; each put wakes exactly one eligible waiter
(round robin over competing consumers, no lost wake-ups). All methods run under the
broker lock.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Callable, Iterator

from ...jms.destination import Destination
from ...jms.message import Message

if TYPE_CHECKING:
    from ...jms.selector import Selector


class LimitBehavior(str, Enum):
    REJECT_NEWEST = "REJECT_NEWEST"
    REMOVE_OLDEST = "REMOVE_OLDEST"


@dataclass(frozen=True)
class DestinationLimits:
    """The broker chapter's physical destination limits; -1 means unlimited."""

    max_num_msgs: int = -1
    max_total_msg_bytes: int = -1
    max_bytes_per_msg: int = -1
    limit_behavior: LimitBehavior = LimitBehavior.REJECT_NEWEST
    use_dmq: bool = True

    @property
    def counts_bytes(self) -> bool:
        return self.max_total_msg_bytes >= 0 or self.max_bytes_per_msg >= 0

    @property
    def unlimited(self) -> bool:
        return self.max_num_msgs < 0 and not self.counts_bytes


UNLIMITED = DestinationLimits()


class Envelope:
    """The broker's record of one message in one queue."""

    __slots__ = ("seq", "queue", "message", "stored", "size", "dcount", "owner", "blob")

    def __init__(self, seq: int, queue: "MessageQueue", message: Message, stored: bool,
                 size: int, dcount: int = 0, blob: bytes | None = None) -> None:
        self.seq = seq
        self.queue = queue
        self.message = message          # the broker's snapshot; never handed out writable
        self.stored = stored            # has (or will have) a row in the store
        self.size = size                # bytes counted against limits (0 when not counted)
        self.dcount = dcount            # deliveries so far
        self.owner: Any = None          # the session holding it unacknowledged, or an XA branch
        self.blob = blob                # encoded form while it may still need writing

    def expired(self, now_ms: int) -> bool:
        exp = self.message.expiration
        return bool(exp) and exp <= now_ms


class MessageQueue:
    """Messages waiting in one queue, subscription or temporary destination."""

    def __init__(self, key: str, destination: Destination, *, durable: bool,
                 limits: DestinationLimits = UNLIMITED, owner: Any = None,
                 selector: "Selector | None" = None, no_local: bool = False,
                 topic: Destination | None = None) -> None:
        self.key = key                  # store key: q:NAME, d:CLIENT\0NAME, or in-memory
        self.destination = destination  # what consumers see as JMSDestination
        self.durable = durable          # persistent messages get a row in the store
        self.limits = limits
        self.owner = owner              # owning connection (temporary destinations, subscribers)
        self.selector = selector        # subscription selector (topics filter at publish)
        self.no_local = no_local
        self.topic = topic              # the topic a subscription listens to
        self._heap: list[tuple[int, int, Envelope]] = []
        self.count = 0                  # unacknowledged messages (queued + in flight)
        self.bytes = 0
        self.waiters: deque[Any] = deque()
        self.consumers: list[Any] = []
        self.deleted = False

    def __len__(self) -> int:
        return len(self._heap)

    # --- putting -------------------------------------------------------------
    def admit(self, env: Envelope) -> None:
        """Account for a new message (limits are checked by the broker first)."""
        self.count += 1
        self.bytes += env.size

    def release(self, env: Envelope) -> None:
        """Forget an acknowledged or removed message."""
        self.count -= 1
        self.bytes -= env.size

    def push(self, env: Envelope) -> None:
        heapq.heappush(self._heap, (-env.message.priority, env.seq, env))
        self.wake(env.message)

    def push_back(self, envs: list[Envelope]) -> None:
        """Return unacknowledged messages to their old places."""
        for env in envs:
            env.owner = None
            heapq.heappush(self._heap, (-env.message.priority, env.seq, env))
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
    def take(self, selector: "Selector | None", now_ms: int,
             on_expired: Callable[[Envelope], None]) -> Envelope | None:
        """The next message for a consumer, dropping expired ones on the way."""
        heap = self._heap
        if selector is None:
            while heap:
                env = heapq.heappop(heap)[2]
                if env.message.expiration and env.expired(now_ms):
                    on_expired(env)
                    continue
                return env
            return None
        for item in sorted(heap):
            env = item[2]
            if env.expired(now_ms):
                self._remove_item(item)
                on_expired(env)
            elif selector.matches(env.message):
                self._remove_item(item)
                return env
        return None

    def _remove_item(self, item: tuple[int, int, Envelope]) -> None:
        heap = self._heap
        i = heap.index(item)
        heap[i] = heap[-1]
        heap.pop()
        if i < len(heap):
            heapq.heapify(heap)

    def remove(self, env: Envelope) -> bool:
        item = (-env.message.priority, env.seq, env)
        try:
            self._remove_item(item)
        except ValueError:
            return False
        return True

    def oldest(self) -> Envelope | None:
        """The waiting message with the smallest seq (REMOVE_OLDEST)."""
        return min(self._heap, key=lambda item: item[1])[2] if self._heap else None

    def drain(self) -> list[Envelope]:
        envs = [item[2] for item in self._heap]
        self._heap = []
        return envs

    def browse(self) -> Iterator[Envelope]:
        """Waiting messages in delivery order (a snapshot)."""
        for item in sorted(self._heap):
            yield item[2]
