"""The embedded host broker: a persistent, in-process JMS provider.

``open_broker(data_dir)`` gives the one :class:`Broker` of a data directory in this
process (a second open of the same directory shares it); ``EmbeddedConnectionFactory``
wraps it in the SPI. The naming context factory ``imq.embedded`` resolves
``lookup-name`` s against it:

=====================================  ===========================================
java.naming.provider.url               the broker's data directory (``file:`` URL
                                       or path); empty: the host broker
ConnectionFactory, XAConnectionFactory  the broker's (XA-capable) connection factory
queue/NAME, topic/NAME                 a Queue or Topic named NAME
=====================================  ===========================================

The service wraps its broker in :class:`~.host.EmbeddedHostBroker` and hands that to its
front ends; nothing here keeps a "current" host broker. Other processes (CLI jobs, Spark
workers) reach it over its ``jms`` connection service through a :class:`HostBrokerFactory`.
A provider URL ``mq://host:port`` names a remote broker; the environment may set the mq://
client's ``imqAckTimeout``, ``imqPingInterval``, ``imqConsumerFlowLimit`` and
``imqConnectionType`` (docs/embedded-broker.md#naming).

Design notes: docs/embedded-broker.md#internals-the-providersembedded-package.
"""

from __future__ import annotations

import os
import ssl
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
    "open_broker",
]

CONTEXT_FACTORY = "imq.embedded"

_lock = threading.Lock()
_open: dict[Path, Broker] = {}


def open_broker(data_dir: str | Path, **options: Any) -> Broker:
    """The broker of ``data_dir`` in this process, opened on first use."""
    path = Path(data_dir).resolve()
    with _lock:
        broker = _open.get(path)
        if broker is None or broker.closed:
            broker = Broker(path, **options)
            _open[path] = broker
        return broker


# --- the host broker seen from other processes -----------------------------------------------
BROKER_URL_ENV = "IMQ_BROKER_URL"
BROKER_USER_ENV = "IMQ_BROKER_USER"
BROKER_PASSWORD_ENV = "IMQ_BROKER_PASSWORD"
DEFAULT_BROKER_URL = "mq://127.0.0.1:7676"


def broker_url(props: Any) -> str:
    """``mq://<imq.hostname or 127.0.0.1>:<imq.portmapper.port>`` of broker properties."""
    host = props.get("imq.hostname") or "127.0.0.1"
    return f"mq://{'[' + host + ']' if ':' in host else host}:{props.get('imq.portmapper.port')}"


class HostBrokerFactory(XAConnectionFactory):
    """The host broker of another process, over its jms service: what "the host broker" is
    in CLI jobs and Spark workers. ``url`` else ``$IMQ_BROKER_URL`` else the default; a
    connection that names no user logs in as ``user`` else ``$IMQ_BROKER_USER``; ``options``
    go to :class:`~.remote.RemoteConnectionFactory`."""

    def __init__(
        self, url: str | None = None, user: str | None = None, password: str | None = None, **options: Any
    ) -> None:
        if url is not None:
            from .remote import parse_url

            parse_url(url)  # refuse a bad URL now, not at the first connection
        self.url = url
        self._login = (user, password or "") if user else None
        self.options = options

    def create_connection(self, username: str | None = None, password: str | None = None) -> Any:
        from .remote import RemoteConnectionFactory

        if username is None:
            username, password = self._login or (os.environ.get(BROKER_USER_ENV), os.environ.get(BROKER_PASSWORD_ENV))
        url = self.url or os.environ.get(BROKER_URL_ENV) or DEFAULT_BROKER_URL
        return RemoteConnectionFactory(url, **self.options).create_connection(username, password)

    create_xa_connection = create_connection

    def __repr__(self) -> str:
        return f"HostBrokerFactory({self.url!r})"


class _Context(naming.Context):
    def __init__(self, factory: Callable[[], XAConnectionFactory]) -> None:
        self.factory = factory

    def lookup(self, name: str) -> Any:
        kind, sep, rest = name.partition("/")
        if sep and rest:
            if kind in ("queue", "dynamicQueues"):
                return Queue(rest)
            if kind in ("topic", "dynamicTopics"):
                return Topic(rest)
        if name.endswith("ConnectionFactory"):
            return self.factory()
        raise NamingException(
            f"{name!r} is not bound in the embedded broker's context "
            "(use ConnectionFactory, XAConnectionFactory, queue/NAME or topic/NAME)"
        )


class EmbeddedContextFactory(naming.InitialContextFactory):
    def get_initial_context(self, environment: Mapping[str, str]) -> naming.Context:
        url = environment.get(naming.PROVIDER_URL, "")
        if not url:
            return _Context(HostBrokerFactory)
        parsed = urlparse(url)
        if parsed.scheme.startswith("mq"):
            from .remote import RemoteConnectionFactory

            options = _client_options(environment)
            return _Context(lambda: RemoteConnectionFactory(url, **options))
        if parsed.scheme in ("", "file"):
            path = unquote(parsed.path) if parsed.scheme else url
            return _Context(lambda: EmbeddedConnectionFactory(lambda: open_broker(path)))
        raise NamingException(f"{naming.PROVIDER_URL}={url!r}: the embedded broker takes a file: URL or a path")


PING_INTERVAL = "imqPingInterval"
CONSUMER_FLOW_LIMIT = "imqConsumerFlowLimit"
CONNECTION_TYPE = "imqConnectionType"


def _client_options(environment: Mapping[str, str]) -> dict[str, Any]:
    """The mq:// client's options the environment sets (the table above)."""
    from .remote import ACK_TIMEOUT, DEFAULT_ACK_TIMEOUT_MS, ack_timeout_seconds

    options: dict[str, Any] = {
        "xa_timeout": ack_timeout_seconds(
            _whole(environment, ACK_TIMEOUT, DEFAULT_ACK_TIMEOUT_MS, 86_400_000, "milliseconds from 0 (no limit)")
        )
    }
    if PING_INTERVAL in environment:
        options["heartbeat"] = float(
            _whole(environment, PING_INTERVAL, 0, 86_400, "seconds from 0 (the service's interval)")
        )
    if CONSUMER_FLOW_LIMIT in environment:
        options["prefetch"] = _whole(environment, CONSUMER_FLOW_LIMIT, 0, 65536, "messages from 0 (pull)")
    connection_type = environment.get(CONNECTION_TYPE, "TCP").strip().upper()
    if connection_type not in ("TCP", "TLS"):
        raise NamingException(f"{CONNECTION_TYPE}={environment[CONNECTION_TYPE]!r}: write TCP or TLS")
    if connection_type == "TLS":
        options["ssl_context"] = ssl.create_default_context()
    return options


def _whole(environment: Mapping[str, str], key: str, default: int, most: int, unit: str) -> int:
    """A whole number from 0 to ``most`` from the environment; NamingException naming the
    property when it is something else."""
    text = environment.get(key)
    if text is None:
        return default
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if not 0 <= value <= most:
        raise NamingException(f"{key}={text!r}: write a whole number of {unit} to {most}")
    return value


naming.register_context_factory(CONTEXT_FACTORY, EmbeddedContextFactory)
