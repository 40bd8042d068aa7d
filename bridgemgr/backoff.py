"""Exponential backoff with a cap, for every retry loop and login throttle."""

from __future__ import annotations

_MAX_EXPONENT = 60  # 2**60 times any sane base is past every cap; beyond it floats overflow


def backoff_delay(base: float, attempt: int, cap: float) -> float:
    """Seconds to wait after ``attempt`` failures in a row: ``base`` doubled per failure after
    the first, never more than ``cap``. Any count is fine: 2 ** 1024 times a float raises
    OverflowError, which once let a link's backoff or the admin login throttle crash after
    1,024 failures."""
    return min(cap, base * 2.0 ** min(max(attempt - 1, 0), _MAX_EXPONENT))
