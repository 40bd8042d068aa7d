"""Progress of a drain or a DMQ archive on stderr: a line rewritten in place, or plain lines.

A long job (drain, dmq archive) calls Progress.update(count) as it goes and
Progress.finish() at the end. On a terminal the progress is one line rewritten in place
(carriage return, erase to the end of the line) at most once per ``tick``: a bar and
percentage when the backlog is known, the count, the rate since the start and the ETA (what
is left at that rate). Elsewhere (a pipe, a log file) it is a plain line at most every
``every`` seconds and a last one at the end, so a log gets a few lines, not one per chunk.
When the backlog is unknown (a provider that cannot tell), count, rate and time only. More
messages than the backlog (they kept coming): the total grows with the count.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

BAR = 24  # characters of the bar between its brackets


def duration(seconds: float) -> str:
    """m:ss, or h:mm:ss from an hour up."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """The progress of one job over ``total`` messages (None: unknown) on ``stream``."""

    def __init__(
        self,
        what: str,
        total: int | None,
        stream: TextIO | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        tick: float = 1.0,
        every: float = 10.0,
    ) -> None:
        self.what = what
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.clock = clock
        self.tick, self.every = tick, every
        self.start = clock()
        self._shown_at: float | None = None  # when the last line was written
        self._shown = 0  # the count it showed (a pipe gets no line while nothing moved)
        self._done = 0
        self._note = ""

    def update(self, done: int, note: str = "") -> None:
        """``done`` messages so far (``note``: e.g. the batch); written when it is time."""
        self._done, self._note = done, note
        now = self.clock()
        if self.tty:
            due = self._shown_at is None or now - self._shown_at >= self.tick
        else:  # a plain line when something moved, at most every ``every`` s
            last = self.start if self._shown_at is None else self._shown_at
            due = done != self._shown and now - last >= self.every
        if due:
            self._write(now)

    def finish(self) -> None:
        """The last line (on a terminal: ended, so what follows starts on a new line)."""
        if self.tty:
            self._write(self.clock())
            self.stream.write("\n")
        elif self._done != self._shown:
            self._write(self.clock())
        self.stream.flush()

    def line(self, done: int, elapsed: float) -> str:
        """What the progress says after ``done`` messages in ``elapsed`` seconds."""
        rate = done / elapsed if elapsed > 0 else 0.0
        note = f" {self._note}" if self._note else ""
        if self.total is None:
            return f"{self.what}{note}: {done:,} messages, {rate:,.0f} msg/s, {duration(elapsed)}"
        total = max(self.total, done)
        share = done / total if total else 1.0
        left = total - done
        eta = duration(left / rate) if rate > 0 else "?" if left else duration(0)
        if self.tty:
            filled = round(share * BAR)
            return (
                f"{self.what}{note} [{'#' * filled}{'.' * (BAR - filled)}] {share:4.0%} "
                f"{done:,}/{total:,} messages, {rate:,.0f} msg/s, ETA {eta}"
            )
        return f"{self.what}{note}: {done:,}/{total:,} messages ({share:.0%}), {rate:,.0f} msg/s, ETA {eta}"

    def _write(self, now: float) -> None:
        text = self.line(self._done, now - self.start)
        if self.tty:
            self.stream.write(f"\r{text}\033[K")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self._shown_at, self._shown = now, self._done
