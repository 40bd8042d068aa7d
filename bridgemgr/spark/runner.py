"""A JMS bridge link that runs as a Spark Structured Streaming query.

A SparkLink is what JMSBridge builds instead of a Link for a non-transacted link of a bridge
with imq.bridge.<name>.runner=spark (importing this module registers the runner "spark"). It
shares RunnerBase with the Link and runs the link as one query, LinkDataSource (source.py)
-> LinkStreamWriter (sink.py), checkpointed under <bridge dir>/spark/<link>/checkpoint; a
watcher restarts a failed query from its checkpoint with backoff. The service's session
takes spark.cores.max = one per Spark link unless set (service_cores).

Rules: pause() and stop() keep the checkpoint, so nothing received is lost; with no
executor (hold_without_executors) the receiver is held, so a source is not taken into the
log while nothing can deliver it.

Design notes: docs/spark.md#internals-sparkrunnerpy.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..backoff import backoff_delay
from ..extras import require
from ..jms.hostbroker import HostBroker, Principal
from ..jmsbridge.counters import RATE_WINDOW, SharedCounters
from ..jmsbridge.runners import LinkSetup, LinkTuning, RunnerBase, RunnerContext, register_link_runner
from ..jmsbridge.states import State
from ..private import private_dir
from .jvmlog import SparkLog
from .options import FORMAT, LinkOptions
from .session import MasterUnreachable, ship_plugins

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from ..props import BrokerProperties

log = logging.getLogger("imq.bridge.spark")
SERVICE_PRINCIPAL = Principal(None, service=None)  # the service asking its own broker (backlog)
RESTARTS = 5  # failed queries in a row (no batch committed between) before giving up
TRIGGER = "0 seconds"  # batches back to back; an idle source waits in receiveWait instead


def checkpoint_dir(bridge_dir: Path, link: str) -> Path:
    return bridge_dir / "spark" / link / "checkpoint"


def link_options(checkpoint: Path, **values: Any) -> LinkOptions:
    """LinkOptions whose source log and stats file live in ``checkpoint``."""
    return LinkOptions(source_log=str(checkpoint / "sourcelog"), stats=str(checkpoint / "linkstats.jsonl"), **values)


def start_query(
    spark: SparkSession, options: LinkOptions, checkpoint: Path, available_now: bool = False, name: str | None = None
) -> StreamingQuery:
    """The link's streaming query, started (from ``checkpoint`` when it has one); this
    process receives into its source log until the query's own receiver takes over
    (prefetch, receiver.py)."""
    from .receiver import Receiver, hold_receiving
    from .slices import quiet_task_size_warning
    from .source import LinkDataSource

    # Spark looks a Python data source up in the JVM thread's *active* session, which only
    # the thread that created the session has: a query started from another thread (an
    # admin command's resume/start, the watcher's restart) failed DATA_SOURCE_NOT_FOUND.
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    getattr(jvm, "org.apache.spark.sql.classic.SparkSession").setActiveSession(spark._jsparkSession)
    spark.dataSource.register(LinkDataSource)
    if options.ship_log:
        quiet_task_size_warning(spark)
    opts = options.to_options()
    writer = (
        spark.readStream.format(FORMAT)
        .options(**opts)
        .load()
        .writeStream.format(FORMAT)
        .options(**opts)
        .option("checkpointLocation", str(checkpoint))
    )
    if name:
        writer = writer.queryName(name)
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime=TRIGGER)
    query = writer.start()
    hold_receiving(options.source_log, False)  # (a hold its last run left)
    if not (spark.sparkContext.master or "local").startswith("local"):
        threading.Thread(
            target=hold_without_executors,
            args=(spark, options, lambda: query.isActive),
            name=f"executors {options.link}",
            daemon=True,
        ).start()
    prefetcher = Receiver.prefetching(options)
    if prefetcher is not None:
        threading.Thread(
            target=prefetcher.prefetch, args=(lambda: query.isActive,), name=f"prefetch {options.link}", daemon=True
        ).start()
    return query


HOLD_POLL = 0.5  # s between two looks at a cluster query's executors


def hold_without_executors(spark: SparkSession, options: LinkOptions, active: Callable[[], bool]) -> None:
    """While ``active()`` (a link's query, or a drain, runs), hold its receiver whenever the
    application has no executor (receiver.py): nothing could deliver what it would take
    from the source."""
    from .receiver import hold_receiving
    from .session import executor_count

    held = seen = False
    try:
        while active():
            none = executor_count(spark) == 0
            if none != held:
                hold_receiving(options.source_log, none)
                held = none
                if seen:  # (not the wait for the first executors of a new session)
                    log.warning(
                        "link %s: %s",
                        options.link,
                        "no executor: receiving held until one comes" if none else "executors again: receiving",
                    )
            seen = seen or not none
            time.sleep(HOLD_POLL)
    except Exception:  # the session stopped under us: the query is over
        pass
    finally:
        if held:
            hold_receiving(options.source_log, False)


def stats_totals(stats: str | Path, now: float | None = None) -> dict[str, Any]:
    """The stats file summed: batches, rows, transferred, consumed_only, to_dmq, dmq_lost,
    reasons, last_batch_id; last_transfer_at (the commit time of the last batch that
    transferred) and recent (transferred by batches committed in the last RATE_WINDOW s)."""
    from .sink import read_stats

    since = (time.time() if now is None else now) - RATE_WINDOW
    totals: dict[str, Any] = {
        "batches": 0,
        "rows": 0,
        "transferred": 0,
        "consumed_only": 0,
        "to_dmq": 0,
        "dmq_lost": 0,
        "reasons": {},
        "last_batch_id": None,
        "last_transfer_at": None,
        "recent": 0,
    }
    for batch, entry in sorted(read_stats(stats).items()):
        totals["batches"] += 1
        for key in ("rows", "transferred", "consumed_only", "to_dmq", "dmq_lost"):
            totals[key] += int(entry.get(key, 0))
        for reason, n in (entry.get("reasons") or {}).items():
            totals["reasons"][reason] = totals["reasons"].get(reason, 0) + int(n)
        totals["last_batch_id"] = batch
        at, moved = entry.get("at"), int(entry.get("transferred", 0))
        if moved and isinstance(at, (int, float)):
            totals["last_transfer_at"] = at
            if at >= since:
                totals["recent"] += moved
    return totals


class SparkCounters(SharedCounters):
    """A Spark link's counters: what the sink's commits recorded in the stats file (they
    survive restarts), plus the runner's own (errors, restarts; written by its command
    and watcher threads). A snapshot reads the file and changes nothing: the totals it
    read replace the last ones as one value, for a snapshot that cannot read the file."""

    def __init__(self, stats: str) -> None:
        super().__init__()
        self.stats = stats
        self._totals: dict[str, Any] | None = None  # the stats file as last read

    def snapshot(self) -> dict[str, Any]:
        totals: dict[str, Any] | None
        try:
            self._totals = totals = stats_totals(self.stats)
        except OSError:  # `list link` still answers (the counters as they were)
            totals = self._totals
        own = super().snapshot()
        if totals is None:
            return own
        own.update(
            received=totals["rows"],
            transferred=totals["transferred"],
            consumed_only=totals["consumed_only"],
            to_dmq=totals["to_dmq"],
            dmq_lost=totals["dmq_lost"],
            dmq_reasons=dict(totals["reasons"]),
            last_transfer_at=totals["last_transfer_at"],
            rate=round(totals["recent"] / RATE_WINDOW, 3),
        )
        return own


class SparkLink(RunnerBase):
    """One <link> of a running bridge, run by Spark (runner=spark)."""

    runner = "spark"

    def __init__(
        self,
        setup: LinkSetup,
        options: LinkOptions,
        checkpoint: Path,
        log: logging.Logger,
        props: BrokerProperties | None = None,
        tuning: LinkTuning = LinkTuning(),
        spark: SparkSession | None = None,
        host: HostBroker | None = None,
    ) -> None:
        self.options = options  # before RunnerBase's __init__: new_counters() reads it
        super().__init__(setup, log, tuning)
        self.host = host  # the service's host broker: the backlog of a source queue there
        self.checkpoint = checkpoint
        self.props = props
        self._spark = spark
        self._query: StreamingQuery | None = None
        self._want = State.STOPPED
        self._lock = threading.RLock()  # query start/stop
        self._wake = threading.Event()  # a command for the watcher's backoff
        self._runs = 0  # which start/resume the current watcher serves

    def new_counters(self) -> SparkCounters:
        return SparkCounters(self.options.stats)

    # --- commands (RunnerBase checked the state table) -----------------------------------------
    def _on_start(self, timeout: float | None) -> State:
        """Start the query (from the checkpoint when there is one)."""
        return self._run(State.STARTED)

    def _on_resume(self, timeout: float | None) -> State:
        """Start the query again from the checkpoint that pause() kept."""
        return self._run(State.STARTED)

    def _on_pause(self, timeout: float | None) -> State:
        """Stop the query between batches; keep the checkpoint (and the source log)."""
        self._halt(State.PAUSED)
        self.log.info("link %s paused (Spark query stopped, checkpoint kept)", self.name)
        return self.state

    def _on_stop(self, timeout: float | None) -> State:
        self._halt(State.STOPPED)
        self.log.info("link %s stopped", self.name)
        return self.state

    def _run(self, want: State) -> State:
        """Start the query; with the master unreachable the link stays STARTING and its
        watcher tries again with backoff (the command, and the bridge, do not wait)."""
        self._want = want
        self._wake.clear()
        self._runs += 1
        try:
            self._spark = SESSION.session(self)
            self._start_query()
        except MasterUnreachable as exc:
            self._query = None
            self._failed(str(exc))
            self.lifecycle.set(State.STARTING)
        except Exception as exc:
            self._failed(f"cannot start the Spark query: {type(exc).__name__}: {exc}")
            self.lifecycle.set(State.STOPPED)
            return self.state
        else:
            self.lifecycle.set(State.STARTED)
        threading.Thread(
            target=self._watch,
            args=(self._query, self._runs),
            daemon=True,
            name=f"spark link {self.bridge_name}/{self.name}",
        ).start()
        return self.state

    def _halt(self, final: State) -> None:
        self._want = final
        self._wake.set()
        with self._lock:
            query = self._query
            if query is not None:
                try:
                    _between_batches(query, self.tuning.start_timeout)
                    query.stop()
                except Exception as exc:  # the JVM may be gone already
                    self.log.warning("link %s: stopping its Spark query: %s", self.name, exc)
        self.lifecycle.set(final)

    def _session(self) -> SparkSession:
        if self._spark is None:
            self._spark = SESSION.session(self)
        return self._spark

    def _suspend(self) -> bool:
        """(ServiceSession, before it stops the session) stop a running query between
        batches, its watcher ending without a word; True when it is to start again."""
        with self._lock:
            self._spark = None
            query = self._query
            if query is None or self._want is not State.STARTED or not query.isActive:
                return False  # (a failed query's watcher starts the next on the new session)
            self._runs += 1  # the watcher of the query stopped here ends quietly
            self._query = None
            try:
                _between_batches(query, self.tuning.start_timeout)
                query.stop()
            except Exception as exc:  # the JVM may be gone already
                self.log.warning("link %s: stopping its Spark query: %s", self.name, exc)
            return True

    def _carry_on(self) -> None:
        """(ServiceSession, once the session runs again) start the query again."""
        if self._want is State.STARTED:
            self._run(State.STARTED)

    def _start_query(self) -> None:
        with self._lock:
            private_dir(self.checkpoint)  # Spark writes it; the folder keeps it private
            spark = self._session()
            ship_plugins(spark, (p for p in self.options.transformer_path.split(os.pathsep) if p))
            self._query = start_query(spark, self.options, self.checkpoint, name=f"{self.bridge_name}.{self.name}")
        self.log.info(
            "link %s runs on Spark (%s -> %s), checkpoint %s",
            self.name,
            self.setup.source_label,
            self.setup.target_label,
            self.checkpoint,
        )

    # --- the watcher ------------------------------------------------------------------------------
    def _watch(self, query: StreamingQuery | None, run: int) -> None:
        """Follow ``query``; restart it after a failure (with backoff) while wanted; with
        no query (its master was unreachable) try to start one, with backoff, until the
        master answers. A watcher ends when its query was stopped on purpose or a command
        started another run."""
        failures = 0
        committed = stats_totals(self.options.stats)["batches"]
        while True:
            if query is not None:
                error = _await(query)
                if self._runs != run or self._want is not State.STARTED:
                    return
                if error is None:
                    self.log.info("link %s: its Spark query ended", self.name)
                    self.lifecycle.set(State.STOPPED)
                    return
                now_committed = stats_totals(self.options.stats)["batches"]
                failures = 1 if now_committed > committed else failures + 1
                committed = now_committed
                self._failed(f"Spark query failed: {error}", restart=True)
                halted = "LinkHalted" in error
                if halted or failures > RESTARTS:
                    self.log.error(
                        "link %s stops: %s",
                        self.name,
                        "the transformer halted it" if halted else f"{RESTARTS} restarts in a row failed",
                    )
                    self._want = State.STOPPED
                    self.lifecycle.set(State.STOPPED)
                    return
                self.lifecycle.move({State.STARTED}, State.STARTING)
            else:
                failures += 1  # the master did not answer: no limit, the link keeps trying
            delay = backoff_delay(self.tuning.backoff_initial, failures, self.tuning.backoff_max)
            if self._wake.wait(delay):
                return
            try:
                self._spark = SESSION.session(self)
            except Exception as exc:
                if not self._restart_failed(exc):
                    return
                query = None
                continue
            with self._lock:
                if self._runs != run or self._want is not State.STARTED:
                    return
                try:
                    self._start_query()
                except Exception as exc:
                    if not self._restart_failed(exc):
                        return
                    query = None
                    continue
                query = self._query
            self.lifecycle.move({State.STARTING}, State.STARTED)

    def _restart_failed(self, exc: Exception) -> bool:
        """A restart (the session or the query) failed: True to try again with backoff (the
        master did not answer), False when the link stops (anything else)."""
        if isinstance(exc, MasterUnreachable):
            self._query = None
            self._failed(str(exc))
            return True
        self._failed(f"cannot restart the Spark query: {exc}")
        self._want = State.STOPPED
        self.lifecycle.set(State.STOPPED)
        return False

    def _failed(self, text: str, restart: bool = False) -> None:
        """The whole text (Spark's stack traces) to the log; one line to `list link`
        (``restart``: counted as a reconnect too)."""
        counters = self.counters
        assert isinstance(counters, SharedCounters)  # written by command and watcher threads
        if restart:
            counters.restarted(one_line(text))
        else:
            counters.error(one_line(text))
        self.log.error("link %s: %s", self.name, text[:20000])

    # --- what `list link` shows -----------------------------------------------------------------
    def progress(self) -> dict[str, Any]:
        """The query's progress: committed batches, input rows, rows/s, last batch id."""
        try:
            totals = stats_totals(self.options.stats)
        except OSError:
            totals = {"batches": 0, "rows": 0, "last_batch_id": None}
        last = self._query.lastProgress if self._query is not None else None
        return {
            "batches": totals["batches"],
            "input_rows": totals["rows"],
            "rows_per_second": round(float(last.get("processedRowsPerSecond") or 0.0), 1) if last else 0.0,
            "last_batch_id": last.get("batchId") if last else totals["last_batch_id"],
            "active": bool(self._query is not None and self._query.isActive),
        }

    def backlog(self) -> int | None:
        """Messages waiting at the source when it is a queue of the host broker read
        without a selector (its depth, a lock and a len); None otherwise: the consumers
        are the query's, in other processes."""
        from ..jmsbridge.resolve import means_host_broker

        source, dest = self.config.source, self.setup.source
        if (
            self.host is None
            or dest.is_topic
            or dest.is_temporary
            or source.selector
            or not means_host_broker(self.setup.bridge.connection_factory(source.connection_factory_ref))
        ):
            return None
        return self.host.queue_depth(SERVICE_PRINCIPAL, dest.name)

    def info(self) -> dict[str, object]:
        counters = self.counters.snapshot()  # read before the progress: never behind it
        return {
            "name": self.name,
            "state": self.state.value,
            "source": self.setup.source_label,
            "target": self.setup.target_label,
            "transacted": self.transacted,
            "runner": self.runner,
            "progress": self.progress(),
            "counters": counters,
            "backlog": self.backlog(),
        }


_NOISE = re.compile(
    r"(at |File |Traceback|JVM stacktrace|An error occurred while calling|\^|~|"
    r"During handling|The above exception|\.\.\. \d+ more|Caused by: java\.lang\."
    r"ClassNotFoundException)"
)
_EXCEPTION = re.compile(r"(?:[\w$]+\.)*\w*(?:Error|Exception)\b:? |(?:[\w$]+\.)+\w+: ")
_PY4J = re.compile(r"\s*Py4JJavaError: An error occurred while calling \S+")
_HEAD_NOISE = re.compile(r"(?<=Query) \[id = [^\]]*, runId = [^\]]*\]|\s*Traceback \(most recent call last\):\s*$")


def one_line(text: str, limit: int = 300) -> str:
    """A failure as one line for `list link`: its first line ("cannot start the Spark
    query: ...") and the innermost line naming an exception (its class shortened), without
    Py4J's "An error occurred while calling", a query's ids and the stack frames; when
    that is too long the first line is cut, not the exception (it says what went wrong)."""
    lines = [line.strip().lstrip(": ").strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not _NOISE.match(line)]
    if not lines:
        return text.strip()[:limit]
    head = _HEAD_NOISE.sub("", _PY4J.sub("", lines[0]))
    cause = next((line for line in reversed(lines[1:]) if _EXCEPTION.match(line)), None)
    if cause is not None and cause not in head:
        cause = re.sub(r"^(?:[\w$]+\.)+(\w+:)", r"\1", cause)[: limit - 40]
        head = head.rstrip(":")
        if len(head) + 2 + len(cause) > limit:
            head = head[: limit - 3 - len(cause)] + "…"
        head = f"{head}: {cause}"
    return head[:limit]


def _between_batches(query: StreamingQuery, timeout: float) -> None:
    """Wait (up to ``timeout`` s) until ``query`` is not writing a batch, so that a stop
    does not cut a batch short: it would run again at the next start (duplicates)."""
    deadline = time.monotonic() + timeout
    while query.isActive and query.status.get("message") == "Processing new data" and time.monotonic() < deadline:
        time.sleep(0.05)


def _await(query: StreamingQuery) -> str | None:
    """Wait for the query to end; its error text (None when it ended cleanly)."""
    while True:
        try:
            if query.awaitTermination(1):
                break
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        if not query.isActive:
            break
    try:
        error = query.exception()
    except Exception as exc:  # the JVM is gone
        return f"{type(exc).__name__}: {exc}"
    return None if error is None else str(error)


def parallelism(master: str, conf: dict[str, str]) -> int:
    """How many slices a batch is read in: spark.default.parallelism, else local[N]'s N
    (local[*]: the CPU count), else 2."""
    if conf.get("spark.default.parallelism"):
        return max(1, int(conf["spark.default.parallelism"]))
    m = re.fullmatch(r"local\[(\d+|\*)(?:,\d+)?\]", master.strip())
    if m:
        return (os.cpu_count() or 1) if m.group(1) == "*" else max(1, int(m.group(1)))
    return 1 if master.strip() == "local" else 2


class ServiceSession:
    """The service's one SparkSession for its Spark links (module comment), with the
    spark.cores.max it was given when that is ours (service_cores), and the links that
    use it."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.cores = 0  # the spark.cores.max the running session got from us (0: none)
        self.links: weakref.WeakSet[SparkLink] = weakref.WeakSet()

    def session(self, link: SparkLink) -> SparkSession:
        """The session for ``link``'s query: started when there is none; started again when
        its cores (our default) are fewer than the links the properties now name."""
        if link._spark is not None and link.props is None:  # (given one: tests)
            return link._spark
        from .session import SPARK_PART, SparkUnavailable, spark_session, spark_settings

        require(SPARK_PART, "pyspark", "pyarrow", error=SparkUnavailable)  # one line, not an ImportError
        from pyspark import SparkContext

        with self.lock:
            self.links.add(link)
            props = link.props
            ours = props is not None and "spark.cores.max" not in props.spark_conf
            need = service_cores(props) if ours and props is not None else 0
            running = SparkContext._active_spark_context is not None
            if running and need > self.cores > 0 and spark_settings(props)[0].startswith("spark://"):
                self._restart(link, need)
                running = False
            # the JVM's own output (Spark's warnings, every failed query's stack traces,
            # its Python workers' stderr) to a file: on the console it took the service's
            # lines' place, and a console nobody reads stopped the JVM at its next line
            jvm_output = None if props is None else SparkLog.for_service(props)
            spark = spark_session(
                props,
                app_name=f"imqbridge {link.bridge_name}",
                conf={"spark.cores.max": str(need)} if need else {},
                jvm_output=jvm_output,
            )
            if not running:  # started here, with that many cores
                self.cores = need
            return spark

    def _restart(self, link: SparkLink, need: int) -> None:
        """Stop the session (the other links' queries first, between batches) so that the
        next one gets ``need`` cores; the links start their queries again after it."""
        from pyspark.sql import SparkSession

        link.log.info(
            "the Spark session starts again with %d cores (was %d) for the Spark "
            "links now configured; running links start again from their checkpoints",
            need,
            self.cores,
        )
        others = [other for other in list(self.links) if other is not link and other._suspend()]
        session = SparkSession._instantiatedSession
        if session is not None:
            session.stop()

        def carry_on() -> None:  # (once this link's session is up: they wait for the lock)
            for other in others:
                other._carry_on()

        threading.Thread(target=carry_on, name="spark links restart", daemon=True).start()


SESSION = ServiceSession()


def service_cores(props: BrokerProperties) -> int:
    """The service's default spark.cores.max: one core per non-transacted link of its
    runner=spark bridges (at least 1), so that a standalone master keeps the rest of its
    cores for drain and the DMQ jobs (Spark's own default gives an application every core)."""
    from ..jmsbridge.config import load_bridge_config

    links = 0
    for name in props.bridge_names:
        settings = props.bridge(name)
        if settings.runner != "spark" or not settings.xmlurl:
            continue
        xmlurl = settings.xmlurl
        if "://" not in xmlurl and not xmlurl.startswith("file:") and settings.xml_base:
            xmlurl = str((settings.xml_base / xmlurl).resolve())
        try:
            config = load_bridge_config(xmlurl, bridge_name=name)
        except Exception:  # (that bridge fails its own start, saying why)
            continue
        links += sum(1 for link in config.links if not link.transacted)
    return max(1, links)


def spark_link_options(
    props: BrokerProperties,
    bridge: str,
    link: str,
    broker_url: str,
    transformer_path: Sequence[str | Path] | None = None,
) -> tuple[LinkOptions, Path]:
    """The options and checkpoint of link ``link`` of bridge ``bridge`` in the service."""
    from ..servicekeys import SERVICE_ACCOUNT, dmq_key, service_password
    from .session import spark_settings
    from .slices import ships_log

    settings = props.bridge(bridge)
    xmlurl = settings.xmlurl or ""
    if xmlurl and "://" not in xmlurl and not xmlurl.startswith("file:") and settings.xml_base:
        xmlurl = str((settings.xml_base / xmlurl).resolve())
    master, conf = spark_settings(props)
    checkpoint = checkpoint_dir(props.bridge_dir(bridge), link)
    options = link_options(
        checkpoint,
        xmlurl=xmlurl,
        bridge=bridge,
        link=link,
        broker_url=broker_url,
        parallelism=parallelism(master, conf),
        backout_threshold=settings.backout_threshold,
        window=settings.link_window,
        window_bytes=settings.link_window_bytes,
        transformer_path=os.pathsep.join(str(p) for p in transformer_path or ()),
        broker_user=SERVICE_ACCOUNT,
        broker_password=service_password(props),
        dmq_secret=dmq_key(props).hex(),
        ship_log=ships_log(master, props.get("imq.bridge.spark.sourcelog") or "auto"),
    )
    return options, checkpoint


def spark_link(setup: LinkSetup, context: RunnerContext) -> SparkLink:
    """runner=spark: the link as a Structured Streaming query."""
    if context.props is None or context.broker_url is None:
        from ..jmsbridge.bridge import BridgeStartError

        raise BridgeStartError(
            f"link {setup.config.name}: imq.bridge.{context.bridge}.runner=spark "
            "needs the service's host broker and its jms connection "
            "service (imq.jms.tcp.port)"
        )
    options, checkpoint = spark_link_options(
        context.props, context.bridge, setup.config.name, context.broker_url, context.transformer_path
    )
    return SparkLink(setup, options, checkpoint, context.log, context.props, context.tuning, host=context.host)


register_link_runner("spark", spark_link)
