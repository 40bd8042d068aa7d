"""imqbridgemgr's admin subcommands, in the original utility's syntax and messages.

    imqbridgemgr <list|start|stop|pause|resume> <bridge|link> [options]
    imqbridgemgr <create|update|query|list> dst -t q|t -n NAME [-o ATTR=VALUE ...]
    imqbridgemgr <purge|destroy> dst -t q|t -n NAME [-f]      browse dst -t q -n NAME [-c N]
    imqbridgemgr <pause|resume> dst [-t q|t -n NAME] [-pst PRODUCERS|CONSUMERS|ALL]
    imqbridgemgr list <cxn [-svn SERVICE]|svc>
    imqbridgemgr list txn -bn BRIDGE        <commit|rollback> txn -n ID -bn BRIDGE
    imqbridgemgr <redrive|archive> dmq -bn BRIDGE [-dmq NAME] (-msgid ID ... | -all)

How it works: the options are checked against the original's rules (``link`` needs
``-bn``; all but ``list link`` need ``-ln`` too; ``-ln`` with ``bridge`` is an error; the
STOMP bridge knows only start, stop and list), the admin port is looked up through
the port mapper at ``-b host:port``, the user and password come from ``-u`` /
``-passfile`` or a prompt, every command that changes something (but ``create dst``) asks
for confirmation unless ``-f``, and the reply is printed as the original's tables and success
line — or, with ``--json``, as one JSON object. ``list link -v`` adds the counters, rate,
backlog and last error. Exit status: 0 success, 1 failure (2 for usage errors).
The ``dst`` commands and ``list cxn`` / ``list svc`` follow imqcmd (dstadmin.py does them in
the service); the ``txn`` commands list a JMS bridge's in-doubt XA transactions and commit
or roll one back by hand (a heuristic outcome the operator chooses).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from .admin.client import AdminError, AuthenticationFailed, ServiceUnavailable
from .admin.clierror import CommandFailed, reply_object
from .admin.login import admin_login, admin_options, host_port, open_admin
from .admin.protocol import BAD_REQUEST, ERROR, MAX_BROWSE, PAUSE_TYPES, UNAVAILABLE, Command, Reply

STOMP = "STOMP"

EXAMPLES = """Examples:
  imqbridgemgr list bridge -b localhost:7676
  imqbridgemgr list bridge -bn mq2external -u admin -passfile pw.txt
  imqbridgemgr list link -bn mq2external
  imqbridgemgr list link -bn mq2external -v
  imqbridgemgr start bridge -bn mq2external -b myhost:8886 -f
  imqbridgemgr stop link -ln link1 -bn mq2external -b myhost:8886
  imqbridgemgr pause link -ln link1 -bn mq2external
  imqbridgemgr stop bridge -t STOMP -b myhost:8886
  imqbridgemgr list bridge --json
  imqbridgemgr update dst -t q -n mq.sys.dmq -o maxNumMsgs=1000 -o limitBehavior=REMOVE_OLDEST -f
  imqbridgemgr create dst -t q -n orders -o maxNumMsgs=10000 -o limitBehavior=FLOW_CONTROL
  imqbridgemgr query dst -t q -n orders
  imqbridgemgr list dst
  imqbridgemgr purge dst -t q -n orders -f
  imqbridgemgr browse dst -t q -n orders -c 5
  imqbridgemgr list dst -t t
  imqbridgemgr pause dst -t q -n orders -pst CONSUMERS -f
  imqbridgemgr resume dst -t q -n orders -f
  imqbridgemgr destroy dst -t q -n orders -f
  imqbridgemgr list cxn -svn stomp
  imqbridgemgr list svc
  imqbridgemgr browse dst -t q -n mq.sys.dmq -c 100 --json
  imqbridgemgr list txn -bn mq2external
  imqbridgemgr commit txn -n 'mq2external|5f1c9a0e2b7d4c11.2a' -bn mq2external
  imqbridgemgr redrive dmq -bn mq2external -msgid ID:a1b2c3 -msgid ID:d4e5f6 -f
  imqbridgemgr archive dmq -bn mq2external -all -f --json
