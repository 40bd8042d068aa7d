# How it works: the broker side of one STOMP connection. It owns an embedded-broker
# connection (client id, temporary destinations, consumers) and uses the broker's own
# thread-safe calls for the data path, because STOMP's acknowledgement model does not fit
# a JMS session: ACK and NACK name single deliveries of one subscription, a transaction
# spans several subscriptions, and any thread may complete them. So a delivery here is
# the broker's Envelope: acknowledge() consumes it, redeliver() puts it back in its queue
# (NACK, ABORT, a closed subscription, a lost connection), and a transaction is a broker
# Work whose sends and acks commit() applies in one store batch.
#
# Each subscription has a Subscriber thread: it waits for credit (consumerFlowLimit minus
# deliveries not yet acknowledged), a writable transport, the loop having taken its
# previous batch and, for transacted subscriptions, an open transaction; then it takes up
# to a batch of messages (blocking only for the first; at most BATCH messages or about
# BATCH_BYTES of frames), renders them to frame bytes with the session's render function,
# and posts the batch to the event loop in one call. So a client that stops reading holds
# at most the transport's high-water mark plus one batch in our memory. Nothing here blocks the loop except
# the calls marked blocking (durable waits, unsubscribe), which the server runs in a pool.
"""The host broker side of a STOMP connection: sends, subscriber threads, acks, transactions."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..jms.destination import Destination
from ..jms.message import Message
from ..providers.embedded import Broker, EmbeddedConnectionFactory
from ..providers.embedded.broker import Work, now_ms
from ..providers.embedded.queues import Envelope

log = logging.getLogger(__name__)

BATCH = 64  # messages a subscriber takes before handing them to the loop ...
BATCH_BYTES = 128 * 1024  # ... or fewer, once their frames are this big
Post = Callable[..., None]  # loop.call_soon_threadsafe, or a test's queue


class HostConnection:
    """One STOMP connection's embedded-broker connection and data path."""

    def __init__(self, broker: Broker, post: Post, client_id: str | None = None,
                 username: str | None = None) -> None:
        self.broker = broker
        self.post = post
        self.connection = EmbeddedConnectionFactory(broker).create_connection(username)
        try:
            if client_id:
                self.connection.client_id = client_id
            self.session = self.connection.create_session()
            self.connection.start()
        except BaseException:
            self.connection.close()
            raise
        self.subscribers: list[Subscriber] = []

    @property
    def client_id(self) -> str | None:
        return self.connection.client_id

    # --- sending ------------------------------------------------------------------------
    def _stamp(self, message: Message, destination: Destination) -> None:
        message.destination = destination
        message.timestamp = now_ms()
        message.message_id = self.broker.next_message_id()
        message.redelivered = False
        message.delivery_count = 0

    def send(self, message: Message, destination: Destination) -> int | None:
        """Route now; returns the store ticket to wait on before confirming, or None."""
        self._stamp(message, destination)
        ticket = self.broker.send(self.connection, message, destination)
        return ticket if self.broker.sync else None

    def send_in(self, work: Work, message: Message, destination: Destination) -> None:
        """Send as part of ``work`` (a STOMP transaction): routed at commit."""
        self._stamp(message, destination)
        work.sends.append((message, destination, self.connection, None))

    def wait_durable(self, ticket: int | None) -> None:
        """Blocking: until the store has written ``ticket``."""
        self.broker.wait_durable(ticket)

    # --- acknowledging and transactions ---------------------------------------------------
    def acknowledge(self, envs: Sequence[Envelope]) -> None:
        if envs:
            self.broker.acknowledge(envs)

    def redeliver(self, envs: Sequence[Envelope]) -> None:
        if envs:
            self.broker.redeliver(list(envs))

    @staticmethod
    def new_work() -> Work:
        return Work()

    @staticmethod
    def hold(work: Work, envs: Sequence[Envelope]) -> None:
        """ACK in a transaction: consumed when ``work`` commits, redelivered if it rolls back."""
        for env in envs:
            env.owner = work
        work.acks.extend(envs)

    def commit(self, work: Work) -> int | None:
        ticket = self.broker.commit(work)
        return ticket if self.broker.sync else None

    def rollback(self, work: Work) -> None:
        self.broker.rollback(work)

    # --- destinations and subscriptions ------------------------------------------------------
    def create_temporary(self, topic: bool) -> Destination:
        if topic:
            return self.session.create_temporary_topic()
        return self.session.create_temporary_queue()

    def subscribe(self, destination: Destination, selector: str | None, durable_name: str | None,
                  no_local: bool, window: int, render: Callable[[Envelope], Any],
                  deliver: Callable[..., None], paused: bool = False) -> Subscriber:
        """A consumer and its thread; raises JMSException (bad selector, destination, ...)."""
        if durable_name:
            # a queue too: the provider refuses it (InvalidDestinationException), and the client is told
            consumer = self.session.create_durable_subscriber(
                destination, durable_name, selector, no_local)  # type: ignore[arg-type]  # (see above)
        else:
            consumer = self.session.create_consumer(destination, selector, no_local)
        sub = Subscriber(self, consumer, window, render, deliver, paused)
        self.subscribers.append(sub)
        sub.start()
        return sub

    def unsubscribe(self, name: str) -> None:
        """Blocking: delete durable subscription ``name`` of this connection's client id."""
        self.session.unsubscribe(name)

    def close(self) -> None:
        for sub in list(self.subscribers):
            sub.stop()
        self.connection.close()


