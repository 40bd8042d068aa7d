"""The durable log between a Spark link's driver (which receives) and its executors.

A folder (<checkpoint>/sourcelog) of segments named by the offsets they hold
(<start>-<end>.seg); a record is a message id and the codec blob of the message as received.
Readers take any slice of offsets; delete_through(end) removes what Spark committed.

Rules: a segment is written to a temporary file, fsynced, renamed and the folder fsynced, so
it is all there or not at all; one process writes the log at a time (flock on .writer,
handed over on request: .handover).

Design notes: docs/spark.md#internals-sparklogpy.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import struct
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..private import open_private, private_dir

MAGIC = b"IMQSLOG1"
_U32 = struct.Struct(">I")
_NAME = re.compile(r"^(\d{20})-(\d{20})\.seg$")
_TMP_PREFIX = ".tmp-"
_WRITER = ".writer"
_HANDOVER = ".handover"


class SourceLogError(Exception):
    """A segment of the source log is missing or damaged (named in the message)."""


@dataclass(frozen=True)
class Record:
    offset: int
    message_id: str
    blob: bytes


@dataclass(frozen=True)
class Segment:
    start: int
    end: int
    path: Path


class SourceLog:
    """The segments of one link's source log (one writer: the driver's reader)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self._writer: int | None = None  # the lock file's descriptor while this one writes

    def own(self, wait: float | None) -> bool:
        """Become the log's one writer. ``wait`` None: only if no one is (False otherwise);
        else ask the writer to hand over and wait up to ``wait`` s for it (SourceLogError
        naming its process when it does not)."""
        private_dir(self.folder)
        fd = open_private(self.folder / _WRITER, os.O_RDWR)
        deadline = None if wait is None else time.monotonic() + wait
        asked = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is None or time.monotonic() >= deadline:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                    os.close(fd)
                    if deadline is None:
                        return False
                    raise SourceLogError(
                        f"source log {self.folder}: process {holder or '?'} still writes it after {wait:.0f} s"
                    ) from None
                if not asked:
                    (self.folder / _HANDOVER).touch()
                    asked = True
                time.sleep(0.02)
        if wait is not None:
            # answered (or left by a crashed process); a prefetcher leaves a request where it
            # is: it lets go at once
            (self.folder / _HANDOVER).unlink(missing_ok=True)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._writer = fd
        return True

    def handover_requested(self) -> bool:
        """Another process waits to take this log over (own)."""
        return (self.folder / _HANDOVER).exists()

    def let_go(self) -> None:
        """Stop being the log's writer (the lock is released; so it is at process end)."""
        if self._writer is not None:
            os.close(self._writer)
            self._writer = None

    def open(self) -> SourceLog:
        """Create the folder; drop temporary files a crash left behind."""
        private_dir(self.folder)
        for leftover in self.folder.glob(_TMP_PREFIX + "*"):
            leftover.unlink(missing_ok=True)
        return self

    def segments(self) -> list[Segment]:
        found = []
        for path in self.folder.iterdir() if self.folder.is_dir() else ():
            m = _NAME.match(path.name)
            if m:
                found.append(Segment(int(m.group(1)), int(m.group(2)), path))
        return sorted(found, key=lambda s: s.start)

    def bounds(self) -> tuple[int, int] | None:
        """(first offset held, offset after the last) or None when empty."""
        segs = self.segments()
        return (segs[0].start, segs[-1].end) if segs else None

    def append(self, start: int, records: list[tuple[str, bytes]], provider: str) -> int:
        """Write ``records`` (message id, codec blob) as the segment from ``start``; durable
        when this returns. The offset after the last record."""
        end = start + len(records)
        self.put(start, end, pack_segment(start, records, provider), durable=True)
        return end

    def put(self, start: int, end: int, data: bytes, durable: bool = False) -> None:
        """``data`` (a packed segment of records start .. end-1) as that segment: written
        aside and renamed into place; with ``durable`` the file and the folder are fsynced."""
        final = self.folder / f"{start:020d}-{end:020d}.seg"
        tmp = self.folder / f"{_TMP_PREFIX}{start:020d}"
        fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            _write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, final)
        if durable:
            _fsync_dir(self.folder)

    def pack(self, lo: int, hi: int) -> list[tuple[int, int, bytes]]:
        """Records lo .. hi-1 as packed segments (start, end, bytes): what the driver ships
        to an executor that cannot read this log. A segment wholly inside goes as its file
        is (no decoding), one cut by lo or hi is packed again with its records inside."""
        packed: list[tuple[int, int, bytes]] = []
        expect = lo
        for seg in self.segments():
            if seg.end <= expect or seg.start >= hi:
                continue
            if seg.start > expect:
                break
            if seg.start == expect and seg.end <= hi:
                packed.append((seg.start, seg.end, seg.path.read_bytes()))
            else:
                end, run, provider = min(hi, seg.end), [], ""
                for record, provider in read_segment(seg.path):  # noqa: B007 (one per segment)
                    if expect <= record.offset < end:
                        run.append((record.message_id, record.blob))
                packed.append((expect, end, pack_segment(expect, run, provider)))
            expect = packed[-1][1]
        if expect < hi:
            raise SourceLogError(
                f"source log {self.folder}: records {expect} .. {hi - 1} are "
                "not there (was the checkpoint's sourcelog folder changed?)"
            )
        return packed

    def end_within(self, lo: int, hi: int, max_bytes: int) -> int:
        """Where a batch from ``lo`` (at most to ``hi``) ends so that it holds about
        ``max_bytes`` of the log: after the first segment at which the segments' file sizes
        from ``lo`` reach it (a segment cut by lo or hi counts its share of records), so at
        least one segment's records, at most one segment beyond ``max_bytes``. No record
        is read: a file's size is its records' bytes."""
        held = 0
        for seg in self.segments():
            if seg.end <= lo:
                continue
            if seg.start >= hi:
                break
            inside = min(seg.end, hi) - max(seg.start, lo)
            held += seg.path.stat().st_size * inside // (seg.end - seg.start)
            if held >= max_bytes:
                return min(seg.end, hi)
        return hi

    def read(self, lo: int, hi: int) -> Iterator[tuple[Record, str]]:
        """Records lo .. hi-1 with the source provider's name; SourceLogError when a
        segment they need is not there (deleted too early, or a foreign folder)."""
        expect = lo
        for seg in self.segments():
            if seg.end <= lo or seg.start >= hi:
                continue
            if seg.start > expect:
                break
            for record, provider in read_segment(seg.path):
                if record.offset >= hi:
                    break
                if record.offset >= expect:
                    yield record, provider
                    expect = record.offset + 1
        if expect < hi:
            raise SourceLogError(
                f"source log {self.folder}: records {expect} .. {hi - 1} are "
                "not there (was the checkpoint's sourcelog folder changed?)"
            )

    def delete_through(self, end: int) -> int:
        """Remove the segments wholly below ``end`` (Spark committed them); how many."""
        removed = 0
        for seg in self.segments():
            if seg.end <= end:
                seg.path.unlink(missing_ok=True)
                removed += 1
        if removed:
            _fsync_dir(self.folder)
        return removed


