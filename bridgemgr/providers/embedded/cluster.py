"""HA broker clusters on the shared PostgreSQL store: leases, bridge ownership, takeover.

Every instance keeps its store in the shared PostgreSQL database in a schema of its own and
shares the cluster's schema: leases (imq_ha_brokers), the bridge ownership table
(imq_ha_bridges), the bridges' XA logs and excuses. join() refuses a live broker id and a
bridge configuration (the service's, props.bridge_configuration) that differs from a live
member's; claim() applies the chapter's activelist rules; a heartbeat thread renews the
lease and takes over at most one expired member, moving its bridges and store rows.

Rules: this module knows no bridge keys (the service tells it the configuration); a lost
lease stops every bridge first; every write (store batches, a bridge's XA log and excuses)
is fenced on the lease generation this process joined as (and the ownership row), and a
process whose generation was replaced ends; clients of a taken-over broker are sent on.

Design notes: docs/ha.md#internals-providersembeddedclusterpy.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...extras import require
from ...jms.errors import StoreError
from ...props import BrokerProperties
from .pgstore import (
    Fence,
    JdbcSettings,
    PostgresDatabase,
    close_quietly,
    jdbc_settings,
    loaded_key,
    schema_name,
    stored_key,
)
from .store import PreparedBranch, Recovered

if TYPE_CHECKING:
    from .broker import Broker
    from .host import EmbeddedHostBroker

log = logging.getLogger(__name__)

BROKERS, BRIDGES, TXLOG = "imq_ha_brokers", "imq_ha_bridges", "imq_bridge_txlog"
CATALOG = "imq_ha_destinations"  # the administrators' destinations (clustercatalog.py)
EXCUSES = "imq_bridge_excuses"  # jmsbridge/excuses.py's TABLE
LIVE, TAKEN = "live", "taken"
_DDL_LOCK = 0x494D5148  # advisory lock: one instance creates the cluster's tables at a time
_TABLES = (
    f"CREATE TABLE IF NOT EXISTS {BROKERS}(brokerid TEXT PRIMARY KEY, state TEXT NOT NULL, "
    "generation BIGINT NOT NULL, lease_expires TIMESTAMPTZ NOT NULL, address TEXT, "
    "taken_by TEXT, config TEXT NOT NULL, urls TEXT)",
    f"CREATE TABLE IF NOT EXISTS {BRIDGES}(bridge TEXT PRIMARY KEY, owner TEXT NOT NULL, "
    "since TIMESTAMPTZ NOT NULL DEFAULT now())",
    # The same table xa/sqllog.py creates, made here first so that the fence can guard it.
    f"CREATE TABLE IF NOT EXISTS {TXLOG} (bridge VARCHAR(200) NOT NULL, "
    "gtrid VARCHAR(200) NOT NULL, record TEXT NOT NULL, PRIMARY KEY (bridge, gtrid))",
    f"CREATE TABLE IF NOT EXISTS {EXCUSES}(bridge TEXT NOT NULL, link TEXT NOT NULL, "
    "message_id TEXT NOT NULL, excused INTEGER NOT NULL, seq BIGSERIAL NOT NULL, "
    "PRIMARY KEY (bridge, link, message_id))",
)
# where clients reach an instance (mq:// URLs), told to those whose broker it took over: a
# table made before has no such column (ALTER only then: it locks the table out for all)
_URLS = f"ALTER TABLE {BROKERS} ADD COLUMN urls TEXT"
MAX_CHAIN = 16  # takeovers followed from a broker to the one serving its store now


def _fence_ddl(schema: str) -> tuple[str, ...]:
    return (
        f'CREATE OR REPLACE FUNCTION "{schema}".imq_fence() RETURNS trigger LANGUAGE plpgsql AS $$\n'
        "DECLARE b TEXT; me TEXT := current_setting('imq.brokerid', true);\n"
        "  gen TEXT := current_setting('imq.generation', true);\n"
        "BEGIN\n"
        "  IF TG_OP = 'DELETE' THEN b := OLD.bridge; ELSE b := NEW.bridge; END IF;\n"
        # the lease row first (a takeover locks it first too): no deadlock between them
        f'  PERFORM 1 FROM "{schema}".{BROKERS} WHERE brokerid = me AND generation::text = gen '
        f"AND state = '{LIVE}' FOR SHARE;\n"
        "  IF NOT FOUND THEN\n"
        "    RAISE EXCEPTION 'fenced: broker % generation % was replaced', me, gen;\n"
        "  END IF;\n"
        f'  PERFORM 1 FROM "{schema}".{BRIDGES} WHERE bridge = b AND owner = me FOR SHARE;\n'
        "  IF NOT FOUND THEN\n"
        "    RAISE EXCEPTION 'fenced: bridge % is not owned by broker %', b, me;\n"
        "  END IF;\n"
        "  IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;\n"
        "  RETURN NEW;\n"
        "END $$",
        *(
            f'CREATE OR REPLACE TRIGGER imq_fence BEFORE INSERT OR UPDATE OR DELETE ON "{schema}".{table} '
            f'FOR EACH ROW EXECUTE FUNCTION "{schema}".imq_fence()'
            for table in (TXLOG, EXCUSES)
        ),
    )


class ClusterError(Exception):
    """This instance cannot join its HA cluster (its broker id is live elsewhere, its
    bridge configuration differs from the cluster's, the store cannot be reached)."""


@dataclass(frozen=True)
class ClusterSettings:
    """An HA instance's cluster properties, and where the cluster's tables live."""

    clusterid: str
    brokerid: str
    heartbeat: float  # seconds between lease renewals
    monitor: float  # seconds without renewal after which an instance is taken over
    jdbc: JdbcSettings  # the cluster's schema, connections marked with our broker id


def cluster_schema(clusterid: str) -> str:
    return schema_name(f"cluster_{clusterid}")


def cluster_settings(props: BrokerProperties) -> ClusterSettings | None:
    """The HA settings of ``props``; None unless imq.cluster.ha is true."""
    if not props.get("imq.cluster.ha"):
        return None
    clusterid, brokerid = props.get("imq.cluster.clusterid"), props.get("imq.brokerid")
    if not clusterid or not brokerid:
        raise StoreError("imq.cluster.ha=true needs imq.cluster.clusterid and imq.brokerid")
    base = jdbc_settings(props, brokerid)
    heartbeat, monitor = (
        float(props.get("imq.cluster.heartbeat.interval")),
        float(props.get("imq.cluster.monitor.interval")),
    )
    return ClusterSettings(
        clusterid,
        brokerid,
        heartbeat,
        monitor,
        dataclasses.replace(
            base, schema=cluster_schema(clusterid), brokerid=brokerid, idle_timeout=idle_timeout(heartbeat, monitor)
        ),
    )


def idle_timeout(heartbeat: float, monitor: float) -> float:
    """Seconds an HA connection's transaction may sit idle (JdbcSettings.idle_timeout): a
    paused process's lock on its lease row delays a takeover by this much at most."""
    return max(heartbeat, monitor / 3)


def store_settings(props: BrokerProperties, generation: int | None = None) -> JdbcSettings:
    """Where the host broker's jdbc store lives: the instance's schema; for an HA instance
    the schema of its broker id in the cluster, its bridges' XA logs in the cluster's, and
    every write fenced on ``generation`` (the one this process joined as)."""
    ha = cluster_settings(props)
    if ha is None:
        return jdbc_settings(props, props.get("imq.instancename"))
    if generation is None:  # (its every write would be fenced)
        raise StoreError(f"HA broker {ha.brokerid}: its store opens only after it joined its cluster")
    return dataclasses.replace(
        ha.jdbc,
        schema=instance_schema(ha.clusterid, ha.brokerid),
        txlog_schema=ha.jdbc.schema,
        generation=generation,
        fence=lease_fence(f'"{ha.jdbc.schema}".{BROKERS}'),
    )


def lease_fence(table: str) -> Fence:
    """How a transaction fences on a lease row of ``table`` (imq_ha_brokers)."""
    return Fence(
        f"SELECT 1 FROM {table} WHERE brokerid = %s AND generation = %s AND state = '{LIVE}' FOR SHARE",
        f"SELECT generation, state, taken_by FROM {table} WHERE brokerid = %s",
    )


_FENCE = lease_fence(BROKERS)  # (the cluster's schema is a cluster connection's search path)


def instance_schema(clusterid: str, brokerid: str) -> str:
    """The schema of an HA instance's host broker store."""
    return schema_name(f"{clusterid}__{brokerid}")


def differences(mine: Mapping[str, str], theirs: Mapping[str, str]) -> list[str]:
    """The keys whose values differ (or that only one side sets), sorted."""
    return sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))