"""


def reply_json(reply: Reply) -> str:
    """A reply under --json: status, message and data; a failed one also as the JSON
    error object every failing command prints (admin/clierror.py)."""
    return json.dumps(reply_object(reply), indent=2)


def _failed(exc: AdminError) -> CommandFailed:
    """The admin port could not be used: 503 unreachable, 400 login refused (as the
    service answers a failed HELLO), else 500."""
    status = (
        UNAVAILABLE
        if isinstance(exc, ServiceUnavailable)
        else BAD_REQUEST
        if isinstance(exc, AuthenticationFailed)
        else ERROR
    )
    return CommandFailed(str(exc), status)


def _show_examples(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(ctx.get_help())
        click.echo()
        click.echo(EXAMPLES)
        ctx.exit(0)


def _table(titles: list[str], rows: list[list[str]]) -> str:
    """The original's table: dash line, titles, dash line, rows sorted by the first column."""
    rows = sorted(rows, key=lambda r: r[0])
    widths = [max([len(t)] + [len(r[i]) for r in rows]) for i, t in enumerate(titles)]
    line = "-" * (sum(widths) + 2 * (len(widths) - 1))
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line, fmt(titles), line] + [fmt(r) for r in rows] + [""])


def _link_rows(links: list[dict[str, Any]], with_counters: bool) -> tuple[list[str], list[list[str]]]:
    """The original's five columns; ``with_counters`` (-v): counters, the rate over the last
    minute, the source backlog ("-": the provider cannot tell) and the last error, last
    since it has spaces."""
    titles = ["Link Name", "Link State", "Source", "Target", "Transacted"]
    spark = with_counters and any("progress" in link for link in links)  # runner=spark links
    if with_counters:
        titles += (
            ["Transferred", "DMQ", "Redelivered", "Rate/s", "Backlog"]
            + (["Spark Progress"] if spark else [])
            + ["Last Error"]
        )
    rows = []
    for link in links:
        row = [link["name"], link["state"], link["source"], link["target"], str(link["transacted"]).lower()]
        if with_counters:
            c = link.get("counters", {})
            backlog = link.get("backlog")
            row += [
                str(c.get("transferred", 0)),
                str(c.get("to_dmq", 0)),
                str(c.get("redelivered", 0)),
                f"{c.get('rate', 0.0):.1f}",
                "-" if backlog is None else str(backlog),
            ]
            if spark:
                row.append(_progress(link.get("progress")))
            row.append(c.get("last_error") or "-")
        rows.append(row)
    return titles, rows


def _progress(p: dict[str, Any] | None) -> str:
    """A Spark link's query progress: batches, input rows, rows/s, last batch id."""
    if not p:
        return "-"
    return (
        f"{p.get('batches', 0)} batches, {p.get('input_rows', 0)} rows, "
        f"{p.get('rows_per_second', 0)} rows/s, last batch {p.get('last_batch_id', '-')}"
    )


def render_list(reply: Reply, argument: str, bridge: str | None, link: str | None, verbose: bool = False) -> str:
    data = reply.data or {}
    out = []
    if argument == "bridge" and bridge is None:
        bridges = data.get("bridges", [])
        if any("owner" in b for b in bridges):  # an HA cluster's bridges and their owners
            out.append(
                _table(
                    ["Bridge Name", "Bridge Type", "Bridge State", "Owner"],
                    [[b["name"], b["type"], b["state"], b.get("owner", "-")] for b in bridges],
                )
            )
        else:
            out.append(
                _table(
                    ["Bridge Name", "Bridge Type", "Bridge State"],
                    [[b["name"], b["type"], b["state"]] for b in bridges],
                )
            )
    elif argument == "bridge":
        b = data["bridge"]
        if b["type"] == "JMS":
            out.append(
                _table(
                    ["Bridge Name", "Bridge Type", "Bridge State", "Links"],
                    [[b["name"], b["type"], b["state"], str(len(data.get("links", [])))]],
                )
            )
            out.append(_table(*_link_rows(data.get("links", []), with_counters=False)))
        else:
            out.append(_table(["Bridge Name", "Bridge Type", "Bridge State"], [[b["name"], b["type"], b["state"]]]))
    else:
        links = [x for x in data.get("links", []) if link is None or x["name"] == link]
        out.append(_table(*_link_rows(links, with_counters=verbose)))
        for x in links:  # what keeps a link from moving now (cleared once it is connected)
            if current := x.get("counters", {}).get("current_error"):
                out.append(f"Link {x['name']} is {x['state']}: {current}\n")
    out.append(f"The operation [list] on the {'bridge(s)' if argument == 'bridge' else 'link(s)'} was successful.")
    return "\n".join(out)


