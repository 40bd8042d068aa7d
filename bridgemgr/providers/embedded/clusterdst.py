"""Cluster-wide destinations of an HA cluster: every instance serves the same queues,
topics, durable subscriptions and temporary destinations.

Each instance advertises in the cluster's table imq_ha_demand what it serves: queues and
durable subscriptions with active consumers (selectors, backlog), its non-durable
subscriptions per topic (selectors, a version), its temporary destinations. A queue's
waiting message that no local consumer waits for is handed off to an instance whose
consumer takes it: in ONE PostgreSQL transaction its row leaves our store's schema for the
cluster's inbox (imq_ha_inbox), NOTIFY wakes the peer, which moves it into its own store
and serves it; a row is in one place at a time, so each message is delivered once. A
publish is stored for each peer with subscribers it selects in a proxy subscription
(r:BROKERID:VERSION:TOPIC) in the publish's store batch, handed off the same way and fanned
out there; a send to a peer's temporary destination goes through a proxy (x:). Durable
subscriptions are kept in imq_ha_durables, mirrored by every instance; their queues are
served as queues are.

Rules: the broker's lock is taken before our connections' (never the other way); the
handoff and the intake each fence on the instance's lease.

Design notes: docs/ha.md#internals-providersembeddedclusterdstpy.
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...jms import codec
from ...jms.destination import Destination, Topic
from ...jms.errors import JMSException, MessageCodecError, StoreError
from ...jms.message import Message
from ...jms.selector import Selector, compile_selector
from ...logfiles import COUNTED
from .cluster import BROKERS, instance_schema
from .pgstore import close_quietly, in_transaction, loaded_key, pipelined, stored_key
from .queues import Envelope, MessageQueue
from .routing import WIRE_KEEP
from .state import Subscription, _owned, log, now_ms

if TYPE_CHECKING:
    from .broker import Broker
    from .cluster import HACluster
    from .host import EmbeddedHostBroker

DEMAND, INBOX, DURABLES = "imq_ha_demand", "imq_ha_inbox", "imq_ha_durables"
REJECTED = "imq_ha_inbox_rejected"  # inbox rows the intake could not decode, kept for the operator
STAMPS = "imq_ha_consumer_stamps"  # a consumer's place in the cluster's order (maxNumActiveConsumers)
SEEN = "imq_ha_durables_seen"  # broker id -> the highest imq_ha_durables version it mirrored
CREDIT = 2000  # messages a peer may hold waiting per active consumer before we stop handing off
BATCH = 500  # rows per handoff or intake transaction
FIRST = 50  # rows at most of a handoff to a peer with nothing waiting: its consumers start sooner
GONE_KEEP = 60.0  # seconds a peer's temporary destination that went is known as gone
REFRESH = 0.2  # seconds between advertisements of our demand (and looks at the inbox)
FED_LOOK = 0.01  # seconds between looks at our demand while the table says messages wait here
_TABLES = (
    f"CREATE TABLE IF NOT EXISTS {DEMAND}(brokerid TEXT NOT NULL, qkey TEXT NOT NULL, "
    "consumers INTEGER NOT NULL, selectors TEXT, backlog BIGINT NOT NULL, "
    "PRIMARY KEY (brokerid, qkey))",
    f"CREATE TABLE IF NOT EXISTS {INBOX}(id BIGSERIAL PRIMARY KEY, target TEXT NOT NULL, "
    "qkey TEXT NOT NULL, dcount INTEGER NOT NULL, blob BYTEA NOT NULL)",
    f"CREATE INDEX IF NOT EXISTS {INBOX}_target ON {INBOX}(target, id)",
    f"CREATE TABLE IF NOT EXISTS {DURABLES}(client_id TEXT NOT NULL, name TEXT NOT NULL, topic TEXT NOT NULL, "
    "selector TEXT, no_local INTEGER NOT NULL, owner TEXT, PRIMARY KEY (client_id, name))",
    f"ALTER TABLE {DEMAND} ADD COLUMN IF NOT EXISTS stamps TEXT",  # (made by an older version)
    f"CREATE SEQUENCE IF NOT EXISTS {STAMPS}",
    # a durable subscription's row is versioned and, once unsubscribed, a tombstone; each
    # instance records the highest version it mirrored (its store's copies are that new)
    f"ALTER TABLE {DURABLES} ADD COLUMN IF NOT EXISTS version BIGINT NOT NULL DEFAULT 0",
    f"ALTER TABLE {DURABLES} ADD COLUMN IF NOT EXISTS deleted BOOLEAN NOT NULL DEFAULT false",
    f"CREATE SEQUENCE IF NOT EXISTS {DURABLES}_version",
    f"CREATE TABLE IF NOT EXISTS {SEEN}(brokerid TEXT PRIMARY KEY, version BIGINT NOT NULL)",
    f"CREATE TABLE IF NOT EXISTS {REJECTED}(id BIGINT PRIMARY KEY, target TEXT NOT NULL, qkey TEXT NOT NULL, "
    "dcount INTEGER NOT NULL, blob BYTEA NOT NULL, reason TEXT NOT NULL, rejected TIMESTAMPTZ NOT NULL DEFAULT now())",
)
_PROXIED = ("r:", "x:")  # inbox rows for our subscribers or temporary destinations: not stored
_DDL_LOCK = 0x494D5144  # advisory lock: one instance creates these tables at a time
_STAMP_LOCK = 0x494D5153  # ...and stamps consumers and reads the others' at a time
Demand = dict[str, tuple[int, str | None, int, str | None]]  # qkey -> consumers, selectors, backlog, stamps


def channel(clusterid: str, brokerid: str) -> str:
    """The NOTIFY channel that wakes ``brokerid``'s intake (its store's schema's name)."""
    return instance_schema(clusterid, brokerid)


@dataclass
class Peer:
    """An instance that advertises active consumers on one of our queues."""

    brokerid: str
    consumers: int
    selectors: list[Selector] | None  # None: a consumer takes any message
    backlog: int

    @property
    def credit(self) -> int:
        return max(0, self.consumers * CREDIT - self.backlog)

    def takes(self, message: Message) -> bool:
        return self.selectors is None or any(s.matches(message) for s in self.selectors)


