"""The unit of work a link is filling: its messages, when it is full, what came back.

The link (link.py) appends each handled message to `pending` and completes the unit when it
is full: `size` messages, or messages holding `max_bytes` bytes (link.windowBytes), or one
at a time while `one_by_one` runs after a unit was undone (back_out()), so only the failing
message is backed out again. `lettered` remembers dead messages already in a DMQ (consumed
without a second copy when they come back); `excused` counts the undone units per message
that were an outage's fault (excuses.outage()), which the backout threshold does not count.

Rules: every undone unit comes back through returned() with its cause; excuses are kept
until the message's unit is final (final()), on disk or in the cluster's database
(excuses.py).

Design notes: docs/jms-bridges.md#internals-jmsbridgebatchpy.
"""

from __future__ import annotations

from typing import SupportsIndex

from ..jms.message import HEADER_FIELDS
from .counters import LinkCounters
from .excuses import Excuses, outage
from .pipeline import Action, ProcessingContext

_MESSAGE_ID = HEADER_FIELDS.index("message_id")


class Unit(list[ProcessingContext]):
    """A unit's messages in order and the bytes they hold (ProcessingContext.size), kept
    by the changes a link makes: append, clear and del (its confirmed head)."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def append(self, ctx: ProcessingContext) -> None:
        super().append(ctx)
        self.bytes += ctx.size

    def clear(self) -> None:
        super().clear()
        self.bytes = 0

    def __delitem__(self, index: SupportsIndex | slice) -> None:
        if isinstance(index, slice):
            self.bytes -= sum(ctx.size for ctx in self[index])
        else:
            self.bytes -= self[index].size
        super().__delitem__(index)


class Batch:
    """The handled messages of a link's open unit of work and what outlives a rollback."""

    def __init__(self, size: int, counters: LinkCounters, excused: Excuses | None = None, max_bytes: int = -1) -> None:
        """``max_bytes``: the bytes that fill a unit however few its messages (0 or -1: no
        bound; kept as 0, as prefetch_at_least takes it)."""
        self.size = max(1, size)
        self.max_bytes = max(max_bytes, 0)
        self.counters = counters
        self.pending = Unit()
        self.open = False  # the transaction's begin() was called, its unit not ended
        self.one_by_one = 0  # messages still to move one per transaction
        self.lettered: set[str] = set()  # ids of dead messages in a DMQ that come back
        self.excused = excused if excused is not None else Excuses()  # id -> its redeliveries that were not its fault

    def restart(self) -> None:
        """The link starts: nothing pending; of what was remembered, the excuses only."""
        self.pending.clear()
        self.open = False
        self.one_by_one = 0
        self.lettered = set()
        self.excused.load()

    def full(self) -> bool:
        """Whether the unit is to be completed now."""
        pending = self.pending
        return len(pending) >= self.size or self.bytes_reached(pending) or self.one_by_one > 0

    def bytes_reached(self, unit: Unit) -> bool:
        """Whether ``unit`` holds max_bytes (never without a bound)."""
        return 0 < self.max_bytes <= unit.bytes

    def completed(self) -> None:
        """The pending messages were completed (before they are counted or handed over)."""
        if self.one_by_one:
            self.one_by_one = max(self.one_by_one - len(self.pending), 0)

    def back_out(self, unit: list[ProcessingContext]) -> None:
        """``unit`` is undone because of one of its messages: what comes back moves one
        per transaction."""
        self.one_by_one = max(self.one_by_one, len(unit))

    def undone(self, unit: list[ProcessingContext], cause: BaseException | None = None) -> None:
        """``unit`` (the pending messages, or a unit that failed behind the link) is aborted
        with the open one: its messages come back from the source (see returned())."""
        self.returned(unit, cause)
        unit.clear()
        self.open = False

    def returned(self, unit: list[ProcessingContext], cause: BaseException | None = None) -> None:
        """A unit was undone because of ``cause``: its messages come back from the source;
        when ``cause`` is an outage they are excused (it does not count toward the backout
        threshold); those of them already in a DMQ must not go there twice."""
        if cause is not None and outage(cause):
            self.excuse(unit)
        self.counters.rolled_back += len(unit)
        self.lettered.update(
            ctx.headers[_MESSAGE_ID] for ctx in unit if ctx.action is Action.DEAD and ctx.headers[_MESSAGE_ID]
        )

    def final(self, unit: list[ProcessingContext]) -> None:
        """``unit`` is final (committed or acknowledged: its messages do not come back):
        their excused redeliveries are forgotten. Not before: a unit completing behind the
        link may still be rolled back, and its messages' delivery counts keep every
        rollback excused so far."""
        if self.excused:
            self.excused.forget(ctx.headers[_MESSAGE_ID] for ctx in unit)

    def excuse(self, unit: list[ProcessingContext]) -> None:
        """``unit`` is undone through no fault of its messages (a database outage): their
        coming back does not count toward the backout threshold."""
        self.excused.add(ctx.headers[_MESSAGE_ID] for ctx in unit)

    def excuse_id(self, message_id: str) -> None:
        """One coming back of message ``message_id`` (taken into a unit undone through no
        fault of its messages, before it was handled) does not count either."""
        self.excused.add((message_id,))

    def in_dmq_already(self, message_id: str) -> bool:
        """Whether a dead message came back from an undone unit after it went to a DMQ
        (it is remembered once: a later copy of it is a new dead message)."""
        if message_id in self.lettered:
            self.lettered.discard(message_id)
            return True
        return False
