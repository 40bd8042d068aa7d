"""The host broker as its front ends see it: one typed interface, built by the service.

Every front end of the host broker (the STOMP bridge, the JMS bridges, the Spark jobs, the
demo) gets this HostBroker from service.py instead of importing the broker. Two ways in:
the provider SPI (connection_factory(): the service's own, trusted connections, for which
the bridges' client ids and durables are reserved) and a data path for front ends whose
acknowledgement model is not a JMS session's (STOMP): connect, subscribe, opaque Delivery
handles, local Transactions, send_many. Destination admin and where the store is are part
of it too.

Rules: every data-path call names the Principal it is made for, so authorization is checked
once, here, for every front end; handles (Client, Consumer, Delivery, Transaction) are the
implementation's own objects, which a front end only passes back.

Design notes: docs/architecture.md#internals-jmshostbrokerpy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .destination import Destination
from .errors import JMSException
from .message import Message
from .spi import XAConnectionFactory

Ticket = object | None  # what wait_durable waits for (the broker's own); None: nothing to wait for


@dataclass(frozen=True)
class Principal:
    """Who a call is made for: the authenticated user, their groups (from the user
    repository), where they connect from, and the connection service they came in
    through (jms, stomp: its access control rules apply; None: the broker-wide ones)."""

    user: str | None
    groups: frozenset[str] = frozenset()
    address: str | None = None
    service: str | None = None


@dataclass(frozen=True)
class DestinationAttributes:
    """A physical destination's limits (the broker chapter's; -1 means unlimited) and
    its poison message handling (backout threshold, queue and disposition)."""

    max_num_msgs: int = -1
    max_total_msg_bytes: int = -1
    max_bytes_per_msg: int = -1
    limit_behavior: str = "REJECT_NEWEST"  # FLOW_CONTROL, REMOVE_OLDEST, REMOVE_LOW_PRIORITY: when full
    use_dmq: bool = True  # a message dropped by a limit goes to the DMQ
    backout_threshold: int = 0  # deliveries without an acknowledgement before a backout; 0: off
    backout_queue: str = ""  # where a message at the threshold goes ("": none)
    backout_disposition: str = "dmq"  # else: dmq or discard (also unwanted messages, retention off)
    local_delivery_preferred: bool = False  # HA cluster: to other instances only without local consumers
    is_local_only: bool = False  # HA cluster: never to consumers on other instances
    max_num_producers: int = 100  # producers of the destination (per instance); -1: unlimited
    max_num_active_consumers: int = -1  # a queue's consumers that receive at once
    max_num_backup_consumers: int = 0  # a queue's consumers beyond those, waiting to take over
    consumer_flow_limit: int = 1000  # messages delivered ahead to one consumer; -1: unlimited


class Client(Protocol):
    """An open client of the host broker (connection-scoped state: client id, temporaries)."""

    @property
    def client_id(self) -> str | None: ...


class Consumer(Protocol):
    """A subscription of a client: receive() takes deliveries for it."""

    @property
    def destination(self) -> Destination: ...


class Delivery(Protocol):
    """One message taken for a consumer, until it is acknowledged or redelivered."""

    @property
    def message(self) -> Message: ...  # the broker's snapshot: read it, never change it

    @property
    def delivery_count(self) -> int: ...  # 1 the first time


class Transaction(Protocol):
    """A local transaction: sends and acknowledgements that commit applies together."""


class HostBroker(ABC):
    """The host broker, for one service's front ends (thread-safe)."""

    @property
    @abstractmethod
    def instance_name(self) -> str: ...

    @abstractmethod
    def store_location(self) -> str | None:
        """Where the host broker keeps its messages (a file, a database), as its errors
        name it; None when it keeps them in memory only."""

    def store_behind(self) -> bool:
        """Is the store's writer far behind the senders? A front end then waits for each
        send's ticket before it reads on, receipt or not, so a flood waits on the disk."""
        return False

    # --- the provider SPI ---------------------------------------------------------------
    @abstractmethod
    def connection_factory(self) -> XAConnectionFactory:
        """Connections (and XA sessions) to the host broker, for the bridges, jobs and
        tools of this process: the service itself, trusted, so no access control applies
        (users' clients come in through a connection service and the data path below)."""

    @abstractmethod
    def reserve(self, owner: str, client_ids: Iterable[str], durables: Iterable[tuple[str, str]]) -> None:
        """Keep ``client_ids`` and the durable subscriptions (client id, name) for the
        bridge service while bridge ``owner`` is loaded (replacing what it kept before): a
        connection not from connection_factory() that sets, subscribes or unsubscribes one
        gets JMSSecurityException."""

    @abstractmethod
    def release(self, owner: str) -> None:
        """Bridge ``owner`` is unloaded: what it reserved is free again."""

    @abstractmethod
    def txlog_sql(self) -> tuple[Callable[[], Any], str] | None:
        """The database of the host broker's jdbc store (a DB-API connect function and its
        paramstyle), where the bridges keep their XA logs; None for another store."""

    # --- clients and subscriptions --------------------------------------------------------------
    @abstractmethod
    def connect(self, principal: Principal, client_id: str | None = None) -> Client:
        """A client; JMSException when ``client_id`` is in use."""

    @abstractmethod
    def disconnect(self, principal: Principal, client: Client) -> None:
        """Close ``client`` and its consumers; what they hold unacknowledged comes back."""

    @abstractmethod
    def create_temporary(self, principal: Principal, client: Client, topic: bool) -> Destination: ...

    @abstractmethod
    def subscribe(
        self,
        principal: Principal,
        client: Client,
        destination: Destination,
        selector: str | None = None,
        durable_name: str | None = None,
        no_local: bool = False,
    ) -> Consumer:
        """JMSException for a bad selector or destination, or a durable name in use."""

    @abstractmethod
    def receive(self, principal: Principal, consumer: Consumer, timeout: float | None) -> Delivery | None:
        """Blocking: the next delivery, waiting up to ``timeout`` seconds (None: until the
        consumer is closed); None when there is none."""

    def consumer_flow_limit(self, principal: Principal, consumer: Consumer) -> int:
        """The most deliveries ``consumer`` may hold unacknowledged, by its destination's
        consumerFlowLimit; -1: no bound."""
        return -1

    def receive_many(
        self, principal: Principal, consumer: Consumer, max_messages: int, timeout: float | None, max_bytes: int = 0
    ) -> list[Delivery]:
        """Blocking: up to ``max_messages`` deliveries, each as receive() would give it:
        waits up to ``timeout`` for the first (as receive), then takes only those ready,
        stopping once their bodies reach ``max_bytes`` (0: no byte bound); [] when there
        is none. An implementation takes them in one step where that is cheaper."""
        first = self.receive(principal, consumer, timeout)
        if first is None:
            return []
        deliveries = [first]
        size = first.message.body_size()
        while len(deliveries) < max_messages and not (max_bytes and size >= max_bytes):
            more = self.receive(principal, consumer, 0)
            if more is None:
                break
            deliveries.append(more)
            size += more.message.body_size()
        return deliveries

    @abstractmethod
    def close_consumer(self, principal: Principal, consumer: Consumer) -> None:
        """Stop ``consumer`` (a receive() under way returns None)."""

    @abstractmethod
    def unsubscribe(self, principal: Principal, client: Client, name: str) -> None:
        """Blocking: delete the durable subscription ``name`` of the client's client id."""

    # --- the data path ------------------------------------------------------------------------------
    @abstractmethod
    def send(
        self,
        principal: Principal,
        client: Client,
        message: Message,
        destination: Destination,
        transaction: Transaction | None = None,
    ) -> Ticket:
        """Stamp and route ``message`` now, or at commit of ``transaction``; the ticket to
        wait on before confirming a send outside a transaction. ProducerFlowControl: the
        producer must wait (a full FLOW_CONTROL destination, the broker's memory state);
        nothing was sent: send again once its ``on_room`` callback has run."""

    def send_many(
        self, principal: Principal, client: Client, sends: Sequence[tuple[Message, Destination]]
    ) -> tuple[Ticket, int, JMSException | None]:
        """send() of each (message, destination) outside a transaction, in order, stopping
        at the first one refused: (the ticket covering those sent; how many were sent; why
        the next was refused, ProducerFlowControl among the reasons: it and those after
        it were not sent; None when all were). An implementation sends them together
        where that is cheaper (one lock, one store call: a STOMP read's SEND frames)."""
        ticket: Ticket = None
        for i, (message, destination) in enumerate(sends):
            try:
                sent = self.send(principal, client, message, destination)
            except JMSException as exc:
                return ticket, i, exc
            if sent is not None:
                ticket = sent
        return ticket, len(sends), None

    @abstractmethod
    def acknowledge(
        self, principal: Principal, deliveries: Sequence[Delivery], transaction: Transaction | None = None
    ) -> None:
        """Consumed for good, now or when ``transaction`` commits (redelivered if it rolls back)."""

    @abstractmethod
    def redeliver(self, principal: Principal, deliveries: Sequence[Delivery]) -> None:
        """Back to their queues, counted as delivered (NACK, a closed subscription, ...)."""

    @abstractmethod
    def begin(self, principal: Principal) -> Transaction: ...

    @abstractmethod
    def commit(self, principal: Principal, transaction: Transaction) -> Ticket:
        """Apply ``transaction`` in one store batch; the ticket that makes it durable."""

    @abstractmethod
    def rollback(self, principal: Principal, transaction: Transaction) -> None: ...

    @abstractmethod
    def wait_durable(self, principal: Principal, ticket: Ticket) -> None:
        """Blocking: until the store has written what ``ticket`` stands for."""

    def write_now(self, principal: Principal, ticket: Ticket) -> bool:
        """Write what ``ticket`` stands for on the calling thread (an event loop's) if
        that cannot block; True when ``wait_durable`` then returns at once, False when it
        must be called where blocking is allowed (the default: always)."""
        return False

    # --- destination admin ------------------------------------------------------------------------------
    @abstractmethod
    def destinations(self, principal: Principal) -> dict[str, dict[str, int]]:
        """Each destination's counts, by ``queue:NAME`` / ``topic:NAME``."""

    @abstractmethod
    def queue_depth(self, principal: Principal, name: str) -> int:
        """Messages of queue ``name`` not yet acknowledged: waiting, or delivered to a consumer
        (a paused link's prefetched ones are still its backlog)."""

    @abstractmethod
    def describe_destination(
        self, principal: Principal, destination: Destination
    ) -> tuple[DestinationAttributes, dict[str, int]] | None:
        """A destination's attributes and counts (pending, unacked, bytes,
        producers_waiting); None when it does not exist."""

    @abstractmethod
    def configure_destination(
        self, principal: Principal, destination: Destination, attributes: DestinationAttributes
    ) -> None:
        """Create ``destination`` with ``attributes``, or give it them (kept in the store);
        JMSException for a temporary destination or a bad limit behavior."""

    @abstractmethod
    def purge_destination(self, principal: Principal, destination: Destination) -> tuple[int, int] | None:
        """Remove the waiting messages of ``destination`` (a topic: of each of its
        subscriptions), in memory and paged out; those delivered and not yet acknowledged
        stay with their consumers. (removed, still in delivery); None when it does not exist."""

    @abstractmethod
    def list_destinations(
        self, principal: Principal, queues: bool = True, topics: bool = True, temporary: bool = False
    ) -> list[tuple[Destination, DestinationAttributes, dict[str, int], str]]:
        """Every queue and topic (``temporary``: the temporary ones too), by name: its
        attributes, counts (describe_destination's, plus producers and consumers; a topic's
        subscriptions and durable_subscriptions) and state (RUNNING, PRODUCERS_PAUSED,
        CONSUMERS_PAUSED, PAUSED)."""

    @abstractmethod
    def destination_state(self, principal: Principal, destination: Destination) -> str:
        """RUNNING, PRODUCERS_PAUSED, CONSUMERS_PAUSED or PAUSED (pause_destinations)."""

    @abstractmethod
    def pause_destinations(
        self, principal: Principal, destination: Destination | None, what: str, pause: bool
    ) -> list[tuple[Destination, str]] | None:
        """Pause or resume (``pause``) ``what`` (PRODUCERS: their sends wait; CONSUMERS:
        nothing is delivered; ALL) of ``destination``, or of every one when None; each
        one's state after, None when it does not exist."""

    @abstractmethod
    def destroy_destination(self, principal: Principal, destination: Destination) -> int | None:
        """Remove ``destination`` with its messages (a topic: its durable subscriptions
        too) and its attributes: how many messages went, None when it does not exist;
        JMSException while it has consumers or messages in delivery."""

    @abstractmethod
    def connections(self, principal: Principal) -> list[dict[str, Any]]:
        """The open connections: id, user, service, host, client_id, producers, consumers."""

    @abstractmethod
    def browse_destination(
        self, principal: Principal, name: str, limit: int, after: str | None = None
    ) -> list[Message] | None:
        """Read-only copies of the first ``limit`` waiting messages of queue ``name``, in
        delivery order (``after``: those after the waiting message with that JMSMessageID;
        IllegalStateException when it is no longer waiting); None when it does not exist."""
