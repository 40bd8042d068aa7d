"""The service log: console and rotating file, JSON lines, per-message lines kept out,
repeated warnings counted; and the rotating file handler the bridge logs use too.

`serve` opens the service log (open_service_log) before the service starts: one Throttle
handler on the root logger, writing to the console and to log.txt (0600, rolling over by
size and age), as text or JSON lines. Log a line about one message with
extra=PER_MESSAGE (it goes to the bridge's own file only) and a line that may flood with
extra=COUNTED (repeats are counted, not written).

Rules: the console never holds up the thread that logs (a writer thread writes it, lines
it cannot take are counted); a repeated warning passes once per REPEAT_WINDOW and the
count follows, at close at the latest; third-party loggers pass below WARNING only at DEBUG.

Design notes: docs/operations.md#internals-logfilespy.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import logging.handlers
import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from .private import open_private_text, private_dir
from .props import LOG_LEVELS, BrokerProperties

log = logging.getLogger(__name__)

LOG_FILE = "log.txt"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
SERVICE_LOG_FILES = 10  # log.txt and the nine before it, as the original broker keeps
REPEAT_WINDOW = 10.0  # seconds over which a repeated warning is counted instead of written
# extra= of a line about one message: it goes to the bridge's own log only.
PER_MESSAGE: Mapping[str, Any] = {"per_message": True}
# A line that comes once per message but belongs in the service log (a message the broker
# drops): counted when it repeats, as WARNING and above are, whatever its level.
COUNTED: Mapping[str, Any] = {"counted": True}
_BRIDGE_LOGGER = "imq.bridge."
_OWN_LOGGERS = frozenset({"bridgemgr", "imq"})
# Third-party loggers (pika, py4j, psycopg ...) pass at this level or above, unless the
# service log is at DEBUG: pika alone wrote 121 of 221 lines of a service log at INFO.
FOREIGN_LEVEL = logging.WARNING


def level_name(level: int) -> str:
    """The name a level is written with (Python's for its own levels, else the Java one)."""
    name = logging.getLevelName(level)
    if name.startswith("Level "):
        name = next((k for k, v in LOG_LEVELS.items() if v == level), name)
    return name


def where(record: logging.LogRecord) -> tuple[str | None, str | None]:
    """(bridge, link) a record is about: the bridge from its logger imq.bridge.<name>[.x],
    the link from a ``link=`` extra or from a message that starts "link %s" (every link
    line does)."""
    bridge = None
    if record.name.startswith(_BRIDGE_LOGGER):
        bridge = record.name[len(_BRIDGE_LOGGER) :].split(".", 1)[0]
    link = getattr(record, "link", None)
    if (
        link is None
        and isinstance(record.msg, str)
        and record.msg.startswith("link %s")
        and isinstance(record.args, tuple)
        and record.args
    ):
        link = str(record.args[0])
    return bridge, link


class LineFormatter(logging.Formatter):
    """``fmt``, with the date and time text made once per second (a busy bridge log
    formats thousands of lines a second)."""

    def __init__(self, fmt: str = TEXT_FORMAT) -> None:
        super().__init__(fmt)
        self._second = -1
        self._text = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        second = int(record.created)
        if second != self._second:
            self._second = second
            self._text = time.strftime("%Y-%m-%d %H:%M:%S", self.converter(record.created))
        return f"{self._text},{int(record.msecs):03d}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers: time (UTC, ISO 8601), level, logger,
    message, bridge and link where known, exception (the traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": level_name(record.levelno),
            "logger": record.name,
            "message": record.getMessage(),
        }
        bridge, link = where(record)
        if bridge is not None:
            entry["bridge"] = bridge
        if link is not None:
            entry["link"] = link
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


class Console(logging.Handler):
    """The console (stderr) as a handler that never holds up the thread that logs: a
    console nobody reads (a full pipe, a paused terminal) blocked the first thread to log
    there, the network loop with it, and every other thread at the handler's lock. A
    writer thread writes the lines; a caller waits up to ``wait`` s for its line only while
    the console keeps up (lines keep their order with what serve prints itself), else it
    leaves the line queued (at most ``limit``: the others are counted, and a line says how
    many once the console takes lines again; the log file has them all)."""

    def __init__(self, stream: IO[str], limit: int = 1000, wait: float = 0.5) -> None:
        super().__init__()
        self.stream = stream
        self.limit = limit
        self.wait = wait
        self._lines: deque[str] = deque()
        self._cond = threading.Condition()
        self._queued = 0  # lines queued so far
        self._written = 0  # lines the writer has written (or given up on) so far
        self._dropped = 0  # lines left out since the console last kept up
        self._closed = False
        self._writer = threading.Thread(target=self._write, name="console", daemon=True)
        self._writer.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
        except Exception:
            self.handleError(record)
            return
        with self._cond:
            if self._closed:
                return
            if len(self._lines) >= self.limit:
                self._dropped += 1
                return
            keeping_up = self._written == self._queued  # nothing of before still pending
            self._lines.append(line)
            self._queued += 1
            mine = self._queued
            self._cond.notify_all()
            if keeping_up:
                self._cond.wait_for(lambda: self._written >= mine, self.wait)

    def _write(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._lines or self._closed)
                if not self._lines:
                    return
                line = self._lines.popleft()
                if not self._lines and self._dropped:
                    line += (
                        f"({self._dropped:,} console line(s) left out: the console did not "
                        "take them; the log file has every line)\n"
                    )
                    self._dropped = 0
            try:
                self.stream.write(line)
                self.stream.flush()
            except (OSError, ValueError):  # the console is gone; the log file has the lines
                pass
            with self._cond:
                self._written += 1
                self._cond.notify_all()

    def close(self) -> None:
        """Write what is queued (waiting at most a few seconds for the console), then end."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._writer.join(5.0)
        super().close()


def _own_stderr() -> IO[str]:
    """The console as a stream of its own descriptor (a dup of fd 2): the service's Spark
    session points fd 2 at its log file while its JVM starts (session.py), and the
    console must not go quiet meanwhile."""
    try:
        fd = os.dup(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):  # no descriptor behind sys.stderr
        return sys.stderr
    return open(fd, "w", encoding=sys.stderr.encoding or "utf-8", errors="backslashreplace", closefd=True)


def roll_over(path: Path, count: int) -> None:
    """<name>.(i-1) becomes <name>.i and <name> becomes <name>.1, keeping ``count`` files
    (<name>.<count-1> is the oldest): <name> can then be opened empty."""
    for i in range(count - 1, 0, -1):
        older = path.with_name(f"{path.name}.{i - 1}") if i > 1 else path
        if older.exists():
            os.replace(older, path.with_name(f"{path.name}.{i}"))


@dataclass(frozen=True)
class FileBounds:
    """When a log file rolls over: past ``limit`` bytes (0: no limit) or once ``max_age``
    seconds old (0: never), to <name>.1 ... <name>.<count-1>; RotatingFile's and the Spark
    JVM's (spark/jvmlog.py) both. Use of(), which takes -1 for none as the props give it."""

    path: Path
    limit: int
    count: int
    max_age: float

    @classmethod
    def of(cls, path: Path, limit: int, count: int, max_age: float) -> FileBounds:
        return cls(path, max(limit, 0), max(count, 1), max(max_age, 0))

    def too_big(self, size: int, more: int) -> bool:
        """Whether ``more`` bytes would take a file of ``size`` past the limit."""
        return bool(self.limit) and size + more > self.limit

    def too_old(self, size: int, since: float, now: float) -> bool:
        """Whether a file of ``size`` (an empty one never) is max_age old at ``now``,
        counted from ``since`` (when it was opened; when last written, at open)."""
        return bool(self.max_age and size) and now - since >= self.max_age

    def roll_over(self) -> None:
        roll_over(self.path, self.count)


class WriteFailures:
    """Says through ``report`` (never the file's own logger) once that a log file cannot
    be written (its lines are lost) and once more when it takes lines again."""

    def __init__(self, path: Path, report: logging.Logger) -> None:
        self.path = path
        self.report = report
        self.failing = False

    def failed(self, exc: OSError) -> None:
        if not self.failing:
            self.report.error(
                "log %s: cannot write (%s); its lines are lost until it can", self.path, exc.strerror or exc
            )
            self.failing = True

    def writing(self, lost: str = "") -> None:
        """A write worked (``lost``: what the failure cost, said with it)."""
        if self.failing:
            self.report.warning("log %s: writing again%s", self.path, lost)
            self.failing = False


class RotatingFile(logging.Handler):
    """A log file (0600) that rolls over to <name>.1 ... <name>.<count-1> when a line would
    take it past ``limit`` bytes (0: no limit) or once it is ``max_age`` seconds old (0:
    never). With ``buffered``, lines below WARNING wait in the file's buffer for flush();
    otherwise every line is flushed. A file that cannot be written (a full disk) costs its
    lines, not the caller: the service log says so once, and once more when it takes
    lines again, through ``report`` (never this file's own logger)."""

    def __init__(
        self,
        path: Path,
        limit: int = 0,
        count: int = 1,
        *,
        max_age: float = 0,
        buffered: bool = False,
        report: logging.Logger = log,
    ) -> None:
        super().__init__()
        self.path = path
        self.bounds = FileBounds.of(path, limit, count, max_age)
        self.failures = WriteFailures(path, report)  # said once in the service log
        self.buffered = buffered
        self.stream: IO[str] = open_private_text(path, "a")
        self.size = self.stream.tell()
        self.opened = time.time()
        self.unflushed = False  # lines went into the buffer since the last flush that worked
        if self.bounds.too_old(self.size, path.stat().st_mtime, self.opened):
            self._rotate()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
            n = len(line.encode("utf-8")) if not line.isascii() else len(line)
            if self.size and (
                self.bounds.too_big(self.size, n) or self.bounds.too_old(self.size, self.opened, record.created)
            ):
                self._rotate()
            self.stream.write(line)
            self.size += n
            self.unflushed = True
            if not self.buffered or record.levelno >= logging.WARNING:
                self._flush()
        except OSError as exc:
            self.failures.failed(exc)
        except Exception:
            self.handleError(record)

    def _flush(self) -> None:
        """Flush; a flush that wrote lines ends a failure (an empty one proves nothing)."""
        self.stream.flush()
        if self.unflushed:
            self.unflushed = False
            self.failures.writing()

    def _rotate(self) -> None:
        try:
            self.stream.close()
        except OSError as exc:  # its buffered lines are lost; the new file is opened anyway
            self.failures.failed(exc)
        self.bounds.roll_over()
        self.stream = open_private_text(self.path, "w")
        self.size = 0
        self.opened = time.time()

    def flush(self) -> None:
        self.acquire()
        try:
            if not self.stream.closed:
                self._flush()
        except OSError as exc:  # the housekeeping thread that calls this must live on
            self.failures.failed(exc)
        finally:
            self.release()

    def close(self) -> None:
        self.acquire()
        try:
            if not self.stream.closed:
                try:
                    self.stream.close()  # flushes; closed also when that fails
                except OSError as exc:
                    self.failures.failed(exc)
        finally:
            self.release()
        super().close()


@dataclass
class _Repeats:
    """One message template's current window."""

    start: float
    count: int = 0  # records held back since start
    last: logging.LogRecord | None = None
    timer: threading.Timer | None = None


_NUMBER = re.compile(r"[\d.:,/_+-]*\d[\d.:,/_+-]*")
_ID_LENGTH = 16  # a word this long with a digit in it is an id (a message id, a uuid)


def repeat_key(text: str) -> str:
    """A formatted message with what changes from one repeat to the next masked: a word
    that is a number or an address (digits and . : , / _ + - only), or an id (a word
    of _ID_LENGTH characters or more with a digit in it, "ID:..." included), becomes #.
    Names stay: "jb1 is owned by B1" and "jb2 is owned by B1" are two lines."""
    return " ".join(
        "#"
        if _NUMBER.fullmatch(word.strip("()[]'\",;")) or (len(word) >= _ID_LENGTH and any(c.isdigit() for c in word))
        else word
        for word in text.split()
    )


def is_own(logger: str) -> bool:
    """Whether ``logger`` is the service's (bridgemgr.*, imq.*), not a third party's."""
    return logger.partition(".")[0] in _OWN_LOGGERS


class Throttle(logging.Handler):
    """Hands records to ``handlers`` (each at its own level), dropping PER_MESSAGE ones and
    third-party records below ``foreign_level``, and counting WARNING and above (and
    COUNTED ones) whose formatted message (repeat_key) repeats within ``window`` seconds."""

    def __init__(
        self, handlers: Iterable[logging.Handler], window: float = REPEAT_WINDOW, foreign_level: int = FOREIGN_LEVEL
    ) -> None:
        super().__init__()
        self.handlers = list(handlers)
        self.window = window
        self.foreign_level = foreign_level
        self._repeats: dict[tuple[Any, ...], _Repeats] = {}
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "per_message", False):
            return
        if record.levelno < self.foreign_level and not is_own(record.name):
            return
        if record.levelno >= logging.WARNING or getattr(record, "counted", False):
            try:
                text = record.getMessage()
            except Exception:  # arguments that do not fit: the handlers report it
                text = str(record.msg)
            key = (record.name, where(record)[1], record.levelno, repeat_key(text))
            now = time.monotonic()
            with self._guard:
                repeats = self._repeats.get(key)
                if repeats is not None and now - repeats.start < self.window:
                    repeats.count += 1
                    repeats.last = record
                    if repeats.timer is None:
                        repeats.timer = threading.Timer(self.window - (now - repeats.start), self._summarise, (key,))
                        repeats.timer.daemon = True
                        repeats.timer.start()
                    return
                if len(self._repeats) > 1000:  # messages with values repeat_key keeps: forget
                    self._repeats = {k: r for k, r in self._repeats.items() if r.count}
                self._repeats[key] = _Repeats(now)
        self._hand_on(record)

    def _hand_on(self, record: logging.LogRecord) -> None:
        for handler in self.handlers:
            if record.levelno >= handler.level:
                handler.handle(record)

    def _summarise(self, key: tuple[Any, ...]) -> None:
        """The window of ``key`` ended: one line with the last record held back and the count."""
        with self._guard:
            repeats = self._repeats.pop(key, None)
        if repeats is None or repeats.last is None:
            return
        last = repeats.last
        seconds = max(1, round(time.monotonic() - repeats.start))
        line = logging.makeLogRecord(
            {**last.__dict__, "args": None, "exc_info": None, "exc_text": None, "created": time.time(), "msecs": 0.0}
        )
        line.msg = f"{last.getMessage()} (repeated {repeats.count:,} times in the last {seconds} s)"
        line.msecs = (line.created % 1) * 1000
        self._hand_on(line)

    def close(self) -> None:
        """Write the counts still pending, then close the handlers."""
        with self._guard:
            pending = [(key, r) for key, r in self._repeats.items() if r.timer is not None]
        for key, repeats in pending:
            assert repeats.timer is not None
            repeats.timer.cancel()
            self._summarise(key)
        for handler in self.handlers:
            handler.close()
        super().close()


