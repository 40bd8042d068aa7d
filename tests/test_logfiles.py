"""The service log's throttle: a repeating warning is written once per window with a
count, and lines that differ in what they are about are not merged."""

from __future__ import annotations

import logging
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from bridgemgr.logfiles import Throttle


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _record(msg: str, *args: object) -> logging.LogRecord:
    return logging.makeLogRecord(
        {"name": "bridgemgr.guard", "levelno": logging.WARNING, "levelname": "WARNING", "msg": msg, "args": args}
    )


def test_one_template_about_different_services_is_not_merged_but_its_repeats_are():
    out = Collect()
    throttle = Throttle([out], window=60)
    template = "%s service: refused a connection from %s: %d connections open"
    for service in ("stomp", "jms", "admin"):
        for n in range(5):
            throttle.emit(_record(template, service, f"127.0.0.{n}", n))
    assert out.lines == [
        f"{s} service: refused a connection from 127.0.0.0: 0 connections open" for s in ("stomp", "jms", "admin")
    ]
    throttle.close()  # the counts held back: one line each
    assert sorted(line.split(":")[0] for line in out.lines[3:]) == ["admin service", "jms service", "stomp service"]
    assert all("(repeated 4 times" in line for line in out.lines[3:])


def test_a_console_nobody_reads_does_not_hold_up_the_threads_that_log():
    """A pipe nobody reads (as `serve`'s console may be): logging 3,000 lines of 200
    characters returns at once (a StreamHandler blocked at the full pipe, and with it the
    network loop); once the pipe is read, the lines kept come, then how many were left out."""
    import os
    import threading
    import time

    from bridgemgr.logfiles import Console

    read_end, write_end = os.pipe()
    stream = open(write_end, "w")  # noqa: SIM115 (closed by close() below, after the handler)
    console = Console(stream, limit=100, wait=0.2)
    logger = logging.getLogger("test.console")
    logger.propagate = False
    logger.addHandler(console)
    try:
        done = threading.Event()

        def flood() -> None:
            for i in range(3000):
                logger.warning("line %d %s", i, "x" * 200)
            done.set()

        start = time.monotonic()
        threading.Thread(target=flood, daemon=True).start()
        assert done.wait(10), "logging blocked at the full console"
        assert time.monotonic() - start < 5
        with open(read_end) as pipe:

            def close() -> None:  # what is queued is written, then the pipe ends
                console.close()
                stream.close()

            threading.Thread(target=close, daemon=True).start()
            text = pipe.read()
    finally:
        logger.removeHandler(console)
    lines = text.splitlines()
    assert lines[0].startswith("line 0 ")
    assert len(lines) < 3000 and "console line(s) left out" in lines[-1]
    kept = [line for line in lines if line.startswith("line ")]
    left_out = int(re.search(r"\(([\d,]+) console line", lines[-1]).group(1).replace(",", ""))
    assert len(kept) + left_out == 3000


def test_lines_about_different_names_are_not_merged_but_ids_and_numbers_are():
    """The key is the formatted message: before, "jb1 is owned by B1" and "jb2 is owned by
    B1" were one repeated line (the arguments with digits were left out of the key)."""
    out = Collect()
    throttle = Throttle([out], window=60)
    for name in ("jb1", "jb2", "jb1"):
        throttle.emit(_record("bridge %s is owned by broker %s: removed", name, "B1"))
    for n in range(3):
        throttle.emit(_record("link %s: message %s goes to the DMQ", "l1", f"ID:0a1b2c3d4e5f-{n}"))
    assert out.lines == [
        "bridge jb1 is owned by broker B1: removed",
        "bridge jb2 is owned by broker B1: removed",
        "link l1: message ID:0a1b2c3d4e5f-0 goes to the DMQ",
    ]
    throttle.close()


NAMES = st.builds(
    lambda word, n: word + (str(n) if n is not None else ""),
    st.text("abjxyz", min_size=1, max_size=6),
    st.none() | st.integers(0, 99),
)


@settings(max_examples=60)
@given(NAMES, NAMES, st.integers(0, 10**9))
def test_the_repeat_key_keeps_names_and_masks_numbers(a, b, n):
    from bridgemgr.logfiles import repeat_key

    line = "bridge {} moved {} messages to {}:" + str(n)
    assert (repeat_key(line.format(a, n, "10.0.0.1")) == repeat_key(line.format(b, n + 1, "10.0.0.2"))) == (a == b)


def test_third_party_lines_below_warning_pass_only_at_debug(tmp_path):
    """pika's INFO lines (with object reprs) were 121 of 221 lines of a service log: a
    third party's logger passes at WARNING and above, all of it at DEBUG."""
    import io

    from bridgemgr.logfiles import ServiceLogSettings, open_service_log

    settings = ServiceLogSettings(tmp_path / "log.txt", logging.INFO, False, -1, -1)
    service_log = open_service_log(settings, io.StringIO())
    try:
        logging.getLogger("pika.adapters.blocking").info("Created channel=%s", 1)
        logging.getLogger("pika.adapters.blocking").warning("Connection lost")
        logging.getLogger("bridgemgr.service").info("bridge jb started")
        service_log.set_level(logging.DEBUG)
        logging.getLogger("pika.adapters.blocking").info("Created channel=%s", 2)
    finally:
        service_log.close()
    text = (tmp_path / "log.txt").read_text()
    assert "channel=1" not in text
    assert "Connection lost" in text and "bridge jb started" in text and "channel=2" in text
