"""The JMS exception tree.

One root, ``JMSException``, as in JMS; subclasses carry an ``error_code`` registered
through ``__init_subclass__`` so a code read off the wire (admin port, jms service)
maps back to its class with :func:`lookup`. Every class pickles with its message
and code, so errors can cross process boundaries (Spark workers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_BY_CODE: dict[str, type[JMSException]] = {}


class JMSException(Exception):
    """Root of every error the messaging layer raises."""

    code: str = "JMS"

    def __init_subclass__(cls, code: str | None = None, **kw: object) -> None:
        super().__init_subclass__(**kw)
        if code is not None:
            cls.code = code
            _BY_CODE[code] = cls

    def __init__(self, message: str = "", error_code: str | None = None) -> None:
        super().__init__(message)
        self.error_code = error_code or self.code

    def __reduce__(self) -> tuple[Callable[..., JMSException], tuple[Any, ...]]:  # extra init args: picklable
        return (_rebuild, (type(self).code, str(self), self.error_code))


def _rebuild(code: str, message: str, error_code: str) -> JMSException:
    exc = lookup(code).__new__(lookup(code))
    JMSException.__init__(exc, message, error_code)
    return exc


def lookup(code: str) -> type[JMSException]:
    """The exception class registered for ``code`` (JMSException if unknown)."""
    return _BY_CODE.get(code, JMSException)


_BY_CODE["JMS"] = JMSException


class IllegalStateException(JMSException, code="ILLEGAL_STATE"):
    """A method was called at a time or in a state that does not allow it."""


class InvalidDestinationException(JMSException, code="INVALID_DESTINATION"):
    """A destination is unknown, of the wrong kind, or no longer valid."""


class InvalidSelectorError(JMSException, code="INVALID_SELECTOR"):
    """A message selector is not valid JMS selector syntax; names the position."""

    def __init__(self, message: str = "", position: int | None = None, selector: str | None = None) -> None:
        super().__init__(message)
        self.position = position
        self.selector = selector


class InvalidClientIDException(JMSException, code="INVALID_CLIENT_ID"):
    """A client id is already in use or set too late."""


class JMSSecurityException(JMSException, code="SECURITY"):
    """Authentication failed or the user may not do this."""


class MessageFormatException(JMSException, code="MESSAGE_FORMAT"):
    """A value has the wrong type for a property, body or conversion."""


class MessageNotReadableException(JMSException, code="MESSAGE_NOT_READABLE"):
    """A write-only message body was read."""


class MessageNotWriteableException(JMSException, code="MESSAGE_NOT_WRITEABLE"):
    """A read-only message body or property was written."""


class MessageEOFException(JMSException, code="MESSAGE_EOF"):
    """A bytes or stream message body was read past its end."""


class ResourceAllocationException(JMSException, code="RESOURCE_ALLOCATION"):
    """A broker limit (destination size, message size) refused the operation."""


class ProducerFlowControl(ResourceAllocationException):
    """The send was not made and the producer must wait: a FLOW_CONTROL destination is
    full, or the broker is short of memory. ``on_room(callback)`` calls ``callback`` once,
    from any thread and without blocking, when trying again may succeed; a front end that
    cannot wait reports the exception as it is."""

    def __init__(self, message: str, on_room: Callable[[Callable[[], None]], None]) -> None:
        super().__init__(message)
        self.on_room = on_room


class SendCancelled(JMSException, code="SEND_CANCELLED"):
    """A send the provider held (a full FLOW_CONTROL destination, the memory state) was
    given up because its session's ``cancel`` event was set: the message was not sent."""


class TransportException(JMSException, code="TRANSPORT"):
    """The connection to a provider failed."""


class BrokerMoved(TransportException, code="BROKER_MOVED"):
    """(HA cluster) The broker a client's last connection reached was taken over: its store
    is served by another instance, at ``urls`` (mq:// URLs, comma separated). A factory
    whose address list has one of them connects there."""

    urls: str = ""  # (lost when pickled: what the message says stays)

    def __init__(self, message: str = "", urls: str = "") -> None:
        super().__init__(message)
        self.urls = urls


class RetriableTransportException(TransportException, code="TRANSPORT_RETRIABLE"):
    """A transport failure that may succeed when tried again (reconnect, resend)."""


class StoreError(JMSException, code="STORE"):
    """A broker's store cannot be opened or written; the broker stops accepting work."""


class StoreFull(ResourceAllocationException, code="STORE_FULL"):
    """A broker's store has no space left: the message was refused, nothing stored is lost,
    and the broker takes messages again once space is back (a limit, like a full queue)."""


class StoreUnavailable(StoreFull, code="STORE_UNAVAILABLE"):
    """A broker's store cannot reach its database now (PostgreSQL restarting): refused
    like a full store, its pending changes kept and written once the database is back."""


class TransactionInProgressException(JMSException, code="TX_IN_PROGRESS"):
    """An operation is not allowed while a transaction is open."""


class TransactionRolledBackException(JMSException, code="TX_ROLLED_BACK"):
    """A commit could not complete and the transaction was rolled back."""


class HeuristicMixedException(JMSException, code="HEURISTIC_MIXED"):
    """Some branches of a distributed transaction committed and some rolled back."""


class MessageCodecError(MessageFormatException, code="CODEC"):
    """A stored or received message blob is corrupt, truncated or of an unknown version."""


class NamingException(JMSException, code="NAMING"):
    """A JNDI-style lookup failed (unknown factory, missing name, bad environment)."""


class XAException(JMSException, code="XA"):
    """An XA resource error; ``errorcode`` is the X/Open code (see jms.xa)."""

    def __init__(self, message: str = "", errorcode: int = -3) -> None:
        super().__init__(message)
        self.errorcode = errorcode

    def __reduce__(self) -> tuple[Callable[..., JMSException], tuple[Any, ...]]:
        return (XAException, (str(self), self.errorcode))
