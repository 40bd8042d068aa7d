"""The embedded broker's persistent store: group commit over SQLite (WAL) or PostgreSQL.

The broker records changes (a message row added, removed, its delivery count bumped, a
subscription, an XA branch prepared or completed) into in-memory pending sets under the
store lock; a writer swaps them out and writes each swap as one transaction (a "batch").
Whatever the broker adds under one ``with store.lock`` lands in the same batch, so a JMS
commit is atomic on disk. A row added and removed before its batch is written never
touches the disk. Where batches go is a ``Database``: ``SQLiteDatabase`` (store.db,
imq.persist.store=file) or ``pgstore.PostgresDatabase`` (imq.persist.store=jdbc).

Rules: everything promised (a persistent send's answer, a STOMP RECEIPT, a commit, a
CLIENT_ACKNOWLEDGE, every XA prepare and commit) waits for its batch (``ticket()``,
``wait(ticket)``), whatever the sync setting; a batch that cannot be written (disk full, a
database out of reach) is kept and retried, never lost, and its waiters get StoreFull;
batches apply in a fixed order (inserts, ordered ops, delivery counts, deletes), and a seq
is never reused.

Design notes: docs/embedded-broker.md#internals-providersembeddedstorepy.
"""

from __future__ import annotations

import bisect
import errno
import functools
import json
import logging
import mmap
import os
import sqlite3
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...backoff import backoff_delay
from ...jms import codec
from ...jms.errors import (  # jms-level: the CLI names them without knowing the store
    StoreError,
    StoreFull,
    StoreUnavailable,
)
from ...jms.message import Message
from ...private import private_dir, private_file, tighten

log = logging.getLogger(__name__)

