# How it works: LinkDataSource (format "imqbridge_link") is the Python streaming data
# source of a runner=spark link; its options are a LinkOptions. The reader's driver-side
# methods (latestOffset, partitions, commit) run in one long-lived Python process on the
# driver (Spark's source runner), the same reader object every call. Its Receiver keeps
# the source connection and a thread that stays ahead of Spark: while the executors work
# on one batch it receives the next (up to maxPerBatch messages: it waits receiveWait
# seconds for the first, then takes what is there), appends them to a segment of the
# source log (fsync file and folder: log.py) and only then acknowledges them at the source
# (CLIENT_ACKNOWLEDGE: exactly the messages received since the last acknowledge, i.e. that
# segment, in one round trip). latestOffset(start) returns the log's end (at most
# maxPerBatch past start), waiting up to receiveWait when nothing is logged yet; what a
# crash left logged but unplanned is simply there at the next start.
# An offset is {"offset": n}, the log's record count. partitions(start, end) cuts the range
# into `parallelism` slices; read(slice) runs on executors (another reader instance,
# from the options alone) and yields the slice's records as Arrow batches of
# (offset, message_id, provider, data). commit(end) deletes the segments below ``end``:
# Spark calls it for batch N when it plans batch N+1, after batch N is in its commits log.
#
# Failures: the source connection lost while receiving drops that receive (the broker
# gives the unacknowledged messages back) and the thread reconnects with backoff; lost
# after the log write, the logged messages stay logged (the broker redelivers them too: a
# duplicate, which carries the same source message id). A crash anywhere loses nothing:
# unlogged messages were never acknowledged, logged ones are replayed from the log.
# Trigger.AvailableNow (drain): batches until the source has nothing for receiveWait.
# The thread logs in segments of a tenth of maxPerBatch (at least SEGMENT_MIN): the first
# batch is planned as soon as one segment is logged instead of after a whole batch.
"""The streaming source of a runner=spark link: receive, log (fsync), acknowledge."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from ..jms import codec
from ..jms.message import Message
from ..jms.spi import AckMode, MessageConsumer, Session
from ..jmsbridge.connections import Handle
from ..jmsbridge.pipeline import CONNECTION_LOST
from .linkenv import FORMAT, SCHEMA, LinkEnvironment, LinkOptions
from .log import SourceLog

log = logging.getLogger("imq.bridge.spark.source")
ARROW_ROWS = 1024  # rows per Arrow batch that read() yields
DRAIN_FAILURES = 5  # receive failures in a row after which a drain gives up
SEGMENT_MIN = 500  # messages: below this, a segment's fsync and acknowledge cost too much
_ARROW_SCHEMA = pa.schema([("offset", pa.int64()), ("message_id", pa.string()),
                           ("provider", pa.string()), ("data", pa.binary())])


class LinkDataSource(DataSource):
    """A link's source (streamReader) and target (streamWriter) for Structured Streaming."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> "LinkStreamReader":
        return LinkStreamReader(LinkOptions.from_options(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from .sink import LinkStreamWriter
        return LinkStreamWriter(LinkOptions.from_options(self.options))


class LogSlice(InputPartition):
    """Offsets lo .. hi-1 of the source log: one executor task."""

    def __init__(self, lo: int, hi: int) -> None:
        super().__init__((lo, hi))
        self.lo, self.hi = lo, hi


def slices(lo: int, hi: int, parts: int) -> list[LogSlice]:
    """[lo, hi) cut into at most ``parts`` nearly equal slices (none when empty)."""
    n = hi - lo
    parts = max(1, min(parts, n))
    if n <= 0:
        return []
    bounds = [lo + n * i // parts for i in range(parts + 1)]
    return [LogSlice(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


class LinkStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver side: receive -> log -> acknowledge, ahead of Spark; executor side: read log
    slices."""

    def __init__(self, options: LinkOptions) -> None:
        self.options = options
        # driver side only, made on first use (an executor's instance never connects)
        self._receiver: Receiver | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_receiver": None}

    # --- offsets (driver) -----------------------------------------------------------------------
    def _driver(self) -> "Receiver":
        if self._receiver is None:
            self._receiver = Receiver(self.options)
        return self._receiver

    def initialOffset(self) -> dict:
        bounds = self._driver().log.bounds()
        return {"offset": bounds[0] if bounds else 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        """A queue has no "latest offset" to aim at: a drain takes batches until the source
        has had nothing for receiveWait seconds (latestOffset then returns its start)."""
        self._driver().until_empty = True

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        first = int(start["offset"])
        cap = self.options.max_per_batch
        if isinstance(limit, ReadMaxRows):
            cap = max(1, min(cap, limit.max_rows))
        end = self._driver().logged_beyond(first, self.options.receive_wait)
        return {"offset": min(end, first + cap)} if end > first else start

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return slices(int(start["offset"]), int(end["offset"]), self.options.parallelism)

    def commit(self, end: dict) -> None:
        self._driver().log.delete_through(int(end["offset"]))

    # --- executors ------------------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LogSlice)
        source_log = SourceLog(self.options.source_log)
        columns: tuple[list[Any], ...] = ([], [], [], [])
        for record, provider in source_log.read(partition.lo, partition.hi):
            offsets, ids, providers, data = columns
            offsets.append(record.offset)
            ids.append(record.message_id)
            providers.append(provider)
            data.append(record.blob)
            if len(offsets) >= ARROW_ROWS:
                yield pa.RecordBatch.from_arrays(list(columns), schema=_ARROW_SCHEMA)
                columns = ([], [], [], [])
        if columns[0]:
            yield pa.RecordBatch.from_arrays(list(columns), schema=_ARROW_SCHEMA)


class Receiver:
    """The driver's side of the source: a thread that keeps one batch (maxPerBatch
    messages) received, logged and acknowledged beyond the batch Spark works on (so that
    receiving overlaps the executors' work), and the log it writes."""

    def __init__(self, options: LinkOptions) -> None:
        self.options = options
        self.log = SourceLog(options.source_log).open()
        bounds = self.log.bounds()
        self.end = bounds[1] if bounds else 0   # the offset after the last logged record
        self.planned = 0                        # the start of the batch Spark asked for last
        self.until_empty = False                # availableNow: stop at an empty source
        self.drained = False
        self.error: Exception | None = None     # why a drain's receiving gave up
        self.cond = threading.Condition()
        self._env: LinkEnvironment | None = None
        self._handle: Handle | None = None
        self._session: Session | None = None
        self._consumer: MessageConsumer | None = None
        self._thread: threading.Thread | None = None

    def logged_beyond(self, start: int, wait: float) -> int:
        """The log's end once it is past ``start`` (waiting up to ``wait`` s for the
        receiving thread); ``start`` when nothing came."""
        with self.cond:
            self.planned = start
            self.end = max(self.end, start)  # segments below start may be gone already
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"receive {self.options.link}")
                self._thread.start()
            self.cond.notify_all()
            # a drain needs an answer (returning start ends it); a stream asks again later
            deadline = None if self.until_empty else time.monotonic() + wait
            while self.end <= start and not self.drained:
                if self.error is not None:
                    raise self.error
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self.cond.wait(remaining if remaining is not None else 1.0)
            return self.end

    def _run(self) -> None:
        failures = 0
        while True:
            most = self.options.max_per_batch
            with self.cond:
                # the batch Spark works on (from planned) and one more, received ahead
                while self.end - self.planned >= 2 * most or self.drained:
                    self.cond.wait()
                start = self.end
                room = min(most, 2 * most - (self.end - self.planned))
            # in segments of a tenth of a batch: the first batch starts as soon as its first
            # segment is logged (executors start early), later batches take what is logged
            room = min(room, max(SEGMENT_MIN, most // 10))
            try:
                end = self._receive_batch(start, room)
                failures = 0
            except Exception as exc:  # the source is unreachable, or refused something
                failures += 1
                log.warning("link %s: receiving failed (%s: %s); trying again",
                            self.options.link, type(exc).__name__, exc)
                self._disconnect()
                if self.until_empty and failures >= DRAIN_FAILURES:
                    with self.cond:  # a drain gives up: latestOffset raises it
                        self.error = exc
                        self.cond.notify_all()
                    return
                time.sleep(min(0.5 * 2 ** failures, 10.0))
                continue
            with self.cond:
                if end > start:
                    self.end = end
                elif self.until_empty:
                    self.drained = True
                self.cond.notify_all()

    def _receive_batch(self, start: int, room: int) -> int:
        """Receive up to ``room`` messages, log them from ``start``, acknowledge them; the
        log's end after them (``start`` when the source had nothing)."""
        messages = self._receive(room)
        if not messages:
            return start
        assert self._handle is not None
        records = [(m.message_id or "", codec.encode(m)) for m in messages]
        end = self.log.append(start, records, self._handle.provider_name)
        try:
            assert self._session is not None
            self._session.acknowledge()
        except CONNECTION_LOST as exc:
            log.warning("link %s: acknowledging %d logged message(s) failed (%s); the source "
                        "gives them again: duplicates carry the same source message id",
                        self.options.link, len(records), exc)
            self._disconnect()
        return end

    def _connect(self) -> MessageConsumer:
        if self._consumer is not None:
            if self._handle is not None and not self._handle.broken.is_set():
                return self._consumer
            self._disconnect()
        if self._env is None:
            self._env = LinkEnvironment(self.options, log)
        env = self._env
        cfg = env.link.source
        handle = env.connectors[cfg.connection_factory_ref].connect(cfg.clientid)
        try:
            session = handle.connection.create_session(False, AckMode.CLIENT_ACKNOWLEDGE)
            src = env.source
            if src.is_topic and cfg.durable_sub:
                consumer = session.create_durable_subscriber(src, cfg.durable_sub,  # type: ignore[arg-type]
                                                             cfg.selector)
            else:
                consumer = session.create_consumer(src, cfg.selector)
            handle.connection.start()
        except BaseException:
            handle.close()
            raise
        self._handle, self._session, self._consumer = handle, session, consumer
        log.info("link %s: receiving from %s on the driver", self.options.link, src)
        return consumer

    def _disconnect(self) -> None:
        if self._handle is not None:
            self._handle.close()  # unacknowledged messages go back to the source
        self._handle = self._session = self._consumer = None

    def _receive(self, cap: int) -> list[Message]:
        """Up to ``cap`` messages: wait receiveWait for the first, then take what is there.
        A lost connection raises: what this call received was not acknowledged, and the
        source gives it back."""
        consumer = self._connect()
        batch: list[Message] = []
        message = consumer.receive(self.options.receive_wait)
        while message is not None:
            batch.append(message)
            if len(batch) >= cap:
                break
            message = consumer.receive(0)
        return batch
