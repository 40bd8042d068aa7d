"""Waiting in tests for an event or a count, never for a fixed time: ``wait_for`` polls a
condition until it holds, ``quiet_for`` until a value stops changing."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

POLL = 0.02  # s between two looks: short against every timeout the tests give


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, what: str = "", interval: float = POLL) -> T:
    """Poll ``predicate()`` until it returns something true, and return that. After
    ``timeout`` seconds raise AssertionError naming ``what`` (or the predicate) and the
    last value it returned."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout:g} s: {what or predicate}; last: {value!r}")
        time.sleep(interval)


def quiet_for(
    value_fn: Callable[[], Any], settle: float, timeout: float = 60.0, what: str = "", interval: float = POLL
) -> Any:
    """Poll ``value_fn()`` until it has returned the same value for ``settle`` seconds,
    and return that value: as soon as it has settled, not after a fixed wait. After
    ``timeout`` seconds of changes raise AssertionError naming ``what`` and the last value."""
    deadline = time.monotonic() + timeout
    last = value_fn()
    since = time.monotonic()
    while True:
        now = time.monotonic()
        if now - since >= settle:
            return last
        if now >= deadline:
            raise AssertionError(f"still changing after {timeout:g} s: {what or value_fn}; last: {last!r}")
        time.sleep(min(interval, settle))
        value = value_fn()
        if value != last:
            last, since = value, time.monotonic()