class Subscriber:
    """The thread that moves one subscription's messages from the broker to the loop."""

    def __init__(self, host: HostConnection, consumer: Any, window: int,
                 render: Callable[[Envelope], Any], deliver: Callable[..., None], paused: bool) -> None:
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
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"stomp-sub:{consumer.destination}")

    def start(self) -> None:
        self.thread.start()

    # --- called from the loop -----------------------------------------------------------
    def release(self, n: int) -> None:
        """``n`` deliveries were acknowledged or returned: room for as many more."""
        if n:
            with self._cond:
                self._credit += n
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
        self.consumer.close()  # wakes a receive() in progress
        _pass_on_wakeup(self.host.broker, self.consumer.queue)
        if self in self.host.subscribers:
            self.host.subscribers.remove(self)

    @property
    def stopped(self) -> bool:
        return self._stopped

    # --- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        broker, consumer, render = self.host.broker, self.consumer, self.render
        try:
            while True:
                with self._cond:
                    while not self._stopped and (self._credit <= 0 or self._paused or not self._writable
                                                 or self._in_flight):
                        self._cond.wait()
                    if self._stopped:
                        return
                    limit = min(self._credit, BATCH)
                env = broker.receive(consumer, None, False)
                if env is None:
                    return  # consumer closed, or the broker shut down
                items = [render(env)]
                size = len(items[0].data or b"")
                while len(items) < limit and size < BATCH_BYTES:
                    more = broker.receive(consumer, 0, False)
                    if more is None:
                        break
                    items.append(render(more))
                    size += len(items[-1].data or b"")
                with self._cond:
                    self._credit -= len(items)
                    self._in_flight = True
                self.host.post(self.deliver, items)
        except Exception:  # a bug here must not leave messages stranded silently
            log.exception("STOMP subscriber on %s failed", consumer.destination)
            self.host.post(self.deliver, None)


def _pass_on_wakeup(broker: Broker, queue: Any) -> None:
    """The broker wakes one waiting consumer per message; a consumer closed between that
    wake-up and its taking the message leaves with it, and the message would wait for the
    next send. Wake another waiter for whatever is queued (the broker's remove_consumer
    does not do this yet)."""
    if queue is None:
        return
    with broker.lock:
        if len(queue) and queue.waiters:
            queue.wake(None)