# 2: subs.owner, the user a durable subscription belongs to (NULL: made before owners
# were recorded; version 1 stores get the column, empty, when they are opened).
SCHEMA_VERSION = "2"
UPGRADES = {"1": ("ALTER TABLE subs ADD COLUMN owner TEXT",)}  # from version -> statements
LINGER = 0.5  # seconds the writer thread lets a batch grow (nobody waits for it; module doc)
RETRY_BASE, RETRY_CAP = 0.05, 2.0  # seconds between writes of a full store (doubling, capped)
# bucket bounds (seconds, Prometheus "le") of the batch write latency histogram (metrics)
COMMIT_BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
NO_ROOM = 1 << 20  # bytes free below which an I/O error counts as no space left
SQLITE_FULL, SQLITE_IOERR = 13, 10
BEHIND = 32 << 20  # bytes of pending inserts past which senders wait for the writer
NOW_BYTES, NOW_ROWS = 256 << 10, 1024  # at most this pending for write_now (on an event loop: ~ms)
Row = tuple[int, str, bytes | Message, int]  # a message row for Store.add_many: seq, qkey, blob, dcount
# WAL bytes between checkpoints (SQLite's default 1000 pages, 4 MB): a message's insert
# and its delete seconds later mostly dirty the same pages, and a checkpoint copies each
# page once however often the WAL holds it; measured: 8.0 -> 6.5 us of writer CPU per
# message inserted and deleted. The WAL file grows to about 40 MB and stays (reused, not
# shrunk). The store runs them (Store._commit), never a write on an event loop; SQLite's
# own automatic checkpoint stays at WAL_SAFETY times that, should ours fall behind.
WAL_CHECKPOINT_BYTES = 40_960_000
WAL_SAFETY = 4
_MX_FRAME = 16  # offset of mxFrame, the WAL's last frame, in the wal-index header (-shm)
# Page size of a new store.db: SQLite's default 4 KiB (one made before keeps its own).
# Large pages suit large batches (20,000 messages written then deleted: 4.2 us of writer
# CPU per message at 16 KiB, 6.2 at 4 KiB), but since every persistent send is answered
# only once written, one producer commits a transaction per message, and each writes its
# dirty pages whole to the WAL: insert + delete of a 1 KiB row, one commit each, 40-43 us
# of CPU at 16 KiB, 22-30 at 4 KiB (8 KiB no better than 16 in the broker benchmark).
PAGE_SIZE = 4096
# Messages a batch inserts per SQLite statement (a multi-row VALUES). Python's sqlite3
# lets go of the GIL around every statement it steps, so executemany's statement per row
# handed the GIL back and forth with the event loop once per message: measured with a
# thread busy beside the writer, 85 -> 27 us of wall time per message written.
INSERT_ROWS = 256
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS msgs(seq INTEGER PRIMARY KEY, qkey TEXT NOT NULL,
                                dcount INTEGER NOT NULL DEFAULT 0, blob BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS subs(client_id TEXT NOT NULL, name TEXT NOT NULL, topic TEXT NOT NULL,
                                selector TEXT, no_local INTEGER NOT NULL, owner TEXT,
                                PRIMARY KEY(client_id, name));
CREATE TABLE IF NOT EXISTS dests(qkey TEXT PRIMARY KEY, config TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS xa(xid TEXT PRIMARY KEY, state TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS xa_sends(xid TEXT NOT NULL, seq INTEGER NOT NULL, qkey TEXT NOT NULL,
                                    blob BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS xa_acks(xid TEXT NOT NULL, seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS rejected(seq INTEGER PRIMARY KEY, qkey TEXT NOT NULL, dcount INTEGER NOT NULL,
                                    blob BLOB NOT NULL, reason TEXT NOT NULL,
                                    rejected TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP);
CREATE INDEX IF NOT EXISTS msgs_qkey ON msgs(qkey, seq);
CREATE INDEX IF NOT EXISTS xa_sends_xid ON xa_sends(xid);
CREATE INDEX IF NOT EXISTS xa_acks_xid ON xa_acks(xid);
"""

INSERT_MSG = "INSERT INTO msgs(seq, qkey, dcount, blob) VALUES (?, ?, ?, ?)"
# A send and the acknowledgements recorded with it in one statement (SQLiteDatabase.write):
# a trigger's statements run in the INSERT's own transaction, so it is atomic by itself.
SEND_ACKS = """
CREATE TEMP VIEW IF NOT EXISTS send_acks(seq, qkey, dcount, blob, acks) AS
    SELECT NULL, NULL, NULL, NULL, NULL WHERE 0;
CREATE TEMP TRIGGER IF NOT EXISTS send_acks_write INSTEAD OF INSERT ON send_acks BEGIN
    INSERT INTO msgs(seq, qkey, dcount, blob) VALUES (NEW.seq, NEW.qkey, NEW.dcount, NEW.blob);
    DELETE FROM msgs WHERE seq IN (SELECT value FROM json_each(NEW.acks));
END;
"""
INSERT_SEND_ACKS = "INSERT INTO send_acks(seq, qkey, dcount, blob, acks) VALUES (?, ?, ?, ?, ?)"
SEND_ACKS_MAX = 64  # at most this many acknowledgements ride in a send's statement


def a_waiting_send(inserts: dict[int, Any], deletes: set[int], updates: dict[int, int], ops: list[Any]) -> bool:
    """A batch of a sender that waits for each send: one message and at most SEND_ACKS_MAX
    acknowledgements beside it, nothing else (each database writes it as one statement)."""
    return len(inserts) == 1 and len(deletes) <= SEND_ACKS_MAX and not (updates or ops)


# Ordered ops: name -> SQL statements run with the op's arguments.
_OPS: dict[str, tuple[str, ...]] = {
    "sub_put": (
        "INSERT OR REPLACE INTO subs(client_id, name, topic, selector, no_local, owner) VALUES (?, ?, ?, ?, ?, ?)",
    ),
    "sub_del": ("DELETE FROM subs WHERE client_id = ? AND name = ?",),
    "dest_put": ("INSERT OR REPLACE INTO dests(qkey, config) VALUES (?, ?)",),
    "dest_del": ("DELETE FROM dests WHERE qkey = ?",),
    "purge": ("DELETE FROM msgs WHERE qkey = ? AND seq < ?",),
    "purge_between": ("DELETE FROM msgs WHERE qkey = ? AND seq > ? AND seq < ?",),
    # (reason, seq): a row that is not a message, kept for the operator (its delete follows)
    "reject": (
        "INSERT INTO rejected(seq, qkey, dcount, blob, reason) "
        "SELECT seq, qkey, dcount, blob, ? FROM msgs WHERE seq = ?",
    ),
    # (reason, seq): the same for a prepared XA branch's send (xa_send_del follows)
    "reject_prepared": (
        "INSERT INTO rejected(seq, qkey, dcount, blob, reason) "
        "SELECT seq, qkey, 0, blob, ? FROM xa_sends WHERE seq = ?",
    ),
    "xa_send_del": ("DELETE FROM xa_sends WHERE seq = ?",),
    "xa_commit": (
        "INSERT INTO msgs(seq, qkey, dcount, blob) SELECT seq, qkey, 0, blob FROM xa_sends WHERE xid = ?",
        "DELETE FROM msgs WHERE seq IN (SELECT seq FROM xa_acks WHERE xid = ?)",
        "DELETE FROM xa_sends WHERE xid = ?",
        "DELETE FROM xa_acks WHERE xid = ?",
        "DELETE FROM xa WHERE xid = ?",
    ),
    "xa_rollback": (
        "DELETE FROM xa_sends WHERE xid = ?",
        "DELETE FROM xa_acks WHERE xid = ?",
        "DELETE FROM xa WHERE xid = ?",
    ),
}


@dataclass
class PreparedBranch:
    sends: list[tuple[int, str, bytes]] = field(default_factory=list)  # (seq, qkey, blob)
    acks: list[int] = field(default_factory=list)  # seqs


@dataclass
class _Claim:
    """A batch taken for writing: its number and the changes it holds."""

    batch: int
    inserts: dict[int, list[Any]]
    deletes: set[int]
    updates: dict[int, int]
    ops: list[tuple[str, tuple[Any, ...]]]
    queues: dict[str, int] = field(default_factory=dict)  # qkey -> inserts in this batch


@dataclass
class Recovered:
    """What a store holds at open: everything the broker rebuilds its state from."""

    backlogs: dict[str, int]  # qkey -> stored messages (read lazily)
    locked: list[tuple[int, str, int, bytes]]  # (seq, qkey, dcount, blob) a prepared XA branch consumed
    subscriptions: list[tuple[str, str, str, str | None, bool, str | None]]  # ..., no_local, owner
    destinations: dict[str, dict[str, Any]]
    prepared: dict[str, PreparedBranch]
    max_seq: int


class Database:
    """Where a store's batches go. ``where`` names it in errors (never a password).
    ``probe_interval``: seconds an idle store waits before it writes an empty batch, which
    the database must make a round trip for (a server that went away while nothing was
    written is noticed); None: never (a local file)."""

    where: str = ""
    probe_interval: float | None = None

    def load(self) -> Recovered:
        raise NotImplementedError

    def page(self, qkey: str, after: int, limit: int) -> list[tuple[int, int, bytes]]:
        """Up to ``limit`` (seq, dcount, blob) of ``qkey`` with seq > ``after``, by seq."""
        raise NotImplementedError

    def queue_bytes(self, qkey: str) -> int:
        """Bytes of ``qkey``'s stored messages (a destination with a byte limit, at open)."""
        raise NotImplementedError

    def write(
        self,
        inserts: dict[int, list[Any]],
        deletes: set[int],
        updates: dict[int, int],
        ops: list[tuple[str, tuple[Any, ...]]],
    ) -> None:
        """One batch as one database transaction, in the order the module comment gives."""
        raise NotImplementedError

    def no_space(self, exc: BaseException) -> bool:
        """``exc``, raised by ``write``, means no space was left (the batch can be retried)."""
        return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)

    def unavailable(self, exc: BaseException) -> bool:
        """``exc``, raised by ``write``, means the database could not be reached (the batch
        can be retried once it is back; the next write connects again)."""
        return False

    def size(self) -> int | None:
        """Bytes the store takes on disk; None where it cannot tell cheaply."""
        return None

    def checkpoint_due(self) -> bool:
        """A checkpoint should run before the next write (a cheap look, after each write)."""
        return False

    def checkpoint(self) -> None:
        """Run the checkpoint ``checkpoint_due`` asked for (by the one writer: no write
        runs beside it, so it copies the whole WAL and the next write starts it over)."""

    def close(self) -> None:
        raise NotImplementedError


class SQLiteDatabase(Database):
    """store.db in a directory, WAL mode; synchronous=FULL with sync, else OFF."""

    def __init__(self, directory: str | Path, sync: bool) -> None:
        self.path = Path(directory) / "store.db"
        self.where = str(self.path)
        try:
            # SQLite creates -wal and -shm with the database file's mode: made 0600 first
            private_file(private_dir(directory) / "store.db")
            for extra in ("store.db-wal", "store.db-shm"):
                if (Path(directory) / extra).exists():
                    tighten(Path(directory) / extra)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot create the store: {exc}") from exc
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.execute(f"PRAGMA page_size={PAGE_SIZE}")  # (a no-op on a store already made)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={'FULL' if sync else 'OFF'}")
            page_size = db.execute("PRAGMA page_size").fetchone()[0]
            db.execute(f"PRAGMA wal_autocheckpoint={WAL_SAFETY * WAL_CHECKPOINT_BYTES // page_size}")
            db.executescript(SCHEMA)
            row = db.execute("SELECT v FROM meta WHERE k = 'schema'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta(k, v) VALUES ('schema', ?)", (SCHEMA_VERSION,))
            elif row[0] in UPGRADES:
                db.execute("BEGIN IMMEDIATE")
                for statement in UPGRADES[row[0]]:
                    db.execute(statement)
                db.execute("UPDATE meta SET v = ? WHERE k = 'schema'", (SCHEMA_VERSION,))
                db.execute("COMMIT")
                log.info("store %s: upgraded from schema version %s to %s", self.path, row[0], SCHEMA_VERSION)
            elif row[0] != SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: store schema version {row[0]} is not supported "
                    f"(this broker reads version {SCHEMA_VERSION})"
                )
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot open the store: {exc}") from exc
        try:
            db.executescript(SEND_ACKS)
            self._send_acks = True
        except sqlite3.Error:  # an SQLite built without JSON: such batches take BEGIN..COMMIT
            self._send_acks = False
        self._db = db
        self._rows_per_insert = max(1, min(INSERT_ROWS, db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // 4))
        # Paging reads on a connection of their own: WAL lets them run beside the writer.
        self._reader = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._checkpoint_frames = WAL_CHECKPOINT_BYTES // page_size
        # The WAL's frame count, read from the wal-index header (https://www.sqlite.org/
        # walformat.html; native byte order) with no call into SQLite: after every write.
        with open(f"{self.path}-shm", "rb") as shm:
            self._wal_index = mmap.mmap(shm.fileno(), 0, access=mmap.ACCESS_READ)

    def size(self) -> int | None:
        total = 0
        for name in (self.path.name, f"{self.path.name}-wal", f"{self.path.name}-shm"):
            try:
                total += (self.path.parent / name).stat().st_size
            except OSError:
                pass
        return total

    def load(self) -> Recovered:
        try:
            return recovered(self._db.execute)
        except (sqlite3.Error, ValueError) as exc:
            raise StoreError(f"{self.path}: cannot read the store: {exc}") from exc

    def page(self, qkey: str, after: int, limit: int) -> list[tuple[int, int, bytes]]:
        try:
            return self._reader.execute(PAGE_SQL, (qkey, after, limit)).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot read the store: {exc}") from exc

    def queue_bytes(self, qkey: str) -> int:
        try:
            return int(self._reader.execute(BYTES_SQL, (qkey,)).fetchone()[0])
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot read the store: {exc}") from exc

    def write(
        self,
        inserts: dict[int, list[Any]],
        deletes: set[int],
        updates: dict[int, int],
        ops: list[tuple[str, tuple[Any, ...]]],
    ) -> None:
        db = self._db
        if len(inserts) == 1 and not (deletes or updates or ops):
            # A lone sender's batch (one per message while it waits for each): its INSERT
            # alone, atomic by itself (autocommit), without building a batch's statements
            for seq, (qkey, dcount, blob) in inserts.items():
                db.execute(INSERT_MSG, (seq, qkey, dcount, blob))
            return
        if deletes and a_waiting_send(inserts, deletes, updates, ops) and self._send_acks:
            # A waiting sender's batch with the acknowledgements of the consumers taking
            # its messages: one statement, not four calls (BEGIN, INSERT, DELETE, COMMIT)
            # that each let go of the GIL and hand it to a consumer thread and back
            for seq, (qkey, dcount, blob) in inserts.items():
                acks = "[" + ",".join(map(str, deletes)) + "]"  # (a JSON array: 0.3 us, json.dumps 2.1)
                db.execute(INSERT_SEND_ACKS, (seq, qkey, dcount, blob, acks))
            return
        steps: list[tuple[str, list[tuple[Any, ...]]]] = []
        write_batch(
            lambda sql, args: steps.append((sql, args)),
            inserts,
            deletes,
            updates,
            ops,
            _OPS,
            "INSERT OR REPLACE INTO xa(xid, state) VALUES (?, 'prepared')",
            rows_per_insert=self._rows_per_insert,
        )
        if len(steps) == 1 and len(steps[0][1]) == 1:
            # One statement run once is atomic by itself (autocommit): a persistent send
            # or an acknowledgement written alone skips two round trips, BEGIN and COMMIT
            db.execute(steps[0][0], steps[0][1][0])
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            for sql, args in steps:
                db.executemany(sql, args)
            db.execute("COMMIT")
        except BaseException:
            # SQLite rolls back by itself after some errors (SQLITE_FULL on COMMIT): a
            # ROLLBACK then failed with "no transaction is active" and hid the cause
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def no_space(self, exc: BaseException) -> bool:
        """SQLITE_FULL (the database or its WAL could not grow), ENOSPC, or an I/O error
        (a failed fsync) while the filesystem has next to no room left."""
        if isinstance(exc, sqlite3.Error):
            code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
            if code == SQLITE_FULL:
                return True
            if code != SQLITE_IOERR:
                return False
            try:
                fs = os.statvfs(self.path.parent)
            except OSError:
                return False
            return fs.f_bavail * fs.f_frsize < NO_ROOM
        return super().no_space(exc)

    def checkpoint_due(self) -> bool:
        return bool(struct.unpack_from("=I", self._wal_index, _MX_FRAME)[0] >= self._checkpoint_frames)

    def checkpoint(self) -> None:
        # (fetchall: a statement left unfinished would hold a read of the WAL)
        self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def close(self) -> None:
        self._wal_index.close()
        self._reader.close()
        self._db.close()


PAGE_SQL = "SELECT seq, dcount, blob FROM msgs WHERE qkey = ? AND seq > ? ORDER BY seq LIMIT ?"
BYTES_SQL = "SELECT COALESCE(SUM(LENGTH(blob)), 0) FROM msgs WHERE qkey = ?"


def recovered(execute: Callable[..., Any]) -> Recovered:
    """What a store holds, read through a DB-API ``execute`` returning a cursor: counts of
    waiting messages (an index scan), not the messages themselves."""
    backlogs = {q: int(n) for q, n in execute("SELECT qkey, COUNT(*) FROM msgs GROUP BY qkey").fetchall()}
    locked = [
        (seq, q, d, bytes(b))
        for seq, q, d, b in execute(
            "SELECT m.seq, m.qkey, m.dcount, m.blob FROM msgs m JOIN xa_acks a ON a.seq = m.seq ORDER BY m.seq"
        ).fetchall()
    ]
    subs = [
        (c, n, t, s, bool(nl), o)
        for c, n, t, s, nl, o in execute(
            "SELECT client_id, name, topic, selector, no_local, owner FROM subs"
        ).fetchall()
    ]
    dests = {k: json.loads(v) for k, v in execute("SELECT qkey, config FROM dests").fetchall()}
    prepared: dict[str, PreparedBranch] = {}
    for (xid,) in execute("SELECT xid FROM xa WHERE state = 'prepared'").fetchall():
        prepared[xid] = PreparedBranch()
    for xid, seq, qkey, blob in execute("SELECT xid, seq, qkey, blob FROM xa_sends ORDER BY seq").fetchall():
        prepared.setdefault(xid, PreparedBranch()).sends.append((seq, qkey, bytes(blob)))
    for xid, seq in execute("SELECT xid, seq FROM xa_acks ORDER BY seq").fetchall():
        prepared.setdefault(xid, PreparedBranch()).acks.append(seq)
    max_seq = max(
        execute("SELECT COALESCE(MAX(seq), 0) FROM msgs").fetchone()[0],
        execute("SELECT COALESCE(MAX(seq), 0) FROM xa_sends").fetchone()[0],
    )
    return Recovered(backlogs, locked, subs, dests, prepared, max_seq)


def write_batch(
    executemany: Callable[[str, list[tuple[Any, ...]]], Any],
    inserts: dict[int, list[Any]],
    deletes: set[int],
    updates: dict[int, int],
    ops: list[tuple[str, tuple[Any, ...]]],
    statements: dict[str, tuple[str, ...]],
    prepare_xa: str | tuple[str, ...],
    mark: str = "?",
    insert_msg: str = INSERT_MSG,
    rows_per_insert: int = 1,
    arrays: tuple[str, str] | None = None,
) -> None:
    """A batch's statements in the fixed order (inserts, ordered ops, delivery counts,
    deletes) inside the caller's transaction; ``mark`` is the driver's placeholder;
    ``prepare_xa`` the statement(s), each taking the xid, that begin a prepared branch.
    ``rows_per_insert`` > 1 (``mark`` "?" only): messages go in statements of that many
    rows each (one multi-row VALUES), not a statement per row (see INSERT_ROWS).
    ``arrays`` (insert, delete): statements taking the batch's rows as arrays (seqs,
    keys, counts, blobs; seqs), run once for two or more rows instead of once per row."""

    def sql(text: str) -> str:
        return text if mark == "?" else text.replace("?", mark)

    if arrays is not None and len(inserts) > 1:
        executemany(arrays[0], [tuple(map(list, zip(*((seq, q, d, b) for seq, (q, d, b) in inserts.items()))))])
    elif inserts and rows_per_insert > 1:
        values = [x for seq, (q, d, b) in inserts.items() for x in (seq, q, d, b)]
        step = 4 * rows_per_insert
        for at in range(0, len(values), step):
            part = values[at : at + step]
            executemany(_rows_sql(insert_msg, len(part) // 4), [tuple(part)])
    elif inserts:
        executemany(sql(insert_msg), [(seq, q, d, b) for seq, (q, d, b) in inserts.items()])
    for name, args in ops:
        if name == "xa_prepare":
            xid, sends, acks = args
            for statement in (prepare_xa,) if isinstance(prepare_xa, str) else prepare_xa:
                executemany(sql(statement), [(xid,)])
            if sends:
                executemany(
                    sql("INSERT INTO xa_sends(xid, seq, qkey, blob) VALUES (?, ?, ?, ?)"),
                    [(xid, seq, q, b) for seq, q, b in sends],
                )
            if acks:
                executemany(sql("INSERT INTO xa_acks(xid, seq) VALUES (?, ?)"), [(xid, seq) for seq in acks])
            continue
        for statement in statements[name]:
            executemany(sql(statement), [args])
    if updates:
        executemany(sql("UPDATE msgs SET dcount = ? WHERE seq = ?"), [(d, seq) for seq, d in updates.items()])
    if deletes:
        singles, runs = delete_runs(deletes)
        if runs:
            executemany(sql("DELETE FROM msgs WHERE seq BETWEEN ? AND ?"), runs)
        if arrays is not None and len(singles) > 1:
            executemany(arrays[1], [([seq for (seq,) in singles],)])
        elif singles:
            executemany(sql("DELETE FROM msgs WHERE seq = ?"), singles)


@functools.lru_cache(maxsize=64)
def _rows_sql(insert_msg: str, rows: int) -> str:
    """``insert_msg`` with ``rows`` rows in its VALUES: built once per row count, not per
    batch (a one-message batch built and joined the 256-row text each time)."""
    head, row = insert_msg.split(" VALUES ")
    return f"{head} VALUES {', '.join([row] * rows)}"


def _pending_size(blob: bytes | Message) -> int:
    """Bytes a pending row counts for (``behind``): a lazy row's message estimated, as the
    broker estimates a message it has not encoded."""
    return len(blob) if isinstance(blob, bytes) else blob.body_size() + 200


def _encode_row(row: list[Any]) -> bytes:
    """A pending row's blob, a lazy row's message encoded now (the broker checked its
    headers; it never changes a routed message)."""
    blob = row[2]
    if type(blob) is not bytes:
        blob = row[2] = codec.encode(blob)
    return blob


def delete_runs(deletes: set[int]) -> tuple[list[tuple[int]], list[tuple[int, int]]]:
    """Deleted seqs as lone seqs and (first, last) runs of consecutive ones: consumers ack
    in seq order, so a batch's deletes are mostly a few runs, one statement step each
    instead of one per row. A run holds every seq between its ends (a seq names one row)."""
    singles: list[tuple[int]] = []
    runs: list[tuple[int, int]] = []
    ordered = sorted(deletes)
    first = last = ordered[0]
    for seq in ordered[1:]:
        if seq != last + 1:
            if last > first:
                runs.append((first, last))
            else:
                singles.append((first,))
            first = seq
        last = seq
    if last > first:
        runs.append((first, last))
    else:
        singles.append((first,))
    return singles, runs


class Store:
    """Group commit over a ``Database`` (SQLite under ``directory`` unless one is given);
    see the module comment."""

    def __init__(
        self, directory: str | Path | None = None, *, sync: bool = False, database: Database | None = None
    ) -> None:
        if database is None:
            if directory is None:
                raise ValueError("a store needs a directory or a database")
            database = SQLiteDatabase(directory, sync)
        self.database = database
        self.path = database.where  # what errors and logs name
        self.sync = sync
        self.linger = LINGER
        self.lock = threading.RLock()
        self._work = threading.Condition(self.lock)  # the writer waits here for changes
        self._written = threading.Condition(self.lock)  # callers wait here for batches
        self._waiting = 0  # callers blocked in wait()
        self._writing = False  # a batch is being written
        self._claim: _Claim | None = None  # ...this one
        self._idle = False  # the writer sleeps until a change
        self._first_change: float | None = None  # pending since (not idle; _gather)
        self._inserts: dict[int, list[Any]] = {}
        self._pending_bytes = 0  # blobs in _inserts
        self._pending_queues: dict[str, int] = {}  # qkey -> rows in _inserts
        self._deletes: set[int] = set()
        self._updates: dict[int, int] = {}
        self._ops: list[tuple[str, tuple[Any, ...]]] = []
        self._next = 1  # number of the batch the writer takes next
        self._done = 0  # last batch committed
        self._error: BaseException | None = None
        self._full: BaseException | None = None  # why the last write failed for lack of space
        self._down = False  # ... and it was the database that could not be reached
        self._full_since = 0.0
        self._failed = 0  # last batch that failed for lack of space (its changes pending again)
        self._attempts = 0  # failed writes in a row while full (the retry backoff)
        self._closing = False
        self._checkpoint_wanted = False  # a write on a loop found one due: the writer runs it
        self._checkpoint_failed = False
        self.checkpoints = 0
        self.rejected = 0  # rows set aside: not messages (set_aside)
        self.batches = 0  # written batches (benchmarks report batch sizes)
        self.rows = 0
        # seconds per batch write (its fsync included when sync): counts per COMMIT_BOUNDS bucket
        self.commit_buckets = [0] * (len(COMMIT_BOUNDS) + 1)
        self.commit_seconds = 0.0
        self._writer = threading.Thread(target=self._run, name=f"store-writer:{self.path}", daemon=True)

    # --- open -----------------------------------------------------------------
    def load(self) -> Recovered:
        """Read what the broker rebuilds from, then start the writer. Call once, before
        any change."""
        rec = self.database.load()
        self._writer.start()
        return rec

    def page(self, qkey: str, after: int, limit: int) -> list[tuple[int, int, bytes]]:
        """Up to ``limit`` (seq, dcount, blob) of ``qkey`` after seq ``after``, in seq
        order: the database's rows and the changes not written yet (module comment)."""
        with self.lock:
            batches = [self._claim] if self._claim is not None else []
            batches.append(_Claim(0, self._inserts, self._deletes, self._updates, self._ops, self._pending_queues))
            if any(name in ("purge", "purge_between", "xa_commit") for b in batches for name, _ in b.ops):
                moving = True
            else:
                moving = False
                pending: dict[int, tuple[int, bytes]] = {}
                gone: set[int] = set()
                dcounts: dict[int, int] = {}
                for b in batches:  # the batch being written first: it is the older
                    if qkey in b.queues:  # (a count that a cancelled insert leaves high)
                        for seq, row in b.inserts.items():
                            if row[0] == qkey and seq > after:
                                pending[seq] = (row[1], _encode_row(row))
                    gone.update(seq for seq in b.deletes if seq > after)
                    dcounts.update((seq, d) for seq, d in b.updates.items() if seq > after)
        if moving:
            self.flush()
            return self.database.page(qkey, after, limit)
        if not (pending or gone or dcounts):  # the common case: the database has it all
            return self.database.page(qkey, after, limit)
        # Enough rows that ``limit`` remain when every pending delete is among them.
        rows = {seq: (dcount, blob) for seq, dcount, blob in self.database.page(qkey, after, limit + len(gone))}
        rows.update(pending)  # (a batch written meanwhile is in both)
        out = []
        for seq in sorted(rows):
            if seq not in gone:
                dcount, blob = rows[seq]
                out.append((seq, dcounts.get(seq, dcount), blob))
                if len(out) == limit:
                    break
        return out

    def queue_bytes(self, qkey: str) -> int:
        return self.database.queue_bytes(qkey)

    # --- recording changes (callers may hold the broker lock) -------------------
    def _check(self) -> None:
        if self._error is not None:
            raise StoreError(f"{self.path}: the store failed and accepts no more changes: {self._error}")
        if self._closing:
            raise StoreError(f"{self.path}: the store is closed")

    @property
    def full(self) -> bool:
        return self._full is not None

    def _no_space(self) -> StoreFull:
        if self._down:
            return StoreUnavailable(
                f"store unavailable: {self.path}: its database cannot be reached "
                f"({self._full}); changes are kept and written once it is back"
            )
        return StoreFull(f"store full: {self.path}: no space left")

    def check_room(self) -> None:
        """StoreFull while the store is full: the broker asks before it routes a persistent
        message, so a refused one is nowhere (acknowledgements are never refused)."""
        if self._full is not None:
            raise self._no_space()

    def add_many(self, rows: Iterable[Row]) -> int:
        """Record message rows (seq, qkey, blob, dcount) under one taking of the lock (a run
        of sends routed together); the ticket of the batch that will hold them all
        (``ticket()`` right after, without taking the lock again). A ``blob`` may be the
        message itself, its headers checked (codec.check_headers): encoded when its batch
        is cut, so a row cancelled before is never encoded ("Lazy rows" above)."""
        with self.lock:
            self._check()
            inserts, queues = self._inserts, self._pending_queues
            size = 0
            for seq, qkey, blob, dcount in rows:
                inserts[seq] = [qkey, dcount, blob]
                size += _pending_size(blob)
                queues[qkey] = queues.get(qkey, 0) + 1
            self._pending_bytes += size
            if self._pending_bytes >= BEHIND // 2:
                self._work.notify()  # ends a linger before senders must wait (behind)
            else:
                self._changed()
            return self._next

    def remove(self, seq: int) -> None:
        self.remove_all((seq,))

    def remove_all(self, seqs: Iterable[int]) -> None:
        """Record removals (a batch of acknowledgements) under one taking of the lock. A
        removal cancels its row's pending insert, whose bytes then no longer count as
        pending (``behind``, the linger's end at half BEHIND)."""
        with self.lock:
            inserts, deletes, updates = self._inserts, self._deletes, self._updates
            deleted = cancelled = False
            for seq in seqs:
                updates.pop(seq, None)
                pending = inserts.pop(seq, None)
                if pending is None:
                    deletes.add(seq)
                    deleted = True
                else:
                    self._pending_bytes -= _pending_size(pending[2])
                    cancelled = True
            if deleted:
                self._changed()
            elif cancelled and self._waiting and not self._dirty():
                self._written.notify_all()  # cancelling left nothing to wait for

    def mark_delivered(self, seq: int, dcount: int, wake: bool = False) -> None:
        """Record a message's delivery count, with the next batch; ``wake``: have the
        writer write it now (a destination that counts backouts: so a crash loses none)."""
        self.mark_delivered_all(((seq, dcount),), wake)

    def mark_delivered_all(self, marks: Iterable[tuple[int, int]], wake: bool = False) -> None:
        """mark_delivered for each (seq, delivery count) of a batch taken together, under
        one taking of the lock."""
        with self.lock:
            inserts, updates = self._inserts, self._updates
            for seq, dcount in marks:
                pending = inserts.get(seq)
                if pending is not None:
                    pending[1] = dcount
                else:
                    updates[seq] = dcount
            if wake:
                self._changed()

    def op(self, name: str, *args: Any, waited: bool = False) -> None:
        """Record an ordered op (see ``_OPS`` and ``_write``). ``waited``: the caller
        wait()s for it next and so writes it itself; the writer thread is not woken for it
        (two context switches per op saved)."""
        with self.lock:
            self._check()
            self._ops.append((name, args))
            if not waited:
                self._changed()

    def prepare_xa(self, xid: str, sends: list[tuple[int, str, bytes]], acks: list[int], waited: bool = False) -> None:
        self.op("xa_prepare", xid, sends, acks, waited=waited)

    # --- durability -------------------------------------------------------------
    def _changed(self) -> None:
        if self._idle:
            self._work.notify()
        elif self._first_change is None:
            self._first_change = time.monotonic()

    def _dirty(self) -> bool:
        return bool(self._inserts or self._deletes or self._updates or self._ops)

    def _settled(self, ticket: int) -> bool:
        """Batch ``ticket`` is written, or nothing is left to write (a cancelled insert)."""
        return (
            self._done >= ticket
            or self._error is not None
            or self._failed >= ticket
            or (not self._dirty() and self._done == self._next - 1)
        )

    def ticket(self) -> int:
        """The batch that will hold every change recorded so far (the one being written
        when nothing is pending)."""
        with self.lock:
            return self._next if self._dirty() else self._next - 1

    def wait(self, ticket: int, timeout: float | None = None) -> None:
        """Block until batch ``ticket`` is committed (fsynced in sync mode). Leader/follower
        group commit: a caller that finds nobody writing writes everything pending itself,
        at once; the callers that arrive while it writes wait, and the first of them writes
        what they recorded meanwhile in one batch."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self.lock:
                while self._writing and not self._settled(ticket):
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise StoreError(f"{self.path}: timed out waiting for the store to write")
                    self._waiting += 1
                    try:
                        self._written.wait(remaining)
                    finally:
                        self._waiting -= 1
                if self._settled(ticket):
                    if self._done < ticket and self._error is not None:
                        raise StoreError(f"{self.path}: the store failed: {self._error}")
                    if self._done < ticket and self._failed >= ticket:
                        raise self._no_space()  # kept pending: written once space is back
                    return
                claim = self._take()  # also while closing: close() waits for this write
            self._commit(claim)

    def write_now(self, ticket: int) -> bool:
        """Write batch ``ticket`` on the calling thread if that cannot wait for anyone: a
        file store without fsync (a write is a copy into the page cache) that nobody is
        writing, with little pending (NOW_BYTES, NOW_ROWS). True once the batch is settled
        (``wait`` then returns, or raises what the write met); False when the caller
        should ``wait`` where blocking is allowed (the jms service and the STOMP bridge
        write here on their event loop instead of a pool: two thread hand-offs less)."""
        if self.sync or not isinstance(self.database, SQLiteDatabase):
            return False
        with self.lock:
            if self._settled(ticket):
                return True
            if self._writing or self._full is not None or self._closing or self._checkpoint_wanted:
                return False  # (a checkpoint is due: the next write off the loop runs it)
            rows = len(self._inserts) + len(self._deletes) + len(self._updates)
            if self._pending_bytes > NOW_BYTES or rows > NOW_ROWS:
                return False  # (what nobody waited for piled up: a batch too long for a loop)
            claim = self._take()
        self._commit(claim, on_loop=True)
        return True

    @property
    def behind(self) -> bool:
        """More than BEHIND bytes of messages wait to be written (a lock-free read)."""
        return self._pending_bytes > BEHIND

    def flush(self) -> None:
        self.wait(self.ticket())

    # --- writing: one writer at a time, a caller (wait) or the writer thread --------------
    def _take(self) -> _Claim:
        """Become the writer of everything pending (under the lock, nobody writing)."""
        claim = _Claim(self._next, self._inserts, self._deletes, self._updates, self._ops, self._pending_queues)
        self._inserts, self._deletes, self._updates, self._ops = {}, set(), {}, []
        self._pending_bytes = 0
        self._pending_queues = {}
        self._first_change = None
        self._next += 1
        self._writing = True
        self._claim = claim
        return claim

    def _commit(self, claim: _Claim, on_loop: bool = False) -> bool:
        """Write a taken batch (outside the lock); False when it failed (see ``_full`` and
        ``_error``). Then, still the one writer, a checkpoint if one is due, unless
        ``on_loop`` (write_now): the writer thread is woken to run it."""
        started = time.perf_counter()
        try:
            for row in claim.inserts.values():  # lazy rows still pending at the cut
                if type(row[2]) is not bytes:
                    _encode_row(row)
            self._write(claim.inserts, claim.deletes, claim.updates, claim.ops)
        except BaseException as exc:
            with self.lock:
                down = self.database.unavailable(exc)
                if down or self.database.no_space(exc):  # kept, retried: the module comment
                    self._restore(claim)
                    self._failed = claim.batch
                    self._attempts += 1
                    if self._full is None:
                        self._full_since = time.monotonic()
                        if down:
                            log.error(
                                "store %s: the database cannot be reached (%s); persistent "
                                "messages are refused and pending changes retried until "
                                "it is back",
                                self.path,
                                exc,
                            )
                        else:
                            log.error(
                                "store full: %s: no space left (%s); persistent messages "
                                "are refused and pending changes retried until space is "
                                "back",
                                self.path,
                                exc,
                            )
                    self._full, self._down = exc, down
                    self._changed()  # an idle writer thread wakes up to retry
                else:  # an I/O error, a lost database: stop accepting work
                    log.error("store %s: writing batch %d failed: %s", self.path, claim.batch, exc)
                    self._error = exc
                self._writing = False
                self._claim = None
                self._written.notify_all()
            return False
        due = not self._checkpoint_failed and self.database.checkpoint_due()
        if due and not on_loop:
            self._checkpoint()
        with self.lock:
            if on_loop:
                if due:
                    self._checkpoint_wanted = True
                    self._work.notify()
            else:  # it ran, or is no longer due (SQLite's own may have run)
                self._checkpoint_wanted = False
            if self._full is not None:
                log.warning(
                    "store %s: %s after %.1f s; writing again",
                    self.path,
                    "the database is back" if self._down else "space is back",
                    time.monotonic() - self._full_since,
                )
                self._full, self._down, self._attempts = None, False, 0
            self._done = claim.batch
            self._writing = False
            self._claim = None
            if claim.inserts or claim.deletes or claim.updates or claim.ops:  # not a probe
                self.batches += 1
                self.rows += len(claim.inserts) + len(claim.deletes)
                took = time.perf_counter() - started
                self.commit_seconds += took
                self.commit_buckets[bisect.bisect_left(COMMIT_BOUNDS, took)] += 1
            self._written.notify_all()
        return True

    def _checkpoint(self) -> None:
        """The database's checkpoint (by the writer, nobody writing beside it). A failure
        is not the batch's: it is logged once, and SQLite's own automatic checkpoint
        (WAL_SAFETY) is left to do them from then on."""
        try:
            self.database.checkpoint()
        except sqlite3.Error as exc:
            log.warning("store %s: a WAL checkpoint failed (%s); SQLite's own checkpoints take over", self.path, exc)
            self._checkpoint_failed = True
            return
        self.checkpoints += 1

    def _restore(self, claim: _Claim) -> None:
        """Put a batch that could not be written back in front of what was recorded since,
        as if it had never been taken (under the lock)."""
        inserts, deletes, updates, ops = claim.inserts, claim.deletes, claim.updates, claim.ops
        inserts.update(self._inserts)
        ops.extend(self._ops)
        for seq, dcount in self._updates.items():
            if seq in inserts:
                inserts[seq][1] = dcount
            else:
                updates[seq] = dcount
        for seq in self._deletes:
            updates.pop(seq, None)
            if inserts.pop(seq, None) is None:
                deletes.add(seq)
        self._inserts, self._deletes, self._updates, self._ops = inserts, deletes, updates, ops
        self._pending_bytes = sum(_pending_size(blob) for _, _, blob in inserts.values())
        for qkey, count in claim.queues.items():  # (page merges the inserts of these queues)
            self._pending_queues[qkey] = self._pending_queues.get(qkey, 0) + count

    def _run(self) -> None:
        """The writer thread: writes what nobody waits for (non-durable sends, acks), and
        while the store is full retries with backoff until a write succeeds."""
        while True:
            with self.lock:
                probe = woken = False
                while not (
                    self._dirty() or self._closing or self._full is not None or probe or self._checkpoint_wanted
                ):
                    if woken:  # for changes their caller wrote itself (a send it waits for)
                        # so not woken per change while such callers go on: it looks
                        # again after a linger (what nobody waits for is written by then)
                        woken = False
                        self._work.wait(self.linger)
                        continue
                    self._idle = True
                    probe = not self._work.wait(self.database.probe_interval)
                    self._idle = False
                    woken = not probe
                if self._full is not None and not self._closing:
                    self._work.wait(backoff_delay(RETRY_BASE, self._attempts, RETRY_CAP))
                elif not self._checkpoint_wanted:
                    self._gather()  # the linger counts from the first change (_changed)
                # A caller is writing: what it leaves is ours, but a caller that takes
                # it first writes it (every batch wakes the waiters here: a sender
                # writing batch after batch woke this thread per message).
                target = self._next
                while self._writing and (self._closing or self._next == target):
                    self._written.wait()
                if self._writing:  # a caller took what was pending: back to the linger
                    continue
                if self._error is not None or (self._closing and not self._dirty()):
                    return
                if not self._dirty() and self._full is None and not probe and not self._checkpoint_wanted:
                    continue
                # while full or idle, or for a checkpoint, also an empty one (a probe)
                claim = self._take()
            if not self._commit(claim):
                with self.lock:
                    if self._error is not None:
                        return
                    if self._closing:
                        log.error(
                            "store full: %s: closing with %d messages, %d removals and %d other changes not written",
                            self.path,
                            len(self._inserts),
                            len(self._deletes),
                            len(self._ops),
                        )
                        return

    def _gather(self) -> None:
        """Let a batch grow for the linger (LINGER): one wake-up per batch, not
        per change, and a message consumed meanwhile never touches the disk. A caller that
        waits meanwhile writes the batch at once itself; close() ends the wait, and so
        do pending messages of half BEHIND (written before senders must wait for them)
        and a checkpoint wanted."""
        start = self._first_change
        deadline = (time.monotonic() if start is None else start) + self.linger
        while (
            not self._closing
            and not self._checkpoint_wanted
            and self._pending_bytes < BEHIND // 2
            and (remaining := deadline - time.monotonic()) > 0
        ):
            self._work.wait(remaining)

    def _write(
        self,
        inserts: dict[int, list[Any]],
        deletes: set[int],
        updates: dict[int, int],
        ops: list[tuple[str, tuple[Any, ...]]],
    ) -> None:
        self.database.write(inserts, deletes, updates, ops)

    def close(self) -> None:
        """Write what is pending, stop the writer, close the database."""
        with self.lock:
            if self._closing:
                return
            self._closing = True
            self._work.notify()
        if self._writer.is_alive():
            self._writer.join()
        self.database.close()

    def stats(self) -> dict[str, int]:
        return {"batches": self.batches, "rows": self.rows}

    def problem(self) -> str | None:
        """Why the store takes no writes now (failed, full, closed); None when it does."""
        with self.lock:
            if self._error is not None:
                return f"{self.path}: the store failed: {self._error}"
            if self._full is not None:
                if self._down:
                    return f"{self.path}: the store's database cannot be reached: {self._full}"
                return f"{self.path}: the store is full (no space left)"
            if self._closing:
                return f"{self.path}: the store is closed"
        return None

    def set_aside(self, seq: int, reason: str, prepared: bool = False) -> None:
        """Move message row ``seq``, which is not a message, to the table rejected with
        ``reason`` (in the next batch, like a removal); ``prepared``: a prepared XA
        branch's send (its commit then has no such send)."""
        with self.lock:
            if prepared:
                self.op("reject_prepared", reason, seq)
                self.op("xa_send_del", seq)
            else:
                self.op("reject", reason, seq)
                self.remove(seq)
            self.rejected += 1

    def metrics(self) -> dict[str, Any]:
        """Size on disk, batch writes and their latency histogram, rows set aside, and any
        problem."""
        with self.lock:
            buckets, total, batches = list(self.commit_buckets), self.commit_seconds, self.batches
        return {
            "size": self.database.size(),
            "batches": batches,
            "rows": self.rows,
            "rejected": self.rejected,
            "commit_bounds": COMMIT_BOUNDS,
            "commit_buckets": buckets,
            "commit_seconds": total,
            "problem": self.problem(),
        }
