# How it works: with imq.persist.store=jdbc the coordinator's decisions live in the host
# broker's database instead of txlog.<bridge>: one row per live commit record in table
# imq_bridge_txlog (bridge, gtrid, record), the record framed and checksummed exactly as in
# the file log and stored as hex text (portable across databases); forgetting deletes rows.
# Each change is one database transaction, so a commit record is durable when log_commit
# returns. On open every row must decode to the commit record of its gtrid, or the bridge
# does not start (a damaged decision cannot be trusted either way). Any DB-API 2.0 driver
# works: statements are written with ? and rewritten to the driver's paramstyle.
"""The XA transaction log in a table of a DB-API database (the host broker's JDBC store)."""

from __future__ import annotations

import threading
from typing import Any, Callable, Mapping, Sequence

from .txlog import CommitRecord, DoneRecord, Record, TxLog, TxLogError, fold, frame, scan

DBAPIConnect = Callable[[], Any]
_PLACEHOLDERS: Mapping[str, Callable[[int], str]] = {
    "qmark": lambda i: "?", "format": lambda i: "%s", "numeric": lambda i: f":{i}",
    "named": lambda i: f":p{i}", "pyformat": lambda i: f"%(p{i})s",
}


class SqlTxLog(TxLog):
    """The records in a table of a DB-API database: one row per live commit record (the
    framed record as hex, so its checksum is checked on load); DONE deletes rows."""

    def __init__(self, connect: DBAPIConnect, bridge: str, paramstyle: str = "qmark",
                 table: str = "imq_bridge_txlog") -> None:
        if paramstyle not in _PLACEHOLDERS:
            raise ValueError(f"unknown DB-API paramstyle {paramstyle!r}")
        if not table.replace("_", "").isalnum():
            raise ValueError(f"table name {table!r}: letters, digits and _ only")
        self.connect, self.bridge, self.paramstyle, self.table = connect, bridge, paramstyle, table
        self.description = f"table {table} (bridge {bridge})"
        self._conn: Any = None
        self._lock = threading.Lock()
        self._live: dict[bytes, CommitRecord] = {}

    def _run(self, sql: str, *args: Any) -> Any:
        """``sql`` written with ? placeholders, run in this database's paramstyle."""
        parts = sql.split("?")
        text = parts[0] + "".join(_PLACEHOLDERS[self.paramstyle](i + 1) + part
                                  for i, part in enumerate(parts[1:]))
        params: Any = args
        if self.paramstyle in ("named", "pyformat"):
            params = {f"p{i + 1}": a for i, a in enumerate(args)}
        cursor = self._conn.cursor()
        cursor.execute(text, params)
        return cursor

    def open(self) -> dict[bytes, CommitRecord]:
        with self._lock:
            try:
                self._conn = self.connect()
                self._run(f"CREATE TABLE IF NOT EXISTS {self.table} (bridge VARCHAR(200) NOT NULL, "
                          "gtrid VARCHAR(200) NOT NULL, record TEXT NOT NULL, "
                          "PRIMARY KEY (bridge, gtrid))")
                self._conn.commit()
                rows = self._run(f"SELECT gtrid, record FROM {self.table} WHERE bridge = ?",
                                 self.bridge).fetchall()
            except Exception as exc:
                raise TxLogError(f"cannot open the transaction log {self.description}: "
                                 f"{exc}") from exc
            self._live = {}
            for gtrid_hex, text in rows:
                found = scan(bytes.fromhex(text))
                if (found.problem is not None or len(found.records) != 1
                        or not isinstance(found.records[0], CommitRecord)
                        or found.records[0].gtrid.hex() != gtrid_hex):
                    raise TxLogError(f"{self.description}: the row of gtrid {gtrid_hex} is not "
                                     f"a valid commit record ({found.problem or 'mismatch'}); "
                                     "it cannot be trusted, so the bridge does not start")
                fold(found.records, self._live)
            return dict(self._live)

    def log_commits(self, records: Sequence[CommitRecord], forget: Sequence[bytes] = ()) -> None:
        def insert() -> None:
            self._delete(forget)
            for record in records:
                self._run(f"INSERT INTO {self.table} (bridge, gtrid, record) VALUES (?, ?, ?)",
                          self.bridge, record.gtrid.hex(), frame(record).hex())
        self._change(insert, [DoneRecord(tuple(forget)), *records])

    def log_done(self, gtrids: Sequence[bytes]) -> None:
        if gtrids:
            self._change(lambda: self._delete(gtrids), [DoneRecord(tuple(gtrids))])

    def _delete(self, gtrids: Sequence[bytes]) -> None:
        for gtrid in gtrids:
            self._run(f"DELETE FROM {self.table} WHERE bridge = ? AND gtrid = ?",
                      self.bridge, gtrid.hex())

    def _change(self, statement: Callable[[], Any], records: list[Record]) -> None:
        with self._lock:
            if self._conn is None:
                raise TxLogError(f"the transaction log {self.description} is closed")
            try:
                statement()
                self._conn.commit()
            except Exception as exc:
                try:
                    self._conn.rollback()
                except Exception:
                    pass
                raise TxLogError(f"cannot write the transaction log {self.description}: "
                                 f"{exc}") from exc
            fold(records, self._live)

    def live(self) -> dict[bytes, CommitRecord]:
        with self._lock:
            return dict(self._live)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.close()
                finally:
                    self._conn = None
