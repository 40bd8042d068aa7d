# How it works: a Transfer is one executor worker's side of a runner=spark link (the sink,
# sink.py, keeps one per link and worker: worker reuse, the next task of the link finds
# it), built from the options like the driver's receiver: the LinkPlan (the same
# per-message steps as the local runner, jmsbridge/pipeline.py), a target connection and
# the bridge's DMQs. A task's rows are offsets of the source log (source.py): it reads
# those records from the log, and for each decodes the message as received, runs the steps
# and then, as the local runner does: sends it (stamped with JMS_SUN_JMSBRIDGE_SOURCE_
# MESSAGEID, the source's message id, so a consumer can drop the duplicate a crash may
# cause), or gives it to the DMQs (DeadLetter with the DMQ pipeline's reasons: expired,
# transform failure, send failure, backout; the first branch_to / no_transfer of a worker
# as the audit copy), or consumes it (no_transfer). HALT (a transformer failure with
# consume-no-transfer-on-transform-error false) fails the task: the batch is not committed,
# the query stops, and the message stays in the source log for the next start.
#
# A task sends on transacted target sessions and commits every CHUNK messages and at its
# end (sends inside a transaction travel in batches: no round trip per message), so a
# batch Spark commits is on the target. It has two such sessions: while the worker's
# committer thread waits for one chunk's commit (the target writes it to disk: ~10 ms on
# the host broker here, ~20 µs per message of a 500-message chunk), the task sends the
# next chunk on the other session. A chunk's commit is issued only once the one before
# it has been settled, so chunks reach the target in the order of the log. When the
# target refuses a commit (a send in it failed), that chunk is sent again one message at
# a time and only the failing message goes to the DMQ. A lost target connection fails the
# task (what it had not committed is rolled back): the batch runs again when the runner
# restarts the query from its checkpoint (at-least-once). write() returns the task's
# counts.
"""One worker's transfer of a Spark link's log slices: the pipeline steps, the send, the DMQ."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..jms import codec
from ..jms.errors import JMSException
from ..jms.message import HEADER_FIELDS, Message
from ..jms.spi import AckMode, MessageProducer, Session
from ..jmsbridge.connections import BridgeConnections, ConnectionKind, Lease
from ..jmsbridge.dmq import DeadMessageQueues, dead_letter
from ..jmsbridge.pipeline import (
    CONNECTION_LOST,
    Action,
    DMQReason,
    LinkPlan,
    ProcessingContext,
    RetryWithTolerance,
    Stage,
    run_steps,
)
from .counts import BatchCounts
from .linkenv import LinkEnvironment
from .log import SourceLog
from .options import SOURCE_ID_PROPERTY, LinkOptions

if TYPE_CHECKING:  # pyarrow starts threads: not imported before Spark's daemon forks (daemon.py)
    import pyarrow as pa

log = logging.getLogger("imq.bridge.spark.sink")
_DELIVERY_MODE = HEADER_FIELDS.index("delivery_mode")
_PRIORITY = HEADER_FIELDS.index("priority")
CHUNK = 500  # sends per target transaction


class LinkHalted(Exception):
    """The transformer failed and the link must stop without consuming the message."""


class Transfer:
    """One worker's side of a link: plan, target connection, DMQs."""

    def __init__(self, options: LinkOptions) -> None:
        self.env = env = LinkEnvironment(options, log)
        self.stop = threading.Event()
        self.operator = RetryWithTolerance(self.stop, deadline=30.0)
        self.connections = BridgeConnections(env.connectors)
        self.connections.prepare()
        self.dmqs: DeadMessageQueues = env.dead_message_queues(self.connections)
        self.transformer = env.transformer(env.link.target.message_transformer_class)
        self.audited: set[DMQReason] = set()
        self.plans: dict[str, LinkPlan] = {}
        self._target: Lease | None = None
        self.source_log = SourceLog(options.source_log)
        self._committer = ThreadPoolExecutor(1, thread_name_prefix=f"commit {options.link}")

    def plan(self, source_provider: str, target_provider: str) -> LinkPlan:
        plan = self.plans.get(source_provider)
        if plan is None:
            env, cfg = self.env, self.env.link
            plan = self.plans[source_provider] = LinkPlan(
                bridge_name=env.config.name, link_name=cfg.name, target=env.target,
                retain_reply_to=cfg.target.retain_replyto or source_provider == target_provider,
                tag_bridge_name=env.config.message_transfer_tag_bridge_name,
                consume_on_transform_error=cfg.target.consume_no_transfer_on_transform_error,
                source_provider=source_provider, target_provider=target_provider,
                transformer=self.transformer,
                transformer_properties={**{p.name: p.value for p in cfg.target.properties},
                                        "JMS_SUN_JMSBRIDGE_NAME": env.config.name},
                destinations=env.destinations,
                backout_threshold=env.options.backout_threshold)
        return plan

    def open_target(self) -> tuple[Session, MessageProducer]:
        """A transacted session and producer on the target connection (made on first use
        and kept by the worker)."""
        if self._target is None or self._target.broken:
            self.drop_target()
            ref = self.env.link.target.connection_factory_ref
            # Every worker is a producer of its own: no client id (it would clash).
            self._target = self.connections.lease(ref, ConnectionKind.DEDICATED, None,
                                                  self.stop)
        session = self._target.connection.create_session(True, AckMode.AUTO_ACKNOWLEDGE)
        return session, session.create_producer(None)

    def drop_target(self) -> None:
        if self._target is not None:
            self._target.release(broken=True)
        self._target = None

    def write(self, batches: Iterator[pa.RecordBatch]) -> BatchCounts:
        task = _Task((_Chunk(*self.open_target()), _Chunk(*self.open_target())))
        assert self._target is not None
        target_provider = self._target.handle.provider_name
        try:
            for lo, hi in offset_runs(batches):
                for record, provider in self.source_log.read(lo, hi):
                    task.counts.rows += 1
                    plan = self.plan(provider, target_provider)
                    ctx = ProcessingContext(codec.decode(record.blob), int(time.time() * 1000))
                    self._handle(task, ctx, plan, record.message_id)
                    if len(task.filling.sent) >= CHUNK:
                        self._commit(task)
            self._commit(task)
            self._settle(task)
            for chunk in task.chunks:
                chunk.session.close()
        except BaseException:
            self.drop_target()  # a commit in flight fails with the connection
            if task.committing is not None:
                task.committing[1].exception()  # the session is no longer in use
            raise
        task.counts.reasons = dict(task.reasons)
        return task.counts

    def _handle(self, task: _Task, ctx: ProcessingContext, plan: LinkPlan,
                message_id: str) -> None:
        out = run_steps(ctx.original, plan, ctx, self.operator)
        if out is not None:
            if out.is_read_only:
                out = out.copy()
            out.set_string_property(SOURCE_ID_PROPERTY, message_id)
            self._send(task.filling.producer, ctx, out)
            if ctx.error is not None:
                self._send_failed(task, ctx, plan)
                return
            task.filling.sent.append((ctx, out, plan))
        if ctx.audit is not None and ctx.audit not in self.audited:
            self.audited.add(ctx.audit)
            self._to_dmq(task, ctx, plan, ctx.audit)
        if ctx.action is Action.HALT:
            raise LinkHalted(f"link {plan.link_name}: the transformer failed on message "
                             f"{message_id} ({ctx.failure}) and consume-no-transfer-on-"
                             "transform-error is false; it stays in the source log")
        if ctx.action is Action.DEAD:
            self._to_dmq(task, ctx, plan, ctx.reason or DMQReason.SEND_FAILURE)
        elif ctx.action is Action.CONSUME:
            task.counts.consumed_only += 1

    def _send(self, producer: MessageProducer, ctx: ProcessingContext, out: Message) -> None:
        """Send (retriable failures retried, tolerated ones recorded on ``ctx``); a lost
        connection propagates: the task fails and the whole batch runs again."""
        headers = ctx.headers
        kwargs = {"delivery_mode": headers[_DELIVERY_MODE], "priority": headers[_PRIORITY],
                  "time_to_live": ctx.time_to_live}
        try:
            producer.send(out, ctx.destination, **kwargs)
        except Exception as exc:
            self.operator.failed(ctx, Stage.SEND, exc, producer.send, (out, ctx.destination),
                                 kwargs)

    def _send_failed(self, task: _Task, ctx: ProcessingContext, plan: LinkPlan) -> None:
        log.warning("link %s: sending message %s to %s failed (%s); it goes to the DMQ",
                    plan.link_name, ctx.header("message_id"), ctx.destination, ctx.failure)
        ctx.dead(DMQReason.SEND_FAILURE)
        self._to_dmq(task, ctx, plan, DMQReason.SEND_FAILURE)

    def _commit(self, task: _Task) -> None:
        """Hand the filling chunk's commit to the committer thread and fill the other
        session meanwhile; the chunk before it is settled first (chunks stay in order)."""
        chunk = task.filling
        if not chunk.sent:
            return
        self._settle(task)
        task.committing = (chunk, self._committer.submit(chunk.session.commit))
        task.filling = task.chunks[1] if chunk is task.chunks[0] else task.chunks[0]

    def _settle(self, task: _Task) -> None:
        """Wait for the chunk in commit; when the target refused it, send it again singly."""
        if task.committing is None:
            return
        chunk, commit = task.committing
        task.committing = None
        try:
            commit.result()
            task.counts.transferred += len(chunk.sent)
        except CONNECTION_LOST:
            raise
        except JMSException as exc:
            log.warning("link %s: the target refused a chunk of %d message(s) (%s); sending "
                        "them one at a time", self.env.link.name, len(chunk.sent), exc)
            self._send_singly(task, chunk.sent)
        chunk.sent.clear()

    def _send_singly(self, task: _Task, sent: list[tuple[ProcessingContext, Message, LinkPlan]]
                     ) -> None:
        """Send a refused chunk again one message at a time, each committed on its own (a
        send's refusal may only show at the commit): only the message that fails goes to the
        DMQ (SEND_FAILURE), as on the local runner."""
        session, producer = self.open_target()
        for ctx, out, plan in sent:
            ctx.error = None
            self._send(producer, ctx, out)
            if ctx.error is None:
                try:
                    session.commit()
                except CONNECTION_LOST:
                    raise
                except JMSException as exc:
                    ctx.fail(Stage.SEND, exc)
            if ctx.error is not None:
                self._send_failed(task, ctx, plan)
            else:
                task.counts.transferred += 1
        session.close()

    def _to_dmq(self, task: _Task, ctx: ProcessingContext, plan: LinkPlan,
                reason: DMQReason) -> None:
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
class _Chunk:
    """A transacted target session of a task and what was sent on it since its last
    commit (context, message sent, plan)."""

    session: Session
    producer: MessageProducer
    sent: list[tuple[ProcessingContext, Message, LinkPlan]] = field(default_factory=list)


@dataclass
class _Task:
    """One write(): its two chunks, the one it sends on, the one in commit, the counts."""

    chunks: tuple[_Chunk, _Chunk]
    filling: _Chunk = field(init=False)
    committing: tuple[_Chunk, Future] | None = None
    counts: BatchCounts = field(default_factory=BatchCounts)
    reasons: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.filling = self.chunks[0]
