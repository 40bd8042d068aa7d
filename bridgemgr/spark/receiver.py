"""The driver's receiver of a runner=spark link: receive, log (fsync), acknowledge.

A Receiver keeps the source connection and a thread that stays ahead of Spark: it receives
the next batch while the executors work on one, appends it to the source log in segments
(log.py) and only then acknowledges it at the source. It also prefetches in the driver's own
process while Spark starts the query, runs a drain (until_empty), and holds while the job
has no executor (the file .hold).

Rules: log, then ack: a crash anywhere loses nothing (unlogged messages were never
acknowledged, logged ones are replayed); a segment ends at the link's windowBytes, so the
driver never holds much more than that of a segment's records.

Design notes: docs/spark.md#internals-sparkreceiverpy.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..backoff import backoff_delay
from ..jms import codec
from ..jms.destination import Topic
from ..jms.spi import AckMode, MessageConsumer, Session
from ..jmsbridge.connections import Handle
from ..jmsbridge.link import PREFETCH_WINDOWS
from ..jmsbridge.linkenv import LinkEnvironment
from ..jmsbridge.pipeline import CONNECTION_LOST
from ..providers.embedded import HostBrokerFactory
from .log import SourceLog
from .options import LinkOptions

log = logging.getLogger("imq.bridge.spark.source")
DRAIN_FAILURES = 5  # receive failures in a row after which a drain gives up
SEGMENT_MIN = 500  # messages: below this, a segment's fsync and acknowledge cost too much
HANDOVER_WAIT = 60.0  # s: how long the source runner waits for the prefetcher to let go
PREFETCH_WAIT = 0.2  # s: a prefetcher's receive wait (it answers a handover request within)
HOLD = ".hold"  # in the source log's folder: the query has no executor, receive nothing


def hold_receiving(source_log: str | Path, on: bool) -> None:
    """Ask the link's receiver to take nothing more from the source (``on``), or to carry on."""
    from ..private import private_dir

    path = Path(source_log) / HOLD
    if on:
        private_dir(path.parent)
        path.touch()
    else:
        path.unlink(missing_ok=True)


