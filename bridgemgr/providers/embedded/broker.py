"""The embedded host broker: destinations, routing, acknowledgement, transactions.

How it works: one lock guards all broker state. Producers route a snapshot of each
message into the :class:`MessageQueue` s it belongs to (a queue, or every matching
subscription of a topic) as :class:`Envelope` s; consumers take envelopes out under
the same lock (a STOMP subscriber a batch per hold: receive_many) and either
acknowledge them at once (AUTO/DUPS_OK) or hold them in their
session's :class:`Work` until acknowledge, commit, rollback or close. Persistent
messages on durable queues get a row in the :class:`Store`; a transaction's sends and
acks go to the store in one batch, so they land together or not at all. A run of a
front end's sends (``send_many``: a STOMP read's SENDs) is routed under one taking of the
lock, each send as alone, and its rows recorded in one store call.

XA branches are :class:`Work` with an Xid and a state (ACTIVE, IDLE, PREPARED,
ROLLBACK_ONLY; ``_XA_ALLOWED`` says which call is legal in which state). A prepared
branch is written to the store and survives a crash: at open it comes back with its
sends held back and the messages it consumed locked until ``commit`` or ``rollback``.

Memory: a destination or subscription keeps a window of its waiting messages in memory
(``memory_window``, imq.destination.memory.window); persistent messages beyond it stay
only in the store, non-persistent ones go to the swap file (swap.py), and both are paged
back in seq order (queues.py, "Paging"). Opening the store reads per-destination counts,
not messages. Each queue counts the bytes of its messages (encoded size; estimated for one
not encoded: held in memory only, or a lazy row, see ``_route``) for its limits and
/metrics, an int add per put and take; those recovered at open only where a byte limit
is set (their sizes are a table scan). An HA takeover (cluster.py) moves a dead
instance's rows into this store with seqs above ours and ``adopt`` takes them in the
same way, under the lock.

Poison messages: a destination's ``backout_threshold`` counts a message's deliveries that
were not acknowledged (``dcount``, kept in the store; where a threshold is set the store
writes it as the message is delivered). A message that reaches it, as it comes back
(rollback, recover, close) or is taken again after a restart, moves to ``backout_queue``,
else goes by ``backout_disposition`` (the DMQ or discarded). Connection consumers
(spi.ConnectionConsumer) have a consumer in each server session they load;
``group_queue`` gives a topic's group one shared subscription. A consumer with ``retain``
off (message retention off) that finds nothing to take sweeps the messages no active
consumer of its queue selects out by the same disposition.

Physical names: queues ``q:NAME``; durable subscriptions ``d:CLIENTID\\0NAME``;
non-durable subscribers and temporary destinations are never stored (beyond their window they
wait in the swap file, which a restart empties). The broker's
own dead message queue is the queue ``mq.sys.dmq``.

Three lines of protection guard memory. A destination's limits (maxNumMsgs,
maxTotalMsgBytes, maxBytesPerMsg) apply its limitBehavior when full: REJECT_NEWEST
refuses the send, REMOVE_OLDEST and REMOVE_LOW_PRIORITY drop a waiting message (to the
DMQ when useDMQ), FLOW_CONTROL raises ProducerFlowControl: nothing is sent, and the
producer waits for room (``on_room``) and tries again; in-process producers block (until
their session closes or its ``cancel`` event is set: SendCancelled), the
STOMP and jms services stop reading that connection and answer later. A transacted send
waits the same way when it is sent (``check_room``); at commit FLOW_CONTROL lets the
transaction's messages in even past the limit (waiting there could wait on the
transaction's own unacknowledged messages). The system-wide limits
(imq.system.max_count, max_size) refuse messages held in memory only (not in the store)
beyond them, and imq.message.max_size refuses bigger bodies. The memory states
(memory.py) hold producers that have sent their batch.

Pacing (RabbitMQ's credit flow, for the front ends' producers: ``send(pace=True)``, the
HostBroker's sends to queues): while more than PACE_HIGH messages wait in a queue whose
consumers are taking (one without a selector took a message, or waited for one, within
PACE_STALL seconds; a selector's consumer may never take the backlog), a send raises
ProducerFlowControl and its producer waits until a take leaves PACE_LOW, the consumers
go or stall (a timer checks), or the queue is purged or goes away. So a queue whose
consumers keep up holds a short backlog, and a persistent message is mostly consumed
before its store batch is cut (it never touches the disk). A queue without consumers, or
whose consumers stopped, pages as before; so do topics' subscriptions (a slow
subscriber does not hold the publishers of the others).
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from enum import Enum
from functools import partial
from pathlib import Path
from typing import Any, Literal, overload

from ...jms import codec, xa
from ...jms.destination import Destination, Queue, TemporaryQueue, TemporaryTopic, Topic, check_name
from ...jms.errors import (
    IllegalStateException,
    InvalidClientIDException,
    InvalidDestinationException,
    JMSException,
    JMSSecurityException,
    ProducerFlowControl,
    ResourceAllocationException,
    StoreFull,
    StoreUnavailable,
    TransactionRolledBackException,
    XAException,
)
from ...jms.message import BytesMessage, DeliveryMode, Message, TextMessage
from ...jms.selector import MAX_SIZE as SELECTOR_MAX_SIZE
from ...jms.selector import Selector, check_size, compile_selector
from ...jms.xa import Xid
from ...logfiles import COUNTED
from .memory import MemoryConfig, MemoryMonitor
from .owners import DurableOwners, owner_name
from .queues import (
    PACE_HIGH,
    PACE_LOW,
    PACE_STALL,
    UNLIMITED,
    WINDOW,
    DestinationLimits,
    Envelope,
    LimitBehavior,
    MessageQueue,
    SystemUsage,
)
from .reserve import Reservations
from .store import Database, Recovered, Row, Store
from .swap import Swap

PERSISTENT = int(DeliveryMode.PERSISTENT)

log = logging.getLogger(__name__)

DMQ_NAME = "mq.sys.dmq"
_DMQ_KEY = f"q:{DMQ_NAME}"
WIRE_KEEP = 1024   # a queue this long or longer keeps no remote sender's blob (re-encoded at delivery)
_LAZY_KINDS = (TextMessage, BytesMessage)  # encoded for the store only when still pending (_route)
Authenticator = Callable[[str | None, str | None], bool]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Sent:
    """A send's store ticket and the envelopes it routed: what Broker.wait_all withdraws
    when the store cannot write that batch."""

    __slots__ = ("envs", "ticket")

    def __init__(self, ticket: int, envs: list[Envelope]) -> None:
        self.ticket = ticket
        self.envs = envs


class WorkState(str, Enum):
    LOCAL = "LOCAL"                  # a local transaction or a CLIENT_ACKNOWLEDGE session
    ACTIVE = "ACTIVE"                # XA: associated with a session (start)
    IDLE = "IDLE"                    # XA: ended, may be prepared or committed
    ROLLBACK_ONLY = "ROLLBACK_ONLY"  # XA: ended with TMFAIL
    PREPARED = "PREPARED"            # XA: prepared, durable, in doubt until commit/rollback
    DONE = "DONE"


# Which XA call is legal in which branch state (anything else: XAER_PROTO).
_XA_ALLOWED: dict[str, frozenset[WorkState]] = {
    "join": frozenset({WorkState.ACTIVE, WorkState.IDLE}),
    "end": frozenset({WorkState.ACTIVE}),
    "prepare": frozenset({WorkState.IDLE, WorkState.ROLLBACK_ONLY}),
    "commit_one_phase": frozenset({WorkState.IDLE, WorkState.ROLLBACK_ONLY}),
    "commit_two_phase": frozenset({WorkState.PREPARED}),
    "rollback": frozenset({WorkState.IDLE, WorkState.ROLLBACK_ONLY, WorkState.PREPARED}),
}


class Work:
    """Messages a session consumed and sent but has not completed (tx or XA branch)."""

    __slots__ = ("acks", "connection", "prepared_sends", "sends", "sessions", "state", "xid")

    def __init__(self, xid: Xid | None = None, state: WorkState = WorkState.LOCAL,
                 connection: Any = None) -> None:
        self.xid = xid
        self.connection = connection   # XA: the connection that started the branch
        self.state = state
        # (snapshot, dest, connection, the blob a remote client sent or None)
        self.sends: list[tuple[Message, Destination, Any, bytes | None]] = []
        self.acks: list[Envelope] = []
        self.prepared_sends: list[Envelope] = []                   # routed at prepare
        self.sessions: set[Any] = set()

    @property
    def empty(self) -> bool:
        return not (self.sends or self.acks or self.prepared_sends)


@dataclass
class Subscription:
    client_id: str
    name: str
    topic: Topic
    selector: str | None
    no_local: bool
    queue: MessageQueue
    active: Any = None  # the consumer, while one is open
    owner: str | None = None  # the user who made it ("": no user; None: unknown, owners.py)


class Broker:
    """An in-process JMS broker; thread-safe; persistent when given a directory."""

    provider_name = "imqbridge embedded broker"

    def __init__(self, data_dir: str | Path | None = None, *, sync: bool = False,
                 instance_name: str = "imqbroker", limits: DestinationLimits = UNLIMITED,
                 autocreate_queue: bool = True, autocreate_topic: bool = True,
                 authenticator: Authenticator | None = None,
                 database: Database | None = None, system: SystemUsage | None = None,
                 max_message_size: int = -1, max_selector_size: int = SELECTOR_MAX_SIZE,
                 memory: MemoryConfig | None = None,
                 memory_window: int = WINDOW, swap_dir: str | Path | None = None) -> None:
        """``database``: where the store lives instead of SQLite under ``data_dir``
        (pgstore.PostgresDatabase for imq.persist.store=jdbc); ``system``: the
        imq.system.max_count/max_size limits (default none); ``max_message_size``: the
        largest body accepted (-1: any); ``max_selector_size``: the longest selector a
        new consumer or browser may give, in bytes (-1: any); ``memory``: the memory states (default: none
        watched). ``memory_window``: waiting messages a destination keeps in memory;
        persistent ones beyond wait in the store, non-persistent ones in swap.db under
        ``swap_dir`` (default ``data_dir``; with neither, they stay in memory)."""
        if memory_window < 1:
            raise ValueError(f"memory window {memory_window}: must be at least 1")
        self.memory_window = memory_window
        self.instance_name = instance_name
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.default_limits = limits
        self.autocreate_queue = autocreate_queue
        self.autocreate_topic = autocreate_topic
        self.authenticator = authenticator
        self.lock = threading.Lock()
        self.closed = False
        self.rm_id = uuid.uuid4().hex        # is_same_rm: same broker, same store
        self._id_prefix = f"ID:{uuid.uuid4().hex[:12]}-"
        self._ids = itertools.count(1)
        self.queues: dict[str, MessageQueue] = {}
        self.topics: dict[str, list[MessageQueue]] = {}       # topic name -> subscription queues
        self.known_topics: set[str] = set()
        self.durable: dict[tuple[str, str], Subscription] = {}
        self.temporary: dict[str, MessageQueue] = {}
        self.connections: set[Any] = set()
        self.producers: collections.Counter[Destination] = collections.Counter()  # (metrics)
        self.client_ids: dict[str, Any] = {}
        self.reservations = Reservations()  # the bridge service's client ids and durables
        self.owners = DurableOwners()  # who may attach to or remove a durable subscription
        self.branches: dict[Xid, Work] = {}
        # Two-phase commits made in memory that the store has not written yet (xid -> the
        # store ticket that writes it): still in doubt for xa_recover(), so a coordinator
        # keeps its decision until they are written (a crash before would bring the branch
        # back prepared, and with no decision left, rolled back).
        self.committing: dict[Xid, int] = {}
        self.configured: dict[str, DestinationLimits] = {}
        self.usage = system if system is not None else SystemUsage()
        self.max_message_size = max_message_size
        self.max_selector_size = max_selector_size
        self.memory = MemoryMonitor(memory) if memory is not None else None
        self.store = (Store(self.data_dir, sync=sync, database=database)
                      if self.data_dir is not None or database is not None else None)
        swap_dir = swap_dir if swap_dir is not None else self.data_dir
        self.swap = Swap(swap_dir) if swap_dir is not None else None
        self._seq = itertools.count(1)
        if self.store is not None:
            self._recover()
        self.dmq = self._queue(DMQ_NAME, create=True)

    # --- opening: rebuild state from the store -------------------------------------
    def _recover(self) -> None:
        """Rebuild from the store: every stored message starts paged out (counted, not
        read); the first consumer of a destination pages in its first window."""
        assert self.store is not None
        rec = self.store.load()
        self._seq = itertools.count(rec.max_seq + 1)
        self._rebuild(rec, self.store.queue_bytes)

    def reserve_seqs(self, count: int) -> int:
        """Skip ``count`` seqs (call with the lock held): rows an HA takeover moves into this
        broker's store take base + 1 .. base + count; returns base. A seq is never reused."""
        base = next(self._seq) - 1
        self._seq = itertools.count(base + count + 1)
        return base

    def adopt(self, rec: Recovered, queue_bytes: dict[str, int]) -> None:
        """Take in what an HA takeover moved into our store from a dead instance's (call
        with the lock held, its seqs reserved with reserve_seqs and higher than any here):
        its waiting messages start paged out, its durable subscriptions and prepared XA
        branches join ours, and consumers waiting on those destinations look again."""
        self._rebuild(rec, queue_bytes.__getitem__)
        for qkey in rec.backlogs:
            mq = self._queue_for_key(qkey, create=False)
            if mq is not None:
                mq.wake_all()

    def _rebuild(self, rec: Recovered, queue_bytes: Callable[[str], int]) -> None:
        """Destinations, subscriptions, paged-out messages and prepared branches of ``rec``."""
        assert self.store is not None
        for qkey, cfg in rec.destinations.items():
            self.configured[qkey] = _limits_from_json(cfg)
        for client_id, name, topic, selector, no_local, owner in rec.subscriptions:
            self._make_subscription(client_id, name, Topic(topic), selector, no_local, persist=False,
                                    owner=owner)
        locked = {seq: xid for xid, br in rec.prepared.items() for seq in br.acks}
        xids = {xid: Xid.parse(xid) for xid in rec.prepared}
        branches = {xid: Work(xids[xid], WorkState.PREPARED) for xid in rec.prepared}
        for qkey, count in rec.backlogs.items():
            mq = self._queue_for_key(qkey)
            if mq is None:
                log.warning("store: dropping %d messages of unknown destination %r", count, qkey)
                self.store.op("purge", qkey, rec.max_seq + 1)
                continue
            mq.count += count
            mq.paged += count
            if mq.limits.counts_bytes:
                mq.bytes += queue_bytes(qkey)
            else:  # not read at open (a table scan): these messages are not in mq.bytes
                mq.counted_from = rec.max_seq + 1
        for seq, qkey, dcount, blob in rec.locked:  # held by a prepared branch: in memory
            mq = self._queue_for_key(qkey)
            if mq is None:
                continue
            env = Envelope(seq, mq, codec.decode(blob), True,
                           len(blob) if seq >= mq.counted_from else 0, dcount)
            mq.paged -= 1
            mq.skip.add(seq)
            env.owner = branches[locked[seq]]
            branches[locked[seq]].acks.append(env)
        for xid, br in rec.prepared.items():
            work = branches[xid]
            for seq, qkey, blob in br.sends:
                mq = self._queue_for_key(qkey, create=True)
                if mq is not None:
                    env = Envelope(seq, mq, codec.decode(blob), True,
                                   len(blob) if seq >= mq.counted_from else 0)
                    mq.admit(env)  # a prepared send holds its room until commit or rollback
                    work.prepared_sends.append(env)
            self.branches[xids[xid]] = work
        if rec.backlogs or rec.prepared:
            log.info("store %s: recovered %d messages, %d subscriptions, %d prepared XA branches",
                     self.store.path, sum(rec.backlogs.values()), len(rec.subscriptions),
                     len(rec.prepared))

    def page(self, mq: MessageQueue, after: int, limit: int) -> tuple[list[Envelope], int | None]:
        """Paged-out messages of ``mq`` read back from the store (queues.Pager)."""
        stored = (self.store.page(mq.key, after, limit)
                  if self.store is not None and mq.durable else [])
        skip, decode, counted = mq.skip, codec.decode, mq.counted_from
        if not (mq.swapped and self.swap is not None):  # the common case: the store alone
            if not stored:
                return [], None
            return ([Envelope(seq, mq, decode(blob), True, len(blob) if seq >= counted else 0, dcount)
                     for seq, dcount, blob in stored if seq not in skip], stored[-1][0])
        rows = sorted([(seq, dcount, blob, True) for seq, dcount, blob in stored]
                      + [(seq, 0, blob, False) for seq, blob in self.swap.page(mq.key, after, limit)]
                      )[:limit]
        if not rows:
            return [], None
        return ([Envelope(seq, mq, decode(blob), kept, len(blob) if seq >= counted else 0, dcount)
                 for seq, dcount, blob, kept in rows if not (kept and seq in skip)], rows[-1][0])

    def page_out(self, env: Envelope) -> bool:
        """(queues.Pager) A stored message is in the store already; a non-persistent one
        goes to the swap file, or stays in memory when there is none or it failed."""
        if env.stored:
            return True
        if self.swap is None:
            return False
        blob = env.wire or codec.encode(env.message)
        try:
            self.swap.put(env.seq, env.queue.key, blob)
        except JMSException as exc:
            log.warning("%s: keeping a message in memory: %s", env.queue.destination, exc)
            return False
        mq = env.queue
        mq.swapped += 1
        mq.bytes += len(blob) - env.size  # an estimated size becomes the one it pages in with
        return True

    def paged_in(self, envs: list[Envelope]) -> None:
        """(queues.Pager)"""
        if self.swap is not None:
            swapped = [env.seq for env in envs if not env.stored]
            if swapped:
                self.swap.forget(swapped)
                envs[0].queue.swapped -= len(swapped)

    def drop(self, mq: MessageQueue) -> None:
        """(queues.Pager)"""
        if self.swap is not None:
            self.swap.drop(mq.key)

    def _pages(self, mq: MessageQueue) -> MessageQueue:
        """``mq`` paged beyond the memory window, when there is a store or a swap file."""
        if (self.store is not None and mq.durable) or self.swap is not None:
            mq.pager = self
            mq.window = self.memory_window
        return mq

    def _queue_for_key(self, qkey: str, create: bool = True) -> MessageQueue | None:
        kind, _, rest = qkey.partition(":")
        if kind == "q":
            return self._queue(rest, create=create, check=False)
        if kind == "d":
            client_id, _, name = rest.partition("\0")
            sub = self.durable.get((client_id, name))
            return sub.queue if sub else None
        return None

    # --- destinations --------------------------------------------------------------
    def _limits(self, qkey: str) -> DestinationLimits:
        limits = self.configured.get(qkey)
        if limits is not None:
            return limits
        if qkey == _DMQ_KEY and self.default_limits.limit_behavior is LimitBehavior.FLOW_CONTROL:
            # dead messages have no producer to hold: a full DMQ drops its oldest
            return replace(self.default_limits, limit_behavior=LimitBehavior.REMOVE_OLDEST)
        return self.default_limits

    def _queue(self, name: str, create: bool = False, check: bool = True) -> MessageQueue:
        """Queue ``name``, created when it is new: when ``create`` (admin) or auto-create
        is on, and its name is one a destination may have (``check``; not for what the
        store holds nor a queue an administrator configured)."""
        mq = self.queues.get(name)
        if mq is None:
            if not (create or self.autocreate_queue):
                raise InvalidDestinationException(f"queue {name!r} does not exist and auto-create is off")
            if check and f"q:{name}" not in self.configured:
                check_name(Queue(name))
            key = f"q:{name}"
            mq = self._pages(MessageQueue(key, Queue(name), durable=True, limits=self._limits(key),
                                          usage=self.usage))
            self.queues[name] = mq
        return mq

    def _know_topic(self, topic: Destination) -> None:
        """Topic ``topic`` is known from now on (created), when its name is one a
        destination may have or an administrator configured it (under the lock)."""
        if topic.name not in self.known_topics:
            if f"t:{topic.name}" not in self.configured:
                check_name(topic)
            self.known_topics.add(topic.name)

    def would_autocreate(self, dest: Destination) -> bool:
        """Would using ``dest`` now create it (for the auto-create access check)? A lock-free
        read: a destination once known stays known."""
        if dest.is_temporary:
            return False
        if dest.is_topic:
            return (self.autocreate_topic and dest.name not in self.known_topics
                    and f"t:{dest.name}" not in self.configured)
        return self.autocreate_queue and dest.name not in self.queues

    def configure_destination(self, destination: Destination, limits: DestinationLimits) -> None:
        """Create (admin-create) a destination with limits; kept in the store."""
        if destination.is_temporary:
            raise InvalidDestinationException("temporary destinations cannot be configured")
        if destination.name == DMQ_NAME and not destination.is_topic \
                and limits.limit_behavior is LimitBehavior.FLOW_CONTROL:
            raise InvalidDestinationException(f"{DMQ_NAME} cannot use limitBehavior=FLOW_CONTROL: dead "
                                              "messages have no producer to hold")
        key = ("t:" if destination.is_topic else "q:") + destination.name
        if limits.backout_queue and limits.backout_queue not in self.queues:
            check_name(Queue(limits.backout_queue))
        with self.lock:
            if destination.is_topic:
                self._know_topic(destination)
                self.configured[key] = limits
                for mq in self.topics.get(destination.name, ()):
                    mq.limits = limits
                    mq.wake_producers()
            else:
                mq = self._queue(destination.name, create=True)
                self.configured[key] = limits
                mq.limits = limits
                mq.wake_producers()
            if self.store is not None:
                self.store.op("dest_put", key, _limits_to_json(limits))
                ticket = self.store.ticket()
        if self.store is not None:
            self.store.wait(ticket)

    def destinations(self) -> dict[str, dict[str, int]]:
        """Queue and subscription depths (admin and tests)."""
        with self.lock:
            out = {f"queue:{n}": {"pending": len(mq), "unacked": mq.count - len(mq), "bytes": mq.bytes}
                   for n, mq in self.queues.items()}
            for (cid, name), sub in self.durable.items():
                mq = sub.queue
                out[f"durable:{cid}:{name}"] = {"pending": len(mq), "unacked": mq.count - len(mq),
                                                 "bytes": mq.bytes}
            return out

    def describe_destination(self, destination: Destination) -> tuple[DestinationLimits, dict[str, int]] | None:
        """A destination's limits and counts (a topic's summed over its subscriptions);
        None when it does not exist."""
        with self.lock:
            if destination.is_topic:
                key = f"t:{destination.name}"
                if destination.name not in self.known_topics and key not in self.configured:
                    return None
                queues = self.topics.get(destination.name, [])
                limits = self.configured.get(key, self.default_limits)
            else:
                mq = self.queues.get(destination.name)
                if mq is None:
                    return None
                queues, limits = [mq], mq.limits
            return limits, {"pending": sum(len(q) for q in queues),
                            "unacked": sum(q.count - len(q) for q in queues),
                            "bytes": sum(q.bytes for q in queues),
                            "producers_waiting": sum(len(q.room_waiters) + len(q.pace_waiters)
                                                     for q in queues)}

    def purge(self, destination: Destination) -> tuple[int, int] | None:
        """Remove every waiting message of a queue (a topic: of each of its subscriptions),
        in memory and paged out, without the DMQ; messages delivered and not yet
        acknowledged stay with their consumers. (removed, still in delivery); None when the
        destination does not exist. Producers held by a full FLOW_CONTROL limit go on."""
        with self.lock:
            if destination.is_topic:
                if destination.name not in self.known_topics and f"t:{destination.name}" not in self.configured:
                    return None
                queues = list(self.topics.get(destination.name, []))
            else:
                mq = self.queues.get(destination.name)
                if mq is None:
                    return None
                queues = [mq]
            removed = held = 0
            for mq in queues:
                n, h = self._purge(mq)
                removed, held = removed + n, held + h
            ticket = self.store.ticket() if self.store is not None else None
        self.wait_durable(ticket)
        return removed, held

    def _purge(self, mq: MessageQueue) -> tuple[int, int]:
        """Empty ``mq`` of its waiting messages (under the lock): those in memory one by
        one, the paged-out ones by seq range (skipping the few in memory in delivery)."""
        removed, paged, high = len(mq), mq.paged, mq.high
        held = _owned(mq, self)
        kept = {env.seq for env in held}
        for env in mq.drain():  # (the swapped ones go with it)
            mq.release(env)
            if env.stored:
                assert self.store is not None  # a stored envelope: there is a store
                self.store.remove(env.seq)
        if paged and self.store is not None and mq.durable:
            bounds = [high, *sorted(seq for seq in kept if seq > high), next(self._seq)]
            for low, up in itertools.pairwise(bounds):
                if up - low > 1:
                    self.store.op("purge_between", mq.key, low, up)
        prepared = [env for work in self.branches.values() for env in work.prepared_sends if env.queue is mq]
        mq.bytes = sum(env.size for env in held) + sum(env.size for env in prepared)  # what is still counted
        mq.skip &= kept
        mq.epoch += 1
        mq.paged_epoch += 1
        if mq.room_waiters and not mq.full():
            mq.wake_producers()
        mq.unpace()
        return removed, len(held)

    def browse_queue(self, name: str, limit: int) -> list[Message] | None:
        """Read-only copies of the first ``limit`` waiting messages of queue ``name`` in
        delivery order (paged-out ones included); None when it does not exist."""
        with self.lock:
            if name not in self.queues:
                return None
        out: list[Message] = []
        for message in self.browse(Queue(name), None):
            if len(out) >= limit:
                break
            out.append(message)
        return out

    def producer_opened(self, destination: Destination | None) -> None:
        if destination is not None:
            with self.lock:
                self.producers[destination] += 1

    def producer_closed(self, destination: Destination | None) -> None:
        if destination is not None:
            with self.lock:
                self.producers[destination] -= 1
                if self.producers[destination] <= 0:
                    del self.producers[destination]

    def metrics(self) -> dict[str, Any]:
        """What /metrics shows of the broker, read at scrape time: per queue and topic
        (a topic summed over its subscriptions) depth, bytes, consumers, producers (see
        client.py's notes: bound ones, and anonymous ones that sent to it), enqueued and
        dequeued since start; the
        connections; the memory state; the store's counters."""
        with self.lock:
            dests: dict[tuple[str, str], dict[str, int]] = {}
            groups = [(("queue", n), [mq]) for n, mq in self.queues.items()]
            groups += [(("topic", n), self.topics.get(n, [])) for n in sorted(self.known_topics)]
            for key, queues in groups:
                dest = Topic(key[1]) if key[0] == "topic" else Queue(key[1])
                dests[key] = {"depth": sum(len(q) for q in queues), "bytes": sum(q.bytes for q in queues),
                              "consumers": sum(len(q.consumers) for q in queues),
                              "producers": self.producers.get(dest, 0),
                              "enqueued": sum(q.enqueued for q in queues),
                              "dequeued": sum(q.dequeued for q in queues)}
            connections = len(self.connections)
        memory = self.memory
        return {"destinations": dests, "connections": connections,
                "memory": None if memory is None else {"state": memory.state_name, "percent": memory.percent,
                                                       "budget": memory.budget},
                "store": None if self.store is None else self.store.metrics()}

    def queue_depth(self, name: str) -> int:
        with self.lock:
            mq = self.queues.get(name)
            return len(mq) if mq else 0

    # --- connections -----------------------------------------------------------------
    def authenticate(self, username: str | None, password: str | None) -> None:
        if self.closed:
            raise IllegalStateException("the broker is closed")
        if self.authenticator is not None and not self.authenticator(username, password):
            raise JMSSecurityException(f"authentication failed for user {username!r}")

    def attach(self, connection: Any) -> None:
        with self.lock:
            if self.closed:
                raise IllegalStateException("the broker is closed")
            self.connections.add(connection)

    def claim_client_id(self, connection: Any, client_id: str) -> None:
        self.reservations.check_client_id(connection, client_id)
        with self.lock:
            holder = self.client_ids.get(client_id)
            if holder is not None and holder is not connection:
                raise InvalidClientIDException(f"client id {client_id!r} is in use by another connection")
            self.client_ids[client_id] = connection

    def detach(self, connection: Any) -> None:
        """A connection closed: free its client id, temporary destinations, subscribers."""
        with self.lock:
            self.connections.discard(connection)
            client_id = connection.client_id_value
            if client_id is not None and self.client_ids.get(client_id) is connection:
                del self.client_ids[client_id]
            for name in [n for n, mq in self.temporary.items() if mq.owner is connection]:
                self._delete_temporary(name)
            # Its unprepared XA branches die with it; prepared ones stay in doubt for the TM.
            for work in [w for w in self.branches.values() if w.connection is connection]:
                if work.state is not WorkState.PREPARED:
                    self._xa_forget_rollback(work)

    def next_message_id(self) -> str:
        return self._id_prefix + str(next(self._ids))

    # --- temporary destinations ------------------------------------------------------------
    @overload
    def create_temporary(self, connection: Any, topic: Literal[False]) -> TemporaryQueue: ...
    @overload
    def create_temporary(self, connection: Any, topic: Literal[True]) -> TemporaryTopic: ...
    def create_temporary(self, connection: Any, topic: bool) -> TemporaryQueue | TemporaryTopic:
        with self.lock:
            name = f"temp.{self.instance_name}.{uuid.uuid4().hex[:16]}"
            dest = TemporaryTopic(name) if topic else TemporaryQueue(name)
            mq = self._pages(MessageQueue(f"tmp:{name}", dest, durable=False, owner=connection,
                                          usage=self.usage))
            self.temporary[name] = mq
            if topic:
                self.topics[name] = []
            return dest

    def delete_temporary(self, connection: Any, dest: Destination) -> None:
        with self.lock:
            mq = self.temporary.get(dest.name)
            if mq is None:
                return
            if mq.owner is not connection:
                raise InvalidDestinationException(f"{dest} belongs to another connection")
            busy = mq.consumers or (dest.is_topic and self.topics.get(dest.name))
            if busy:
                raise IllegalStateException(f"{dest} still has consumers")
            self._delete_temporary(dest.name)

    def _delete_temporary(self, name: str) -> None:
        mq = self.temporary.pop(name)
        mq.deleted = True
        _release_all(mq)
        for sub in self.topics.pop(name, []) if mq.destination.is_topic else ():
            sub.deleted = True
            _release_all(sub)
        mq.wake_all()

    # --- sending ----------------------------------------------------------------------------
    def _targets(self, dest: Destination, sender: Any, message: Message) -> list[MessageQueue]:
        """The message queues a message sent to ``dest`` goes to (under the lock)."""
        if dest.is_temporary:
            mq = self.temporary.get(dest.name)
            if mq is None:
                raise InvalidDestinationException(f"{dest} no longer exists (its connection closed)")
            if not dest.is_topic:
                return [mq]
        elif not dest.is_topic:
            return [self._queue(dest.name)]
        elif dest.name not in self.known_topics:
            if not self.autocreate_topic and f"t:{dest.name}" not in self.configured:
                raise InvalidDestinationException(f"topic {dest.name!r} does not exist and auto-create is off")
            self._know_topic(dest)
        out = []
        for sub in self.topics.get(dest.name, ()):
            if sub.no_local and sender is not None and _same_origin(sub, sender):
                continue
            if sub.selector is not None and not sub.selector.matches(message):
                continue
            out.append(sub)
        return out

    def _route(self, message: Message, targets: list[MessageQueue],
               blob: bytes | None = None, hold: bool = True, lazy: bool = False) -> list[Envelope]:
        """Envelopes for ``message`` in each target, limits applied and room taken (under
        the lock); on a refusal nothing stays taken. ``blob``: ``message`` encoded as a
        remote sender sent it; stored as it is and kept for deliveries over the wire while
        the queue is short (a backlog would hold every message twice). ``hold``: a full
        FLOW_CONTROL target raises ProducerFlowControl (else it takes the message).
        ``lazy``: a persistent text or bytes message is encoded for the store only if its
        row is still pending when its batch is cut (or at once when it is paged out): one
        consumed before is never encoded (its headers are checked now, so a bad one is
        refused here)."""
        wire = blob
        persistent = message.delivery_mode == PERSISTENT and self.store is not None
        if lazy and not (persistent and blob is None and type(message) in _LAZY_KINDS):
            lazy = False
        if lazy:
            codec.check_headers(message)
        body = -1
        if self.max_message_size >= 0:
            body = message.body_size()
            if body > self.max_message_size:
                raise ResourceAllocationException(
                    f"{message.destination}: a message body of {body} bytes is larger than "
                    f"imq.message.max_size={self.max_message_size}")
        envs: list[Envelope] = []
        try:
            for i, mq in enumerate(targets):
                stored = persistent and mq.durable
                limits = mq.limits
                if blob is None and ((stored and not lazy) or limits.counts_bytes):
                    blob = codec.encode(message)
                size = len(blob) if blob is not None else 0  # (an int add in admit: metrics)
                if not limits.unlimited:
                    self._make_room(mq, size, hold)
                if not size:  # not encoded: estimated (as the store estimates a lazy row)
                    if body < 0:
                        body = message.body_size()
                    size = body + 200
                if not stored:  # held in memory only: the system-wide limits apply
                    self._check_system(mq, size)
                msg = message if i == 0 else message.copy()
                env = Envelope(next(self._seq), mq, msg, stored, size, blob=blob if stored else None,
                               wire=wire if mq.count < WIRE_KEEP else None)
                mq.admit(env)
                envs.append(env)
        except BaseException:
            self._unroute(envs)
            raise
        return envs

    @staticmethod
    def _unroute(envs: Iterable[Envelope]) -> None:
        """Give back the room of routed envelopes that will not be committed."""
        for env in envs:
            env.queue.release(env)

    def _route_all(self, sends: list[tuple[Message, Destination, Any, bytes | None]]
                   ) -> list[Envelope]:
        """Route every send of a transaction; all or none (room included). A remote send's
        blob is stored as it came, not encoded again at the commit."""
        envs: list[Envelope] = []
        try:
            for message, dest, sender, blob in sends:
                envs.extend(self._route(message, self._targets(dest, sender, message), blob, hold=False))
        except BaseException:
            self._unroute(envs)
            raise
        return envs

    def _check_system(self, mq: MessageQueue, size: int) -> None:
        """imq.system.max_count / max_size: refuse one more message held in memory only."""
        usage = self.usage
        if 0 <= usage.max_count <= usage.count:
            raise ResourceAllocationException(
                f"{mq.destination}: the broker holds {usage.count} messages in memory, its limit "
                f"imq.system.max_count={usage.max_count}; the message is refused")
        if 0 <= usage.max_size < usage.bytes + size:
            raise ResourceAllocationException(
                f"{mq.destination}: the broker holds {usage.bytes} bytes of messages in memory; "
                f"{size} more would pass its limit imq.system.max_size={usage.max_size}; the message is refused")

    def _make_room(self, mq: MessageQueue, size: int, hold: bool = True) -> None:
        lim = mq.limits
        name = mq.destination
        if 0 <= lim.max_bytes_per_msg < size:
            raise ResourceAllocationException(
                f"{name}: message of {size} bytes exceeds maxBytesPerMsg={lim.max_bytes_per_msg}")
        if not mq.full(size):
            return
        behavior = lim.limit_behavior
        if behavior is LimitBehavior.FLOW_CONTROL:
            if not hold:
                return  # a commit: its producer waited at send time
            if mq.count or mq.bytes:  # an empty queue that is "full" would never make room
                raise ProducerFlowControl(self._full_text(mq, size), partial(self.on_room, mq))
        elif behavior is not LimitBehavior.REJECT_NEWEST:
            pick = mq.oldest if behavior is LimitBehavior.REMOVE_OLDEST else mq.lowest_priority
            while mq.full(size):
                victim = pick()
                if victim is None:
                    break
                mq.remove(victim)
                self._discard(victim, behavior.value)
        if mq.full(size):
            raise ResourceAllocationException(self._full_text(mq, size))

    @staticmethod
    def _full_text(mq: MessageQueue, size: int) -> str:
        lim = mq.limits
        return (f"{mq.destination} is full (maxNumMsgs={lim.max_num_msgs}, maxTotalMsgBytes="
                f"{lim.max_total_msg_bytes}, {mq.count} messages, {mq.bytes} bytes"
                + (f", this one {size} bytes" if size else "") + f"); limitBehavior={lim.limit_behavior.value}")

    def on_room(self, mq: MessageQueue, callback: Callable[[], None]) -> None:
        """Call ``callback`` (once, without blocking) when ``mq`` may have room again: at
        once if it has now, when a release makes room, its limits change, it goes away or
        the broker closes."""
        with self.lock:
            if mq.full() and not (mq.deleted or self.closed):
                mq.room_waiters.append(callback)
                return
        callback()

    def _pace(self, targets: list[MessageQueue]) -> None:
        """Pacing (module comment): ProducerFlowControl when a target's consumers are
        behind by more than PACE_HIGH messages."""
        for mq in targets:
            if len(mq) > PACE_HIGH and self._paced(mq, PACE_HIGH):
                raise ProducerFlowControl(
                    f"{mq.destination}: {len(mq)} messages wait for its consumers; the producer "
                    f"waits until they have taken all but {PACE_LOW}", partial(self.on_pace, mq))

    def _paced(self, mq: MessageQueue, level: int) -> bool:
        """Are producers of ``mq`` to wait: more than ``level`` messages wait, and
        consumers are there and took one (or waited for one) within PACE_STALL seconds
        (under the lock)?"""
        return (len(mq) > level and bool(mq.consumers) and not (mq.deleted or self.closed)
                and time.monotonic() - mq.last_take < PACE_STALL)

    def on_pace(self, mq: MessageQueue, callback: Callable[[], None]) -> None:
        """Call ``callback`` (once, without blocking) when a paced producer of ``mq`` may
        send again: at once if it may now."""
        with self.lock:
            if self._paced(mq, PACE_LOW):
                mq.pace_waiters.append(callback)
                if mq.pace_timer is None:
                    self._check_pace_later(mq, PACE_STALL)
                return
        callback()

    def _check_pace_later(self, mq: MessageQueue, delay: float) -> None:
        timer = threading.Timer(delay, self._check_pace, (mq,))
        timer.daemon = True
        mq.pace_timer = timer
        timer.start()

    def _check_pace(self, mq: MessageQueue) -> None:
        """The stall check: paced producers go on once the consumers have taken nothing
        for PACE_STALL seconds (or went away); else look again when that could be."""
        with self.lock:
            mq.pace_timer = None
            if not mq.pace_waiters:
                return
            if self._paced(mq, PACE_LOW):
                self._check_pace_later(mq, mq.last_take + PACE_STALL - time.monotonic() + 0.001)
            else:
                mq.unpace()

    def _throttle(self, sender: Any) -> None:
        """The memory state's batch: ProducerFlowControl when ``sender`` has sent its batch."""
        memory = self.memory
        if memory is not None and sender is not None and not memory.admit(sender):
            raise ProducerFlowControl(
                f"the broker's memory state is {memory.state_name} ({memory.percent:.0f}% of "
                f"{memory.budget >> 20} MB); producers may send {memory.batch} messages per batch",
                memory.on_sample)

    def check_room(self, sender: Any, message: Message, dest: Destination) -> None:
        """Before a send into a transaction: ProducerFlowControl when the producer must
        wait now (a full FLOW_CONTROL target, or the memory state); nothing is taken."""
        with self.lock:
            if self.closed:
                raise IllegalStateException("the broker is closed")
            self._throttle(sender)
            for mq in self._targets(dest, sender, message):
                if mq.limits.limit_behavior is LimitBehavior.FLOW_CONTROL and mq.count and mq.full():
                    raise ProducerFlowControl(self._full_text(mq, 0), partial(self.on_room, mq))

    def _admit(self, envs: list[Envelope]) -> None:
        """StoreFull, the envelopes' room given back, when a persistent one meets a full
        store: a producer's message is refused, not kept in memory only (the DMQ's are kept)."""
        if self.store is not None and self.store.full and any(env.stored for env in envs):
            self._unroute(envs)
            self.store.check_room()

    def _commit_envelopes(self, envs: Iterable[Envelope], rows: list[Row] | None = None) -> int | None:
        """Make routed envelopes durable (recorded) and visible (under the lock); the store
        ticket of the batch that holds them, or None when none is stored. Their rows go to
        the store in one call (a push never reads the store; a take waits for the lock),
        or, with ``rows``, are left there for the caller to record (send_many)."""
        out: list[Row] = [] if rows is None else rows
        for env in envs:
            mq = env.queue
            if mq.deleted:
                continue
            if env.stored:
                blob: bytes | Message | None = env.blob
                if blob is None:  # routed lazily (_route)
                    if mq.beyond_window(env):  # paged out: read back encoded, so encoded now
                        blob = codec.encode(env.message)
                        mq.bytes += len(blob) - env.size  # the size it pages in with
                        env.size = len(blob)
                    else:
                        blob = env.message
                out.append((env.seq, mq.key, blob, 0))
                env.blob = None
            mq.push(env)
        return self._record(out) if rows is None and out else None

    def _record(self, rows: list[Row]) -> int:
        """Record routed rows in the store in one call; its ticket (rows is emptied)."""
        assert self.store is not None  # a row is stored: there is a store
        ticket = self.store.add_many(rows)
        rows.clear()
        return ticket

    def send(self, sender: Any, message: Message, dest: Destination,
             blob: bytes | None = None, pace: bool = False) -> Sent | None:
        """Route and enqueue now; what to wait on (wait_all) for a stored send, or None.
        ``blob``: ``message`` as a remote client encoded it (see ``_route``); ``pace``: the
        producer is paced to a queue's consumers (module comment)."""
        with self.lock:
            if self.closed:
                raise IllegalStateException("the broker is closed")
            envs = self._admit_send(sender, message, dest, self._targets(dest, sender, message), blob, pace)
            ticket = self._commit_envelopes(envs)
            return None if ticket is None else Sent(ticket, envs)

    def _admit_send(self, sender: Any, message: Message, dest: Destination, targets: list[MessageQueue],
                    blob: bytes | None, pace: bool) -> list[Envelope]:
        """One send's envelopes, routed (lazily) to ``targets`` and admitted, not yet
        committed: the producer paced and throttled first (under the lock)."""
        if pace and not dest.is_topic:
            self._pace(targets)
        self._throttle(sender)
        envs = self._route(message, targets, blob, lazy=True)
        self._admit(envs)
        return envs

    def send_many(self, sender: Any, sends: Sequence[tuple[Message, Destination]], pace: bool = False
                  ) -> tuple[Sent | None, int, JMSException | None]:
        """send() of each of ``sends`` in order under one taking of the lock, their rows
        recorded in one store call, stopping at the first refused (ProducerFlowControl
        among the refusals): (what to wait on for those sent, or None; how many were sent;
        why the next was refused, None when none was). A send into a destination with
        limits records the rows before it first (making room may remove one of them)."""
        with self.lock:
            if self.closed:
                return None, 0, IllegalStateException("the broker is closed")
            rows: list[Row] = []
            ticket = None
            sent: list[Envelope] = []
            last: Destination | None = None  # a queue's targets serve the sends after to it
            targets: list[MessageQueue] = []
            limited = False
            for i, (message, dest) in enumerate(sends):
                try:
                    if dest is not last or dest.is_topic or dest.is_temporary:
                        targets = self._targets(dest, sender, message)
                        last = dest
                        limited = any(not mq.limits.unlimited for mq in targets)
                    if rows and limited:  # recorded before making room may remove one
                        ticket = self._record(rows)
                    envs = self._admit_send(sender, message, dest, targets, None, pace)
                except JMSException as exc:
                    return self._sent(rows, ticket, sent), i, exc
                self._commit_envelopes(envs, rows)
                sent += envs
            return self._sent(rows, ticket, sent), len(sends), None

    def _sent(self, rows: list[Row], ticket: int | None, envs: list[Envelope]) -> Sent | None:
        """send_many's answer: its rows recorded; None when nothing was stored."""
        if rows:
            ticket = self._record(rows)
        return None if ticket is None else Sent(ticket, envs)

    def wait_durable(self, ticket: int | None) -> None:
        if ticket is not None and self.store is not None:
            self.store.wait(ticket)

    def wait_all(self, tickets: Sequence[int | Sent]) -> None:
        """Wait for the newest of ``tickets`` (batches are written in order, so it covers
        the others). If the store cannot write it (StoreFull: no space, the database
        unreachable) the sends among them are withdrawn before their producers hear the
        error: a refused send is in no queue, and never written later. A message of theirs
        already delivered to a consumer, or paged out, stays (written once the store can)."""
        if not tickets or self.store is None:
            return
        try:
            self.store.wait(max(t.ticket if isinstance(t, Sent) else t for t in tickets))
        except StoreFull:
            self._withdraw([env for t in tickets if isinstance(t, Sent) for env in t.envs])
            raise

    def _withdraw(self, envs: list[Envelope]) -> None:
        """Take sent envelopes that still wait in their queues out again (wait_all)."""
        removed: list[int] = []
        with self.lock:
            for env in envs:
                if env.owner is None and env.queue.remove(env):
                    env.queue.release(env)
                    if env.stored:
                        removed.append(env.seq)
            if removed:
                assert self.store is not None  # a stored envelope: there is a store
                self.store.remove_all(removed)

    def _xa_durable(self, what: str, ticket: int | None) -> None:
        """Wait for an XA step's batch; a store that cannot write it now (its disk full, its
        database unreachable) is an RM that failed (XAER_RMFAIL: the outcome is the
        coordinator's recovery's), not a vote."""
        try:
            self.wait_durable(ticket)
        except StoreFull as exc:
            raise XAException(f"{what}: {exc}", xa.XAER_RMFAIL) from exc

    @property
    def sync(self) -> bool:
        return self.store is not None and self.store.sync

    # --- consuming --------------------------------------------------------------------------
    def receive(self, consumer: Any, timeout: float | None, ack_now: bool) -> Envelope | None:
        """Take the next envelope for ``consumer``, waiting up to ``timeout`` seconds.

        With ``ack_now`` (AUTO/DUPS_OK) it is acknowledged as it is taken; otherwise its
        delivery count is recorded so a crash still reports it redelivered.
        """
        envs = self._take(consumer, 1, timeout, 0, ack_now)
        return envs[0] if envs else None

    def receive_many(self, consumer: Any, limit: int, timeout: float | None,
                     max_bytes: int = 0) -> list[Envelope]:
        """Up to ``limit`` envelopes for ``consumer`` under one lock: waits up to
        ``timeout`` seconds for the first as :meth:`receive` does (not acknowledged), then
        takes those ready now, stopping once their bodies reach ``max_bytes`` (0: no byte
        bound). Each is taken as receive takes one; [] when there is none. A front end
        moving a batch so pays one lock, one wake-up and one clock read for it."""
        return self._take(consumer, limit, timeout, max_bytes, False)

    def _take(self, consumer: Any, limit: int, timeout: float | None, max_bytes: int,
              ack_now: bool) -> list[Envelope]:
        deadline = None if timeout is None else time.monotonic() + timeout
        mq: MessageQueue = consumer.queue
        with self.lock:
            while True:
                if consumer.closed or self.closed or mq.deleted:
                    return []
                if consumer.connection.started:
                    now = now_ms()
                    marks: list[tuple[int, int]] = []  # recorded in one store call, not one each
                    try:
                        env = self._take_next(consumer, mq, now, ack_now, marks)
                        envs = [] if env is None else [env]
                        size = env.message.body_size() if max_bytes and env is not None else 0
                        while envs and len(envs) < limit and not (max_bytes and size >= max_bytes):
                            env = self._take_next(consumer, mq, now, ack_now, marks)
                            if env is None:
                                break
                            envs.append(env)
                            if max_bytes:
                                size += env.message.body_size()
                    finally:
                        if marks:
                            assert self.store is not None  # stored envelopes: there is a store
                            self.store.mark_delivered_all(marks, bool(mq.limits.backout_threshold))
                    if envs:
                        if consumer.selector is None:  # (pacing) one that takes any message
                            mq.last_take = time.monotonic()
                            if mq.pace_waiters and len(mq) <= PACE_LOW:
                                mq.unpace()
                        return envs
                    if not consumer.retain and len(mq):
                        self._sweep_unwanted(mq)
                remaining = None
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return []
                mq.waiters.append(consumer)
                if consumer.selector is None and consumer.connection.started:
                    mq.last_take = time.monotonic()  # (pacing) ready to take any: not stalled
                consumer.cond.wait(remaining)
                try:
                    mq.waiters.remove(consumer)
                except ValueError:
                    pass

    def _take_next(self, consumer: Any, mq: MessageQueue, now: int, ack_now: bool,
                   marks: list[tuple[int, int]]) -> Envelope | None:
        """The next envelope of ``mq`` for ``consumer``, counted as delivered (and
        acknowledged with ``ack_now``, else, when stored, its (seq, count) added to
        ``marks`` for the caller to record before it hands the envelope out, so a crash
        still reports it redelivered); None when none is ready (under the lock)."""
        while True:
            env = mq.take(consumer.selector, now, self._expire, consumer)
            if env is None:
                return None
            if mq.limits.backout_threshold and self._backed_out(env):
                continue  # delivered unacknowledged too often before a restart
            env.dcount += 1
            if ack_now:
                self._ack((env,))
            elif env.stored:
                marks.append((env.seq, env.dcount))
            return env

    def acknowledge(self, envs: Iterable[Envelope]) -> None:
        """Consumed for good: drop from queues' accounting and from the store."""
        with self.lock:
            self._ack(envs)

    def _ack(self, envs: Iterable[Envelope]) -> None:
        stored = []
        for env in envs:
            env.owner = None
            env.queue.release(env)
            if env.stored:
                stored.append(env.seq)
        if stored:
            assert self.store is not None  # a stored envelope: there is a store
            self.store.remove_all(stored)

    def redeliver(self, envs: list[Envelope]) -> None:
        """Return unacknowledged messages to their queues (recover, rollback, close)."""
        with self.lock:
            self._redeliver(envs)

    def _redeliver(self, envs: list[Envelope]) -> None:
        by_queue: dict[int, list[Envelope]] = {}
        for env in envs:
            if env.queue.deleted:
                env.queue.release(env)  # its queue went away while it was out
                continue
            if env.queue.limits.backout_threshold and self._backed_out(env):
                continue
            if env.stored:
                assert self.store is not None  # a stored envelope: there is a store
                self.store.mark_delivered(env.seq, env.dcount)
            by_queue.setdefault(id(env.queue), []).append(env)
        for group in by_queue.values():
            group[0].queue.push_back(group)

    def _backed_out(self, env: Envelope) -> bool:
        """A message taken out of (or returning to) its queue that has been delivered
        backoutThreshold times without an acknowledgement (its delivery count, which the
        store keeps across restarts): requeued on the destination's backoutQueue; if there
        is none or it refuses the message, backoutDisposition (the DMQ, or discarded).
        True when the message left its queue (under the lock)."""
        mq = env.queue
        limits = mq.limits
        if env.dcount < limits.backout_threshold:
            return False
        if limits.backout_queue:
            try:
                target = self._queue(limits.backout_queue)
                if target is mq:
                    raise InvalidDestinationException("it is the queue the message backed out of")
                moved = env.message.copy()
                moved.set_int_property("JMS_IMQ_BACKOUT_COUNT", env.dcount)
                moved.set_string_property("JMS_IMQ_BACKOUT_DESTINATION", str(mq.destination))
                moved.destination = target.destination
                envs = self._route(moved, [target], hold=False)
                self._admit(envs)
                with self.store.lock if self.store is not None else _NULL:
                    self._commit_envelopes(envs)
                    self._ack((env,))
            except JMSException as exc:
                log.warning("%s: message %s reached backoutThreshold=%d; backoutQueue %s refused it: %s",
                            mq.destination, env.message.message_id, limits.backout_threshold,
                            limits.backout_queue, exc)
            else:
                log.info("%s: message %s backed out %d times, requeued on %s", mq.destination,
                         env.message.message_id, env.dcount, limits.backout_queue)
                return True
        self._dispose(env, "BACKOUT_THRESHOLD_REACHED")
        return True

    def _dispose(self, env: Envelope, reason: str) -> None:
        """Remove a message by its destination's backoutDisposition: dmq (the DMQ, as
        _discard) or discard."""
        if env.queue.limits.backout_disposition == "discard":
            env.queue.release(env)
            if env.stored:
                assert self.store is not None  # a stored envelope: there is a store
                self.store.remove(env.seq)
            log.warning("%s: message %s discarded (%s)", env.queue.destination, env.message.message_id, reason)
        else:
            self._discard(env, reason)

    def _sweep_unwanted(self, mq: MessageQueue) -> None:
        """Message retention off: the waiting messages (in memory) that no active
        consumer of ``mq`` selects go by the disposition rule (reason MSG_NOT_MATCHED), so
        they do not pile up. Only while one of its active consumers is a connection
        consumer's with retention off (under the lock)."""
        active = [c for c in mq.consumers if not c.closed and c.connection.started]
        if not any(not c.retain for c in active):
            return
        selectors = [c.selector for c in active]
        if any(sel is None for sel in selectors):
            return
        for env in mq.browse():
            if not any(sel.matches(env.message) for sel in selectors if sel is not None):
                mq.remove(env)
                self._dispose(env, "MSG_NOT_MATCHED")

    def _expire(self, env: Envelope) -> None:
        self._discard(env, "EXPIRED")

    def _discard(self, env: Envelope, reason: str) -> None:
        """Remove a message the broker will never deliver; to the DMQ if the destination says so."""
        mq = env.queue
        mq.release(env)
        if env.stored:
            assert self.store is not None  # a stored envelope: there is a store
            self.store.remove(env.seq)
        if mq.limits.use_dmq and mq is not getattr(self, "dmq", None) and not mq.destination.is_temporary:
            dead = env.message.copy()
            dead.expiration = 0
            dead.set_string_property("JMS_SUN_DMQ_UNDELIVERED_REASON", reason)
            dead.set_long_property("JMS_SUN_DMQ_UNDELIVERED_TIMESTAMP", now_ms())
            dead.set_string_property("JMS_SUN_DMQ_DESTINATION", str(mq.destination))
            dead.set_int_property("JMS_SUN_DMQ_DELIVERY_COUNT", env.dcount)
            dead.destination = self.dmq.destination
            try:
                self._commit_envelopes(self._route(dead, [self.dmq]))
            except JMSException as exc:
                log.warning("%s: message %s dropped (%s); the DMQ refused it: %s",
                            mq.destination, env.message.message_id, reason, exc)
        else:
            log.info("%s: message %s dropped (%s)", mq.destination, env.message.message_id, reason,
                     extra=COUNTED)  # a flood of them: counted lines in the service log

    def browsable(self, queue: Queue) -> None:
        """InvalidDestinationException unless ``queue`` can be browsed now (a browser's
        creation: it fails there, not when first iterated)."""
        with self.lock:
            self._browsed_queue(queue)

    def _browsed_queue(self, queue: Queue) -> MessageQueue:
        if queue.is_temporary:
            mq = self.temporary.get(queue.name)
            if mq is None:
                raise InvalidDestinationException(f"{queue} no longer exists")
            return mq
        return self._queue(queue.name)

    def browse(self, queue: Queue, selector: Selector | None) -> Iterator[Message]:
        """The queue's waiting messages: those in memory (a snapshot taken now), then
        the paged-out ones, read a chunk at a time as the caller iterates."""
        with self.lock:
            mq = self._browsed_queue(queue)
            now = now_ms()
            window = [_browsed(env) for env in mq.browse()
                      if not env.expired(now) and (selector is None or selector.matches(env.message))]
            after = mq.high
        return self._browse(mq, selector, window, after)

    def _browse(self, mq: MessageQueue, selector: Selector | None, window: list[Message],
                after: int) -> Iterator[Message]:
        yield from window
        while True:
            with self.lock:
                if mq.deleted or self.closed:
                    return
                envs, last = mq.browse_paged(after, mq.window)
                now = now_ms()
                chunk = [_browsed(env) for env in envs if not env.expired(now)
                         and (selector is None or selector.matches(env.message))]
            if last is None:
                return
            after = last
            yield from chunk

    # --- consumers and subscriptions -------------------------------------------------------------
    def compile_selector(self, text: str | None) -> Selector | None:
        """A new consumer's or browser's selector, once its size is within
        imq.selector.max_size (the cost of compiling it is bounded in jms.selector)."""
        check_size(text, self.max_selector_size, "imq.selector.max_size")
        return compile_selector(text)

    def queue_for_consumer(self, consumer: Any, dest: Destination, selector: str | None,
                           no_local: bool) -> MessageQueue:
        """The message queue a new consumer reads (a new one for a topic subscriber)."""
        with self.lock:
            if dest.is_temporary:
                tmq = self.temporary.get(dest.name)
                if tmq is None:
                    raise InvalidDestinationException(f"{dest} no longer exists")
                if tmq.owner is not consumer.connection:
                    raise InvalidDestinationException(
                        f"{dest} belongs to another connection; only its creator may consume from it")
            if not dest.is_topic:
                mq = self.temporary[dest.name] if dest.is_temporary else self._queue(dest.name)
            else:
                if not dest.is_temporary and dest.name not in self.known_topics:
                    if not self.autocreate_topic and f"t:{dest.name}" not in self.configured:
                        raise InvalidDestinationException(f"topic {dest.name!r} does not exist and auto-create is off")
                    self._know_topic(dest)
                mq = self._pages(MessageQueue(
                    f"sub:{id(consumer)}", dest, durable=False,
                    limits=self.configured.get(f"t:{dest.name}", UNLIMITED),
                    owner=consumer.connection, selector=self.compile_selector(selector),
                    no_local=no_local, topic=dest, usage=self.usage))
                self.topics.setdefault(dest.name, []).append(mq)
            mq.consumers.append(consumer)
            return mq

    def durable_queue(self, consumer: Any, topic: Topic, name: str, selector: str | None,
                      no_local: bool, locked: bool = False) -> MessageQueue:
        """The durable subscription's queue (created or changed as the subscriber says);
        ``locked``: the caller holds the lock."""
        client_id = consumer.connection.client_id_value
        if client_id is None:
            raise IllegalStateException("a durable subscription needs the connection's client id to be set")
        if topic.is_temporary:
            raise InvalidDestinationException("a durable subscription cannot be made on a temporary topic")
        self.reservations.check_durable(consumer.connection, client_id, name, "subscribe to")
        compiled = self.compile_selector(selector)
        with _NULL if locked else self.lock:
            sub = self.durable.get((client_id, name))
            owner: str | None = owner_name(consumer.connection)
            if sub is not None:
                owner = self._check_owner(consumer.connection, sub, "subscribe to")
            if sub is not None and sub.active is not None:
                raise IllegalStateException(
                    f"durable subscription {name!r} of client {client_id!r} already has an active subscriber")
            if sub is not None and (sub.topic != topic or sub.selector != selector or sub.no_local != no_local):
                self._drop_subscription(sub)
                sub = None
            if sub is None:  # (changed: it keeps its owner)
                if topic.name not in self.known_topics and f"t:{topic.name}" not in self.configured:
                    check_name(topic)
                sub = self._make_subscription(client_id, name, topic, selector, no_local, persist=True,
                                              compiled=compiled, owner=owner)
            sub.active = consumer
            sub.queue.consumers.append(consumer)
            self.known_topics.add(topic.name)
            return sub.queue

    def group_queue(self, consumer: Any, dest: Destination, selector: str | None,
                    durable_name: str | None, group: str) -> MessageQueue:
        """The message queue of one consumer of a connection consumer (``group``: its id;
        it has a consumer in each server session it loads). A queue destination: the
        queue. A topic: one subscription shared by the group's consumers, so each message
        reaches one session: the durable subscription ``durable_name``, or a non-durable
        one that lives while the group has consumers."""
        consumer.group = group
        if not dest.is_topic:
            return self.queue_for_consumer(consumer, dest, selector, False)
        if dest.is_temporary or not isinstance(dest, Topic):
            raise InvalidDestinationException(f"a connection consumer cannot listen to {dest}")
        with self.lock:
            if durable_name is not None:
                sub = self.durable.get((consumer.connection.client_id_value, durable_name))
                if sub is not None and sub.active is not None and sub.active.group == group:
                    sub.queue.consumers.append(consumer)
                    return sub.queue
                return self.durable_queue(consumer, dest, durable_name, selector, False, locked=True)
            for mq in self.topics.get(dest.name, ()):
                if mq.key == f"cc:{group}":
                    mq.consumers.append(consumer)
                    return mq
            if dest.name not in self.known_topics:
                if not self.autocreate_topic and f"t:{dest.name}" not in self.configured:
                    raise InvalidDestinationException(f"topic {dest.name!r} does not exist and auto-create is off")
                self._know_topic(dest)
            mq = self._pages(MessageQueue(
                f"cc:{group}", dest, durable=False, limits=self.configured.get(f"t:{dest.name}", UNLIMITED),
                owner=consumer.connection, selector=self.compile_selector(selector), topic=dest,
                usage=self.usage))
            self.topics.setdefault(dest.name, []).append(mq)
            mq.consumers.append(consumer)
            return mq

    def _check_owner(self, connection: Any, sub: Subscription, action: str) -> str | None:
        """JMSSecurityException unless ``connection`` may ``action`` ``sub`` (owners.py; lock
        held); an unowned one it attaches to becomes its user's. Returns the owner."""
        claimed = self.owners.check(connection, sub.client_id, sub.name, sub.owner, action,
                                    self.reservations.is_service(connection))
        if claimed is not None:
            sub.owner = claimed
            if self.store is not None:
                self.store.op("sub_put", sub.client_id, sub.name, sub.topic.name, sub.selector,
                              int(sub.no_local), claimed)
        return sub.owner

    def _make_subscription(self, client_id: str, name: str, topic: Topic, selector: str | None,
                           no_local: bool, persist: bool, compiled: Selector | None = None,
                           owner: str | None = None) -> Subscription:
        key = f"d:{client_id}\0{name}"
        mq = self._pages(MessageQueue(
            key, topic, durable=True,
            limits=self.configured.get(f"t:{topic.name}", self.default_limits),
            selector=compiled if compiled is not None else compile_selector(selector),
            no_local=no_local, topic=topic, usage=self.usage))
        sub = Subscription(client_id, name, topic, selector, no_local, mq, owner=owner)
        self.durable[(client_id, name)] = sub
        self.topics.setdefault(topic.name, []).append(mq)
        if persist and self.store is not None:
            self.store.op("sub_put", client_id, name, topic.name, selector, int(no_local), owner)
        return sub

    def _drop_subscription(self, sub: Subscription) -> None:
        mq = sub.queue
        del self.durable[(sub.client_id, sub.name)]
        subs = self.topics.get(sub.topic.name, [])
        if mq in subs:
            subs.remove(mq)
        mq.deleted = True
        _release_all(mq)
        if self.store is not None:
            self.store.op("purge", mq.key, next(self._seq))
            self.store.op("sub_del", sub.client_id, sub.name)

    def unsubscribe(self, connection: Any, name: str) -> None:
        client_id = connection.client_id_value
        if client_id is None:
            raise IllegalStateException("unsubscribe needs the connection's client id to be set")
        self.reservations.check_durable(connection, client_id, name, "unsubscribe")
        with self.lock:
            sub = self.durable.get((client_id, name))
            if sub is None:
                raise InvalidDestinationException(f"no durable subscription {name!r} for client {client_id!r}")
            self._check_owner(connection, sub, "unsubscribe")
            if sub.active is not None:
                raise IllegalStateException(f"durable subscription {name!r} has an active subscriber")
            if any(env.owner is not None for env in _owned(sub.queue, self)):
                raise IllegalStateException(f"durable subscription {name!r} has unacknowledged messages")
            self._drop_subscription(sub)
            ticket = self.store.ticket() if self.store is not None else None
        self.wait_durable(ticket)

    def remove_consumer(self, consumer: Any) -> None:
        with self.lock:
            mq: MessageQueue = consumer.queue
            if consumer in mq.consumers:
                mq.consumers.remove(consumer)
            if consumer in mq.waiters:
                mq.waiters.remove(consumer)
            if not mq.consumers:
                mq.unpace()  # nobody left to pace its producers to
            consumer.cond.notify_all()
            if len(mq):  # it may have been woken for a message it will now never take
                mq.wake(None)
            if mq.topic is not None and (mq.key.startswith("sub:")
                                         or (mq.key.startswith("cc:") and not mq.consumers)):
                subs = self.topics.get(mq.topic.name, [])
                if mq in subs:
                    subs.remove(mq)
                mq.deleted = True
                _release_all(mq)
            for sub in self.durable.values():
                if sub.active is consumer:  # a connection consumer's next one, or none
                    sub.active = sub.queue.consumers[0] if sub.queue.consumers else None

    def wake_connection(self, connection: Any) -> None:
        """Connection started or closed: let its waiting consumers look again."""
        with self.lock:
            for consumer in connection.consumers():
                consumer.cond.notify_all()
                if consumer.queue is not None and len(consumer.queue):
                    consumer.queue.wake(None)

    # --- transactions -----------------------------------------------------------------------------
    def commit(self, work: Work) -> int | None:
        """Apply a local transaction atomically; the store ticket that makes it durable."""
        with self.lock:
            if self.closed:
                raise IllegalStateException("the broker is closed")
            try:
                return self._commit_work(work)
            except JMSException as exc:  # a destination refused a send: nothing was applied
                self._rollback_locked(work)
                raise TransactionRolledBackException(
                    f"the transaction was rolled back: {exc}") from exc

    def _commit_work(self, work: Work) -> int | None:
        envs = self._route_all(work.sends)
        self._admit(envs)
        with self.store.lock if self.store is not None else _NULL:
            self._commit_envelopes(envs)
            self._ack(work.acks)
        work.sends, work.acks = [], []
        return self.store.ticket() if self.store is not None else None

    def acknowledge_work(self, work: Work, env: Envelope | None = None,
                         oldest: int | None = None) -> int | None:
        """CLIENT_ACKNOWLEDGE (everything delivered; ``oldest``: only that many of the
        oldest, in delivery order) or INDIVIDUAL (just ``env``); the store ticket that makes
        the removal durable, when a stored message was acknowledged: a consumer that waits
        for it is not handed an acknowledged message again after a crash (a bridge link
        would copy it twice)."""
        with self.lock:
            if oldest is not None:
                acks, work.acks = work.acks[:oldest], work.acks[oldest:]
            elif env is None:
                acks, work.acks = work.acks, []
            elif env in work.acks:
                work.acks.remove(env)
                acks = [env]
            else:
                return None
            self._ack(acks)
            if self.store is not None and any(e.stored for e in acks):
                return self.store.ticket()
        return None

    def rollback(self, work: Work) -> None:
        with self.lock:
            self._rollback_locked(work)

    def _rollback_locked(self, work: Work) -> None:
        acks, work.sends, work.acks = work.acks, [], []
        for env in acks:
            env.owner = None
        self._redeliver(acks)

    # --- XA -------------------------------------------------------------------------------------------
    def xa_start(self, session: Any, xid: Xid, flags: int) -> Work:
        with self.lock:
            work = self.branches.get(xid)
            if flags & (xa.TMJOIN | xa.TMRESUME):
                if work is None:
                    raise XAException(f"start: unknown branch {xid}", xa.XAER_NOTA)
                self._xa_check(work, "join", "start(TMJOIN/TMRESUME)")
            elif flags == xa.TMNOFLAGS:
                if work is not None:
                    raise XAException(f"start: branch {xid} already exists", xa.XAER_DUPID)
                work = Work(xid, WorkState.ACTIVE, session.connection)
                self.branches[xid] = work
            else:
                raise XAException(f"start: invalid flags {flags:#x}", xa.XAER_INVAL)
            work.state = WorkState.ACTIVE
            work.sessions.add(session)
            return work

    def xa_end(self, session: Any, xid: Xid, flags: int) -> None:
        with self.lock:
            work = self._branch(xid, "end")
            if session not in work.sessions:
                raise XAException(f"end: branch {xid} is not associated with this session", xa.XAER_PROTO)
            self._xa_check(work, "end", "end")
            work.sessions.discard(session)
            if flags & xa.TMFAIL:
                work.state = WorkState.ROLLBACK_ONLY
            elif flags & xa.TMSUSPEND or work.sessions:
                work.state = WorkState.ACTIVE if work.sessions else WorkState.IDLE
            elif flags & xa.TMSUCCESS:
                work.state = WorkState.IDLE
            else:
                raise XAException(f"end: invalid flags {flags:#x}", xa.XAER_INVAL)

    def xa_prepare(self, xid: Xid) -> int:
        with self.lock:
            work = self._branch(xid, "prepare")
            self._xa_check(work, "prepare", "prepare")
            if work.state is WorkState.ROLLBACK_ONLY:
                self._xa_forget_rollback(work)
                raise XAException(f"prepare: branch {xid} was marked rollback-only and is rolled back",
                                  xa.XA_RBROLLBACK)
            if work.empty:
                del self.branches[xid]
                work.state = WorkState.DONE
                return xa.XA_RDONLY
            try:
                if self.store is not None:
                    self.store.check_room()  # a prepared branch is written: it needs room
                envs = self._route_all(work.sends)
            except JMSException as exc:
                self._xa_forget_rollback(work)
                raise XAException(f"prepare: branch {xid} cannot be prepared and is rolled back: {exc}",
                                  xa.XAER_RMFAIL if isinstance(exc, StoreUnavailable)
                                  else xa.XA_RBROLLBACK) from exc
            work.sends = []
            work.prepared_sends = envs
            work.state = WorkState.PREPARED
            ticket = None
            if self.store is not None:
                sends: list[tuple[int, str, bytes]] = []
                for env in envs:
                    if env.stored:
                        assert env.blob is not None  # a send not written yet: encoded
                        sends.append((env.seq, env.queue.key, env.blob))
                        env.blob = None
                self.store.prepare_xa(str(xid), sends, [e.seq for e in work.acks if e.stored], waited=True)
                ticket = self.store.ticket()
        self._xa_durable("prepare", ticket)
        return xa.XA_OK

    def xa_commit(self, xid: Xid, one_phase: bool, wait: bool = True) -> int | None:
        """Commit branch ``xid``; returns the store ticket that makes it durable, waited
        for here (xa_commit_written) unless ``wait`` is false (the caller waits later). A
        branch committed already whose commit is not written yet is waited for again."""
        with self.lock:
            ticket = self.committing.get(xid)
            if ticket is None:
                ticket = self._xa_commit(xid, one_phase)
        if wait:
            self.xa_commit_written(xid, ticket)
        return ticket

    def xa_commit_written(self, xid: Xid, ticket: int | None) -> None:
        """Wait until the store wrote the commit of branch ``xid`` (``ticket``); it stays in
        doubt until then (XAER_RMFAIL while the store cannot write)."""
        self._xa_durable("commit", ticket)
        if ticket is not None:
            with self.lock:
                if self.committing.get(xid) == ticket:
                    del self.committing[xid]

    def _xa_commit(self, xid: Xid, one_phase: bool) -> int | None:
        """xa_commit's work in memory, under the lock: the store ticket that writes it."""
        work = self._branch(xid, "commit")
        self._xa_check(work, "commit_one_phase" if one_phase else "commit_two_phase", "commit")
        if one_phase and work.state is WorkState.ROLLBACK_ONLY:
            self._xa_forget_rollback(work)
            raise XAException(f"commit: branch {xid} was marked rollback-only and is rolled back",
                              xa.XA_RBROLLBACK)
        del self.branches[xid]
        work.state = WorkState.DONE
        if one_phase:
            try:
                ticket = self._commit_work(work)
            except JMSException as exc:
                self._xa_forget_rollback(work)
                raise XAException(f"commit: branch {xid} was rolled back: {exc}", xa.XA_RBROLLBACK) from exc
        else:
            with self.store.lock if self.store is not None else _NULL:
                if self.store is not None:
                    self.store.op("xa_commit", str(xid), waited=True)  # moves the prepared rows
                for env in work.prepared_sends:  # their room was taken at prepare
                    if not env.queue.deleted:
                        env.queue.push(env)
                for env in work.acks:
                    env.owner = None
                    env.queue.release(env)
            ticket = self.store.ticket() if self.store is not None else None
            if ticket is not None:
                self.committing[xid] = ticket
        return ticket

    def xa_rollback(self, xid: Xid) -> None:
        with self.lock:
            if xid in self.committing:
                raise XAException(f"rollback: branch {xid} is committed (its commit is being "
                                  "written)", xa.XA_HEURCOM)
            work = self._branch(xid, "rollback")
            self._xa_check(work, "rollback", "rollback")
            prepared = work.state is WorkState.PREPARED
            self._xa_forget_rollback(work)
            ticket = None
            if prepared and self.store is not None:
                self.store.op("xa_rollback", str(xid), waited=True)
                ticket = self.store.ticket()
        self.wait_durable(ticket)

    def _xa_forget_rollback(self, work: Work) -> None:
        if work.xid is not None:  # always, for a branch
            self.branches.pop(work.xid, None)
        work.state = WorkState.DONE
        self._unroute(work.prepared_sends)
        acks, work.acks, work.sends, work.prepared_sends = work.acks, [], [], []
        for env in acks:
            env.owner = None
        self._redeliver(acks)

    def xa_recover(self) -> list[Xid]:
        with self.lock:
            return [*(xid for xid, w in self.branches.items() if w.state is WorkState.PREPARED),
                    *self.committing]

    def xa_forget(self, xid: Xid) -> None:
        with self.lock:
            if xid not in self.branches:
                raise XAException(f"forget: unknown branch {xid}", xa.XAER_NOTA)
            raise XAException(f"forget: branch {xid} has no heuristic outcome to forget", xa.XAER_PROTO)

    def xa_abandon(self, session: Any) -> None:
        """A session closed: branches it was still associated with fail (rollback-only)."""
        with self.lock:
            for work in list(self.branches.values()):
                if session in work.sessions:
                    work.sessions.discard(session)
                    if not work.sessions and work.state is WorkState.ACTIVE:
                        work.state = WorkState.ROLLBACK_ONLY

    def _branch(self, xid: Xid, call: str) -> Work:
        work = self.branches.get(xid)
        if work is None:
            raise XAException(f"{call}: unknown branch {xid}", xa.XAER_NOTA)
        return work

    @staticmethod
    def _xa_check(work: Work, what: str, call: str) -> None:
        if work.state not in _XA_ALLOWED[what]:
            raise XAException(f"{call}: not allowed while branch {work.xid} is {work.state.value}", xa.XAER_PROTO)

    # --- closing ----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop: break every connection, write what is pending, close the store."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            conns = list(self.connections)
        for conn in conns:
            conn.broker_closed()
        with self.lock:
            for mq in list(self.queues.values()) + list(self.temporary.values()):
                mq.wake_all()
                mq.wake_producers()
            for subs in self.topics.values():
                for mq in subs:
                    mq.wake_all()
                    mq.wake_producers()
        if self.memory is not None:
            self.memory.close()
        if self.store is not None:
            self.store.close()
        if self.swap is not None:
            with self.lock:
                self.swap.close()

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NULL = _Null()


