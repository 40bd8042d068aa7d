"""The embedded broker's state and the records its parts share (broker.py, the facade).

``BrokerState`` names every attribute of a :class:`Broker` (made in ``Broker.__init__``)
and which part owns it; the parts (paging, destinations, dstcontrol, routing, delivery, localtx,
xabranches, adoption) are mixins over it, each a layer over the ones before, so every
part reads and changes the same state under the one lock, ``lock``.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from ...jms.destination import Destination, Topic
from ...jms.message import DeliveryMode, Message
from ...jms.xa import Xid
from .memory import MemoryMonitor
from .owners import DurableOwners
from .queues import DestinationLimits, Envelope, MessageQueue, SystemUsage
from .reserve import Reservations
from .store import Store
from .swap import Swap

PERSISTENT = int(DeliveryMode.PERSISTENT)

# The broker's one logger, whichever part of it logs (log lines keep their name).
log = logging.getLogger(__name__.rpartition(".")[0] + ".broker")

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
    LOCAL = "LOCAL"  # a local transaction or a CLIENT_ACKNOWLEDGE session
    ACTIVE = "ACTIVE"  # XA: associated with a session (start)
    IDLE = "IDLE"  # XA: ended, may be prepared or committed
    ROLLBACK_ONLY = "ROLLBACK_ONLY"  # XA: ended with TMFAIL
    PREPARED = "PREPARED"  # XA: prepared, durable, in doubt until commit/rollback
    DONE = "DONE"


class Work:
    """Messages a session consumed and sent but has not completed (tx or XA branch)."""

    __slots__ = ("acks", "connection", "prepared_sends", "sends", "sessions", "state", "xid")

    def __init__(self, xid: Xid | None = None, state: WorkState = WorkState.LOCAL, connection: Any = None) -> None:
        self.xid = xid
        self.connection = connection  # XA: the connection that started the branch
        self.state = state
        # (snapshot, dest, connection, the blob a remote client sent or None)
        self.sends: list[tuple[Message, Destination, Any, bytes | None]] = []
        self.acks: list[Envelope] = []
        self.prepared_sends: list[Envelope] = []  # routed at prepare
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


class BrokerState:
    """Every attribute of a broker, by the part that owns it (changes it; the others
    may read it), all guarded by ``lock`` unless said otherwise. Made in Broker.__init__."""

    # broker.py (the facade): settings, connections, the lock and what lives beside it
    lock: threading.Lock  # the one lock: before Store.lock, never after
    closed: bool
    instance_name: str
    data_dir: Path | None
    authenticator: Authenticator | None
    rm_id: str  # is_same_rm: same broker, same store
    connections: set[Any]
    client_ids: dict[str, Any]
    reservations: Reservations  # the bridge service's client ids and durables (its own lock)
    store: Store | None  # (its own lock, taken after ours)
    swap: Swap | None
    memory: MemoryMonitor | None  # (its own lock)
    _seq: Iterator[int]  # the next envelope's seq (routing; adoption skips some)
    _connection_ids: Iterator[int]  # each attached connection's id (list cxn)
    # paging.py: queues' paging settings
    memory_window: int
    # destinations.py: which queues exist, their limits and bindings
    queues: dict[str, MessageQueue]
    topics: dict[str, list[MessageQueue]]  # topic name -> subscription queues
    known_topics: set[str]
    durable: dict[tuple[str, str], Subscription]
    temporary: dict[str, MessageQueue]
    configured: dict[str, DestinationLimits]
    default_limits: DestinationLimits
    autocreate_queue: bool
    autocreate_topic: bool
    max_selector_size: int
    owners: DurableOwners  # who may attach to or remove a durable subscription
    producers: collections.Counter[Destination]  # (metrics)
    dmq: MessageQueue
    temp_home: str  # the instance a temporary destination's name says (temp.<home>.<id>)
    # clusterdst.py (an HA instance's cluster-wide destinations; empty/None outside one)
    proxies: dict[str, MessageQueue]  # r:/x: keys: messages on their way to another instance
    cluster_durables: list[tuple[str, Subscription]] | None  # durables made or dropped here
    remote_temporary: Callable[[Destination], MessageQueue | None] | None  # another's temp
    remote_durable: Callable[[str, str], str | None] | None  # where a durable's subscriber is
    # dstcontrol.py: pauses (destroy changes destinations.py's attributes too)
    paused: dict[str, str]  # q:NAME / t:NAME -> PRODUCERS, CONSUMERS or ALL (pause dst; memory only)
    paused_producers: dict[str, list[Callable[[], None]]]  # ...the producers a pause holds
    # routing.py: what a send may be
    usage: SystemUsage  # imq.system.max_count/max_size (the queues count into it)
    max_message_size: int
    # xabranches.py: the XA branches
    branches: dict[Xid, Work]
    committing: dict[Xid, int]  # two-phase commits not written yet (xid -> store ticket)

    def wait_durable(self, ticket: int | None) -> None:
        if ticket is not None and self.store is not None:
            self.store.wait(ticket)


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NULL = _Null()


def _release_all(mq: MessageQueue) -> None:
    """A queue goes away: forget what waits in it (its counts, the system's), and let its
    held producers find out."""
    for env in mq.drain():
        mq.release(env)
    mq.wake_producers()


def _owned(mq: MessageQueue, broker: BrokerState) -> list[Envelope]:
    """Envelopes of ``mq`` held unacknowledged by sessions or branches."""
    out: list[Envelope] = []
    for conn in broker.connections:
        for session in conn.sessions_list():
            out.extend(e for e in session.unacked() if e.queue is mq)
    for work in broker.branches.values():
        out.extend(e for e in work.acks if e.queue is mq)
    return out
