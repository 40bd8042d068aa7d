"""Per-bridge log files, rotation, levels from a logging configuration file, redaction.

Every JMS bridge logs through the logger imq.bridge.<name>, which BridgeLog gives its own
file, bridges/<name>/log.txt of the instance, rotating by imq.bridge.<name>.logfile.limit
and logfile.count; levels come from a Java-format logging configuration file
(java.util.logging.config.file) or imq.bridge.<name>.level; INFO by default.

Rules: a filter replaces the bridge's configured passwords with ******** (the file never
holds a password); INFO and below are buffered (flushed every second), WARNING and above at
once; a file that cannot be written costs its lines, not the bridge; lines about one
message (extra=PER_MESSAGE) stay in the bridge's file only.

Design notes: docs/jms-bridges.md#internals-jmsbridgelogspy.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..logfiles import RotatingFile, formatter
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
            problems.append(
                Problem(
                    origin.source, origin.line, f"{key} is {shorten(value)}; write a level: " + ", ".join(JAVA_LEVELS)
                )
            )
            continue
        levels[key[: -len(".level")]] = level
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

    def __init__(
        self,
        bridge: str,
        directory: Path | None = None,
        limit: int = 0,
        count: int = 1,
        config_file: str | Path | None = None,
        secrets: Iterable[str] = (),
        level: int | None = None,
        json_lines: bool = False,
    ) -> None:
        """``json_lines``: the file as JSON lines (imq.log.format=json), as the service log."""
        self.bridge = bridge
        self.directory = directory
        self.limit = limit
        self.count = count
        self.config_file = config_file
        self.secrets = [s for s in secrets if s]
        self.level = DEFAULT_LEVEL if level is None else level  # imq.bridge.<name>.level
        self.json_lines = json_lines
        self.logger = logging.getLogger(logger_name(bridge))
        self._handler: logging.Handler | None = None
        self._filter: _Redact | None = None

    @property
    def path(self) -> Path | None:
        return self.directory / LOG_FILE if self.directory is not None else None

    def open(self) -> logging.Logger:
        """Attach the file (and the configured levels); the logger to log to."""
        self.close()
        self._apply_levels()
        if self.secrets:
            self._filter = _Redact(self.secrets)
            self.logger.addFilter(self._filter)
        if self.path is not None:
            private_dir(self.path.parent)
            handler = RotatingFile(self.path, self.limit, self.count, buffered=True, report=log)
            handler.setFormatter(formatter(self.json_lines, FORMAT))
            if self._filter is not None:  # records of child loggers reach the handler only
                handler.addFilter(self._filter)
            self.logger.addHandler(handler)
            self._handler = handler
        return self.logger

    def _apply_levels(self) -> None:
        """The logging configuration file's levels, else ``level``, on the bridge's loggers."""
        prefix = logger_name(self.bridge)
        levels = read_levels(self.config_file) if self.config_file else {}
        self.logger.setLevel(levels.get(prefix, self.level))
        for name, level in levels.items():
            if name.startswith(prefix + "."):
                logging.getLogger(name).setLevel(level)

    def set_level(self, level: int) -> None:
        """imq.bridge.<name>.level changed (SIGHUP): it applies now; the logging
        configuration file's level for the bridge, when it has one, still wins."""
        self.level = level
        self._apply_levels()

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
