"""The tests' waits (tests/waiting.py): they return on the event, and say what they waited
for when it does not come."""

from __future__ import annotations

import threading
import time

import pytest

from waiting import quiet_for, wait_for


def test_wait_for_returns_the_true_value_as_soon_as_it_comes():
    values = iter([0, None, [], "found"])
    assert wait_for(lambda: next(values), timeout=5, what="a value") == "found"


def test_wait_for_names_what_it_waited_for_and_the_last_value():
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"not within 0.1 s: a message over 2; last: \[\]"):
        wait_for(lambda: [m for m in (1, 2) if m > 2], timeout=0.1, what="a message over 2")
    assert 0.1 <= time.monotonic() - started < 2


def test_quiet_for_returns_once_the_value_settles_not_after_the_timeout():
    count = [0]

    def grow():
        for _ in range(10):
            count[0] += 1
            time.sleep(0.01)

    threading.Thread(target=grow).start()
    started = time.monotonic()
    assert quiet_for(lambda: count[0], settle=0.1, timeout=30) == 10
    assert time.monotonic() - started < 5, "waited for the timeout, not for the value to settle"


def test_quiet_for_names_a_value_that_keeps_changing():
    ticks = iter(range(10**6))
    with pytest.raises(AssertionError, match=r"still changing after 0.2 s: the ticks; last: \d+"):
        quiet_for(lambda: next(ticks), settle=0.1, timeout=0.2, what="the ticks")
