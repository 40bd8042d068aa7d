# How it works: LinkDataSource (format "imqbridge_link") is the Python streaming data
# source of a runner=spark link; its options are a LinkOptions. The reader's
# latestOffset() runs in one long-lived Python process on the driver (Spark's source
# runner), the same reader object every call, so it keeps the source connection: it
#   1. returns what the source log already holds beyond ``start`` (a batch received before
#      a crash that Spark had not planned yet), else
#   2. receives up to maxPerBatch messages (waiting receiveWait seconds for the first,
#      then taking what is there), appends them to a log segment (fsync file and folder:
#      log.py) and only then acknowledges them at the source (CLIENT_ACKNOWLEDGE: exactly
#      the messages received since the last acknowledge, i.e. this batch, in one round
#      trip; nothing else was received on that session), and returns the new offset.
# An offset is {"offset": n}, the log's record count. partitions(start, end) cuts the range
# into `parallelism` slices; read(slice) runs on executors (another reader instance,
# from the options alone) and yields the slice's records as Arrow batches of
# (offset, message_id, provider, data). commit(end) deletes the segments below ``end``:
# Spark calls it for batch N when it plans batch N+1, after batch N is in its commits log.
#
# Failures: the source connection lost while receiving drops the batch (the broker gives
# the unacknowledged messages back) and reconnects on the next call; lost after the log
# write, the logged messages are still the batch (the broker redelivers them too: a
# duplicate, which carries the same source message id). A crash anywhere loses nothing:
# unlogged messages were never acknowledged, logged ones are replayed from the log.
# Trigger.AvailableNow (drain): batches until the source has nothing for receiveWait.
"""The streaming source of a runner=spark link: receive, log (fsync), acknowledge."""

from __future__ import annotations

import logging
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
    """Driver side: receive -> log -> acknowledge; executor side: read log slices."""

    def __init__(self, options: LinkOptions) -> None:
        self.options = options
        # driver side only, made on first use (an executor's instance never connects)
        self._env: LinkEnvironment | None = None
        self._log: SourceLog | None = None
        self._handle: Handle | None = None
        self._session: Session | None = None
        self._consumer: MessageConsumer | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_env": None, "_log": None, "_handle": None,
                "_session": None, "_consumer": None}

    # --- offsets (driver) -----------------------------------------------------------------------
    def initialOffset(self) -> dict:
        bounds = self._source_log().bounds()
        return {"offset": bounds[0] if bounds else 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        """A queue has no "latest offset" to aim at: a drain takes batches until the source
        has had nothing for receiveWait seconds (latestOffset then returns its start)."""
        log.info("link %s: draining until the source is empty", self.options.link)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        first = int(start["offset"])
        cap = self.options.max_per_batch
        if isinstance(limit, ReadMaxRows):
            cap = max(1, min(cap, limit.max_rows))
        source_log = self._source_log()
        bounds = source_log.bounds()
        if bounds is not None and bounds[1] > first:
            return {"offset": min(bounds[1], first + cap)}  # logged before a restart
        messages = self._receive(cap)
        if not messages:
            return start
        assert self._handle is not None
        records = [(m.message_id or "", codec.encode(m)) for m in messages]
        end = source_log.append(first, records, self._handle.provider_name)
        try:
            assert self._session is not None
            self._session.acknowledge()
        except CONNECTION_LOST as exc:
            log.warning("link %s: acknowledging %d logged message(s) failed (%s); the source "
                        "gives them again: duplicates carry the same source message id",
                        self.options.link, len(records), exc)
            self._disconnect()
        return {"offset": end}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return slices(int(start["offset"]), int(end["offset"]), self.options.parallelism)

    def commit(self, end: dict) -> None:
        self._source_log().delete_through(int(end["offset"]))

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

    # --- the source connection (driver) ------------------------------------------------------
    def _source_log(self) -> SourceLog:
        if self._log is None:
            self._log = SourceLog(self.options.source_log).open()
        return self._log

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
        A lost connection gives back what this call received (it was not acknowledged)."""
        try:
            consumer = self._connect()
            batch: list[Message] = []
            message = consumer.receive(self.options.receive_wait)
            while message is not None:
                batch.append(message)
                if len(batch) >= cap:
                    break
                message = consumer.receive(0)
            return batch
        except CONNECTION_LOST as exc:
            log.warning("link %s: the source connection was lost (%s); reconnecting",
                        self.options.link, exc)
            self._disconnect()
            return []
