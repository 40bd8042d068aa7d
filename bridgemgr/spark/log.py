# How it works: a runner=spark link receives on the driver and its executors read what was
# received from here, so that a message is acknowledged at the source only once it is on
# disk ("log, then ack", spark-notes.md). The log is a folder (<checkpoint>/sourcelog) of
# segments, one per micro-batch, named by the offsets they hold: <start>-<end>.seg holds
# the records start .. end-1 (an offset is a record's sequence number, counted from 0 over
# the life of the checkpoint). A segment is written to a temporary file, fsynced, renamed
# into place, and the folder fsynced: a segment is either all there or not at all, and a
# crash leaves at most a temporary file, removed when the log opens again.
#
# Segment format: MAGIC | u32 n | n bytes of JSON header {start, end, provider} | records,
# record = u32 id length | message id (UTF-8) | u32 blob length | codec blob (the message
# as received, jms/codec.py). Readers take any slice [lo, hi) of the offsets, across
# segments; delete_through(end) removes the segments wholly below ``end`` once Spark has
# committed them.
"""The durable log between a Spark link's driver (which receives) and its executors."""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

MAGIC = b"IMQSLOG1"
_U32 = struct.Struct(">I")
_NAME = re.compile(r"^(\d{20})-(\d{20})\.seg$")
_TMP_PREFIX = ".tmp-"


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

    def open(self) -> "SourceLog":
        """Create the folder; drop temporary files a crash left behind."""
        self.folder.mkdir(parents=True, exist_ok=True)
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
        header = json.dumps({"start": start, "end": end, "provider": provider}).encode()
        parts = [MAGIC, _U32.pack(len(header)), header]
        for message_id, blob in records:
            mid = message_id.encode("utf-8", "surrogatepass")
            parts += (_U32.pack(len(mid)), mid, _U32.pack(len(blob)), blob)
        final = self.folder / f"{start:020d}-{end:020d}.seg"
        tmp = self.folder / f"{_TMP_PREFIX}{start:020d}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            _write_all(fd, b"".join(parts))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, final)
        _fsync_dir(self.folder)
        return end

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
            raise SourceLogError(f"source log {self.folder}: records {expect} .. {hi - 1} are "
                                 "not there (was the checkpoint's sourcelog folder changed?)")

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


def read_segment(path: Path) -> Iterable[tuple[Record, str]]:
    """Every record of one segment, checked against its header."""
    data = path.read_bytes()
    try:
        if not data.startswith(MAGIC):
            raise ValueError("not a source log segment")
        pos = len(MAGIC)
        (n,) = _U32.unpack_from(data, pos)
        header = json.loads(data[pos + 4:pos + 4 + n])
        pos += 4 + n
        start, end, provider = int(header["start"]), int(header["end"]), str(header["provider"])
        view = memoryview(data)
        for offset in range(start, end):
            (n,) = _U32.unpack_from(data, pos)
            mid = bytes(view[pos + 4:pos + 4 + n]).decode("utf-8", "surrogatepass")
            pos += 4 + n
            (n,) = _U32.unpack_from(data, pos)
            blob = bytes(view[pos + 4:pos + 4 + n])
            if len(blob) != n:
                raise ValueError("truncated record")
            pos += 4 + n
            yield Record(offset, mid, blob), provider
        if pos != len(data):
            raise ValueError(f"{len(data) - pos} bytes after the last record")
    except (ValueError, KeyError, struct.error) as exc:
        raise SourceLogError(f"source log segment {path} is damaged: {exc}") from None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
