"""The host broker side of a STOMP connection: sends, subscriber threads, acks, transactions.

A HostConnection, one per STOMP connection, owns a HostBroker client (client id, temporary
destinations, consumers) and uses the HostBroker data path, because STOMP's acknowledgement
model does not fit a JMS session: ACK and NACK name single deliveries of one subscription, a
transaction spans several subscriptions, and any thread may complete them. So a delivery
here is the HostBroker's opaque Delivery: acknowledge() consumes it, redeliver() puts it
back in its queue (NACK, ABORT, a closed subscription, a lost connection), and a STOMP
transaction is a HostBroker Transaction whose sends and acks commit() applies in one store
batch. Every call names the connection's authenticated Principal.

Each subscription has a Subscriber thread: it waits for credit (consumerFlowLimit, or its
destination's if lower, minus deliveries not yet acknowledged), a writable transport, the
loop having taken its previous batch and, for transacted subscriptions, an open
transaction; then it takes up to a batch of messages in one receive_many (blocking only
for the first; at most BATCH messages or about BATCH_BYTES of bodies), renders them to
frame bytes with the session's render function, and posts the batch to the event loop in
one call. So a client that stops reading holds at most the transport's high-water mark
plus one batch in our memory. Nothing here blocks the loop except the calls marked
blocking (durable waits, unsubscribe), which the server runs in a pool.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..jms.destination import Destination
from ..jms.errors import JMSException
from ..jms.hostbroker import (
    Consumer,
    Delivery,
    HostBroker,
    Principal,
    Ticket,
    Transaction,
)
from ..jms.message import Message

log = logging.getLogger("imq.bridge.stomp.host")  # the STOMP bridge's log: bridges/stomp/log.txt

BATCH = 64  # messages a subscriber takes before handing them to the loop ...
BATCH_BYTES = 128 * 1024  # ... or fewer, once their bodies are this big
Post = Callable[..., None]  # loop.call_soon_threadsafe, or a test's queue


class HostConnection:
    """One STOMP connection's host broker client and data path."""

    def __init__(self, broker: HostBroker, principal: Principal, post: Post, client_id: str | None = None) -> None:
        self.broker = broker
        self.principal = principal
        self.post = post
        self.client = broker.connect(principal, client_id)
        self.subscribers: list[Subscriber] = []

    @property
    def client_id(self) -> str | None:
        return self.client.client_id

    def store_behind(self) -> bool:
        """The host broker's store is far behind its senders: wait for tickets."""
        return self.broker.store_behind()

    # --- sending ------------------------------------------------------------------------
    def send(self, message: Message, destination: Destination) -> Ticket:
        """Route now; returns the store ticket to wait on before confirming, or None."""
        return self.broker.send(self.principal, self.client, message, destination)

    def send_many(self, sends: Sequence[tuple[Message, Destination]]) -> tuple[Ticket, int, JMSException | None]:
        """Route a run of sends together (HostBroker.send_many): the ticket covering those
        sent, how many were, and why the next was refused (None: none was)."""
        return self.broker.send_many(self.principal, self.client, sends)

    def send_in(self, tx: Transaction, message: Message, destination: Destination) -> None:
        """Send as part of ``tx`` (a STOMP transaction): routed at commit."""
        self.broker.send(self.principal, self.client, message, destination, tx)

    def wait_durable(self, ticket: Ticket) -> None:
        """Blocking: until the store has written ``ticket``."""
        self.broker.wait_durable(self.principal, ticket)

    def write_now(self, ticket: Ticket) -> bool:
        """Write ``ticket`` on this thread if that cannot block; True when
        ``wait_durable`` then returns at once."""
        return self.broker.write_now(self.principal, ticket)

    # --- acknowledging and transactions ---------------------------------------------------
    def acknowledge(self, deliveries: Sequence[Delivery]) -> None:
        if deliveries:
            self.broker.acknowledge(self.principal, deliveries)

    def redeliver(self, deliveries: Sequence[Delivery]) -> None:
        if deliveries:
            self.broker.redeliver(self.principal, deliveries)

    def begin(self) -> Transaction:
        return self.broker.begin(self.principal)

    def hold(self, tx: Transaction, deliveries: Sequence[Delivery]) -> None:
        """ACK in a transaction: consumed when ``tx`` commits, redelivered if it rolls back."""
        self.broker.acknowledge(self.principal, deliveries, tx)

    def commit(self, tx: Transaction) -> Ticket:
        return self.broker.commit(self.principal, tx)

    def rollback(self, tx: Transaction) -> None:
        self.broker.rollback(self.principal, tx)

    # --- destinations and subscriptions ------------------------------------------------------
    def create_temporary(self, topic: bool) -> Destination:
        return self.broker.create_temporary(self.principal, self.client, topic)

    def subscribe(
        self,
        destination: Destination,
        selector: str | None,
        durable_name: str | None,
        no_local: bool,
        window: int,
        render: Callable[[Delivery], Any],
        deliver: Callable[..., None],
        paused: bool = False,
    ) -> Subscriber:
        """A consumer and its thread; raises JMSException (bad selector, destination, ...)."""
        consumer = self.broker.subscribe(self.principal, self.client, destination, selector, durable_name, no_local)
        flow = self.broker.consumer_flow_limit(self.principal, consumer)  # the destination's cap
        if 0 < flow < window:
            window = flow
        sub = Subscriber(self, consumer, window, render, deliver, paused)
        self.subscribers.append(sub)
        sub.start()
        return sub

    def unsubscribe(self, name: str) -> None:
        """Blocking: delete durable subscription ``name`` of this connection's client id."""
        self.broker.unsubscribe(self.principal, self.client, name)

    def close(self) -> None:
        for sub in list(self.subscribers):
            sub.stop()
        self.broker.disconnect(self.principal, self.client)


