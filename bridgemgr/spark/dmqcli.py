"""The `imqbridgemgr dmq` commands: archive, report and redrive a bridge's DMQ.

`imqbridgemgr dmq archive|report|redrive` are thin: each takes the admin commands' options
and -bn (jobs.job_options), asks the running service for the bridge's configuration and host
broker (jobs.service_job, which points this process's host broker at the service's jms
connection service), finds the DMQ (--dmq NAME, default the built-in one) and calls the core
functions of spark/dmq.py. pyspark and the core are imported inside the commands, so
`imqbridgemgr --help` stays fast. `report --archive` reads Parquet only and needs no
service. JMS and job errors become one clear line; archive shows its progress on stderr
(progress.py) with the DMQ's depth as the backlog.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from .jobs import job_failures, job_options, require_spark, service_job, spark_options

if TYPE_CHECKING:
    from .dmq import DMQEndpoint, RedriveResult
    from .jobs import ServiceJob

DMQ_HELP = "The <dmq> of the bridge to use (default: the built-in DMQ, imq.bridge.jms.dmq)."


@click.group("dmq")
def dmq() -> None:
    """Archive, report and redrive the dead messages of a JMS bridge's DMQs."""


@contextmanager
def _errors() -> Iterator[None]:
    """JMS, DMQ-job and Spark failures as one ClickException line."""
    from ..jms.errors import JMSException

    try:
        yield
    except JMSException as exc:
        raise click.ClickException(str(exc)) from None


def _job(options: dict[str, Any], dmq_name: str) -> tuple[ServiceJob, DMQEndpoint]:
    from .dmq import dmq_endpoint

    job = service_job(**options)
    with _errors():
        return job, dmq_endpoint(job.config, dmq_name, host_factory=job.host_factory, marker_key=job.dmq_key)


def _check_local(path: str) -> None:
    """A local archive path that does not exist fails before Spark starts."""
    local = path[len("file:") :] if path.startswith("file:") else path
    if "://" not in path and not os.path.exists(local):
        raise click.ClickException(f"the DMQ archive {path} cannot be read: no such directory")


def _write(text: str, target: str) -> None:
    """To a file, or to stdout for '-'."""
    if target == "-":
        click.echo(text, nl=False)
    else:
        with open(target, "w", encoding="utf-8") as out:
            out.write(text)
        click.echo(f"wrote {target}", err=True)