@dataclass(eq=False)  # found in a queue's waiters by identity
class _Parker:
    """Parked in a queue's waiters: woken when a message arrives that a peer's consumer
    would take and no local waiting consumer can (local consumers come first)."""

    queue: MessageQueue
    peers: list[Peer]
    wake: Callable[[], None]
    closed: bool = False

    def can_take(self, message: Message | None) -> bool:
        limits = self.queue.limits
        if self.closed or limits.is_local_only or (limits.local_delivery_preferred and _active(self.queue)):
            return False
        if message is not None:
            if not any(p.credit and p.takes(message) for p in self.peers):
                return False
            if any(w is not self and w.can_take(message) and self.queue.is_active(w) for w in self.queue.waiters):
                return False
        return True

    def notify(self) -> None:
        self.wake()


@dataclass(eq=False)
class _Nudge:
    """Parked in a proxy's waiters (r:, x:): a message put there wakes the handoff."""

    wake: Callable[[], None]

    def can_take(self, message: Message | None) -> bool:
        return True

    def notify(self) -> None:
        self.wake()


def _active(mq: MessageQueue) -> list[Any]:
    """The consumers of ``mq`` that take messages now, not backups (under the broker's lock)."""
    return [c for c in mq.consumers if not c.closed and getattr(c.connection, "started", False) and mq.is_active(c)]


