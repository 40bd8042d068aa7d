"""The embedded host broker: the ``Broker`` facade over its parts, all under one lock.

Producers route a snapshot of each message into the :class:`MessageQueue` s it belongs to
(a queue, or every matching subscription of a topic) as :class:`Envelope` s; consumers
take them out under the same lock and acknowledge them at once or hold them in their
session's :class:`Work` until acknowledge, commit, rollback or close. Persistent messages
on durable queues get a row in the :class:`Store`; a transaction's sends and acks go to
the store in one batch, so they land together or not at all.

The parts, each a mixin in a module of its own (``Broker``'s docstring says which state
each owns): paging.py, destinations.py, routing.py, delivery.py, localtx.py,
xabranches.py and adoption.py; state.py names the state and the records they share.

Design notes: docs/embedded-broker.md#internals-providersembeddedbrokerpy.
"""

from __future__ import annotations

import collections
import itertools
import threading
import uuid
from pathlib import Path
from typing import Any

from ...jms.errors import IllegalStateException, InvalidClientIDException, JMSSecurityException
from ...jms.selector import MAX_SIZE as SELECTOR_MAX_SIZE
from .adoption import Adoption
from .destinations import DMQ_NAME
from .memory import MemoryConfig, MemoryMonitor
from .owners import DurableOwners
from .queues import UNLIMITED, WINDOW, DestinationLimits, Envelope, LimitBehavior, SystemUsage
from .reserve import Reservations
from .state import PERSISTENT, Authenticator, Sent, Subscription, Work, WorkState, now_ms
from .store import Database, Store
from .swap import Swap
from .xabranches import XABranches

__all__ = [
    "DMQ_NAME",
    "PERSISTENT",
    "Authenticator",
    "Broker",
    "DestinationLimits",
    "Envelope",
    "LimitBehavior",
    "Sent",
    "Subscription",
    "Work",
    "WorkState",
    "now_ms",
]


class Broker(XABranches, Adoption):
    """An in-process JMS broker; thread-safe; persistent when given a directory.

    The facade: its methods are its parts' (mixins), all under the one ``lock`` (taken
    before the store's ``Store.lock``, never after; waits for the store outside it).
    Who owns (changes) which state:

    - broker.py: settings, ``connections`` (and their ids), ``client_ids``, ``closed``, ``store``,
      ``swap``, ``memory``, the message ids; attach, detach, close.
    - paging.py: ``memory_window``; which queues page (their ``pager`` and ``window``),
      the queues' ``swapped`` counts.
    - destinations.py: ``queues``, ``topics``, ``known_topics``, ``durable``,
      ``temporary``, ``configured`` (limits), ``producers``, ``dmq``; queues'
      ``consumers`` and ``deleted``; subscription rows, purges.
    - dstcontrol.py: ``paused`` and ``paused_producers``; destroys.
    - routing.py: ``_seq`` (each envelope's seq), the envelopes going into queues, their
      room (``usage``, queues' counts and bytes), queues' room and pace waiters; message
      rows added to the store.
    - delivery.py: envelopes leaving queues and coming back, queues' ``waiters`` and
      ``last_take``, delivery counts; message rows removed from the store.
    - localtx.py: a session's :class:`Work` (its ``sends`` and ``acks``).
    - xabranches.py: ``branches`` and ``committing``, XA rows in the store.
    - adoption.py: what the store holds at open and after an HA takeover (``_seq``
      moved past the adopted rows).
    """

    provider_name = "imqbridge embedded broker"

    def __init__(
        self,
        data_dir: str | Path | None = None,
        *,
        sync: bool = False,
        instance_name: str = "imqbroker",
        limits: DestinationLimits = UNLIMITED,
        autocreate_queue: bool = True,
        autocreate_topic: bool = True,
        authenticator: Authenticator | None = None,
        database: Database | None = None,
        system: SystemUsage | None = None,
        max_message_size: int = -1,
        max_selector_size: int = SELECTOR_MAX_SIZE,
        memory: MemoryConfig | None = None,
        memory_window: int = WINDOW,
        swap_dir: str | Path | None = None,
    ) -> None:
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
        self.rm_id = uuid.uuid4().hex  # is_same_rm: same broker, same store
        self._id_prefix = f"ID:{uuid.uuid4().hex[:12]}-"
        self._ids = itertools.count(1)
        self.queues = {}
        self.topics = {}  # topic name -> subscription queues
        self.known_topics = set()
        self.durable = {}
        self.temporary = {}
        self.temp_home = instance_name
        self.proxies = {}
        self.cluster_durables = None
        self.remote_temporary = None
        self.remote_durable = None
        self.connections = set()
        self.producers = collections.Counter()  # (metrics)
        self.paused = {}
        self.paused_producers = {}
        self._connection_ids = itertools.count(1)
        self.client_ids = {}
        self.reservations = Reservations()  # the bridge service's client ids and durables
        self.owners = DurableOwners()  # who may attach to or remove a durable subscription
        self.branches = {}
        # Two-phase commits made in memory that the store has not written yet (xid -> the
        # store ticket that writes it): still in doubt for xa_recover(), so a coordinator
        # keeps its decision until they are written (a crash before would bring the branch
        # back prepared, and with no decision left, rolled back).
        self.committing = {}
        self.configured = {}
        self.usage = system if system is not None else SystemUsage()
        self.max_message_size = max_message_size
        self.max_selector_size = max_selector_size
        self.memory = MemoryMonitor(memory) if memory is not None else None
        self.store = (
            Store(self.data_dir, sync=sync, database=database)
            if self.data_dir is not None or database is not None
            else None
        )
        swap_dir = swap_dir if swap_dir is not None else self.data_dir
        self.swap = Swap(swap_dir) if swap_dir is not None else None
        self._seq = itertools.count(1)
        if self.store is not None:
            self._recover()
        self.dmq = self._queue(DMQ_NAME, create=True)

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
            connection.connection_id = next(self._connection_ids)
            self.connections.add(connection)

    def connection_list(self) -> list[dict[str, Any]]:
        """Every open connection, by id (imqcmd list cxn): its user, the service it came
        in through (jms, stomp, bridge: the bridges' own, embedded: other in-process
        ones), the client's address, client id, producers and consumers."""
        with self.lock:
            conns = sorted(self.connections, key=lambda c: c.connection_id)
            return [
                {
                    "id": conn.connection_id,
                    "user": conn.username,
                    "service": conn.origin_service,
                    "host": conn.origin_host,
                    "client_id": conn.client_id_value,
                    "producers": sum(s.producer_count() for s in conn.sessions_list()),
                    "consumers": sum(1 for _ in conn.consumers()),
                }
                for conn in conns
            ]

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

    @property
    def sync(self) -> bool:
        return self.store is not None and self.store.sync

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
            for key in list(self.paused_producers):
                self._release_paused(key)
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
