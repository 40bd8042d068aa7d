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
# imq.bridge.<name>.level sets the level when the configuration file does not.
#
# A busy link writes an INFO line per message, so the file handler (logfiles.RotatingFile)
# is built for that: it counts the bytes it wrote instead of asking the file, formats the
# time once a second, and writes INFO and below through the file's buffer, which flush()
# (the bridge's housekeeping, every second, and close) empties; WARNING and above are
# flushed at once. A file that cannot be written (a full disk) costs its lines, not the
# bridge: the service log says so once, and once more when the file takes lines again.
# The lines about one message are logged with extra=PER_MESSAGE: they stay out of the
# service log and the console (logfiles.py), in the bridge's file only.
"""Per-bridge log files, rotation, levels from a logging configuration file, redaction."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..logfiles import LineFormatter, RotatingFile
from ..private import private_dir
from ..props import LOG_LEVELS, REDACTED, ConfigError, Problem, read_properties_file, shorten

log = logging.getLogger(__name__)  # the service's log: never a bridge's file

LOG_FILE = "log.txt"
LOGGING_CONFIG_PROPERTY = "java.util.logging.config.file"  # the chapter's logging configuration file
FORMAT = "%(asctime)s %(levelname)s %(message)s"
# java.util.logging level names -> Python levels (Python's own names work too).
JAVA_LEVELS: Mapping[str, int] = LOG_LEVELS
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
                 secrets: Iterable[str] = (), level: int | None = None) -> None:
        self.bridge = bridge
        self.directory = directory
        self.limit = limit
        self.count = count
        self.config_file = config_file
        self.secrets = [s for s in secrets if s]
        self.level = DEFAULT_LEVEL if level is None else level  # imq.bridge.<name>.level
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
        self.logger.setLevel(levels.get(prefix, self.level))
        for name, level in levels.items():
            if name.startswith(prefix + "."):
                logging.getLogger(name).setLevel(level)
        if self.secrets:
            self._filter = _Redact(self.secrets)
            self.logger.addFilter(self._filter)
        if self.path is not None:
            private_dir(self.path.parent)
            handler = RotatingFile(self.path, self.limit, self.count, buffered=True, report=log)
            handler.setFormatter(LineFormatter(FORMAT))
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
