"""A JMS bridge link: the transfer loop and its commands.

A started link runs one thread, _main(): connect, then _loop():
receive -> pipeline.run_steps() -> send | DMQ | consume-only | halt -> complete, where
"complete" is the TransferTransaction's (transfer.py) for the unit of messages the Batch
(batch.py) holds; the Settler (settle.py) counts what became final. With a confirm window
(imq.bridge.<name>.link.window > 1) sends are asynchronous, their outcomes kept in order by
a ConfirmWindow (window.py), the prefetch bounded in bytes by the largest message seen
(largest.py). A lost connection aborts the unit and reconnects (reconnect.py).

Rules: no message is acknowledged before its send (and every send before it) is known to
have succeeded; only completed messages count as transferred; a failure never loses a
message and never sends one to the DMQ twice; a transacted link rolls back instead of
dead-lettering a refused send. Commands from other threads set `_want` and wait on the
Lifecycle; stop and pause finish the message in flight.

Design notes: docs/jms-bridges.md#internals-jmsbridgelinkpy.
"""

from __future__ import annotations

import logging
import threading
import time
from functools import partial
from pathlib import Path

from ..jms.destination import Topic
from ..jms.errors import JMSException, StoreUnavailable
from ..jms.message import HEADER_FIELDS, Message
from ..jms.spi import MessageConsumer, MessageProducer, Session
from ..logfiles import PER_MESSAGE
from ..xa.txlog import TxLogError
from .batch import Batch, Unit
from .connections import BridgeConnections, ConnectError, ConnectionKind, Lease
from .dmq import DeadMessageQueues, dead_letter
from .excuses import Excuses, excuses_path, outage
from .largest import LargestMessage, largest_path
from .pipeline import (
    CONNECTION_LOST,
    EMBEDDED_PROVIDER,
    RETRIED,
    Action,
    DMQReason,
    Interrupted,
    LinkPlan,
    ProcessingContext,
    RetryWithTolerance,
    Stage,
    keeps_reply_to,
    run_steps,
)
from .reconnect import ReconnectPolicy
from .runners import LOCAL, LinkSetup, LinkTuning, RunnerBase, RunnerContext, register_link_runner
from .settle import Settler
from .states import State
from .transfer import TransactedLinkUnsupported, TransferTransaction
from .window import ConfirmWindow

_DELIVERY_MODE = HEADER_FIELDS.index("delivery_mode")
_PRIORITY = HEADER_FIELDS.index("priority")
_MESSAGE_ID = HEADER_FIELDS.index("message_id")
_DELIVERY_COUNT = HEADER_FIELDS.index("delivery_count")


# The source's prefetch a windowed link asks for, in windows: one being confirmed, one
# being received, one on its way (a prefetch of one window stalls the source at every
# window until its acknowledgement reaches the broker).
PREFETCH_WINDOWS = 3
# How long a full window waits for its oldest send before it completes the unit whole.
HEAD_WAIT = 1.0
# A moving link's thread reads its source backlog this often (ms) and publishes it; readers
# that must not block (info_now: the management port's loop) take it while it is fresher
# than PUBLISHED_FRESH seconds (an idle, paused or stuck link: they read it live). Only from
# this project's broker (a lock and a len in process, nothing over mq://): another
# provider's backlog may be a round trip it caches (AMQP), which readers would then see late.
PUBLISH_EVERY_MS = 100
PUBLISHED_FRESH = 0.3

# What connecting the target again after it failed under a window may raise.
_TARGET_GONE: tuple[type[BaseException], ...] = (ConnectError, *CONNECTION_LOST)


def now_ms() -> int:
    """The link's clock (the expiration check and the remaining time to live)."""
    return int(time.time() * 1000)


class ConnectionLost(Exception):
    """The source or target connection failed; the link reconnects."""


