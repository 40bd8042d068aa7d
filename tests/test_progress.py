"""The progress of drain and dmq archive (bridgemgr/spark/progress.py), without Spark: a
fake clock and a stream that is or is not a terminal. On a terminal one line rewritten
in place with a bar, count, rate and ETA; elsewhere a plain line at most every 10 s and a
last one; with no backlog known, count and rate only."""

from __future__ import annotations

import io

from bridgemgr.spark.progress import Progress, duration


class Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run(tty: bool, total: int | None, steps: list[tuple[float, int]]) -> str:
    """Updates at (seconds from the start, count so far), then finish; what was written."""
    stream, clock = Stream(tty), Clock()
    progress = Progress("DMQ built-in-dmq", total, stream, clock=clock)
    for at, done in steps:
        clock.now = 100.0 + at
        progress.update(done)
    progress.finish()
    return stream.getvalue()


def test_a_terminal_gets_one_line_rewritten_with_a_bar_rate_and_eta():
    out = run(True, 10_000, [(0.0, 0), (0.5, 500), (1.0, 1000), (2.0, 2000), (2.5, 2500)])
    frames = out.split("\r")[1:]
    assert out.endswith("\n") and "\n" not in out[:-1]  # one line, ended at the end
    assert all(f.rstrip("\n").endswith("\033[K") for f in frames)
    assert len(frames) == 4  # at most once a second, and the last
    assert frames[2].startswith(
        "DMQ built-in-dmq [#####...................]  20% 2,000/10,000 messages, 1,000 msg/s, ETA 0:08"
    )
    assert "2,500/10,000 messages, 1,000 msg/s, ETA 0:08" in frames[3]


def test_a_pipe_gets_a_plain_line_every_10_s_and_the_last():
    steps = [(float(s), s * 100) for s in range(1, 26)]
    lines = run(False, 5_000, steps).splitlines()
    assert lines == [
        "DMQ built-in-dmq: 1,000/5,000 messages (20%), 100 msg/s, ETA 0:40",
        "DMQ built-in-dmq: 2,000/5,000 messages (40%), 100 msg/s, ETA 0:30",
        "DMQ built-in-dmq: 2,500/5,000 messages (50%), 100 msg/s, ETA 0:25",
    ]
    assert "\r" not in "".join(lines) and "\033" not in "".join(lines)


def test_without_a_backlog_count_and_rate_only():
    lines = run(False, None, [(12.0, 600)]).splitlines()
    assert lines == ["DMQ built-in-dmq: 600 messages, 50 msg/s, 0:12"]
    assert "ETA" not in run(True, None, [(1.0, 10)])


def test_more_than_the_backlog_or_nothing_moved_yet():
    assert "120/120 messages (100%), 60 msg/s, ETA 0:00" in run(False, 100, [(2.0, 120)])
    assert "   0% 0/100 messages, 0 msg/s, ETA ?\033[K" in run(True, 100, [(0.0, 0)])
    assert run(False, 100, []) == ""  # nothing moved: nothing to say
    assert duration(3725) == "1:02:05" and duration(59.6) == "1:00"