def pack_segment(start: int, records: list[tuple[str, bytes]], provider: str) -> bytes:
    """A segment's bytes: ``records`` (message id, codec blob) from offset ``start``."""
    end = start + len(records)
    header = json.dumps({"start": start, "end": end, "provider": provider}).encode()
    parts = [MAGIC, _U32.pack(len(header)), header]
    for message_id, blob in records:
        mid = message_id.encode("utf-8", "surrogatepass")
        parts += (_U32.pack(len(mid)), mid, _U32.pack(len(blob)), blob)
    return b"".join(parts)


def read_segment(path: Path) -> Iterable[tuple[Record, str]]:
    """Every record of one segment, checked against its header."""
    return parse_segment(path.read_bytes(), str(path))


def parse_segment(data: bytes, name: str) -> Iterator[tuple[Record, str]]:
    """Every record of a segment's bytes, checked against its header (SourceLogError
    naming ``name`` when they are damaged)."""
    try:
        if not data.startswith(MAGIC):
            raise ValueError("not a source log segment")
        pos = len(MAGIC)
        (n,) = _U32.unpack_from(data, pos)
        header = json.loads(data[pos + 4 : pos + 4 + n])
        pos += 4 + n
        start, end, provider = int(header["start"]), int(header["end"]), str(header["provider"])
        view = memoryview(data)
        for offset in range(start, end):
            (n,) = _U32.unpack_from(data, pos)
            mid = bytes(view[pos + 4 : pos + 4 + n]).decode("utf-8", "surrogatepass")
            pos += 4 + n
            (n,) = _U32.unpack_from(data, pos)
            blob = bytes(view[pos + 4 : pos + 4 + n])
            if len(blob) != n:
                raise ValueError("truncated record")
            pos += 4 + n
            yield Record(offset, mid, blob), provider
        if pos != len(data):
            raise ValueError(f"{len(data) - pos} bytes after the last record")
    except (ValueError, KeyError, struct.error) as exc:
        raise SourceLogError(f"source log segment {name} is damaged: {exc}") from None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
