"""A link's excused redeliveries, kept so that a restart or an HA takeover does not forget them.

A unit undone by an outage (outage(): a store, an XA log or a resource manager that could
not be reached, anywhere in the chain of causes) is no fault of its messages; the Batch
excuses them, and the backout threshold does not count those redeliveries. Since the source
broker keeps the delivery counts across restarts, the excuses are kept too: Excuses in
bridges/<bridge>/excused.<link> (JSON, 0600, written aside and renamed), SharedExcuses on an
HA instance in the cluster's table imq_bridge_excuses, written behind the link by a writer
thread that retries while the database is down.

Rules: a restart itself is not excused; at most LIMIT ids are kept (oldest first out); only
the bridge's owner writes the shared rows (fenced like the XA log); the link never waits
for the database; this module knows no provider.

Design notes: docs/jms-bridges.md#internals-jmsbridgeexcusespy.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from ..jms import xa
from ..jms.errors import StoreError, StoreFull, TransportException, XAException
from ..private import open_private, private_dir
from ..xa.txlog import TxLogError

LIMIT = 10_000
RETRY = 1.0  # seconds between tries of a SharedExcuses write while the database is out of reach
TABLE = "imq_bridge_excuses"


def outage(exc: BaseException | None) -> bool:
    """Whether a failure was an outage, not its messages' fault: a store that cannot
    reach its database or write (StoreUnavailable, StoreFull), an XA log that cannot be
    written (TxLogError: its database unreachable, its disk full), a resource manager
    that cannot be reached or whose
    connection was lost (TransportException, XAER_RMFAIL), anywhere in its chain of
    causes."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (StoreFull, TxLogError, TransportException)) or (
            isinstance(exc, XAException) and exc.errorcode == xa.XAER_RMFAIL
        ):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def excuses_path(bridge_dir: Path, link: str) -> Path:
    """Where link ``link`` of the bridge whose folder is ``bridge_dir`` keeps its excuses."""
    return bridge_dir / f"excused.{link}"


class Excuses:
    """Message id -> redeliveries that were not the message's fault, persisted in ``path``."""

    def __init__(self, path: Path | None = None, log: logging.Logger | None = None) -> None:
        self.path = path
        self.log = log or logging.getLogger(__name__)
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()  # the counts: the link's thread and a writer's

    def __bool__(self) -> bool:
        return bool(self._counts)

    def get(self, message_id: str) -> int:
        return self._counts.get(message_id, 0)

    def load(self) -> None:
        """Read what the last run of the link kept (a link starts). A file that cannot be
        read is reported and left out: its messages are then judged by their delivery
        counts alone, as before there were excuses."""
        self._counts = {}
        if self.path is None or not self.path.exists():
            return
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or not all(
                isinstance(k, str) and type(v) is int and v > 0 for k, v in data.items()
            ):
                raise ValueError("not an object of message ids to positive counts")
        except (OSError, ValueError) as exc:
            self.log.warning(
                "excused redeliveries in %s cannot be read (%s); they are not counted out of the backout threshold",
                self.path,
                exc,
            )
            return
        self._counts = dict(list(data.items())[-LIMIT:])

    def add(self, message_ids: Iterable[str]) -> None:
        """One more excused redelivery for each of ``message_ids`` (empty ids skipped)."""
        changed: set[str] = set()
        with self._lock:
            counts = self._counts
            for message_id in message_ids:
                if message_id:
                    counts[message_id] = counts.pop(message_id, 0) + 1
                    changed.add(message_id)
            while len(counts) > LIMIT:
                oldest = next(iter(counts))
                del counts[oldest]
                changed.add(oldest)
        if changed:
            self._save(changed)

    def forget(self, message_ids: Iterable[str]) -> None:
        """``message_ids`` are consumed for good: their excuses go."""
        with self._lock:
            counts = self._counts
            gone = (
                {message_id for message_id in message_ids if counts.pop(message_id, None) is not None}
                if counts
                else set()
            )
        if gone:
            self._save(gone)

    def _save(self, changed: set[str]) -> None:
        """Replace the file with the counts now (no file: nothing to do). A failed write
        is reported and the counts kept in memory: the link goes on."""
        if self.path is None:
            return
        with self._lock:
            counts = dict(self._counts)
        temporary = self.path.with_name(self.path.name + ".new")
        try:
            private_dir(self.path.parent)
            fd = open_private(temporary, os.O_WRONLY | os.O_TRUNC)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(counts, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, self.path)
        except OSError as exc:
            self.log.warning(
                "excused redeliveries cannot be written to %s (%s); a restart "
                "will count them toward the backout threshold",
                self.path,
                exc,
            )


