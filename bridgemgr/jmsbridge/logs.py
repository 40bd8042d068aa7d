# How it works: every JMS bridge logs through the logger imq.bridge.<name> (its links
# too), which BridgeLog gives its own file, IMQ_VARHOME/instances/<instance>/bridges/
# <name>/log.txt, rotating as imq.bridge.<name>.logfile.limit (bytes; 0 = no limit) and
# logfile.count (files cycled through) say: count N keeps log.txt and N-1 older files
# (log.txt.1 ...); with count 1 the file starts over when it reaches the limit, as
# java.util.logging.FileHandler does. Levels come from a logging configuration file in the
# Java format the chapter names (java.util.logging.config.file): lines
# `imq.bridge.<name>.level=FINE` set the bridge's logger (and `imq.bridge.<name>.<x>.level`
# a child's); Java and Python level names are both understood; INFO is the default, so
# the per-transfer INFO lines are written. A filter on the logger replaces the bridge's
# configured passwords with ******** wherever they would appear (a provider error text
# may quote one), so the file never holds a password.
#
# A busy link writes an INFO line per message, so the file handler is built for that: it
# counts the bytes it wrote instead of asking the file, formats the time once a second,
# and writes INFO and below through the file's buffer, which flush() (the bridge's
# housekeeping, every second, and close) empties; WARNING and above are flushed at once.
# A file that cannot be written (a full disk) costs its lines, not the bridge: the service
# log says so once, and once more when the file takes lines again.
"""Per-bridge log files, rotation, levels from a logging configuration file, redaction."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..private import open_private_text, private_dir
from ..props import REDACTED, ConfigError, Problem, read_properties_file, shorten

log = logging.getLogger(__name__)  # the service's log: never a bridge's file

LOG_FILE = "log.txt"
FORMAT = "%(asctime)s %(levelname)s %(message)s"
# java.util.logging level names -> Python levels (Python's own names work too).
JAVA_LEVELS: Mapping[str, int] = {
    "OFF": logging.CRITICAL + 10, "SEVERE": logging.ERROR, "WARNING": logging.WARNING,
    "INFO": logging.INFO, "CONFIG": logging.INFO - 5, "FINE": logging.DEBUG,
    "FINER": logging.DEBUG - 3, "FINEST": logging.DEBUG - 5, "ALL": 1,
    "CRITICAL": logging.CRITICAL, "ERROR": logging.ERROR, "WARN": logging.WARNING,
    "DEBUG": logging.DEBUG,
}
DEFAULT_LEVEL = logging.INFO


def logger_name(bridge: str) -> str:
    return f"imq.bridge.{bridge}"


def read_levels(path: str | Path) -> dict[str, int]:
    """``logger -> level`` from the `<logger>.level=<LEVEL>` lines of a logging
    configuration file (other lines are the Java handlers' business and are ignored);
    ConfigError naming the file and line of every bad level."""
    levels: dict[str, int] = {}
    problems: list[Problem] = []
    for key, value, origin in read_properties_file(path):
        if not key.endswith(".level") and key != ".level":
            continue
        level = JAVA_LEVELS.get(value.strip().upper())
        if level is None and value.strip().isdigit():
            level = int(value.strip())
        if level is None:
            problems.append(Problem(origin.source, origin.line, f"{key} is {shorten(value)}; "
                                    "write a level: " + ", ".join(JAVA_LEVELS)))
            continue
        levels[key[:-len(".level")]] = level
    if problems:
        raise ConfigError(problems)
    return levels


class _Formatter(logging.Formatter):
    """FORMAT, with the date and time text made once per second."""

    def __init__(self) -> None:
        super().__init__(FORMAT)
        self._second = -1
        self._text = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        second = int(record.created)
        if second != self._second:
            self._second = second
            self._text = time.strftime("%Y-%m-%d %H:%M:%S", self.converter(record.created))
        return f"{self._text},{int(record.msecs):03d}"


class _RotatingFile(logging.Handler):
    """The bridge's file: rotation by logfile.limit/count, buffered INFO lines."""

    def __init__(self, path: Path, limit: int, count: int) -> None:
        super().__init__()
        self.path = path
        self.limit = limit
        self.count = max(count, 1)
        self.stream = open_private_text(path, "a")
        self.size = self.stream.tell()
        self.failing = False    # the last write or flush failed (said once in the service log)
        self.unflushed = False  # lines went into the buffer since the last flush that worked

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
            n = len(line.encode("utf-8")) if not line.isascii() else len(line)
            if self.limit and self.size and self.size + n > self.limit:
                self._rotate()
            self.stream.write(line)
            self.size += n
            self.unflushed = True
            if record.levelno >= logging.WARNING:
                self._flush()
        except OSError as exc:
            self._failed(exc)
        except Exception:
            self.handleError(record)

    def _failed(self, exc: OSError) -> None:
        if not self.failing:
            log.error("bridge log %s: cannot write (%s); its lines are lost until it can",
                      self.path, exc.strerror or exc)
            self.failing = True

    def _flush(self) -> None:
        """Flush; a flush that wrote lines ends a failure (an empty one proves nothing)."""
        self.stream.flush()
        if self.unflushed:
            self.unflushed = False
            self._wrote()

    def _wrote(self) -> None:
        if self.failing:
            log.warning("bridge log %s: writing again", self.path)
            self.failing = False

    def _rotate(self) -> None:
        try:
            self.stream.close()
        except OSError as exc:  # its buffered lines are lost; the new file is opened anyway
            self._failed(exc)
        for i in range(self.count - 1, 0, -1):  # log.txt.(i-1) -> log.txt.i; log.txt -> .1
            older = self.path.with_name(f"{self.path.name}.{i - 1}") if i > 1 else self.path
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{i}"))
        self.stream = open_private_text(self.path, "w")
        self.size = 0

    def flush(self) -> None:
        self.acquire()
        try:
            if not self.stream.closed:
                self._flush()
        except OSError as exc:  # the housekeeping thread that calls this must live on
            self._failed(exc)
        finally:
            self.release()

    def close(self) -> None:
        self.acquire()
        try:
            if not self.stream.closed:
                try:
                    self.stream.close()  # flushes; closed also when that fails
                except OSError as exc:
                    self._failed(exc)
        finally:
            self.release()
        super().close()


class _Redact(logging.Filter):
    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if any(secret in text for secret in self.secrets):
            for secret in self.secrets:
                text = text.replace(secret, REDACTED)
            record.msg, record.args = text, None
        return True


class BridgeLog:
    """The logger of one bridge and its file."""

    def __init__(self, bridge: str, directory: Path | None = None, limit: int = 0,
                 count: int = 1, config_file: str | Path | None = None,
                 secrets: Iterable[str] = ()) -> None:
        self.bridge = bridge
        self.directory = directory
        self.limit = limit
        self.count = count
        self.config_file = config_file
        self.secrets = [s for s in secrets if s]
        self.logger = logging.getLogger(logger_name(bridge))
        self._handler: logging.Handler | None = None
        self._filter: _Redact | None = None

    @property
    def path(self) -> Path | None:
        return self.directory / LOG_FILE if self.directory is not None else None

    def open(self) -> logging.Logger:
        """Attach the file (and the configured levels); the logger to log to."""
        self.close()
        prefix = logger_name(self.bridge)
        levels = read_levels(self.config_file) if self.config_file else {}
        self.logger.setLevel(levels.get(prefix, DEFAULT_LEVEL))
        for name, level in levels.items():
            if name.startswith(prefix + "."):
                logging.getLogger(name).setLevel(level)
        if self.secrets:
            self._filter = _Redact(self.secrets)
            self.logger.addFilter(self._filter)
        if self.path is not None:
            private_dir(self.path.parent)
            handler = _RotatingFile(self.path, self.limit, self.count)
            handler.setFormatter(_Formatter())
            if self._filter is not None:  # records of child loggers reach the handler only
                handler.addFilter(self._filter)
            self.logger.addHandler(handler)
            self._handler = handler
        return self.logger

    def flush(self) -> None:
        """Write the buffered lines (the bridge's housekeeping calls this every second)."""
        if self._handler is not None:
            self._handler.flush()

    def close(self) -> None:
        if self._handler is not None:
            self.logger.removeHandler(self._handler)
            self._handler.close()
            self._handler = None
        if self._filter is not None:
            self.logger.removeFilter(self._filter)
            self._filter = None