@dataclass(frozen=True)
class ServiceLogSettings:
    """Where and how the service logs (imq.log.*)."""

    path: Path
    level: int
    json: bool
    rollover_bytes: int  # -1: no size limit
    rollover_secs: int  # -1: never by age

    @classmethod
    def from_props(cls, props: BrokerProperties, level: int | None = None) -> ServiceLogSettings:
        """From imq.log.*; ``level`` (serve -loglevel) wins over imq.log.level."""
        return cls(
            path=props.instance_dir / "log" / LOG_FILE,
            level=level if level is not None else props.get("imq.log.level"),
            json=props.get("imq.log.format") == "json",
            rollover_bytes=props.get("imq.log.file.rolloverbytes"),
            rollover_secs=props.get("imq.log.file.rolloversecs"),
        )


@dataclass
class ServiceLog:
    """The service log while it is open: set_level() at SIGHUP, close() writes the pending
    counts and lets go. ``pinned``: serve -loglevel set the level, imq.log.level does not."""

    settings: ServiceLogSettings
    throttle: Throttle
    root_level: int
    file: RotatingFile = field(repr=False)
    console: logging.Handler = field(repr=False)
    pinned: bool = False

    def set_level(self, level: int) -> None:
        """The level of the console and the file (and of the root logger); third-party
        loggers pass below WARNING only at DEBUG."""
        for handler in (self.file, self.console):
            handler.setLevel(level)
        self.throttle.foreign_level = level if level <= logging.DEBUG else FOREIGN_LEVEL
        logging.getLogger().setLevel(level)
        self.settings = dataclasses.replace(self.settings, level=level)

    def close(self) -> None:
        root = logging.getLogger()
        root.removeHandler(self.throttle)
        root.setLevel(self.root_level)
        self.throttle.close()


