"""A link's outstanding asynchronous sends and their outcomes, in send order.

A link with a confirm window (imq.bridge.<name>.link.window > 1) sends
with MessageProducer.send_async(); add() gives each send a listener bound to a slot, in
send order. Listeners may be called from any thread and in any order (a provider's
reader thread, or the link's own during flush()); settled() hands the link the settled
prefix only: the slots from the oldest up to the first one still waiting, each with its
error (None: confirmed). So the link acknowledges a source message only after its send
and every send before it are settled, and handles each failure once, in order: a
listener called twice (a confused provider) changes nothing after the first call.
confirmed_head() lets a link whose window is full wait for the oldest send only and
acknowledge the confirmed head of its unit while the later sends are out.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Generic, TypeVar

from ..jms.errors import JMSException
from ..jms.message import Message

T = TypeVar("T")


class _Slot(Generic[T]):
    """One send_async(): its CompletionListener, the outcome once known."""

    __slots__ = ("error", "item", "settled", "window")

    def __init__(self, window: ConfirmWindow[T], item: T) -> None:
        self.window = window
        self.item = item
        self.settled = False
        self.error: JMSException | None = None

    def on_completion(self, message: Message) -> None:
        window = self.window
        with window._lock:  # (inline: a window settles a thousand of these per flush)
            if not self.settled:
                self.settled = True
                if window._waiting:
                    window._changed.notify_all()

    def on_exception(self, message: Message, exception: JMSException) -> None:
        self.window._settle(self, exception)


class ConfirmWindow(Generic[T]):
    """The outstanding sends of one producer, oldest first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # a plain lock: settling is the hot path
        self._changed = threading.Condition(self._lock)  # a slot settled (confirmed_head waits)
        self._waiting = 0  # threads in confirmed_head(): only then is a settle notified
        self.slots: deque[_Slot[T]] = deque()  # oldest first; others only read its len()

    def __len__(self) -> int:
        """Sends not yet handed back by settled() (settled or not)."""
        return len(self.slots)

    def add(self, item: T) -> _Slot[T]:
        """A listener for the next send of ``item`` (pass it to send_async)."""
        slot = _Slot(self, item)
        with self._lock:
            self.slots.append(slot)
        return slot

    def cancel(self, slot: _Slot[T]) -> None:
        """send_async() raised: that send never left, its listener is never called."""
        with self._lock:
            self.slots.remove(slot)

    def _settle(self, slot: _Slot[T], error: JMSException | None) -> None:
        with self._lock:
            if not slot.settled:
                slot.settled, slot.error = True, error
                if self._waiting:
                    self._changed.notify_all()

    def settled(self) -> list[tuple[T, JMSException | None]]:
        """Take the settled prefix, oldest first: (item, None) confirmed, (item, error)
        failed. Each send is handed back once."""
        out: list[tuple[T, JMSException | None]] = []
        with self._lock:
            slots = self.slots
            while slots and slots[0].settled:
                slot = slots.popleft()
                out.append((slot.item, slot.error))
        return out

    def confirmed_head(self, timeout: float) -> list[T]:
        """Wait (up to ``timeout`` s) until the oldest send is settled; then the items of
        the oldest sends that are confirmed, in order, without taking them (confirmed()
        does). Empty when the oldest is not settled in time, or failed."""
        with self._lock:
            slots = self.slots
            self._waiting += 1
            try:
                self._changed.wait_for(lambda: not slots or slots[0].settled, timeout)
            finally:
                self._waiting -= 1
            head = []
            for slot in slots:
                if not slot.settled or slot.error is not None:
                    break
                head.append(slot.item)
            return head

    def confirmed(self, count: int) -> None:
        """Take the ``count`` oldest sends (confirmed_head() gave them)."""
        with self._lock:
            for _ in range(count):
                self.slots.popleft()

    def unsettled(self) -> list[T]:
        """Take every send still waiting (after flush() returned: a provider that broke its
        promise), oldest first; the window is empty afterwards."""
        with self._lock:
            items = [slot.item for slot in self.slots]
            self.slots.clear()
        return items
