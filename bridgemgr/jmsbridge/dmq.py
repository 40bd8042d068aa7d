"""The DMQ pipeline: DMQ messages, the DMQ senders and the final log, in the chapter's order.

A link that cannot transfer a message gives it as a DeadLetter to its bridge's
DeadMessageQueues: the built-in DMQ first and, whether it took it or not, every other
enabled <dmq> in file order until one takes it; when none does, FinalLog writes one log line
with every header and property. A DMQSender builds the ObjectMessage with the
JMS_SUN_JMSBRIDGE_* properties (dmq_message(), pure), applies the DMQ's transformer, marks
it with an HMAC (DMQ_MARKER, verified by `dmq redrive`) and sends it up to send-attempts
times.

Rules: failures are logged, never raised (the link goes on); only a stop request ends the
attempts early, and before any DMQ took the message the link leaves it unconsumed
(DMQResult.interrupted); a sender is locked (every link of the bridge may use it).

Design notes: docs/jms-bridges.md#internals-jmsbridgedmqpy.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from ..jms import codec
from ..jms.destination import Destination
from ..jms.message import HEADER_FIELDS, Message, ObjectMessage
from ..jms.spi import MessageProducer, Session
from ..logfiles import PER_MESSAGE
from ..props import clip, is_secret_name
from ..transform import MessageTransformer
from .config import DMQConfig
from .connections import BridgeConnections, ConnectionKind, Lease
from .pipeline import DMQReason, Interrupted, LinkPlan, ProcessingContext

P = "JMS_SUN_JMSBRIDGE_"
BODY_TRUNCATED = P + "DMQ_BODY_TRUNCATED"
DMQ_EXCEPTION = P + "DMQ_EXCEPTION"
DMQ_REASON = P + "DMQ_REASON"
DMQ_TIMESTAMP = P + "DMQ_TIMESTAMP"
SOURCE_CORRELATIONID = P + "SOURCE_CORRELATIONID"
SOURCE_DESTINATION = P + "SOURCE_DESTINATION"
SOURCE_JMSTYPE = P + "SOURCE_JMSTYPE"
SOURCE_MESSAGEID = P + "SOURCE_MESSAGEID"
SOURCE_PROVIDER = P + "SOURCE_PROVIDER"
SOURCE_TIMESTAMP = P + "SOURCE_TIMESTAMP"
TARGET_DESTINATION = P + "TARGET_DESTINATION"
TARGET_CURRENT_DESTINATION = P + "TARGET_CURRENT_DESTINATION"
TARGET_PROVIDER = P + "TARGET_PROVIDER"
DMQ_MARKER = P + "DMQ_MARKER"  # ours: the bridge dead-lettered it (marker(), verify_marker())
# What the marker covers: every property the bridge sets on a DMQ message, and the body.
MARKED = (
    SOURCE_MESSAGEID,
    SOURCE_TIMESTAMP,
    SOURCE_CORRELATIONID,
    SOURCE_JMSTYPE,
    SOURCE_DESTINATION,
    TARGET_DESTINATION,
    TARGET_CURRENT_DESTINATION,
    SOURCE_PROVIDER,
    TARGET_PROVIDER,
    DMQ_REASON,
    DMQ_EXCEPTION,
    DMQ_TIMESTAMP,
    BODY_TRUNCATED,
)


@dataclass(frozen=True)
class DeadLetter:
    """A message for the DMQ, and why."""

    original: Message  # with its headers as received
    reason: DMQReason
    exception: str | None  # the error text or a comment; None if none
    bridge: str
    link: str
    source_destination: str | None
    target_destination: str | None  # where it was meant to go
    target_current_destination: str | None  # where branch_to sent it
    source_provider: str
    target_provider: str


def dead_letter(ctx: ProcessingContext, plan: LinkPlan, reason: DMQReason, link_source: Destination) -> DeadLetter:
    """The DeadLetter of a message a link (local or Spark) cannot transfer: its received
    original, where it came from (``link_source`` when it names no JMSDestination) and
    where it was meant to go (the target, or AS_SOURCE: where it came from)."""
    source = ctx.header("destination")
    target = plan.target if plan.target is not None else source
    return DeadLetter(
        original=ctx.original_message(),
        reason=reason,
        exception=ctx.failure,
        bridge=plan.bridge_name,
        link=plan.link_name,
        source_destination=source.name if source is not None else link_source.name,
        target_destination=target.name if target is not None else None,
        target_current_destination=ctx.destination.name if ctx.destination is not None else None,
        source_provider=plan.source_provider,
        target_provider=plan.target_provider,
    )


def _name(dest: Destination | None) -> str | None:
    return dest.name if dest is not None else None


def dmq_properties(letter: DeadLetter, now_ms: int) -> dict[str, str | int]:
    """Table 12-1 (plus _TARGET_CURRENT_DESTINATION); None values are left out."""
    orig = letter.original
    values: dict[str, str | int | None] = {
        SOURCE_MESSAGEID: orig.message_id,
        SOURCE_TIMESTAMP: orig.timestamp,
        SOURCE_CORRELATIONID: orig.correlation_id,
        SOURCE_JMSTYPE: orig.type,
        SOURCE_DESTINATION: letter.source_destination,
        TARGET_DESTINATION: letter.target_destination,
        TARGET_CURRENT_DESTINATION: letter.target_current_destination,
        SOURCE_PROVIDER: letter.source_provider,
        TARGET_PROVIDER: letter.target_provider,
        DMQ_REASON: letter.reason.value,
        DMQ_EXCEPTION: letter.exception,
        DMQ_TIMESTAMP: str(now_ms),
    }
    return {k: v for k, v in values.items() if v is not None}


def dmq_message(letter: DeadLetter, body: Message, now_ms: int, key: bytes | None = None) -> ObjectMessage:
    """Steps 1, 3 and 4: the DMQ ObjectMessage carrying ``body`` (the original or the DMQ
    transformer's result), or str(original) when the codec cannot encode ``body``; marked
    with ``key`` when given."""
    dead = ObjectMessage()
    for name, ptype, value in letter.original.typed_properties():
        dead.set_typed_property(name, ptype, value)
    for name, value in dmq_properties(letter, now_ms).items():
        if isinstance(value, int):
            dead.set_long_property(name, value)
        else:
            dead.set_string_property(name, value)
    if codec.is_serialisable(body):
        dead.object = body
    else:
        dead.object = str(letter.original)
        dead.set_string_property(BODY_TRUNCATED, "true")
    if key:
        dead.set_string_property(DMQ_MARKER, marker(dead, key))
    return dead


def marker(dead: Message, key: bytes) -> str:
    """HMAC-SHA256 (hex) of the MARKED properties of ``dead`` as it carries them (their
    names, types and values; absent ones too) and of its body (the carried message's codec
    bytes, or the text of a truncated body)."""
    mac = hmac.new(
        key,
        json.dumps([[name, dead.get_object_property(name)] for name in MARKED], separators=(",", ":")).encode(),
        hashlib.sha256,
    )
    body = dead.get_body()
    data = (
        codec.encode(body)
        if isinstance(body, Message)
        else b""
        if body is None
        else str(body).encode("utf-8", "surrogatepass")
    )
    mac.update(b"\0" + data)
    return mac.hexdigest()


def verify_marker(dead: Message, key: bytes | None) -> bool:
    """Did a bridge with ``key`` dead-letter ``dead``? False without a key or a marker."""
    found = dead.get_object_property(DMQ_MARKER)
    if not key or not isinstance(found, str):
        return False
    try:
        expected = marker(dead, key)
    except Exception:  # a body the codec cannot encode: not one the bridge wrote
        return False
    return hmac.compare_digest(found, expected)


def describe(letter: DeadLetter, now_ms: int) -> str:
    """Headers and properties of the original and the DMQ properties, for the final log
    (values of properties named like secrets are not shown)."""
    orig = letter.original
    headers = ", ".join(f"{name}={getattr(orig, name)!r}" for name in HEADER_FIELDS)
    props = ", ".join(
        f"{name}={'********' if is_secret_name(name) else clip(repr(value), 200)}"
        for name, value in orig.properties.items()
    )
    dmq = ", ".join(f"{k}={v!r}" for k, v in dmq_properties(letter, now_ms).items())
    return f"headers: {headers}; properties: {{{props}}}; DMQ properties: {{{dmq}}}"


@dataclass(frozen=True)
class DMQResult:
    taken_by: tuple[str, ...] = ()  # the DMQs that took it, in order; (): only the final log
    interrupted: bool = False  # a stop request ended the attempts first: do not consume

    @property
    def taken(self) -> bool:
        """A DMQ has the message (else only the final log line has it)."""
        return bool(self.taken_by)


class DMQSender:
    """One <dmq>: its destination, connection, transformer and send attempts."""

    def __init__(
        self,
        config: DMQConfig,
        destination: Destination,
        cf_ref: str,
        connections: BridgeConnections,
        log: logging.Logger,
        transformer: MessageTransformer | None = None,
        marker_key: bytes | None = None,
    ) -> None:
        self.config = config
        self.marker_key = marker_key  # the instance's DMQ key (never logged); None: no marker
        self.name = config.name
        self.destination = destination
        self.cf_ref = cf_ref
        self.connections = connections
        self.log = log
        self.transformer = transformer
        self.kind = (
            ConnectionKind.DEDICATED
            if config.is_builtin
            else connections.kind("dmq", cf_ref, config.stay_connected, config.clientid)
        )
        self.properties: Mapping[str, str] = {p.name: p.value for p in config.properties}
        self._lock = threading.Lock()
        self._lease: Lease | None = None
        self._session: Session | None = None
        self._producer: MessageProducer | None = None

    @property
    def label(self) -> str:
        return f"{self.cf_ref}:{self.kind.value}:{self.destination.kind}:{self.destination.name}"

    def ready(self, stop: threading.Event | None = None) -> None:
        """Start step 8: connect now (one attempt), so a broken DMQ shows at start."""
        with self._lock:
            self._open(stop)
            if self.kind is ConnectionKind.POOLED:
                self._drop(False)

    def report(self, letter: DeadLetter, stop: threading.Event) -> bool:
        with self._lock:
            body = self._transform(letter)
            attempts = self.config.send_attempts
            for attempt in range(1, attempts + 1):
                try:
                    producer = self._open(stop)
                    message = dmq_message(letter, body, int(time.time() * 1000), self.marker_key)
                    producer.send(
                        message,
                        self.destination,
                        delivery_mode=letter.original.delivery_mode,
                        priority=letter.original.priority,
                        time_to_live=self.config.time_to_live_in_millis,
                    )
                    if self.kind is ConnectionKind.POOLED:
                        self._drop(False)
                    return True
                except Interrupted:
                    raise
                except Exception as exc:  # provider code: every failure is a failed attempt
                    self._drop(True)
                    self.log.warning(
                        "DMQ %s: send attempt %d of %d of message %s failed: %s: %s",
                        self.name,
                        attempt,
                        attempts,
                        letter.original.message_id,
                        type(exc).__name__,
                        clip(str(exc), 300),
                    )
                if attempt < attempts and stop.wait(self.config.send_attempt_interval_in_seconds):
                    raise Interrupted(f"stopped while sending to DMQ {self.name}")
            return False

    def _transform(self, letter: DeadLetter) -> Message:
        """Step 2; when the transformer fails, the DMQ still gets the original."""
        if self.transformer is None:
            return letter.original
        try:
            self.transformer.reset(in_bridge_link=False)
            result = self.transformer.transform(
                letter.original, True, None, letter.source_provider, letter.target_provider, self.properties
            )
            if isinstance(result, Message):
                return result
            problem = f"returned {type(result).__name__}"
        except Exception as exc:  # plugin code
            problem = f"failed: {type(exc).__name__}: {clip(str(exc), 300)}"
        self.log.warning(
            "DMQ %s: transformer %s %s; the DMQ message carries the original",
            self.name,
            type(self.transformer).__name__,
            problem,
        )
        return letter.original

    def _open(self, stop: threading.Event | None) -> MessageProducer:
        if self._producer is None:
            self._lease = self.connections.lease(self.cf_ref, self.kind, self.config.clientid, stop, attempts=1)
            try:
                self._session = self._lease.connection.create_session()
                self._producer = self._session.create_producer(None)
                self._producer.confirm_sends = True  # "sent" means the DMQ has it
            except BaseException:
                self._drop(True)
                raise
        return self._producer

    def _drop(self, broken: bool) -> None:
        session, lease = self._session, self._lease
        self._session = self._producer = None
        self._lease = None
        if session is not None:
            try:
                session.close()
            except Exception:
                pass
        if lease is not None:
            lease.release(broken)

    def close(self) -> None:
        with self._lock:
            self._drop(False)


class FinalLog:
    """The last resort: one log line with everything known about the message."""

    name = "final-log"

    def __init__(self, log: logging.Logger) -> None:
        self.log = log

    def report(self, letter: DeadLetter, stop: threading.Event) -> bool:
        self.log.error(
            "link %s: no DMQ took message %s (%s: %s); %s",
            letter.link,
            letter.original.message_id,
            letter.reason.value,
            letter.exception,
            describe(letter, int(time.time() * 1000)),
        )
        return True


class DeadMessageQueues:
    """The bridge's DMQs in the chapter's order, then the final log."""

    def __init__(self, senders: list[DMQSender], log: logging.Logger) -> None:
        self.senders = senders  # the built-in DMQ first, then the file's order
        self.final = FinalLog(log)
        self.log = log

    def send(self, letter: DeadLetter, stop: threading.Event) -> DMQResult:
        """The chapter's sequence: the built-in DMQ, then the others until one takes it,
        else the final log."""
        taken: list[str] = []
        for sender in self.senders:
            try:
                took = sender.report(letter, stop)
            except Interrupted:
                if not taken:
                    return DMQResult(interrupted=True)
                self.log.warning(
                    "link %s: stopped while sending message %s to DMQ %s; it is in DMQ %s only",
                    letter.link,
                    letter.original.message_id,
                    sender.name,
                    ", ".join(taken),
                )
                return DMQResult(tuple(taken))
            except Exception:  # a bug in a sender must not stop the link
                self.log.exception("DMQ %s failed", sender.name)
                continue
            if took:
                self.log.info(
                    "link %s: message %s went to DMQ %s (%s%s)",
                    letter.link,
                    letter.original.message_id,
                    sender.name,
                    letter.reason.value,
                    f": {letter.exception}" if letter.exception else "",
                    extra=PER_MESSAGE,
                )
                taken.append(sender.name)
                if not sender.config.is_builtin:
                    break
        if not taken:
            self.final.report(letter, stop)
        return DMQResult(tuple(taken))

    def ready(self, stop: threading.Event | None = None) -> None:
        """Start step 8: the built-in DMQ must connect; others only warn."""
        for sender in self.senders:
            try:
                sender.ready(stop)
            except Exception as exc:
                if sender.config.is_builtin:
                    raise
                self.log.warning("DMQ %s is not ready (%s); it is tried again when needed", sender.name, exc)

    def close(self) -> None:
        for sender in self.senders:
            sender.close()
