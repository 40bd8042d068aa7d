"""The XA coordinator's transaction log: checksummed commit records, in a file.

The coordinator logs one thing, under presumed abort: the decision to commit a transaction
with two or more prepared branches (a CommitRecord), after every branch voted yes and before
the first commit; a DoneRecord forgets it once every branch committed. FileTxLog keeps the
records framed and checksummed in txlog.<bridge> of the bridge's var directory (bounded by
txlogSize, compacted, optionally memory-mapped, syncs grouped); MemoryTxLog survives
nothing; sqllog.SqlTxLog keeps the same records in a database table.

Rules: a record is read exactly as written or not at all; a torn last write is cut off,
any other damage leaves the log untouched and refused (TxLogDamaged); a log that cannot
take a record is TxLogFull (the link stops, its messages stay on the source).

Design notes: docs/jms-bridges.md#internals-xatxlogpy.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import struct
import threading
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

from ..jms.xa import MAXBQUALSIZE, MAXGTRIDSIZE, Xid
from ..private import open_private, private_dir
from ..props import TM_KEYS

log = logging.getLogger(__name__)

FILE_MAGIC = b"IMQTXL\x00\x01"  # file header: name and format version 1
RECORD_MAGIC = b"\xa7\x5c"
FRAME = struct.Struct(">2sII")  # record magic, payload length, CRC-32
MAX_PAYLOAD = 1 << 16
DEFAULT_SIZE = 10 * 1024 * 1024  # txlogSize when tm.props does not say
UNBOUNDED_COMPACT = 16 * 1024 * 1024  # txlogSize -1: compact when the file grows past this
PREALLOCATE = 256 * 1024  # zeros written ahead of the records at a time
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class TxLogError(Exception):
    """The transaction log cannot be read or written. Not a JMSException on purpose: a link
    whose commit decisions cannot be logged stops (with this as its error) instead of
    retrying; its messages stay on the source."""


class TxLogUnavailable(TxLogError):
    """The log's database cannot be reached now (a restart, the network): the decision was
    not logged, so the transaction rolled back; the next write connects again. A link
    takes it for a lost connection and tries again, instead of stopping."""


class TxLogDamaged(TxLogError):
    """The log holds damage a crash cannot cause: its recovery would guess, so the bridge
    does not start and the file is left as it is for the operator."""


class TxLogFull(TxLogError):
    """No room for a record: the disk is full, or txlogSize is too small for the
    transactions still in doubt."""


class RecordError(ValueError):
    """A payload that is not a record of this format (decoding is strict)."""


class RecordType(IntEnum):
    COMMIT = 1
    DONE = 2


@dataclass(frozen=True, slots=True)
class Participant:
    """One prepared branch of a logged transaction: its Xid and resource manager name."""

    rm: str
    xid: Xid


@dataclass(frozen=True, slots=True)
class CommitRecord:
    """The decision to commit global transaction ``gtrid`` with these prepared branches."""

    gtrid: bytes
    participants: tuple[Participant, ...]

    def __post_init__(self) -> None:
        if not 1 <= len(self.gtrid) <= MAXGTRIDSIZE:
            raise RecordError(f"gtrid must be 1..{MAXGTRIDSIZE} bytes")
        if any(p.xid.gtrid != self.gtrid for p in self.participants):
            raise RecordError("every branch of a commit record has the record's gtrid")


@dataclass(frozen=True, slots=True)
class DoneRecord:
    """Transactions whose every branch is committed: forget their CommitRecords."""

    gtrids: tuple[bytes, ...]


Record = CommitRecord | DoneRecord


# --- the record codec (pure) ---------------------------------------------------------------------


def encode_payload(record: Record) -> bytes:
    out = bytearray()
    if isinstance(record, CommitRecord):
        out.append(RecordType.COMMIT)
        _put_bytes8(out, record.gtrid)
        out += struct.pack(">H", len(record.participants))
        for p in record.participants:
            out += struct.pack(">i", p.xid.format_id)
            _put_bytes8(out, p.xid.bqual)
            rm = p.rm.encode("utf-8")
            out += struct.pack(">H", len(rm)) + rm
    else:
        out.append(RecordType.DONE)
        out += struct.pack(">H", len(record.gtrids))
        for gtrid in record.gtrids:
            _put_bytes8(out, gtrid)
    if len(out) > MAX_PAYLOAD:
        raise RecordError(f"a record of {len(out)} bytes is larger than {MAX_PAYLOAD}")
    return bytes(out)


def _put_bytes8(out: bytearray, value: bytes) -> None:
    if len(value) > 255:
        raise RecordError("a gtrid or bqual is at most 255 bytes")
    out.append(len(value))
    out += value


class _Reader:
    """Strict cursor over a payload: every read is bounds-checked."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise RecordError(f"payload ends at {len(self.data)}, a field needs {self.pos + n}")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def u8(self) -> int:
        return self.take(1)[0]

    def unpack(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self.take(size))[0]

    def bytes8(self) -> bytes:
        return self.take(self.u8())


