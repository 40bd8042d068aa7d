"""JNDI-style lookups: ``lookup-name`` plus environment properties -> provider objects.

A bridge XML names connection factories and destinations by ``lookup-name`` with
``<property>`` elements as the JNDI environment. ``java.naming.factory.initial``
picks the context factory:

* a name registered with :func:`register_context_factory` (our providers register
  short names such as ``imq.embedded``);
* a Python ``module:attribute`` path to an :class:`InitialContextFactory`;
* anything else that looks like a Java class name goes to the Java provider
  (JPype), registered under :data:`JAVA_CONTEXT_FACTORY` when it is available.

Contexts are built per lookup from the environment; factories may cache.
"""

from __future__ import annotations

import importlib
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

from .destination import Destination, Queue, Topic
from .errors import NamingException
from .spi import ConnectionFactory

INITIAL_CONTEXT_FACTORY = "java.naming.factory.initial"
PROVIDER_URL = "java.naming.provider.url"
SECURITY_PRINCIPAL = "java.naming.security.principal"
SECURITY_CREDENTIALS = "java.naming.security.credentials"
JAVA_CONTEXT_FACTORY = "java"  # registry key of the JPype-backed factory

_JAVA_CLASS = re.compile(r"[A-Za-z_$][\w$]*(\.[A-Za-z_$][\w$]*)+\Z")


class Context(ABC):
    """A naming context: resolves names to connection factories and destinations."""

    @abstractmethod
    def lookup(self, name: str) -> Any:
        """The object bound to ``name``; NamingException when there is none."""

    def close(self) -> None:
        pass


def destination_named(name: str) -> Destination | None:
    """The Queue or Topic a ``queue/NAME``, ``topic/NAME``, ``dynamicQueues/NAME`` or
    ``dynamicTopics/NAME`` lookup names (the names every provider's context binds); None
    for any other name."""
    kind, sep, rest = name.partition("/")
    if sep and rest:
        if kind in ("queue", "dynamicQueues"):
            return Queue(rest)
        if kind in ("topic", "dynamicTopics"):
            return Topic(rest)
    return None


class UrlContext(Context):
    """The context of a provider reached by java.naming.provider.url: the URL (checked
    now, so a bad one fails the lookup naming it) and the security principal/credentials
    make its connection factories; destinations are by :func:`destination_named`. A
    provider sets the class variables and :meth:`connection_factory`."""

    context_factory: ClassVar[str]  # its java.naming.factory.initial, for the errors
    url_example: ClassVar[str]  # what its URL looks like, for the error of a missing one
    bindings: ClassVar[str]  # "the X context (use ...)", for the error of an unbound name

    def __init__(self, environment: Mapping[str, str]) -> None:
        self.url = environment.get(PROVIDER_URL, "")
        if not self.url:
            raise NamingException(f"{self.context_factory} needs {PROVIDER_URL} ({self.url_example})")
        self.check_url(self.url)
        self.username = environment.get(SECURITY_PRINCIPAL)
        self.password = environment.get(SECURITY_CREDENTIALS)

    @abstractmethod
    def check_url(self, url: str) -> None:
        """NamingException when ``url`` is not one of this provider's."""

    @abstractmethod
    def connection_factory(self) -> ConnectionFactory:
        """A connection factory for the URL and credentials."""

    def lookup(self, name: str) -> Any:
        destination = destination_named(name)
        if destination is not None:
            return destination
        if name.endswith("ConnectionFactory"):
            return self.connection_factory()
        raise NamingException(f"{name!r} is not bound in {self.bindings}")


class InitialContextFactory(ABC):
    @abstractmethod
    def get_initial_context(self, environment: Mapping[str, str]) -> Context: ...


_registry: dict[str, Callable[[], InitialContextFactory]] = {}
_lock = threading.Lock()
# Our own providers register on import; name them here so a lookup imports them.
_BUILTIN = {
    "imq.embedded": "bridgemgr.providers.embedded",
    "imq.stomp": "bridgemgr.providers.stomp",
    "imq.amqp": "bridgemgr.providers.amqp",
    JAVA_CONTEXT_FACTORY: "bridgemgr.providers.java",
}


def register_context_factory(name: str, factory: Callable[[], InitialContextFactory]) -> None:
    """Make ``name`` usable as java.naming.factory.initial."""
    with _lock:
        _registry[name] = factory


def _context_factory(name: str) -> InitialContextFactory:
    if name in _BUILTIN and name not in _registry:
        importlib.import_module(_BUILTIN[name])
    with _lock:
        maker = _registry.get(name)
    if maker is not None:
        return maker()
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            obj = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise NamingException(f"cannot load context factory {name!r}: {exc}") from None
        factory = obj() if isinstance(obj, type) else obj
        if not isinstance(factory, InitialContextFactory):
            raise NamingException(f"{name!r} is not an InitialContextFactory")
        return factory
    if _JAVA_CLASS.match(name):
        if JAVA_CONTEXT_FACTORY not in _registry:
            importlib.import_module(_BUILTIN[JAVA_CONTEXT_FACTORY])
        with _lock:
            java = _registry.get(JAVA_CONTEXT_FACTORY)
        if java is None:
            raise NamingException(f"context factory {name!r} is a Java class, and the Java provider is not available")
        return java()
    raise NamingException(f"unknown context factory {name!r} ({INITIAL_CONTEXT_FACTORY})")


def initial_context(environment: Mapping[str, str]) -> Context:
    """An initial context for ``environment`` (which must name a context factory)."""
    name = environment.get(INITIAL_CONTEXT_FACTORY)
    if not name:
        raise NamingException(f"the environment does not set {INITIAL_CONTEXT_FACTORY}")
    return _context_factory(name).get_initial_context(environment)


def lookup(name: str, environment: Mapping[str, str]) -> Any:
    """Resolve ``name`` in the context described by ``environment``."""
    if not name:
        raise NamingException("an empty lookup name")
    ctx = initial_context(environment)
    try:
        return ctx.lookup(name)
    finally:
        ctx.close()


def without_password(url: str) -> str:
    """``url`` with the password of its user info replaced by *** (for errors, logs, repr)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")
    user = netloc[0].partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[2]}"))
