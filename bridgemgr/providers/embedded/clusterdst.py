"""Cluster-wide queues of an HA cluster: a message reaches a consumer on another instance.

Each instance advertises in the cluster's table imq_ha_demand the queues it has active
consumers on (their selectors, its backlog). A queue's waiting message that no local
consumer is waiting for is handed off to an instance that advertises a consumer whose
selector takes it: in ONE PostgreSQL transaction its row leaves our store's schema for the
cluster's inbox (imq_ha_inbox), then NOTIFY wakes the peer, which moves it into its own
store (new seqs, its delivery count kept) and serves it. A row is in one place at a time,
so each message is delivered once; a delivered, unacknowledged message stays where it was
delivered.

Rules: the broker's lock is taken before our connections' (never the other way); the
handoff and the intake each fence on the instance's lease.

Design notes: docs/ha.md#internals-providersembeddedclusterdstpy.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...jms import codec
from ...jms.errors import StoreError
from ...jms.message import Message
from ...jms.selector import Selector, compile_selector
from .cluster import BROKERS, LIVE, instance_schema
from .pgstore import close_quietly
from .queues import Envelope, MessageQueue
from .state import log, now_ms

if TYPE_CHECKING:
    from .broker import Broker
    from .cluster import HACluster
    from .host import EmbeddedHostBroker

DEMAND, INBOX = "imq_ha_demand", "imq_ha_inbox"
CREDIT = 1000  # messages a peer may hold waiting per active consumer before we stop handing off
BATCH = 500  # rows per handoff or intake transaction
REFRESH = 0.2  # seconds between advertisements of our demand (and looks at the inbox)
_TABLES = (
    f"CREATE TABLE IF NOT EXISTS {DEMAND}(brokerid TEXT NOT NULL, qkey TEXT NOT NULL, "
    "consumers INTEGER NOT NULL, selectors TEXT, backlog BIGINT NOT NULL, "
    "PRIMARY KEY (brokerid, qkey))",
    f"CREATE TABLE IF NOT EXISTS {INBOX}(id BIGSERIAL PRIMARY KEY, target TEXT NOT NULL, "
    "qkey TEXT NOT NULL, dcount INTEGER NOT NULL, blob BYTEA NOT NULL)",
    f"CREATE INDEX IF NOT EXISTS {INBOX}_target ON {INBOX}(target, id)",
)
_DDL_LOCK = 0x494D5144  # advisory lock: one instance creates these tables at a time


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
            if any(w is not self and w.can_take(message) for w in self.queue.waiters):
                return False
        return True

    def notify(self) -> None:
        self.wake()


def _active(mq: MessageQueue) -> list[Any]:
    """The consumers of ``mq`` that take messages now (under the broker's lock)."""
    return [c for c in mq.consumers if not c.closed and getattr(c.connection, "started", False)]


def _shape(demand: dict[str, tuple[int, str | None, int]]) -> dict[str, tuple[int, str | None, int]]:
    """What of our demand is worth telling the peers at once: consumers, selectors, and
    the backlog in steps of a quarter of a consumer's credit."""
    return {k: (n, sel, backlog // (CREDIT // 4)) for k, (n, sel, backlog) in demand.items()}


def _local_demand(broker: Broker) -> dict[str, tuple[int, str | None, int]]:
    """qkey -> (active consumers, their selectors as JSON (None: one takes any), backlog)
    of our queues (not temporary ones) with active consumers (under the broker's lock)."""
    out: dict[str, tuple[int, str | None, int]] = {}
    for mq in broker.queues.values():
        if mq.deleted or mq.topic is not None or mq.limits.is_local_only:
            continue
        active = _active(mq)
        if not active:
            continue
        texts = [getattr(c.selector, "text", None) if c.selector is not None else None for c in active]
        selectors = None if any(t is None for t in texts) else json.dumps(sorted(set(texts)))
        out[mq.key] = (len(active), selectors, len(mq))
    return out


class ClusterQueues:
    """This instance's part in the cluster-wide queues: advertising, handing off, taking in."""

    def __init__(self, cluster: HACluster, broker: Broker) -> None:
        self.cluster, self.broker = cluster, broker
        self.settings, self.brokerid = cluster.settings, cluster.brokerid
        # as the store's fence: the lease is our generation's, live (FOR SHARE: a takeover
        # of us waits for our move, or our move finds it and fails)
        self._fence = f"SELECT 1 FROM {BROKERS} WHERE brokerid = %s AND generation = %s AND state = '{LIVE}' FOR SHARE"
        self._schema = instance_schema(self.settings.clusterid, self.brokerid)  # our store's
        self._halt = threading.Event()
        self._wake = threading.Event()
        self._reread = False  # a peer's demand changed: advertise (and read theirs) now
        self._demand_channel = f"{self.settings.jdbc.schema}_demand"
        self._threads: list[threading.Thread] = []
        self._parkers: dict[str, _Parker] = {}
        self._conns: dict[str, Any] = {}
        self.handed_off = 0  # messages handed to other instances (tests, logs)
        self.taken_in = 0  # messages other instances handed to us

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

    def _transaction(self, role: str, work: Callable[[Any], Any]) -> Any:
        import psycopg

        conn = self._conn(role)
        try:
            with conn.cursor() as cur:
                result = work(cur)
            conn.commit()
            return result
        except psycopg.Error as exc:
            close_quietly(self._conns.pop(role, None))
            raise StoreError(f"{self.settings.jdbc.where}: cluster-wide queues: {exc}") from exc
        except BaseException:
            if not conn.closed:
                conn.rollback()
            raise

    def _fenced(self, cur: Any) -> None:
        cur.execute(self._fence, (self.brokerid, self.cluster.generation))
        if cur.fetchone() is None:
            raise StoreError(f"fenced: broker {self.brokerid} generation {self.cluster.generation} was replaced")

    def create_tables(self) -> None:
        def create(cur: Any) -> None:
            cur.execute("SELECT to_regclass(%s), to_regclass(%s)", (DEMAND, f"{INBOX}_target"))
            if None not in cur.fetchone():
                return  # (CREATE INDEX IF NOT EXISTS would lock the inbox: peers' moves wait)
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK,))
            for statement in _TABLES:
                cur.execute(statement)

        self._transaction("work", create)

    # --- the threads ------------------------------------------------------------------------
    def start(self) -> None:
        self.create_tables()
        self._transaction(
            "work", lambda cur: cur.execute(f"DELETE FROM {DEMAND} WHERE brokerid = %s", (self.brokerid,))
        )
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
        try:
            self._transaction(
                "work", lambda cur: cur.execute(f"DELETE FROM {DEMAND} WHERE brokerid = %s", (self.brokerid,))
            )
        except StoreError as exc:
            log.warning("HA cluster %s: %s", self.settings.clusterid, exc)
        for conn in self._conns.values():
            close_quietly(conn)
        self._conns.clear()

    def _run_handoff(self) -> None:
        advertised, shape = 0.0, None
        while not self._halt.is_set():
            self._wake.wait(REFRESH / 4)
            self._wake.clear()
            if self._halt.is_set():
                return
            try:
                with self.broker.lock:
                    demand = _local_demand(self.broker)
                now, changed = time.monotonic(), _shape(demand) != shape
                if changed or self._reread or now - advertised >= REFRESH:
                    self._reread = False
                    self.advertise(demand, changed)
                    advertised, shape = now, _shape(demand)
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
                    if note.channel == self._demand_channel:  # a peer's demand changed: look now
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
    def advertise(self, demand: dict[str, tuple[int, str | None, int]], changed: bool) -> None:
        """Write our queues' ``demand`` (rows that differ: a peer's handoff raises our
        backlog there; ``changed``: NOTIFY the peers), and read the peers' into parkers."""
        me = self.brokerid

        def write(cur: Any) -> list[tuple[str, str, int, str | None, int]]:
            cur.execute(f"DELETE FROM {DEMAND} WHERE brokerid = %s AND NOT qkey = ANY(%s)", (me, list(demand)))
            if demand:
                cur.executemany(
                    f"INSERT INTO {DEMAND} AS d(brokerid, qkey, consumers, selectors, backlog) "
                    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (brokerid, qkey) DO UPDATE SET "
                    "consumers = EXCLUDED.consumers, selectors = EXCLUDED.selectors, backlog = EXCLUDED.backlog "
                    "WHERE (d.consumers, d.selectors, d.backlog) IS DISTINCT FROM "
                    "(EXCLUDED.consumers, EXCLUDED.selectors, EXCLUDED.backlog)",
                    [(me, k, *v) for k, v in demand.items()],
                )
            if changed:
                cur.execute(f'NOTIFY "{self._demand_channel}"')
            cur.execute(
                f"SELECT d.brokerid, d.qkey, d.consumers, d.selectors, d.backlog FROM {DEMAND} d "
                f"JOIN {BROKERS} b ON b.brokerid = d.brokerid AND b.state = 'live' "
                "AND b.lease_expires > now() WHERE d.brokerid <> %s ORDER BY d.brokerid",
                (me,),
            )
            return list(cur.fetchall())

        rows = self._transaction("work", write)
        peers: dict[str, list[Peer]] = {}
        for brokerid, qkey, consumers, selectors, backlog in rows:
            compiled = None if selectors is None else [compile_selector(t) for t in json.loads(selectors)]
            peers.setdefault(qkey, []).append(Peer(brokerid, consumers, compiled, backlog))  # type: ignore[arg-type]
        with self.broker.lock:
            self._park(peers)

    def _park(self, peers: dict[str, list[Peer]]) -> None:
        """Park a waiter in each of our queues a peer has consumers on (under the lock)."""
        for qkey in [k for k in self._parkers if k not in peers]:
            self._unpark(qkey)
        for qkey, found in peers.items():
            mq = self.broker.queues.get(qkey[2:]) if qkey.startswith("q:") else None
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
                credit = {id(p): p.credit for p in parker.peers}
                local = [w for w in mq.waiters if w is not parker]
                for env in mq.browse():  # in memory, in delivery order
                    if len(taken) >= BATCH:
                        break
                    if env.expired(now) or env.owner is not None:
                        continue
                    if any(w.can_take(env.message) for w in local):
                        continue  # a local consumer waits for it: it goes there
                    peer = next((p for p in parker.peers if credit[id(p)] and p.takes(env.message)), None)
                    if peer is None:
                        continue
                    if mq.remove(env):
                        credit[id(peer)] -= 1
                        taken.append((peer, env))
                if mq.paged and len(mq) == mq.paged and any(credit.values()):
                    mq.page_in()  # the window is empty: the next chunk, for the next batch
                    if len(mq) > mq.paged:
                        self._wake.set()
                if parker not in mq.waiters and not parker.closed:
                    mq.waiters.append(parker)
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
        broker.acknowledge(envs)  # gone from here (the store's delete finds no row)
        for peer, _ in taken:
            peer.backlog += 1
        self.handed_off += len(envs)
        return True

    def _move_out(self, cur: Any, taken: list[tuple[Peer, Envelope]]) -> None:
        """In our transaction: each message's row leaves our store for the inbox of its
        peer (a message not stored is encoded), and the peers are woken at commit."""
        self._fenced(cur)
        stored = [(p.brokerid, env.seq, env.dcount) for p, env in taken if env.stored]
        if stored:
            targets, seqs, dcounts = (list(column) for column in zip(*stored, strict=True))
            cur.execute(
                "WITH h AS (SELECT * FROM unnest(%s::text[], %s::bigint[], %s::integer[]) AS h(target, seq, dcount)), "
                f'moved AS (DELETE FROM "{self._schema}".msgs m USING h WHERE m.seq = h.seq '
                "RETURNING h.target, m.seq, m.qkey, h.dcount, m.blob) "
                f"INSERT INTO {INBOX}(target, qkey, dcount, blob) "
                "SELECT target, qkey, dcount, blob FROM moved ORDER BY seq",
                (targets, seqs, dcounts),
            )
            if cur.rowcount != len(stored):
                raise StoreError(f"handoff: {len(stored) - cur.rowcount} of {len(stored)} rows were not in the store")
        loose = [
            (p.brokerid, env.queue.key, env.dcount, codec.encode(env.message)) for p, env in taken if not env.stored
        ]
        if loose:
            cur.executemany(f"INSERT INTO {INBOX}(target, qkey, dcount, blob) VALUES (%s, %s, %s, %s)", loose)
        counts: dict[tuple[str, str], int] = {}
        for peer, env in taken:
            key = (peer.brokerid, env.queue.key)
            counts[key] = counts.get(key, 0) + 1
        cur.executemany(
            f"UPDATE {DEMAND} SET backlog = backlog + %s WHERE brokerid = %s AND qkey = %s",
            [(n, b, q) for (b, q), n in counts.items()],
        )
        for target in sorted({b for b, _ in counts}):
            cur.execute(f'NOTIFY "{channel(self.settings.clusterid, target)}"')

    # --- taking in --------------------------------------------------------------------------
    def take_in(self) -> bool:
        """Move one batch of the inbox's rows for us (or for instances we took over) into
        our store and serve them; True if there were some."""
        broker, me = self.broker, self.brokerid

        def take(cur: Any) -> list[tuple[int, str, int, bytes]]:
            cur.execute(
                f"SELECT id, qkey, dcount, blob FROM {INBOX} WHERE target = %s OR target IN (SELECT brokerid "
                f"FROM {BROKERS} WHERE state = 'taken' AND taken_by = %s) ORDER BY id LIMIT %s "
                "FOR UPDATE SKIP LOCKED",
                (me, me, BATCH),
            )
            rows = cur.fetchall()
            if not rows:
                return []
            self._fenced(cur)
            ids = [r[0] for r in rows]
            base = broker.reserve_seqs(len(ids))
            cur.execute(
                f'INSERT INTO "{self._schema}".msgs(seq, qkey, dcount, blob) '
                f"SELECT %s + ROW_NUMBER() OVER (ORDER BY id), qkey, dcount, blob FROM {INBOX} WHERE id = ANY(%s)",
                (base, ids),
            )
            cur.execute(f"DELETE FROM {INBOX} WHERE id = ANY(%s)", (ids,))
            return [(base + i, qkey, dcount, bytes(blob)) for i, (_, qkey, dcount, blob) in enumerate(rows, 1)]

        with broker.lock:  # nothing enters our queues between the seqs and the pushes
            moved = self._transaction("intake", take)
            for seq, qkey, dcount, blob in moved:
                mq = broker._queue_for_key(qkey)
                if mq is not None:  # (a queue: made when missing)
                    env = Envelope(seq, mq, codec.decode(blob), True, len(blob), dcount)
                    mq.admit(env)
                    mq.push(env)  # as a send's: in the window, or paged out (its row is there)
        self.taken_in += len(moved)
        return bool(moved)


def open_cluster_queues(cluster: HACluster, host: EmbeddedHostBroker) -> ClusterQueues:
    """Start serving the cluster's queues with ``host``'s broker (an HA instance's)."""
    queues = ClusterQueues(cluster, host.broker)
    queues.start()
    return queues