class HACluster:
    """This instance's membership in its HA cluster (one database connection, its own)."""

    def __init__(self, settings: ClusterSettings) -> None:
        self.settings = settings
        self.brokerid = settings.brokerid
        self.generation = 0
        self._conn: Any = None
        self._lock = threading.Lock()  # the connection: heartbeat thread and admin threads
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._address: str | None = None
        self._config: dict[str, str] = {}
        self._broker: Broker | None = None  # attach(): the host broker a takeover adopts into
        self.holding = False  # we hold our lease (a member, renewed in time): imq_ha_lease_held
        self._lost: Callable[[str | None], None] | None = None  # start()'s
        # start()'s took_over, rejoined and the activelist: None while the service starts
        self._callbacks: tuple[Callable[[str, list[str]], None], Callable[[list[str]], None], list[str]] | None = None
        self._replaced = False  # our generation was replaced: this process ends
        self._reason = ""  # ... what replaced it
        self._replaced_lock = threading.Lock()

    @property
    def jdbc(self) -> JdbcSettings:
        """Connections for the bridges' shared rows (XA logs, excuses): marked with our broker
        id and generation, which the fence trigger checks."""
        return dataclasses.replace(self.settings.jdbc, generation=self.generation)

    def attach(self, host: EmbeddedHostBroker) -> None:
        """The host broker whose store a takeover moves the dead instance's rows into (and
        whose fenced writes tell us, first maybe, that we were replaced)."""
        self._broker = host.broker
        store = host.broker.store
        if store is not None and isinstance(store.database, PostgresDatabase):
            store.database.on_fenced = self._fenced_write

    def fence(self, cur: Any) -> None:
        """First in a transaction that writes the cluster's shared rows (its destinations,
        counts, demand, durables, XA decisions): lock our lease row FOR SHARE while it holds
        this process's generation, live, so a takeover waits for the commit; else tell the
        service (which ends this process) and raise StoreError: nothing is written."""
        cur.execute(_FENCE.check, (self.brokerid, self.generation))
        if cur.fetchone() is not None:
            return
        cur.execute(_FENCE.holder, (self.brokerid,))
        reason = self._replaced_by(cur.fetchone())
        self._fenced_write(reason)
        raise StoreError(f"{self.settings.jdbc.where}: fenced: {reason}; it writes nothing more")

    def _fenced_write(self, reason: str) -> None:
        """(A store writer, its database lock held) tell the service on a thread of its
        own: stopping the bridges waits for links that may wait for this store."""
        threading.Thread(target=self.replaced, args=(reason,), daemon=True, name="ha-replaced").start()

    def advertise(self, urls: str) -> None:
        """Where clients reach this instance (mq:// URLs, comma separated): what a live
        instance tells the clients of a broker this one took over (locate)."""
        self._transaction(
            lambda cur: cur.execute(
                f"UPDATE {BROKERS} SET urls = %s WHERE brokerid = %s AND generation = %s",
                (urls, self.brokerid, self.generation),
            )
        )

    def locate(self, home: str) -> tuple[str, str] | None:
        """Where the store of broker ``home`` (a client's last) is served now: None here
        (or ``home`` is no member), else (broker id, its mq:// URLs); ClusterError while
        ``home``'s lease is live elsewhere but it cannot be reached yet, or it is not
        taken over yet (the client tries again)."""
        if home == self.brokerid:
            return None

        def read(cur: Any) -> tuple[str, str] | None:
            broker = home
            for _ in range(MAX_CHAIN):
                cur.execute(
                    f"SELECT state, taken_by, urls, lease_expires > now() FROM {BROKERS} WHERE brokerid = %s",
                    (broker,),
                )
                row = cur.fetchone()
                if row is None:
                    return None
                state, taker, urls, live = row
                if state == TAKEN and taker:
                    broker = taker
                    continue
                if broker == self.brokerid:
                    return None
                if not live or not urls:
                    raise ClusterError(
                        f"broker {home} of HA cluster {self.settings.clusterid} is not taken over yet; try again"
                    )
                return broker, str(urls)
            return None

        return self._transaction(read)

    # --- the database -------------------------------------------------------------------
    def _transaction(self, work: Callable[[Any], Any]) -> Any:
        """``work(cursor)`` in one transaction; a failed one drops the connection."""
        (psycopg,) = require("imq.cluster.ha", "psycopg", error=StoreError)  # not installed: which extra

        with self._lock:
            try:
                if self._conn is None:
                    self._conn = self.settings.jdbc.connect()
                with self._conn.cursor() as cur:
                    result = work(cur)
                self._conn.commit()
                return result
            except psycopg.Error as exc:
                self._drop()
                raise StoreError(f"{self.settings.jdbc.where}: HA cluster tables: {exc}") from exc
            except BaseException:
                if self._conn is not None:
                    self._conn.rollback()
                raise

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        close_quietly(conn)

    def create_tables(self) -> None:
        schema = self.settings.jdbc.schema

        def create(cur: Any) -> None:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK,))
            for statement in (*_TABLES, *_fence_ddl(schema)):
                cur.execute(statement)
            cur.execute(
                "SELECT 1 FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
                "AND column_name = 'urls'",
                (schema, BROKERS),
            )
            if cur.fetchone() is None:
                cur.execute(_URLS)

        self._transaction(create)

    # --- membership -------------------------------------------------------------------
    def join(self, address: str, config: Mapping[str, str]) -> None:
        """Become a live member as a new generation; ClusterError when our broker id is
        live elsewhere or a live member runs another bridge configuration."""
        self._address, self._config = address, dict(config)
        monitor, me = self.settings.monitor, self.brokerid

        def join(cur: Any) -> int:
            cur.execute(
                f"SELECT state, lease_expires > now(), address FROM {BROKERS} WHERE brokerid = %s FOR UPDATE", (me,)
            )
            row = cur.fetchone()
            if row is not None and row[0] == LIVE and row[1]:
                raise ClusterError(
                    f"broker id {me} is in use by a live instance ({row[2]}); give "
                    f"this one another imq.brokerid, or wait {monitor:g} s "
                    "(imq.cluster.monitor.interval) if that instance is gone"
                )
            cur.execute(
                f"SELECT brokerid, config FROM {BROKERS} WHERE state = %s "
                "AND lease_expires > now() AND brokerid <> %s ORDER BY brokerid",
                (LIVE, me),
            )
            for other, text in cur.fetchall():
                differ = differences(config, json.loads(text))
                if differ:
                    raise ClusterError(
                        f"the bridge configuration differs from live broker {other}'s "
                        f"in {', '.join(differ)}; every instance of an HA cluster "
                        "needs the same (imq.cluster.url)"
                    )
            cur.execute(
                f"INSERT INTO {BROKERS}(brokerid, state, generation, lease_expires, address, config) "
                "VALUES (%s, %s, 1, now() + make_interval(secs => %s), %s, %s) "
                "ON CONFLICT (brokerid) DO UPDATE SET state = EXCLUDED.state, "
                f"generation = {BROKERS}.generation + 1, lease_expires = EXCLUDED.lease_expires, "
                "address = EXCLUDED.address, config = EXCLUDED.config, taken_by = NULL, urls = NULL "
                "RETURNING generation",
                (me, LIVE, monitor, address, json.dumps(config, sort_keys=True)),
            )
            return int(cur.fetchone()[0])

        self.generation = self._transaction(join)
        log.info("HA cluster %s: broker %s joined (generation %d)", self.settings.clusterid, me, self.generation)

    def _holding(self, cur: Any) -> bool:
        """Whether our lease is ours still (locks our row against a takeover till commit)."""
        cur.execute(
            f"SELECT 1 FROM {BROKERS} WHERE brokerid = %s AND generation = %s AND state = %s "
            "AND lease_expires > now() FOR SHARE",
            (self.brokerid, self.generation, LIVE),
        )
        return cur.fetchone() is not None

    def claim(self, activelist: Iterable[str]) -> list[str]:
        """The chapter's start-up rules: a bridge of ``activelist`` not in the ownership
        table is added as ours; one another broker owns is dropped; one we own that
        ``activelist`` does not name is added. The bridges this instance is to run."""
        me, wanted = self.brokerid, list(dict.fromkeys(activelist))

        def claim(cur: Any) -> list[str]:
            if not self._holding(cur):
                raise ClusterError(f"broker {me} no longer holds its lease")
            cur.execute(f"LOCK TABLE {BRIDGES} IN SHARE ROW EXCLUSIVE MODE")
            cur.execute(f"SELECT bridge, owner FROM {BRIDGES}")
            owners = dict(cur.fetchall())
            active = []
            for name in wanted:
                owner = owners.get(name)
                if owner is None:
                    cur.execute(f"INSERT INTO {BRIDGES}(bridge, owner) VALUES (%s, %s)", (name, me))
                    log.info("bridge %s: added to the ownership table as broker %s's", name, me)
                    active.append(name)
                elif owner != me:
                    log.warning("bridge %s is owned by broker %s: removed from imq.bridge.activelist", name, owner)
                else:
                    active.append(name)
            for name, owner in sorted(owners.items()):
                if owner == me and name not in wanted:
                    log.info("bridge %s is owned by broker %s: added to imq.bridge.activelist", name, me)
                    active.append(name)
            return active

        return self._transaction(claim)

    def owners(self) -> dict[str, str]:
        """The ownership table: bridge name -> owning broker id."""

        def read(cur: Any) -> dict[str, str]:
            cur.execute(f"SELECT bridge, owner FROM {BRIDGES} ORDER BY bridge")
            return dict(cur.fetchall())

        return self._transaction(read)

    def members(self) -> dict[str, Any]:
        """The cluster as the management API shows it: each instance (broker id, state,
        address, lease expiry, whether that lease is current, who took it over) and each
        bridge's owner and since when."""

        def read(cur: Any) -> dict[str, Any]:
            cur.execute(
                f"SELECT brokerid, state, address, lease_expires, lease_expires > now(), taken_by "
                f"FROM {BROKERS} ORDER BY brokerid"
            )
            instances = [
                {
                    "brokerid": brokerid,
                    "state": state,
                    "address": address,
                    "leaseExpires": expires.isoformat(),
                    "leaseCurrent": bool(current),
                    "takenBy": taken_by,
                }
                for brokerid, state, address, expires, current, taken_by in cur.fetchall()
            ]
            cur.execute(f"SELECT bridge, owner, since FROM {BRIDGES} ORDER BY bridge")
            bridges = [{"name": b, "owner": o, "since": since.isoformat()} for b, o, since in cur.fetchall()]
            return {"instances": instances, "bridges": bridges}

        return self._transaction(read)

    # --- heart-beats and takeover ---------------------------------------------------------
    def start(
        self,
        took_over: Callable[[str, list[str]], None],
        lost: Callable[[str | None], None],
        rejoined: Callable[[list[str]], None],
        activelist: Iterable[str],
    ) -> None:
        """Renew the lease on a thread of its own. ``took_over(broker, bridges)``: we took
        over that broker and now own those bridges; ``lost(reason)``: stop every bridge now
        (``reason`` None: the database was out of reach for a monitor interval, we run them
        again when it is back; else our generation was replaced, by a takeover or a new
        process of our broker id, which the reason says: this process must end, called once,
        also when a store write finds it first); ``rejoined(bridges)``: the database is back,
        our lease is ours still, and we own these."""
        self._callbacks = (took_over, rejoined, list(activelist))
        with self._replaced_lock:
            self._lost = lost
            told = self._replaced
        self.holding = not told  # join() made us a member
        if told:  # replaced while the service started: it ends now
            lost(self._reason)
        self.keep_alive()

    def keep_alive(self) -> None:
        """Renew the lease from now on, on a thread of its own (the service's start, between
        join and start(), may take longer than a monitor interval); takeovers and the
        callbacks begin with start()."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._beat, daemon=True, name="ha-heartbeat")
            self._thread.start()

    def replaced(self, reason: str) -> None:
        """Our generation is another's now (the heart-beat or a fenced store write found it):
        tell the service once (it stops every bridge and ends), and beat no more."""
        with self._replaced_lock:
            if self._replaced:
                return
            self._replaced, self._reason, lost = True, reason, self._lost
        self.holding = False
        self._halt.set()
        if lost is not None:
            lost(reason)

    def _beat(self) -> None:
        renewed = time.monotonic()
        while not self._halt.wait(self.settings.heartbeat):
            try:
                if not self.renew():
                    self.replaced(self._replacement())
                    return
                renewed = time.monotonic()
                callbacks = self._callbacks
                if callbacks is None:  # (the service is starting)
                    continue
                took_over, rejoined, wanted = callbacks
                if not self.holding:
                    rejoined(self.claim(wanted))
                    self.holding = True
                    continue
                taken = self.take_over()
                if taken is not None:
                    took_over(*taken)
            except (StoreError, ClusterError) as exc:
                log.warning("HA cluster %s: %s", self.settings.clusterid, exc)
                lost = self._lost
                if self.holding and lost is not None and time.monotonic() - renewed > self.settings.monitor:
                    self.holding = False
                    log.error(
                        "HA cluster %s: broker %s could not renew its lease for %g s; stopping its bridges",
                        self.settings.clusterid,
                        self.brokerid,
                        self.settings.monitor,
                    )
                    lost(None)
            except Exception:
                log.exception("HA cluster %s: heart-beat failed", self.settings.clusterid)

    def _replacement(self) -> str:
        """What replaced our generation, as the one ERROR line says it."""

        def read(cur: Any) -> tuple[Any, ...] | None:
            cur.execute(f"SELECT generation, state, taken_by FROM {BROKERS} WHERE brokerid = %s", (self.brokerid,))
            row = cur.fetchone()
            return None if row is None else tuple(row)

        return self._replaced_by(self._transaction(read))

    def _replaced_by(self, row: tuple[Any, ...] | None) -> str:
        """The ERROR line's words for our lease row (generation, state, taken_by) now."""
        me = f"broker {self.brokerid} generation {self.generation}"
        if row is None:
            return f"{me} lost its lease row in HA cluster {self.settings.clusterid}"
        if row[1] == TAKEN:
            return f"{me} was taken over by broker {row[2]} of HA cluster {self.settings.clusterid}"
        return (
            f"{me} was replaced by generation {row[0]}: another process joined HA cluster "
            f"{self.settings.clusterid} as broker {self.brokerid}"
        )

    def renew(self) -> bool:
        """Extend our lease by a monitor interval; False when it is no longer ours."""

        def renew(cur: Any) -> bool:
            cur.execute(
                f"UPDATE {BROKERS} SET lease_expires = now() + make_interval(secs => %s) "
                "WHERE brokerid = %s AND generation = %s AND state = %s",
                (self.settings.monitor, self.brokerid, self.generation, LIVE),
            )
            return bool(cur.rowcount == 1)

        return bool(self._transaction(renew))

    def take_over(self) -> tuple[str, list[str]] | None:
        """Take over at most one member whose lease has expired: (its broker id, the
        bridges now ours), or None. Atomic: of several live instances one wins, and in the
        same transaction its store's rows move into ours (adopt)."""
        me, broker = self.brokerid, self._broker
        moved: list[tuple[Recovered, dict[str, int]]] = []

        def take(cur: Any) -> tuple[str, list[str]] | None:
            cur.execute(
                f"SELECT brokerid FROM {BROKERS} WHERE state = %s AND brokerid <> %s "
                "AND lease_expires < now() ORDER BY lease_expires LIMIT 1 "
                "FOR UPDATE SKIP LOCKED",
                (LIVE, me),
            )
            row = cur.fetchone()
            if row is None or not self._holding(cur):
                return None
            dead = row[0]
            cur.execute(
                f"UPDATE {BROKERS} SET state = %s, taken_by = %s, generation = generation + 1 WHERE brokerid = %s",
                (TAKEN, me, dead),
            )
            cur.execute(f"UPDATE {BRIDGES} SET owner = %s, since = now() WHERE owner = %s RETURNING bridge", (me, dead))
            bridges = sorted(r[0] for r in cur.fetchall())
            if broker is not None:
                moved.append(self._move_store(cur, broker, dead))
            return dead, bridges

        if broker is None:
            taken = self._transaction(take)
        else:
            with broker.lock:  # nothing enters our queues between the seqs and the adoption
                taken = self._transaction(take)
                if taken is not None and moved:
                    broker.adopt(*moved[0])
        if taken is not None:
            log.warning(
                "HA cluster %s: broker %s took over broker %s (lease expired), its store and its bridges: %s",
                self.settings.clusterid,
                me,
                taken[0],
                ", ".join(taken[1]) or "none",
            )
        return taken

    def _move_store(self, cur: Any, broker: Broker, dead: str) -> tuple[Recovered, dict[str, int]]:
        """Move the dead instance's store rows into ours (the caller's transaction, our
        broker's lock held): messages and prepared XA branches get seqs of ours in their
        order; subscriptions and destination settings we lack come along. What the broker
        needs to adopt them, and the bytes of each destination's moved messages."""
        clusterid = self.settings.clusterid
        theirs, ours = instance_schema(clusterid, dead), instance_schema(clusterid, self.brokerid)
        cur.execute("SELECT to_regclass(%s), to_regclass(%s)", (f'"{theirs}".msgs', f'"{ours}".msgs'))
        if None in cur.fetchone():
            return Recovered({}, [], [], {}, {}, 0), {}
        t, o = f'"{theirs}"', f'"{ours}"'
        self._drop_destroyed(cur, t, dead)
        cur.execute(f"SELECT COUNT(*) FROM (SELECT seq FROM {t}.msgs UNION SELECT seq FROM {t}.xa_sends) s")
        count = int(cur.fetchone()[0])
        base = broker.reserve_seqs(count)
        cur.execute(
            "CREATE TEMPORARY TABLE imq_adopt ON COMMIT DROP AS SELECT seq AS old, "
            "%s + ROW_NUMBER() OVER (ORDER BY seq) AS new FROM "
            f"(SELECT seq FROM {t}.msgs UNION SELECT seq FROM {t}.xa_sends) s",
            (base,),
        )
        cur.execute(
            f"INSERT INTO {o}.msgs(seq, qkey, dcount, blob) SELECT a.new, m.qkey, m.dcount, m.blob "
            f"FROM {t}.msgs m JOIN imq_adopt a ON a.old = m.seq"
        )
        cur.execute(
            f"INSERT INTO {o}.xa(xid, state) SELECT xid, state FROM {t}.xa ON CONFLICT (xid) DO NOTHING RETURNING xid"
        )
        prepared = {xid: PreparedBranch() for (xid,) in cur.fetchall()}
        cur.execute(
            f"INSERT INTO {o}.xa_sends(xid, seq, qkey, blob) SELECT s.xid, a.new, s.qkey, s.blob "
            f"FROM {t}.xa_sends s JOIN imq_adopt a ON a.old = s.seq "
            "RETURNING xid, seq, qkey, blob"
        )
        for xid, seq, qkey, blob in sorted(cur.fetchall(), key=lambda r: r[1]):
            prepared.setdefault(xid, PreparedBranch()).sends.append((seq, loaded_key(qkey), bytes(blob)))
        cur.execute(
            f"INSERT INTO {o}.xa_acks(xid, seq) SELECT k.xid, a.new "
            f"FROM {t}.xa_acks k JOIN imq_adopt a ON a.old = k.seq RETURNING xid, seq"
        )
        for xid, seq in sorted(cur.fetchall(), key=lambda r: r[1]):
            prepared.setdefault(xid, PreparedBranch()).acks.append(seq)
        # (a dead instance's store of schema version 1 has no owners: they stay unknown)
        cur.execute(f"ALTER TABLE {t}.subs ADD COLUMN IF NOT EXISTS owner TEXT")
        cur.execute(
            f"INSERT INTO {o}.subs(client_id, name, topic, selector, no_local, owner) "
            f"SELECT client_id, name, topic, selector, no_local, owner FROM {t}.subs "
            "ON CONFLICT DO NOTHING RETURNING client_id, name, topic, selector, no_local, owner"
        )
        subs = [(c, n, tp, sel, bool(nl), ow) for c, n, tp, sel, nl, ow in cur.fetchall()]
        cur.execute(f"INSERT INTO {o}.dests SELECT * FROM {t}.dests ON CONFLICT DO NOTHING RETURNING qkey, config")
        dests: dict[str, dict[str, Any]] = {loaded_key(k): json.loads(v) for k, v in cur.fetchall()}
        top = base + count
        cur.execute(
            f"SELECT qkey, COUNT(*), COALESCE(SUM(LENGTH(blob)), 0) FROM {o}.msgs "
            "WHERE seq > %s AND seq <= %s GROUP BY qkey",
            (base, top),
        )
        rows = [(loaded_key(q), n, b) for q, n, b in cur.fetchall()]
        cur.execute(
            f"SELECT m.seq, m.qkey, m.dcount, m.blob FROM {o}.msgs m JOIN {o}.xa_acks a "
            "ON a.seq = m.seq WHERE m.seq > %s AND m.seq <= %s ORDER BY m.seq",
            (base, top),
        )
        locked = [(seq, loaded_key(q), d, bytes(b)) for seq, q, d, b in cur.fetchall()]
        for table in ("msgs", "xa", "xa_sends", "xa_acks", "subs", "dests"):
            cur.execute(f"DELETE FROM {t}.{table}")
        log.info(
            "HA cluster %s: moving broker %s's store into %s's: %d messages, %d subscriptions, %d prepared XA branches",
            clusterid,
            dead,
            self.brokerid,
            sum(int(n) for _, n, _ in rows),
            len(subs),
            len(prepared),
        )
        return (
            Recovered({q: int(n) for q, n, _ in rows}, locked, subs, dests, prepared, top),
            {q: int(b) for q, _, b in rows},
        )

    def _drop_destroyed(self, cur: Any, theirs: str, dead: str) -> None:
        """Before the move: the dead instance's queues and destination settings that an
        administrator destroyed in the cluster meanwhile go, with the queues' messages,
        as they would at its own next start. Adopted, such a queue was ours until the
        catalog was applied again, and a send to it was taken (to be destroyed after)."""
        cur.execute("SELECT to_regclass(%s)", (CATALOG,))
        if cur.fetchone()[0] is None:
            return
        cur.execute(f"SELECT dkey FROM {CATALOG} WHERE destroyed")
        gone = [stored_key(key) for (key,) in cur.fetchall()]
        if not gone:
            return
        cur.execute(f"DELETE FROM {theirs}.msgs WHERE qkey = ANY(%s)", (gone,))
        removed = cur.rowcount
        cur.execute(f"DELETE FROM {theirs}.dests WHERE qkey = ANY(%s) RETURNING qkey", (gone,))
        dropped = sorted({loaded_key(k) for (k,) in cur.fetchall()})
        if removed or dropped:
            log.info(
                "HA cluster %s: broker %s's destinations destroyed in the cluster are not taken over: "
                "%s (%d message(s))",
                self.settings.clusterid,
                dead,
                ", ".join(dropped) or "-",
                removed,
            )

    def halt(self) -> None:
        """Stop the heart-beats (no takeover begins after this returns)."""
        self._halt.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None

    def leave(self) -> None:
        """A clean stop: our lease expires now, so that a live instance takes our bridges
        over at its next heart-beat (as after a failure)."""
        self.halt()
        self.holding = False
        try:
            self._transaction(
                lambda cur: cur.execute(
                    f"UPDATE {BROKERS} SET lease_expires = now() WHERE brokerid = %s AND generation = %s "
                    "AND state = %s",
                    (self.brokerid, self.generation, LIVE),
                )
            )
        except StoreError as exc:
            log.warning("HA cluster %s: %s", self.settings.clusterid, exc)
        self.close()

    def close(self) -> None:
        """Close our database connection (the next transaction would open another)."""
        with self._lock:
            self._drop()