def decode_payload(payload: bytes) -> Record:
    """The record ``payload`` encodes; RecordError unless it is exactly one valid record."""
    r = _Reader(payload)
    kind = r.u8()
    record: Record
    try:
        if kind == RecordType.COMMIT:
            gtrid = r.bytes8()
            participants = []
            for _ in range(r.unpack(">H")):
                format_id = r.unpack(">i")
                bqual = r.bytes8()
                if len(bqual) > MAXBQUALSIZE:
                    raise RecordError("bqual too long")
                rm = r.take(r.unpack(">H")).decode("utf-8")
                participants.append(Participant(rm, Xid(format_id, gtrid, bqual)))
            record = CommitRecord(gtrid, tuple(participants))
        elif kind == RecordType.DONE:
            gtrids = tuple(r.bytes8() for _ in range(r.unpack(">H")))
            if any(not g for g in gtrids):
                raise RecordError("an empty gtrid")
            record = DoneRecord(gtrids)
        else:
            raise RecordError(f"unknown record type {kind}")
    except (UnicodeDecodeError, ValueError, TypeError) as exc:
        raise RecordError(str(exc)) from exc
    if r.pos != len(payload):
        raise RecordError(f"{len(payload) - r.pos} byte(s) after the record")
    return record


def frame(record: Record) -> bytes:
    """The record as it is written: magic, length, CRC-32 of length and payload, payload."""
    payload = encode_payload(record)
    length = struct.pack(">I", len(payload))
    return FRAME.pack(RECORD_MAGIC, len(payload), zlib.crc32(length + payload)) + payload


# What follows the records a sync covered (FileTxLog._mark_durable): a DONE of nothing.
DURABLE_MARK = frame(DoneRecord(()))


@dataclass(frozen=True)
class Scan:
    """What scanning a log body found: the records up to ``end`` and why it stopped there."""

    records: list[Record]
    end: int  # offset after the last good record
    problem: str | None = None  # None: a clean end (no bytes, or only zeros, after ``end``)


def scan(data: bytes | memoryview, start: int = 0) -> Scan:
    """Read frames from ``start`` until the data ends or a frame is not good."""
    data = memoryview(data)
    records: list[Record] = []
    pos = start
    while True:
        rest = len(data) - pos
        if rest == 0:
            return Scan(records, pos)
        if rest < FRAME.size:
            return Scan(records, pos, _tail_problem(data[pos:], "a partial frame header"))
        magic, length, crc = FRAME.unpack_from(data, pos)
        if magic != RECORD_MAGIC:
            return Scan(records, pos, _tail_problem(data[pos:], "no record magic"))
        if length > MAX_PAYLOAD or length > rest - FRAME.size:
            return Scan(records, pos, f"a frame of {length} bytes where {rest - FRAME.size} remain")
        payload = bytes(data[pos + FRAME.size : pos + FRAME.size + length])
        if zlib.crc32(struct.pack(">I", length) + payload) != crc:
            return Scan(records, pos, "a checksum mismatch")
        try:
            records.append(decode_payload(payload))
        except RecordError as exc:
            return Scan(records, pos, f"a record that does not decode ({exc})")
        pos += FRAME.size + length


def _tail_problem(rest: memoryview, what: str) -> str | None:
    """Only zeros left is a clean end (a preallocated or mapped file); anything else is torn."""
    return None if not any(rest) else what


