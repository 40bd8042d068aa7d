"""The service log's throttle: a repeating warning is written once per window with a
count, and lines that differ in what they are about are not merged."""

from __future__ import annotations

import logging
import re

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
