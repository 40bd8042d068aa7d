"""Archive, report and redrive of a JMS bridge's dead message queues.

The three DMQ jobs read DMQ messages as jmsbridge/dmq.py writes them: dmq_endpoint() finds
a bridge's DMQ, dead_row() makes one archive row of a DMQ message, archive() moves the DMQ
into Parquet, report() aggregates from the DMQ or an archive, redrive() resends the chosen
originals to their link's target.

Rules: a DMQ message is acknowledged only after its archive write or its resend returned
(duplicates, never losses); redrive resends only messages whose DMQ marker verifies.
pyspark is imported inside the functions that need it, so the CLI starts fast.

Design notes: docs/spark.md#internals-sparkdmqpy.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from ..jms import codec, naming
from ..jms.destination import Destination, Queue, Topic
from ..jms.errors import JMSException
from ..jms.message import Message
from ..jms.spi import (
    CLIENT_ACKNOWLEDGE,
    INDIVIDUAL_ACKNOWLEDGE,
    Connection,
    ConnectionFactory,
)
from ..jmsbridge import dmq as d
from ..jmsbridge.config import BUILTIN_DMQ, BUILTIN_DMQ_DESTINATION, BridgeConfig
from ..jmsbridge.pipeline import BRIDGE_NAME_PROPERTY, DMQReason
from ..jmsbridge.resolve import (
    HostFactory,
    Lookup,
    resolve_connection_factories,
    with_host_broker,
)
from ..props import clip
from ..transform import MessageTransformer
from .options import SOURCE_ID_PROPERTY

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger("imq.bridge.dmqjobs")

# Every JMS_SUN_JMSBRIDGE_* field of a DMQ message, with its archive column type.
# DMQ_TIMESTAMP is a string property holding milliseconds: archived as a long.
DMQ_FIELDS: tuple[tuple[str, str], ...] = (
    (d.SOURCE_MESSAGEID, "string"),
    (d.SOURCE_TIMESTAMP, "long"),
    (d.SOURCE_CORRELATIONID, "string"),
    (d.SOURCE_JMSTYPE, "string"),
    (d.SOURCE_DESTINATION, "string"),
    (d.TARGET_DESTINATION, "string"),
    (d.TARGET_CURRENT_DESTINATION, "string"),
    (d.SOURCE_PROVIDER, "string"),
    (d.TARGET_PROVIDER, "string"),
    (d.DMQ_REASON, "string"),
    (d.DMQ_EXCEPTION, "string"),
    (d.DMQ_TIMESTAMP, "long"),
    (d.BODY_TRUNCATED, "boolean"),
    (BRIDGE_NAME_PROPERTY, "string"),
)
# The other columns, then the two partition columns (last, as Parquet puts them).
OTHER_COLUMNS: tuple[tuple[str, str], ...] = (
    ("dmq_message_id", "string"),
    ("dmq", "string"),
    ("bridge", "string"),
    ("link", "string"),
    ("dmq_time", "timestamp"),
    ("hour", "string"),
    ("message_type", "string"),
    ("message", "binary"),
    ("truncated_body", "string"),
    ("size", "long"),
    ("verified", "boolean"),  # the bridge's DMQ marker is there and right (see redrive)
)
PARTITIONS: tuple[tuple[str, str], ...] = (("day", "string"), ("reason", "string"))
COLUMNS = tuple(name for name, _ in (*OTHER_COLUMNS, *DMQ_FIELDS, *PARTITIONS))
_SIZE = COLUMNS.index("size")
REPORT_KEYS = ("hour", "reason", "link", "source", "target", "verified")
UNKNOWN_REASON = "UNKNOWN"


class DMQJobError(JMSException, code="DMQ_JOB"):
    """A DMQ job cannot run as asked; the message says what to change."""


def archive_schema() -> StructType:
    from pyspark.sql.types import StructType

    return cast(
        StructType, StructType.fromDDL(", ".join(f"`{n}` {t}" for n, t in (*OTHER_COLUMNS, *DMQ_FIELDS, *PARTITIONS)))
    )


# --- where a DMQ is, and which link a dead message came from -------------------------------


@dataclass(frozen=True)
class Target:
    """Where a link sends: its target connection factory and destination."""

    link: str
    factory_ref: str
    destination: Destination


class LinkIndex:
    """The bridge's links by (source, target) destination names, and their targets."""

    def __init__(self, config: BridgeConfig | None, lookup: Lookup = naming.lookup) -> None:
        from ..jmsbridge.resolve import resolve_destination

        self.bridge = config.name if config is not None else None
        self._by_names: dict[tuple[str, str], Target] = {}
        for link in config.links if config is not None else ():
            if link.target.as_source:
                continue
            assert config is not None  # (it has links)
            try:
                src = resolve_destination(config.destination(link.source.destination_ref), lookup)
                tgt = resolve_destination(config.destination(link.target.destination_ref), lookup)
            except Exception as exc:  # a lookup that fails: that link cannot be matched
                log.warning(
                    "link %s: its destinations cannot be resolved (%s); its dead messages show no link",
                    link.name,
                    clip(str(exc), 200),
                )
                continue
            self._by_names.setdefault((src.name, tgt.name), Target(link.name, link.target.connection_factory_ref, tgt))

    def target(self, dead: Message) -> Target | None:
        """The link (and its target) whose source and target the DMQ message names."""
        key = (_prop(dead, d.SOURCE_DESTINATION), _prop(dead, d.TARGET_DESTINATION))
        return self._by_names.get(key)