def next_good_frame(data: bytes | memoryview, start: int) -> int | None:
    """The offset of the first whole, checksummed, decodable frame at or after ``start``
    (searching byte by byte); None when there is none. A crash tears only the last write,
    so a good frame after a bad one means the bad one was damaged, not torn."""
    data = memoryview(data)
    raw = bytes(data)
    pos = raw.find(RECORD_MAGIC, start)
    while pos >= 0:
        if scan(data[: _frame_end(raw, pos)], pos).records:
            return pos
        pos = raw.find(RECORD_MAGIC, pos + 1)
    return None


def _frame_end(raw: bytes, pos: int) -> int:
    """Where the frame starting at ``pos`` would end (bounded by the data)."""
    if len(raw) - pos < FRAME.size:
        return len(raw)
    _magic, length, _crc = FRAME.unpack_from(raw, pos)
    return min(len(raw), pos + FRAME.size + length)


def salvage(data: bytes | memoryview, start: int) -> dict[bytes, CommitRecord]:
    """The live commit records of every good frame of a damaged log, skipping bad bytes:
    a hint for the operator resolving in-doubt transactions by hand, never a decision."""
    records: list[Record] = []
    pos: int | None = start
    while pos is not None:
        found = scan(data, pos)
        records += found.records
        if found.problem is None:
            break
        pos = next_good_frame(data, found.end + 1)
    return fold(records)


def fold(records: Iterable[Record], live: dict[bytes, CommitRecord] | None = None) -> dict[bytes, CommitRecord]:
    """The CommitRecords still live after ``records`` (in order)."""
    live = {} if live is None else live
    for record in records:
        if isinstance(record, CommitRecord):
            live[record.gtrid] = record
        else:
            for gtrid in record.gtrids:
                live.pop(gtrid, None)
    return live


# --- settings -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TxLogSettings:
    """The tm.props keys of the file log (the chapter's txlogSize, txlogSync, txlogMmap)."""

    size: int = DEFAULT_SIZE  # bytes; -1: unbounded
    sync: bool = True  # fsync the commit record before the commit phase
    mmap: bool = False

    @classmethod
    def from_tm_props(cls, tm_props: Mapping[str, str]) -> TxLogSettings:
        values: dict[str, Any] = {}
        for key, field_name in (("txlogSize", "size"), ("txlogSync", "sync"), ("txlogMmap", "mmap")):
            if key in tm_props:
                try:
                    values[field_name] = TM_KEYS[key].parse(tm_props[key])
                except ValueError:
                    raise TxLogError(f"tm.props {key}={tm_props[key]!r}: {TM_KEYS[key].expected}") from None
        settings = cls(**values)
        if settings.mmap and settings.size < 0:
            log.warning("txlogMmap needs a bounded txlogSize; using %d bytes", DEFAULT_SIZE)
            settings = cls(DEFAULT_SIZE, settings.sync, True)
        if 0 <= settings.size < 4096:
            raise TxLogError(f"tm.props txlogSize={settings.size} is too small; give at least 4k (10m is the default)")
        return settings


# --- the logs -------------------------------------------------------------------------------------


class TxLog(ABC):
    """Where a coordinator's commit decisions live."""

    description: str

    @abstractmethod
    def open(self) -> dict[bytes, CommitRecord]:
        """Open (creating if needed) and return the live commit records."""

    @abstractmethod
    def log_commits(self, records: Sequence[CommitRecord], forget: Sequence[bytes] = ()) -> None:
        """Make the decisions durable (as txlogSync says) before their commit phase, in
        one write and one sync; first forget the finished transactions ``forget``."""

    def log_commit(self, record: CommitRecord, forget: Sequence[bytes] = ()) -> None:
        self.log_commits([record], forget)

    @abstractmethod
    def log_done(self, gtrids: Sequence[bytes]) -> None:
        """Forget finished transactions (not synced: if it is lost, recovery finds no
        branch of them and forgets them again)."""

    @abstractmethod
    def live(self) -> dict[bytes, CommitRecord]:
        """The commit records not yet forgotten (a copy)."""

    def close(self) -> None:
        pass


