"""The Spark JVM's output (stdout and stderr) into a log file that rolls over, read from a pipe.

spark_session() points the JVM's stdout and stderr at a pipe; JvmLog, a thread, reads it
and writes what comes to SparkLog (<instance>/log/spark.log for the service,
~/.imqbridge/logs/spark.log for a CLI job) through RotatingBytes, which rolls over by size
and age as the service log does.

Rules: a file that cannot be written costs its bytes, counted, never the JVM's time; at exit
the JVM is stopped and waited for, and everything up to the pipe's end is written before the
file is closed.

Design notes: docs/spark.md#internals-sparkjvmlogpy.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import logging
import os
import select
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..logfiles import SERVICE_LOG_FILES, FileBounds, WriteFailures
from ..private import open_private, private_dir

if TYPE_CHECKING:
    from ..props import BrokerProperties

log = logging.getLogger(__name__)

SPARK_LOG = "spark.log"  # the service's Spark JVM output, beside the service log
CHUNK = 65536  # bytes read (and written) at a time
PIPE_SIZE = 1 << 20  # what the pipe holds before the JVM waits (Linux's default max)
CLOSE_WAIT = 10.0  # s the JVM is given to end at exit, its last lines read
HOLD_MS = 50  # a quiet pipe's unended line waits this long for its end before it is written


@dataclass(frozen=True)
class SparkLog:
    """Where the JVM's output goes and when that file rolls over (0 or -1: never by size,
    or by age), keeping ``files`` files (spark.log and the ones before it)."""

    path: Path
    rollover_bytes: int
    rollover_secs: float
    files: int = SERVICE_LOG_FILES

    @classmethod
    def for_service(cls, props: BrokerProperties) -> SparkLog:
        """<instance>/log/spark.log, bounded as the service log is (imq.log.file.*)."""
        return cls(
            props.instance_dir / "log" / SPARK_LOG,
            props.get("imq.log.file.rolloverbytes"),
            props.get("imq.log.file.rolloversecs"),
        )


class RotatingBytes:
    """A file (0600) of whole lines written as they come, that rolls over to <name>.1 ...
    <name>.<count-1> before a write would take it past ``limit`` bytes (the lines that fit
    are written first; a line longer than the limit is cut at it, so no file is ever
    larger) or once it is ``max_age`` seconds old (from when it was opened; a file last
    written longer ago rolls over at open). A failed write costs its bytes (counted) and
    is said once through ``report``, and once more when writing works again. The end of a
    line still being written waits in memory for the rest (up to ``limit``), so a line
    read in two pieces is not split across two files; flush() writes it as it is."""

    def __init__(
        self, path: Path, limit: int = 0, count: int = 1, *, max_age: float = 0, report: logging.Logger = log
    ) -> None:
        self.path = path
        self.bounds = FileBounds.of(path, limit, count, max_age)
        self.failures = WriteFailures(path, report)
        self.lost = 0  # bytes not written since writing last failed
        self.tail = b""  # the start of a line whose end has not come yet
        self.mid_line = False  # the file ends with an unended line (flush() wrote it)
        private_dir(path.parent)
        self.fd = -1
        self._open()
        if self.bounds.too_old(self.size, os.fstat(self.fd).st_mtime, self.opened):
            self._roll_over()

    def write(self, data: bytes) -> None:
        """Write the whole lines of what came so far; hold the start of an unended line,
        unless it is as long as a file may be. (One write per chunk: the held line joins
        the chunk's whole lines in one copy; with none held, they go out as a view.)"""
        last = data.rfind(b"\n") + 1
        if not last:  # no line ends here
            self.tail += data
        else:
            whole = memoryview(data)[:last]
            self._write(b"".join((self.tail, whole)) if self.tail else whole)
            self.tail = data[last:]
        if len(self.tail) >= (self.bounds.limit or CHUNK):
            self.flush()

    def flush(self) -> None:
        """Write the unended line held back (its writer paused mid-line, or ended)."""
        data, self.tail = self.tail, b""
        self._write(data)

    def _write(self, data: bytes | memoryview) -> None:
        if not data:
            return
        try:
            if self.fd < 0:  # (a roll-over that failed to open the new file)
                self._open()
            if self.bounds.too_old(self.size, self.opened, time.time()):
                self._roll_over()
            rest = bytes(data) if self.bounds.too_big(self.size, len(data)) else b""
            while rest and self.bounds.too_big(self.size, len(rest)):
                room = self.bounds.limit - self.size
                cut = rest.rfind(b"\n", 0, room) + 1  # the whole lines that fit
                if not cut:
                    if self.size:  # the line starts in the next file
                        self._roll_over()
                        continue
                    cut = room  # a line longer than a file
                self._put(rest[:cut])
                data = rest = rest[cut:]
                self._roll_over()
            if data:
                self._put(data)
        except OSError as exc:
            self.lost += len(data)
            self.failures.failed(exc)
            return
        if self.failures.failing:
            self.failures.writing(f" ({self.lost} bytes were lost)")
            self.lost = 0

    def _put(self, data: bytes | memoryview) -> None:
        self.mid_line = data[-1:] != b"\n"
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            self.size += n
            view = view[n:]

    def _open(self, flags: int = 0) -> None:
        self.fd = open_private(self.path, os.O_WRONLY | os.O_APPEND | flags)
        self.size = os.fstat(self.fd).st_size
        self.opened = time.time()

    def _roll_over(self) -> None:
        self.close()
        self.bounds.roll_over()
        self._open(os.O_TRUNC)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class JvmLog:
    """A pipe whose reader thread writes what comes through it to ``log``'s file: hand
    ``write_fd`` to the process that writes (as its stdout and stderr), then call started()."""

    def __init__(self, log: SparkLog) -> None:
        self.file = RotatingBytes(log.path, log.rollover_bytes, log.files, max_age=log.rollover_secs)
        self._read_fd, self.write_fd = os.pipe()
        try:
            fcntl.fcntl(self.write_fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        except (AttributeError, OSError):  # (not Linux, or over /proc/sys/fs/pipe-max-size)
            pass
        os.set_blocking(self._read_fd, False)
        self._wake_read, self._wake_write = os.pipe()
        self.ended = threading.Event()  # every writer closed the pipe and all was written
        self._thread = threading.Thread(target=self._copy, name=f"{log.path.name} writer", daemon=True)
        self._thread.start()

    def started(self) -> None:
        """The writers have their copies of the write end: close ours (its end then comes
        when theirs close)."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def _copy(self) -> None:
        poller = select.poll()
        poller.register(self._read_fd, select.POLLIN)
        poller.register(self._wake_read, select.POLLIN)
        try:
            while True:
                # an unended line is written once the pipe stayed empty for HOLD ms: not
                # in the middle of a burst, where its end is about to come
                events = dict(poller.poll(HOLD_MS if self.file.tail else None))
                if not events:
                    self.file.flush()
                    continue
                if self._wake_read in events:
                    self._take_what_is_there()
                    self.file.flush()
                    self.file.write(
                        b"\n" * self.file.mid_line
                        + b"(the JVM still runs: what it writes from here on is not in this file)\n"
                    )
                    return
                if not self._take_what_is_there():
                    self.ended.set()
                    return
        finally:
            self.file.close()
            os.close(self._read_fd)

    def _take_what_is_there(self) -> bool:
        """Write what the pipe holds now; False at its end (every writer closed it)."""
        while True:
            try:
                chunk = os.read(self._read_fd, CHUNK)
            except BlockingIOError:
                return True
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            if not chunk:
                self.file.flush()
                return False
            self.file.write(chunk)

    def close(self, timeout: float = CLOSE_WAIT) -> None:
        """Wait up to ``timeout`` s for the pipe's end, writing until then; then write what
        it holds and stop (a last line saying that later output is not in the file)."""
        self.started()
        if not self.ended.wait(timeout) and self._thread.is_alive():
            os.write(self._wake_write, b"x")
        self._thread.join(timeout)
        os.close(self._wake_read)
        os.close(self._wake_write)


_current: JvmLog | None = None  # the output of this process's Spark JVM (one per process)


def open_jvm_log(log: SparkLog) -> JvmLog:
    """The pipe for the JVM about to start; at exit the JVM is ended and its output
    written to the end (module comment)."""
    global _current
    first = _current is None
    _current = JvmLog(log)
    if first:
        atexit.register(_end_jvm)
    return _current


def _end_jvm() -> None:
    """(atexit) End the Spark JVM as our exit would (its stdin closed), waiting up to
    CLOSE_WAIT s, and write its output to the end."""
    output = _current
    if output is None:
        return
    deadline = time.monotonic() + CLOSE_WAIT
    try:
        from pyspark import SparkContext

        proc = getattr(SparkContext._gateway, "proc", None)
        if proc is not None and proc.poll() is None and proc.stdin is not None:
            context = SparkContext._active_spark_context
            if context is not None:  # (its accumulator server would fail, loudly, at the end)
                context.stop()
            proc.stdin.close()
            proc.wait(CLOSE_WAIT)
    except Exception:  # (a JVM that does not end in time: its later lines are said lost)
        pass
    output.close(max(0.5, deadline - time.monotonic()))