def _check_usage(op: str, argument: str, bridge: str | None, link: str | None, btype: str | None) -> str | None:
    """The original's option rules; returns the bridge name to use (STOMP: 'stomp')."""
    if btype == STOMP:
        if op in ("pause", "resume"):
            raise click.UsageError(f"the STOMP bridge cannot be {op}d (it knows start, stop and list)")
        if argument == "link":
            raise click.UsageError("the STOMP bridge has no links")
        if bridge is not None and op == "list":
            raise click.UsageError("list bridge -bn is not supported for the STOMP bridge")
        if op != "list":
            bridge = bridge or "stomp"
    if argument == "bridge":
        if link is not None:
            raise click.UsageError("-ln is not allowed with 'bridge' (use 'link')")
        if op != "list" and bridge is None:
            raise click.UsageError(f"{op} bridge needs -bn BRIDGE (or -t STOMP)")
    else:
        if bridge is None:
            raise click.UsageError(f"{op} link needs -bn BRIDGE")
        if op != "list" and link is None:
            raise click.UsageError(f"{op} link needs -ln LINK")
    return bridge


F = TypeVar("F", bound=Callable[..., Any])


def reply_options(fn: F) -> F:
    """The options every admin command shares for its reply: -f, -s, --json, -nocheck
    (the original's option, accepted and ignored), -H."""
    for option in reversed(
        (
            click.option("-f", "force", is_flag=True, help="Do not ask for confirmation."),
            click.option("-s", "silent", is_flag=True, help="Silent mode: print nothing on success."),
            click.option("--json", "as_json", is_flag=True, help="Print the reply as JSON."),
            click.option(
                "-nocheck",
                is_flag=True,
                expose_value=False,
                help="Accepted for the original's scripts; changes nothing here.",
            ),
            click.option(
                "-H",
                "-Help",
                is_flag=True,
                expose_value=False,
                is_eager=True,
                callback=_show_examples,
                help="Show this help with examples.",
            ),
        )
    ):
        fn = option(fn)
    return fn


