"""The per-message steps of a JMS bridge link, and the retry-with-tolerance executor.

run_steps() runs STEPS, the chapter's transfer sequence up to the send, over a received
message with a fresh ProcessingContext and the link's LinkPlan: backout, expiration,
JMSReplyTo, transformer, bridge-name tag, send parameters. A step returns the message to go
on with, or None after setting ctx.action (DEAD, CONSUME or HALT). RetryWithTolerance (as in
Kafka Connect) governs every step and I/O call: retriable errors are retried with backoff
until a deadline, tolerated ones (TOLERANCE) recorded, anything else propagates.

Rules: steps are pure functions: they never send, acknowledge or log (link.py does the
I/O, and the Spark runner reuses the steps); LinkPlan.steps leaves out no-op steps once
per connection.

Design notes: docs/jms-bridges.md#internals-jmsbridgepipelinepy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from operator import attrgetter
from types import MappingProxyType
from typing import Any, TypeVar

from ..backoff import backoff_delay
from ..jms.destination import Destination
from ..jms.errors import (
    IllegalStateException,
    JMSException,
    RetriableTransportException,
    SendCancelled,
    TransportException,
)
from ..jms.message import HEADER_FIELDS, Message
from ..transform import MessageTransformer

T = TypeVar("T")

BRIDGE_NAME_PROPERTY = "JMS_SUN_JMSBRIDGE_NAME"


class Stage(str, Enum):
    RECEIVE = "receive"
    BACKOUT = "backout"
    EXPIRATION = "expiration"
    REPLY_TO = "reply-to"
    TRANSFORM = "transform"
    TAG = "tag"
    ADDRESS = "address"
    SEND = "send"
    ACKNOWLEDGE = "acknowledge"
    COMMIT = "commit"


class Action(Enum):
    TRANSFER = "transfer"  # send ctx.message to ctx.destination, then consume
    CONSUME = "consume"  # consume without sending (no_transfer)
    DEAD = "dead"  # to the DMQ with ctx.reason, then consume
    HALT = "halt"  # stop the link; do not consume (the message is redelivered)


class DMQReason(str, Enum):
    """JMS_SUN_JMSBRIDGE_DMQ_REASON values: the chapter's five, the original's two audit
    reasons, and ours for poison messages."""

    MESSAGE_EXPIRED = "MESSAGE_EXPIRED"
    SEND_FAILURE = "SEND_FAILURE"
    ACK_FAILURE = "ACK_FAILURE"
    TRANSFORM_FAILURE = "TRANSFORM_FAILURE"
    COMMIT_FAILURE = "COMMIT_FAILURE"
    FIRST_TRANSFORMER_BRANCHTO = "FIRST_TRANSFORMER_BRANCHTO"
    FIRST_TRANSFORMER_NOTRANSFER = "FIRST_TRANSFORMER_NOTRANSFER"
    BACKOUT_THRESHOLD_REACHED = "BACKOUT_THRESHOLD_REACHED"


class RetriableError(JMSException, code="RETRIABLE"):
    """A failure that may go away when the same operation is tried again later."""


class TransformError(JMSException, code="TRANSFORM"):
    """The transformer failed, returned None, or asked for something impossible."""


class Interrupted(Exception):
    """The link was told to stop while an operation was being retried."""


# A lost connection is never one message's failure: the link reconnects and the message
# comes back (an IllegalStateException is what a closed session or connection raises).
CONNECTION_LOST: tuple[type[BaseException], ...] = (TransportException, IllegalStateException)
RETRIED: tuple[type[BaseException], ...] = (RetriableError, RetriableTransportException)
# What each stage turns into a per-message failure (recorded on the context) instead of
# letting it propagate. Stages not listed tolerate nothing.
TOLERANCE: Mapping[Stage, tuple[type[BaseException], ...]] = MappingProxyType(
    {
        Stage.TRANSFORM: (Exception,),  # any plugin failure is a transform failure
        Stage.SEND: (JMSException,),
        Stage.ACKNOWLEDGE: (JMSException,),
        Stage.COMMIT: (JMSException,),
    }
)
# ... except these, which propagate from the stage even though they are JMSExceptions.
NEVER_TOLERATED: Mapping[Stage, tuple[type[BaseException], ...]] = MappingProxyType(
    {
        Stage.SEND: CONNECTION_LOST,
    }
)


# The ConnectionMetaData provider names of Message Queue: this broker (in process or over
# mq://, providers/embedded) and Open Message Queue's own Java client ("... Message Queue").
EMBEDDED_PROVIDER = "imqbridge embedded broker"


def is_message_queue(provider_name: str) -> bool:
    return provider_name == EMBEDDED_PROVIDER or provider_name.rstrip().endswith("Message Queue")


def keeps_reply_to(retain_replyto: bool, source_provider: str, target_provider: str) -> bool:
    """The chapter's JMSReplyTo rule: a reply-to is provider dependent, so it is cleared
    unless the target's retain-replyto is true or both ends are Message Queue (two other
    providers, even the same one, need retain-replyto)."""
    return retain_replyto or (is_message_queue(source_provider) and is_message_queue(target_provider))


@dataclass(frozen=True)
class LinkPlan:
    """What the steps need to know about a link, fixed when it connects."""

    bridge_name: str
    link_name: str
    target: Destination | None  # None: AS_SOURCE
    retain_reply_to: bool  # keeps_reply_to(): retain-replyto, or both ends Message Queue
    tag_bridge_name: bool  # message-transfer-tag-bridge-name
    consume_on_transform_error: bool  # consume-no-transfer-on-transform-error
    source_provider: str
    target_provider: str
    transformer: MessageTransformer | None = None
    transformer_properties: Mapping[str, str] = field(default_factory=dict)
    destinations: Mapping[str, Destination] = field(default_factory=dict)  # for branch_to
    backout_threshold: int = 0  # 0: off

    @cached_property
    def steps(self) -> tuple[tuple[Stage, Step], ...]:
        """STEPS without those this link's configuration makes no-ops (hoisted once)."""
        return tuple((stage, step) for stage, step in STEPS if SKIP.get(stage, _never)(self) is False)