def open_cluster(props: BrokerProperties, address: str, bridges: Mapping[str, str]) -> HACluster | None:
    """Join the HA cluster ``props`` name (None when imq.cluster.ha is not true) with the
    bridge configuration ``bridges`` (the service's: what every live member must share)."""
    settings = cluster_settings(props)
    if settings is None:
        return None
    cluster = HACluster(settings)
    try:
        cluster.create_tables()
        cluster.join(address, bridges)
    except BaseException:
        cluster.close()
        raise
    return cluster


def cluster_problems(props: BrokerProperties, bridges: Mapping[str, str]) -> list[str]:
    """For check: how this instance, with the bridge configuration ``bridges``, would fail
    to join its cluster now (a live member with another configuration, or its broker id
    live), without joining."""
    settings = cluster_settings(props)
    if settings is None:
        return []
    cluster = HACluster(settings)

    def read(cur: Any) -> list[str]:
        cur.execute("SELECT to_regclass(%s)", (f'"{settings.jdbc.schema}".{BROKERS}',))
        if cur.fetchone()[0] is None:
            return []
        cur.execute(
            f"SELECT brokerid, config FROM {BROKERS} WHERE state = %s AND lease_expires > now() ORDER BY brokerid",
            (LIVE,),
        )
        found = []
        for other, text in cur.fetchall():
            if other == settings.brokerid:
                found.append(
                    f"broker id {other} is in use by a live instance of cluster "
                    f"{settings.clusterid}; each instance needs its own imq.brokerid"
                )
            differ = differences(bridges, json.loads(text))
            if differ:
                found.append(
                    f"the bridge configuration differs from live broker {other}'s in "
                    f"{', '.join(differ)}; every instance of HA cluster "
                    f"{settings.clusterid} needs the same (imq.cluster.url)"
                )
        return found

    try:
        return cluster._transaction(read)
    finally:
        cluster.close()
