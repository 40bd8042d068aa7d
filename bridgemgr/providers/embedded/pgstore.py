"""The embedded broker's store in PostgreSQL (psycopg 3).

With imq.persist.store=jdbc the host broker keeps the SQLite store's tables (same rows,
same batch order) in a PostgreSQL schema of its own per broker instance; a batch is one
PostgreSQL transaction, sync is synchronous_commit. The bridges' XA logs go into the same
database (xa/sqllog.py); an HA instance (cluster.py) fences every batch on its lease.

Rules: a connection the database dropped is replaced at the next write and the batch
retried with backoff; since a commit lost with its connection may have happened, the next
write first looks which of that batch's messages are there (every other statement is an
upsert or a delete); a message insert that conflicts is an error, never skipped.

Design notes: docs/embedded-broker.md#internals-providersembeddedpgstorepy.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ...extras import require
from ...jms.errors import StoreError, StoreUnavailable
from .store import (
    _OPS,
    BYTES_SQL,
    PAGE_SQL,
    SCHEMA_VERSION,
    Database,
    Recovered,
    a_waiting_send,
    recovered,
    write_batch,
)

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS msgs(seq BIGINT PRIMARY KEY, qkey TEXT NOT NULL, "
    "dcount INTEGER NOT NULL DEFAULT 0, blob BYTEA NOT NULL)",
    "CREATE TABLE IF NOT EXISTS subs(client_id TEXT NOT NULL, name TEXT NOT NULL, "
    "topic TEXT NOT NULL, selector TEXT, no_local INTEGER NOT NULL, owner TEXT, "
    "PRIMARY KEY(client_id, name))",
    "CREATE TABLE IF NOT EXISTS dests(qkey TEXT PRIMARY KEY, config TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS xa(xid TEXT PRIMARY KEY, state TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS xa_sends(xid TEXT NOT NULL, seq BIGINT NOT NULL, "
    "qkey TEXT NOT NULL, blob BYTEA NOT NULL)",
    "CREATE TABLE IF NOT EXISTS xa_acks(xid TEXT NOT NULL, seq BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS rejected(seq BIGINT PRIMARY KEY, qkey TEXT NOT NULL, dcount INTEGER NOT NULL, "
    "blob BYTEA NOT NULL, reason TEXT NOT NULL, rejected TIMESTAMPTZ NOT NULL DEFAULT now())",
    "CREATE INDEX IF NOT EXISTS msgs_qkey ON msgs(qkey, seq)",
    "CREATE INDEX IF NOT EXISTS xa_sends_xid ON xa_sends(xid)",
    "CREATE INDEX IF NOT EXISTS xa_acks_xid ON xa_acks(xid)",
)
# from schema version -> statements (IF NOT EXISTS: an HA takeover may have added the column)
UPGRADES = {"1": ("ALTER TABLE subs ADD COLUMN IF NOT EXISTS owner TEXT",)}
PROBE_INTERVAL = 2.0  # seconds an idle store waits before it checks the database is there
DISK_FULL = "53100"  # the SQLSTATE of a write the server had no space for
# SQLite's INSERT OR REPLACE, said the PostgreSQL way.
_PG_OPS = {
    **_OPS,
    "sub_put": (
        "INSERT INTO subs(client_id, name, topic, selector, no_local, owner) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (client_id, name) DO UPDATE SET "
        "topic = EXCLUDED.topic, selector = EXCLUDED.selector, "
        "no_local = EXCLUDED.no_local, owner = EXCLUDED.owner",
    ),
    "dest_put": (
        "INSERT INTO dests(qkey, config) VALUES (?, ?) ON CONFLICT (qkey) DO UPDATE SET config = EXCLUDED.config",
    ),
}
INSERT_MSG = "INSERT INTO msgs(seq, qkey, dcount, blob) VALUES (?, ?, ?, ?)"
# A batch's rows as arrays in binary (%b): one statement, not one per row. 500 rows of 1 KiB
# inserted and deleted: 8-9 us of server CPU a row, not 18-23; 13-15 us of wall, not 26-31.
_ARRAYS = (
    "INSERT INTO msgs(seq, qkey, dcount, blob) "
    "SELECT * FROM unnest(%b::bigint[], %b::text[], %b::integer[], %b::bytea[])",
    "DELETE FROM msgs WHERE seq = ANY(%b::bigint[])",
)
# A waiting sender's batch as one statement (PostgresDatabase._one_statement): its message
# and the acknowledgements beside it (gone); in an HA instance only while the fence holds.
_GONE = "gone AS (DELETE FROM msgs WHERE seq = ANY(%b::bigint[]){}) "
_ONE = "INSERT INTO msgs(seq, qkey, dcount, blob) VALUES (%s, %s, %s, %b)"
_ONE_FENCED = "INSERT INTO msgs(seq, qkey, dcount, blob) SELECT %s, %s, %s, %b WHERE EXISTS (SELECT FROM fence)"
# A durable subscription's key is "d:<client id>\0<name>", and PostgreSQL text holds no NUL:
# in the database the NUL is U+FFFE (a noncharacter, in no queue name or client id).
_NUL, _NUL_STORED = "\0", "\ufffe"
_KEYED_OPS = ("purge", "dest_put", "dest_del")  # ops whose first argument is a key


def stored_key(qkey: str) -> str:
    return qkey.replace(_NUL, _NUL_STORED)


def loaded_key(text: str) -> str:
    return text.replace(_NUL_STORED, _NUL)


_PREPARE_XA = (
    "INSERT INTO xa(xid, state) VALUES (?, 'prepared') ON CONFLICT (xid) DO UPDATE SET state = 'prepared'",
    "DELETE FROM xa_sends WHERE xid = ?",
    "DELETE FROM xa_acks WHERE xid = ?",
)


@dataclass(frozen=True)
class Fence:
    """HA: ``check`` (%s: broker id, generation) finds a row only while this process's
    generation holds the store, locking it FOR SHARE; ``holder`` (%s: broker id) reads
    (generation, state, taken_by) of the one that replaced it, for the error."""

    check: str
    holder: str

    def replaced(self, cur: Any, brokerid: str, generation: int) -> str | None:
        """In the caller's transaction: None while ``generation`` holds the lease of
        ``brokerid`` (its row locked FOR SHARE till the commit), else what replaced it."""
        cur.execute(self.check, (brokerid, generation))
        if cur.fetchone() is not None:
            return None
        cur.execute(self.holder, (brokerid,))
        row = cur.fetchone()
        if row is None:
            now = "(its lease row is gone)"
        elif row[2]:
            now = f"by generation {row[0]} (taken over by broker {row[2]})"
        else:
            now = f"by generation {row[0]} ({row[1]}: a new process of broker {brokerid})"
        return f"broker {brokerid} generation {generation} was replaced {now}"


@dataclass(frozen=True)
class JdbcSettings:
    """Where a jdbc store lives: a PostgreSQL conninfo (from the JDBC URL and the user and
    password properties) and the schema of this broker instance."""

    conninfo: dict[str, str]
    schema: str
    # HA cluster (cluster.py): the bridges' XA logs go to the cluster's schema, and each
    # connection says which broker id it writes for (the txlog's fencing trigger checks it).
    txlog_schema: str | None = None
    brokerid: str | None = None
    # HA: the lease generation this process joined as (cluster.py); every store batch and
    # every write of the bridges' XA logs and excuses checks that the cluster still has it.
    generation: int | None = None
    fence: Fence | None = None  # HA: how a batch checks it (run first in its transaction)
    # HA: seconds a transaction may wait for its client's next statement before the server
    # ends the session: a paused process (SIGSTOP) must not keep its lease row locked
    # FOR SHARE (the fence), which a takeover's SKIP LOCKED would pass over till it resumed
    idle_timeout: float | None = None

    @property
    def where(self) -> str:
        """The database as errors and logs name it: no password."""
        c = self.conninfo
        return (
            f"postgresql://{c.get('user', '')}@{c.get('host', 'localhost')}:"
            f"{c.get('port', '5432')}/{c.get('dbname', '')} (schema {self.schema})"
        )

    def connect(self) -> Any:
        """A new psycopg connection with this instance's schema first on its search path."""
        (psycopg,) = require("imq.persist.store=jdbc", "psycopg", error=StoreError)
        try:
            params: dict[str, Any] = {**self.conninfo, "connect_timeout": 10}
            conn = psycopg.connect(**params)
            with conn.cursor() as cur:
                cur.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
                cur.execute(f'SET search_path TO "{self.schema}"')
                if self.brokerid is not None:
                    cur.execute("SELECT set_config('imq.brokerid', %s, false)", (self.brokerid,))
                if self.generation is not None:
                    cur.execute("SELECT set_config('imq.generation', %s, false)", (str(self.generation),))
                if self.idle_timeout is not None:
                    cur.execute(
                        "SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
                        (f"{max(1, round(self.idle_timeout * 1000))}ms",),
                    )
            conn.commit()
            return conn
        except psycopg.Error as exc:
            raise StoreError(f"{self.where}: cannot connect: {exc}") from exc

    def txlog_sql(self) -> tuple[Callable[[], Any], str]:
        """What xa/sqllog.py needs to keep a bridge's XA log in this database."""
        if self.txlog_schema is not None:
            return dataclasses.replace(self, schema=self.txlog_schema).connect, "format"
        return self.connect, "format"


