"""The embedded host broker: a persistent, in-process JMS provider.

``open_broker(data_dir)`` gives the one :class:`Broker` of a data directory in this
process (a second open of the same directory shares it); ``connection_factory``
wraps it in the SPI. The naming context factory ``imq.embedded`` resolves
``lookup-name`` s against it:

=====================================  ===========================================
java.naming.provider.url               the broker's data directory (``file:`` URL
                                       or path); empty: the process's host broker
ConnectionFactory, XAConnectionFactory  the broker's (XA-capable) connection factory
queue/NAME, topic/NAME                 a Queue or Topic named NAME
=====================================  ===========================================

Other processes reach the host broker over its ``jms`` connection service
(:mod:`.jmsservice`, client :mod:`.remote`): in a process where no host broker runs,
"the host broker" (``connection_factory()``, an empty provider URL) means the remote
broker at ``remote_broker_url()``: the URL given to ``set_remote_broker_url`` (CLI jobs
set it from the broker properties with ``broker_url(props)``), else ``$IMQ_BROKER_URL``,
else ``mq://127.0.0.1:7676``. A provider URL ``mq://host:port`` names a remote broker.
A connection made without a user name logs in to the remote host broker with the
credentials given to ``set_remote_broker_url``, else ``$IMQ_BROKER_USER`` /
``$IMQ_BROKER_PASSWORD`` (how CLI jobs and Spark workers log in; a bridge XML rarely
names a user for the host broker).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from ...jms import naming
from ...jms.destination import Queue, Topic
from ...jms.errors import NamingException
from ...jms.spi import XAConnectionFactory
from .broker import DMQ_NAME, Broker
from .client import EmbeddedConnectionFactory
from .queues import DestinationLimits, LimitBehavior

__all__ = [
    "BROKER_PASSWORD_ENV",
    "BROKER_URL_ENV",
    "BROKER_USER_ENV",
    "CONTEXT_FACTORY",
    "DMQ_NAME",
    "Broker",
    "DestinationLimits",
    "EmbeddedConnectionFactory",
    "HostBrokerFactory",
    "LimitBehavior",
    "broker_url",
    "connection_factory",
    "host_broker",
    "open_broker",
    "remote_broker_url",
    "remote_login",
    "set_host_broker",
    "set_remote_broker_url",
]

CONTEXT_FACTORY = "imq.embedded"

_lock = threading.Lock()
_open: dict[Path, Broker] = {}
_host: Broker | None = None


def open_broker(data_dir: str | Path, **options: Any) -> Broker:
    """The broker of ``data_dir`` in this process, opened on first use."""
    path = Path(data_dir).resolve()
    with _lock:
        broker = _open.get(path)
        if broker is None or broker.closed:
            broker = Broker(path, **options)
            _open[path] = broker
        return broker


def set_host_broker(broker: Broker | None) -> None:
    """Make ``broker`` the host broker (what a factory without lookup-name means)."""
    global _host
    with _lock:
        _host = broker


def host_broker() -> Broker:
    with _lock:
        if _host is None or _host.closed:
            raise NamingException("no host broker is running in this process")
        return _host


def host_txlog_sql() -> tuple[Callable[[], Any], str] | None:
    """The host broker's database for the bridges' XA logs (a DB-API connect function and
    its paramstyle) when its store is a jdbc one, else None (chapter: the coordinator uses
    the same JDBC store as the broker the bridge lives in)."""
    with _lock:
        store = _host.store if _host is not None and not _host.closed else None
    settings = getattr(store.database, "settings", None) if store is not None else None
    return settings.txlog_sql() if settings is not None else None


def connection_factory(broker: Broker | None = None) -> XAConnectionFactory:
    """A factory for ``broker``; without one, for whatever host broker runs at connect time
    (in this process, or else over the wire: see :class:`HostBrokerFactory`)."""
    return EmbeddedConnectionFactory(broker) if broker is not None else HostBrokerFactory()


# --- the host broker seen from other processes -----------------------------------------------
BROKER_URL_ENV = "IMQ_BROKER_URL"
BROKER_USER_ENV = "IMQ_BROKER_USER"
BROKER_PASSWORD_ENV = "IMQ_BROKER_PASSWORD"
_remote_url: str | None = None
_remote_login: tuple[str, str] | None = None


def set_remote_broker_url(url: str | None, user: str | None = None,
                          password: str | None = None) -> None:
    """Where this process finds the host broker when it does not run it (None: the default),
    and who logs in there when a connection names no user."""
    global _remote_url, _remote_login
    if url is not None:
        from .remote import parse_url
        parse_url(url)  # refuse a bad URL now, not at the first connection
    _remote_url = url
    _remote_login = (user, password or "") if user else None


def remote_broker_url() -> str:
    return _remote_url or os.environ.get(BROKER_URL_ENV) or "mq://127.0.0.1:7676"


def remote_login() -> tuple[str | None, str | None]:
    """The default (user, password) for the remote host broker (see the module doc)."""
    if _remote_login is not None:
        return _remote_login
    return os.environ.get(BROKER_USER_ENV), os.environ.get(BROKER_PASSWORD_ENV)


def broker_url(props: Any) -> str:
    """``mq://<imq.hostname or 127.0.0.1>:<imq.portmapper.port>`` of broker properties."""
    host = props.get("imq.hostname") or "127.0.0.1"
    return f"mq://{'[' + host + ']' if ':' in host else host}:{props.get('imq.portmapper.port')}"