@dmq.command("archive")
@job_options
@click.option("--dmq", "dmq_name", default="built-in-dmq", show_default=True, metavar="NAME", help=DMQ_HELP)
@click.option(
    "--chunk-size",
    type=click.IntRange(1),
    default=5000,
    show_default=True,
    help="Messages per Parquet commit (each chunk is acknowledged after its write).",
)
@click.option("--limit", type=click.IntRange(1), default=None, help="Archive at most this many messages.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.argument("path")
@spark_options
@job_failures("the DMQ archive")
def archive_cmd(
    dmq_name: str,
    chunk_size: int,
    limit: int | None,
    as_json: bool,
    path: str,
    master: str | None,
    timeout: float,
    **options: Any,
) -> None:
    """Move the DMQ's messages to Parquet at PATH (partitioned by day and reason).

    Each chunk is acknowledged in the DMQ only after its Parquet write committed; a crash
    in between archives that chunk twice, never loses it (readers drop duplicates by
    dmq_message_id, as `dmq report --archive` does).
    """
    from .dmq import archive
    from .progress import Progress

    require_spark()
    job, endpoint = _job(options, dmq_name)
    total = _dmq_backlog(job, dmq_name)
    progress = Progress(f"DMQ {dmq_name}", min(total, limit or total) if total is not None else None)
    spark = job.spark("imqbridge-dmq-archive", master, timeout)
    try:
        with _errors():
            result = archive(spark, endpoint, path, chunk_size=chunk_size, limit=limit, progress=progress.update)
    finally:
        progress.finish()
        spark.stop()
    if as_json:
        click.echo(json.dumps({"bridge": job.bridge, "dmq": dmq_name, **result.as_dict()}))
    else:
        click.echo(
            f"archived {result.messages} messages of DMQ {dmq_name} in {result.chunks} "
            f"chunks to {path} ({result.seconds:.1f} s)"
        )


def _dmq_backlog(job: ServiceJob, dmq_name: str) -> int | None:
    """Messages waiting in the DMQ when the host broker holds it; else None."""
    from ..jmsbridge.config import BUILTIN_DMQ_DESTINATION

    dmq = job.config.dmq(dmq_name)
    if dmq.is_builtin:
        return job.host_queue_depth(BUILTIN_DMQ_DESTINATION)
    return job.backlog(dmq.connection_factory_ref, dmq.destination_ref)


@dmq.command("report")
@job_options(bridge_required=False)
@click.option("--dmq", "dmq_name", default="built-in-dmq", show_default=True, metavar="NAME", help=DMQ_HELP)
@click.option(
    "--archive", "archive_path", metavar="PATH", help="Report on this archive instead of the DMQ (no service is asked)."
)
@click.option(
    "--csv",
    "csv_out",
    is_flag=False,
    flag_value="-",
    default=None,
    metavar="[FILE]",
    help="Write CSV to FILE (alone: to stdout).",
)
@click.option(
    "--json",
    "json_out",
    is_flag=False,
    flag_value="-",
    default=None,
    metavar="[FILE]",
    help="Write JSON to FILE (alone: to stdout, instead of the table).",
)
@click.option("--html", "html_out", metavar="FILE", help="Write a self-contained HTML page with bar charts to FILE.")
@spark_options
@job_failures("the DMQ report")
def report_cmd(
    dmq_name: str,
    archive_path: str | None,
    csv_out: str | None,
    json_out: str | None,
    html_out: str | None,
    master: str | None,
    timeout: float,
    **options: Any,
) -> None:
    """Count and bytes of dead messages by hour, reason, link, source and target.

    Reads the DMQ without consuming anything (a queue browser), or an archive.
    """
    from . import dmqreport
    from .dmq import browse_frame, read_archive, report

    require_spark()
    if archive_path is not None:
        from .jobs import job_spark
        from .session import DEFAULT_MASTER

        _check_local(archive_path)  # (no service: its master only with --master)
        spark = job_spark("imqbridge-dmq-report", master or DEFAULT_MASTER, {}, timeout)
        source = f"archive {archive_path}"
    else:
        if options["bridge"] is None:
            raise click.UsageError("name the bridge whose DMQ to report on (-bn), or give --archive")
        job, endpoint = _job(options, dmq_name)
        spark = job.spark("imqbridge-dmq-report", master, timeout)
        source = f"DMQ {dmq_name} of bridge {job.bridge}"
    try:
        with _errors():
            df = read_archive(spark, archive_path) if archive_path else browse_frame(spark, endpoint)
            rows = report(df)
    finally:
        spark.stop()
    for kind, target in (("csv", csv_out), ("json", json_out), ("html", html_out)):
        if target is not None:
            _write(dmqreport.render(kind, rows, source), target)
    if "-" not in (csv_out, json_out):
        click.echo(dmqreport.table(rows), nl=False)


@dmq.command("redrive")
@job_options
@click.option("--dmq", "dmq_name", default="built-in-dmq", show_default=True, metavar="NAME", help=DMQ_HELP)
@click.option(
    "--reason",
    required=True,
    metavar="REASON",
    help="JMS_SUN_JMSBRIDGE_DMQ_REASON of the messages to resend (SEND_FAILURE ...).",
)
@click.option(
    "--since",
    required=True,
    metavar="TIME",
    help="Earliest DMQ time: ISO 8601 (2026-11-22T09:00Z) or a time ago (30m, 2h, 1d).",
)
@click.option("--until", metavar="TIME", help="Only messages that reached the DMQ before this time (default: no end).")
@click.option(
    "--to", "to", metavar="DEST", help="Send here instead of the original target: NAME, queue:NAME or topic:NAME."
)
@click.option(
    "--transformer", metavar="CLASS", help="A MessageTransformer (package.module.Class) applied before each resend."
)
@click.option(
    "--dry-run", is_flag=True, help="Print how many would be sent where (per destination and status); consume nothing."
)
@click.option("-v", "--verbose", is_flag=True, help="With --dry-run: a line per message as well.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@job_failures("the redrive")
def redrive_cmd(
    dmq_name: str,
    reason: str,
    since: str,
    until: str | None,
    to: str | None,
    transformer: str | None,
    dry_run: bool,
    verbose: bool,
    as_json: bool,
    **options: Any,
) -> None:
    """Resend chosen dead messages to their original target (or DEST).

    Only messages the bridge itself dead-lettered (their DMQ marker verifies with the
    service's key) are resent; others are counted as unverified and left in the DMQ.
    The original message is restored (body, properties and headers as it had them) and
    sent through the link's target connection factory; each DMQ message is consumed only
    after its resend committed. Exits 1 when some resend failed (those stay in the DMQ).
    """
    from ..transform import load_transformer
    from .dmq import check_reason, parse_destination, parse_time, redrive, target_factories

    with _errors():
        check_reason(reason)
        since_ms = parse_time(since)
        until_ms = parse_time(until) if until else None
        dest = parse_destination(to) if to else None
        plugin = load_transformer(transformer) if transformer else None
    job, endpoint = _job(options, dmq_name)
    with _errors():
        result = redrive(
            endpoint,
            reason,
            since_ms,
            until_ms,
            to=dest,
            transformer=plugin,
            dry_run=dry_run,
            factories=target_factories(job.config, job.host_factory),
        )
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
    else:
        _print_redrive(result, per_message=verbose or not result.dry_run)
    if result.count("failed"):
        sys.exit(1)


def _print_redrive(result: RedriveResult, per_message: bool) -> None:
    """A line per message (a real redrive, or -v), else one per destination and status."""
    rows: list[tuple[str, ...]]
    if per_message:
        rows = [("status", "dmq message", "source message", "link", "destination", "detail")]
        rows += [
            (
                i.status,
                i.dmq_message_id,
                i.source_message_id or "-",
                i.link or "-",
                i.destination or "-",
                i.detail or "",
            )
            for i in result.items
        ]
    else:
        groups = Counter((i.status, i.destination or "-", i.link or "-") for i in result.items)
        rows = [("status", "messages", "destination", "link")]
        rows += [(status, f"{n:,}", dest, link) for (status, dest, link), n in sorted(groups.items())]
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
    counts = ", ".join(
        f"{result.count(s)} {s}"
        for s in ("would-send", "sent", "failed", "skipped", "unverified", "gone")
        if result.count(s)
    )
    click.echo(f"{'dry run: ' if result.dry_run else ''}{len(result.items)} chosen{': ' + counts if counts else ''}")
    if result.count("unverified"):
        click.echo(
            f"skipped {result.count('unverified')} message(s) the bridge did not "
            "dead-letter (DMQ marker missing or wrong); they are left in the DMQ"
        )
