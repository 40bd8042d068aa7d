"""An HA cluster's XA branches as one resource manager's: a branch started on one instance
is the cluster's.

recover() on any instance lists every prepared branch of the cluster (its own, its peers',
a dead instance's not taken over yet); commit or rollback of a branch another instance's
store holds is recorded, fenced on our lease, in the cluster's table imq_ha_xa_decisions
and NOTIFYed; the ``ha-xa`` thread of the instance serving that store (the one that
prepared it, or the one that took it over) applies it to its broker and deletes the row.
The caller waits for that, APPLY_TIMEOUT at most; then XAER_RMFAIL: the decision stands
and is applied later, a retry waits again, one after it was applied gets XAER_NOTA.

Rules: sends and receives stay on the instance of their connection; the broker's lock is
never held across a database call; every write fences on the lease generation.

Design notes: docs/ha.md#internals-providersembeddedclusterxapy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...jms import xa
from ...jms.errors import StoreError, XAException
from ...jms.xa import Xid
from .cluster import BROKERS, MAX_CHAIN, TAKEN, instance_schema
from .pgstore import close_quietly, in_transaction
from .state import WorkState, log

if TYPE_CHECKING:
    from .broker import Broker
    from .cluster import HACluster

DECISIONS = "imq_ha_xa_decisions"
APPLY_TIMEOUT = 8.0  # s a commit or rollback waits for the holder to apply it (< imqAckTimeout's 10)
LOOK = 0.5  # s between two looks at the decisions without a NOTIFY (a takeover's adoption)
POLL = 0.02  # s between two looks of a waiting caller
_TABLE = (
    f"CREATE TABLE IF NOT EXISTS {DECISIONS}(xid TEXT PRIMARY KEY, decision TEXT NOT NULL, "
    "holder TEXT NOT NULL, decided_by TEXT NOT NULL, decided TIMESTAMPTZ NOT NULL DEFAULT now())"
)
_DDL_LOCK = 0x494D5158  # advisory lock: one instance creates the table at a time
COMMIT, ROLLBACK = "commit", "rollback"


class ClusterXA:
    """This instance's part in the cluster's XA branches (Broker.cluster_xa)."""

    def __init__(self, cluster: HACluster, broker: Broker) -> None:
        self.cluster, self.broker = cluster, broker
        self.settings, self.brokerid = cluster.settings, cluster.brokerid
        self.channel = f"{self.settings.jdbc.schema}_xa"
        self._conns: dict[str, Any] = {}
        self._lock = threading.Lock()  # the callers' connection
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the database ---------------------------------------------------------------------
    def _conn(self, role: str) -> Any:
        conn = self._conns.get(role)
        if conn is None or conn.closed:
            conn = self._conns[role] = self.settings.jdbc.connect()
        return conn

    def _transaction(self, role: str, work: Callable[[Any], Any]) -> Any:
        where = f"{self.settings.jdbc.where}: the cluster's XA branches"
        if role != "caller":
            return in_transaction(self._conns, role, self._conn, where, work)
        with self._lock:
            return in_transaction(self._conns, role, self._conn, where, work)

    def create_tables(self) -> None:
        def create(cur: Any) -> None:
            cur.execute("SELECT to_regclass(%s)", (DECISIONS,))
            if cur.fetchone()[0] is None:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK,))
                cur.execute(_TABLE)

        self._transaction("look", create)

    # --- start and stop ----------------------------------------------------------------------
    def start(self) -> None:
        """Create the table, apply what was decided for our store meanwhile, then serve."""
        self.create_tables()
        self.look()
        with self.broker.lock:
            self.broker.cluster_xa = self
        self._thread = threading.Thread(target=self._run, daemon=True, name="ha-xa")
        self._thread.start()

    def stop(self) -> None:
        with self.broker.lock:
            self.broker.cluster_xa = None
        self._halt.set()
        if self._thread is not None:
            self._thread.join(30)
        for conn in self._conns.values():
            close_quietly(conn)
        self._conns.clear()

    def _run(self) -> None:
        listening: Any = None
        while not self._halt.is_set():
            try:
                conn = self._conn("listen")
                if listening is not conn:
                    conn.execute(f'LISTEN "{self.channel}"')
                    conn.commit()
                    listening = conn
                for _ in conn.notifies(timeout=LOOK, stop_after=1):
                    pass
                if not self._halt.is_set():
                    self.look()
            except StoreError as exc:
                log.warning("HA cluster %s: %s", self.settings.clusterid, exc)
                self._halt.wait(1)
            except Exception as exc:  # a lost LISTEN connection: connect again
                log.warning("HA cluster %s: the cluster's XA branches: %s", self.settings.clusterid, exc)
                close_quietly(self._conns.pop("listen", None))
                self._halt.wait(1)

    # --- a caller's commit, rollback, recover (Broker.cluster_xa) -----------------------------
    def commit(self, xid: Xid) -> None:
        """Commit a branch prepared on another instance: returns once its holder applied it."""
        self._decide(xid, COMMIT)

    def rollback(self, xid: Xid) -> None:
        """Roll back a branch prepared on another instance, likewise."""
        self._decide(xid, ROLLBACK)

    def recover(self) -> list[Xid]:
        """The prepared branches of every other instance's store (a dead one's included)."""

        def read(cur: Any) -> list[str]:
            found: list[str] = []
            for brokerid, schema in self._stores(cur):
                if brokerid == self.brokerid:
                    continue
                cur.execute(f'SELECT xid FROM "{schema}".xa WHERE state = %s ORDER BY xid', ("prepared",))
                found += [r[0] for r in cur.fetchall()]
            return found

        try:
            return [Xid.parse(text) for text in self._transaction("caller", read)]
        except StoreError as exc:
            raise XAException(f"recover: {exc}", xa.XAER_RMFAIL) from exc

    def _decide(self, xid: Xid, decision: str) -> None:
        text = str(xid)

        def record(cur: Any) -> tuple[str, bool]:
            self.cluster.fence(cur)  # a replaced process decides nothing
            cur.execute(f"SELECT decision, holder FROM {DECISIONS} WHERE xid = %s FOR UPDATE", (text,))
            row = cur.fetchone()
            if row is not None:  # decided before (a retry): wait for it again
                if row[0] != decision:
                    raise XAException(
                        f"{decision}: branch {xid} is being {'committed' if row[0] == COMMIT else 'rolled back'} "
                        f"(decided on HA cluster {self.settings.clusterid})",
                        xa.XA_HEURCOM if row[0] == COMMIT else xa.XA_HEURRB,
                    )
                return str(row[1]), False
            holder = self._holder(cur, text) or self._holder(cur, text)  # (again: a takeover moved it)
            if holder is None:
                raise XAException(
                    f"{decision}: unknown branch {xid} (prepared on no instance of HA cluster "
                    f"{self.settings.clusterid})",
                    xa.XAER_NOTA,
                )
            cur.execute(
                f"INSERT INTO {DECISIONS}(xid, decision, holder, decided_by) VALUES (%s, %s, %s, %s)",
                (text, decision, holder, self.brokerid),
            )
            cur.execute(f'NOTIFY "{self.channel}"')
            return holder, True

        try:
            holder, new = self._transaction("caller", record)
        except StoreError as exc:
            raise XAException(f"{decision}: branch {xid}: {exc}", xa.XAER_RMFAIL) from exc
        if new:
            log.info(
                "HA cluster %s: %s of XA branch %s decided here; broker %s's store holds it",
                self.settings.clusterid,
                decision,
                xid,
                holder,
            )
        deadline = time.monotonic() + APPLY_TIMEOUT
        while True:
            try:
                pending = self._transaction(
                    "caller", lambda cur: cur.execute(f"SELECT 1 FROM {DECISIONS} WHERE xid = %s", (text,)).fetchone()
                )
            except StoreError as exc:
                raise XAException(f"{decision}: branch {xid} (decided): {exc}", xa.XAER_RMFAIL) from exc
            if pending is None:
                return
            if time.monotonic() >= deadline:
                raise XAException(
                    f"{decision}: branch {xid} is decided in HA cluster {self.settings.clusterid}, but "
                    f"broker {holder}, whose store holds it, has not applied it within {APPLY_TIMEOUT:g} s; "
                    "it (or the instance that takes it over) will: try again",
                    xa.XAER_RMFAIL,
                )
            time.sleep(POLL)

    def _stores(self, cur: Any) -> list[tuple[str, str]]:
        """(broker id, store schema) of the cluster's instances whose store exists."""
        cur.execute(f"SELECT brokerid FROM {BROKERS} ORDER BY brokerid")
        stores = []
        for (brokerid,) in list(cur.fetchall()):
            schema = instance_schema(self.settings.clusterid, brokerid)
            cur.execute("SELECT to_regclass(%s)", (f'"{schema}".xa',))
            if cur.fetchone()[0] is not None:
                stores.append((str(brokerid), schema))
        return stores

    def _holder(self, cur: Any, text: str) -> str | None:
        """The broker id whose store holds branch ``text`` prepared (locked FOR SHARE: a
        takeover moving it waits for our decision's commit), or None."""
        for brokerid, schema in self._stores(cur):
            cur.execute(f'SELECT 1 FROM "{schema}".xa WHERE xid = %s AND state = %s FOR SHARE', (text, "prepared"))
            if cur.fetchone() is not None:
                return brokerid
        return None

    # --- the holder's side: applying decisions ---------------------------------------------
    def look(self) -> None:
        """Apply the decisions for branches our store holds (ours, or a store we took over),
        and delete them; one whose branch is no longer here was applied (its delete lost)."""

        def read(cur: Any) -> list[tuple[str, str]]:
            self.cluster.fence(cur)  # a replaced process's memory is stale: it applies nothing
            cur.execute(f"SELECT xid, decision, holder FROM {DECISIONS} ORDER BY decided")
            rows = list(cur.fetchall())
            if not rows:
                return []
            cur.execute(f"SELECT brokerid, state, taken_by FROM {BROKERS}")
            taken = {b: t for b, s, t in cur.fetchall() if s == TAKEN and t}
            return [(x, d) for x, d, holder in rows if _serving(holder, taken) == self.brokerid]

        for text, decision in self._transaction("look", read):
            xid = Xid.parse(text)
            with self.broker.lock:
                work = self.broker.branches.get(xid)
                here = xid in self.broker.committing or (work is not None and work.state is WorkState.PREPARED)
            if here:
                try:
                    if decision == COMMIT:
                        self.broker.xa_commit(xid, False)
                    else:
                        self.broker.xa_rollback(xid)
                except XAException as exc:
                    if exc.errorcode != xa.XAER_NOTA:  # (NOTA: a local call completed it meanwhile)
                        log.warning("HA cluster %s: %s of branch %s: %s", self.settings.clusterid, decision, xid, exc)
                        continue  # tried again at the next look
                log.info("HA cluster %s: XA branch %s: %s applied here", self.settings.clusterid, xid, decision)
            elif work is not None:
                continue  # (not prepared here: no decision is ours to apply)

            def done(cur: Any, text: str = text) -> None:
                self.cluster.fence(cur)
                cur.execute(f"DELETE FROM {DECISIONS} WHERE xid = %s", (text,))

            self._transaction("look", done)


def _serving(brokerid: str, taken: dict[str, str]) -> str:
    """The broker serving ``brokerid``'s store now (following takeovers)."""
    for _ in range(MAX_CHAIN):
        if brokerid not in taken:
            return brokerid
        brokerid = taken[brokerid]
    return brokerid


def open_cluster_xa(cluster: HACluster, broker: Broker) -> ClusterXA:
    """Make ``broker``'s XA branches the cluster's (an HA instance's)."""
    cluster_xa = ClusterXA(cluster, broker)
    cluster_xa.start()
    return cluster_xa