class HostBrokerFactory(XAConnectionFactory):
    """The host broker, resolved at connect time: the one running in this process if any,
    else the remote one at :func:`remote_broker_url` (so one bridge XML works in the
    service, in Spark executors and in CLI jobs)."""

    def create_connection(self, username: str | None = None, password: str | None = None) -> Any:
        with _lock:
            local = _host if _host is not None and not _host.closed else None
        if local is not None:
            return EmbeddedConnectionFactory(local).create_connection(username, password)
        from .remote import RemoteConnectionFactory
        if username is None:
            username, password = remote_login()
        return RemoteConnectionFactory(remote_broker_url()).create_connection(username, password)

    create_xa_connection = create_connection

    def __repr__(self) -> str:
        return "HostBrokerFactory()"


class _Context(naming.Context):
    def __init__(self, broker: Callable[[], Broker], factory: Callable[[], XAConnectionFactory] | None = None) -> None:
        self.broker = broker
        self.factory = factory

    def lookup(self, name: str) -> Any:
        kind, sep, rest = name.partition("/")
        if sep and rest:
            if kind in ("queue", "dynamicQueues"):
                return Queue(rest)
            if kind in ("topic", "dynamicTopics"):
                return Topic(rest)
        if name.endswith("ConnectionFactory"):
            return self.factory() if self.factory is not None else EmbeddedConnectionFactory(self.broker)
        raise NamingException(f"{name!r} is not bound in the embedded broker's context "
                              "(use ConnectionFactory, XAConnectionFactory, queue/NAME or topic/NAME)")


class EmbeddedContextFactory(naming.InitialContextFactory):
    def get_initial_context(self, environment: Mapping[str, str]) -> naming.Context:
        url = environment.get(naming.PROVIDER_URL, "")
        if not url:
            return _Context(host_broker, HostBrokerFactory)
        parsed = urlparse(url)
        if parsed.scheme.startswith("mq"):
            from .remote import RemoteConnectionFactory
            return _Context(host_broker, lambda: RemoteConnectionFactory(url))
        if parsed.scheme in ("", "file"):
            path = unquote(parsed.path) if parsed.scheme else url
            return _Context(lambda: open_broker(path))
        raise NamingException(f"{naming.PROVIDER_URL}={url!r}: the embedded broker takes a file: URL or a path")


naming.register_context_factory(CONTEXT_FACTORY, EmbeddedContextFactory)
