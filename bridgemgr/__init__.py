"""imqbridge: a Bridge Service Manager for message-oriented middleware.

JMS bridges move messages between destinations of different providers, the STOMP
bridge lets STOMP clients reach the host broker, and ``imqbridgemgr`` operates both.
"""

from typing import Any

from .version import __version__

__all__ = ["__version__", "connect", "connect_xa"]


# --- one call for users' own programs (the mq:// client; imported only when used) -------------


def connect(url: str = "mq://127.0.0.1:7676", username: str | None = None, password: str | None = None, **options: Any):
    """A :class:`~bridgemgr.jms.spi.Connection` to the host broker's jms service.

    ``url`` is the port mapper's address (``mq://host:port``; ``mqtcp://`` / ``mqssl://``
    name the service's own port), or several separated by commas, tried in turn;
    ``options`` go to :class:`~bridgemgr.providers.embedded.remote.RemoteConnectionFactory`
    (``ssl_context``, ``prefetch`` (0: pull), ``heartbeat``, ``connect_timeout``,
    ``sync_sends``, ``send_window``).
    """
    from .providers.embedded.remote import RemoteConnectionFactory

    return RemoteConnectionFactory(url, **options).create_connection(username, password)


def connect_xa(
    url: str = "mq://127.0.0.1:7676", username: str | None = None, password: str | None = None, **options: Any
):
    """Like :func:`connect`, an :class:`~bridgemgr.jms.spi.XAConnection` (XA sessions too)."""
    from .providers.embedded.remote import RemoteConnectionFactory

    return RemoteConnectionFactory(url, **options).create_xa_connection(username, password)