def _command(op: str):
    @click.command(
        op,
        context_settings={"help_option_names": ["-h", "-help", "--help"]},
        help="List bridges, links, the host broker's destinations (list dst), connections (list cxn) "
        "or the instance's services (list svc)."
        if op == "list"
        else f"{op.capitalize()} a bridge or a link (the original imqbridgemgr syntax)"
        + (f", or a destination (imqcmd's {op} dst)." if op in ("pause", "resume") else "."),
    )
    @click.argument(
        "argument",
        type=click.Choice(
            ["bridge", "link", "dst", "txn", "cxn", "svc"]
            if op == "list"
            else ["bridge", "link", "dst"]
            if op in ("pause", "resume")
            else ["bridge", "link"],
            case_sensitive=False,
        ),
    )
    @click.option("-bn", "bridge", metavar="NAME", help="Bridge name.")
    @click.option("-ln", "link", metavar="NAME", help="Link name.")
    @click.option(
        "-t",
        "btype",
        type=click.Choice(
            ["JMS", "STOMP"] if op in ("start", "stop") else ["JMS", "STOMP", "q", "t"], case_sensitive=False
        ),
        help="Bridge type" + ("" if op in ("start", "stop") else " (dst: destination type, q or t)") + ".",
    )
    @click.option(
        "-n",
        "name",
        metavar="NAME",
        hidden=op not in ("pause", "resume"),
        help=f"{op} dst: the destination (with -t; without both: every destination).",
    )
    @click.option(
        "-pst",
        "pause_type",
        type=click.Choice(list(PAUSE_TYPES), case_sensitive=False),
        hidden=op not in ("pause", "resume"),
        help=f"{op} dst: what to {op}: the producers' sends, deliveries to consumers, or both (default ALL).",
    )
    @click.option("-tmp", "temporary", is_flag=True, hidden=op != "list", help="list dst: temporary ones too.")
    @click.option(
        "-svn", "service", metavar="SERVICE", hidden=op != "list", help="list cxn: only this service's (jms, stomp...)."
    )
    @admin_options
    @reply_options
    @click.option(
        "-v",
        "verbose",
        is_flag=True,
        hidden=op != "list",
        help="list link: also counters, rate (msg/s over the last minute), backlog and "
        "last error; list dst: each destination's counts on each instance of an HA cluster, "
        "with their age (--json always has them).",
    )
    def command(
        argument: str,
        broker: str,
        bridge: str | None,
        link: str | None,
        btype: str | None,
        user: str | None,
        passfile: str | None,
        force: bool,
        silent: bool,
        secure: bool,
        cafile: str | None,
        reply_timeout: int,
        retries: int,
        as_json: bool,
        verbose: bool,
        name: str | None,
        pause_type: str | None,
        temporary: bool,
        service: str | None,
    ) -> None:
        argument = argument.lower()
        if (name is not None or pause_type is not None) and (argument != "dst" or op == "list"):
            raise click.UsageError("-n and -pst are for pause dst and resume dst")
        if temporary and (argument, op) != ("dst", "list"):
            raise click.UsageError("-tmp is for list dst")
        if service is not None and argument != "cxn":
            raise click.UsageError("-svn is for list cxn")
        if argument in ("cxn", "svc"):
            if bridge is not None or link is not None or btype is not None:
                raise click.UsageError(f"list {argument} takes no -bn, -ln or -t")
            _run_dst(
                Command(f"LIST_{argument.upper()}", service=service),
                "list",
                broker,
                user,
                passfile,
                silent,
                secure,
                cafile,
                reply_timeout,
                retries,
                as_json,
                "connection" if argument == "cxn" else "service",
            )
            return
        if argument == "dst":
            if bridge is not None or link is not None:
                raise click.UsageError(f"{op} dst takes no -bn or -ln")
            dst_type = btype.lower() if btype else None
            if dst_type not in (None, "q", "t"):
                raise click.UsageError(f"{op} dst -t takes q or t")
            if op != "list":
                if (dst_type is None) != (name is None):
                    raise click.UsageError(f"{op} dst takes -t and -n together (neither: every destination)")
                what = "destination" if name is not None else "destinations"
                if not force and not click.confirm(
                    f"Are you sure you want to perform operation [{op}] on "
                    + ("this destination ?" if name is not None else "all destinations ?"),
                    default=False,
                    show_default=False,
                    prompt_suffix=" (y/n)[n] ",
                    err=as_json,
                ):
                    click.echo(f"The operation [{op}] on the {what} was not performed.", err=as_json)
                    raise click.exceptions.Exit(0)
                cmd = Command(
                    f"{op.upper()}_DST", dst_type=dst_type, destination=name, pause_type=(pause_type or "ALL").upper()
                )
                _run_dst(cmd, op, broker, user, passfile, silent, secure, cafile, reply_timeout, retries, as_json)
                return
            _run_dst(
                Command("LIST_DST", dst_type=dst_type, temporary=temporary),
                "list",
                broker,
                user,
                passfile,
                silent,
                secure,
                cafile,
                reply_timeout,
                retries,
                as_json,
                verbose=verbose,
            )
            return
        if argument == "txn":
            if bridge is None or link is not None or btype is not None:
                raise click.UsageError("list txn needs -bn BRIDGE (and takes no -ln or -t)")
            _run_txn(
                Command("LIST_TXN", bridge=bridge),
                "list",
                broker,
                user,
                passfile,
                silent,
                secure,
                cafile,
                reply_timeout,
                retries,
                as_json,
            )
            return
        btype = btype.upper() if btype else None
        if btype in ("Q", "T"):
            raise click.UsageError(f"-t {btype.lower()} is a destination type: use {op} dst")
        bridge = _check_usage(op, argument, bridge, link, btype)
        host_port(broker)
        if (
            op != "list"
            and not force
            and not click.confirm(
                f"Are you sure you want to perform operation [{op}] on this {argument} ?",
                default=False,
                show_default=False,
                prompt_suffix=" (y/n)[n] ",
            )
        ):
            click.echo(f"The operation [{op}] on the {argument} was not performed.")
            raise click.exceptions.Exit(0)
        user, password = admin_login(user, passfile)
        cmd = Command(op.upper(), btype, bridge, link if argument == "link" else None)
        try:
            with open_admin(broker, user, password, secure, cafile, reply_timeout, retries) as client:
                reply = client.request(cmd)
        except AdminError as exc:
            raise _failed(exc) from None
        if as_json:
            click.echo(reply_json(reply))
        elif not reply.ok:
            click.echo(f"The operation [{op}] on the {argument} failed: {reply.message}", err=True)
        elif not silent:
            if op == "list":
                click.echo(render_list(reply, argument, bridge, link, verbose))
            else:
                click.echo(f"The operation [{op}] on the {argument} was successful.")
        if not reply.ok:
            raise click.exceptions.Exit(1)

    return command


