"""imqbridgemgr: the command line (a thin click group; the work lives elsewhere).

How it works: the group is called imqbridgemgr however it is started (the console script,
./imqbridgemgr, python -m bridgemgr or bridgemgr.cli). Before the subcommand is parsed,
``-javahome DIR`` is taken from wherever it stands on the line (the original's utilities
accept it anywhere) and sets JAVA_HOME, where the Java provider's JPype finds its JVM.
With ``--json`` on the line, a failure is printed as one JSON error object on stdout
(admin/clierror.py) with the same exit status.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from .version import __version__

if TYPE_CHECKING:
    from .logfiles import ServiceLog
    from .users import UserRepository

F = TypeVar("F", bound=Callable[..., Any])

PROG = "imqbridgemgr"
EXAMPLES = """Examples:
  imqbridgemgr serve -props broker.properties -passfile admin.pw
  imqbridgemgr check -props broker.properties bridge1.xml
  imqbridgemgr list bridge -b localhost:7676 -u admin -passfile pw.txt
  imqbridgemgr start link -bn mq2external -ln link1 -f
  imqbridgemgr browse dst -t q -n orders -c 5 --json
  imqbridgemgr purge dst -t q -n orders -f
  imqbridgemgr user list -props broker.properties --json
  imqbridgemgr keytool -props broker.properties -service stomp
  imqbridgemgr -javahome /usr/lib/jvm/java-17 serve -props broker.properties
  imqbridgemgr COMMAND -H    (a command's help with its examples)
"""


def _log_level(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """-loglevel NAME as a logging level (LOG_LEVELS' names, either case)."""
    if value is None:
        return None
    from .props import LOG_LEVELS, parse_log_level

    try:
        return parse_log_level(value)
    except ValueError:
        raise click.BadParameter(f"{value!r}; write one of {', '.join(LOG_LEVELS)}") from None


class Imqbridgemgr(click.Group):
    """The top-level group: its name whatever started it, -javahome anywhere on the line,
    and failures as JSON under --json."""

    def main(
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        args = list(sys.argv[1:] if args is None else args)
        options = args[: args.index("--")] if "--" in args else args
        if "--json" not in options or not standalone_mode:
            return super().main(args, prog_name or PROG, complete_var, standalone_mode, **extra)
        from .admin.clierror import error_object

        try:
            result = super().main(args, prog_name or PROG, complete_var, False, **extra)
        except click.ClickException as exc:
            click.echo(json.dumps(error_object(exc), indent=2))
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo(json.dumps({"error": {"message": "aborted", "code": 400}}, indent=2))
            sys.exit(1)
        sys.exit(result if isinstance(result, int) else 0)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """``-javahome DIR`` after the subcommand moves to the front, where the group takes it."""
        end = args.index("--") if "--" in args else len(args)
        if "-javahome" in args[1:end]:
            i = args.index("-javahome", 1)
            args = args[i : i + 2] + args[:i] + args[i + 2 :]
        return super().parse_args(ctx, args)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The Spark commands' modules load when one of them is asked for: they import
        the broker properties and Spark's log pipe, 80 ms of every other command's start."""
        if cmd_name in LAZY_COMMANDS and cmd_name not in self.commands:
            module, _, name = LAZY_COMMANDS[cmd_name].partition(":")
            self.add_command(getattr(importlib.import_module(module, __package__), name), cmd_name)
        return super().get_command(ctx, cmd_name)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """(An unknown command loads the lazy ones: click's "Did you mean" reads
        ``commands``.)"""
        if args and args[0] not in self.commands and args[0] not in LAZY_COMMANDS:
            for lazy in LAZY_COMMANDS:
                self.get_command(ctx, lazy)
        return super().resolve_command(ctx, args)


# command -> "module:attribute" (relative to this package), loaded by Imqbridgemgr.get_command
LAZY_COMMANDS = {"dmq": ".spark.dmqcli:dmq", "drain": ".spark.drain:drain"}


def _show_examples(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(ctx.get_help())
        click.echo()
        click.echo(EXAMPLES)
        ctx.exit(0)


def _java_home(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    """-javahome DIR: the JVM the Java provider starts (JPype looks in JAVA_HOME first);
    processes the service starts (Spark) inherit it."""
    if value is None or ctx.resilient_parsing:
        return
    home = Path(value).expanduser().resolve()
    if not home.is_dir():
        raise click.BadParameter(f"{value}: no such directory", param_hint="-javahome")
    if not any(home.rglob("libjvm.*")) and not any(home.rglob("jvm.dll")):
        raise click.BadParameter(
            f"{value} holds no JVM (no libjvm under it); give a JDK or JRE directory", param_hint="-javahome"
        )
    os.environ["JAVA_HOME"] = str(home)


@click.group(PROG, cls=Imqbridgemgr, context_settings={"help_option_names": ["-h", "--help", "-help"]})
@click.version_option(__version__, "-v", "--version", "-version", prog_name=PROG)
@click.option(
    "-H",
    "-Help",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_show_examples,
    help="Show this help with examples.",
)
@click.option(
    "-javahome",
    "--javahome",
    metavar="DIR",
    expose_value=False,
    is_eager=True,
    callback=_java_home,
    help="The Java home (JDK or JRE) whose JVM the Java provider starts (sets JAVA_HOME).",
)
def main() -> None:
    """imqbridgemgr: run and operate the Bridge Service Manager.

    Syntax: imqbridgemgr <subcommand> <argument> [options]; every command takes -h, and
    --json for a result (and any failure) as JSON on stdout.
    """


def _props_options(what: str = "") -> Callable[[F], F]:
    """-props FILE... and -D KEY=VALUE..., as check, serve and the user commands take them."""

    def apply(fn: F) -> F:
        fn = click.option(
            "-D",
            "overrides",
            multiple=True,
            metavar="KEY=VALUE",
            help="A broker property, overriding the files (repeatable).",
        )(fn)
        return click.option(
            "-props",
            "--props",
            "props_files",
            multiple=True,
            metavar="FILE",
            help=f"Broker properties file{what} (repeatable; later files win).",
        )(fn)

    return apply


@main.command("check")
@_props_options()
@click.option(
    "-resolve",
    "--resolve",
    is_flag=True,
    help="Also look up the connection factories of transacted links (JNDI) and check that they are XA-capable.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.argument("xml_files", nargs=-1, metavar="[XMLFILE]...")
def check(
    props_files: tuple[str, ...], overrides: tuple[str, ...], resolve: bool, as_json: bool, xml_files: tuple[str, ...]
) -> None:
    """Validate broker properties and bridge XML files without starting anything.

    Every message transformer is found as serve finds it and checked from its module's
    source (imported only where the source cannot tell, with a warning). Prints every
    problem with its file and line and exits 1, or prints one line per bridge and link and
    exits 0 (warnings do not fail the check).
    """
    # Imported here so the admin subcommands do not pay for lxml.
    from .check import run_check

    if not (props_files or overrides or xml_files):
        raise click.UsageError("nothing to check; give -props FILE, -Dkey=value or XML files")
    report = run_check(props_files, overrides, xml_files, resolve=resolve)
    if as_json:
        result = report.to_json()
        if not report.ok:  # the error object every failing command prints under --json
            result["error"] = {"message": report.error_message(), "code": 400}
        click.echo(json.dumps(result, indent=2))
    else:
        for problem in report.problems:
            click.echo(str(problem), err=True)
        if report.ok:
            for line in report.summary:
                click.echo(line)
    if not report.ok:
        raise click.exceptions.Exit(1)


@main.command("serve")
@_props_options()
@click.option(
    "-passfile",
    "--passfile",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Properties file holding imq.bridge.admin.password.",
)
@click.option(
    "--demo/--no-demo",
    default=None,
    help="Serve the demo: the STOMP bridge on 7672 and a JMS bridge moving demo.in "
    "to demo.out (default: on when no properties file is given).",
)
@click.option(
    "-loglevel",
    "--loglevel",
    metavar="LEVEL",
    callback=_log_level,
    help="Level of the service log and the console: ERROR, WARNING, INFO or DEBUG "
    "(Java names too); overrides imq.log.level.",
)
def serve(
    props_files: tuple[str, ...],
    overrides: tuple[str, ...],
    passfile: str | None,
    demo: bool | None,
    loglevel: int | None,
) -> None:
    """Run the Bridge Service Manager with its embedded host broker until SIGTERM/SIGINT.

    SIGHUP reads the properties and the XML files of stopped JMS bridges again. The service
    logs to <var>/instances/<instance>/log/log.txt and to the console (lines about the
    service only: the lines about each message are in the bridges' own logs).
    """
    import logging

    from .logfiles import EarlyLines, ServiceLogSettings, open_service_log
    from .props import ConfigError, load_properties

    early = EarlyLines()  # until the properties say where the service log goes
    files = list(props_files) + ([passfile] if passfile else [])
    if passfile:
        from .private import readable_by_others

        warning = readable_by_others(passfile)
        if warning:
            logging.getLogger("bridgemgr.serve").warning("%s", warning)
    demo = demo if demo is not None else not props_files
    try:
        props = load_properties(files, overrides, environ=os.environ)
        if demo:  # the demo's bridges first; the command line's -D still win
            from .demo import demo_overrides

            overrides = tuple(demo_overrides(props.instance_dir)) + overrides
            props = load_properties(files, overrides, environ=os.environ)
    except ConfigError as exc:
        early.hand_to(None)
        raise click.ClickException(str(exc)) from None
    try:
        service_log = open_service_log(ServiceLogSettings.from_props(props, loglevel), pinned=loglevel is not None)
    except OSError as exc:
        early.hand_to(None)
        raise click.ClickException(f"the service log cannot be opened: {exc}") from None
    early.hand_to(service_log.throttle)
    try:
        _serve(props, demo, lambda: load_properties(files, overrides, environ=os.environ), service_log)
    finally:
        service_log.close()


class BridgeLines:
    """serve's status lines: "bridge NAME (TYPE): STATE" once per bridge and state, from
    the main thread and from the threads whose bridge start has ended."""

    def __init__(self, echo: Callable[[str], None] = click.echo) -> None:
        self.lock = threading.Lock()
        self.echo = echo
        self.shown: dict[str, str] = {}

    def show(self, bridge: Any, under_way: Callable[[], bool] | None = None) -> None:
        """The bridge's state, or STARTING while ``under_way()`` says its start thread has
        not ended (or not begun). Asked under the lock: a start that ends meanwhile prints
        its own line after this one, never before it (which left STARTING as the last word
        on a bridge whose start had failed at once)."""
        with self.lock:
            state = getattr(bridge.state, "value", str(bridge.state))
            if under_way is not None and under_way():
                state = "STARTING"
            if self.shown.get(bridge.name) != state:
                self.shown[bridge.name] = state
                self.echo(f"bridge {bridge.name} ({bridge.type}): {state}")


def _serve(props: Any, demo: bool, read_properties: Callable[[], Any], service_log: ServiceLog) -> None:
    """serve, once its log is open (``service_log``: SIGHUP sets its level)."""
    from . import gcpolicy
    from .jms.errors import StoreError
    from .service import BridgeServiceManager, ServiceError

    gcpolicy.tune()
    manager = BridgeServiceManager(props, read_properties=read_properties, service_log=service_log)
    manager.handle_signals()
    # Bridges start on threads of their own: a line per bridge now (STARTING while it
    # connects) and another when its start has ended, whether before or after "Running".
    lines = BridgeLines()
    manager.on_bridge_started = lines.show
    with lines.lock:  # the service's lines first
        try:
            manager.start()
        except (ServiceError, StoreError, OSError) as exc:
            raise click.ClickException(f"the service cannot start: {exc}") from None
        assert manager.host_broker is not None
        click.echo(
            f"imqbridgemgr {__version__}: host broker {manager.host_broker.instance_name} "
            f"running, store {manager.host_broker.store_location()}"
        )
        portmapper = f"{manager.portmapper.host}:{manager.portmapper.port}"
        click.echo(f"port mapper: {portmapper}")
        if manager.metrics is not None:
            click.echo(
                f"metrics: {'https' if manager.metrics.secure else 'http'}://"
                f"{manager.metrics.host}:{manager.metrics.port}/metrics"
            )
    if demo:  # the demo needs its bridges
        manager.wait_for_starts(60)
    for bridge in manager.bridges.values():
        lines.show(bridge, under_way=partial(manager.start_under_way, bridge))
    if demo:
        from .demo import how_to_reach, run_demo

        if "demo" in manager.bridges and manager.host_broker is not None:
            run_demo(manager.host_broker, echo=click.echo)
        stomp = manager.bridges.get("stomp")
        for line in how_to_reach(
            manager.instance_dir, portmapper, getattr(getattr(stomp, "bridge", None), "tcp_port", None)
        ):
            click.echo(line)
    click.echo("Running; stop with Ctrl-C or SIGTERM.")
    manager.run()  # a signal during start or the demo is seen here, then it stops
    if manager.taken_over_by is not None:  # HA: its store and bridges are another's now
        raise click.ClickException(f"{manager.taken_over_by}; start it again to rejoin")
    click.echo("Stopped cleanly.")


USER_PASSWORD_KEYS = ("imq.imqusermgr.password", "imq.imqbridgemgr.password")


def _user_repository(props_files: tuple[str, ...], overrides: tuple[str, ...]) -> UserRepository:
    from .props import ConfigError, load_properties
    from .users import UserRepository, default_path

    try:
        props = load_properties(props_files, overrides, environ=os.environ)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    return UserRepository(default_path(props))


def _password_from(passfile: str | None) -> str:
    """The new user's password: from the passfile's imq.imqusermgr.password (or
    imq.imqbridgemgr.password), else asked for twice without echo."""
    if passfile is None:
        return click.prompt("Password", hide_input=True, confirmation_prompt=True)
    import javaproperties

    from .private import readable_by_others

    warning = readable_by_others(passfile)
    if warning:
        click.echo(f"warning: {warning}", err=True)
    try:
        with open(passfile, encoding="utf-8") as handle:
            values = javaproperties.load(handle)
    except OSError as exc:
        raise click.ClickException(f"cannot read the passfile {passfile}: {exc}") from None
    for key in USER_PASSWORD_KEYS:
        if values.get(key):
            return values[key]
    raise click.ClickException(f"the passfile {passfile} sets none of {', '.join(USER_PASSWORD_KEYS)}")


def _user_options(fn: F) -> F:
    fn = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")(fn)
    return _props_options(" naming the instance")(fn)


@main.group("user")
def user() -> None:
    """Edit the user repository (imq.user_repository.file, else
    <var>/instances/<instance>/etc/passwd) that STOMP logins are checked against."""


@user.command("add")
@_user_options
@click.option("-u", "name", required=True, metavar="NAME", help="The user name.")
@click.option(
    "-passfile",
    "--passfile",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Properties file holding imq.imqusermgr.password (else you are asked).",
)
@click.option(
    "-g", "group", type=click.Choice(["admin", "user"]), default="user", show_default=True, help="The user's group."
)
@click.option("-replace", "--replace", is_flag=True, help="Change an existing user's password and group.")
def user_add(
    props_files: tuple[str, ...],
    overrides: tuple[str, ...],
    as_json: bool,
    name: str,
    passfile: str | None,
    group: str,
    replace: bool,
) -> None:
    """Add a user (the password is stored only as a salted scrypt hash)."""
    from .users import UserRepositoryError

    repo = _user_repository(props_files, overrides)
    try:
        repo.add(name, _password_from(passfile), group, replace=replace)
    except UserRepositoryError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        json.dumps({"user": name, "group": group, "file": str(repo.path)}, indent=2)
        if as_json
        else f"User {name} ({group}) saved in {repo.path}."
    )


@user.command("delete")
@_user_options
@click.option("-u", "name", required=True, metavar="NAME", help="The user name.")
def user_delete(props_files: tuple[str, ...], overrides: tuple[str, ...], as_json: bool, name: str) -> None:
    """Delete a user."""
    from .users import UserRepositoryError

    repo = _user_repository(props_files, overrides)
    try:
        repo.delete(name)
    except UserRepositoryError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        json.dumps({"user": name, "deleted": True, "file": str(repo.path)}, indent=2)
        if as_json
        else f"User {name} deleted from {repo.path}."
    )


@user.command("list")
@_user_options
def user_list(props_files: tuple[str, ...], overrides: tuple[str, ...], as_json: bool) -> None:
    """List the users and their groups (never a password or hash)."""
    from .users import UserRepositoryError

    repo = _user_repository(props_files, overrides)
    try:
        users = repo.users()
    except UserRepositoryError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(
            json.dumps({"file": str(repo.path), "users": [{"name": u.name, "group": u.group} for u in users]}, indent=2)
        )
        return
    width = max([len("User Name")] + [len(u.name) for u in users])
    click.echo(f"{'User Name'.ljust(width)}  Group")
    click.echo("-" * (width + 7))
    for u in users:
        click.echo(f"{u.name.ljust(width)}  {u.group}")


@main.command("keytool")
@_user_options
@click.option(
    "-service",
    "--service",
    type=click.Choice(["stomp", "jms", "admin", "metrics"]),
    default="stomp",
    show_default=True,
    help="The TLS port the key is for (names the files and the properties).",
)
@click.option(
    "-cn",
    "--cn",
    "common_name",
    metavar="NAME",
    help="The certificate's host name (default: the service's hostname property, else this host).",
)
@click.option(
    "-san",
    "--san",
    "alt_names",
    multiple=True,
    metavar="NAME",
    help="Another host name or IP address clients use (repeatable; localhost, 127.0.0.1 and ::1 are always in).",
)
@click.option(
    "-validity",
    "--validity",
    type=click.IntRange(min=1),
    default=365,
    show_default=True,
    metavar="DAYS",
    help="Days the certificate is valid.",
)
@click.option(
    "-keyalg",
    "--keyalg",
    type=click.Choice(["EC", "RSA"], case_sensitive=False),
    default="EC",
    show_default=True,
    help="EC (P-256) or RSA (3072 bits).",
)
@click.option(
    "-certfile",
    "--certfile",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Where the certificate goes (default: <instance>/etc/<service>-cert.pem).",
)
@click.option(
    "-keyfile",
    "--keyfile",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Where the private key goes, mode 0600 (default: <instance>/etc/<service>-key.pem).",
)
@click.option("-f", "replace", is_flag=True, help="Replace files that exist.")
def keytool(
    props_files: tuple[str, ...],
    overrides: tuple[str, ...],
    as_json: bool,
    service: str,
    common_name: str | None,
    alt_names: tuple[str, ...],
    validity: int,
    keyalg: str,
    certfile: str | None,
    keyfile: str | None,
    replace: bool,
) -> None:
    """Create a private key and a self-signed certificate for an instance's TLS port (the
    chapter's imqkeytool step) and print the properties that use them."""
    from .keytool import KeyRequest, KeytoolError, default_common_name, make_key_pair
    from .props import ConfigError, load_properties

    try:
        props = load_properties(props_files, overrides, environ=os.environ)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    request = KeyRequest(
        service,
        common_name or default_common_name(props, service),
        alt_names,
        validity,
        keyalg.upper(),
        Path(certfile) if certfile else None,
        Path(keyfile) if keyfile else None,
        replace,
    )
    try:
        made = make_key_pair(props, request)
    except KeytoolError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(
            json.dumps(
                {
                    "certfile": str(made.certfile),
                    "keyfile": str(made.keyfile),
                    "fingerprint": made.fingerprint,
                    "notAfter": made.not_after.isoformat(),
                    "properties": made.properties,
                },
                indent=2,
            )
        )
        return
    click.echo(
        f"Private key {made.keyfile} (mode 0600) and certificate {made.certfile} for "
        f"{request.common_name}, valid until {made.not_after:%Y-%m-%d}.\n"
        f"SHA-256 fingerprint: {made.fingerprint}\n"
        "Clients trust the certificate file. Set these broker properties:"
    )
    for key, value in made.properties.items():
        click.echo(f"{key}={value}")


from .admincli import register as _register_admin_commands  # noqa: E402  (list/start/stop/pause/resume)

_register_admin_commands(main)

if __name__ == "__main__":
    main(prog_name=PROG)
