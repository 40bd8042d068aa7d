"""An AMQP 0-9-1 broker (RabbitMQ) as a JMS provider, over pika.

Naming: ``java.naming.factory.initial = imq.amqp`` and ``java.naming.provider.url =
amqp://user:password@host:port/vhost[?option=value&...]`` (``amqps://`` for TLS; our options
in :data:`.wire.OPTIONS`, the others are pika's URL parameters such as ``heartbeat``).
java.naming.security.principal/credentials, when set, replace the URL's user and password.
Lookups:

================================================  ==========================================
name                                              what it gives
================================================  ==========================================
anything ending in ``ConnectionFactory``          an :class:`AmqpConnectionFactory`; not XA
``queue/NAME``, ``topic/NAME``                    Queue / Topic NAME
================================================  ==========================================

:mod:`.wire` is the pure part (URLs, destinations, deliveries <-> messages), :mod:`.client`
the connections over pika.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...extras import require
from ...jms import naming
from ...jms.errors import NamingException

# pika comes with imqbridge[amqp]: without it a lookup fails with the line naming the extra
require("the AMQP provider (imq.amqp)", "pika", error=NamingException)

from .client import (  # noqa: E402  (after the check above)
    PROVIDER_NAME,
    AmqpConnection,
    AmqpConnectionFactory,
    AmqpConsumer,
    AmqpProducer,
    AmqpSession,
)
from .wire import (  # noqa: E402
    CODEC_TYPE,
    CONTENT_TYPE_PROPERTY,
    AmqpOptions,
    from_amqp,
    parse_url,
    route,
    to_amqp,
)

__all__ = [
    "CODEC_TYPE",
    "CONTENT_TYPE_PROPERTY",
    "CONTEXT_FACTORY",
    "PROVIDER_NAME",
    "AmqpConnection",
    "AmqpConnectionFactory",
    "AmqpConsumer",
    "AmqpContextFactory",
    "AmqpOptions",
    "AmqpProducer",
    "AmqpSession",
    "from_amqp",
    "parse_url",
    "route",
    "to_amqp",
]

CONTEXT_FACTORY = "imq.amqp"


class _Context(naming.UrlContext):
    context_factory = CONTEXT_FACTORY
    url_example = "amqp://user:password@host:port/vhost"
    bindings = "the AMQP context (use ConnectionFactory, queue/NAME or topic/NAME)"

    def check_url(self, url: str) -> None:
        parse_url(url)

    def connection_factory(self) -> AmqpConnectionFactory:
        return AmqpConnectionFactory(self.url, self.username, self.password)


class AmqpContextFactory(naming.InitialContextFactory):
    def get_initial_context(self, environment: Mapping[str, str]) -> naming.Context:
        return _Context(environment)


naming.register_context_factory(CONTEXT_FACTORY, AmqpContextFactory)
