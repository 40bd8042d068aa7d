"""The service log's throttle: a repeating warning is written once per window with a
count, and lines that differ in what they are about are not merged."""

from __future__ import annotations

import logging

from bridgemgr.logfiles import Throttle


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _record(msg: str, *args: object) -> logging.LogRecord:
    return logging.makeLogRecord({"name": "bridgemgr.guard", "levelno": logging.WARNING,
                                  "levelname": "WARNING", "msg": msg, "args": args})


def test_one_template_about_different_services_is_not_merged_but_its_repeats_are():
    out = Collect()
    throttle = Throttle([out], window=60)
    template = "%s service: refused a connection from %s: %d connections open"
    for service in ("stomp", "jms", "admin"):
        for n in range(5):
            throttle.emit(_record(template, service, f"127.0.0.{n}", n))
    assert out.lines == [f"{s} service: refused a connection from 127.0.0.0: 0 connections open"
                         for s in ("stomp", "jms", "admin")]
    throttle.close()  # the counts held back: one line each
    assert sorted(line.split(":")[0] for line in out.lines[3:]) == ["admin service", "jms service",
                                                                     "stomp service"]
    assert all("(repeated 4 times" in line for line in out.lines[3:])