def _dst_table(rows: list[dict[str, Any]]) -> str:
    """list dst / query dst: imqcmd's Name, Type, State, Producers, Consumers (a topic:
    and its subscriptions, durable ones among them), the counts, then the attributes."""
    titles = [
        "Name",
        "Type",
        "State",
        "Producers",
        "Consumers",
        "Subscriptions",
        "Pending",
        "Unacked",
        "Bytes",
        "Producers waiting",
        "maxNumMsgs",
        "maxTotalMsgBytes",
        "maxBytesPerMsg",
        "limitBehavior",
        "useDMQ",
        "backoutThreshold",
        "backoutQueue",
        "backoutDisposition",
        "maxNumProducers",
        "maxNumActiveConsumers",
        "maxNumBackupConsumers",
        "consumerFlowLimit",
    ]
    return _table(
        titles,
        [
            [
                r["name"],
                ("temporary " if r.get("temporary") else "") + ("topic" if r["type"] == "t" else "queue"),
                r["state"],
                str(r["producers"]),
                str(r["consumers"]),
                f"{r['subscriptions']} ({r['durable_subscriptions']} durable)" if r["type"] == "t" else "-",
                str(r["pending"]),
                str(r["unacked"]),
                str(r["bytes"]),
                str(r["producers_waiting"]),
                *(_cell(r["attributes"].get(name, "-")) for name in titles[10:]),
            ]
            for r in rows
        ],
    )