_HEADERS = attrgetter(*HEADER_FIELDS)


@dataclass(slots=True, eq=False)
class ProcessingContext:
    """One message's way through a link. ``original`` is the message as received;
    sending changes a message's headers, so their received values are kept in
    ``headers`` and put back by original_message()."""

    original: Message
    now: int  # ms since the epoch when it was received
    headers: tuple[Any, ...] = ()
    stage: Stage = Stage.RECEIVE
    action: Action = Action.TRANSFER
    message: Message | None = None  # what is sent
    destination: Destination | None = None  # where it is sent
    time_to_live: int = 0
    branched: bool = False
    reason: DMQReason | None = None
    error: BaseException | None = None
    detail: str | None = None
    audit: DMQReason | None = None  # FIRST_TRANSFORMER_*: the link may copy it to the DMQ
    attempts: int = 0
    excused: int = 0  # redeliveries that were not its fault
    size: int = 0  # bytes it holds, about (Message.size; a unit's byte bound)

    def __post_init__(self) -> None:
        self.headers = _HEADERS(self.original)

    def original_message(self) -> Message:
        """The original with its received header values back."""
        msg = self.original
        for name, value in zip(HEADER_FIELDS, self.headers):
            setattr(msg, name, value)
        return msg

    def header(self, name: str) -> Any:
        return self.headers[HEADER_FIELDS.index(name)]

    def dead(self, reason: DMQReason, detail: str | None = None) -> None:
        self.action = Action.DEAD
        self.reason = reason
        if detail is not None:
            self.detail = detail

    def fail(self, stage: Stage, error: BaseException) -> None:
        self.stage = stage
        self.error = error

    @property
    def failure(self) -> str | None:
        """The error text or detail (JMS_SUN_JMSBRIDGE_DMQ_EXCEPTION, logs)."""
        if self.error is not None:
            text = str(self.error)
            return f"{type(self.error).__name__}: {text}" if text else type(self.error).__name__
        return self.detail


# --- the steps ----------------------------------------------------------------------------

Step = Callable[[Message, LinkPlan, ProcessingContext], "Message | None"]
_DELIVERY_COUNT = HEADER_FIELDS.index("delivery_count")
_EXPIRATION = HEADER_FIELDS.index("expiration")
_DESTINATION = HEADER_FIELDS.index("destination")


