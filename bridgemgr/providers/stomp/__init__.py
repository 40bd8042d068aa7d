"""Any STOMP 1.2 broker (ActiveMQ, RabbitMQ, our own STOMP bridge, ...) as a JMS provider.

Naming: ``java.naming.factory.initial = imq.stomp`` and ``java.naming.provider.url =
stomp://host:port[,host:port...][?option=value&...]`` (``stomp+ssl://`` for TLS; options in
:data:`.wire.OPTIONS`). Lookups:

================================================  ==========================================
name                                              what it gives
================================================  ==========================================
anything ending in ``ConnectionFactory``          a :class:`StompConnectionFactory` for the
                                                  URL (credentials from
                                                  java.naming.security.principal/credentials
                                                  unless the bridge gives its own); not XA
``queue/NAME``, ``topic/NAME`` (``dynamicQueues``  Queue / Topic NAME
/ ``dynamicTopics`` too)
a STOMP destination (``/exchange/amq.direct/k``)  that exact destination
================================================  ==========================================

:mod:`.wire` is the pure part (URLs, broker dialects, frames <-> messages), :mod:`.client`
the connections over stomp.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...jms import naming
from ...jms.destination import Queue, Topic
from ...jms.errors import NamingException
from .client import (
    PROVIDER_NAME,
    StompConnection,
    StompConnectionFactory,
    StompConsumer,
    StompProducer,
    StompSession,
)
from .wire import (
    CODEC_TYPE,
    CONTENT_TYPE_PROPERTY,
    DIALECTS,
    Dialect,
    StompOptions,
    dialect_for,
    from_frame,
    parse_url,
    to_frame,
    to_jms_destination,
    to_stomp_destination,
)

__all__ = [
    "CODEC_TYPE",
    "CONTENT_TYPE_PROPERTY",
    "CONTEXT_FACTORY",
    "DIALECTS",
    "PROVIDER_NAME",
    "Dialect",
    "StompConnection",
    "StompConnectionFactory",
    "StompConsumer",
    "StompContextFactory",
    "StompOptions",
    "StompProducer",
    "StompSession",
    "dialect_for",
    "from_frame",
    "parse_url",
    "to_frame",
    "to_jms_destination",
    "to_stomp_destination",
]

CONTEXT_FACTORY = "imq.stomp"


class _Context(naming.Context):
    def __init__(self, environment: Mapping[str, str]) -> None:
        self.url = environment.get(naming.PROVIDER_URL, "")
        if not self.url:
            raise NamingException(f"{CONTEXT_FACTORY} needs {naming.PROVIDER_URL} "
                                  "(stomp://host:port or stomp+ssl://host:port)")
        parse_url(self.url)
        self.username = environment.get(naming.SECURITY_PRINCIPAL)
        self.password = environment.get(naming.SECURITY_CREDENTIALS)

    def lookup(self, name: str) -> Any:
        kind, sep, rest = name.partition("/")
        if sep and rest:
            if kind in ("queue", "dynamicQueues"):
                return Queue(rest)
            if kind in ("topic", "dynamicTopics"):
                return Topic(rest)
        if name.startswith("/"):
            return to_jms_destination(name)
        if name.endswith("ConnectionFactory"):
            return StompConnectionFactory(self.url, self.username, self.password)
        raise NamingException(f"{name!r} is not bound in the STOMP context (use ConnectionFactory, "
                              "queue/NAME, topic/NAME or a STOMP destination such as /queue/NAME)")


class StompContextFactory(naming.InitialContextFactory):
    def get_initial_context(self, environment: Mapping[str, str]) -> naming.Context:
        return _Context(environment)


naming.register_context_factory(CONTEXT_FACTORY, StompContextFactory)
