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
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import unquote, urlparse

from ...jms import naming
from ...jms.destination import Queue, Topic
from ...jms.errors import NamingException
from .broker import DMQ_NAME, Broker
from .client import EmbeddedConnectionFactory
from .queues import DestinationLimits, LimitBehavior

__all__ = ["Broker", "DMQ_NAME", "DestinationLimits", "EmbeddedConnectionFactory", "LimitBehavior",
           "CONTEXT_FACTORY", "open_broker", "set_host_broker", "host_broker", "connection_factory"]

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


def connection_factory(broker: Broker | None = None) -> EmbeddedConnectionFactory:
    """A factory for ``broker``; without one, for whatever host broker runs at connect time."""
    return EmbeddedConnectionFactory(broker if broker is not None else host_broker)


class _Context(naming.Context):
    def __init__(self, broker: Callable[[], Broker]) -> None:
        self.broker = broker

    def lookup(self, name: str) -> Any:
        kind, sep, rest = name.partition("/")
        if sep and rest:
            if kind in ("queue", "dynamicQueues"):
                return Queue(rest)
            if kind in ("topic", "dynamicTopics"):
                return Topic(rest)
        if name.endswith("ConnectionFactory"):
            return EmbeddedConnectionFactory(self.broker)
        raise NamingException(f"{name!r} is not bound in the embedded broker's context "
                              "(use ConnectionFactory, XAConnectionFactory, queue/NAME or topic/NAME)")


class EmbeddedContextFactory(naming.InitialContextFactory):
    def get_initial_context(self, environment: Mapping[str, str]) -> naming.Context:
        url = environment.get(naming.PROVIDER_URL, "")
        if not url:
            return _Context(host_broker)
        parsed = urlparse(url)
        if parsed.scheme in ("", "file"):
            path = unquote(parsed.path) if parsed.scheme else url
            return _Context(lambda: open_broker(path))
        raise NamingException(f"{naming.PROVIDER_URL}={url!r}: the embedded broker takes a file: URL or a path")


naming.register_context_factory(CONTEXT_FACTORY, EmbeddedContextFactory)
