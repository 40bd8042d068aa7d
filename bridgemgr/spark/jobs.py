"""What a CLI job needs from the running service: its bridge's configuration and broker.

A CLI job (drain, dmq archive|report|redrive) runs in its own process next to a running
service. job_options gives it the admin commands' options plus -bn; service_job() asks the
admin port for the bridge's CONFIG and gives the job a factory for the service's host broker
over mq:// with the service account's login; backlog() tells a source's depth for the
progress line; job_spark() starts the job's Spark; job_failures turns a failure into one line.

Rules: the job logs in to the host broker as the service account, never as the admin; it
runs on --master or the service's master, never another.

Design notes: docs/spark.md#internals-sparkjobspy.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..admin.client import AdminError
from ..admin.login import admin_login, admin_options, host_port, open_admin
from ..admin.protocol import Command
from ..extras import require
from ..props import LOG_ROLLOVER_SECS
from .jvmlog import SparkLog
from .options import BACKOUT_THRESHOLD, LINK_WINDOW, LINK_WINDOW_BYTES

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from ..jms.spi import XAConnectionFactory
    from ..jmsbridge.config import BridgeConfig


EXECUTOR_WAIT = 120.0  # s a job waits for its first executor on a cluster (--timeout)


@dataclass(frozen=True)
class ServiceJob:
    """One job's view of the service and of the JMS bridge it works on."""

    broker_url: str  # the host broker's jms connection service
    bridge: str
    xmlurl: str
    config: BridgeConfig
    runner: str = "local"
    backout_threshold: int = BACKOUT_THRESHOLD
    link_window: int = LINK_WINDOW  # imq.bridge.<name>.link.window
    link_window_bytes: int = LINK_WINDOW_BYTES  # imq.bridge.<name>.link.windowBytes
    spark_master: str = "local[*]"
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    user: str | None = field(default=None, repr=False)  # the admin login (admin port)
    password: str | None = field(default=None, repr=False)
    broker_user: str | None = field(default=None, repr=False)  # the service account (host broker)
    broker_password: str | None = field(default=None, repr=False)
    dmq_key: bytes | None = field(default=None, repr=False)  # verifies the DMQ marker
    admin: tuple[Any, ...] = field(default=(), repr=False)  # open_admin's arguments

    def host_queue_depth(self, name: str) -> int | None:
        """Messages waiting in the host broker's queue ``name`` (the admin port's QUERY_DST);
        None when the service cannot tell (no such queue, a service without QUERY_DST)."""
        try:
            with open_admin(*self.admin) as client:
                reply = client.request(Command("QUERY_DST", dst_type="q", destination=name))
        except AdminError:
            return None
        pending = (reply.data or {}).get("pending") if reply.ok else None
        return pending if isinstance(pending, int) else None

    def backlog(
        self, cf_ref: str | None, dest_ref: str | None, selector: str | None = None, durable: str | None = None
    ) -> int | None:
        """How many messages wait at a link's source or a DMQ, when the host broker holds
        them in a queue (a named one, no selector); None when that cannot be told (another
        provider, a topic, a JNDI destination, a selector)."""
        from ..jmsbridge.config import DestinationType
        from ..jmsbridge.resolve import means_host_broker

        if cf_ref is None or dest_ref is None or selector or durable:
            return None
        host = means_host_broker(self.config.connection_factory(cf_ref))
        dest = self.config.destination(dest_ref)
        if not host or dest.lookup_name is not None or dest.name is None or dest.type is not DestinationType.QUEUE:
            return None
        return self.host_queue_depth(dest.name)

    def host_factory(self, environment: Mapping[str, str]) -> XAConnectionFactory:
        """The service's host broker; connections that name no user log in as the
        service account."""
        from ..providers.embedded import HostBrokerFactory

        return HostBrokerFactory(self.broker_url, self.broker_user, self.broker_password)

    def spark(
        self, app_name: str, master: str | None = None, timeout: float = EXECUTOR_WAIT, **conf: Any
    ) -> SparkSession:
        """The job's SparkSession on ``master`` (default: the service's): the service's
        imq.bridge.spark.conf.* settings, then ``conf`` (see job_spark)."""
        return job_spark(app_name, master or self.spark_master, {**self.spark_conf, **conf}, timeout)


def job_spark(app_name: str, master: str, conf: Mapping[str, Any], timeout: float = EXECUTOR_WAIT) -> SparkSession:
    """A job's SparkSession on ``master``, never another: an unreachable master is one
    line within seconds (probe_master); stderr says which master runs the job
    ("running on spark://host:7077"); on a cluster the job waits at most ``timeout`` s
    for an executor, saying once why it waits. Spark's own lines go to SPARK_LOG
    unless -loglevel DEBUG."""
    from .session import SparkUnavailable, spark_session

    quiet = job_output().level > logging.DEBUG
    try:
        spark = spark_session(app_name=app_name, master=master, conf=conf, jvm_output=JOB_SPARK_LOG if quiet else None)
    except SparkUnavailable as exc:
        raise click.ClickException(str(exc)) from None
    ran_on = spark.sparkContext.master or master
    click.echo(f"running on {ran_on}", err=True)
    if not ran_on.startswith("local"):
        try:
            wait_for_executors(spark, ran_on, timeout, dict(conf))
        except click.ClickException:
            spark.stop()
            raise
    return spark


