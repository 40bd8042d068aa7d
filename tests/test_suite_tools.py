"""The suite's own tools: its waits (tests/waiting.py) return on the event and say what
they waited for when it does not come; the fast tier's guard (tests/conftest.py) names an
unmarked test over its limit."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

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
    counts = itertools.chain(range(1, 10), itertools.repeat(10))  # grows for 9 looks, then stays
    started = time.monotonic()
    assert quiet_for(lambda: next(counts), settle=0.1, timeout=30) == 10
    assert time.monotonic() - started < 5, "waited for the timeout, not for the value to settle"


def test_quiet_for_names_a_value_that_keeps_changing():
    ticks = iter(range(10**6))
    with pytest.raises(AssertionError, match=r"still changing after 0.2 s: the ticks; last: \d+"):
        quiet_for(lambda: next(ticks), settle=0.1, timeout=0.2, what="the ticks")


@pytest.mark.slow  # a pytest of its own: 1-2 s
def test_the_fast_tier_guard_names_an_unmarked_test_over_its_stated_limit(tmp_path):
    """The limit the conftest's comment and the slow marker state (0.3 s), not 2 s."""
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_timed.py").write_text(
        "import time\n\n\ndef test_half_a_second():\n    time.sleep(0.5)\n\n\ndef test_at_once():\n    pass\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:faulthandler",
            "-p",
            "no:cacheprovider",
            "-m",
            "not slow",
            "-n",
            "0",
            str(tmp_path / "test_timed.py"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "unmarked tests slower than 0.3 s" in r.stdout, r.stdout
    named = [line for line in r.stdout.splitlines() if line.endswith("test_timed.py::test_half_a_second")]
    assert len(named) == 1 and float(named[0].split("s ")[0]) >= 0.5, r.stdout
    assert "test_at_once" not in r.stdout.split("unmarked tests slower")[1], r.stdout