def schema_name(instance: str) -> str:
    """imq_<instance>, folded to what PostgreSQL takes unquoted (letters, digits, _)."""
    return "imq_" + re.sub(r"[^a-z0-9_]", "_", instance.lower())[:50]


def jdbc_settings(props: Any, instance: str) -> JdbcSettings:
    """The imq.persist.jdbc.* properties of the original (dbVendor postgresql; its
    property.url, user, password) as psycopg connection settings."""
    prefix = "imq.persist.jdbc.postgresql"
    url = props.get(f"{prefix}.property.url")
    if not url:
        raise StoreError(f"imq.persist.store=jdbc needs {prefix}.property.url (jdbc:postgresql://host:port/database)")
    conninfo = parse_jdbc_url(url)
    if props.get(f"{prefix}.user"):
        conninfo["user"] = props.get(f"{prefix}.user")
    if props.get(f"{prefix}.password"):
        conninfo["password"] = props.get(f"{prefix}.password")
    return JdbcSettings(conninfo, schema_name(instance))


def parse_jdbc_url(url: str) -> dict[str, str]:
    """jdbc:postgresql://host[:port]/database[?user=..&password=..&k=v] as conninfo."""
    text = url[len("jdbc:") :] if url.startswith("jdbc:") else url
    parts = urlsplit(text)
    if parts.scheme not in ("postgresql", "postgres") or not parts.netloc or not parts.path.strip("/"):
        raise StoreError(f"{url.split('?')[0]}: not a jdbc:postgresql://host:port/database URL")
    info = {"dbname": unquote(parts.path.strip("/")), "host": parts.hostname or "localhost"}
    try:
        if parts.port:
            info["port"] = str(parts.port)
    except ValueError:
        raise StoreError(f"{url.split('?')[0]}: bad port") from None
    if parts.username:
        info["user"] = unquote(parts.username)
    if parts.password:
        info["password"] = unquote(parts.password)
    for key, value in parse_qsl(parts.query):
        info[{"ssl": "sslmode"}.get(key, key)] = value
    return info


