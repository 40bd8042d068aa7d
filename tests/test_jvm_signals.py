"""The JVM leaves SIGTERM, SIGINT, SIGHUP and SIGQUIT to Python, and a process whose JVM a
thread other than the main one started still exits: a child process starts the JVM through
jvm.start() on a thread, sends itself each signal and exits."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("jpype")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent("""
    import os, signal, threading, time
    from bridgemgr.providers.java import jvm

    seen = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, lambda signum, frame: seen.append(signum))
    starter = threading.Thread(target=jvm.start, name="bridge start")
    starter.start()
    starter.join()
    assert jvm.is_started()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        os.kill(os.getpid(), sig)
        deadline = time.monotonic() + 10
        while sig not in seen and time.monotonic() < deadline:
            time.sleep(0.01)
    print("seen", sorted(seen), flush=True)
""")


def test_python_keeps_the_signals_and_the_process_exits_after_a_thread_started_the_jvm():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=60)
    except subprocess.TimeoutExpired as exc:  # DestroyJavaVM waiting for the ended thread
        raise AssertionError(f"the process did not exit: {exc.stdout!r}") from None
    assert done.returncode == 0, done.stdout + done.stderr
    assert "seen [1, 2, 3, 15]" in done.stdout
