# How it works: each link thread is the only writer of its LinkCounters (plain int
# fields, so an update costs an attribute increment); readers (the admin `list`, metrics)
# take snapshot(), a plain dict, which may lag a message behind but never tears a value.
"""Per-link counters: received, transferred, to the DMQ (per reason), last error."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class LinkCounters:
    received: int = 0        # taken from the source
    transferred: int = 0     # sent to the target and consumed from the source
    consumed_only: int = 0   # consumed without a transfer (the transformer's no_transfer)
    to_dmq: int = 0          # given to a DMQ (or, when none took it, to the final log)
    dmq_lost: int = 0        # of those: no DMQ took it, only the final log line has it
    redelivered: int = 0     # received with JMSRedelivered set
    rolled_back: int = 0     # messages returned to the source (recover / rollback)
    reconnects: int = 0
    dmq_reasons: Counter[str] = field(default_factory=Counter)
    last_error: str | None = None
    last_error_at: float | None = None  # time.time()

    def error(self, text: str) -> None:
        self.last_error = text
        self.last_error_at = time.time()

    def dead(self, reason: str, taken: bool) -> None:
        self.to_dmq += 1
        self.dmq_reasons[reason] += 1
        if not taken:
            self.dmq_lost += 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "received": self.received, "transferred": self.transferred,
            "consumed_only": self.consumed_only, "to_dmq": self.to_dmq,
            "dmq_lost": self.dmq_lost, "redelivered": self.redelivered,
            "rolled_back": self.rolled_back, "reconnects": self.reconnects,
            "dmq_reasons": dict(self.dmq_reasons), "last_error": self.last_error,
            "last_error_at": self.last_error_at,
        }
