"""The embedded broker as the service's host broker.

EmbeddedHostBroker is the HostBroker interface over one in-process Broker. The SPI side is
the broker's EmbeddedConnectionFactory. The data path uses the broker's own thread-safe
calls: a Client is an EmbeddedConnection (with one session for its consumers and temporary
destinations), a Consumer an EmbeddedConsumer, a Delivery the broker's Envelope (it has the
message and delivery_count a front end reads), and a Transaction a broker Work whose sends
and acknowledgements commit() applies in one store batch. Every call takes the caller's
Principal, and access control (the service's AccessControls, one decision point per
connection service) checks it here: connect (connection access), subscribe (consume), send
(produce), and create for a destination the call would auto-create. Without access controls
(imq.accesscontrol.enabled=false) everything is allowed. The jms service checks with the
same AccessControls. connection_factory() is the bridge service's own (trusted; its
connections may use the client ids and durables reserve() keeps for the bridges); connect()
makes front ends' clients. open_host_broker() is how the service gets one: it builds the
Broker from the broker properties (store kind, fsync, auto-create limits, system limits,
memory states), so the service never names Broker; what only the embedded broker has (its
jms connection service, close) is on EmbeddedHostBroker, not on the interface front ends are
given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from ...accesscontrol import durable_override
from ...jms.destination import Destination, Queue, Topic
from ...jms.errors import JMSException
from ...jms.hostbroker import (
    Client,
    Consumer,
    Delivery,
    DestinationAttributes,
    HostBroker,
    Principal,
    Ticket,
    Transaction,
)
from ...jms.message import Message
from ...jms.spi import XAConnectionFactory
from .broker import Broker, Sent, Work, now_ms
from .client import (
    EmbeddedConnection,
    EmbeddedConnectionFactory,
    EmbeddedConsumer,
    EmbeddedSession,
)
from .memory import STATES, MemoryConfig, default_budget
from .queues import DestinationLimits, Envelope, LimitBehavior, SystemUsage

if TYPE_CHECKING:
    import ssl

    from ...accesscontrol import AccessControls
    from ...guard import ServiceGuard
    from ...netloop import NetLoop
    from ...props import BrokerProperties
    from .clientconn import Authenticate, Locate
    from .jmsservice import JmsService


def open_host_broker(
    props: BrokerProperties, access: AccessControls | None = None, generation: int | None = None
) -> EmbeddedHostBroker:
    """The host broker of the instance ``props`` describe: its store in the instance
    directory (imq.persist.store=file) or in PostgreSQL (jdbc; an HA instance's writes
    fenced on the lease ``generation`` it joined as), destinations created on first use
    with the imq.autocreate.* limits, ``access`` checked on its data path and its jms
    service; StoreError when the store cannot open."""
    auto = props.autocreate
    database, sync = None, props.get("imq.persist.file.sync.enabled")
    if props.get("imq.persist.store") == "jdbc":
        # The original's JDBC store commits every persistent message before the send
        # returns; so does ours (a database commit per group of sends).
        from .cluster import store_settings
        from .pgstore import PostgresDatabase

        database, sync = PostgresDatabase(store_settings(props, generation), sync=True), True
    limits = _limits(
        DestinationAttributes(
            auto.max_num_msgs, auto.max_total_msg_bytes, auto.max_bytes_per_msg, auto.limit_behavior, auto.use_dmq
        )
    )
    memory = MemoryConfig(
        tuple(props.get(f"imq.{s}.threshold") for s in STATES),
        tuple(props.get(f"imq.{s}.count") for s in STATES),
        props.get("imq.system.max_memory") or 0,
    )
    max_size = props.get("imq.system.max_size")
    if max_size is None:  # a quarter of the memory budget for what is held in memory only
        max_size = (memory.budget or default_budget()) // 4 or -1
    return EmbeddedHostBroker(
        Broker(
            None if database else props.instance_dir / "store",
            database=database,
            sync=sync,
            instance_name=props.get("imq.instancename"),
            autocreate_queue=auto.autocreate_queue,
            autocreate_topic=auto.autocreate_topic,
            limits=limits,
            system=SystemUsage(props.get("imq.system.max_count"), max_size),
            max_message_size=props.get("imq.message.max_size"),
            max_selector_size=props.get("imq.selector.max_size"),
            memory=memory,
            memory_window=props.get("imq.destination.memory.window"),
            swap_dir=props.instance_dir / "store",
        ),
        access,
    )


def _attributes(lim: DestinationLimits) -> DestinationAttributes:
    return DestinationAttributes(
        lim.max_num_msgs,
        lim.max_total_msg_bytes,
        lim.max_bytes_per_msg,
        lim.limit_behavior.value,
        lim.use_dmq,
        lim.backout_threshold,
        lim.backout_queue,
        lim.backout_disposition,
        lim.local_delivery_preferred,
        lim.is_local_only,
        lim.max_num_producers,
        lim.max_num_active_consumers,
        lim.max_num_backup_consumers,
        lim.consumer_flow_limit,
    )


def _limits(attributes: DestinationAttributes) -> DestinationLimits:
    try:
        behavior = LimitBehavior(attributes.limit_behavior)
    except ValueError:
        raise JMSException(
            f"limit behavior {attributes.limit_behavior!r} is not one of " + ", ".join(b.value for b in LimitBehavior)
        ) from None
    if attributes.backout_disposition not in ("dmq", "discard"):
        raise JMSException(f"backout disposition {attributes.backout_disposition!r} is not dmq or discard")
    for name, value in (
        ("maxNumActiveConsumers", attributes.max_num_active_consumers),
        ("consumerFlowLimit", attributes.consumer_flow_limit),
    ):
        if value == 0:
            raise JMSException(f"{name}=0 would deliver nothing: write -1 (unlimited) or at least 1")
    return DestinationLimits(
        attributes.max_num_msgs,
        attributes.max_total_msg_bytes,
        attributes.max_bytes_per_msg,
        behavior,
        attributes.use_dmq,
        attributes.backout_threshold,
        attributes.backout_queue,
        attributes.backout_disposition,
        attributes.local_delivery_preferred,
        attributes.is_local_only,
        attributes.max_num_producers,
        attributes.max_num_active_consumers,
        attributes.max_num_backup_consumers,
        attributes.consumer_flow_limit,
    )


class EmbeddedHostBroker(HostBroker):
    """The HostBroker of an in-process :class:`Broker`."""

    def __init__(self, broker: Broker, access: AccessControls | None = None) -> None:
        self.broker = broker
        self.access = access  # None: no access control
        self._factory = EmbeddedConnectionFactory(broker)  # front ends' clients (connect)
        self._service_factory = EmbeddedConnectionFactory(broker, service=True)  # the bridges'

    @property
    def instance_name(self) -> str:
        return self.broker.instance_name

    def store_location(self) -> str | None:
        return str(self.broker.store.path) if self.broker.store is not None else None

    def store_behind(self) -> bool:
        return self.broker.store is not None and self.broker.store.behind

    def store_problem(self) -> str | None:
        """Why the store takes no writes now (failed, full, closed); None when it does (or
        there is no store)."""
        store = self.broker.store
        return store.problem() if store is not None else None

    def metrics(self) -> dict[str, Any]:
        """The broker's metrics snapshot (Broker.metrics), read at scrape time."""
        return self.broker.metrics()

    @property
    def fsync(self) -> bool:
        """Whether each store write is flushed to disk (or the database's WAL) before it counts."""
        return self.broker.sync

    def jms_service(
        self,
        netloop: NetLoop,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        authenticator: Authenticate | None = None,
        guard: ServiceGuard | None = None,
        brokerid: str | None = None,
        locate: Locate | None = None,
    ) -> JmsService:
        """The broker's ``jms`` connection service on ``host:port`` (not started yet):
        how other processes (CLI jobs, Spark workers) reach it; ``guard``: its login
        timeout, connection cap and the service's login throttle; an HA instance's
        ``brokerid`` and ``locate`` (clientconn.Locate) send a client whose last broker
        was taken over to the instance that serves that broker's store."""
        from .jmsservice import JmsService

        return JmsService(
            self.broker,
            netloop,
            host,
            port,
            ssl_context=ssl_context,
            authenticator=authenticator,
            guard=guard,
            access=self.access,
            brokerid=brokerid,
            locate=locate,
        )

    def close(self) -> None:
        """Stop the broker: break its connections, write what is pending, close the store
        (the service's to call, once its front ends have stopped)."""
        self.broker.close()

    def connection_factory(self) -> XAConnectionFactory:
        return self._service_factory

    def reserve(self, owner: str, client_ids: Iterable[str], durables: Iterable[tuple[str, str]]) -> None:
        self.broker.reservations.reserve(owner, client_ids, durables)

    def release(self, owner: str) -> None:
        self.broker.reservations.release(owner)

    def set_service_users(self, users: Iterable[str]) -> None:
        """Who logs in as the bridge service from other processes (the Spark service
        account): they may use what reserve() keeps."""
        self.broker.reservations.service_users = frozenset(users)

    def txlog_sql(self) -> tuple[Callable[[], Any], str] | None:
        store = self.broker.store if not self.broker.closed else None
        settings = getattr(store.database, "settings", None) if store is not None else None
        return settings.txlog_sql() if settings is not None else None

    # --- clients and subscriptions --------------------------------------------------------------
    def _authorize(self, principal: Principal, operation: str, destination: Destination) -> None:
        access = self.access
        if access is not None:
            control = access.get(principal.service)
            if control is not None:
                control.check(principal, operation, destination, self.broker.would_autocreate)

    def connect(self, principal: Principal, client_id: str | None = None) -> Client:
        if self.access is not None:
            self.access.check_connection(principal)
        connection = self._factory.create_connection(principal.user)
        connection.origin_service = principal.service or "embedded"
        connection.origin_host = principal.address
        control = self.access.get(principal.service) if self.access is not None else None
        connection.durable_override = partial(durable_override, control, principal)
        try:
            if client_id:
                connection.client_id = client_id
            connection.create_session()  # the session of its consumers and temporaries
            connection.start()
        except BaseException:
            connection.close()
            raise
        return connection

    def disconnect(self, principal: Principal, client: Client) -> None:
        cast(EmbeddedConnection, client).close()

    @staticmethod
    def _session(client: Client) -> EmbeddedSession:
        return cast(EmbeddedConnection, client).sessions_list()[0]

    def create_temporary(self, principal: Principal, client: Client, topic: bool) -> Destination:
        session = self._session(client)
        return session.create_temporary_topic() if topic else session.create_temporary_queue()

    def subscribe(
        self,
        principal: Principal,
        client: Client,
        destination: Destination,
        selector: str | None = None,
        durable_name: str | None = None,
        no_local: bool = False,
    ) -> Consumer:
        self._authorize(principal, "consume", destination)
        session = self._session(client)
        if durable_name:
            return session.create_durable_subscriber(cast(Topic, destination), durable_name, selector, no_local)
        return session.create_consumer(destination, selector, no_local)

    def receive(self, principal: Principal, consumer: Consumer, timeout: float | None) -> Delivery | None:
        return self.broker.receive(consumer, timeout, False)

    def consumer_flow_limit(self, principal: Principal, consumer: Consumer) -> int:
        queue = cast(EmbeddedConsumer, consumer).queue
        return queue.limits.consumer_flow_limit if queue is not None else -1

    def receive_many(
        self, principal: Principal, consumer: Consumer, max_messages: int, timeout: float | None, max_bytes: int = 0
    ) -> list[Delivery]:
        return cast(list[Delivery], self.broker.receive_many(consumer, max_messages, timeout, max_bytes))

    def close_consumer(self, principal: Principal, consumer: Consumer) -> None:
        embedded = cast(EmbeddedConsumer, consumer)
        embedded.close()  # wakes a receive() in progress
        # The broker wakes one waiting consumer per message; one closed between that
        # wake-up and its taking the message leaves with it: wake another waiter.
        queue = embedded.queue
        if queue is not None:
            with self.broker.lock:
                if len(queue) and queue.waiters:
                    queue.wake(None)

    def unsubscribe(self, principal: Principal, client: Client, name: str) -> None:
        self._session(client).unsubscribe(name)

    # --- the data path ------------------------------------------------------------------------------
    def _stamp(self, message: Message, destination: Destination) -> None:
        message.destination = destination
        message.timestamp = now_ms()
        message.message_id = self.broker.next_message_id()
        message.redelivered = False
        message.delivery_count = 0

    def send(
        self,
        principal: Principal,
        client: Client,
        message: Message,
        destination: Destination,
        transaction: Transaction | None = None,
    ) -> Ticket:
        self._authorize(principal, "produce", destination)
        self._session(client).producing(destination)  # a STOMP connection: one producer
        self._stamp(message, destination)
        if transaction is not None:
            self.broker.check_room(client, message, destination)  # a held producer waits now
            cast(Work, transaction).sends.append((message, destination, client, None))
            return None
        ticket = self.broker.send(client, message, destination, pace=True)
        return ticket

    def send_many(
        self, principal: Principal, client: Client, sends: Sequence[tuple[Message, Destination]]
    ) -> tuple[Ticket, int, JMSException | None]:
        """Each send authorized and stamped (up to the first refused), then routed in one
        Broker.send_many: one lock, one store call."""
        session, checked = self._session(client), self.access is not None
        allowed, refused = len(sends), None
        for i, (message, destination) in enumerate(sends):
            if checked:
                try:
                    self._authorize(principal, "produce", destination)
                except JMSException as exc:
                    allowed, refused = i, exc
                    break
            session.producing(destination)
            self._stamp(message, destination)
        ticket, sent, why = self.broker.send_many(client, sends[:allowed] if refused else sends, pace=True)
        return ticket, sent, why or refused

    def acknowledge(
        self, principal: Principal, deliveries: Sequence[Delivery], transaction: Transaction | None = None
    ) -> None:
        envs = cast(Sequence[Envelope], deliveries)
        if transaction is not None:
            work = cast(Work, transaction)
            for env in envs:
                env.owner = work
            work.acks.extend(envs)
        elif envs:
            self.broker.acknowledge(envs)

    def redeliver(self, principal: Principal, deliveries: Sequence[Delivery]) -> None:
        if deliveries:
            self.broker.redeliver(list(cast(Sequence[Envelope], deliveries)))

    def begin(self, principal: Principal) -> Transaction:
        return Work()

    def commit(self, principal: Principal, transaction: Transaction) -> Ticket:
        ticket = self.broker.commit(cast(Work, transaction))
        return ticket

    def rollback(self, principal: Principal, transaction: Transaction) -> None:
        self.broker.rollback(cast(Work, transaction))

    def wait_durable(self, principal: Principal, ticket: Ticket) -> None:
        if ticket is not None:
            self.broker.wait_all((cast("int | Sent", ticket),))

    def write_now(self, principal: Principal, ticket: Ticket) -> bool:
        return ticket is None or self.broker.write_now((cast("int | Sent", ticket),))

    # --- destination admin ------------------------------------------------------------------------------
    def destinations(self, principal: Principal) -> dict[str, dict[str, int]]:
        return self.broker.destinations()

    def queue_depth(self, principal: Principal, name: str) -> int:
        found = self.broker.describe_destination(Queue(name))
        return 0 if found is None else found[1]["pending"] + found[1]["unacked"]

    def describe_destination(
        self, principal: Principal, destination: Destination
    ) -> tuple[DestinationAttributes, dict[str, int]] | None:
        found = self.broker.describe_destination(destination)
        if found is None:
            return None
        lim, counts = found
        return _attributes(lim), counts

    def list_destinations(
        self, principal: Principal, queues: bool = True, topics: bool = True, temporary: bool = False
    ) -> list[tuple[Destination, DestinationAttributes, dict[str, int], str]]:
        return [
            (dest, _attributes(lim), counts, state)
            for dest, lim, counts, state in self.broker.list_destinations(queues, topics, temporary)
        ]

    def destination_state(self, principal: Principal, destination: Destination) -> str:
        return self.broker.destination_state(destination)

    def pause_destinations(
        self, principal: Principal, destination: Destination | None, what: str, pause: bool
    ) -> list[tuple[Destination, str]] | None:
        return self.broker.pause_destinations(destination, what, pause)

    def destroy_destination(self, principal: Principal, destination: Destination) -> int | None:
        return self.broker.destroy(destination)

    def connections(self, principal: Principal) -> list[dict[str, Any]]:
        return self.broker.connection_list()

    def configure_destination(
        self, principal: Principal, destination: Destination, attributes: DestinationAttributes
    ) -> None:
        self.broker.configure_destination(destination, _limits(attributes))

    def purge_destination(self, principal: Principal, destination: Destination) -> tuple[int, int] | None:
        return self.broker.purge(destination)

    def browse_destination(
        self, principal: Principal, name: str, limit: int, after: str | None = None
    ) -> list[Message] | None:
        return self.broker.browse_queue(name, limit, after)

    def __repr__(self) -> str:
        return f"EmbeddedHostBroker({self.broker.instance_name!r})"
