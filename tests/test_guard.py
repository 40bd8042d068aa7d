"""The login throttle's rules on its own (the black-box tests over a real serve are in
test_service_netguard.py): capped, decaying, bounded in memory, turns per address."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from bridgemgr.guard import LogEvery, LoginThrottle, ThrottleSettings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_user_delay_doubles_and_stops_at_its_cap_however_many_failures():
    clock = Clock()
    throttle = LoginThrottle(ThrottleSettings(base_delay=0.25, max_delay=5.0), clock)
    delays = []
    for _ in range(5000):  # 2 ** 5000 would overflow a float
        throttle.failed("10.0.0.1", "admin")
        delays.append(throttle.user_delay("admin"))
    assert delays[:6] == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0]
    assert max(delays) == 5.0  # an attacker slows the user by 5 s at most: never a lockout


def test_failures_decay_until_they_are_forgotten():
    clock = Clock()
    settings = ThrottleSettings(base_delay=0.25, max_delay=5.0, decay=60.0)
    throttle = LoginThrottle(settings, clock)
    for _ in range(100):
        throttle.failed("10.0.0.1", "admin")
    clock.now += 60  # one failure forgotten per minute; 100 counted as the cap's 6
    throttle.failed("10.0.0.2", "admin")  # counts again from 5: 6
    clock.now += 3 * 60
    assert throttle.user_delay("admin") == 0.0  # ready long ago
    throttle.failed("10.0.0.2", "admin")  # 6 - 3 + 1 = 4 failures: 2 s
    assert throttle.user_delay("admin") == 2.0
    clock.now += 10 * 60
    assert throttle.user_delay("admin") == 0.0
    assert "admin" not in throttle._users  # forgotten, not kept at zero


@pytest.mark.slow
def test_cycling_addresses_and_user_names_cannot_grow_memory():
    throttle = LoginThrottle(ThrottleSettings(max_entries=100), Clock())
    for n in range(20_000):
        throttle.failed(f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}", "x" * 10_000 + str(n))
    assert len(throttle) <= 200


def test_a_success_resets_the_user_not_the_address():
    async def run() -> tuple[float, float]:
        throttle = LoginThrottle(ThrottleSettings(base_delay=0.05, max_delay=1.0))
        for user in ("bob", "alice"):
            throttle.failed("10.0.0.1", user)
        async with throttle.attempt("10.0.0.1", "alice") as attempt:
            attempt.outcome(True)
        start = time.monotonic()
        async with throttle.attempt("10.0.0.1", "alice") as attempt:
            waited = time.monotonic() - start
            attempt.outcome(True)
        return throttle.user_delay("alice"), waited

    user_delay, waited = asyncio.run(run())
    assert user_delay == 0.0
    assert waited < 0.05  # the address's delay was served by the first attempt


def test_checks_of_one_address_take_turns_and_a_waiter_that_gives_up_takes_none():
    async def run() -> list[str]:
        throttle = LoginThrottle(ThrottleSettings(base_delay=0.05, max_delay=1.0))
        order: list[str] = []
        first_in = asyncio.Event()
        release = asyncio.Event()

        async def log_in(name: str, ok: bool, hold: bool = False) -> None:
            async with throttle.attempt("10.0.0.1", name) as attempt:
                order.append(name)
                if hold:
                    first_in.set()
                    await release.wait()
                attempt.outcome(ok)

        first = asyncio.create_task(log_in("a", False, hold=True))
        await first_in.wait()
        quitter = asyncio.create_task(log_in("b", True))
        last = asyncio.create_task(log_in("c", True))
        await asyncio.sleep(0.01)
        quitter.cancel()  # gave up waiting (timeout, disconnect)
        release.set()
        start = time.monotonic()
        await asyncio.gather(first, last, return_exceptions=True)
        assert time.monotonic() - start >= 0.05 - 0.005  # after a's failure: c waits 0.05 s
        assert len(throttle) == 2  # the address and user a, with a failure each
        return order

    assert asyncio.run(run()) == ["a", "c"]


def test_correct_logins_from_one_address_are_not_delayed():
    async def run() -> float:
        throttle = LoginThrottle()

        async def log_in() -> None:
            async with throttle.attempt("127.0.0.1", "spark") as attempt:
                attempt.outcome(True)

        start = time.monotonic()
        await asyncio.gather(*(log_in() for _ in range(200)))
        assert len(throttle) == 0
        return time.monotonic() - start

    assert asyncio.run(run()) < 0.5


def test_log_every_logs_once_per_period_and_says_how_often(caplog):
    clock = Clock()
    every = LogEvery(60, clock)
    log = logging.getLogger("test.guard")
    with caplog.at_level(logging.INFO, "test.guard"):
        for _ in range(1000):
            every(log, logging.WARNING, "out of %s", "files")
        clock.now += 61
        every(log, logging.WARNING, "out of %s", "files")
    assert [r.getMessage() for r in caplog.records] == [
        "out of files",
        "out of files (and 999 more times in the last 60 s)",
    ]
