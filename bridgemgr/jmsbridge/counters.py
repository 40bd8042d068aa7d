"""Per-link counters: received, transferred, to the DMQ (per reason), last error,
latency histogram and rate.

The Settler calls transferred_unit() per completed unit: last transfer time, the one-minute
rate and each message's transfer latency into fixed histogram buckets. last_error names
the latest DMQ reason with its count; current_error is what keeps the link from moving now,
cleared (and last_error with it when that is the same trouble) once it is connected again.

Rules: each link thread is the only writer of its LinkCounters (plain ints); readers take
snapshot(), which never tears a value nor changes the counters; a runner whose counters
several threads write uses SharedCounters (every write under its lock). LinkHistory keeps
the last hour of a link's snapshots (whatever its runner) in a fixed ring.

Design notes: docs/jms-bridges.md#internals-jmsbridgecounterspy.
"""

from __future__ import annotations

import threading
import time
from array import array
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

# Transfer latency bucket bounds (ms; Prometheus "le"), and the rate's window (s).
LATENCY_BOUNDS_MS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
RATE_WINDOW = 60
# A link's history: one sample of its counters every HISTORY_STEP seconds, an hour of them.
HISTORY_STEP = 5.0
HISTORY_SPAN = 3600.0


@dataclass
class LinkCounters:
    received: int = 0  # taken from the source
    transferred: int = 0  # sent to the target and consumed from the source
    consumed_only: int = 0  # consumed without a transfer (the transformer's no_transfer)
    to_dmq: int = 0  # given to a DMQ (or, when none took it, to the final log)
    dmq_lost: int = 0  # of those: no DMQ took it, only the final log line has it
    redelivered: int = 0  # received with JMSRedelivered set
    rolled_back: int = 0  # messages returned to the source (recover / rollback)
    reconnects: int = 0
    dmq_reasons: Counter[str] = field(default_factory=Counter)
    last_error: str | None = None
    last_error_at: float | None = None  # time.time()
    current_error: str | None = None  # what keeps the link from moving now (None: nothing)
    last_transfer_at: float | None = None  # time.time() of the last completed transfer
    # transfer latency: counts per LATENCY_BOUNDS_MS bucket (the last: above them all), sum
    latency_buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BOUNDS_MS) + 1))
    latency_sum_ms: int = 0
    # transfers per second of the last RATE_WINDOW seconds: slot i holds second _seconds[i]
    _per_second: list[int] = field(default_factory=lambda: [0] * RATE_WINDOW, repr=False)
    _seconds: list[int] = field(default_factory=lambda: [0] * RATE_WINDOW, repr=False)

    def error(self, text: str) -> None:
        self.last_error = text
        self.last_error_at = time.time()

    def trouble(self, text: str) -> None:
        """An error that holds until the link is connected again (current_error)."""
        self.error(text)
        self.current_error = text

    def resolved(self) -> None:
        """The link is connected again: no current error, and no last error either when
        that was the trouble just passed (a DMQ reason or a failure since then stays)."""
        if self.current_error is not None and self.last_error == self.current_error:
            self.last_error = self.last_error_at = None
        self.current_error = None

    def dead(self, reason: str, taken: bool, why: str | None = None) -> None:
        self.to_dmq += 1
        self.dmq_reasons[reason] += 1
        if not taken:
            self.dmq_lost += 1
        times = self.dmq_reasons[reason]
        self.error(f"{reason}: {why or 'sent to the DMQ'} ({times} time{'s' if times != 1 else ''})")

    def transferred_unit(self, count: int, received_ms: list[int], now_ms: int) -> None:
        """``count`` messages of a completed unit were transferred; ``received_ms``: when
        each was received (ms since the epoch), ``now_ms``: now."""
        self.transferred += count
        now = now_ms / 1000.0
        self.last_transfer_at = now
        second = int(now)
        slot = second % RATE_WINDOW
        if self._seconds[slot] != second:
            self._seconds[slot] = second
            self._per_second[slot] = 0
        self._per_second[slot] += count
        buckets = self.latency_buckets
        total = 0
        for received in received_ms:
            ms = now_ms - received
            total += ms
            buckets[bisect_left(LATENCY_BOUNDS_MS, ms)] += 1
        self.latency_sum_ms += total

    def rate(self, now: float | None = None) -> float:
        """Transfers per second over the last RATE_WINDOW seconds."""
        second = int(time.time() if now is None else now)
        recent = sum(n for n, s in zip(self._per_second, self._seconds) if 0 <= second - s < RATE_WINDOW)
        return recent / RATE_WINDOW

    def snapshot(self) -> dict[str, Any]:
        return {
            "received": self.received,
            "transferred": self.transferred,
            "consumed_only": self.consumed_only,
            "to_dmq": self.to_dmq,
            "dmq_lost": self.dmq_lost,
            "redelivered": self.redelivered,
            "rolled_back": self.rolled_back,
            "reconnects": self.reconnects,
            "dmq_reasons": dict(self.dmq_reasons),
            "last_error": self.last_error,
            "current_error": self.current_error,
            "last_error_at": self.last_error_at,
            "last_transfer_at": self.last_transfer_at,
            "rate": round(self.rate(), 3),
            "latency_ms": {
                "bounds": list(LATENCY_BOUNDS_MS),
                "buckets": list(self.latency_buckets),
                "sum": self.latency_sum_ms,
            },
        }