def _same_origin(sub: MessageQueue, sender: Any) -> bool:
    """no_local: did the subscriber's own connection (or client id, when durable) publish it?"""
    if sub.owner is not None:
        return sub.owner is sender
    client_id = getattr(sender, "client_id_value", None)
    return client_id is not None and sub.key.startswith(f"d:{client_id}\0")


def _release_all(mq: MessageQueue) -> None:
    """A queue goes away: forget what waits in it (its counts, the system's), and let its
    held producers find out."""
    for env in mq.drain():
        mq.release(env)
    mq.wake_producers()


def _browsed(env: Envelope) -> Message:
    """A browser's read-only copy of a waiting message."""
    msg = env.message.copy()
    msg.delivery_count = env.dcount
    msg.redelivered = env.dcount > 0
    msg.set_read_only()
    return msg


def _owned(mq: MessageQueue, broker: Broker) -> list[Envelope]:
    """Envelopes of ``mq`` held unacknowledged by sessions or branches."""
    out: list[Envelope] = []
    for conn in broker.connections:
        for session in conn.sessions_list():
            out.extend(e for e in session.unacked() if e.queue is mq)
    for work in broker.branches.values():
        out.extend(e for e in work.acks if e.queue is mq)
    return out


def _limits_to_json(limits: DestinationLimits) -> str:
    import json
    data = asdict(limits)
    data["limit_behavior"] = limits.limit_behavior.value
    return json.dumps(data)


def _limits_from_json(data: dict[str, Any]) -> DestinationLimits:
    return DestinationLimits(**{**data, "limit_behavior": LimitBehavior(data["limit_behavior"])})
