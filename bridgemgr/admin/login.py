"""How a command reaches the service's admin port: the options every admin command and CLI
job takes (-b, -u, -passfile, -secure, --cafile, -rtm, -rtr), the login they give, and a
client of the admin port found through the port mapper at -b.

The admin subcommands (admincli.py) and the CLI jobs (spark/jobs.py, spark/drain.py) share
it; failures are click exceptions, as the commands report them.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any, TypeVar

import click

from .client import AdminClient
from .clierror import CommandFailed
from .protocol import BAD_REQUEST, UNAVAILABLE

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_BROKER = "localhost:7676"
PASSWORD_KEY = "imq.imqbridgemgr.password"


def read_passfile(path: str) -> str:
    """The admin password that the -passfile properties file sets (a warning on stderr
    when others can read the file)."""
    import javaproperties

    from ..private import readable_by_others

    warning = readable_by_others(path)
    if warning:
        click.echo(f"warning: {warning}", err=True)

    try:
        with open(path, encoding="utf-8") as fh:
            props = javaproperties.load(fh)
    except OSError as exc:
        raise CommandFailed(f"cannot read the password file {path}: {exc.strerror}", BAD_REQUEST) from None
    if PASSWORD_KEY not in props:
        raise CommandFailed(f"the password file {path} does not set {PASSWORD_KEY}", BAD_REQUEST)
    return props[PASSWORD_KEY]


def host_port(broker: str) -> tuple[str, int]:
    host, sep, port_text = broker.rpartition(":")
    if not sep or not port_text.isdigit() or not host:
        raise click.UsageError(f"-b must be host:port, not {broker!r}")
    return host, int(port_text)


def admin_address(broker: str, timeout: float) -> tuple[str, int, bool]:
    """Find the admin port through the port mapper: (host, port, is TLS)."""
    from .portmapper import PortMapperError, find_service

    host, port = host_port(broker)
    try:
        entry = find_service(host, port, ("bridgeadmin",), timeout=timeout)
    except PortMapperError as exc:
        raise CommandFailed(f"cannot reach the broker at {broker}: {exc}", UNAVAILABLE) from None
    return host, entry.port, entry.protocol == "tls"


def admin_options(fn: F) -> F:
    """The options that find and log in to a service's admin port (every admin command and
    every CLI job): -b, -u, -passfile, -secure, --cafile, -rtm, -rtr."""
    for option in reversed(
        (
            click.option(
                "-b",
                "broker",
                default=DEFAULT_BROKER,
                show_default=True,
                metavar="HOST:PORT",
                help="The broker's port mapper.",
            ),
            click.option("-u", "user", metavar="USER", help="Admin user name (prompted for when missing)."),
            click.option(
                "-passfile",
                "passfile",
                metavar="FILE",
                help=f"Properties file setting {PASSWORD_KEY} (prompted for when missing).",
            ),
            click.option("-secure", "secure", is_flag=True, help="Talk to the admin service over TLS."),
            click.option(
                "--cafile",
                envvar="IMQ_BRIDGEMGR_CAFILE",
                metavar="FILE",
                help="CA certificates to trust for -secure (default: the system's).",
            ),
            click.option(
                "-rtm",
                "reply_timeout",
                type=click.IntRange(1),
                default=10,
                show_default=True,
                help="Seconds to wait for each reply.",
            ),
            click.option(
                "-rtr",
                "retries",
                type=click.IntRange(0),
                default=5,
                show_default=True,
                help="How often to retry a broken connection.",
            ),
        )
    ):
        fn = option(fn)
    return fn


def admin_login(user: str | None, passfile: str | None) -> tuple[str, str]:
    """The admin user and password: -u / -passfile, else asked for."""
    if user is None:
        user = click.prompt("Enter the user name", default="admin")
    password = read_passfile(passfile) if passfile else click.prompt("Enter the password", hide_input=True)
    return user, password


def open_admin(
    broker: str, user: str, password: str, secure: bool, cafile: str | None, reply_timeout: int, retries: int
) -> AdminClient:
    """A client of the admin port behind the port mapper at ``broker`` (it logs in with
    its first request)."""
    host, port, tls = admin_address(broker, float(reply_timeout))
    if secure and not tls:
        raise click.ClickException(f"the admin service at {broker} does not offer TLS (-secure)")
    ctx = ssl.create_default_context(cafile=cafile) if tls else None
    return AdminClient(host, port, user, password, ssl_context=ctx, timeout=reply_timeout, retries=retries)
