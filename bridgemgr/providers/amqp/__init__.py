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
from typing import Any

from ...jms import naming
from ...jms.destination import Queue, Topic
from ...jms.errors import NamingException
from .client import (
    PROVIDER_NAME,
    AmqpConnection,
    AmqpConnectionFactory,
    AmqpConsumer,
    AmqpProducer,
    AmqpSession,
)
from .wire import CODEC_TYPE, CONTENT_TYPE_PROPERTY, AmqpOptions, from_amqp, parse_url, route, to_amqp

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


class _Context(naming.Context):
    def __init__(self, environment: Mapping[str, str]) -> None:
        self.url = environment.get(naming.PROVIDER_URL, "")
        if not self.url:
            raise NamingException(f"{CONTEXT_FACTORY} needs {naming.PROVIDER_URL} "
                                  "(amqp://user:password@host:port/vhost)")
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
        if name.endswith("ConnectionFactory"):
            return AmqpConnectionFactory(self.url, self.username, self.password)
        raise NamingException(f"{name!r} is not bound in the AMQP context (use ConnectionFactory, "
                              "queue/NAME or topic/NAME)")


class AmqpContextFactory(naming.InitialContextFactory):
    def get_initial_context(self, environment: Mapping[str, str]) -> naming.Context:
        return _Context(environment)


naming.register_context_factory(CONTEXT_FACTORY, AmqpContextFactory)
