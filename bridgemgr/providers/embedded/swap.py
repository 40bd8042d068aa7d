"""The embedded broker's swap: non-persistent messages paged out of memory.

How it works: when a destination's memory window is full, a non-persistent message goes
to swap.db (a private SQLite file next to the store) instead of the heap, and is read back
in seq order with the destination's paged-out persistent messages (queues.py, "Paging").
A row is deleted as soon as its message is back in memory. Non-persistent messages do not
survive a restart, so nothing here needs to: the file is emptied when the broker opens and
removed when it closes, written without a journal or fsync, in one transaction that is
never committed (its reads see its writes; SQLite spills pages to the file as its cache
fills), which makes a message's trip through the swap a few microseconds. The broker
lock is held for every call.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ...jms.errors import StoreError
from ...private import private_dir, private_file

SCHEMA = """
CREATE TABLE swapped(seq INTEGER PRIMARY KEY, qkey TEXT NOT NULL, blob BLOB NOT NULL);
CREATE INDEX swapped_qkey ON swapped(qkey, seq);
"""


class Swap:
    """swap.db in ``directory``, empty at open."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / "swap.db"
        try:
            private_dir(directory)
            self.path.unlink(missing_ok=True)  # what a previous run swapped died with it
            private_file(self.path)
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=OFF")
            db.execute("PRAGMA synchronous=OFF")
            db.executescript(SCHEMA)
            db.execute("BEGIN")
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"{self.path}: cannot create the swap file: {exc}") from exc
        self._db = db

    def put(self, seq: int, qkey: str, blob: bytes) -> None:
        try:
            self._db.execute("INSERT INTO swapped(seq, qkey, blob) VALUES (?, ?, ?)", (seq, qkey, blob))
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot swap a message out: {exc}") from exc

    def page(self, qkey: str, after: int, limit: int) -> list[tuple[int, bytes]]:
        """Up to ``limit`` (seq, blob) of ``qkey`` with seq > ``after``, by seq."""
        try:
            return self._db.execute(
                "SELECT seq, blob FROM swapped WHERE qkey = ? AND seq > ? ORDER BY seq LIMIT ?", (qkey, after, limit)
            ).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot read the swap file: {exc}") from exc

    def forget(self, seqs: list[int]) -> None:
        """Messages back in memory (or gone)."""
        try:
            self._db.executemany("DELETE FROM swapped WHERE seq = ?", [(seq,) for seq in seqs])
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot update the swap file: {exc}") from exc

    def drop(self, qkey: str) -> None:
        """A destination went away."""
        try:
            self._db.execute("DELETE FROM swapped WHERE qkey = ?", (qkey,))
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot update the swap file: {exc}") from exc

    def close(self) -> None:
        self._db.close()
        self.path.unlink(missing_ok=True)
