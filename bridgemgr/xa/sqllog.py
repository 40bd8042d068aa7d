"""The XA transaction log in a table of a DB-API database (the host broker's JDBC store).

With imq.persist.store=jdbc the coordinator's decisions live in the host broker's database
instead of txlog.<bridge>: one row per live commit record in table imq_bridge_txlog (bridge,
gtrid, record), the record framed and checksummed exactly as in the file log and stored as
hex text (portable across databases); forgetting deletes rows. Each change is one database
transaction, so a commit record is durable when log_commit returns. On open every row must
decode to the commit record of its gtrid, or the bridge does not start (a damaged decision
cannot be trusted either way: TxLogDamaged, telling the operator to resolve the in-doubt
transactions with `imqbridgemgr list|commit|rollback txn`). Any DB-API 2.0 driver works:
statements are written with ? and rewritten to the driver's paramstyle. No transaction stays
open between calls (open ends its read too: an idle transaction would hold PostgreSQL's
snapshot and locks for as long as the bridge runs). A write that fails drops the connection
and the next write connects again, so a database restart costs the transactions in between
(presumed abort: TxLogUnavailable, which a link takes for a lost connection and retries with
backoff), not every later one; a failed commit whose row did reach the database only leaves
a record that recovery finds nothing to commit for.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .txlog import (
    CommitRecord,
    DoneRecord,
    Record,
    TxLog,
    TxLogDamaged,
    TxLogError,
    TxLogUnavailable,
    fold,
    frame,
    scan,
)

DBAPIConnect = Callable[[], Any]
_PLACEHOLDERS: Mapping[str, Callable[[int], str]] = {
    "qmark": lambda i: "?",
    "format": lambda i: "%s",
    "numeric": lambda i: f":{i}",
    "named": lambda i: f":p{i}",
    "pyformat": lambda i: f"%(p{i})s",
}


class SqlTxLog(TxLog):
    """The records in a table of a DB-API database: one row per live commit record (the
    framed record as hex, so its checksum is checked on load); DONE deletes rows."""

    def __init__(
        self, connect: DBAPIConnect, bridge: str, paramstyle: str = "qmark", table: str = "imq_bridge_txlog"
    ) -> None:
        if paramstyle not in _PLACEHOLDERS:
            raise ValueError(f"unknown DB-API paramstyle {paramstyle!r}")
        if not table.replace("_", "").isalnum():
            raise ValueError(f"table name {table!r}: letters, digits and _ only")
        self.connect, self.bridge, self.paramstyle, self.table = connect, bridge, paramstyle, table
        self.description = f"table {table} (bridge {bridge})"
        self._conn: Any = None
        self._opened = False  # open() ran and close() did not: writes may reconnect
        self._lock = threading.Lock()
        self._live: dict[bytes, CommitRecord] = {}

    def _run(self, sql: str, *args: Any) -> Any:
        """``sql`` written with ? placeholders, run in this database's paramstyle."""
        parts = sql.split("?")
        text = parts[0] + "".join(_PLACEHOLDERS[self.paramstyle](i + 1) + part for i, part in enumerate(parts[1:]))
        params: Any = args
        if self.paramstyle in ("named", "pyformat"):
            params = {f"p{i + 1}": a for i, a in enumerate(args)}
        cursor = self._conn.cursor()
        cursor.execute(text, params)
        return cursor

    def open(self) -> dict[bytes, CommitRecord]:
        with self._lock:
            self._opened = False
            self._drop()
            try:
                self._conn = self.connect()
                self._create_table()
                rows = self._run(f"SELECT gtrid, record FROM {self.table} WHERE bridge = ?", self.bridge).fetchall()
                self._conn.commit()  # the read's transaction too: none stays open
            except Exception as exc:
                self._drop()
                raise TxLogError(f"cannot open the transaction log {self.description}: {exc}") from exc
            self._live = {}
            try:
                fold([self._decode(gtrid_hex, text) for gtrid_hex, text in rows], self._live)
            except TxLogError:
                self._drop()
                raise
            self._opened = True
            return dict(self._live)

    def peek(self) -> dict[bytes, CommitRecord]:
        """The commit records of the rows that decode, read on a connection of its own
        and changing nothing (for the operator while the bridge is not running)."""
        try:
            conn = self.connect()
        except Exception as exc:
            raise TxLogError(f"cannot read the transaction log {self.description}: {exc}") from exc
        records: list[Record] = []
        with self._lock:
            self._conn = conn
            try:
                rows = self._run(f"SELECT gtrid, record FROM {self.table} WHERE bridge = ?", self.bridge).fetchall()
                conn.rollback()
            except Exception as exc:
                raise TxLogError(f"cannot read the transaction log {self.description}: {exc}") from exc
            finally:
                self._drop()
        for gtrid_hex, text in rows:
            try:
                records.append(self._decode(gtrid_hex, text))
            except TxLogError:
                continue
        return fold(records)

    def _decode(self, gtrid_hex: str, text: str) -> CommitRecord:
        """The commit record of one row; TxLogError naming the row when it is not one."""
        try:
            found = scan(bytes.fromhex(text))
        except ValueError as exc:  # not hex at all
            problem = f"not hex: {exc}"
        else:
            record = found.records[0] if len(found.records) == 1 else None
            if found.problem is None and isinstance(record, CommitRecord) and record.gtrid.hex() == gtrid_hex:
                return record
            problem = found.problem or "mismatch"
        raise TxLogDamaged(
            f"the transaction log {self.description} is damaged: the row of gtrid {gtrid_hex} "
            f"is not a valid commit record ({problem}). It was left as it is and recovery of "
            f"bridge {self.bridge} stopped (its transacted links do not start). List the "
            f"in-doubt transactions with `imqbridgemgr list txn -bn {self.bridge}`, commit or "
            f"roll back each with `imqbridgemgr commit txn -n ID -bn {self.bridge}` or "
            f"`imqbridgemgr rollback txn -n ID -bn {self.bridge}`, then delete the row "
            f"(DELETE FROM {self.table} WHERE bridge = '{self.bridge}' AND gtrid = "
            f"'{gtrid_hex}') and start the bridge again"
        )

    def _create_table(self) -> None:
        """CREATE TABLE IF NOT EXISTS is not atomic in PostgreSQL: of two bridges creating
        the table at the same moment one fails on the catalog's unique index (pg_type);
        the table is there then, so a second try finds it."""
        create = (
            f"CREATE TABLE IF NOT EXISTS {self.table} (bridge VARCHAR(200) NOT NULL, "
            "gtrid VARCHAR(200) NOT NULL, record TEXT NOT NULL, PRIMARY KEY (bridge, gtrid))"
        )
        try:
            self._run(create)
            self._conn.commit()
        except Exception:
            self._conn.rollback()
            self._run(create)
            self._conn.commit()

    def log_commits(self, records: Sequence[CommitRecord], forget: Sequence[bytes] = ()) -> None:
        def insert() -> None:
            self._delete(forget)
            for record in records:
                self._run(
                    f"INSERT INTO {self.table} (bridge, gtrid, record) VALUES (?, ?, ?)",
                    self.bridge,
                    record.gtrid.hex(),
                    frame(record).hex(),
                )

        self._change(insert, [DoneRecord(tuple(forget)), *records])

    def log_done(self, gtrids: Sequence[bytes]) -> None:
        if gtrids:
            self._change(lambda: self._delete(gtrids), [DoneRecord(tuple(gtrids))])

    def _delete(self, gtrids: Sequence[bytes]) -> None:
        for gtrid in gtrids:
            self._run(f"DELETE FROM {self.table} WHERE bridge = ? AND gtrid = ?", self.bridge, gtrid.hex())

    def _change(self, statement: Callable[[], Any], records: list[Record]) -> None:
        with self._lock:
            if not self._opened:
                raise TxLogError(f"the transaction log {self.description} is closed")
            try:
                if self._conn is None:  # the last write failed: a new connection
                    self._conn = self.connect()
                statement()
                self._conn.commit()
            except Exception as exc:
                self._drop()  # its state is unknown (lost, or mid-transaction): never reused
                kind = TxLogUnavailable if _connection_error(exc) else TxLogError
                raise kind(f"cannot write the transaction log {self.description}: {exc}") from exc
            fold(records, self._live)

    def live(self) -> dict[bytes, CommitRecord]:
        with self._lock:
            return dict(self._live)

    def _drop(self) -> None:
        """Close the connection, if any, ignoring errors (it may be lost already); an
        open transaction on it is rolled back by the database."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    def close(self) -> None:
        with self._lock:
            self._opened = False
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()


def _connection_error(exc: BaseException) -> bool:
    """A DB-API OperationalError or InterfaceError (the database unreachable, the
    connection lost), by the standard's class names: any driver raises them; anywhere in
    the chain of causes, since the connect function may wrap it (the store's StoreError)."""
    seen: BaseException | None = exc
    while seen is not None:
        if any(c.__name__ in ("OperationalError", "InterfaceError") for c in type(seen).__mro__):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