@dataclass(frozen=True)
class DMQEndpoint:
    """One DMQ of a bridge: its name, connection factory and queue."""

    name: str
    factory: ConnectionFactory
    queue: Queue
    links: LinkIndex = field(default_factory=lambda: LinkIndex(None))
    marker_key: bytes | None = field(default=None, repr=False)  # the service's DMQ key

    def verified(self, dead: Message) -> bool:
        """Did the bridge service dead-letter ``dead`` (its DMQ marker is right)?"""
        return d.verify_marker(dead, self.marker_key)

    @property
    def bridge(self) -> str | None:
        return self.links.bridge

    def connect(self) -> Connection:
        conn = self.factory.create_connection()
        conn.start()
        return conn


def dmq_endpoint(
    config: BridgeConfig,
    dmq_name: str = BUILTIN_DMQ,
    *,
    host_factory: HostFactory,
    lookup: Lookup | None = None,
    marker_key: bytes | None = None,
) -> DMQEndpoint:
    """The DMQ ``dmq_name`` of the bridge (default the built-in one), ready to connect;
    ``host_factory`` is the host broker (the job's, or the service's); ``marker_key`` the
    service's DMQ key (without it no message counts as the bridge's)."""
    from ..jmsbridge.resolve import resolve_destination

    lookup = lookup or with_host_broker(naming.lookup, host_factory)

    known = [q.name for q in config.dmqs]
    if dmq_name not in known:
        raise DMQJobError(
            f"bridge {config.name} has no DMQ named {dmq_name!r} (its DMQs: "
            f"{', '.join(known)}; see the <dmq> elements of {config.source or 'its XML'})"
        )
    links = LinkIndex(config, lookup)
    dmq = config.dmq(dmq_name)
    if dmq.is_builtin:
        return DMQEndpoint(dmq_name, host_factory({}), Queue(BUILTIN_DMQ_DESTINATION), links, marker_key)
    assert dmq.connection_factory_ref is not None and dmq.destination_ref is not None
    factories, problems = resolve_connection_factories(config, host_factory, lookup, [dmq.connection_factory_ref])
    if problems:
        raise DMQJobError(f"DMQ {dmq_name}: {problems[0]}")
    try:
        dest = resolve_destination(config.destination(dmq.destination_ref), lookup)
    except Exception as exc:
        raise DMQJobError(
            f"DMQ {dmq_name}: destination {dmq.destination_ref} cannot be "
            f"resolved ({type(exc).__name__}: {clip(str(exc), 200)})"
        ) from exc
    if not isinstance(dest, Queue):
        raise DMQJobError(
            f"DMQ {dmq_name} is the topic {dest.name}: only a queue DMQ can be "
            "read by these jobs (subscribe to the topic instead)"
        )
    return DMQEndpoint(dmq_name, factories[dmq.connection_factory_ref], dest, links, marker_key)