def _shape(demand: Demand) -> Demand:
    """What of our demand is worth telling the peers at once: consumers, selectors, the
    backlog in steps of a quarter of a consumer's credit, and the consumers' stamps."""
    return {
        k: (n, sel, backlog if k.startswith("t:") else backlog // (CREDIT // 4), stamps)
        for k, (n, sel, backlog, stamps) in demand.items()
    }


def _raised_by(rows: Demand, raised: dict[str, int]) -> Demand:
    """Our demand as the table holds it once the peers raised our backlog there by what
    they handed us (``raised``: what we took in since we wrote ``rows``). Compared with
    our demand now, it says when to tell the peers that our consumers took what they
    sent: the credit they hand off against."""
    if not raised:
        return rows
    return {k: (n, sel, backlog + raised.get(k, 0), stamps) for k, (n, sel, backlog, stamps) in rows.items()}


def _ints(values: Iterable[int]) -> str:
    """A PostgreSQL array literal of ``values`` (for ``%s::bigint[]``): psycopg dumps a list
    element by element in Python, 8% of a handoff's CPU for its three arrays."""
    return "{" + ",".join(map(str, values)) + "}"


def _texts(values: Iterable[str]) -> str:
    """A PostgreSQL array literal of ``values`` (for ``%s::text[]``), each quoted."""
    return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"


def _window(mq: MessageQueue, first: int) -> Iterator[Envelope]:
    """``mq``'s waiting messages in memory, in delivery order (under the lock): the first
    ``first`` copied at once, the rest only if the caller goes on past them (a handoff
    takes at most a batch, and copying a window of 20,000 for each cost more than the
    batch's move)."""
    head = mq.head(first)
    yield from head
    if len(head) == first:
        seen = set(map(id, head))
        yield from (env for env in mq.browse() if id(env) not in seen)


def _selectors(selectors: list[Selector | None]) -> str | None:
    """Selectors as JSON, None when one of them takes any message."""
    texts = [getattr(s, "text", None) if s is not None else None for s in selectors]
    return None if any(t is None for t in texts) else json.dumps(sorted(set(texts)))


def _local_demand(broker: Broker) -> Demand:
    """qkey -> (active consumers, their selectors as JSON (None: one takes any), backlog,
    None) of our queues (not temporary ones, nor those with maxNumActiveConsumers: see
    _ranked_demand) and durable subscriptions with active consumers (under the lock)."""
    out: Demand = {}
    for mq in broker.queues.values():
        if mq.deleted or mq.topic is not None or mq.limits.is_local_only or _ranked(mq):
            continue
        active = _active(mq)
        if active:
            out[mq.key] = (len(active), _selectors([c.selector for c in active]), len(mq), None)
    for sub in broker.durable.values():  # (its queue selects at publish: its consumers take any)
        mq = sub.queue
        if not mq.limits.is_local_only and (active := _active(mq)):
            out[mq.key] = (len(active), None, len(mq), None)
    return out


def _ranked(mq: MessageQueue) -> bool:
    """Are ``mq``'s consumers active or backups in the cluster's order (a queue of ours
    with maxNumActiveConsumers, not local only)?"""
    return mq.topic is None and mq.limits.max_num_active_consumers >= 0 and not mq.limits.is_local_only


def _subscribers(broker: Broker, topic: str) -> list[MessageQueue]:
    """The non-durable subscriptions of ``topic`` (not a temporary one) here (under the lock)."""
    if topic in broker.temporary:
        return []
    return [mq for mq in broker.topics.get(topic, ()) if mq.key.startswith(("sub:", "cc:")) and not mq.deleted]


def _any_of(texts: str | None) -> Selector | None:
    """One selector that takes what any of ``texts`` (JSON, as advertised) takes."""
    if texts is None:
        return None
    try:
        return compile_selector(" OR ".join(f"({t})" for t in json.loads(texts)))
    except JMSException:  # too large together: every message goes, the peer selects
        return None


class ClusterQueues:
    """This instance's part in the cluster-wide destinations: advertising, handing off,
    taking in."""

    def __init__(self, cluster: HACluster, broker: Broker) -> None:
        self.cluster, self.broker = cluster, broker
        self.settings, self.brokerid = cluster.settings, cluster.brokerid
        self._schema = instance_schema(self.settings.clusterid, self.brokerid)  # our store's
        self._halt = threading.Event()
        self._wake = threading.Event()
        self._reread = False  # a peer's demand changed: advertise (and read theirs) now
        self._raised: dict[str, int] = {}  # qkey -> messages taken in since the last look (under the lock)
        self._demand_channel = f"{self.settings.jdbc.schema}_demand"
        self._threads: list[threading.Thread] = []
        self._parkers: dict[str, _Parker] = {}
        self._nudge = _Nudge(self._wake.set)
        # our non-durable subscriptions' versions: a peer's copy of a message published
        # when it knew version V goes to ours of version <= V (made before it was published)
        self._versions: weakref.WeakKeyDictionary[MessageQueue, int] = weakref.WeakKeyDictionary()
        # our consumers' places in the cluster's order (queues with maxNumActiveConsumers),
        # and those the next advertisement stamps, by qkey
        self._stamps: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._fresh: dict[str, list[Any]] = {}
        self._version = 0
        self._selected: dict[str, str | None] = {}  # a proxy's selectors, as advertised
        self._dead: set[str] = set()  # broker ids taken over (not one whose lease lapsed: it may renew)
        self._live: set[str] = set()  # ...and those whose lease is live
        self._temps: dict[str, str] = {}  # the peers' temporary destinations -> their broker id
        self._gone: dict[str, float] = {}  # ...no longer advertised -> since (time.monotonic())
        # (client id, name) of a durable subscription -> the peer its subscriber is attached to
        self._attached: dict[tuple[str, str], str] = {}
        self._conns: dict[str, Any] = {}
        self._seen: int | None = None  # the imq_ha_durables version we mirrored (None: not read yet)
        self.handed_off = 0  # messages handed to other instances (tests, /metrics)
        self.taken_in = 0  # messages other instances handed to us
        self.inbox_rejected = 0  # inbox rows for us set aside in imq_ha_inbox_rejected

    # --- the database ---------------------------------------------------------------------
    def _conn(self, role: str) -> Any:
        conn = self._conns.get(role)
        if conn is None or conn.closed:
            conn = self._conns[role] = self.settings.jdbc.connect()
            # A move need not wait for its flush: what makes it matter (an acknowledgement,
            # a consumer's commit) is a synchronous commit after it in the log, which
            # flushes it too; one lost with the server leaves the message unacknowledged
            # where it was, and it is delivered again, as after any crash.
            conn.execute("SET synchronous_commit TO off")
            conn.commit()
        return conn

    def _own_pid(self) -> int | None:
        """The server process of our advertisements' connection (its NOTIFYs are ours)."""
        conn = self._conns.get("work")
        return None if conn is None or conn.closed else conn.info.backend_pid

    def _transaction(self, role: str, work: Callable[[Any], Any]) -> Any:
        return in_transaction(self._conns, role, self._conn, f"{self.settings.jdbc.where}: cluster-wide queues", work)

    def _fenced(self, cur: Any) -> None:
        """As the store's fence: the lease is our generation's, live (FOR SHARE: a takeover
        of us waits for our write, or our write finds it and fails, and this process ends)."""
        self.cluster.fence(cur)

    def _clear_demand(self, cur: Any) -> None:
        """Our demand rows go (at start and stop), fenced: not a new process's of our id."""
        self._fenced(cur)
        cur.execute(f"DELETE FROM {DEMAND} WHERE brokerid = %s", (self.brokerid,))

    def create_tables(self) -> None:
        def create(cur: Any) -> None:
            cur.execute(
                "SELECT to_regclass(%s), to_regclass(%s), to_regclass(%s), to_regclass(%s), to_regclass(%s)",
                (DEMAND, f"{INBOX}_target", DURABLES, STAMPS, SEEN),
            )
            if None not in cur.fetchone():
                return  # (CREATE INDEX IF NOT EXISTS would lock the inbox: peers' moves wait)
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK,))
            for statement in _TABLES:
                cur.execute(statement)

        self._transaction("work", create)

    # --- the threads ------------------------------------------------------------------------
    def start(self) -> None:
        self.create_tables()
        with self.broker.lock:  # our durable subscriptions join the cluster's (not replacing one)
            self.broker.cluster_durables = [("add", sub) for sub in self.broker.durable.values()]
            self.broker.temp_home = self.brokerid  # temp.<brokerid>.<id>: peers route there
            self.broker.remote_temporary = self._remote_temporary
            self.broker.remote_durable = self._attached_to
        self._transaction("work", self._clear_demand)
        with self.broker.lock:
            demand = self._demand()
        self.advertise(demand, True)  # the peers' subscriptions, durables, temporaries: known now
        for name, target in (("ha-handoff", self._run_handoff), ("ha-intake", self._run_intake)):
            thread = threading.Thread(target=target, daemon=True, name=name)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._halt.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(30)
        self._threads.clear()
        with self.broker.lock:
            self._unpark_all()
            self.broker.cluster_durables = None
            self.broker.remote_temporary = None
            self.broker.remote_durable = None
        try:
            self._transaction("work", self._clear_demand)
        except StoreError as exc:
            log.warning("HA cluster %s: %s", self.settings.clusterid, exc)
        for conn in self._conns.values():
            close_quietly(conn)
        self._conns.clear()

    def _run_handoff(self) -> None:
        advertised, rows = 0.0, None  # rows: our demand as the table holds it, to our knowledge
        fed: set[str] = set()  # queues holding messages the peers handed us
        while not self._halt.is_set():
            # while they wait, look sooner: the peers' credit is our backlog there, and our
            # consumers may take a quarter of it in milliseconds
            self._wake.wait(FED_LOOK if fed else REFRESH / 4)
            self._wake.clear()
            if self._halt.is_set():
                return
            try:
                with self.broker.lock:
                    demand = self._demand()
                    # durables made or removed here, consumers to stamp
                    durables = bool(self.broker.cluster_durables or self._fresh)
                    raised, self._raised = self._raised, {}
                if rows is not None:
                    rows = _raised_by(rows, raised)
                fed = {k for k in fed.union(raised) if k in demand and demand[k][2]}
                now = time.monotonic()
                changed = rows is None or _shape(demand) != _shape(rows) or durables
                if changed or self._reread or now - advertised >= REFRESH:
                    self._reread = False
                    self.advertise(demand, changed)
                    advertised, rows = now, demand
                while self.hand_off() and not self._halt.is_set():
                    pass
            except StoreError as exc:
                log.warning("HA cluster %s: %s", self.settings.clusterid, exc)
                self._halt.wait(1)
            except Exception:
                log.exception("HA cluster %s: the handoff failed", self.settings.clusterid)
                self._halt.wait(1)

    def _run_intake(self) -> None:
        listening: Any = None
        while not self._halt.is_set():
            try:
                conn = self._conn("intake")
                if listening is not conn:
                    conn.execute(f'LISTEN "{channel(self.settings.clusterid, self.brokerid)}"')
                    conn.execute(f'LISTEN "{self._demand_channel}"')
                    conn.commit()
                    listening = conn
                for note in conn.notifies(timeout=REFRESH, stop_after=1):
                    # a peer's demand changed (not ours: our advertisement sent it): look now
                    if note.channel == self._demand_channel and note.pid != self._own_pid():
                        self._reread = True
                        self._wake.set()
                while self.take_in() and not self._halt.is_set():
                    pass
            except StoreError as exc:
                log.warning("HA cluster %s: %s", self.settings.clusterid, exc)
                self._halt.wait(1)
            except Exception as exc:  # a lost LISTEN connection: connect again
                log.warning("HA cluster %s: cluster-wide queues: %s", self.settings.clusterid, exc)
                close_quietly(self._conns.pop("intake", None))
                self._halt.wait(1)

    # --- advertising ------------------------------------------------------------------------
    def _demand(self) -> Demand:
        """What we advertise (under the broker's lock): our queues' demand, and per topic
        ``t:NAME`` our non-durable subscriptions (how many, their selectors, and in place
        of a backlog the newest one's version)."""
        out = _local_demand(self.broker)
        self._ranked_demand(out)
        for topic in list(self.broker.topics):
            subs = _subscribers(self.broker, topic)
            if not subs:
                continue
            for mq in subs:
                if mq not in self._versions:  # versions grow across restarts: the clock's ms
                    self._version = max(self._version + 1, now_ms())
                    self._versions[mq] = self._version
            out[f"t:{topic}"] = (
                len(subs),
                _selectors([mq.selector for mq in subs]),
                max(map(self._versions.__getitem__, subs)),
                None,
            )
        for name in self.broker.temporary:  # (so that a peer's send to one that is gone fails)
            out[f"tmp:{name}"] = (0, None, 0, None)
        return out

    def _ranked_demand(self, out: Demand) -> None:
        """Our queues with maxNumActiveConsumers into ``out`` (under the lock): a row while
        they have consumers, active or backups, with the stamps of those (a JSON list; the
        advertisement stamps the new ones, in _fresh) and as consumers the active ones."""
        self._fresh = {}
        for mq in self.broker.queues.values():
            if mq.deleted or not _ranked(mq):
                continue
            consumers = [c for c in mq.consumers if not c.closed]
            if not consumers:
                continue
            fresh = [c for c in consumers if c not in self._stamps]
            if fresh:
                self._fresh[mq.key] = fresh
            active = _active(mq)
            stamps = json.dumps([self._stamps[c] for c in consumers if c in self._stamps])
            out[mq.key] = (len(active), _selectors([c.selector for c in active]), len(mq), stamps)

    def _stamp(self, cur: Any, demand: Demand, fresh: dict[str, list[Any]]) -> dict[str, list[int]]:
        """In the advertisement's transaction: a stamp from the cluster's sequence for each
        new consumer, in ``demand``'s rows (a copy); holding the stamp lock to the commit,
        so the peers' rows read after it hold every consumer stamped before ours."""
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (_STAMP_LOCK,))
        cur.execute(f"SELECT nextval('{STAMPS}') FROM generate_series(1, %s)", (sum(map(len, fresh.values())),))
        numbers = iter(sorted(row[0] for row in cur.fetchall()))
        stamped = {qkey: [next(numbers) for _ in new] for qkey, new in fresh.items()}
        for qkey, stamps in stamped.items():
            n, selectors, backlog, known = demand[qkey]
            demand[qkey] = (n, selectors, backlog, json.dumps(json.loads(known or "[]") + stamps))
        return stamped

    def _rank(self, elsewhere: dict[str, list[int]]) -> None:
        """Which of our consumers of each queue with maxNumActiveConsumers are active
        (under the lock): those among the cluster's first (the lowest stamps, ours and the
        live peers'); one not stamped yet waits for its stamp. A change wakes the waiters."""
        for mq in self.broker.queues.values():
            theirs = elsewhere.get(mq.key, []) if _ranked(mq) else []
            ranked = None
            if _ranked(mq):
                ours = [(self._stamps[c], c) for c in mq.consumers if c in self._stamps and not c.closed]
                order = sorted([(s, None) for s in theirs] + ours, key=lambda entry: entry[0])
                ranked = [c for _, c in order[: mq.limits.max_num_active_consumers] if c is not None]
            mq.elsewhere = len(theirs)
            if ranked != mq.cluster_active:
                mq.cluster_active = ranked
                mq.wake_all()  # a consumer made active takes now, a backup stops

    def remote_subscribers(self, topic: str) -> list[str]:
        """The other instances whose subscribers of ``topic`` our publishers reach now."""
        with self.broker.lock:
            return sorted(mq.key.split(":")[1] for mq in self.broker.topics.get(topic, ()) if mq.key.startswith("r:"))

    def advertise(self, demand: Demand, changed: bool) -> None:
        """Write our queues' ``demand`` (rows that differ: a peer's handoff raises our
        backlog there; ``changed``: NOTIFY the peers), and read the peers' into parkers."""
        me = self.brokerid
        with self.broker.lock:
            changes = list(self.broker.cluster_durables or ())
            if self.broker.cluster_durables is not None:
                self.broker.cluster_durables.clear()
            fresh, self._fresh = self._fresh, {}
        written = dict(demand)

        def write(cur: Any) -> tuple[list[Any], dict[str, str | None], Any]:
            self._fenced(cur)  # our demand and durables: not a replaced process's
            stamped.update(self._stamp(cur, written, fresh) if fresh else {})
            cur.execute(
                f"DELETE FROM {DEMAND} WHERE brokerid = %s AND NOT qkey = ANY(%s)",
                (me, [stored_key(k) for k in written]),
            )
            if written:
                cur.executemany(
                    f"INSERT INTO {DEMAND} AS d(brokerid, qkey, consumers, selectors, backlog, stamps) "
                    "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (brokerid, qkey) DO UPDATE SET "
                    "consumers = EXCLUDED.consumers, selectors = EXCLUDED.selectors, backlog = EXCLUDED.backlog, "
                    "stamps = EXCLUDED.stamps WHERE (d.consumers, d.selectors, d.backlog, d.stamps) IS DISTINCT FROM "
                    "(EXCLUDED.consumers, EXCLUDED.selectors, EXCLUDED.backlog, EXCLUDED.stamps)",
                    [(me, stored_key(k), *v) for k, v in written.items()],
                )
            if changed or fresh:
                cur.execute(f'NOTIFY "{self._demand_channel}"')
            cur.execute(
                f"SELECT d.brokerid, d.qkey, d.consumers, d.selectors, d.backlog, d.stamps FROM {DEMAND} d "
                f"JOIN {BROKERS} b ON b.brokerid = d.brokerid AND b.state = 'live' "
                "AND b.lease_expires > now() WHERE d.brokerid <> %s ORDER BY d.brokerid",
                (me,),
            )
            rows = list(cur.fetchall())
            cur.execute(
                "SELECT brokerid, CASE WHEN state <> 'live' THEN 'taken' WHEN lease_expires > now() THEN 'live' END "
                f"FROM {BROKERS}"
            )
            members = dict(cur.fetchall())
            return rows, members, self._share_durables(cur, changes)

        stamped: dict[str, list[int]] = {}
        try:
            rows, members, (durables, stale, newest) = self._transaction("work", write)
        except BaseException:
            with self.broker.lock:  # told at the next advertisement
                if self.broker.cluster_durables is not None:
                    self.broker.cluster_durables[:0] = changes
            raise
        demand.update(written)  # (with the new stamps: the handoff's shape of what we wrote)
        elsewhere: dict[str, list[int]] = {}  # qkey -> the live peers' consumers' stamps
        peers: dict[str, list[Peer]] = {}
        topics: dict[str, str | None] = {}  # r:BROKERID:VERSION:TOPIC -> selectors
        temps: dict[str, str] = {}
        attached: dict[tuple[str, str], str] = {}
        for brokerid, stored, consumers, selectors, backlog, stamps in rows:
            qkey = loaded_key(stored)
            if stamps:
                elsewhere.setdefault(qkey, []).extend(json.loads(stamps))
                if not consumers:
                    continue  # (backups only: nothing goes there)
            if qkey.startswith("t:"):
                topics[f"r:{brokerid}:{backlog}:{qkey[2:]}"] = selectors
                continue
            if qkey.startswith("tmp:"):
                temps[qkey[4:]] = brokerid
                continue
            if qkey.startswith("d:"):
                client_id, _, name = qkey[2:].partition("\0")
                attached[(client_id, name)] = brokerid
            compiled = None if selectors is None else [compile_selector(t) for t in json.loads(selectors)]
            peers.setdefault(qkey, []).append(Peer(brokerid, consumers, compiled, backlog))  # type: ignore[arg-type]
        with self.broker.lock:
            self._dead = {b for b, state in members.items() if state == "taken"}
            self._live = {b for b, state in members.items() if state == "live"}
            self._know_temps(temps)
            self._attached = attached
            for qkey, stamps in stamped.items():
                for consumer, stamp in zip(fresh[qkey], stamps, strict=True):
                    self._stamps[consumer] = stamp
            self._rank(elsewhere)
            self._mirror(durables, stale)
            self._seen = newest
            self._park(peers)
            self._reach(topics)

    def _know_temps(self, temps: dict[str, str]) -> None:
        """The peers' temporary destinations now (under the lock); those gone are kept
        GONE_KEEP seconds (a send to one fails) and our proxies of them go once empty."""
        now = time.monotonic()
        for name in self._temps.keys() - temps.keys():
            self._gone[name] = now
        for name in [n for n, since in self._gone.items() if n in temps or now - since > GONE_KEEP]:
            del self._gone[name]
        self._temps = temps
        for qkey, mq in list(self.broker.proxies.items()):
            if qkey.startswith("x:") and not mq.count and qkey.split(":", 2)[2] not in temps:
                del self.broker.proxies[qkey]
                mq.deleted = True

    def _remote_temporary(self, dest: Destination) -> MessageQueue | None:
        """Where a send to another instance's temporary destination goes (Broker's hook,
        under the lock): our proxy of it, x:BROKERID:NAME, handed to that instance as a
        queue's messages are; None when it is gone (or names no live instance)."""
        owner = self._temps.get(dest.name)
        if owner is None:
            kind, _, rest = dest.name.partition(".")
            owner = rest.partition(".")[0]
            if kind != "temp" or dest.name in self._gone or owner not in self._live or owner == self.brokerid:
                return None
        qkey = f"x:{owner}:{dest.name}"
        mq = self.broker.proxies.get(qkey)
        if mq is None:
            mq = self.broker.proxies[qkey] = MessageQueue(qkey, dest, durable=False, usage=self.broker.usage)
            mq.waiters.append(self._nudge)
        return mq

    def _attached_to(self, client_id: str, name: str) -> str | None:
        """The peer a durable subscription's subscriber is attached to, as last read
        (Broker's hook, under the lock): attaching here or unsubscribing fails meanwhile."""
        return self._attached.get((client_id, name))

    def _share_durables(
        self, cur: Any, changes: list[tuple[str, Subscription]]
    ) -> tuple[dict[tuple[str, str], tuple[Any, ...]], set[tuple[str, str]], int]:
        """Write our durable subscriptions' changes to the cluster's (imq_ha_durables: a new
        version each, an unsubscribe a tombstone) and read them all: (client id, name) ->
        (topic, selector, no_local, owner) of the live ones, and the stale ones: an "add"
        of our store's (at start) that the cluster changed or removed since we last
        mirrored it (we were down), which our copy must not stand for; the newest version."""
        if self._seen is None:
            cur.execute(f"SELECT version FROM {SEEN} WHERE brokerid = %s", (self.brokerid,))
            row = cur.fetchone()
            self._seen = row[0] if row else 0
        seen = self._seen
        version = f"nextval('{DURABLES}_version')"
        inserted = set()
        for change, sub in changes:
            cur.execute(
                f"INSERT INTO {DURABLES}(client_id, name, topic, selector, no_local, owner, version, deleted) "
                f"VALUES (%s, %s, %s, %s, %s, %s, {version}, %s) ON CONFLICT (client_id, name) "
                + (
                    "DO NOTHING"
                    if change == "add"
                    else f"DO UPDATE SET version = {version}, deleted = EXCLUDED.deleted"
                    + (
                        ""
                        if change == "del"
                        else ", topic = EXCLUDED.topic, selector = EXCLUDED.selector, "
                        "no_local = EXCLUDED.no_local, owner = EXCLUDED.owner"
                    )
                )
                + " RETURNING 1",
                (sub.client_id, sub.name, sub.topic.name, sub.selector, int(sub.no_local), sub.owner, change == "del"),
            )
            if cur.fetchone() is not None:
                inserted.add((sub.client_id, sub.name))
        cur.execute(f"SELECT client_id, name, topic, selector, no_local, owner, version, deleted FROM {DURABLES}")
        rows = cur.fetchall()
        added = {(sub.client_id, sub.name) for change, sub in changes if change == "add"} - inserted
        stale = {(c, n) for c, n, *_, v, _ in rows if (c, n) in added and v > seen}
        live = {(c, n): (t, s, bool(nl), o) for c, n, t, s, nl, o, _, deleted in rows if not deleted}
        newest = max((r[6] for r in rows), default=0)
        if newest > seen:  # mirrored after the commit (a crash before: a stale copy is kept, none lost)
            cur.execute(
                f"INSERT INTO {SEEN}(brokerid, version) VALUES (%s, %s) "
                "ON CONFLICT (brokerid) DO UPDATE SET version = EXCLUDED.version",
                (self.brokerid, newest),
            )
        return live, stale, newest

    def _mirror(self, durables: dict[tuple[str, str], tuple[Any, ...]], stale: set[tuple[str, str]]) -> None:
        """Make our durable subscriptions the cluster's (under the lock): one made or
        changed on another instance is made here (our publishers' messages for it wait
        here until its subscriber's instance takes them); one removed there goes, and a
        ``stale`` one (changed or removed while we were down) goes with its messages,
        made anew if the cluster has it. One we changed since the read, or that has a
        subscriber or unacknowledged messages here, stays as it is."""
        broker = self.broker
        pending = broker.cluster_durables
        if pending is None:
            return
        mine = {(sub.client_id, sub.name) for _, sub in pending}
        broker.cluster_durables = None  # (what we do here is the cluster's already)
        try:
            for key in stale - mine:
                sub = broker.durable.get(key)
                if sub is not None and sub.active is None and not _owned(sub.queue, broker):
                    broker._drop_subscription(sub)
            for key, (topic, selector, no_local, owner) in durables.items():
                sub = broker.durable.get(key)
                if key in mine or (
                    sub is not None and (sub.topic.name, sub.selector, sub.no_local) == (topic, selector, no_local)
                ):
                    continue
                if sub is not None:
                    if sub.active is not None or _owned(sub.queue, broker):
                        continue
                    broker._drop_subscription(sub)
                try:
                    broker._make_subscription(
                        key[0], key[1], Topic(topic), selector, no_local, persist=True, owner=owner
                    )
                except JMSException as exc:
                    log.warning(
                        "HA cluster %s: durable subscription %r of client %r: %s",
                        self.settings.clusterid,
                        key[1],
                        key[0],
                        exc,
                    )
            for key, sub in list(broker.durable.items()):
                if key not in durables and key not in mine and sub.active is None and not _owned(sub.queue, broker):
                    broker._drop_subscription(sub)
        finally:
            broker.cluster_durables = pending

    def _reach(self, topics: dict[str, str | None]) -> None:
        """Route our publishers' messages to the peers' subscribers (under the lock): one
        proxy per peer and topic in the topic's subscriptions, r:BROKERID:VERSION:TOPIC,
        taking what any of them selects; one of an older version takes no more and goes
        once empty."""
        broker = self.broker
        for qkey, mq in list(broker.proxies.items()):
            if mq.deleted:  # (destroy dst of its topic: made again below while wanted)
                del broker.proxies[qkey]
                self._selected.pop(qkey, None)
                if mq.durable and broker.store is not None:
                    broker.store.op("purge", qkey, next(broker._seq))
        for qkey, selectors in topics.items():
            mq = broker._proxy_queue(qkey)
            if self._selected.get(qkey, "") != selectors:  # ("": no JSON text)
                mq.selector = _any_of(selectors)
                self._selected[qkey] = selectors
            subs = broker.topics.setdefault(qkey.split(":", 3)[3], [])
            if mq not in subs:
                subs.append(mq)
        for qkey, mq in list(broker.proxies.items()):
            if qkey.startswith("r:") and qkey not in topics:
                subs = broker.topics.get(mq.topic.name if mq.topic is not None else "", [])
                if mq in subs:
                    subs.remove(mq)
                if not mq.count:
                    del broker.proxies[qkey]
                    self._selected.pop(qkey, None)
                    mq.deleted = True
                    continue
            if self._nudge not in mq.waiters:
                mq.waiters.append(self._nudge)
            if len(mq):
                self._wake.set()

    def _park(self, peers: dict[str, list[Peer]]) -> None:
        """Park a waiter in each of our queues a peer has consumers on (under the lock)."""
        for qkey in [k for k in self._parkers if k not in peers]:
            self._unpark(qkey)
        for qkey, found in peers.items():
            mq = self.broker.queues.get(qkey[2:]) if qkey.startswith("q:") else self.broker._queue_for_key(qkey, False)
            parker = self._parkers.get(qkey)
            if parker is not None and parker.queue is not mq:
                self._unpark(qkey)
                parker = None
            if mq is None or mq.deleted or mq.limits.is_local_only:
                continue
            if parker is None:
                parker = self._parkers[qkey] = _Parker(mq, found, self._wake.set)
            parker.peers = found
            if parker not in mq.waiters:
                mq.waiters.append(parker)
            if len(mq):
                self._wake.set()

    def _unpark(self, qkey: str) -> None:
        parker = self._parkers.pop(qkey)
        parker.closed = True
        while parker in parker.queue.waiters:
            parker.queue.waiters.remove(parker)

    def _unpark_all(self) -> None:
        for qkey in list(self._parkers):
            self._unpark(qkey)

    # --- handing off ------------------------------------------------------------------------
    def hand_off(self) -> bool:
        """Hand one batch of waiting messages to peers with credit; True if some went."""
        broker = self.broker
        taken: list[tuple[Peer, Envelope]] = []
        with broker.lock:
            now = now_ms()
            for parker in list(self._parkers.values()):
                mq = parker.queue
                if mq.deleted or not len(mq) or mq.limits.is_local_only:
                    continue
                if mq.limits.local_delivery_preferred and _active(mq):
                    continue  # local consumers take them all
                credit = {id(p): p.credit if p.backlog else min(p.credit, FIRST) for p in parker.peers}
                left = sum(credit.values())  # (none: the window is not looked through)
                local = [w for w in mq.waiters if w is not parker and mq.is_active(w)]
                for env in _window(mq, 2 * min(left, BATCH)) if left else ():  # in memory, in delivery order
                    if len(taken) >= BATCH:
                        break
                    if env.expired(now) or env.owner is not None:
                        continue
                    if local and any(w.can_take(env.message) for w in local):
                        continue  # a local consumer waits for it: it goes there
                    peer = next((p for p in parker.peers if credit[id(p)] and p.takes(env.message)), None)
                    if peer is None:
                        continue
                    if mq.remove(env):
                        credit[id(peer)] -= 1
                        taken.append((peer, env))
                        left -= 1
                        if not left:
                            break
                if mq.paged and len(mq) == mq.paged and any(credit.values()):
                    mq.page_in()  # the window is empty: the next chunk, for the next batch
                    if len(mq) > mq.paged:
                        self._wake.set()
                if parker not in mq.waiters and not parker.closed:
                    mq.waiters.append(parker)
            lost = self._take_proxies(taken)
            if lost:
                broker._ack(lost)  # for subscribers that died with their instance
        if not taken:
            return False
        envs = [env for _, env in taken]
        try:
            if broker.store is not None:
                broker.store.flush()  # their rows are written: the move finds them
            self._transaction("work", lambda cur: self._move_out(cur, taken))
        except BaseException:
            with broker.lock:
                by_queue: dict[int, list[Envelope]] = {}
                for env in envs:
                    by_queue.setdefault(id(env.queue), []).append(env)
                for group in by_queue.values():
                    group[0].queue.push_back(group)
            raise
        with broker.lock:  # gone from here: the move deleted their rows (no delete for the store)
            for env in envs:
                env.queue.release(env)
        for peer, _ in taken:
            if peer.consumers:
                peer.backlog += 1
        self.handed_off += len(envs)
        return True

    def _take_proxies(self, taken: list[tuple[Peer, Envelope]]) -> list[Envelope]:
        """Take our proxies' waiting messages (r:, x:) for their instances into ``taken``
        (under the lock); those of an instance that is gone are returned, to drop."""
        lost: list[Envelope] = []
        for qkey, mq in list(self.broker.proxies.items()):
            if not len(mq):
                continue
            target = qkey.split(":", 2)[1]
            peer = Peer(target, 0, None, 0)  # (no consumers: no credit counted)
            for env in mq.browse():
                if len(taken) >= BATCH:
                    break
                if env.owner is None and mq.remove(env):
                    if target in self._dead:
                        lost.append(env)
                    else:
                        taken.append((peer, env))
            if mq.paged and len(mq) == mq.paged and len(taken) < BATCH:
                mq.page_in()
                self._wake.set()
            if self._nudge not in mq.waiters:
                mq.waiters.append(self._nudge)
        return lost

    def _move_out(self, cur: Any, taken: list[tuple[Peer, Envelope]]) -> None:
        """In our transaction: each message's row leaves our store for the inbox of its
        peer (a message not stored is encoded), and the peers are woken at commit. After
        the fence the statements go in one round trip (pipelined); the move's row count is
        checked after it (a failure rolls them all back)."""
        stored = [(p.brokerid, env.seq, env.dcount) for p, env in taken if env.stored]
        loose = [
            (p.brokerid, stored_key(env.queue.key), env.dcount, codec.encode(env.message))
            for p, env in taken
            if not env.stored
        ]
        counts: dict[tuple[str, str], int] = {}
        for peer, env in taken:
            key = (peer.brokerid, stored_key(env.queue.key) if peer.consumers else "")
            counts[key] = counts.get(key, 0) + 1
        self._fenced(cur)
        conn = cur.connection
        with conn.cursor() as move:
            with pipelined(conn):
                if stored:
                    targets, seqs, dcounts = zip(*stored, strict=True)
                    move.execute(
                        "WITH h AS (SELECT * FROM unnest(%s::text[], %s::bigint[], %s::integer[]) "
                        f'AS h(target, seq, dcount)), moved AS (DELETE FROM "{self._schema}".msgs m USING h '
                        "WHERE m.seq = h.seq RETURNING h.target, m.seq, m.qkey, h.dcount, m.blob) "
                        f"INSERT INTO {INBOX}(target, qkey, dcount, blob) "
                        "SELECT target, qkey, dcount, blob FROM moved ORDER BY seq",
                        (_texts(targets), _ints(seqs), _ints(dcounts)),
                    )
                if loose:
                    cur.executemany(f"INSERT INTO {INBOX}(target, qkey, dcount, blob) VALUES (%s, %s, %s, %s)", loose)
                raised = [(n, b, q) for (b, q), n in counts.items() if q]
                if raised:
                    cur.executemany(
                        f"UPDATE {DEMAND} SET backlog = backlog + %s WHERE brokerid = %s AND qkey = %s", raised
                    )
                for target in sorted({b for b, _ in counts}):
                    cur.execute(f'NOTIFY "{channel(self.settings.clusterid, target)}"')
            if stored and move.rowcount != len(stored):
                raise StoreError(f"handoff: {len(stored) - move.rowcount} of {len(stored)} rows were not in the store")

    # --- taking in --------------------------------------------------------------------------
    def take_in(self) -> bool:
        """Move one batch of the inbox's rows for us (or for instances we took over) into
        our store and serve them; True if there were some. The rows are read and decoded
        without the broker's lock (our consumers go on meanwhile); it is held from the
        seqs to the pushes, so a purge's bound (the next seq) covers them only if it saw
        them in the queue, and no page-in or browser reads a row before it is pushed."""
        broker, me = self.broker, self.brokerid
        rejected: list[tuple[int, str, str]] = []  # inbox rows that are not messages: id, qkey, why
        with ExitStack() as held:

            def take(cur: Any) -> list[tuple[int, str, int, bytes, Message]]:
                cur.execute(
                    # each target's rows through the index in id order (its killed entries
                    # skipped): an OR of the targets scanned the whole table, dead rows too
                    f"SELECT i.id, i.qkey, i.dcount, i.blob FROM unnest(%s::text || ARRAY(SELECT brokerid "
                    f"FROM {BROKERS} WHERE state = 'taken' AND taken_by = %s)) AS t(target), LATERAL "
                    f"(SELECT id, qkey, dcount, blob FROM {INBOX} WHERE {INBOX}.target = t.target ORDER BY id "
                    "LIMIT %s FOR UPDATE SKIP LOCKED) i ORDER BY i.id LIMIT %s",
                    (me, me, BATCH, BATCH),
                    binary=True,  # (bytea as text is hex: twice the bytes, 2.8 ms to read 500 rows, not 1.1)
                )
                rows, messages = [], []
                for row in cur.fetchall():
                    try:
                        messages.append(codec.decode(row[3]))
                    except MessageCodecError as exc:  # (kept aside: the rows after it come in)
                        rejected.append((row[0], row[1], str(exc)))
                        continue
                    rows.append(row)
                if not (rows or rejected):
                    return []
                queued = [r[0] for r in rows if not r[1].startswith(_PROXIED)]  # (the rest: in memory)
                held.enter_context(broker.lock)  # until the pushes (released if this fails)
                base = broker.reserve_seqs(len(queued))  # (unused if this fails: never reused)
                self._fenced(cur)
                if rejected:
                    cur.execute(
                        f"WITH bad AS (SELECT * FROM unnest(%s::bigint[], %s::text[]) AS bad(id, reason)), "
                        f"moved AS (DELETE FROM {INBOX} i USING bad WHERE i.id = bad.id "
                        "RETURNING i.id, i.target, i.qkey, i.dcount, i.blob, bad.reason) "
                        f"INSERT INTO {REJECTED}(id, target, qkey, dcount, blob, reason) SELECT * FROM moved",
                        ([r[0] for r in rejected], [r[2] for r in rejected]),
                    )
                ids = [r[0] for r in rows]
                if ids:
                    cur.execute(
                        f"WITH moved AS (DELETE FROM {INBOX} WHERE id = ANY(%s::bigint[]) "
                        "RETURNING id, qkey, dcount, blob) "
                        f'INSERT INTO "{self._schema}".msgs(seq, qkey, dcount, blob) '
                        "SELECT %s + ROW_NUMBER() OVER (ORDER BY id), qkey, dcount, blob FROM moved"
                        # (a filter of 500 ids on 500 rows took 1.9 of the statement's 5 ms)
                        + (" WHERE id = ANY(%s::bigint[])" if len(queued) < len(ids) else ""),
                        (_ints(ids), base, _ints(queued)) if len(queued) < len(ids) else (_ints(ids), base),
                    )
                seqs = iter(range(base + 1, base + len(queued) + 1))
                return [
                    (0 if qkey.startswith(_PROXIED) else next(seqs), loaded_key(qkey), dcount, bytes(blob), message)
                    for (_, qkey, dcount, blob), message in zip(rows, messages, strict=True)
                ]

            moved = self._transaction("intake", take)
            for seq, qkey, dcount, blob, message in moved:
                if not seq:
                    self._fan_out(qkey, message)
                    continue
                mq = broker._queue_for_key(qkey)
                self._raised[qkey] = self._raised.get(qkey, 0) + 1
                if mq is not None:  # (a queue: made when missing)
                    wire = blob if mq.count < WIRE_KEEP else None  # (sent to remote consumers as it is)
                    env = Envelope(seq, mq, message, True, len(blob), dcount, None, wire)
                    mq.admit(env)
                    mq.push(env)  # as a send's: in the window, or paged out (its row is there)
        for row_id, qkey, why in rejected:
            log.error(
                "HA cluster %s: inbox row %d for %s is not a message (%s); it is kept in %s, the "
                "rows after it are taken in",
                self.settings.clusterid,
                row_id,
                loaded_key(qkey),
                why,
                REJECTED,
            )
        self.taken_in += len(moved)
        self.inbox_rejected += len(rejected)
        return bool(moved or rejected)

    def _fan_out(self, qkey: str, message: Message) -> None:
        """A peer's copy for our subscribers (r:ME:VERSION:TOPIC) or for a temporary
        destination of ours (x:ME:NAME) to them, as a publish here would (under the lock;
        not stored, as ours are not)."""
        broker = self.broker
        kind, target, rest = qkey.split(":", 2)
        if target != self.brokerid:
            return  # (for subscribers or a temporary destination of an instance that is gone)
        if kind == "r":
            version, _, topic = rest.partition(":")
            targets = [
                mq
                for mq in _subscribers(broker, topic)
                if self._versions.get(mq, int(version) + 1) <= int(version)
                and (mq.selector is None or mq.selector.matches(message))
            ]
        else:
            tmq = broker.temporary.get(rest)
            if tmq is None:
                log.info(
                    "HA cluster %s: message %s for %s dropped: its connection ended",
                    self.settings.clusterid,
                    message.message_id,
                    rest,
                    extra=COUNTED,  # a flood of them: counted lines in the service log
                )
                return
            targets = broker._targets(tmq.destination, None, message) if tmq.destination.is_topic else [tmq]
        for i, mq in enumerate(targets):
            try:
                broker._commit_envelopes(broker._route(message if i == 0 else message.copy(), [mq], hold=False))
            except JMSException as exc:
                log.warning(
                    "HA cluster %s: %s: message %s dropped: %s",
                    self.settings.clusterid,
                    mq.destination,
                    message.message_id,
                    exc,
                    extra=COUNTED,
                )


def open_cluster_queues(cluster: HACluster, host: EmbeddedHostBroker) -> ClusterQueues:
    """Start serving the cluster's queues with ``host``'s broker (an HA instance's)."""
    queues = ClusterQueues(cluster, host.broker)
    queues.start()
    return queues
