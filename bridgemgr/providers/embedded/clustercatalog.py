"""An HA cluster's destinations as one broker's (Table 4-2 of the original's Technical
Overview), and each instance's counts of them for list dst.

An administrator's create, update or destroy dst on any instance is written (after the
instance's own broker did it) into the cluster's table imq_ha_destinations, with a version;
NOTIFY wakes every instance's ``ha-catalog`` thread, which applies the rows it has not
applied to its host broker and records the version in imq_ha_catalog_applied, for which
the admin command waits. A destroyed destination keeps its row (destroyed), so an
instance that was down destroys it at its next start. A queue a live peer advertises
consumers on (imq_ha_demand) is made here too; an auto-created queue without consumers,
producers or messages here (and no peer's consumers) for imq.autocreate.reaptime seconds
is deleted. Every PUBLISH seconds the thread writes this instance's destinations and their
counts into imq_ha_dstcounts, which list dst on any instance reads, with their age.

Rules: the broker's lock is never held while the database is waited for; the thread's
work and the admin commands' have a connection each; every write fences on the lease.

Design notes: docs/ha.md#internals-providersembeddedclustercatalogpy.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ...jms.destination import Destination, Queue, Topic
from ...jms.errors import JMSException, StoreError
from ...jms.hostbroker import Principal
from .cluster import BROKERS, CATALOG, LIVE
from .clusterdst import DEMAND
from .destinations import _limits_from_json, _limits_to_json
from .pgstore import close_quietly, in_transaction
from .state import log

if TYPE_CHECKING:
    from .cluster import HACluster
    from .host import EmbeddedHostBroker

APPLIED, COUNTS = "imq_ha_catalog_applied", "imq_ha_dstcounts"
PUBLISH = 1.0  # seconds between two publications of our counts (and looks at the catalog)
APPLY_TIMEOUT = 5.0  # seconds an admin command waits for every live instance to apply it (< the CLI's 10 s)
_T = TypeVar("_T")
_TABLES = (
    f"CREATE SEQUENCE IF NOT EXISTS {CATALOG}_version",
    f"CREATE TABLE IF NOT EXISTS {CATALOG}(dkey TEXT PRIMARY KEY, limits TEXT, destroyed BOOLEAN NOT NULL, "
    "version BIGINT NOT NULL, brokerid TEXT NOT NULL)",
    f"CREATE TABLE IF NOT EXISTS {APPLIED}(brokerid TEXT PRIMARY KEY, version BIGINT NOT NULL)",
    f"CREATE TABLE IF NOT EXISTS {COUNTS}(brokerid TEXT PRIMARY KEY, published TIMESTAMPTZ NOT NULL, "
    "rows TEXT NOT NULL)",
)
_DDL_LOCK = 0x494D5143  # advisory lock: one instance creates these tables at a time
_LIVE = f"b.state = '{LIVE}' AND b.lease_expires > now()"
_CLUSTER = Principal("imq.cluster", frozenset({"admin"}))


def destination_key(destination: Destination) -> str:
    return ("t:" if destination.is_topic else "q:") + destination.name


def _destination(key: str) -> Destination:
    return Topic(key[2:]) if key.startswith("t:") else Queue(key[2:])


class ClusterDestinations:
    """This instance's part in the cluster's destinations: applying the catalog, making the
    queues peers consume, reaping idle auto-created queues, publishing counts."""

    def __init__(self, cluster: HACluster, host: EmbeddedHostBroker, reaptime: float) -> None:
        self.cluster, self.host, self.broker = cluster, host, host.broker
        self.settings, self.brokerid = cluster.settings, cluster.brokerid
        self.reaptime = reaptime
        self.channel = f"{self.settings.jdbc.schema}_catalog"
        self.applied = 0  # the catalog's version applied here
        self._failed: set[str] = set()  # destroyed keys this broker refused to destroy: tried again
        self._again = False  # reconcile(): apply the catalog from version 0
        self._idle: dict[str, float] = {}  # auto-created queue -> since when it is idle
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._conns: dict[str, Any] = {}
        self._admin_lock = threading.Lock()  # the admin commands' connection
        self._publish_lock = threading.Lock()  # one publish at a time (publish())

    # --- the database ---------------------------------------------------------------------
    def _transaction(self, role: str, work: Callable[[Any], Any]) -> Any:
        where = f"{self.settings.jdbc.where}: the cluster's destinations"
        return in_transaction(self._conns, role, self._conn, where, work)

    def _conn(self, role: str) -> Any:
        conn = self._conns.get(role)
        if conn is None or conn.closed:
            conn = self._conns[role] = self.settings.jdbc.connect()
        return conn

    def _admin(self, work: Callable[[Any], Any]) -> Any:
        """A transaction of an admin command's (one at a time on their connection)."""
        with self._admin_lock:
            return self._transaction("admin", work)

    def create_tables(self) -> None:
        def create(cur: Any) -> None:
            cur.execute("SELECT to_regclass(%s), to_regclass(%s), to_regclass(%s)", (CATALOG, APPLIED, COUNTS))
            if None not in cur.fetchone():
                return
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK,))
            for statement in _TABLES:
                cur.execute(statement)

        self._transaction("work", create)

    # --- start and stop ----------------------------------------------------------------------
    def start(self) -> None:
        """Create the tables, record what this broker's administrators created before the
        catalog knew it, apply the catalog and publish once; then the thread runs."""
        self.create_tables()
        mine = {key: _limits_to_json(limits) for key, limits in dict(self.broker.configured).items()}

        def seed(cur: Any) -> None:
            self.cluster.fence(cur)
            for key, limits in sorted(mine.items()):
                cur.execute(
                    f"INSERT INTO {CATALOG}(dkey, limits, destroyed, version, brokerid) "
                    f"VALUES (%s, %s, false, nextval('{CATALOG}_version'), %s) ON CONFLICT (dkey) DO NOTHING",
                    (key, limits, self.brokerid),
                )

        self._transaction("work", seed)
        self.apply()
        self.publish()
        self._thread = threading.Thread(target=self._run, daemon=True, name="ha-catalog")
        self._thread.start()

    def stop(self) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(30)
        try:
            self._transaction("work", self._unpublish)
        except StoreError as exc:
            log.warning("HA cluster %s: %s", self.settings.clusterid, exc)
        for conn in self._conns.values():
            close_quietly(conn)
        self._conns.clear()

    def _run(self) -> None:
        listening: Any = None
        while not self._halt.is_set():
            try:
                conn = self._conns.get("listen")
                if conn is None or conn.closed:
                    conn = self._conns["listen"] = self.settings.jdbc.connect()
                if listening is not conn:
                    conn.execute(f'LISTEN "{self.channel}"')
                    conn.commit()
                    listening = conn
                for _ in conn.notifies(timeout=PUBLISH, stop_after=1):
                    pass
                if self._halt.is_set():
                    return
                if self._again:
                    self._again, self.applied = False, 0
                self.apply()
                self.reap()
                self.publish()
            except StoreError as exc:
                log.warning("HA cluster %s: %s", self.settings.clusterid, exc)
                self._halt.wait(1)
            except Exception as exc:  # a lost LISTEN connection: connect again
                log.warning("HA cluster %s: the cluster's destinations: %s", self.settings.clusterid, exc)
                close_quietly(self._conns.pop("listen", None))
                self._halt.wait(1)

    # --- the catalog (admin-created destinations) ----------------------------------------
    def apply(self) -> None:
        """Apply the catalog's rows newer than ours (and destroys refused before), then
        record the version applied."""

        def read(cur: Any) -> list[tuple[str, str | None, bool, int]]:
            cur.execute(
                f"SELECT dkey, limits, destroyed, version FROM {CATALOG} WHERE version > %s OR dkey = ANY(%s) "
                "ORDER BY version",
                (self.applied, sorted(self._failed)),
            )
            return list(cur.fetchall())

        rows = self._transaction("work", read)
        for key, limits, destroyed, version in rows:
            again = key in self._failed
            self._failed.discard(key)
            self._apply_one(key, limits, destroyed, again)
            self.applied = max(self.applied, version)
        if rows:  # what we publish is current once the administrator hears "applied"
            self._publish_with(self._write_applied)

    def _write_applied(self, cur: Any) -> None:
        self.cluster.fence(cur)
        cur.execute(
            f"INSERT INTO {APPLIED}(brokerid, version) VALUES (%s, %s) "
            "ON CONFLICT (brokerid) DO UPDATE SET version = EXCLUDED.version",
            (self.brokerid, self.applied),
        )

    def reconcile(self) -> None:
        """Have the thread apply the whole catalog again, now: a takeover brought another
        instance's store in, with destinations destroyed meanwhile, or changed since."""
        self._again = True
        self._transaction("wake", lambda cur: cur.execute(f'NOTIFY "{self.channel}"'))  # (the heart-beat's)

    def _apply_one(self, key: str, limits: str | None, destroyed: bool, again: bool = False) -> None:
        """``again``: a destroy this broker refused before (logged then, not each time)."""
        broker, dest = self.broker, _destination(key)
        try:
            if destroyed:
                if broker.describe_destination(dest) is not None:
                    removed = broker.destroy(dest)
                    log.info("HA cluster: %s destroyed here with %s message(s), as on every instance", dest, removed)
                return
            wanted = _limits_from_json(json.loads(limits or "{}"))
            exists = dest.is_topic or dest.name in broker.queues
            if broker.configured.get(key) != wanted or not exists:
                broker.configure_destination(dest, wanted)
        except JMSException as exc:
            if destroyed:
                self._failed.add(key)
            (log.debug if again else log.warning)(
                "HA cluster: %s cannot be %s here: %s", dest, "destroyed" if destroyed else "configured", exc
            )

    def record(self, destination: Destination, destroyed: bool) -> list[str]:
        """An administrator created, updated (``destroyed`` False) or destroyed it on this
        instance: write it into the catalog, wake the others and wait until every live
        instance applied it; the broker ids that did not within APPLY_TIMEOUT."""
        key = destination_key(destination)
        limits = self.broker.configured.get(key)
        text = None if destroyed or limits is None else _limits_to_json(limits)

        def write(cur: Any) -> int:
            self.cluster.fence(cur)  # a replaced process's word is no administrator's
            cur.execute(
                f"INSERT INTO {CATALOG} AS c(dkey, limits, destroyed, version, brokerid) "
                f"VALUES (%s, %s, %s, nextval('{CATALOG}_version'), %s) ON CONFLICT (dkey) DO UPDATE SET "
                "limits = EXCLUDED.limits, destroyed = EXCLUDED.destroyed, version = EXCLUDED.version, "
                "brokerid = EXCLUDED.brokerid RETURNING version",
                (key, text, destroyed, self.brokerid),
            )
            version = int(cur.fetchone()[0])
            cur.execute(f'NOTIFY "{self.channel}"')
            return version

        # our own published rows change with the catalog's: a list dst on a peer after the
        # command returns no longer shows a destroyed queue here
        version = self._publish_with(write, role="admin")
        deadline = time.monotonic() + APPLY_TIMEOUT
        while True:
            behind = self._admin(lambda cur: self._behind(cur, version))
            if not behind or time.monotonic() >= deadline:
                return behind
            time.sleep(0.02)

    def _behind(self, cur: Any, version: int) -> list[str]:
        cur.execute(
            f"SELECT b.brokerid FROM {BROKERS} b LEFT JOIN {APPLIED} a ON a.brokerid = b.brokerid "
            f"WHERE {_LIVE} AND COALESCE(a.version, 0) < %s ORDER BY b.brokerid",
            (version,),
        )
        return [r[0] for r in cur.fetchall()]

    # --- queues peers consume, idle auto-created queues ----------------------------------
    def reap(self) -> None:
        """Make the queues live peers have consumers on; delete auto-created queues idle
        here for reaptime (none a peer has consumers on)."""

        def read(cur: Any) -> set[str]:
            cur.execute("SELECT to_regclass(%s)", (DEMAND,))
            if cur.fetchone()[0] is None:
                return set()
            cur.execute(
                f"SELECT DISTINCT d.qkey FROM {DEMAND} d JOIN {BROKERS} b ON b.brokerid = d.brokerid "
                f"WHERE {_LIVE} AND d.brokerid <> %s",
                (self.brokerid,),
            )
            return {r[0] for r in cur.fetchall() if r[0].startswith("q:")}

        demanded = self._transaction("work", read)
        broker = self.broker
        with broker.lock:
            for key in demanded:
                if key[2:] not in broker.queues:
                    broker._queue_for_key(key)  # propagated: a consumer's destination exists everywhere
        now = time.monotonic()
        idle = {name for name in broker.idle_queues() if f"q:{name}" not in demanded}
        self._idle = {name: self._idle.get(name, now) for name in idle}
        for name, since in list(self._idle.items()):
            if now - since >= self.reaptime and broker.reap_queue(name):
                del self._idle[name]
                log.info("HA cluster: auto-created queue %s was idle for %g s: deleted here", name, self.reaptime)

    # --- counts ----------------------------------------------------------------------------
    def publish(self) -> None:
        """Write this instance's destinations (not temporary ones) and their counts."""
        self._publish_with(lambda cur: None)

    def _publish_with(self, also: Callable[[Any], _T], role: str = "work") -> _T:
        """publish(), with ``also``'s writes in the same transaction (its result returned).
        One publisher at a time, each reading the broker just before it writes: an older
        view never lands after a newer one."""
        with self._publish_lock:
            rows = [
                {
                    "type": "t" if dest.is_topic else "q",
                    "name": dest.name,
                    "state": state,
                    "attributes": dataclasses.asdict(attributes),
                    **counts,
                }
                for dest, attributes, counts, state in self.host.list_destinations(_CLUSTER)
            ]
            text = json.dumps(rows)

            def write(cur: Any) -> _T:
                result = also(cur)
                self.cluster.fence(cur)  # (a new process of our broker id publishes its own)
                cur.execute(
                    f"INSERT INTO {COUNTS}(brokerid, published, rows) VALUES (%s, now(), %s) "
                    "ON CONFLICT (brokerid) DO UPDATE SET published = EXCLUDED.published, rows = EXCLUDED.rows",
                    (self.brokerid, text),
                )
                return result

            return self._admin(write) if role == "admin" else self._transaction(role, write)

    def _unpublish(self, cur: Any) -> None:
        """At stop: our counts go (fenced: not those of a new process of our broker id)."""
        self.cluster.fence(cur)
        cur.execute(f"DELETE FROM {COUNTS} WHERE brokerid = %s", (self.brokerid,))

    def peer_rows(self) -> list[tuple[str, float, list[dict[str, Any]]]]:
        """The other live instances' published destinations: (broker id, age in seconds,
        rows as list dst's), by broker id."""

        def read(cur: Any) -> list[tuple[str, float, list[dict[str, Any]]]]:
            cur.execute(
                f"SELECT c.brokerid, EXTRACT(EPOCH FROM now() - c.published), c.rows FROM {COUNTS} c "
                f"JOIN {BROKERS} b ON b.brokerid = c.brokerid WHERE {_LIVE} AND c.brokerid <> %s ORDER BY c.brokerid",
                (self.brokerid,),
            )
            return [(b, max(0.0, float(age)), json.loads(rows)) for b, age, rows in cur.fetchall()]

        return self._admin(read)

    def consumers_elsewhere(self, destination: Destination) -> dict[str, int]:
        """Broker id -> the active consumers of ``destination`` another live instance
        published (destroy dst refuses while there are some)."""
        kind = "t" if destination.is_topic else "q"
        return {
            brokerid: row["consumers"]
            for brokerid, _, rows in self.peer_rows()
            for row in rows
            if row["type"] == kind and row["name"] == destination.name and row["consumers"]
        }


def open_cluster_destinations(cluster: HACluster, host: EmbeddedHostBroker, reaptime: float) -> ClusterDestinations:
    """Start keeping ``host``'s destinations as the cluster's (an HA instance's)."""
    catalog = ClusterDestinations(cluster, host, reaptime)
    catalog.start()
    return catalog