def _cell(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _dst_instances_table(rows: list[dict[str, Any]]) -> str:
    """list dst -v: each destination's counts on each instance (an HA cluster's live ones:
    Age is how many seconds ago that instance published them), then their total."""
    counted = ["producers", "consumers", "pending", "unacked", "bytes"]
    out = []
    for r in rows:
        kind = ("temporary " if r.get("temporary") else "") + ("topic" if r["type"] == "t" else "queue")
        for i in r.get("instances", []):
            out.append([r["name"], kind, i["broker_id"], f"{i['age']:.1f}", *(str(i.get(k, 0)) for k in counted)])
        out.append([r["name"], kind, "(total)", "", *(str(r[k]) for k in counted)])
    return _table(["Name", "Type", "Broker", "Age (s)", "Producers", "Consumers", "Pending", "Unacked", "Bytes"], out)


def _cxn_table(rows: list[dict[str, Any]]) -> str:
    """list cxn: imqcmd's Connection ID, User, Service, Producers, Consumers, Host."""
    return _table(
        ["Connection ID", "User", "Service", "Producers", "Consumers", "Host", "Client ID"],
        [
            [
                str(c["id"]),
                c["user"] or "-",
                c["service"],
                str(c["producers"]),
                str(c["consumers"]),
                c["host"] or "-",
                c["client_id"] or "-",
            ]
            for c in rows
        ],
    )


def _browse_table(messages: list[dict[str, Any]]) -> str:
    """Browsed messages in delivery order: one block of headers, properties and a preview each."""
    if not messages:
        return "No messages.\n"
    out = []
    for i, m in enumerate(messages, 1):
        out.append(f"Message {i}: {m['message_id']}")
        out.append(
            f"  timestamp {m['timestamp']}  priority {m['priority']}  persistent "
            f"{str(m['persistent']).lower()}  redelivered {str(m['redelivered']).lower()}"
        )
        for name in ("correlation_id", "type", "reply_to", "expiration"):
            if m[name]:
                out.append(f"  {name} {m[name]}")
        for name, value in m["properties"].items():
            out.append(f"  property {name} = {value!r}")
        out.append(f"  body {m['body_type']}, {m['body_size']} bytes: {m['preview']}")
    return "\n".join(out) + "\n"


def _ask(
    cmd: Command,
    broker: str,
    user: str | None,
    passfile: str | None,
    secure: bool,
    cafile: str | None,
    reply_timeout: int,
    retries: int,
) -> Reply:
    """One admin command's reply (a failure to reach or log in: a ClickException)."""
    host_port(broker)
    user, password = admin_login(user, passfile)
    try:
        with open_admin(broker, user, password, secure, cafile, reply_timeout, retries) as client:
            return client.request(cmd)
    except AdminError as exc:
        raise _failed(exc) from None


def _answer(reply: Reply, op: str, what: str, silent: bool, as_json: bool, show: Callable[[Any], str | None]) -> None:
    """Print ``reply`` the original's way (``show`` renders its data) or as JSON; exit 1
    when it failed."""
    if as_json:
        click.echo(reply_json(reply))
    elif not reply.ok:
        click.echo(f"The operation [{op}] on the {what} failed: {reply.message}", err=True)
    elif not silent:
        text = show(reply.data)
        if text is not None:
            click.echo(text)
        click.echo(f"The operation [{op}] on the {what}{'s' if op == 'list' else ''} was successful.")
    if not reply.ok:
        raise click.exceptions.Exit(1)


def _not_yet(data: dict[str, Any]) -> str:
    """create, update, destroy dst on an HA instance: the live instances not caught up."""
    behind = data.get("not_yet")
    if not behind:
        return ""
    return (
        f"\nNot yet done on broker {', '.join(behind)} of the HA cluster (it is once that instance "
        "reads the cluster's destinations)."
    )


def _dst_text(op: str, data: Any, verbose: bool = False) -> str | None:
    if "connections" in data:
        return _cxn_table(data["connections"])
    if "services" in data:
        return _table(
            ["Service Name", "Protocol", "Port Number", "Service State"],
            [[v["name"], v["protocol"], str(v["port"]), v["state"]] for v in data["services"]],
        )
    if op == "list":
        return _dst_table(data["destinations"]) + (_dst_instances_table(data["destinations"]) if verbose else "")
    if op == "query":  # (an HA instance's: and each instance's counts)
        return _dst_table([data]) + (_dst_instances_table([data]) if data.get("instances") else "")
    if op in ("create", "update"):
        return _not_yet(data).lstrip("\n") or None
    if op == "browse":
        more = f"More messages follow: add -after {data['next']} for the next page.\n" if data.get("next") else ""
        return _browse_table(data["messages"]) + more
    if op == "purge":
        return f"Purged {data['purged']} message(s)" + (
            f"; {data['in_delivery']} in delivery stay with their consumers." if data["in_delivery"] else "."
        )
    if op == "destroy":
        return f"Destroyed with {data['removed']} message(s)." + _not_yet(data)
    if op in ("pause", "resume"):
        return _table(
            ["Name", "Type", "State"],
            [[d["name"], "topic" if d["type"] == "t" else "queue", d["state"]] for d in data["destinations"]],
        )
    return None


def _run_dst(
    cmd: Command,
    op: str,
    broker: str,
    user: str | None,
    passfile: str | None,
    silent: bool,
    secure: bool,
    cafile: str | None,
    reply_timeout: int,
    retries: int,
    as_json: bool,
    what: str = "destination",
    verbose: bool = False,
) -> None:
    """Send a destination command (or list cxn, list svc: ``what``) and print its reply
    (exit 1 when it failed); ``verbose``: list dst -v."""
    reply = _ask(cmd, broker, user, passfile, secure, cafile, reply_timeout, retries)
    _answer(reply, op, what, silent, as_json, lambda data: _dst_text(op, data, verbose))


def _dst_command(op: str):
    @click.command(
        op,
        context_settings={"help_option_names": ["-h", "-help", "--help"]},
        help=f"{op.capitalize()} a physical destination of the host broker (imqcmd syntax).",
    )
    @click.argument("argument", type=click.Choice(["dst"], case_sensitive=False))
    @click.option(
        "-t",
        "dst_type",
        type=click.Choice(["q", "t"], case_sensitive=False),
        required=True,
        help="Destination type: q (queue) or t (topic).",
    )
    @click.option("-n", "name", metavar="NAME", required=True, help="Destination name.")
    @click.option(
        "-o",
        "attributes",
        metavar="ATTR=VALUE",
        multiple=True,
        help="An attribute to set: maxNumMsgs, maxTotalMsgBytes, maxBytesPerMsg, limitBehavior, useDMQ, "
        "backoutThreshold, backoutQueue, backoutDisposition, localDeliveryPreferred, isLocalOnly, "
        "maxNumProducers, maxNumActiveConsumers, maxNumBackupConsumers, consumerFlowLimit.",
    )
    @admin_options
    @reply_options
    def command(
        argument: str,
        dst_type: str,
        name: str,
        attributes: tuple[str, ...],
        broker: str,
        user: str | None,
        passfile: str | None,
        force: bool,
        silent: bool,
        secure: bool,
        cafile: str | None,
        reply_timeout: int,
        retries: int,
        as_json: bool,
    ) -> None:
        values: dict[str, str] = {}
        for item in attributes:
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                raise click.UsageError(f"-o {item!r}: write ATTR=VALUE, e.g. -o maxNumMsgs=1000")
            values[key.strip()] = value.strip()
        if op == "query" and values:
            raise click.UsageError("query dst takes no -o")
        if op == "update" and not values:
            raise click.UsageError("update dst needs at least one -o ATTR=VALUE")
        if (
            op == "update"
            and not force
            and not click.confirm(
                "Are you sure you want to perform operation [update] on this destination ?",
                default=False,
                show_default=False,
                prompt_suffix=" (y/n)[n] ",
            )
        ):
            click.echo("The operation [update] on the destination was not performed.")
            raise click.exceptions.Exit(0)
        cmd = Command(f"{op.upper()}_DST", dst_type=dst_type.lower(), destination=name, attributes=values)
        _run_dst(cmd, op, broker, user, passfile, silent, secure, cafile, reply_timeout, retries, as_json)

    return command


def _purge_browse_command(op: str):
    purge = op in ("purge", "destroy")  # (both ask, both take -t q|t)

    @click.command(
        op,
        context_settings={"help_option_names": ["-h", "-help", "--help"]},
        help="Remove every waiting message of a destination (paged-out ones too)."
        if op == "purge"
        else "Remove a destination with its messages (a topic: its durable subscriptions too)."
        if op == "destroy"
        else "Show the first messages waiting on a queue: headers, properties and a preview.",
    )
    @click.argument("argument", type=click.Choice(["dst"], case_sensitive=False))
    @click.option(
        "-t",
        "dst_type",
        type=click.Choice(["q", "t"] if purge else ["q"], case_sensitive=False),
        required=True,
        help="Destination type: q (queue)" + (" or t (topic)." if purge else "."),
    )
    @click.option("-n", "name", metavar="NAME", required=True, help="Destination name.")
    @click.option(
        "-c",
        "count",
        type=click.IntRange(1, MAX_BROWSE),
        default=10,
        show_default=True,
        hidden=purge,
        help="How many messages to show.",
    )
    @click.option(
        "-after",
        "after",
        metavar="ID",
        hidden=purge,
        help="Only the messages after this one (a JMSMessageID; the next page's, as --json's data.next gives it).",
    )
    @admin_options
    @reply_options
    def command(
        argument: str,
        dst_type: str,
        name: str,
        count: int,
        after: str | None,
        broker: str,
        user: str | None,
        passfile: str | None,
        force: bool,
        silent: bool,
        secure: bool,
        cafile: str | None,
        reply_timeout: int,
        retries: int,
        as_json: bool,
    ) -> None:
        if (
            purge
            and not force
            and not click.confirm(
                f"Are you sure you want to perform operation [{op}] on this destination ?",
                default=False,
                show_default=False,
                prompt_suffix=" (y/n)[n] ",
                err=as_json,
            )
        ):
            click.echo(f"The operation [{op}] on the destination was not performed.", err=as_json)
            raise click.exceptions.Exit(0)
        if purge and after is not None:
            raise click.UsageError(f"{op} dst takes no -after")
        cmd = Command(
            f"{op.upper()}_DST",
            dst_type=dst_type.lower(),
            destination=name,
            count=None if purge else count,
            after=None if purge else after,
        )
        _run_dst(cmd, op, broker, user, passfile, silent, secure, cafile, reply_timeout, retries, as_json)

    return command


def _txn_table(data: dict[str, Any]) -> str:
    """In-doubt transactions: id, what the log says, and each branch's RM and Xid."""
    rows = [
        [
            t["id"],
            t["logged"] + (" (in flight)" if t["in_flight"] else ""),
            ", ".join(b["rm"] for b in t["branches"]),
            " ".join(b["xid"] for b in t["branches"]),
        ]
        for t in data["transactions"]
    ]
    out = _table(["Transaction ID", "Log Says", "Prepared At", "Branch Xids"], rows)
    for rm, why in data.get("unreachable", {}).items():
        out += f"Resource manager {rm} could not be asked: {why}\n"
    return out


def _run_txn(
    cmd: Command,
    op: str,
    broker: str,
    user: str | None,
    passfile: str | None,
    silent: bool,
    secure: bool,
    cafile: str | None,
    reply_timeout: int,
    retries: int,
    as_json: bool,
) -> None:
    """Send a txn command and print its reply (exit 1 when it failed)."""
    reply = _ask(cmd, broker, user, passfile, secure, cafile, reply_timeout, retries)
    _answer(reply, op, "transaction", silent, as_json, lambda data: _txn_table(data) if op == "list" else None)


def _txn_command(op: str):
    @click.command(
        op,
        context_settings={"help_option_names": ["-h", "-help", "--help"]},
        help=f"{op.capitalize()} an in-doubt XA transaction of a JMS bridge by hand "
        "(a heuristic outcome; see list txn).",
    )
    @click.argument("argument", type=click.Choice(["txn"], case_sensitive=False))
    @click.option(
        "-n", "txn", metavar="ID", required=True, help="Transaction ID as list txn shows it (or one branch's Xid)."
    )
    @click.option("-bn", "bridge", metavar="NAME", required=True, help="Bridge name.")
    @admin_options
    @reply_options
    def command(
        argument: str,
        txn: str,
        bridge: str,
        broker: str,
        user: str | None,
        passfile: str | None,
        force: bool,
        silent: bool,
        secure: bool,
        cafile: str | None,
        reply_timeout: int,
        retries: int,
        as_json: bool,
    ) -> None:
        if not force and not click.confirm(
            f"Are you sure you want to perform operation [{op}] on this transaction ?",
            default=False,
            show_default=False,
            prompt_suffix=" (y/n)[n] ",
            err=as_json,
        ):
            click.echo(f"The operation [{op}] on the transaction was not performed.", err=as_json)
            raise click.exceptions.Exit(0)
        _run_txn(
            Command(f"{op.upper()}_TXN", bridge=bridge, txn=txn),
            op,
            broker,
            user,
            passfile,
            silent,
            secure,
            cafile,
            reply_timeout,
            retries,
            as_json,
        )

    return command


def _dmq_table(data: dict[str, Any]) -> str:
    """Each chosen entry: its JMSMessageID, what became of it, where it went or why not."""
    rows = [
        [e["message_id"], e["status"], e.get("destination") or e.get("detail") or data.get("archive") or ""]
        for e in data["entries"]
    ]
    out = _table(["JMSMessageID", "Outcome", "Where / Why"], rows)
    if data["remaining"]:
        out += f"{data['remaining']} more entries remain: run the command again.\n"
    return out


def _dmq_move_command(op: str):
    @click.command(
        op,
        context_settings={"help_option_names": ["-h", "-help", "--help"]},
        help="Send DMQ entries of a JMS bridge back to their links' targets, each in one "
        "transaction with its removal from the DMQ (entries whose target is on another broker: "
        "imqbridgemgr dmq redrive)."
        if op == "redrive"
        else "Move DMQ entries of a JMS bridge into the service's archive file "
        "(<instance>/dmqarchive/<bridge>/<dmq>.jsonl, one JSON object a line).",
    )
    @click.argument("argument", type=click.Choice(["dmq"], case_sensitive=False))
    @click.option("-bn", "bridge", metavar="NAME", required=True, help="Bridge name.")
    @click.option("-dmq", "dmq_name", metavar="NAME", help="The <dmq>'s name (default: the built-in DMQ).")
    @click.option(
        "-msgid", "message_ids", metavar="ID", multiple=True, help="An entry's JMSMessageID (repeat for more)."
    )
    @click.option("-all", "all_entries", is_flag=True, help="Every entry of the DMQ.")
    @admin_options
    @reply_options
    def command(
        argument: str,
        bridge: str,
        dmq_name: str | None,
        message_ids: tuple[str, ...],
        all_entries: bool,
        broker: str,
        user: str | None,
        passfile: str | None,
        force: bool,
        silent: bool,
        secure: bool,
        cafile: str | None,
        reply_timeout: int,
        retries: int,
        as_json: bool,
    ) -> None:
        if bool(message_ids) == all_entries:
            raise click.UsageError(f"{op} dmq needs -msgid ID (one or more) or -all, not both")
        if not force and not click.confirm(
            f"Are you sure you want to perform operation [{op}] on this DMQ ?",
            default=False,
            show_default=False,
            prompt_suffix=" (y/n)[n] ",
            err=as_json,
        ):
            click.echo(f"The operation [{op}] on the DMQ was not performed.", err=as_json)
            raise click.exceptions.Exit(0)
        cmd = Command(
            f"{op.upper()}_DMQ", bridge=bridge, dmq=dmq_name, message_ids=message_ids, all_entries=all_entries
        )
        reply = _ask(cmd, broker, user, passfile, secure, cafile, reply_timeout, retries)
        _answer(reply, op, "DMQ", silent, as_json, _dmq_table)

    return command


def register(group: click.Group) -> None:
    for op in ("list", "start", "stop", "pause", "resume"):
        group.add_command(_command(op))
    for op in ("create", "update", "query"):
        group.add_command(_dst_command(op))
    for op in ("purge", "browse", "destroy"):
        group.add_command(_purge_browse_command(op))
    for op in ("commit", "rollback"):
        group.add_command(_txn_command(op))
    for op in ("redrive", "archive"):
        group.add_command(_dmq_move_command(op))