class SharedCounters(LinkCounters):
    """Counters that more than one thread writes: every write (here and in subclasses)
    and snapshot() take ``lock``."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.RLock()

    def error(self, text: str) -> None:
        with self.lock:
            super().error(text)

    def trouble(self, text: str) -> None:
        with self.lock:
            super().trouble(text)

    def resolved(self) -> None:
        with self.lock:
            super().resolved()

    def restarted(self, text: str) -> None:
        """The runner started a failed part again (a worker, a query): one reconnect and
        its error."""
        with self.lock:
            self.reconnects += 1
            super().error(text)

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return super().snapshot()


class LinkHistory:
    """The last HISTORY_SPAN seconds of a link: its counters sampled every ``step``
    seconds into a ring of doubles allocated once (memory does not grow with uptime: 23 KB
    for an hour of 5-second samples), given as intervals of transfers per second and mean
    transfer latency."""

    FIELDS = 4  # time.time(), transferred, latency sum ms, latency count

    def __init__(self, step: float = HISTORY_STEP, span: float = HISTORY_SPAN) -> None:
        self.step = step
        self.size = int(span / step) + 1  # samples: one more than the intervals
        self._ring = array("d", bytes(8 * self.FIELDS * self.size))
        self._count = 0  # samples taken so far (the newest is at (count - 1) % size)
        self._lock = threading.Lock()

    def due(self, now: float) -> bool:
        with self._lock:
            return self._count == 0 or now - self._ring[((self._count - 1) % self.size) * self.FIELDS] >= self.step

    def sample(self, snapshot: dict[str, Any], now: float) -> None:
        """Record a counters snapshot (LinkCounters.snapshot()) taken at ``now``."""
        latency = snapshot["latency_ms"]
        with self._lock:
            at = (self._count % self.size) * self.FIELDS
            self._ring[at : at + self.FIELDS] = array(
                "d", (now, snapshot["transferred"], latency["sum"], sum(latency["buckets"]))
            )
            self._count += 1

    def _samples(self) -> list[tuple[float, ...]]:
        with self._lock:
            ring, count = self._ring.tolist(), self._count
        first = max(0, count - self.size)
        return [
            tuple(ring[(i % self.size) * self.FIELDS : (i % self.size + 1) * self.FIELDS]) for i in range(first, count)
        ]

    def intervals(self) -> list[dict[str, Any]]:
        """Oldest first: ``end`` (seconds since the epoch), ``seconds``, ``transferred``,
        ``rate`` (msg/s) and ``latency_ms`` (the mean of the interval's transfers, None
        without any); counters that went back (a restart with new ones) count from zero."""
        out = []
        for (t0, n0, s0, c0), (t1, n1, s1, c1) in pairwise(self._samples()):
            if n1 < n0 or c1 < c0:
                n0 = s0 = c0 = 0
            seconds = max(t1 - t0, 1e-3)
            out.append(
                {
                    "end": round(t1, 3),
                    "seconds": round(seconds, 3),
                    "transferred": int(n1 - n0),
                    "rate": round((n1 - n0) / seconds, 3),
                    "latency_ms": round((s1 - s0) / (c1 - c0), 3) if c1 > c0 else None,
                }
            )
        return out