class Receiver:
    """The driver's side of the source: a thread that keeps one batch (maxPerBatch
    messages) received, logged and acknowledged beyond the batch Spark works on (so that
    receiving overlaps the executors' work), and the log it writes."""

    def __init__(self, options: LinkOptions, source_log: SourceLog | None = None) -> None:
        """The receiver of Spark's source runner or of a drain: it takes the log over (from a
        prefetcher)."""
        self.options = options
        if source_log is None:
            source_log = SourceLog(options.source_log)
            source_log.own(wait=HANDOVER_WAIT)
        self.log = source_log.open()
        bounds = self.log.bounds()
        self.end = bounds[1] if bounds else 0  # the offset after the last logged record
        self.planned = bounds[0] if bounds else 0  # the batch Spark asked for last starts here
        self.until_empty = False  # a drain: stop at an empty source
        self.drained = False
        self.error: Exception | None = None  # why a drain's receiving gave up
        self.cond = threading.Condition()
        self._env: LinkEnvironment | None = None
        self._handle: Handle | None = None
        self._session: Session | None = None
        self._consumer: MessageConsumer | None = None
        self._thread: threading.Thread | None = None
        self._stopped = False  # stop(): the thread ends, the source and the log are let go
        self._connect_attempts: int | None = None  # the factory's; a prefetch tries once

    @classmethod
    def prefetching(cls, options: LinkOptions) -> Receiver | None:
        """A receiver for prefetch(), when no one writes the link's log (None otherwise)."""
        source_log = SourceLog(options.source_log)
        if not source_log.own(wait=None):
            return None
        receiver = cls(options, source_log)
        receiver._connect_attempts = 1  # a source it cannot reach is left to the query's own
        return receiver

    def prefetch(self, active: Callable[[], bool]) -> None:
        """(A thread of the driver's process) receive, log and acknowledge ahead of a query
        being started, up to two batches beyond the log's start, until the source runner
        asks for the log or ``active()`` is false; then let go of the source and the log."""
        try:
            env = self._environment()
            if env.source.is_topic and not env.link.source.durable_sub:
                return
            while active() and not self.log.handover_requested():
                room = self._room()
                if room == 0:
                    if self._held():
                        self._disconnect()
                    time.sleep(PREFETCH_WAIT)
                    continue
                self.end = self._receive_batch(self.end, room, PREFETCH_WAIT)
        except Exception as exc:  # the source runner's receiver receives (and retries) itself
            log.warning("link %s: prefetching stopped (%s: %s)", self.options.link, type(exc).__name__, exc)
        finally:
            self._disconnect()
            self.log.let_go()
            log.info("link %s: prefetched up to offset %d", self.options.link, self.end)

    def logged_beyond(self, start: int, wait: float) -> int:
        """The log's end once it is past ``start`` (waiting up to ``wait`` s for the
        receiving thread); ``start`` when nothing came."""
        with self.cond:
            self.planned = start
            self.end = max(self.end, start)  # segments below start may be gone already
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name=f"receive {self.options.link}")
                self._thread.start()
            self.cond.notify_all()
            # a drain needs an answer (returning start ends it); a stream asks again later
            deadline = None if self.until_empty else time.monotonic() + wait
            while self.end <= start and not self.drained and not self._stopped:
                if self.error is not None:
                    raise self.error
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self.cond.wait(remaining if remaining is not None else 1.0)
            return self.end

    def stop(self) -> None:
        """The query ended: end the receiving thread (within a receive's wait), close the
        source connection (what was received but not logged goes back to the source) and
        let go of the log, so that nothing keeps reconnecting to a source after its query."""
        with self.cond:
            self._stopped = True
            self.cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(self.options.receive_wait + 5.0)
        if thread is None or not thread.is_alive():
            self._disconnect()
        self.log.let_go()

    def _run(self) -> None:
        failures = 0
        while True:
            with self.cond:
                while not self._stopped and (self._room() == 0 or self.drained):
                    held = self._held()
                    if held:  # what the source sent ahead of receive goes back to it
                        self._disconnect()
                    self.cond.wait(PREFETCH_WAIT if held else None)
                if self._stopped:
                    return
                start, room = self.end, self._room()
            try:
                end = self._receive_batch(start, room)
                failures = 0
            except Exception as exc:  # the source is unreachable, or refused something
                if self._stopped:
                    return
                failures += 1
                log.warning(
                    "link %s: receiving failed (%s: %s); trying again", self.options.link, type(exc).__name__, exc
                )
                self._disconnect()
                if self.until_empty and failures >= DRAIN_FAILURES:
                    with self.cond:  # a drain gives up: latestOffset raises it
                        self.error = exc
                        self.cond.notify_all()
                    return
                with self.cond:  # the backoff, cut short by stop()
                    self.cond.wait_for(lambda: self._stopped, backoff_delay(0.5, failures + 1, 10.0))
                continue
            with self.cond:
                if end > start:
                    self.end = end
                elif self.until_empty:
                    self.drained = True
                self.cond.notify_all()

    def _room(self) -> int:
        """How many messages to receive next: the batch Spark works on (from planned) and
        one more are received ahead (0: that far already, or held), in segments of a tenth of a
        batch (the first batch starts as soon as its first segment is logged: executors
        start early; later batches take what is logged)."""
        if self._held():
            return 0
        most = self.options.max_per_batch
        room = min(most, 2 * most - (self.end - self.planned))
        return max(0, min(room, max(SEGMENT_MIN, most // 10)))

    def _held(self) -> bool:
        return (Path(self.options.source_log) / HOLD).exists()

    def _receive_batch(self, start: int, room: int, wait: float | None = None) -> int:
        """Receive up to ``room`` messages (waiting ``wait`` s, receiveWait by default, for
        the first), log them from ``start``, acknowledge them; the log's end after them
        (``start`` when the source had nothing)."""
        records = self._receive(room, self.options.receive_wait if wait is None else wait)
        if not records:
            return start
        assert self._handle is not None
        end = self.log.append(start, records, self._handle.provider_name)
        try:
            assert self._session is not None
            self._session.acknowledge()
        except CONNECTION_LOST as exc:
            log.warning(
                "link %s: acknowledging %d logged message(s) failed (%s); the source "
                "gives them again: duplicates carry the same source message id",
                self.options.link,
                len(records),
                exc,
            )
            self._disconnect()
        return end

    def _connect(self) -> MessageConsumer:
        if self._consumer is not None:
            if self._handle is not None and not self._handle.broken.is_set():
                return self._consumer
            self._disconnect()
        env = self._environment()
        cfg = env.link.source
        handle = env.connectors[cfg.connection_factory_ref].connect(cfg.clientid, attempts=self._connect_attempts)
        try:
            session = handle.connection.create_session(False, AckMode.CLIENT_ACKNOWLEDGE)
            # a segment's worth unacknowledged at most; what the source sends ahead held to
            # PREFETCH_WINDOWS segments of windowBytes where it can (mq://), as a local link's
            most = self._environment().window_bytes
            session.prefetch_at_least(
                max(SEGMENT_MIN, self.options.max_per_batch // 10), PREFETCH_WINDOWS * most if most > 0 else 0
            )
            src = env.source
            if isinstance(src, Topic) and cfg.durable_sub:  # (is_topic: a Topic)
                consumer = session.create_durable_subscriber(src, cfg.durable_sub, cfg.selector)
            else:
                consumer = session.create_consumer(src, cfg.selector)
            handle.connection.start()
        except BaseException:
            handle.close()
            raise
        self._handle, self._session, self._consumer = handle, session, consumer
        log.info("link %s: receiving from %s on the driver", self.options.link, src)
        return consumer

    def _environment(self) -> LinkEnvironment:
        if self._env is None:
            self._env = LinkEnvironment(self.options, log, HostBrokerFactory)
        return self._env

    def _disconnect(self) -> None:
        if self._handle is not None:
            self._handle.close()  # unacknowledged messages go back to the source
        self._handle = self._session = self._consumer = None

    def _receive(self, cap: int, wait: float) -> list[tuple[str, bytes]]:
        """Up to ``cap`` messages as log records (message id, codec blob), fewer once they
        hold the link's windowBytes (the last one may cross it): wait ``wait`` s for the
        first, then take what is there. The blobs come as the provider has them
        (the host broker's are never decoded here: receive_blob). A lost connection
        raises: what this call received was not acknowledged, and the source gives it
        back."""
        consumer = self._connect()
        most = self._environment().window_bytes
        batch: list[tuple[str, bytes]] = []
        held = 0
        blob = consumer.receive_blob(wait)
        while blob is not None:
            batch.append((codec.message_id(blob) or "", blob))
            held += len(blob)
            if len(batch) >= cap or 0 < most <= held:
                break
            blob = consumer.receive_blob(0)
        return batch