class Link(RunnerBase):
    """One <link> of a running bridge, run by a thread of this process (runner=local)."""

    runner = LOCAL

    def __init__(
        self,
        setup: LinkSetup,
        connections: BridgeConnections,
        dmqs: DeadMessageQueues,
        log: logging.Logger,
        tuning: LinkTuning = LinkTuning(),
        excused: Excuses | None = None,
        largest: Path | None = None,
    ) -> None:
        """``excused``: where the link's excused redeliveries are kept across restarts and
        HA takeovers (excuses.py); ``largest``: the file that keeps the size of its largest
        message (largest.py). None keeps them in memory while the link lives."""
        super().__init__(setup, log, tuning)
        self.connections = connections
        self.dmqs = dmqs
        self._want = State.STOPPED
        self._commands = 0  # bumped by every command: the loop looks at _want when it changes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.operator = RetryWithTolerance(
            self._stop, tuning.retry_deadline, tuning.backoff_initial, tuning.backoff_max
        )
        # per connection
        self._source: Lease | None = None
        self._target: Lease | None = None
        self._txn: TransferTransaction | None = None
        self._consumer: MessageConsumer | None = None
        self._producer: MessageProducer | None = None
        self._plan: LinkPlan | None = None
        self._audited: set[DMQReason] = set()
        # A transformer failure may stop a non-transacted link without consuming the
        # message (_halt_after); CLIENT_ACKNOWLEDGE acks everything delivered, so unless the
        # source can acknowledge its oldest messages alone, such a link completes each
        # message before it receives the next one (window 1; _connect decides).
        self._halts = (
            setup.transformer is not None
            and not setup.transaction.transacted
            and not setup.config.target.consume_no_transfer_on_transform_error
        )
        # The confirm window: sends outstanding at once (1: each send waits for its answer).
        self.window = 1 if setup.transaction.transacted else max(1, setup.window)
        self.batch = Batch(
            max(setup.batch_size, self.window),
            self.counters,
            excused if excused is not None else Excuses(None, log),
            setup.window_bytes,
        )
        self._outstanding: ConfirmWindow[ProcessingContext] = ConfirmWindow()
        self._slides = False  # the source acknowledges its oldest messages alone (_slide)
        self._halting = False  # completing what came before the message that stops the link
        self.largest = LargestMessage(largest, log)  # of the messages this link received
        self._source_session: Session | None = None
        self._prefetch_most = 0  # what prefetch_at_most() asked of the source session
        self.settler = Settler(self.batch, self.counters, log, self.name)
        # An outage: when the link lost its connection or first failed to connect (time.time()),
        # the connect attempts that failed since, and whether this run had been connected.
        self._down_since: float | None = None
        self._down_attempts = 0
        self._was_connected = False
        self._setting_up = setup.config.source.connection_factory_ref  # the factory _connect is at
        self._published: tuple[float, int | None] | None = None  # (time.monotonic(), backlog())
        self._publishes = False  # the source's backlog is published (decided when connecting)

    def backlog(self) -> int | None:
        """The source consumer's backlog at its provider (read from another thread: a
        consumer closed meanwhile answers None or fails, which reads as unknown)."""
        consumer = self._consumer
        if consumer is None:
            return None
        try:
            return consumer.backlog()
        except Exception:
            return None

    def published_backlog(self) -> tuple[int | None] | None:
        published = self._published
        if published is None or self.lifecycle.state is not State.STARTED:
            return None
        at, backlog = published
        return (backlog,) if time.monotonic() - at <= PUBLISHED_FRESH else None

    # --- commands (any thread; RunnerBase checked the state table) ---------------------------
    def _on_start(self, timeout: float | None) -> State:
        """Start the transfer thread; wait until it connected (or ``timeout`` seconds,
        tuning.start_timeout by default); the state then (STARTING while still connecting)."""
        if self._thread is not None:
            self._thread.join()
        self._stop.clear()
        self._want = State.STARTED
        self._audited = set()
        self._down_since, self._down_attempts, self._was_connected = None, 0, False
        self.batch.restart()
        self._thread = threading.Thread(target=self._main, daemon=True, name=f"link {self.bridge_name}/{self.name}")
        self._thread.start()
        return self.lifecycle.wait_for({State.STARTED, State.STOPPED, State.PAUSED}, self._wait(timeout))

    def _on_stop(self, timeout: float | None) -> State:
        """Finish the message in flight, complete what was handled, close the connections."""
        self._command(State.STOPPED)
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if thread is None or not thread.is_alive():
            self.lifecycle.set(State.STOPPED)
        return self.state

    def _on_pause(self, timeout: float | None) -> State:
        """Finish the message in flight and hold; waits like start() (a link still
        connecting pauses once connected)."""
        self._command(State.PAUSED)
        return self.lifecycle.wait_for({State.PAUSED, State.STOPPED}, self._wait(timeout))

    def _on_resume(self, timeout: float | None) -> State:
        self._command(State.STARTED)
        return self.lifecycle.wait_for({State.STARTED, State.STOPPED}, self._wait(timeout))

    def _command(self, want: State) -> None:
        with self.lifecycle.cond:
            self._want = want
            self._commands += 1
            self.lifecycle.cond.notify_all()

    # --- the thread -------------------------------------------------------------------------
    def _main(self) -> None:
        reconnect = ReconnectPolicy(self.operator.backoff, between_attempts=self._between_attempts)
        try:
            while self._want is not State.STOPPED:
                try:
                    self._connect()
                except Interrupted:
                    break
                except ConnectError as exc:  # every connect attempt the factory allows failed
                    self._failed(str(exc))
                    break
                except CONNECTION_LOST as exc:  # lost again while setting up: a failed attempt
                    reconnect.lost(connecting=True)
                    self._down_attempts += 1
                    self._lost(exc)
                    if not reconnect.wait():
                        break
                    continue
                except TransactedLinkUnsupported as exc:
                    self._failed(str(exc))
                    break
                except Exception as exc:
                    self._failed(f"cannot start: {type(exc).__name__}: {exc}")
                    break
                self._reconnected()
                self.counters.resolved()  # connected: what kept it has passed
                self.lifecycle.move({State.STARTING, State.RESUMING}, State.STARTED)
                self._was_connected = True
                reconnect.connected()
                try:
                    self._loop()
                    break
                except ConnectionLost as exc:
                    reconnect.lost()  # soon after connecting: back off before reconnecting
                    self._lost(exc)
                    if not reconnect.wait():
                        break
                except _Halt as exc:
                    self._failed(str(exc))
                    break
                except Interrupted:
                    break
                except Exception as exc:  # a bug: stop rather than loop on it
                    self.log.exception("link %s failed", self.name)
                    self._failed(f"{type(exc).__name__}: {exc}")
                    break
        finally:
            self._disconnect(broken=False)
            with self.lifecycle.cond:
                self._want = State.STOPPED
                self.lifecycle.set(State.STOPPED)
            self.log.info("link %s stopped", self.name)

    def _lost(self, exc: BaseException) -> None:
        self._outage(f"connection lost: {exc}")
        self.counters.reconnects += 1
        self.log.warning("link %s: connection lost (%s); reconnecting", self.name, exc)
        self._disconnect(broken=True)

    def _outage(self, text: str) -> None:
        """The link cannot move because a connection is lost or cannot be made: STARTING
        until it is connected again, with ``text`` as its current error."""
        self.lifecycle.move({State.STARTED, State.RESUMING}, State.STARTING)
        self.counters.trouble(text)
        if self._down_since is None:
            self._down_since = time.time()

    def _between_attempts(self, failures: int) -> bool:
        """After a connect that failed while setting up (``failures`` in a row): wait the
        connect-attempt-interval of the factory being set up (with none, the tuning's
        backoff, so that it does not spin); False when stopped meanwhile."""
        ref = self._setting_up
        config = self.connections.connectors[ref].config if ref in self.connections.connectors else None
        interval = config.connect_attempt_interval_in_seconds if config is not None else 0
        if interval <= 0:
            return self.operator.backoff(failures)
        return not self._stop.wait(interval)

    def _unreachable(self, text: str) -> None:
        """A connect attempt failed (Connector.connect): ``text`` names the factory, its
        broker and the cause."""
        self._down_attempts += 1
        self._outage(text)

    def _reconnected(self) -> None:
        """Connected again after an outage: STARTED with no current error, and one line
        saying how long it lasted."""
        since = self._down_since
        if since is None:
            return
        attempts = self._down_attempts
        self._down_since, self._down_attempts = None, 0
        self.log.info(
            "link %s %s after %.1f s (%s since %s UTC, %d failed connect attempt(s))",
            self.name,
            "reconnected" if self._was_connected else "connected",
            time.time() - since,
            "disconnected" if self._was_connected else "unreachable",
            time.strftime("%H:%M:%S", time.gmtime(since)),
            attempts,
        )
        self.counters.resolved()
        self.lifecycle.move({State.STARTING}, State.STARTED)

    def _failed(self, text: str) -> None:
        self.counters.trouble(text)
        self.log.error("link %s stops: %s", self.name, text)

    def _connect(self) -> None:
        setup, cfg = self.setup, self.config
        self._setting_up = cfg.source.connection_factory_ref
        self._source = self.connections.lease(
            cfg.source.connection_factory_ref,
            ConnectionKind.DEDICATED,
            cfg.source.clientid,
            self._stop,
            xa=setup.transaction.xa,
            failed=self._unreachable,
        )
        self._txn = txn = setup.transaction()
        self.batch.open = False
        self._outstanding = ConfirmWindow()
        session = txn.open_source(self._source.connection)
        if self._halts:
            one = not txn.slides()
            self.window = 1 if one else max(1, setup.window)
            self.batch.size = 1 if one else max(setup.batch_size, self.window)
        if self.window > 1:
            session.prefetch_at_least(
                PREFETCH_WINDOWS * self.prefetch_window(), PREFETCH_WINDOWS * self.batch.max_bytes
            )
        self._source_session, self._prefetch_most = session, 0
        self._bound_prefetch()
        src = setup.source
        if isinstance(src, Topic) and cfg.source.durable_sub:  # (is_topic: a Topic)
            self._consumer = session.create_durable_subscriber(src, cfg.source.durable_sub, cfg.source.selector)
        else:
            self._consumer = session.create_consumer(src, cfg.source.selector)
        producer = self._open_target()
        # sliding needs answers that come while the link waits for the oldest one alone
        self._slides = txn.slides() and producer.answers_alone
        assert self._target is not None
        source_provider = self._source.handle.provider_name
        target_provider = self._target.handle.provider_name
        self._publishes = source_provider == EMBEDDED_PROVIDER
        self._plan = LinkPlan(
            bridge_name=self.bridge_name,
            link_name=self.name,
            target=setup.target,
            retain_reply_to=keeps_reply_to(cfg.target.retain_replyto, source_provider, target_provider),
            tag_bridge_name=setup.bridge.message_transfer_tag_bridge_name,
            consume_on_transform_error=cfg.target.consume_no_transfer_on_transform_error,
            source_provider=source_provider,
            target_provider=target_provider,
            transformer=setup.transformer,
            transformer_properties={
                **{p.name: p.value for p in cfg.target.properties},
                "JMS_SUN_JMSBRIDGE_NAME": self.bridge_name,
            },
            destinations=setup.destinations,
            backout_threshold=setup.backout_threshold,
        )
        self.settler.log_transfers = setup.bridge.log_message_transfer and self.log.isEnabledFor(logging.INFO)
        self._source.connection.start()
        self.log.info(
            "link %s connected: %s -> %s (%s)",
            self.name,
            setup.source_label,
            setup.target_label,
            f"transacted, {txn.kind}" if self.transacted else f"CLIENT_ACKNOWLEDGE, window {self.window}",
        )

    def prefetch_window(self) -> int:
        """The messages of a window the source is asked to prefetch: the confirm window,
        or fewer where the largest message seen would make it hold more than windowBytes."""
        reach = self._messages_in_bound()
        return min(self.window, reach) if reach else self.window

    def _messages_in_bound(self) -> int:
        """How many messages of the largest size seen reach windowBytes (0: no size seen
        yet, or no byte bound)."""
        largest, bound = self.largest.size, self.batch.max_bytes
        return -(-bound // largest) if largest and bound else 0

    def _bound_prefetch(self) -> None:
        """Ask the source session to hold at most PREFETCH_WINDOWS windows of the largest
        message's size, whatever the provider URL's prefetch. Knowing no size yet, a
        session that can change an open consumer's prefetch (AMQP) is asked for one
        message until the first one shows its size."""
        session = self._source_session
        if session is None or not self.batch.max_bytes:
            return
        if reach := self._messages_in_bound():
            most = PREFETCH_WINDOWS * reach
        elif session.prefetch_adjustable:
            most = 1
        else:
            return
        if most != self._prefetch_most:  # (only lower, but for the first message's)
            try:
                session.prefetch_at_most(most)
            except CONNECTION_LOST as exc:
                raise ConnectionLost(f"prefetch: {exc}") from exc
            self._prefetch_most = most

    def _open_target(self) -> MessageProducer:
        txn = self._txn
        assert txn is not None
        target = self.config.target
        self._setting_up = target.connection_factory_ref
        self._target = self.connections.lease(
            target.connection_factory_ref,
            self.setup.target_kind,
            target.clientid,
            self._stop,
            xa=txn.xa,
            failed=self._unreachable,
        )
        session = txn.open_target(self._target.connection)
        session.cancel = self._stop  # stop gives up a send the target holds (FLOW_CONTROL)
        self._producer = producer = session.create_producer(None)
        producer.confirm_sends = True  # a refusal must be the failure of the message refused
        return producer

    def _release_idle_target(self) -> None:
        """A link that does not stay connected gives its pooled connection back when idle."""
        if self.setup.target_kind is ConnectionKind.POOLED and self._target is not None:
            assert self._txn is not None
            self._txn.close_target()
            self._producer = None
            self._target.release()
            self._target = None

    def _disconnect(self, broken: bool) -> None:
        txn = self._txn
        if txn is not None:
            if not broken:
                try:
                    txn.abort()  # nothing is pending after a clean stop; else it comes back
                except Exception:
                    pass
            txn.close()  # units completing behind the link finish first
        self.settler.closed(txn)
        for lease in (self._target, self._source):
            if lease is not None:
                lease.release(broken)
        self._txn = self._consumer = self._producer = self._source_session = None
        self._source = self._target = None
        self._published = None

    # --- the transfer loop --------------------------------------------------------------------
    def _loop(self) -> None:
        consumer, txn, plan = self._consumer, self._txn, self._plan
        assert consumer is not None and txn is not None and plan is not None
        receive = consumer.receive
        poll = self.tuning.poll_interval
        batch = self.batch
        pending = batch.pending
        counters = self.counters
        largest, excused, clock = self.largest, batch.excused, now_ms
        publishes, publish_at = self._publishes, 0  # (ms) when the backlog is published next
        seen = -1
        try:
            while True:
                if seen != self._commands:  # a command came: settle into what it wants
                    seen = self._commands
                    self._end_unit(pending)
                    if not self._hold():
                        return
                try:
                    if not batch.open:
                        txn.begin()
                        batch.open = True
                    message = receive(0 if pending else poll)
                except CONNECTION_LOST as exc:
                    raise ConnectionLost(f"receive: {exc}") from exc
                except StoreUnavailable as exc:  # the source broker's database is restarting
                    raise ConnectionLost(f"receive: {exc}") from exc
                if message is None:
                    if pending:
                        self._complete(pending)
                        continue
                    self._end_unit(pending)
                    for end, lease in (("source", self._source), ("target", self._target)):
                        if lease is not None and lease.broken:
                            raise ConnectionLost(f"{end}: {lease.handle.describe_failure()}")
                    self._release_idle_target()
                    continue
                if message.redelivered:
                    if self.settler.units and not self._settle(pending, wait=True, received=message):
                        continue  # a unit behind failed: the open one, this message with it, is undone
                    counters.redelivered += 1
                counters.received += 1
                size = message.size()
                ctx = ProcessingContext(message, clock(), size=size)
                if size > largest.size and largest.saw(size):
                    self._bound_prefetch()
                if excused:
                    ctx.excused = excused.get(ctx.headers[_MESSAGE_ID])
                try:
                    self._handle(ctx, plan, pending)
                except CONNECTION_LOST as exc:
                    raise ConnectionLost(f"{ctx.stage.value}: {exc}") from exc
                if len(pending) >= batch.size or 0 < batch.max_bytes <= pending.bytes or batch.one_by_one:
                    self._complete(pending)  # (Batch.full(), inline: it runs for every message)
                if publishes and ctx.now >= publish_at:
                    publish_at = ctx.now + PUBLISH_EVERY_MS
                    self._published = (time.monotonic(), self.backlog())
        except (ConnectionLost, TxLogError) as exc:
            batch.undone(pending, exc)  # they come back after the reconnect (or a restart)
            raise

    def _handle(self, ctx: ProcessingContext, plan: LinkPlan, pending: Unit) -> None:
        batch = self.batch
        if batch.lettered and batch.in_dmq_already(ctx.headers[_MESSAGE_ID]):
            # refused in a window whose unit came back (a lost connection): in a DMQ already
            self.log.info(
                "link %s: message %s is in the DMQ already: consumed",
                self.name,
                ctx.headers[_MESSAGE_ID],
                extra=PER_MESSAGE,
            )
            ctx.dead(DMQReason.SEND_FAILURE)
            pending.append(ctx)
            return
        out = run_steps(ctx.original, plan, ctx, self.operator)
        if out is not None:
            if self._producer is None:  # a pooled target given back while idle
                self._open_target()
                self._reconnected()
            producer = self._producer
            assert producer is not None
            send = producer.send
            headers = ctx.headers
            windowed = self.window > 1 and not batch.one_by_one and not producer.answers_when_sent
            gone = False  # the target connection was found lost by this send (windowed)
            try:
                if windowed:
                    gone = self._send_async(producer, ctx, out)
                else:
                    send(
                        out,
                        ctx.destination,
                        delivery_mode=headers[_DELIVERY_MODE],
                        priority=headers[_PRIORITY],
                        time_to_live=ctx.time_to_live,
                    )
            except Exception as exc:  # (raised by send_async: that send never left)
                self.operator.failed(
                    ctx,
                    Stage.SEND,
                    exc,
                    send,
                    (out, ctx.destination),
                    {
                        "delivery_mode": headers[_DELIVERY_MODE],
                        "priority": headers[_PRIORITY],
                        "time_to_live": ctx.time_to_live,
                    },
                )
            if ctx.error is not None:
                self._send_failed(ctx, pending)
                return
            if ctx.audit is None:  # the common case: sent as it is
                pending.append(ctx)
                if gone:  # take the answers that came before the loss; resend the rest
                    self._confirm(pending)
                elif windowed and (len(self._outstanding.slots) >= self.window or 0 < batch.max_bytes <= pending.bytes):
                    if self._slides:
                        self._slide(pending)
                    else:
                        self._confirm(pending)
                return
        if ctx.audit is not None and ctx.audit not in self._audited:
            self._audited.add(ctx.audit)
            self._to_dmq(ctx, ctx.audit)
        if ctx.action is Action.HALT:
            self._halt_after(pending)
            raise _Halt(
                f"the transformer failed on message {ctx.header('message_id')} "
                f"({ctx.failure}) and consume-no-transfer-on-transform-error is false; "
                "the message stays on the source"
            )
        if ctx.action is Action.DEAD:
            message_id = ctx.headers[_MESSAGE_ID]
            if self.batch.in_dmq_already(message_id):  # its unit was undone after it went there
                self.log.info(
                    "link %s: message %s is in the DMQ already: consumed", self.name, message_id, extra=PER_MESSAGE
                )
            else:
                self.log.warning(
                    "link %s: message %s goes to the DMQ: %s%s",
                    self.name,
                    message_id,
                    ctx.reason.value if ctx.reason else "?",
                    f" ({ctx.failure})" if ctx.failure else "",
                )
                self._to_dmq(ctx, ctx.reason or DMQReason.SEND_FAILURE)
        pending.append(ctx)

    def _halt_after(self, pending: list[ProcessingContext]) -> None:
        """The link stops on the message just received: complete those received before it
        (the window's sends settled as at the end of any unit: refused ones to the DMQ),
        never it. CLIENT_ACKNOWLEDGE acknowledges everything delivered, so only the
        ``len(pending)`` oldest are acknowledged (a window with a transformer that may halt
        runs only on a source that can: _connect)."""
        self._halting = True
        try:
            self._complete(pending)
        finally:
            self._halting = False

    def _send_async(self, producer: MessageProducer, ctx: ProcessingContext, out: Message) -> bool:
        """Send ``out`` within the confirm window; True when the send found the target
        connection lost. That send never left: it stays in the window as a send whose
        answer never came, so that _confirm() first takes the answers the window's earlier
        sends got before the loss (a RECEIPT, a refusal and then the connection closed, as
        STOMP brokers do) and then sends it again with the unanswered ones; raising would
        send the whole unit back from the source, the confirmed sends with it (duplicates)
        and the refused one without its DMQ copy. Another failure raises: that send is
        retried (or fails) as a send that waits, behind the window's sends on the same
        connection; their outcomes are taken before the unit completes."""
        headers = ctx.headers
        listener = self._outstanding.add(ctx)
        try:
            producer.send_async(
                out,
                listener,
                ctx.destination,
                delivery_mode=headers[_DELIVERY_MODE],
                priority=headers[_PRIORITY],
                time_to_live=ctx.time_to_live,
            )
        except JMSException as exc:
            if _lost(exc):
                listener.on_exception(out, exc)  # (a listener answers once: a no-op if it did)
                return True
            self._outstanding.cancel(listener)
            raise
        except Exception:
            self._outstanding.cancel(listener)
            raise
        return False

    def _slide(self, pending: list[ProcessingContext]) -> None:
        """The window is full: wait for its oldest send only and acknowledge the head of
        the unit up to its last confirmed send (later sends stay out: the window slides).
        Where that cannot be done (a send of the head failed, no answer within
        HEAD_WAIT) the unit completes whole."""
        window = self._outstanding
        head = window.confirmed_head(HEAD_WAIT)
        if head:
            last = head[-1]
            upto = next(i for i, ctx in enumerate(pending) if ctx is last) + 1
            assert self._txn is not None
            try:
                done = self._txn.complete_oldest(upto)
            except CONNECTION_LOST as exc:
                raise ConnectionLost(f"acknowledge: {exc}") from exc
            if done:
                window.confirmed(len(head))
                self.settler.count(pending[:upto])
                del pending[:upto]
                return
        self._complete(pending)

    def _confirm(self, pending: list[ProcessingContext]) -> None:
        """Wait for the window's sends and take their outcomes in order (see the notes at
        the top): afterwards every message in ``pending`` was sent or went to the DMQ;
        after a retriable failure ``pending`` is backed out (empty)."""
        window = self._outstanding
        if not len(window):
            return
        assert self._producer is not None
        lost: BaseException | None = None
        try:
            self._producer.flush()
        except CONNECTION_LOST as exc:
            lost = exc
        failed = [(ctx, error) for ctx, error in window.settled() if error is not None]
        unanswered = window.unsettled() if len(window) else []
        if not failed and not unanswered:  # the common case: every send confirmed
            return
        resend = [ctx for ctx, error in failed if _lost(error)] + unanswered
        lost = lost or next((error for _, error in failed if _lost(error)), None)
        retried: tuple[ProcessingContext, JMSException] | None = None
        refused = False
        for ctx, error in failed:
            if _lost(error):
                continue
            if isinstance(error, RETRIED):
                retried = retried or (ctx, error)
            elif retried is None:
                ctx.fail(Stage.SEND, error)
                self._refused(ctx)
                refused = True
        if retried is not None:
            ctx, error = retried
            self.counters.error(f"send to {ctx.destination}: {error}")
            self._back_out(pending, ctx.headers[_DELIVERY_COUNT], "a failed send", error)
            return
        if resend:
            refused = self._resend(resend, lost) or refused
        if refused:
            self._complete(pending)  # as after a synchronous refusal: consume them now

    def _resend(self, resend: list[ProcessingContext], lost: BaseException | None) -> bool:
        """The target connection failed under sends of the window whose answer never came
        (``resend``, in order): connect the target again and send them once more, waiting
        for each, so that the source messages confirmed before them are not sent twice.
        ConnectionLost (everything unacknowledged comes back) when that fails too. True
        when one of them was refused (it went to the DMQ)."""
        first = lost or "no answer"
        self.counters.reconnects += 1
        self._outage(f"target connection lost: {first}")
        self.log.warning(
            "link %s: the target connection failed with %d send(s) unanswered (%s); sending them again",
            self.name,
            len(resend),
            first,
        )
        if self._target is not None:
            assert self._txn is not None
            self._txn.close_target()
            self._target.release(broken=True)
            self._target = self._producer = None
        refused = False
        try:
            producer = self._open_target()
            self._reconnected()
            for ctx in resend:
                ctx.error = None
                headers = ctx.headers
                kwargs = {
                    "delivery_mode": headers[_DELIVERY_MODE],
                    "priority": headers[_PRIORITY],
                    "time_to_live": ctx.time_to_live,
                }
                self.operator.execute(ctx, Stage.SEND, producer.send, ctx.message, ctx.destination, **kwargs)
                if ctx.error is not None:
                    self._refused(ctx)
                    refused = True
        except _TARGET_GONE as exc:
            raise ConnectionLost(f"send: {exc}") from exc
        return refused

    def _refused(self, ctx: ProcessingContext) -> None:
        """A non-transacted link's send of ``ctx`` was refused: the DMQ (SEND_FAILURE)."""
        self.counters.error(f"send to {ctx.destination}: {ctx.failure}")
        self.log.warning(
            "link %s: sending message %s to %s failed (%s); it goes to the DMQ",
            self.name,
            ctx.headers[_MESSAGE_ID],
            ctx.destination,
            ctx.failure,
        )
        ctx.dead(DMQReason.SEND_FAILURE)
        self._to_dmq(ctx, DMQReason.SEND_FAILURE)

    def _send_failed(self, ctx: ProcessingContext, pending: list[ProcessingContext]) -> None:
        txn = self._txn
        assert txn is not None
        if txn.transacted:
            # The chapter: roll back instead of the DMQ; the message comes back (and reaches
            # the DMQ through the backout threshold if it keeps failing).
            self.log.warning(
                "link %s: sending message %s to %s failed (%s); rolling back",
                self.name,
                ctx.headers[_MESSAGE_ID],
                ctx.destination,
                ctx.failure,
            )
            self.counters.error(f"send to {ctx.destination}: {ctx.failure}")
            attempt = ctx.headers[_DELIVERY_COUNT]
            pending.append(ctx)  # undone with the others
            self._back_out(pending, attempt, "a failed send", ctx.error)
            return
        self._refused(ctx)
        pending.append(ctx)
        # Consume it now, with the batch before it: a target that refused a send may drop
        # the connection next (STOMP brokers do), and what comes back after a reconnect
        # would be sent, or dead-lettered, once more.
        self._complete(pending)

    def _back_out(self, pending: list[ProcessingContext], attempt: int, what: str, cause: BaseException | None) -> None:
        """Roll the open unit back after ``what`` failed for one of its messages (with
        ``cause``: an outage excuses them): they come back from the source, and move one
        per transaction until all of them are through again, so that only the failing one
        is backed out once more (it, not its neighbours, reaches the backout threshold).
        Backs off before going on."""
        self.batch.back_out(pending)
        self._roll_back(pending, attempt, what, cause)

    def _roll_back(
        self, pending: list[ProcessingContext], attempt: int, what: str, cause: BaseException | None = None
    ) -> None:
        """Roll the open unit back, then back off so that what keeps failing does not spin."""
        self._abort(pending, cause)
        if not self.operator.backoff(attempt):
            raise Interrupted(f"stopped while backing off after {what}")

    def _abort(self, pending: list[ProcessingContext], cause: BaseException | None = None) -> None:
        """Undo the open unit; its messages come back because of ``cause`` (Batch.returned)."""
        assert self._txn is not None
        self.batch.undone(pending, cause)
        self._txn.abort()

    def _end_unit(self, pending: list[ProcessingContext]) -> None:
        """End the open unit: complete its messages, or close it empty; then wait for the
        units completing behind the link (the source is idle, or a command came)."""
        if pending:
            self._complete(pending)
        elif self.batch.open:
            assert self._txn is not None
            self.batch.open = False
            try:
                self._txn.idle()
            except CONNECTION_LOST as exc:
                raise ConnectionLost(f"idle: {exc}") from exc
        if self.settler.units:
            self._settle(pending, wait=True)

    def _complete(self, pending: list[ProcessingContext]) -> None:
        """Acknowledge or commit the handled messages; a failure sends them to the DMQ."""
        if not pending:
            return
        if len(self._outstanding):
            self._confirm(pending)  # may complete (a refusal) or back out: pending empty
            if not pending:
                return
        txn = self._txn
        assert txn is not None
        if self.settler.units and not self._settle(pending):
            return
        batch = self.batch
        batch.open = False
        final: bool | None
        complete = partial(txn.complete_oldest, len(pending)) if self._halting else txn.complete
        try:
            final = complete()
        except Exception as first:  # retried when retriable (no context: nothing tolerated)
            try:
                final = self.operator.failed(None, txn.completion_stage, first, complete, (), {})
            except JMSException as exc:
                self._completion_failed(pending, exc)
                return
        batch.completed()
        if final is False:  # handed over: final behind the link
            self.settler.handed_over(pending)
        else:
            self.settler.count(pending)
        pending.clear()

    def _settle(self, pending: list[ProcessingContext], wait: bool = False, received: Message | None = None) -> bool:
        """Take the outcomes of the units completing behind the link (Settler). A failed
        one is the chapter's commit failure (DMQ); everything after it comes back from the
        source in order: the units the completer rolled back behind it and the open unit
        ``pending`` (with ``received``, a message taken into it and not handled yet).
        False after a failure."""
        txn = self._txn
        assert txn is not None
        failed = self.settler.settle(txn, wait)
        if failed is None:
            return True
        unit, exc = failed
        if received is not None and received.message_id and outage(exc):
            self.batch.excuse_id(received.message_id)  # undone with the open unit
        if pending:
            self._abort(pending, exc)
        if not isinstance(exc, JMSException):  # the log cannot be written: the link stops
            self.batch.returned(unit, exc)
            raise exc
        self._completion_failed(unit, exc)
        return False

    def _completion_failed(self, pending: list[ProcessingContext], exc: JMSException) -> None:
        """The chapter: a failed acknowledge or commit sends the messages to the DMQ; but
        a transaction that failed before its commit decision was rolled back as a whole:
        its messages come back from the source and none goes to the DMQ (a message is
        never both redelivered and dead)."""
        txn = self._txn
        assert txn is not None
        stage = txn.completion_stage
        self.counters.error(f"{stage.value}: {exc}")
        if txn.all_or_nothing(exc):
            self.log.warning(
                "link %s: %s of %d message(s) failed (%s); they come back from the source",
                self.name,
                stage.value,
                len(pending),
                exc,
            )
            if isinstance(exc, CONNECTION_LOST):
                self._abort(pending, exc)
                raise ConnectionLost(f"{stage.value}: {exc}") from exc
            self._back_out(
                pending, max(ctx.headers[_DELIVERY_COUNT] for ctx in pending), f"a failed {stage.value}", exc
            )
            return
        self.log.warning(
            "link %s: %s of %d message(s) failed (%s); they go to the DMQ", self.name, stage.value, len(pending), exc
        )
        for ctx in pending:
            ctx.fail(stage, exc)
            self._to_dmq(ctx, txn.failure_reason)
        if isinstance(exc, CONNECTION_LOST):
            pending.clear()
            raise ConnectionLost(f"{stage.value}: {exc}") from exc
        if txn.transacted:
            # A failed commit leaves nothing half done: roll back, the messages come back.
            self._roll_back(pending, max(ctx.headers[_DELIVERY_COUNT] for ctx in pending), "a failed commit")
        pending.clear()

    def _to_dmq(self, ctx: ProcessingContext, reason: DMQReason) -> None:
        plan = self._plan
        assert plan is not None
        letter = dead_letter(ctx, plan, reason, self.setup.source)
        result = self.dmqs.send(letter, self._stop)
        if result.interrupted:
            raise Interrupted("stopped while sending to the DMQ")
        self.counters.dead(reason.value, result.taken, ctx.failure)

    def _hold(self) -> bool:
        """Take the state the commands want: wait here while paused; False to stop."""
        with self.lifecycle.cond:
            if self._want is State.PAUSED:
                self._release_idle_target()
                self.lifecycle.set(State.PAUSED)
                self.log.info("link %s paused", self.name)
                while self._want is State.PAUSED:
                    self.lifecycle.cond.wait()
            if self._want is State.STOPPED:
                return False
            if self.lifecycle.state is not State.STARTED:
                self.lifecycle.set(State.STARTED)
                self.log.info("link %s runs", self.name)
            return True


def _lost(error: JMSException | None) -> bool:
    """Whether a send of the window failed because the connection did (not retriable)."""
    return isinstance(error, CONNECTION_LOST) and not isinstance(error, RETRIED)


class _Halt(Exception):
    """The link stops without consuming the current message."""


def local_link(setup: LinkSetup, context: RunnerContext) -> Link:
    """runner=local: the link in a thread of this process."""
    props, name = context.props, setup.config.name
    folder = props.bridge_dir(context.bridge) if props is not None else None
    store = context.excuses
    excused = (
        store(context.bridge, name, context.log)
        if store is not None
        else Excuses(excuses_path(folder, name), context.log)
        if folder
        else None
    )
    return Link(
        setup,
        context.connections,
        context.dmqs,
        context.log,
        context.tuning,
        excused,
        largest_path(folder, name) if folder else None,
    )


register_link_runner(LOCAL, local_link)
