"""The embedded broker's memory states: green, yellow, orange, red, and the producer
batches each allows.

How it works: the memory in use is this process's resident set (RSS, from
``/proc/self/statm``) as a percent of a budget: imq.system.max_memory if set, else the
cgroup's memory limit, else the machine's MemTotal. The state is the highest whose
imq.<state>.threshold that percent has reached. A producer may send imq.<state>.count
messages per batch; a batch ends at each sample. Samples are cheap and rare: at start,
every ``SAMPLE_EVERY`` sends (at most every ``MIN_INTERVAL`` s), at a send when the last
is older than ``MAX_INTERVAL`` s, when a producer has used its
batch in green, and every ``TICK`` s from a timer thread while the state is not green or
producers are held (red's count is 0: they are held until the state drops, and the
timer is what sees it drop). A state change is logged. Callbacks of held producers run
after the next sample; they only post or set an event (the broker lock may be held).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

STATES = ("green", "yellow", "orange", "red")
SAMPLE_EVERY = 1000  # sends between samples
MIN_INTERVAL = 0.01  # s: no two samples closer than this when sends trigger them
MAX_INTERVAL = 1.0  # s: a send samples when the last sample is older than this
TICK = 0.1  # s: the timer's sampling period while not green or producers wait


@dataclass(frozen=True)
class MemoryConfig:
    """imq.<state>.threshold (percent of the budget) and imq.<state>.count (messages per
    batch), green to red; budget in bytes (0: the cgroup limit or MemTotal)."""

    thresholds: tuple[int, int, int, int] = (0, 80, 90, 98)
    counts: tuple[int, int, int, int] = (5000, 500, 50, 0)
    budget: int = 0


def memory_total() -> int:
    """The machine's memory (MemTotal), or 0 when /proc/meminfo cannot tell."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def cgroup_limit() -> int:
    """This process's cgroup memory limit (v2 memory.max, v1 limit_in_bytes), 0: none."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # v1 writes a huge number for "none"
            return int(text)
    return 0


def default_budget() -> int:
    """What the broker's memory is measured against when imq.system.max_memory is unset."""
    total = memory_total()
    limit = cgroup_limit()
    return min(limit, total) if limit and total else (limit or total)


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss() -> int:
    """This process's resident set in bytes (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


class MemoryMonitor:
    """The broker's memory state and the producers' batches (thread-safe)."""

    def __init__(self, config: MemoryConfig, measure: Callable[[], int] = rss) -> None:
        self.config = config
        self.budget = config.budget or default_budget()
        self.measure = measure
        self.state = 0  # index into STATES
        self.batch = config.counts[0]
        self.percent = 0.0
        self._lock = threading.Lock()
        self._sent: dict[int, int] = {}  # id(producer) -> messages sent in this batch
        self._sends = 0
        self._last = 0.0
        self._held: list[Callable[[], None]] = []
        self._timer: threading.Thread | None = None
        self.closed = False
        self.sample()  # the state at start

    @property
    def state_name(self) -> str:
        return STATES[self.state]

    def admit(self, producer: object) -> bool:
        """May ``producer`` send one more message now? False: it is held until the next
        sample (``on_sample``)."""
        key = id(producer)
        with self._lock:
            self._sends += 1
            since = time.monotonic() - self._last
            if (self._sends >= SAMPLE_EVERY and since >= MIN_INTERVAL) or since >= MAX_INTERVAL:
                self._sample()
            sent = self._sent.get(key, 0)
            if sent >= self.batch and self.state == 0 and time.monotonic() - self._last >= MIN_INTERVAL:
                self._sample()  # green: a used batch only asks for a fresh look
                sent = self._sent.get(key, 0)
            if sent >= self.batch:
                self._start_timer()
                return False
            self._sent[key] = sent + 1
            return True

    def on_sample(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` after the next sample (a held producer tries again then)."""
        with self._lock:
            if self.closed:
                callback()
                return
            self._held.append(callback)
            self._start_timer()

    def sample(self) -> None:
        with self._lock:
            self._sample()

    def close(self) -> None:
        """Stop the timer; held producers try again (and find the broker closed)."""
        with self._lock:
            self.closed = True
            held, self._held = self._held, []
        for callback in held:
            callback()

    def _sample(self) -> None:
        self._last = time.monotonic()
        self._sends = 0
        self._sent.clear()
        used = self.measure()
        self.percent = 100.0 * used / self.budget if self.budget else 0.0
        state = max((i for i, threshold in enumerate(self.config.thresholds) if self.percent >= threshold), default=0)
        if state != self.state:
            level = logging.WARNING if state > self.state else logging.INFO
            log.log(
                level,
                "memory state %s -> %s: %d MB in use, %.0f%% of %d MB (producers may send %d messages per batch)",
                STATES[self.state],
                STATES[state],
                used >> 20,
                self.percent,
                self.budget >> 20,
                self.config.counts[state],
            )
            self.state = state
            self.batch = self.config.counts[state]
        held, self._held = self._held, []
        for callback in held:
            callback()

    def _start_timer(self) -> None:
        if self._timer is None and not self.closed:
            self._timer = threading.Thread(target=self._tick, name="broker-memory", daemon=True)
            self._timer.start()

    def _tick(self) -> None:
        """Sample every TICK s while not green or producers are held, then stop."""
        while True:
            time.sleep(TICK)
            with self._lock:
                if self.closed:
                    self._timer = None
                    return
                self._sample()
                if self.state == 0 and not self._held:
                    self._timer = None
                    return