class SharedExcuses(Excuses):
    """The excuses of link ``link`` of bridge ``bridge`` in table imq_bridge_excuses of an
    HA cluster's schema (``connect``: a new connection there, marked with our broker id),
    written behind the link."""

    def __init__(self, connect: Callable[[], Any], bridge: str, link: str, log: logging.Logger | None = None) -> None:
        super().__init__(None, log)
        self.connect, self.bridge, self.link = connect, bridge, link
        self._unwritten: set[str] = set()  # ids whose rows differ from the counts
        self._writer: threading.Thread | None = None
        self._failing = False  # the last write failed (logged once until one succeeds)

    def load(self) -> None:
        """Read the rows (a link starts): the newest LIMIT, oldest first. A table that
        cannot be read is reported and left out, as an unreadable file is. A link started
        again while its writer still writes keeps its counts: they are newer than the rows."""
        import psycopg

        with self._lock:
            if self._writer is not None:
                return
            self._counts = {}
        try:
            conn = self.connect()
            try:
                with conn.cursor() as cur:
                    cur.execute(
                        f"SELECT message_id, excused FROM {TABLE} WHERE bridge = %s AND "
                        "link = %s ORDER BY seq DESC LIMIT %s",
                        (self.bridge, self.link, LIMIT),
                    )
                    rows = cur.fetchall()
                conn.rollback()
            finally:
                conn.close()
        except (StoreError, psycopg.Error) as exc:
            self.log.warning(
                "excused redeliveries of link %s cannot be read from the HA cluster's "
                "table %s (%s); they are not counted out of the backout threshold",
                self.link,
                TABLE,
                exc,
            )
            return
        with self._lock:
            self._counts = {message_id: int(excused) for message_id, excused in reversed(rows)}

    def _save(self, changed: set[str]) -> None:
        """Mark ``changed`` to be written; start the writer unless it runs."""
        with self._lock:
            self._unwritten |= changed
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._write_behind, daemon=True, name=f"excuses {self.bridge}/{self.link}"
                )
                self._writer.start()

    def written(self, timeout: float) -> bool:
        """Whether every change so far reached the table within ``timeout`` seconds."""
        writer = self._writer
        if writer is not None:
            writer.join(timeout)
        return self._writer is None

    def _write_behind(self) -> None:
        """Write the marked ids until none are left; while the database cannot be reached,
        try again every RETRY s."""
        import psycopg

        while True:
            with self._lock:
                ids, self._unwritten = self._unwritten, set()
                if not ids:
                    self._writer = None
                    return
                rows = [(self.bridge, self.link, i, n) for i, n in self._counts.items() if i in ids]
                gone = [i for i in ids if i not in self._counts]
            try:
                self._write(rows, gone)
            except (StoreError, psycopg.OperationalError) as exc:
                with self._lock:
                    self._unwritten |= ids
                if not self._failing:
                    self._failing = True
                    self.log.warning(
                        "excused redeliveries of link %s cannot be written to the HA "
                        "cluster's table %s (%s); trying again every %g s",
                        self.link,
                        TABLE,
                        exc,
                        RETRY,
                    )
                time.sleep(RETRY)
                continue
            except psycopg.Error as exc:
                self.log.warning(
                    "excused redeliveries of link %s are not written to the HA cluster's table %s: %s",
                    self.link,
                    TABLE,
                    exc,
                )
                continue
            if self._failing:
                self._failing = False
                self.log.info(
                    "excused redeliveries of link %s written to the HA cluster's table %s again", self.link, TABLE
                )

    def _write(self, rows: list[tuple[str, str, str, int]], gone: list[str]) -> None:
        """One transaction: upsert ``rows`` (each the newest now, in order), delete ``gone``."""
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                if gone:
                    cur.execute(
                        f"DELETE FROM {TABLE} WHERE bridge = %s AND link = %s AND message_id = ANY(%s)",
                        (self.bridge, self.link, gone),
                    )
                if rows:
                    cur.executemany(
                        f"INSERT INTO {TABLE}(bridge, link, message_id, excused) VALUES (%s, %s, %s, %s) "
                        "ON CONFLICT (bridge, link, message_id) DO UPDATE SET "
                        "excused = EXCLUDED.excused, seq = EXCLUDED.seq",
                        rows,
                    )
            conn.commit()
        finally:
            conn.close()


class ExcusesStore(Protocol):
    """Where the links of a bridge keep their excuses, if not in files: the runner's
    context (runners.py) has it; the service gives one on an instance of an HA cluster."""

    def __call__(self, bridge: str, link: str, log: logging.Logger) -> Excuses: ...


def shared_excuses(connect: Callable[[], Any]) -> ExcusesStore:
    """The HA cluster's table: ``connect`` opens a DB-API connection to the cluster's schema."""

    def store(bridge: str, link: str, log: logging.Logger) -> Excuses:
        return SharedExcuses(connect, bridge, link, log)

    return store