class Subscriber:
    """The thread that moves one subscription's messages from the broker to the loop."""

    def __init__(
        self,
        host: HostConnection,
        consumer: Consumer,
        window: int,
        render: Callable[[Delivery], Any],
        deliver: Callable[..., None],
        paused: bool,
    ) -> None:
        self.host = host
        self.consumer = consumer
        self.render = render
        self.deliver = deliver
        self._cond = threading.Condition()
        self._credit = window
        self._paused = paused
        self._writable = True
        self._in_flight = False  # a batch is on its way to the loop
        self._stopped = False
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"stomp-sub:{consumer.destination}")

    def start(self) -> None:
        self.thread.start()

    # --- called from the loop -----------------------------------------------------------
    def release(self, n: int) -> None:
        """``n`` deliveries were acknowledged or returned: room for as many more. The
        thread is woken only when its credit was used up: otherwise credit is not what it
        waits for (a per-message ACK would wake it for nothing, a thread switch each)."""
        if n:
            with self._cond:
                self._credit += n
                if self._credit <= n:
                    self._cond.notify()

    def batch_done(self) -> None:
        """The loop has taken the last batch: the next may come (one at a time, so a
        full transport stops this thread within one batch)."""
        with self._cond:
            self._in_flight = False
            self._cond.notify()

    def pause(self, paused: bool) -> None:
        with self._cond:
            self._paused = paused
            self._cond.notify()

    def set_writable(self, writable: bool) -> None:
        with self._cond:
            self._writable = writable
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self.host.broker.close_consumer(self.host.principal, self.consumer)  # wakes a receive()
        if self in self.host.subscribers:
            self.host.subscribers.remove(self)

    @property
    def stopped(self) -> bool:
        return self._stopped

    # --- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        broker, principal, consumer, render = self.host.broker, self.host.principal, self.consumer, self.render
        try:
            while True:
                with self._cond:
                    while not self._stopped and (
                        self._credit <= 0 or self._paused or not self._writable or self._in_flight
                    ):
                        self._cond.wait()
                    if self._stopped:
                        return
                    limit = min(self._credit, BATCH)
                deliveries = broker.receive_many(principal, consumer, limit, None, BATCH_BYTES)
                if not deliveries:
                    return  # consumer closed, or the broker shut down
                items = [render(delivery) for delivery in deliveries]
                with self._cond:
                    self._credit -= len(items)
                    self._in_flight = True
                self.host.post(self.deliver, items)
        except Exception:  # a bug here must not leave messages stranded silently
            log.exception("STOMP subscriber on %s failed", consumer.destination)
            self.host.post(self.deliver, None)
