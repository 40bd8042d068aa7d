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


class _Context(naming.UrlContext):
    context_factory = CONTEXT_FACTORY
    url_example = "stomp://host:port or stomp+ssl://host:port"
    bindings = (
        "the STOMP context (use ConnectionFactory, queue/NAME, topic/NAME or a STOMP destination such as /queue/NAME)"
    )

    def check_url(self, url: str) -> None:
        parse_url(url)

    def connection_factory(self) -> StompConnectionFactory:
        return StompConnectionFactory(self.url, self.username, self.password)

    def lookup(self, name: str) -> Any:
        if name.startswith("/"):  # never a queue/NAME or topic/NAME
            return to_jms_destination(name)
        return super().lookup(name)


class StompContextFactory(naming.InitialContextFactory):
    def get_initial_context(self, environment: Mapping[str, str]) -> naming.Context:
        return _Context(environment)


naming.register_context_factory(CONTEXT_FACTORY, StompContextFactory)
