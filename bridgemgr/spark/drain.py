"""imqbridgemgr drain: empty a link's source through Spark (bulk migration).

`imqbridgemgr drain -bn BRIDGE -ln LINK` empties a link's source next to a running service:
the link, when it runs there, is paused through the admin port first and resumed afterwards
whatever happens; the drain itself runs as Spark batch jobs (drainjob.py) until the source
has had nothing for receiveWait and everything logged is sent, with progress on stderr.

Rules: messages it acknowledged at the source live in its checkpoint (--checkpoint) until
they are sent, so a drain that dies is run again with the same checkpoint; pyspark is
imported only when the command runs.

Design notes: docs/spark.md#internals-sparkdrainpy.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import click

from ..private import private_dir
from .jobs import failure_line, job_failures, job_options, job_output, require_spark, service_job, spark_options
from .progress import Progress


def default_checkpoint(bridge: str, link: str) -> Path:
    return Path.home() / ".imqbridge" / "drain" / bridge / link


@click.command("drain")
@job_options
@click.option("-ln", "link", required=True, metavar="NAME", help="The link whose source is drained.")
@click.option(
    "--batch",
    default=50000,
    show_default=True,
    type=click.IntRange(1),
    help="Messages per Spark job at most (a bulk drain: few batch boundaries; "
    "the source log holds up to two batches ahead).",
)
@click.option(
    "--checkpoint",
    type=click.Path(file_okay=False, path_type=Path),
    help="The drain's checkpoint folder [default: ~/.imqbridge/drain/BRIDGE/LINK].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@spark_options
@job_failures("the drain")
def drain(
    broker: str,
    bridge: str,
    user: str | None,
    passfile: str | None,
    secure: bool,
    cafile: str | None,
    reply_timeout: int,
    retries: int,
    link: str,
    batch: int,
    checkpoint: Path | None,
    as_json: bool,
    master: str | None,
    timeout: float,
) -> None:
    """Move everything waiting on a link's source to its target, with Spark, and exit.

    The link's transformer, DMQ rules and the stamped source message id
    (JMS_SUN_JMSBRIDGE_SOURCE_MESSAGEID) apply as on a runner=spark link: at-least-once.
    A running link is paused for the drain and resumed after it.
    """
    require_spark()
    job = service_job(broker, bridge, user, passfile, secure, cafile, reply_timeout, retries)
    try:
        cfg = job.config.link(link)
    except Exception:
        known = ", ".join(cfg.name for cfg in job.config.links) or "none"
        raise click.ClickException(f"bridge {bridge} has no link {link!r} (links: {known})") from None
    if cfg.transacted:
        raise click.ClickException(
            f"link {link} is transacted (once-and-only-once); a drain is "
            "at-least-once and runs non-transacted links only"
        )
    checkpoint = checkpoint or default_checkpoint(bridge, link)
    # Spark first: a master that cannot run the drain fails it before the link is paused
    spark = job.spark(f"imqbridge drain {bridge}/{link}", master, timeout)
    admin = _Admin(broker, job.user, job.password, secure, cafile, reply_timeout, retries)
    paused = admin.pause_if_running(bridge, link)
    if paused:
        click.echo(f"link {link} of bridge {bridge} paused for the drain", err=True)
    try:
        summary = _run(job, spark, link, batch, checkpoint, timeout)
    finally:
        if paused:
            admin.resume(bridge, link)
            click.echo(f"link {link} of bridge {bridge} resumed", err=True)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(summary["dmq_reasons"].items()))
        click.echo(
            f"drained link {link} of bridge {bridge}: {summary['transferred']} transferred, "
            f"{summary['to_dmq']} to the DMQ{f' ({reasons})' if reasons else ''}, "
            f"{summary['consumed_only']} consumed without transfer, in "
            f"{summary['seconds']} s ({summary['msg_per_s']} msg/s)"
        )


def _run(job: Any, spark: Any, link: str, batch: int, checkpoint: Path, timeout: float) -> dict[str, Any]:
    """The drain's batch jobs (drainjob.py), its progress on stderr; the summary. On a
    cluster that loses every executor the drain's receiver holds (runner.py) and the drain
    stops after ``timeout`` s without one, keeping what it took in the checkpoint."""
    from ..transform import transformer_path
    from .drainjob import BatchDrain
    from .runner import link_options, parallelism, stats_totals
    from .session import executor_count, ship_plugins
    from .slices import ships_log

    ship_plugins(spark, transformer_path())  # the executors import the link's transformer
    options = link_options(
        checkpoint,
        xmlurl=job.xmlurl,
        bridge=job.bridge,
        link=link,
        broker_url=job.broker_url,
        parallelism=parallelism(spark.sparkContext.master, dict(job.spark_conf)),
        max_per_batch=batch,
        backout_threshold=job.backout_threshold,
        window=job.link_window,
        window_bytes=job.link_window_bytes,
        broker_user=job.broker_user or "",
        broker_password=job.broker_password or "",
        dmq_secret=(job.dmq_key or b"").hex(),
        ship_log=ships_log(spark.sparkContext.master),
    )  # a cluster's executors: shipped
    private_dir(checkpoint)
    before = stats_totals(options.stats)  # a drain that died before: its totals so far
    source = job.config.link(link).source
    progress = Progress(
        f"drain {job.bridge}.{link}",  # the backlog before the drain takes any
        job.backlog(source.connection_factory_ref, source.destination_ref, source.selector, source.durable_sub),
    )
    start = time.monotonic()
    drain = BatchDrain(spark, options).start()
    master = spark.sparkContext.master
    lost_at: float | None = None  # since when the cluster has no executor for the drain
    try:
        while True:
            ended = drain.wait(1)
            if not ended and not master.startswith("local"):
                lost_at = (lost_at or time.monotonic()) if executor_count(spark) == 0 else None
                if lost_at is not None and time.monotonic() - lost_at >= timeout:
                    drain.cancel()
                    raise click.ClickException(
                        f"the drain lost its executors on {master}: none for {timeout:g} s; "
                        f"what it had taken from the source is kept in {checkpoint}: run the "
                        "drain again"
                    )
            totals = stats_totals(options.stats)
            batch_id = totals["last_batch_id"]
            progress.update(totals["rows"] - before["rows"], "" if batch_id is None else f"batch {batch_id}")
            if ended:
                break
    finally:
        if not drain.wait(0):  # interrupted: what is logged stays in the checkpoint
            drain.cancel()
        progress.finish()  # (a terminal's line ends before an error line)
    error = drain.error
    if error is not None:
        if job_output().debug:
            click.echo(str(error), err=True)
        raise click.ClickException(
            f"{failure_line('the drain', error)}; what it had taken from "
            f"the source is kept in {checkpoint}: run the drain again"
        )
    seconds = time.monotonic() - start
    totals = stats_totals(options.stats)
    shutil.rmtree(checkpoint, ignore_errors=True)  # every batch is sent
    moved = totals["rows"] - before["rows"]
    return {
        "bridge": job.bridge,
        "link": link,
        "messages": totals["rows"],
        "transferred": totals["transferred"],
        "to_dmq": totals["to_dmq"],
        "dmq_reasons": totals["reasons"],
        "consumed_only": totals["consumed_only"],
        "batches": totals["batches"],
        "seconds": round(seconds, 2),
        "msg_per_s": round(moved / seconds) if seconds > 0 else 0,
    }


class _Admin:
    """The service's admin port, for pausing and resuming the link around the drain."""

    def __init__(
        self,
        broker: str,
        user: str | None,
        password: str | None,
        secure: bool,
        cafile: str | None,
        reply_timeout: int,
        retries: int,
    ) -> None:
        self.args = (broker, user or "", password or "", secure, cafile, reply_timeout, retries)

    def _request(self, op: str, bridge: str, link: str) -> Any:
        from ..admin.client import AdminError
        from ..admin.login import open_admin
        from ..admin.protocol import Command

        try:
            with open_admin(*self.args) as client:
                return client.request(Command(op, None, bridge, link))
        except AdminError as exc:
            raise click.ClickException(str(exc)) from None

    def pause_if_running(self, bridge: str, link: str) -> bool:
        """Pause the link when it is running in the service; True if it was paused here."""
        reply = self._request("LIST", bridge, link)
        rows = [x for x in ((reply.data or {}).get("links") or []) if x.get("name") == link]
        if not reply.ok or not rows or rows[0].get("state") not in ("STARTED", "STARTING", "RESUMING"):
            return False
        reply = self._request("PAUSE", bridge, link)
        if not reply.ok:
            raise click.ClickException(f"cannot pause link {link} for the drain: {reply.message}")
        return True

    def resume(self, bridge: str, link: str) -> None:
        reply = self._request("RESUME", bridge, link)
        if not reply.ok:
            click.echo(
                f"resuming link {link} failed: {reply.message}; resume it with "
                f"imqbridgemgr resume link -bn {bridge} -ln {link}",
                err=True,
            )