def _stored_op(name: str, args: tuple[Any, ...]) -> tuple[str, tuple[Any, ...]]:
    """An ordered op with its keys as the database holds them."""
    if name in _KEYED_OPS:
        return name, (stored_key(args[0]), *args[1:])
    if name == "xa_prepare":
        xid, sends, acks = args
        return name, (xid, [(seq, stored_key(q), b) for seq, q, b in sends], acks)
    return name, args


class PostgresDatabase(Database):
    """The store's tables in this instance's schema of a PostgreSQL database."""

    probe_interval = PROBE_INTERVAL

    def __init__(self, settings: JdbcSettings, sync: bool) -> None:
        self.settings = settings
        self.where = settings.where
        self.sync = sync
        self._lock = threading.Lock()
        conn = self._connect()
        try:
            import psycopg

            with conn.cursor() as cur:
                for statement in SCHEMA:
                    cur.execute(statement)
                cur.execute("SELECT v FROM meta WHERE k = 'schema'")
                row = cur.fetchone()
                if row is None:
                    cur.execute(
                        "INSERT INTO meta(k, v) VALUES ('schema', %s) ON CONFLICT DO NOTHING", (SCHEMA_VERSION,)
                    )
                elif row[0] in UPGRADES:  # in this transaction, with the version it gives
                    for upgrade in UPGRADES[row[0]]:
                        cur.execute(upgrade)
                    cur.execute("UPDATE meta SET v = %s WHERE k = 'schema'", (SCHEMA_VERSION,))
                elif row[0] != SCHEMA_VERSION:
                    raise StoreError(
                        f"{self.where}: store schema version {row[0]} is not "
                        f"supported (this broker reads version {SCHEMA_VERSION})"
                    )
            conn.commit()
        except psycopg.Error as exc:
            conn.close()
            raise StoreError(f"{self.where}: cannot open the store: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        self._conn: Any = conn
        # messages of a write whose connection was lost: its commit may have happened
        self._uncertain: set[int] = set()
        self.on_fenced: Callable[[str], None] | None = None  # HA: told why a batch was fenced

    def _connect(self) -> Any:
        conn = self.settings.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(f"SET synchronous_commit TO {'on' if self.sync else 'off'}")
            conn.commit()
        except BaseException:
            conn.close()
            raise
        return conn

    def _connection(self) -> Any:
        """The connection, a new one when the last was lost (under self._lock)."""
        if self._conn is None or self._conn.closed:
            self._conn = None
            self._conn = self._connect()
        return self._conn

    def _drop(self) -> None:
        """Forget a connection that failed (under self._lock): the next use connects again."""
        conn, self._conn = self._conn, None
        close_quietly(conn)

    def unavailable(self, exc: BaseException) -> bool:
        """A lost or refused connection (psycopg's OperationalError or InterfaceError, also
        behind the StoreError of a failed connect); the fence's StoreError is not."""
        import psycopg

        seen: BaseException | None = exc
        while seen is not None:
            if isinstance(seen, (psycopg.OperationalError, psycopg.InterfaceError)):
                return not self.no_space(seen)
            seen = seen.__cause__
        return False

    def load(self) -> Recovered:
        import psycopg

        try:
            with self._lock:
                cur = self._conn.cursor()
                try:
                    rec = recovered(lambda sql: cur.execute(sql) or cur)
                finally:
                    cur.close()
                    self._conn.commit()
        except (psycopg.Error, ValueError) as exc:
            raise StoreError(f"{self.where}: cannot read the store: {exc}") from exc
        rec.backlogs = {loaded_key(q): n for q, n in rec.backlogs.items()}
        rec.locked = [(seq, loaded_key(q), d, b) for seq, q, d, b in rec.locked]
        rec.destinations = {loaded_key(q): c for q, c in rec.destinations.items()}
        for branch in rec.prepared.values():
            branch.sends = [(seq, loaded_key(q), b) for seq, q, b in branch.sends]
        return rec

    def _read(self, sql: str, args: tuple[Any, ...], binary: bool = False) -> list[tuple[Any, ...]]:
        """One read in a transaction of its own (the writer shares the connection);
        ``binary``: rows in PostgreSQL's binary format (a bytea as text is hex)."""
        import psycopg

        try:
            with self._lock:
                try:
                    conn = self._connection()
                except StoreError as exc:
                    if exc.__cause__ is not None and self.unavailable(exc.__cause__):
                        raise StoreUnavailable(str(exc)) from exc  # the database is restarting
                    raise
                try:
                    with conn.cursor() as cur:
                        cur.execute(sql.replace("?", "%s"), args, binary=binary)
                        return cur.fetchall()
                finally:
                    if not conn.closed:
                        conn.commit()
        except psycopg.Error as exc:
            with self._lock:
                gone = self.unavailable(exc)
                if gone:
                    self._drop()
            refusal = StoreUnavailable if gone else StoreError  # an outage: tried again when it is back
            raise refusal(f"{self.where}: cannot read the store: {exc}") from exc

    def page(self, qkey: str, after: int, limit: int) -> list[tuple[int, int, bytes]]:
        rows = self._read(PAGE_SQL, (stored_key(qkey), after, limit), binary=True)
        return [(seq, d, bytes(b)) for seq, d, b in rows]

    def queue_bytes(self, qkey: str) -> int:
        return int(self._read(BYTES_SQL, (stored_key(qkey),))[0][0])

    def write(
        self,
        inserts: dict[int, list[Any]],
        deletes: set[int],
        updates: dict[int, int],
        ops: list[tuple[str, tuple[Any, ...]]],
    ) -> None:
        with self._lock:
            conn = self._connection()
            try:
                if self._one_statement(conn, inserts, deletes, updates, ops):
                    return
                with pipelined(conn), conn.cursor() as cur:
                    # the batch's statements and its COMMIT in one round trip, not one each
                    if not (inserts or deletes or updates or ops):  # the idle store's probe
                        cur.execute("SELECT 1")
                    else:
                        self._fenced(cur)
                        if self._uncertain:
                            inserts, deletes, updates = self._settle(cur, inserts, deletes, updates)
                        inserts = {seq: [stored_key(q), d, b] for seq, (q, d, b) in inserts.items()}
                        ops = [_stored_op(name, args) for name, args in ops]
                        write_batch(
                            cur.executemany,
                            inserts,
                            deletes,
                            updates,
                            ops,
                            _PG_OPS,
                            _PREPARE_XA,
                            mark="%s",
                            insert_msg=INSERT_MSG,
                            arrays=_ARRAYS,
                        )
                    conn.commit()
                self._uncertain = set()
            except BaseException as exc:
                if self.unavailable(exc):
                    self._drop()
                    self._uncertain |= inserts.keys()
                else:
                    conn.rollback()
                raise

    def _one_statement(
        self,
        conn: Any,
        inserts: dict[int, list[Any]],
        deletes: set[int],
        updates: dict[int, int],
        ops: list[tuple[str, tuple[Any, ...]]],
    ) -> bool:
        """A waiting sender's batch (one message, and the acknowledgements its consumer
        made meanwhile: store.a_waiting_send) as ONE statement in autocommit, the HA fence
        in it: no BEGIN and COMMIT around it (224-260 us a batch here, not 400-450; 90-110
        us of client CPU, not 230-300). False: not such a batch, nothing done."""
        if self._uncertain or not a_waiting_send(inserts, deletes, updates, ops):
            return False
        import psycopg
        from psycopg.pq import TransactionStatus

        if conn.info.transaction_status is not TransactionStatus.IDLE:
            return False  # (autocommit is set only between transactions)
        ((seq, (qkey, dcount, blob)),) = inserts.items()
        row = [seq, stored_key(qkey), dcount, blob]
        acks = [sorted(deletes)] if deletes else []
        fence = self.settings.fence
        if fence is None:
            sql = f"WITH {_GONE.format('')}{_ONE}" if deletes else _ONE
            args = [*acks, *row]
        else:  # written only while the lease row is ours (locked FOR SHARE to the end)
            gone = f", {_GONE.format(' AND EXISTS (SELECT FROM fence)')}" if deletes else " "
            sql = f"WITH fence AS ({fence.check}){gone}{_ONE_FENCED}"
            args = [self.settings.brokerid, self.settings.generation, *acks, *row]
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                written = cur.rowcount
        finally:
            try:
                conn.autocommit = False
            except psycopg.Error:  # a broken connection: never used again in autocommit
                self._drop()
        if written != 1:  # fenced: nothing was written; the fence says why (and raises)
            with conn.cursor() as cur:
                self._fenced(cur)
            conn.rollback()
            raise StoreError(f"{self.where}: a message was not written")
        return True

    def _settle(
        self, cur: Any, inserts: dict[int, list[Any]], deletes: set[int], updates: dict[int, int]
    ) -> tuple[dict[int, list[Any]], set[int], dict[int, int]]:
        """After a write whose commit may have happened: its messages that are there are
        not inserted again (their delivery count updated), and those removed since are
        deleted; the rest is this batch as it was."""
        cur.execute("SELECT seq FROM msgs WHERE seq = ANY(%s)", (sorted(self._uncertain),))
        there = {int(seq) for (seq,) in cur.fetchall()}
        if not there:
            return inserts, deletes, updates
        inserts, deletes, updates = dict(inserts), set(deletes), dict(updates)
        for seq in there:
            row = inserts.pop(seq, None)
            if row is None:
                deletes.add(seq)
            else:
                updates[seq] = row[1]
        return inserts, deletes, updates

    def _fenced(self, cur: Any) -> None:
        """HA: StoreError unless this process's generation still holds its store (a
        takeover moving our rows waits for this batch, or this batch finds the store
        another's and fails)."""
        settings, fence = self.settings, self.settings.fence
        if fence is None:
            return
        assert settings.brokerid is not None and settings.generation is not None
        reason = fence.replaced(cur, settings.brokerid, settings.generation)
        if reason is None:
            return
        if self.on_fenced is not None:
            self.on_fenced(reason)
        raise StoreError(f"{self.where}: fenced: {reason}; it writes nothing more")

    def no_space(self, exc: BaseException) -> bool:
        """SQLSTATE 53100 (disk_full: "could not extend file ...: No space left on device")."""
        return getattr(exc, "sqlstate", None) == DISK_FULL or super().no_space(exc)

    def close(self) -> None:
        with self._lock:
            self._drop()


def in_transaction(
    conns: dict[str, Any], role: str, connection: Callable[[str], Any], what: str, work: Callable[[Any], Any]
) -> Any:
    """``work(cursor)`` in one transaction on ``connection(role)``, kept in ``conns``: a
    psycopg error drops that connection (the next call connects again) and is a StoreError
    naming ``what``; any other error rolls the transaction back."""
    import psycopg

    conn = connection(role)
    try:
        with conn.cursor() as cur:
            result = work(cur)
        conn.commit()
        return result
    except psycopg.Error as exc:
        close_quietly(conns.pop(role, None))
        raise StoreError(f"{what}: {exc}") from exc
    except BaseException:
        if not conn.closed:
            conn.rollback()
        raise


def pipelined(conn: Any) -> AbstractContextManager[Any]:
    """Statements sent together, their results read at the end (psycopg's pipeline mode,
    where the client library has it)."""
    import psycopg

    return conn.pipeline() if psycopg.Pipeline.is_supported() else nullcontext()


def close_quietly(conn: Any) -> None:
    """Close a connection that may be lost already (None: nothing), ignoring errors: an
    open transaction on it is rolled back by the database."""
    if conn is not None:
        try:
            conn.close()
        except Exception:
            pass
