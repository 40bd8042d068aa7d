"""What a link's completions made final: now, or behind the link.

A completed unit's messages count once they are final (transferred, or
consumed only; an INFO line per transfer when log-message-transfer is on; a transfer's
latency runs from its receipt to here). A unit whose
completion was handed over (TransferTransaction.complete() False: the XA completer commits
it behind the link, bridgemgr/xa/completer.py) waits in `units`, in order, until the link
takes the outcomes: a committed unit counts; one rolled back behind a failed one comes
back from the source (Batch.returned); the failed one is returned to the link, which
sends it to the DMQ (the chapter's commit failure). After a failure every unit handed
over later was rolled back by the completer: settle() takes them all, then resets the
transaction so that later units complete again. When the failure was an outage (the XA
log's database down), those units are excused (Batch.returned with the failure as their
cause): it was not their messages' fault.
"""

from __future__ import annotations

import logging
import time
from collections import deque

from ..jms.message import HEADER_FIELDS
from ..logfiles import PER_MESSAGE
from .batch import Batch
from .counters import LinkCounters
from .pipeline import Action, ProcessingContext
from .transfer import TransferTransaction

_DESTINATION = HEADER_FIELDS.index("destination")
_MESSAGE_ID = HEADER_FIELDS.index("message_id")

Failed = tuple[list[ProcessingContext], BaseException]


def now_ms() -> int:
    return int(time.time() * 1000)


class Settler:
    """Counts a link's completed units and takes the outcomes of those completing behind it."""

    def __init__(self, batch: Batch, counters: LinkCounters, log: logging.Logger, link_name: str) -> None:
        self.batch = batch
        self.counters = counters
        self.log = log
        self.link_name = link_name
        self.log_transfers = False  # an INFO line per transfer (decided when connecting)
        self.units: deque[list[ProcessingContext]] = deque()  # handed over, in order

    def handed_over(self, unit: list[ProcessingContext]) -> None:
        """``unit``'s completion becomes final behind the link (a copy is kept)."""
        self.units.append(list(unit))

    def count(self, unit: list[ProcessingContext]) -> None:
        """``unit`` is final: count its messages, then clear it."""
        counters = self.counters
        transfer = Action.TRANSFER
        received = [ctx.now for ctx in unit if ctx.action is transfer]
        if received:
            counters.transferred_unit(len(received), received, now_ms())
        for ctx in unit:
            if ctx.action is transfer:
                if self.log_transfers:
                    self.log.info(
                        "link %s: transferred message %s from %s to %s",
                        self.link_name,
                        ctx.headers[_MESSAGE_ID],
                        ctx.headers[_DESTINATION],
                        ctx.destination,
                        extra=PER_MESSAGE,
                    )
            elif ctx.action is Action.CONSUME:
                counters.consumed_only += 1
        self.batch.final(unit)
        unit.clear()

    def settle(self, txn: TransferTransaction, wait: bool = False) -> Failed | None:
        """Take the outcomes so far (``wait``: of every unit handed over) and count the
        committed units. The first failed unit and its error, once every unit after it
        came back and ``txn`` was reset; None when none failed. The units rolled back
        behind it come back with its error as their cause (an outage excuses them)."""
        failed: Failed | None = None
        behind: list[list[ProcessingContext]] = []
        for outcome in txn.outcomes(wait):
            unit = self.units.popleft()
            if outcome.error is None:
                self.count(unit)
            elif outcome.behind:
                behind.append(unit)
            else:
                failed = (unit, outcome.error)
        if failed is not None:  # the rest: all rolled back behind it
            behind.extend(self.units.popleft() for _ in txn.outcomes(wait=True))
        for unit in behind:
            self.batch.returned(unit, failed[1] if failed is not None else None)
        if failed is not None:
            txn.reset()
        return failed

    def closed(self, txn: TransferTransaction | None) -> None:
        """The link disconnects, ``txn`` closed (every unit handed over ended): count or
        return each unit (excused where its failure was an outage)."""
        for outcome in txn.outcomes() if txn is not None else ():
            unit = self.units.popleft()
            if outcome.error is None:
                self.count(unit)
            else:  # rolled back: the messages come back from the source
                self.batch.returned(unit, outcome.error)
        self.units.clear()