def check_backout(message: Message, plan: LinkPlan, ctx: ProcessingContext) -> Message | None:
    """A message backed out backoutThreshold times is poison: to the DMQ instead of being
    tried again (WebSphere MQ's backout count reaching BOTHRESH). Every redelivery is a
    backout (a rollback, a recover, a restart of the service) except those ``excused``:
    its unit was undone by an outage (excuses.outage: a store, XA log or resource
    manager that could not be reached), not by the message."""
    redeliveries = ctx.headers[_DELIVERY_COUNT] - 1 - ctx.excused
    if plan.backout_threshold and redeliveries >= plan.backout_threshold:
        ctx.dead(
            DMQReason.BACKOUT_THRESHOLD_REACHED,
            f"backed out {redeliveries} times, reaching the backout threshold "
            f"imq.bridge.{plan.bridge_name}.backoutThreshold={plan.backout_threshold}",
        )
        return None
    return message


def check_expiration(message: Message, plan: LinkPlan, ctx: ProcessingContext) -> Message | None:
    """Step 2: an expired message goes to the DMQ and no further."""
    expiration = ctx.headers[_EXPIRATION]
    if expiration and expiration <= ctx.now:
        ctx.dead(DMQReason.MESSAGE_EXPIRED, f"expired at {expiration}, received at {ctx.now}")
        return None
    return message


def clear_reply_to(message: Message, plan: LinkPlan, ctx: ProcessingContext) -> Message:
    """Step 3: JMSReplyTo means nothing to another provider, unless retain-replyto."""
    if message.reply_to is not None and not plan.retain_reply_to:
        message.reply_to = None  # a header: original_message() puts it back
    return message


def apply_transformer(message: Message, plan: LinkPlan, ctx: ProcessingContext) -> Message | None:
    """Step 4: the target's transformer, with its <property> elements; branch_to and
    no_transfer. A failure or a None result raises TransformError (see on_failure)."""
    transformer = plan.transformer
    if transformer is None:
        return message
    transformer.reset(in_bridge_link=True)
    result = transformer.transform(
        message, True, None, plan.source_provider, plan.target_provider, plan.transformer_properties
    )
    outcome = transformer.outcome()
    if outcome.no_transfer:
        ctx.action = Action.CONSUME
        ctx.audit = DMQReason.FIRST_TRANSFORMER_NOTRANSFER
        return None
    if result is None:
        raise TransformError(f"{type(transformer).__name__}.transform() returned None")
    if not isinstance(result, Message):
        raise TransformError(
            f"{type(transformer).__name__}.transform() returned a {type(result).__name__}, not a message"
        )
    if outcome.branch_to is not None:
        ctx.destination = _branch_destination(outcome.branch_to, plan)
        ctx.branched = True
        ctx.audit = DMQReason.FIRST_TRANSFORMER_BRANCHTO
    return result


def _branch_destination(branch: Destination | str, plan: LinkPlan) -> Destination:
    if isinstance(branch, Destination):
        return branch
    found = plan.destinations.get(branch)
    if found is None:
        known = ", ".join(sorted(plan.destinations)) or "none"
        raise TransformError(
            f"branch_to({branch!r}) names no <destination ref-name> of bridge {plan.bridge_name} (known: {known})"
        )
    return found


def tag_bridge_name(message: Message, plan: LinkPlan, ctx: ProcessingContext) -> Message:
    """Step 5: JMS_SUN_JMSBRIDGE_NAME when message-transfer-tag-bridge-name is true."""
    if not plan.tag_bridge_name:
        return message
    if message.is_read_only:  # the received message itself: tag a copy
        message = message.copy()
    message.set_string_property(BRIDGE_NAME_PROPERTY, plan.bridge_name)
    return message


def address(message: Message, plan: LinkPlan, ctx: ProcessingContext) -> Message | None:
    """Step 6's parameters: the destination (branch, target or AS_SOURCE) and the time to
    live left until the original's JMSExpiration."""
    if ctx.destination is None:
        ctx.destination = plan.target if plan.target is not None else ctx.headers[_DESTINATION]
        if ctx.destination is None:
            ctx.dead(DMQReason.SEND_FAILURE, "the target is AS_SOURCE but the message has no JMSDestination")
            return None
    expiration = ctx.headers[_EXPIRATION]
    if expiration:
        ctx.time_to_live = expiration - ctx.now
        if ctx.time_to_live <= 0:
            ctx.dead(DMQReason.MESSAGE_EXPIRED, f"expired at {expiration} before it was sent")
            return None
    ctx.message = message
    return message