def wait_for_executors(spark: SparkSession, master: str, timeout: float, conf: Mapping[str, str]) -> None:
    """Return once an executor has registered. A standalone master gives an application
    only free cores, and a job with none would wait forever (a drain with its source
    already taken into its checkpoint): say so once (the cores other applications hold,
    from the master's web UI at spark.master.ui.port, default 8080) and give up after
    ``timeout`` s."""
    started = time.monotonic()
    said = False
    while True:
        status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()
        if status.size() > 1:  # the driver's block manager, and an executor's
            return
        waited = time.monotonic() - started
        busy = _cores_in_use(master, conf) if not said else None
        if not said and (waited > WAIT_QUIET or (busy is not None and busy[0] >= busy[1])):
            click.echo(f"waiting for executors on {master}: {_busy_text(busy)}", err=True)
            said = True
        if waited >= timeout:
            busy = _cores_in_use(master, conf)
            raise click.ClickException(
                f"no executor on {master} after {timeout:g} s ({_busy_text(busy)}): free cores "
                "there (spark.cores.max of the other applications), or run the job with "
                "--master local[N]"
            )
        time.sleep(0.5)


WAIT_QUIET = 10.0  # s without an executor before a job says it waits (when cores seem free)


def _cores_in_use(master: str, conf: Mapping[str, str]) -> tuple[int, int] | None:
    """(cores in use, cores) of a standalone master, from its web UI's JSON; None when it
    cannot be read."""
    import json
    import urllib.request

    if not master.startswith("spark://"):
        return None
    host = master[len("spark://") :].split(",")[0].rpartition(":")[0]
    port = conf.get("spark.master.ui.port", "8080")
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/json/", timeout=2) as reply:
            data = json.load(reply)
        return int(data["coresused"]), int(data["cores"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _busy_text(busy: tuple[int, int] | None) -> str:
    if busy is None:
        return "no free cores? (its web UI shows which applications hold them)"
    return f"{busy[0]} of {busy[1]} cores in use by other applications"


SPARK_LOG = Path.home() / ".imqbridge" / "logs" / "spark.log"
# A job has no instance properties (it may run on another machine, as another user), and
# imq.log.file.rolloverbytes' default (no size limit) with an age counted from each open
# would not bound a file that job after job appends to: 10 MiB a file, 10 files, a week.
JOB_SPARK_LOG = SparkLog(SPARK_LOG, 10 << 20, LOG_ROLLOVER_SECS)


@dataclass(frozen=True)
class JobOutput:
    """-loglevel and --debug of the job's command."""

    level: int = logging.WARNING
    debug: bool = False


def job_output() -> JobOutput:
    ctx = click.get_current_context(silent=True)
    return ctx.meta.get("imq.job_output", JobOutput()) if ctx is not None else JobOutput()


def _set_level(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    from ..props import LOG_LEVELS, parse_log_level

    try:
        level = parse_log_level(value) if value else logging.WARNING
    except ValueError:
        raise click.BadParameter(f"{value!r}; write one of {', '.join(LOG_LEVELS)}") from None
    ctx.meta["imq.job_output"] = JobOutput(level, job_output().debug)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    root = logging.getLogger()
    root.setLevel(level)
    if level > logging.DEBUG:
        for handler in root.handlers:
            if not any(isinstance(f, Py4JSendErrors) for f in handler.filters):
                handler.addFilter(Py4JSendErrors())


class Py4JSendErrors(logging.Filter):
    """Drops every record logged from py4j's code. Its ERROR is "Exception while sending
    command." with a trace, on the root logger, for a JVM call that failed; the call fails
    to its caller as well, and the job reports that in its one line (a failed drain once
    printed 19 such lines after its error line, its JVM ended under a call as the process
    exited). -loglevel DEBUG keeps them."""

    _PACKAGE = f"{os.sep}py4j{os.sep}"

    def filter(self, record: logging.LogRecord) -> bool:
        return self._PACKAGE not in record.pathname


def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta["imq.job_output"] = JobOutput(job_output().level, True)


def job_failures(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A job command whose unexpected failure (Spark's, a transformer's ...) prints one line,
    "<what> failed: <why>; <what to do>", and exits 1; the stack trace only with --debug."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except (click.ClickException, click.exceptions.Exit, click.Abort, SystemExit, KeyboardInterrupt):
                raise
            except Exception as exc:
                if job_output().debug:
                    traceback.print_exc()
                raise click.ClickException(failure_line(what, exc)) from None

        return run

    return decorate


_NO_MODULE = re.compile(r"No module named '([\w.]+)'")


def failure_line(what: str, exc: BaseException) -> str:
    """One line for a failed job: the innermost cause, and what to do about it."""
    from ..jmsbridge.plugins import WHERE_TRANSFORMERS_ARE

    text = str(exc)
    if (missing := _NO_MODULE.search(text)) is not None:
        return (
            f"{what} failed: the module {missing.group(1)} cannot be imported (a message "
            f"transformer not on the plugin path?): {WHERE_TRANSFORMERS_ARE}, where Spark's "
            "processes see it too; --debug shows the stack trace"
        )
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    cause = next(
        (line for line in reversed(lines) if re.match(r"[\w.]+(Error|Exception): ", line)),
        lines[0] if lines else type(exc).__name__,
    )
    return f"{what} failed: {cause[:300]}; Spark's own log is {SPARK_LOG}; --debug shows the stack trace"


def require_spark() -> None:
    """A job command's first step: one line naming imqbridge[spark] when pyspark or pyarrow
    is not installed, before the service is asked anything (or a link paused)."""
    from .session import SPARK_PART

    require(SPARK_PART, "pyspark", "pyarrow", error=click.ClickException)


def job_options(fn: Callable[..., Any] | None = None, *, bridge_required: bool = True) -> Any:
    """-bn and the admin commands' options; the command gets them as keyword arguments
    broker, bridge, user, passfile, secure, cafile, reply_timeout, retries. A command that
    can also work without the service says bridge_required=False and checks -bn itself."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn = admin_options(fn)
        fn = click.option(
            "-loglevel",
            "--loglevel",
            metavar="LEVEL",
            expose_value=False,
            callback=_set_level,
            is_eager=True,
            help="Level of the job's log lines (default WARNING); DEBUG also shows Spark's own start-up lines.",
        )(fn)
        fn = click.option(
            "--debug", is_flag=True, expose_value=False, callback=_set_debug, help="Print the stack trace of a failure."
        )(fn)
        return click.option(
            "-bn",
            "bridge",
            required=bridge_required,
            metavar="NAME",
            help="The JMS bridge whose configuration the job uses.",
        )(fn)

    return decorate if fn is None else decorate(fn)


def spark_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--master and --timeout of a job that runs on Spark (keyword arguments master, timeout)."""
    fn = click.option(
        "--timeout",
        type=click.FloatRange(min=1),
        default=EXECUTOR_WAIT,
        show_default=True,
        metavar="SECONDS",
        help="On a cluster, how long to wait for an executor before failing.",
    )(fn)
    return click.option(
        "--master",
        metavar="URL",
        help="The Spark master to run on (spark://HOST:PORT, local[N]) "
        "[default: the service's imq.bridge.spark.master].",
    )(fn)


def service_job(
    broker: str,
    bridge: str,
    user: str | None,
    passfile: str | None,
    secure: bool = False,
    cafile: str | None = None,
    reply_timeout: int = 10,
    retries: int = 5,
) -> ServiceJob:
    """Ask the service at ``broker`` about ``bridge`` and connect this process to its host
    broker; ClickException with the service's answer when it cannot."""
    from ..jmsbridge.config import load_bridge_config
    from ..props import ConfigError

    host, port = host_port(broker)
    user, password = admin_login(user, passfile)
    try:
        with open_admin(broker, user, password, secure, cafile, reply_timeout, retries) as client:
            reply = client.request(Command("CONFIG", None, bridge, None))
    except AdminError as exc:
        raise click.ClickException(str(exc)) from None
    if not reply.ok:
        raise click.ClickException(reply.message)
    data = reply.data
    if not data.get("xmlurl"):
        raise click.ClickException(f"bridge {bridge} has no imq.bridge.{bridge}.xmlurl")
    try:
        config = load_bridge_config(data["xmlurl"], bridge_name=bridge)
    except ConfigError as exc:
        raise click.ClickException(f"the configuration of bridge {bridge} cannot be loaded:\n{exc}") from None
    url = f"mq://{'[' + host + ']' if ':' in host else host}:{port}"
    spark = data.get("spark") or {}
    account = data.get("service") or {}
    if not account.get("user"):
        raise click.ClickException(f"the service at {broker} names no service account for jobs; upgrade it")
    return ServiceJob(
        url,
        bridge,
        data["xmlurl"],
        config,
        runner=data.get("runner", "local"),
        backout_threshold=int(data.get("backoutThreshold", BACKOUT_THRESHOLD)),
        # (an older service says neither: its defaults were these)
        link_window=int(data.get("linkWindow", LINK_WINDOW)),
        link_window_bytes=int(data.get("linkWindowBytes", LINK_WINDOW_BYTES)),
        spark_master=spark.get("master") or "local[*]",
        spark_conf=dict(spark.get("conf") or {}),
        user=user,
        password=password,
        broker_user=account["user"],
        broker_password=account.get("password"),
        dmq_key=bytes.fromhex(account.get("dmqKey") or ""),
        admin=(broker, user, password, secure, cafile, reply_timeout, retries),
    )