# --- one DMQ message as one archive row ----------------------------------------------------


def _prop(message: Message, name: str) -> Any:
    return message.get_object_property(name)


def dmq_timestamp_ms(dead: Message) -> int:
    """JMS_SUN_JMSBRIDGE_DMQ_TIMESTAMP, else (a message someone else put there) JMSTimestamp."""
    value = _prop(dead, d.DMQ_TIMESTAMP)
    try:
        return int(value)
    except (TypeError, ValueError):
        return dead.timestamp


def original_of(dead: Message) -> Message | None:
    """The original message a DMQ message carries; None when only its str() is there."""
    body = dead.get_body()
    return body if isinstance(body, Message) else None


def dead_row(dead: Message, endpoint: DMQEndpoint, keep_message: bool = True) -> tuple[Any, ...]:
    """The archive row of one DMQ message, in COLUMNS order (``keep_message=False``: no
    message bytes, for reports)."""
    ms = dmq_timestamp_ms(dead)
    when = datetime.fromtimestamp(ms / 1000, UTC)
    original = original_of(dead)
    if original is not None:
        encoded = codec.encode(original)
        data: bytes | None = encoded
        text = None
        size = len(encoded)
        kind = original.message_type
    else:
        body = dead.get_body()
        data, text = None, None if body is None else str(body)
        size = len(text.encode("utf-8", "surrogatepass")) if text is not None else 0
        kind = None
    target = endpoint.links.target(dead)
    bridge = endpoint.bridge if target is not None else _prop(dead, BRIDGE_NAME_PROPERTY)
    reason = _prop(dead, d.DMQ_REASON)
    fields = []
    for name, kind_ in DMQ_FIELDS:
        value = _prop(dead, name)
        if value is not None and kind_ == "long":
            value = ms if name == d.DMQ_TIMESTAMP else int(value)
        elif value is not None and kind_ == "boolean":
            value = str(value).lower() == "true"
        elif value is not None:
            value = str(value)
        fields.append(value)
    return (
        dead.message_id,
        endpoint.name,
        bridge,
        target.link if target else None,
        when,
        when.strftime("%Y-%m-%dT%H:00Z"),
        kind,
        data if keep_message else None,
        text if keep_message else None,
        size,
        endpoint.verified(dead),
        *fields,
        when.strftime("%Y-%m-%d"),
        str(reason) if reason is not None else UNKNOWN_REASON,
    )


# --- archive -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArchiveResult:
    messages: int
    chunks: int
    path: str
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {"messages": self.messages, "chunks": self.chunks, "path": self.path, "seconds": round(self.seconds, 3)}