def formatter(json_lines: bool, fmt: str = TEXT_FORMAT) -> logging.Formatter:
    """The formatter of a log the service writes: JSON lines (imq.log.format=json) or text."""
    return JsonFormatter() if json_lines else LineFormatter(fmt)


def open_service_log(
    settings: ServiceLogSettings, console: IO[str] | None = None, *, pinned: bool = False
) -> ServiceLog:
    """Send every log record of the process to the console and the service log file, as
    ``settings`` say (see the header comment); ``pinned``: the level came from the
    command line."""
    lines = formatter(settings.json)
    private_dir(settings.path.parent)
    file = RotatingFile(settings.path, settings.rollover_bytes, SERVICE_LOG_FILES, max_age=settings.rollover_secs)
    stream = Console(console if console is not None else _own_stderr())
    for handler in (file, stream):
        handler.setFormatter(lines)
    throttle = Throttle([stream, file])
    root = logging.getLogger()
    service_log = ServiceLog(settings, throttle, root.level, file, stream, pinned)
    service_log.set_level(settings.level)
    root.addHandler(throttle)
    return service_log


class EarlyLines(logging.handlers.MemoryHandler):
    """Holds the lines logged before the service log can open (the properties' warnings
    name where it goes), to hand them to it, or to the console when it never opens."""

    def __init__(self) -> None:
        super().__init__(capacity=10_000, flushLevel=logging.CRITICAL + 100)
        root = logging.getLogger()
        root.addHandler(self)
        if root.level > logging.INFO or root.level == logging.NOTSET:
            root.setLevel(logging.INFO)

    def hand_to(self, target: logging.Handler | None) -> None:
        """Pass the held lines on (to the console, formatted as text, when ``target`` is
        None) and stop holding."""
        logging.getLogger().removeHandler(self)
        if target is None:
            target = logging.StreamHandler(sys.stderr)
            target.setFormatter(LineFormatter())
        self.setTarget(target)
        self.flush()
        self.close()