STEPS: tuple[tuple[Stage, Step], ...] = (
    (Stage.BACKOUT, check_backout),
    (Stage.EXPIRATION, check_expiration),
    (Stage.REPLY_TO, clear_reply_to),
    (Stage.TRANSFORM, apply_transformer),
    (Stage.TAG, tag_bridge_name),
    (Stage.ADDRESS, address),
)
# When a step has nothing to do for a whole link (LinkPlan.steps leaves it out).
SKIP: Mapping[Stage, Callable[[LinkPlan], bool]] = MappingProxyType(
    {
        Stage.BACKOUT: lambda plan: not plan.backout_threshold,
        Stage.REPLY_TO: lambda plan: plan.retain_reply_to,
        Stage.TRANSFORM: lambda plan: plan.transformer is None,
        Stage.TAG: lambda plan: not plan.tag_bridge_name,
    }
)


def _never(plan: LinkPlan) -> bool:
    return False


def on_transform_failure(plan: LinkPlan, ctx: ProcessingContext) -> None:
    """consume-no-transfer-on-transform-error: true -> DMQ and consume; false -> stop the
    link, consuming nothing."""
    if plan.consume_on_transform_error:
        ctx.dead(DMQReason.TRANSFORM_FAILURE)
    else:
        ctx.action = Action.HALT


def run_steps(message: Message, plan: LinkPlan, ctx: ProcessingContext, operator: RetryWithTolerance) -> Message | None:
    """The message to send (ctx.destination, ctx.time_to_live set), or None with
    ctx.action saying what to do instead."""
    msg = message
    for stage, step in plan.steps:
        try:  # the first attempt inline: this runs for every message
            out = step(msg, plan, ctx)
        except Exception as exc:
            out = operator.failed(ctx, stage, exc, step, (msg, plan, ctx), {})
        if out is None:
            if ctx.error is not None and ctx.stage is Stage.TRANSFORM:
                on_transform_failure(plan, ctx)
            return None
        msg = out
    return msg


# --- retry with tolerance ----------------------------------------------------------------------


class RetryWithTolerance:
    """Runs an operation for a stage: retries retriable errors with exponential backoff
    until ``deadline`` seconds, records tolerated errors on the context, raises the rest."""

    def __init__(
        self,
        stop: threading.Event | None = None,
        deadline: float = 30.0,
        initial: float = 0.3,
        maximum: float = 10.0,
        tolerance: Mapping[Stage, tuple[type[BaseException], ...]] = TOLERANCE,
    ) -> None:
        self.stop = stop or threading.Event()
        self.deadline = deadline
        self.initial = initial
        self.maximum = maximum
        self.tolerance = tolerance

    def execute(
        self, ctx: ProcessingContext | None, stage: Stage, operation: Callable[..., T], *args: Any, **kwargs: Any
    ) -> T | None:
        """``operation(*args, **kwargs)``; None with ctx.error set when the stage tolerated
        its error (without a context nothing is tolerated)."""
        try:
            return operation(*args, **kwargs)
        except Exception as exc:
            return self.failed(ctx, stage, exc, operation, args, kwargs)

    def failed(
        self,
        ctx: ProcessingContext | None,
        stage: Stage,
        first: Exception,
        operation: Callable[..., T],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
    ) -> T | None:
        """After ``operation`` raised ``first``: retry, tolerate or raise (see execute)."""
        if ctx is not None:
            ctx.stage = stage
        if isinstance(first, SendCancelled):  # the link's stop gave up a held send
            raise Interrupted(f"stopped while {stage.value} was held: {first}") from first
        error: Exception = first
        give_up = time.monotonic() + self.deadline
        delay = self.initial
        while isinstance(error, RETRIED):
            if ctx is not None:
                ctx.attempts += 1
            now = time.monotonic()
            if now >= give_up:
                break
            if self.stop.wait(min(delay, give_up - now)):
                raise Interrupted(f"stopped while retrying {stage.value}: {error}") from error
            delay = min(delay * 2, self.maximum)
            try:
                return operation(*args, **kwargs)
            except Exception as exc:
                error = exc
        if (
            ctx is None
            or isinstance(error, NEVER_TOLERATED.get(stage, ()))
            or not isinstance(error, self.tolerance.get(stage, ()))
        ):
            raise error
        ctx.fail(stage, error)
        return None

    def backoff(self, attempt: int) -> bool:
        """Wait before trying again after ``attempt`` failures in a row; False if stopped."""
        delay = backoff_delay(self.initial, attempt, self.maximum)
        return not self.stop.wait(delay)