def archive(
    spark: SparkSession,
    endpoint: DMQEndpoint,
    path: str,
    *,
    chunk_size: int = 5000,
    chunk_bytes: int = 64 << 20,
    receive_timeout: float = 1.0,
    limit: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> ArchiveResult:
    """Move the DMQ's messages into Parquet at ``path``; each chunk (``chunk_size``
    messages, or fewer once they hold ``chunk_bytes``) is acknowledged only after its
    write returned (a failed write leaves the chunk in the DMQ and raises). ``progress``
    is told the count archived so far after each chunk."""
    if chunk_size < 1 or chunk_bytes < 1:
        raise DMQJobError(f"a chunk needs room for a message (chunk_size={chunk_size}, chunk_bytes={chunk_bytes})")
    started = time.monotonic()
    total = chunks = 0
    conn = endpoint.connect()
    try:
        session = conn.create_session(ack_mode=CLIENT_ACKNOWLEDGE)
        consumer = session.create_consumer(endpoint.queue)
        while limit is None or total < limit:
            want = chunk_size if limit is None else min(chunk_size, limit - total)
            chunk, rows = _receive_chunk(consumer, endpoint, want, chunk_bytes, receive_timeout)
            if not chunk:
                break
            try:
                write_rows(spark, rows, path)
            except Exception as exc:
                raise DMQJobError(
                    f"writing {len(rows)} DMQ messages to {path} failed; they "
                    f"stay in DMQ {endpoint.name} ({total} archived before): "
                    f"{type(exc).__name__}: {clip(str(exc), 500)}"
                ) from exc
            chunk[-1].acknowledge()  # CLIENT_ACKNOWLEDGE: the whole chunk, after the commit
            total += len(chunk)
            chunks += 1
            log.debug("DMQ %s: %d messages archived to %s (%d so far)", endpoint.name, len(chunk), path, total)
            if progress is not None:
                progress(total)
    finally:
        conn.close()
    return ArchiveResult(total, chunks, path, time.monotonic() - started)


def write_rows(spark: SparkSession, rows: list[tuple[Any, ...]], path: str) -> None:
    """Append archive rows to the Parquet at ``path`` in one write (one commit)."""
    (
        spark.createDataFrame(rows, archive_schema())
        .coalesce(1)
        .write.mode("append")
        .partitionBy(*(n for n, _ in PARTITIONS))
        .parquet(path)
    )


def _receive_chunk(
    consumer: Any, endpoint: DMQEndpoint, want: int, max_bytes: int, timeout: float
) -> tuple[list[Message], list[tuple[Any, ...]]]:
    chunk: list[Message] = []
    rows: list[tuple[Any, ...]] = []
    size = 0
    while len(chunk) < want and size < max_bytes:
        message = consumer.receive(timeout)
        if message is None:
            break
        chunk.append(message)
        rows.append(dead_row(message, endpoint))
        size += rows[-1][_SIZE]
    return chunk, rows


def read_archive(spark: SparkSession, path: str) -> DataFrame:
    """The archive at ``path``, without the duplicates a crash between write and
    acknowledge leaves (same dmq_message_id: the same DMQ message archived twice)."""
    try:
        df = spark.read.schema(archive_schema()).parquet(path)
        df.limit(1).collect()  # a path that is not an archive fails here, not later
    except Exception as exc:  # Spark's errors (missing path, not Parquet, no permission)
        raise DMQJobError(f"the DMQ archive {path} cannot be read: {clip(str(exc), 300)}") from exc
    return df.dropDuplicates(["dmq_message_id"])


# --- report --------------------------------------------------------------------------------


def browse(endpoint: DMQEndpoint, selector: str | None = None) -> Iterator[Message]:
    """The DMQ's messages, left where they are (a QueueBrowser)."""
    conn = endpoint.connect()
    try:
        browser = conn.create_session().create_browser(endpoint.queue, selector)
        try:
            yield from browser
        finally:
            browser.close()
    finally:
        conn.close()


def browse_frame(spark: SparkSession, endpoint: DMQEndpoint) -> DataFrame:
    """The DMQ as archive rows without the message bytes, consuming nothing."""
    return spark.createDataFrame(
        [dead_row(m, endpoint, keep_message=False) for m in browse(endpoint)], archive_schema()
    )


@dataclass(frozen=True)
class ReportRow:
    hour: str
    reason: str
    link: str | None
    source: str | None
    target: str | None
    messages: int
    bytes: int
    verified: bool | None = None  # False: not dead-lettered by the bridge (a forged entry)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in (*REPORT_KEYS, "messages", "bytes")}


def report(df: DataFrame) -> list[ReportRow]:
    """Count and bytes by hour, reason, link, source and target destination."""
    from pyspark.sql import functions as F

    grouped = (
        df.groupBy(
            F.col("hour"),
            F.col("reason"),
            F.col("link"),
            F.col(f"`{d.SOURCE_DESTINATION}`").alias("source"),
            F.col(f"`{d.TARGET_DESTINATION}`").alias("target"),
            F.col("verified"),
        )
        .agg(F.count(F.lit(1)).alias("messages"), F.coalesce(F.sum("size"), F.lit(0)).alias("bytes"))
        .orderBy(*REPORT_KEYS)
    )
    return [
        ReportRow(
            r["hour"],
            r["reason"],
            r["link"],
            r["source"],
            r["target"],
            int(r["messages"]),
            int(r["bytes"]),
            r["verified"],
        )
        for r in grouped.collect()
    ]


# --- times for --since / --until -----------------------------------------------------------

_RELATIVE = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\Z", re.IGNORECASE)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(text: str, now: float | None = None) -> int:
    """Milliseconds since the epoch from ISO 8601 (no offset: local time), 'now', or a
    time ago such as 90s, 15m, 2h, 1d, 1w."""
    now = time.time() if now is None else now
    value = text.strip()
    if value.lower() == "now":
        return int(now * 1000)
    rel = _RELATIVE.match(value)
    if rel:
        return int((now - float(rel.group(1)) * _UNITS[rel.group(2).lower()]) * 1000)
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise DMQJobError(
            f"{text!r} is not a time: write ISO 8601 (2026-11-22T17:00, "
            "2026-11-22T17:00:00Z) or a time ago (30m, 2h, 1d)"
        ) from None
    if when.tzinfo is None:
        when = when.astimezone()  # local time
    return int(when.timestamp() * 1000)


# --- redrive -------------------------------------------------------------------------------


@dataclass
class RedriveItem:
    """One chosen DMQ message: where it goes and what became of it."""

    dmq_message_id: str
    reason: str
    dmq_timestamp: int
    source_message_id: str | None
    link: str | None
    destination: str | None  # "queue:NAME" / "topic:NAME"; None: nowhere to send
    factory: str | None  # the target connection factory ref; None: the host broker
    size: int
    status: str = "chosen"  # chosen, would-send, sent, failed, skipped, unverified, gone
    detail: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class RedriveResult:
    items: list[RedriveItem]
    dry_run: bool

    def count(self, status: str) -> int:
        return sum(1 for i in self.items if i.status == status)

    def as_dict(self) -> dict[str, Any]:
        statuses = sorted({i.status for i in self.items})
        return {
            "dry_run": self.dry_run,
            "chosen": len(self.items),
            **{s: self.count(s) for s in statuses},
            "messages": [i.as_dict() for i in self.items],
        }


def _label(dest: Destination) -> str:
    return f"{'topic' if isinstance(dest, Topic) else 'queue'}:{dest.name}"


def parse_destination(text: str) -> Destination:
    """``queue:NAME``, ``topic:NAME`` or a plain NAME (a queue)."""
    kind, sep, name = text.partition(":")
    if sep and kind.lower() in ("queue", "topic") and name:
        return Topic(name) if kind.lower() == "topic" else Queue(name)
    if not sep and text:
        return Queue(text)
    raise DMQJobError(f"{text!r} is not a destination: write NAME, queue:NAME or topic:NAME")


class _Senders:
    """One connection, transacted session and producer per target connection factory: a
    send counts once its commit returned (a provider may send NON_PERSISTENT messages
    asynchronously, and only the commit says the target has them)."""

    def __init__(self, factories: Callable[[str | None], ConnectionFactory]) -> None:
        self.factories = factories
        self._open: dict[str | None, tuple[Connection, Any, Any]] = {}

    def send(self, ref: str | None, message: Message, dest: Destination, ttl: int) -> None:
        if ref not in self._open:
            conn = self.factories(ref).create_connection()
            session = conn.create_session(transacted=True)
            self._open[ref] = (conn, session, session.create_producer(None))
        _, session, producer = self._open[ref]
        try:
            producer.send(
                message, dest, delivery_mode=message.delivery_mode, priority=message.priority, time_to_live=ttl
            )
            session.commit()
        except Exception:
            try:
                session.rollback()
            except Exception:  # a broken session: a new connection next time
                self._close(self._open.pop(ref)[0])
            raise

    @staticmethod
    def _close(conn: Connection) -> None:
        try:
            conn.close()
        except Exception:  # closing a broken connection: nothing more to do
            pass

    def close(self) -> None:
        for conn, _, _ in self._open.values():
            self._close(conn)


def target_factories(
    config: BridgeConfig | None, host_factory: HostFactory, lookup: Lookup | None = None
) -> Callable[[str | None], ConnectionFactory]:
    """ref -> the bridge's connection factory of that ref; None -> the host broker."""
    lookup = lookup or with_host_broker(naming.lookup, host_factory)

    def factory(ref: str | None) -> ConnectionFactory:
        if ref is None or config is None:
            return host_factory({})
        found, problems = resolve_connection_factories(config, host_factory, lookup, [ref])
        if problems:
            raise DMQJobError(str(problems[0]))
        return found[ref]

    return factory


def restore(dead: Message) -> Message:
    """The original message, writable, with its properties and headers as it had them."""
    original = original_of(dead)
    if original is None:
        raise DMQJobError(f"the DMQ message carries only the original's text ({d.BODY_TRUNCATED}): it cannot be resent")
    return original.copy()


def _time_to_live(original: Message, now_ms: int) -> int:
    """What is left of the original's life; a message past its expiration goes without
    one (a redrive is a deliberate resend, and an expired copy would be dropped at once)."""
    if original.expiration <= 0 or original.expiration <= now_ms:
        return 0
    return original.expiration - now_ms


def choose(
    endpoint: DMQEndpoint, reason: str, since_ms: int, until_ms: int | None = None, to: Destination | None = None
) -> list[RedriveItem]:
    """The DMQ messages with this reason and a DMQ timestamp in [since, until), browsed."""
    items = []
    for dead in browse(endpoint, f"{d.DMQ_REASON} = '{_quote(reason)}'"):
        ms = dmq_timestamp_ms(dead)
        if ms < since_ms or (until_ms is not None and ms >= until_ms):
            continue
        target = endpoint.links.target(dead)
        original = original_of(dead)
        dest = to or (target.destination if target else None)
        item = RedriveItem(
            dead.message_id or "",
            reason,
            ms,
            _prop(dead, d.SOURCE_MESSAGEID),
            target.link if target else None,
            _label(dest) if dest is not None else None,
            target.factory_ref if target else None,
            len(codec.encode(original)) if original is not None else 0,
        )
        if not endpoint.verified(dead):
            item.status, item.detail = "unverified", UNVERIFIED
        elif original is None:
            item.status, item.detail = "skipped", "body truncated: the original is not there"
        elif dest is None:
            item.status, item.detail = (
                "skipped",
                (
                    f"no link of bridge {endpoint.bridge or '(none given)'} goes from "
                    f"{_prop(dead, d.SOURCE_DESTINATION)} to {_prop(dead, d.TARGET_DESTINATION)}; "
                    "give --to"
                ),
            )
        items.append(item)
    return items


UNVERIFIED = "not dead-lettered by this bridge service (its DMQ marker is missing or wrong); left in the DMQ"


def _quote(text: str) -> str:
    return text.replace("'", "''")


def check_reason(reason: str) -> None:
    """A JMS_SUN_JMSBRIDGE_DMQ_REASON value, or DMQJobError listing them."""
    reasons = [r.value for r in DMQReason]
    if reason not in reasons:
        raise DMQJobError(f"{reason!r} is not a DMQ reason (one of {', '.join(reasons)})")


def redrive(
    endpoint: DMQEndpoint,
    reason: str,
    since_ms: int,
    until_ms: int | None = None,
    *,
    to: Destination | None = None,
    transformer: MessageTransformer | None = None,
    dry_run: bool = False,
    factories: Callable[[str | None], ConnectionFactory] | None = None,
    receive_timeout: float = 2.0,
    batch: int = 200,
) -> RedriveResult:
    """Resend the chosen DMQ messages' originals; each DMQ message is consumed only after
    its send returned. ``factories`` (see target_factories) gives a target factory by ref;
    only a dry run goes without."""
    check_reason(reason)
    items = choose(endpoint, reason, since_ms, until_ms, to)
    for item in items:
        if item.status == "chosen" and dry_run:
            item.status = "would-send"
    if dry_run:
        return RedriveResult(items, True)
    todo = {i.dmq_message_id: i for i in items if i.status == "chosen"}
    if factories is None:
        raise DMQJobError("a redrive needs the target factories (target_factories())")
    senders = _Senders(factories)
    conn = endpoint.connect()
    try:
        session = conn.create_session(ack_mode=INDIVIDUAL_ACKNOWLEDGE)
        ids = list(todo)
        for start in range(0, len(ids), batch):
            part = ids[start : start + batch]
            selector = "JMSMessageID IN (" + ", ".join(f"'{_quote(i)}'" for i in part) + ")"
            consumer = session.create_consumer(endpoint.queue, selector)
            try:
                _resend(consumer, {i: todo[i] for i in part}, senders, transformer, receive_timeout)
            finally:
                consumer.close()
    finally:
        senders.close()
        conn.close()  # what was not acknowledged goes back to the DMQ
    for item in todo.values():
        if item.status == "chosen":
            item.status, item.detail = "gone", "no longer in the DMQ (consumed by someone else)"
    return RedriveResult(items, False)


def _resend(
    consumer: Any,
    items: dict[str, RedriveItem],
    senders: _Senders,
    transformer: MessageTransformer | None,
    timeout: float,
) -> None:
    waiting = set(items)
    while waiting:
        dead = consumer.receive(timeout)
        if dead is None:
            return
        key = dead.message_id or ""
        if key not in waiting:
            continue
        waiting.discard(key)
        item = items[key]
        try:
            message = restore(dead)
            if transformer is not None:
                message = _transform(transformer, message, dead)
            message = _stamp(message, item.source_message_id or message.message_id)
            assert item.destination is not None  # (only items with one are resent)
            dest = parse_destination(item.destination)
            senders.send(item.factory, message, dest, _time_to_live(message, int(time.time() * 1000)))
        except Exception as exc:  # provider or plugin code: that message stays in the DMQ
            item.status, item.detail = "failed", f"{type(exc).__name__}: {clip(str(exc), 300)}"
            log.warning(
                "DMQ message %s was not resent to %s; it stays in the DMQ: %s",
                item.dmq_message_id,
                item.destination,
                item.detail,
            )
            continue
        dead.acknowledge()
        item.status = "sent"


def _stamp(message: Message, source_id: str | None) -> Message:
    """The resent message carries its source message id, as a Spark link's messages do:
    a consumer drops a redriven copy of one that did arrive after all."""
    if source_id:
        if message.is_read_only:
            message = message.copy()
        message.set_string_property(SOURCE_ID_PROPERTY, source_id)
    return message


def _transform(transformer: MessageTransformer, message: Message, dead: Message) -> Message:
    transformer.reset(in_bridge_link=False)
    result = transformer.transform(
        message, False, None, str(_prop(dead, d.SOURCE_PROVIDER) or ""), str(_prop(dead, d.TARGET_PROVIDER) or ""), {}
    )
    if not isinstance(result, Message):
        raise DMQJobError(f"transformer {type(transformer).__name__} returned {type(result).__name__}, not a message")
    return result