class MemoryTxLog(TxLog):
    """For a bridge without a var directory: decisions are lost with the process."""

    description = "memory (no var directory: decisions do not survive a crash)"

    def __init__(self) -> None:
        self._live: dict[bytes, CommitRecord] = {}
        self._lock = threading.Lock()

    def open(self) -> dict[bytes, CommitRecord]:
        return self.live()

    def log_commits(self, records: Sequence[CommitRecord], forget: Sequence[bytes] = ()) -> None:
        with self._lock:
            fold([DoneRecord(tuple(forget)), *records], self._live)

    def log_done(self, gtrids: Sequence[bytes]) -> None:
        with self._lock:
            fold([DoneRecord(tuple(gtrids))], self._live)

    def live(self) -> dict[bytes, CommitRecord]:
        with self._lock:
            return dict(self._live)


class FileTxLog(TxLog):
    """txlog.<bridge>: appended frames, bounded, compacted, optionally memory-mapped."""

    def __init__(self, path: str | Path, settings: TxLogSettings = TxLogSettings()) -> None:
        self.path = Path(path)
        self.settings = settings
        self.description = str(self.path)
        self._lock = threading.Lock()  # the file, offsets, live records
        self._sync_lock = threading.Lock()  # one fsync at a time
        self._fd = -1
        self._map: mmap.mmap | None = None
        self._end = 0  # offset after the last record
        self._written = 0  # bytes appended since open (all generations)
        self._synced = 0  # ... of which known durable
        self._live: dict[bytes, CommitRecord] = {}
        self._kept = 0  # bytes the last compaction kept
        self._allocated = 0  # file size (zeros after self._end)
        self._no_prealloc = False  # preallocating failed (a full disk)
        self.compactions = 0

    @property
    def _limit(self) -> int:
        """Where the next append compacts first: txlogSize, or when unbounded, a size that
        grows with what the last compaction kept (so compaction does not run constantly)."""
        size = self.settings.size
        return size if size >= 0 else max(UNBOUNDED_COMPACT, 4 * self._kept)

    # --- open --------------------------------------------------------------------------------
    def open(self) -> dict[bytes, CommitRecord]:
        with self._lock:
            private_dir(self.path.parent)
            stale = self._compact_path
            if stale.exists():  # a compaction cut short by a crash; the log itself is whole
                stale.unlink()
            if not self.path.exists():
                self._create()
            try:
                self._fd = open_private(self.path, os.O_RDWR)
                with open(self._fd, "rb", closefd=False) as f:
                    data = f.read()
            except OSError as exc:
                raise TxLogError(f"cannot open the transaction log {self.path}: {exc}") from exc
            try:
                found = self._check(data)
            except TxLogError:
                self._close_fd()
                raise
            self._live = fold(found.records)
            self._end = self._allocated = found.end
            if found.problem is not None:
                tail = len(data.rstrip(b"\0")) - found.end
                log.warning(
                    "transaction log %s: %s at offset %d, the last record; cutting off "
                    "its %d byte(s) (a write torn by a crash: its decision was never "
                    "acted on)",
                    self.path,
                    found.problem,
                    found.end,
                    tail,
                )
            if found.problem is not None or (found.end < len(data) and not self.settings.mmap):
                self._cut_tail(found.end, len(data))
            if self.settings.mmap:
                self._map_file()
            return dict(self._live)

    def _check(self, data: bytes) -> Scan:
        """Scan the file; TxLogDamaged for what a crash cannot do: the file is created
        whole (written aside and renamed), so it is never shorter than its header, and
        only the last write can be torn, so no good record follows a bad one."""
        if not data.startswith(FILE_MAGIC):
            if len(data) < len(FILE_MAGIC) and FILE_MAGIC.startswith(data):
                raise self.damaged(
                    f"it is {len(data)} bytes long, shorter than its "
                    f"{len(FILE_MAGIC)}-byte header: it was emptied or cut "
                    "short, and the decisions it held are lost"
                )
            raise TxLogError(
                f"{self.path} is not a transaction log of this version (it "
                f"starts with {data[:8]!r}); move it away if it is not needed"
            )
        found = scan(data, len(FILE_MAGIC))
        if found.problem is not None:
            after = next_good_frame(data, found.end + 1)
            if after is not None:
                raise self.damaged(
                    f"{found.problem} at offset {found.end}, before intact "
                    f"records (the next at offset {after}): it was changed "
                    "after it was written, not torn by a crash"
                )
        return found

    def damaged(self, what: str) -> TxLogDamaged:
        bridge = self.path.name.removeprefix("txlog.")
        return TxLogDamaged(
            f"the transaction log {self.path} is damaged: {what}. It was left as it is and "
            f"recovery of bridge {bridge} stopped (its transacted links do not start). List "
            f"the in-doubt transactions with `imqbridgemgr list txn -bn {bridge}`, commit or "
            f"roll back each with `imqbridgemgr commit txn -n ID -bn {bridge}` or "
            f"`imqbridgemgr rollback txn -n ID -bn {bridge}`, then move {self.path} "
            "away (keep it for analysis) and start the bridge again"
        )

    def _create(self) -> None:
        """A new log: its header written aside, synced and renamed into place, so a file
        under the log's name always has its header (an empty one is damage, not new)."""
        size = self.settings.size if self.settings.mmap else len(FILE_MAGIC)
        self._replace_whole(
            self.path.with_name(self.path.name + ".new"),
            FILE_MAGIC,
            (lambda fd: os.ftruncate(fd, size)) if size > len(FILE_MAGIC) else None,
            "create",
        )

    def _replace_whole(self, tmp: Path, body: bytes, extend: Callable[[int], None] | None, doing: str) -> None:
        """Write ``body`` aside in ``tmp`` (then ``extend`` that file), sync it and rename it
        over the log: a crash leaves the old file or the whole new one, never a part."""
        try:
            fd = open_private(tmp, os.O_RDWR | os.O_TRUNC)
            try:
                os.pwrite(fd, body, 0)
                if extend is not None:
                    extend(fd)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            _fsync_dir(self.path.parent)
        except OSError as exc:
            try:
                tmp.unlink()
            except OSError:
                pass
            kind = TxLogFull if exc.errno in DISK_FULL else TxLogError
            raise kind(f"cannot {doing} the transaction log {self.path}: {exc.strerror}") from exc

    def _cut_tail(self, end: int, length: int) -> None:
        if self.settings.mmap:  # the file keeps its size: zero the torn bytes
            os.pwrite(self._fd, bytes(length - end), end)
        else:
            os.ftruncate(self._fd, end)
        os.fsync(self._fd)

    def _map_file(self) -> None:
        """Map the file with its txlogSize bytes allocated on disk: a store through the map
        into a hole the full disk cannot fill is a SIGBUS, which killed the service."""
        size = self.settings.size
        try:
            os.posix_fallocate(self._fd, 0, size)
        except OSError as exc:
            self._close_fd()
            kind = TxLogFull if exc.errno in DISK_FULL else TxLogError
            raise kind(
                f"cannot reserve txlogSize={size} bytes for the transaction log "
                f"{self.path}: {exc.strerror}; free space on its disk"
            ) from exc
        self._map = mmap.mmap(self._fd, size)

    # --- append --------------------------------------------------------------------------------
    def log_commits(self, records: Sequence[CommitRecord], forget: Sequence[bytes] = ()) -> None:
        self._append([DoneRecord(tuple(forget)), *records] if forget else list(records), self.settings.sync)

    def log_done(self, gtrids: Sequence[bytes]) -> None:
        if gtrids:
            self._append([DoneRecord(tuple(gtrids))], False)

    def _append(self, records: list[Record], sync: bool) -> None:
        data = b"".join(frame(r) for r in records)
        with self._lock:
            if self._fd < 0:
                raise TxLogError(f"the transaction log {self.path} is closed")
            if self._end + len(data) > self._limit:
                self._compact(len(data))
            self._write(data)
            fold(records, self._live)
            self._written += len(data)
            mark = self._written
        if sync:
            self._sync_to(mark)

    def _write(self, data: bytes) -> None:
        start = self._end
        if self._map is not None:
            self._map[start : start + len(data)] = data
        else:
            try:
                if start + len(data) > self._allocated:
                    self._preallocate(start + len(data))
                written = os.pwrite(self._fd, data, start)
                if written != len(data):
                    raise OSError(errno.ENOSPC, "short write")
            except OSError as exc:
                try:
                    os.ftruncate(self._fd, start)  # no partial record left behind
                    self._allocated = start
                except OSError:
                    pass  # the next open cuts it off
                if exc.errno in DISK_FULL:
                    raise TxLogFull(
                        f"cannot write the transaction log {self.path}: {exc.strerror}; free space on its disk"
                    ) from exc
                raise TxLogError(f"cannot write the transaction log {self.path}: {exc}") from exc
        self._end = start + len(data)

    def _preallocate(self, need: int) -> None:
        """Write zeros ahead of the records (they read as the clean end of the log): an
        fdatasync then writes data only, not a new file size, which costs about a third
        less. A disk too full for them just goes without until the next compaction."""
        target = self._allocated + PREALLOCATE
        if self.settings.size >= 0:
            target = min(target, self.settings.size)
        if self._no_prealloc or target <= need:
            return
        try:
            if os.pwrite(self._fd, bytes(target - self._allocated), self._allocated) == (target - self._allocated):
                self._allocated = target
                return
        except OSError:
            pass
        os.ftruncate(self._fd, self._allocated)
        self._no_prealloc = True

    def _sync_to(self, mark: int) -> None:
        """Make everything up to ``mark`` durable; a sync by another thread may cover it."""
        with self._sync_lock:
            if self._synced >= mark:
                return
            try:
                with self._lock:
                    covered = self._written
                    if self._map is not None:
                        self._map.flush()
                        fd = -1
                    else:
                        fd = os.dup(self._fd)  # a compaction may replace self._fd meanwhile
                if fd >= 0:
                    try:
                        os.fdatasync(fd)
                    finally:
                        os.close(fd)
            except OSError as exc:
                raise TxLogError(f"cannot sync the transaction log {self.path}: {exc}") from exc
            self._synced = max(self._synced, covered)
            self._mark_durable(covered)

    def _mark_durable(self, covered: int) -> None:
        """After a sync returned (the records it covered may be acted on now), an empty
        DONE record follows them, not synced itself: a bad last record with this after
        it was changed after it was durable, which open refuses as damage instead of
        cutting it off as a crash tear (a crash can only tear what no sync covered). A
        write that fails here costs nothing but that distinction."""
        with self._lock:
            if self._fd < 0 or self._written != covered or self._end + len(DURABLE_MARK) > self._limit:
                return  # closed, followed by a record already, or no room without compacting
            try:
                self._write(DURABLE_MARK)
            except TxLogError:
                return
            self._written += len(DURABLE_MARK)

    # --- compaction --------------------------------------------------------------------------
    @property
    def _compact_path(self) -> Path:
        return self.path.with_name(self.path.name + ".compact")

    def _compact(self, room: int) -> None:
        """Rewrite the log with its live records only (under self._lock)."""
        body = FILE_MAGIC + b"".join(frame(r) for r in self._live.values())
        if self.settings.size >= 0 and len(body) + room > self.settings.size:
            raise TxLogFull(
                f"the transaction log {self.path} is full: {len(self._live)} "
                f"transaction(s) in doubt take {len(body)} bytes and txlogSize is "
                f"{self.settings.size}; raise txlogSize in tm.props or let "
                "recovery resolve them"
            )
        size = self.settings.size
        self._replace_whole(
            self._compact_path,
            body,  # a mapped file is allocated: see _map_file
            (lambda fd: os.posix_fallocate(fd, 0, size)) if self.settings.mmap else None,
            "compact",
        )
        self._close_fd()
        self._fd = os.open(self.path, os.O_RDWR)
        if self.settings.mmap:
            self._map_file()
        self._end = self._kept = self._allocated = len(body)
        self._no_prealloc = False
        self._synced = self._written  # the rewrite was fsynced
        self.compactions += 1
        log.info("transaction log %s compacted to %d live record(s)", self.path, len(self._live))

    # --- the rest --------------------------------------------------------------------------------
    def live(self) -> dict[bytes, CommitRecord]:
        with self._lock:
            return dict(self._live)

    @property
    def end(self) -> int:
        """Offset after the last record (tests, benchmarks)."""
        return self._end

    def _close_fd(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def close(self) -> None:
        with self._sync_lock, self._lock:
            if self._fd < 0:
                return
            try:
                if self._map is not None:
                    self._map.flush()
                else:
                    os.fdatasync(self._fd)
            except OSError:
                pass
            self._close_fd()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def txlog_path(directory: str | Path, bridge: str) -> Path:
    """IMQ_VARHOME/instances/<instance>/bridges/<bridge>/txlog.<bridge> (the chapter)."""
    return Path(directory) / f"txlog.{bridge}"
