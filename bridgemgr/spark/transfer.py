"""One worker's transfer of a Spark link's log slices: the pipeline steps, the send, the DMQ.

A Transfer is one executor worker's side of a runner=spark link (sink.py keeps one per link
and worker), built from the options: the LinkPlan (the local runner's per-message steps,
jmsbridge/pipeline.py), a target connection and the bridge's DMQs. For each record of a task
it runs the steps and sends (stamped with JMS_SUN_JMSBRIDGE_SOURCE_MESSAGEID), dead-letters
or consumes the message, within the link's confirm window.

Rules: write() returns only once every send of the task is confirmed, so the batch Spark
commits is on the target; HALT, a lost target or a retriable send failure fails the task
and the batch runs again (at-least-once).

Design notes: docs/spark.md#internals-sparktransferpy.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..jms import codec
from ..jms.errors import TransportException
from ..jms.message import HEADER_FIELDS, Message
from ..jms.spi import AckMode, MessageProducer, Session
from ..jmsbridge.connections import BridgeConnections, ConnectionKind, Lease
from ..jmsbridge.dmq import DeadMessageQueues, dead_letter
from ..jmsbridge.linkenv import LinkEnvironment
from ..jmsbridge.pipeline import (
    CONNECTION_LOST,
    RETRIED,
    Action,
    DMQReason,
    LinkPlan,
    ProcessingContext,
    RetryWithTolerance,
    Stage,
    keeps_reply_to,
    run_steps,
)
from ..jmsbridge.window import ConfirmWindow
from ..providers.embedded import HostBrokerFactory
from .counts import BatchCounts
from .log import Record
from .options import SOURCE_ID_PROPERTY, LinkOptions
from .slices import task_records

if TYPE_CHECKING:  # pyarrow starts threads: not imported before Spark's daemon forks (daemon.py)
    import pyarrow as pa

log = logging.getLogger("imq.bridge.spark.sink")
_DELIVERY_MODE = HEADER_FIELDS.index("delivery_mode")
_PRIORITY = HEADER_FIELDS.index("priority")


class LinkHalted(Exception):
    """The transformer failed and the link must stop without consuming the message."""


class Transfer:
    """One worker's side of a link: plan, target connection, DMQs."""

    def __init__(self, options: LinkOptions) -> None:
        self.options = options
        self.env = env = LinkEnvironment(options, log, HostBrokerFactory)
        self.stop = threading.Event()
        self.operator = RetryWithTolerance(self.stop, deadline=30.0)
        self.connections = BridgeConnections(env.connectors)
        self.connections.prepare()
        self.dmqs: DeadMessageQueues = env.dead_message_queues(self.connections)
        self.transformer = env.transformer(env.link.target.message_transformer_class)
        self.audited: set[DMQReason] = set()
        self.plans: dict[str, LinkPlan] = {}
        self._target: Lease | None = None
        self.window = max(1, env.link.window if env.link.window is not None else options.window)
        self.window_bytes = env.window_bytes  # (-1: the count alone)

    def plan(self, source_provider: str, target_provider: str) -> LinkPlan:
        plan = self.plans.get(source_provider)
        if plan is None:
            env, cfg = self.env, self.env.link
            plan = self.plans[source_provider] = LinkPlan(
                bridge_name=env.config.name,
                link_name=cfg.name,
                target=env.target,
                retain_reply_to=keeps_reply_to(cfg.target.retain_replyto, source_provider, target_provider),
                tag_bridge_name=env.config.message_transfer_tag_bridge_name,
                consume_on_transform_error=cfg.target.consume_no_transfer_on_transform_error,
                source_provider=source_provider,
                target_provider=target_provider,
                transformer=self.transformer,
                transformer_properties={
                    **{p.name: p.value for p in cfg.target.properties},
                    "JMS_SUN_JMSBRIDGE_NAME": env.config.name,
                },
                destinations=env.destinations,
                backout_threshold=env.options.backout_threshold,
            )
        return plan

    def open_target(self) -> tuple[Session, MessageProducer]:
        """A non-transacted session and producer on the target connection (made on first
        use and kept by the worker)."""
        if self._target is None or self._target.broken:
            self.drop_target()
            ref = self.env.link.target.connection_factory_ref
            # Every worker is a producer of its own: no client id (it would clash).
            self._target = self.connections.lease(ref, ConnectionKind.DEDICATED, None, self.stop)
        session = self._target.connection.create_session(False, AckMode.AUTO_ACKNOWLEDGE)
        producer = session.create_producer(None)
        producer.confirm_sends = True  # a send that waits (a retry) waits for its answer
        return session, producer

    def drop_target(self) -> None:
        if self._target is not None:
            self._target.release(broken=True)
        self._target = None

    def write(self, batches: Iterator[pa.RecordBatch]) -> BatchCounts:
        """A streaming task: its rows' offsets, their records from the shared log or
        from what the driver shipped (slices.task_records)."""
        with task_records(self.options, offset_runs(batches)) as records:
            return self.transfer(records)

    def transfer(self, records: Iterable[tuple[Record, str]]) -> BatchCounts:
        """Transfer ``records`` (log records with their source provider's name); the
        counts once every send is confirmed."""
        task = _Task(*self.open_target())
        assert self._target is not None
        target_provider = self._target.handle.provider_name
        try:
            for record, provider in records:
                task.counts.rows += 1
                plan = self.plan(provider, target_provider)
                ctx = ProcessingContext(codec.decode(record.blob), int(time.time() * 1000))
                self._handle(task, ctx, plan, record.message_id)
                task.held += len(record.blob)
                if len(task.window) >= self.window or 0 < self.window_bytes <= task.held:
                    self._confirm(task)
            self._confirm(task)
            task.session.close()
        except BaseException:
            self.drop_target()  # what is unconfirmed fails with the connection
            raise
        task.counts.reasons = dict(task.reasons)
        return task.counts

    def _handle(self, task: _Task, ctx: ProcessingContext, plan: LinkPlan, message_id: str) -> None:
        out = run_steps(ctx.original, plan, ctx, self.operator)
        if out is not None:
            if out.is_read_only:
                out = out.copy()
            out.set_string_property(SOURCE_ID_PROPERTY, message_id)
            self._send(task, ctx, out, plan)
            if ctx.error is not None:
                self._send_failed(task, ctx, plan)
                return
        if ctx.audit is not None and ctx.audit not in self.audited:
            self.audited.add(ctx.audit)
            self._to_dmq(task, ctx, plan, ctx.audit)
        if ctx.action is Action.HALT:
            raise LinkHalted(
                f"link {plan.link_name}: the transformer failed on message "
                f"{message_id} ({ctx.failure}) and consume-no-transfer-on-"
                "transform-error is false; it stays in the source log"
            )
        if ctx.action is Action.DEAD:
            self._to_dmq(task, ctx, plan, ctx.reason or DMQReason.SEND_FAILURE)
        elif ctx.action is Action.CONSUME:
            task.counts.consumed_only += 1

    def _send(self, task: _Task, ctx: ProcessingContext, out: Message, plan: LinkPlan) -> None:
        """send_async() within the window; a send that raises at once never left: it is
        retried as a send that waits (retriable failures), or recorded on ``ctx``
        (tolerated ones). A lost connection propagates: the task fails and the whole
        batch runs again."""
        headers = ctx.headers
        kwargs = {
            "delivery_mode": headers[_DELIVERY_MODE],
            "priority": headers[_PRIORITY],
            "time_to_live": ctx.time_to_live,
        }
        slot = task.window.add((ctx, plan))
        try:
            task.producer.send_async(out, slot, ctx.destination, **kwargs)
            return
        except Exception as exc:
            task.window.cancel(slot)
            first = exc
        if (
            self.operator.failed(ctx, Stage.SEND, first, task.producer.send, (out, ctx.destination), kwargs) is None
            and ctx.error is None
        ):
            task.counts.transferred += 1

    def _confirm(self, task: _Task) -> None:
        """Wait for the window's sends and take their outcomes in send order."""
        task.held = 0
        if not len(task.window):
            return
        task.producer.flush()
        for (ctx, plan), error in task.window.settled():
            if error is None:
                task.counts.transferred += 1
            elif isinstance(error, CONNECTION_LOST + RETRIED):
                raise error  # the batch runs again (at-least-once)
            else:
                ctx.fail(Stage.SEND, error)
                self._send_failed(task, ctx, plan)
        unanswered = task.window.unsettled()
        if unanswered:
            raise TransportException(
                f"link {self.env.link.name}: {len(unanswered)} send(s) have no answer after flush()"
            )

    def _send_failed(self, task: _Task, ctx: ProcessingContext, plan: LinkPlan) -> None:
        log.warning(
            "link %s: sending message %s to %s failed (%s); it goes to the DMQ",
            plan.link_name,
            ctx.header("message_id"),
            ctx.destination,
            ctx.failure,
        )
        ctx.dead(DMQReason.SEND_FAILURE)
        self._to_dmq(task, ctx, plan, DMQReason.SEND_FAILURE)

    def _to_dmq(self, task: _Task, ctx: ProcessingContext, plan: LinkPlan, reason: DMQReason) -> None:
        letter = dead_letter(ctx, plan, reason, self.env.source)
        result = self.dmqs.send(letter, self.stop)
        task.counts.to_dmq += 1
        task.reasons[reason.value] += 1
        if not result.taken:
            task.counts.dmq_lost += 1


def offset_runs(batches: Iterator[pa.RecordBatch]) -> list[tuple[int, int]]:
    """A task's rows (source log offsets) as runs [lo, hi) of consecutive offsets, in order:
    a slice is one run, read from the log in one pass."""
    runs: list[list[int]] = []
    for batch in batches:
        for offset in batch.column(0).to_pylist():
            if runs and runs[-1][1] == offset:
                runs[-1][1] += 1
            else:
                runs.append([offset, offset + 1])
    return [(lo, hi) for lo, hi in runs]


@dataclass
class _Task:
    """One write(): the target session and producer, the sends outstanding, the counts."""

    session: Session
    producer: MessageProducer
    window: ConfirmWindow[tuple[ProcessingContext, LinkPlan]] = field(default_factory=ConfirmWindow)
    counts: BatchCounts = field(default_factory=BatchCounts)
    reasons: Counter[str] = field(default_factory=Counter)
    held: int = 0  # record bytes of the messages handled since the last confirm
