"""A blocking client of the admin command port (what imqbridgemgr uses).

How it works: connect (TCP or TLS), HELLO with the credentials, then one request
line and one reply line per command. ``timeout`` bounds each reply (the original's
``-rtm``); a broken connection is re-opened and the command retried up to
``retries`` times (``-rtr``) — commands are idempotent (start of a started bridge is
a no-op), so a retry cannot do harm.
"""

from __future__ import annotations

import socket
import ssl
import time

from .protocol import (
    MAX_LINE,
    VERSION,
    AdminProtocolError,
    Command,
    Hello,
    Reply,
    encode_request,
    parse_reply,
)


class AdminError(Exception):
    """The admin service could not be used; the message says why, for the user."""


class ServiceUnavailable(AdminError):
    pass


class AuthenticationFailed(AdminError):
    pass


class AdminClient:
    def __init__(
        self,
        host: str,
        port: int,
        user: str,
        password: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        timeout: float = 10.0,
        retries: int = 5,
        retry_interval: float = 0.5,
    ) -> None:
        self.host, self.port = host, port
        self._hello = Hello(VERSION, user, password)
        self.ssl_context = ssl_context
        self.timeout = timeout
        self.retries = retries
        self.retry_interval = retry_interval
        self._sock: socket.socket | None = None
        self._buf = b""

    def _connect(self) -> None:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        except OSError as exc:
            raise ServiceUnavailable(
                f"cannot reach the bridge admin service at {self.host}:{self.port}: {exc.strerror or exc}"
            ) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.ssl_context is not None:
            try:
                sock = self.ssl_context.wrap_socket(sock, server_hostname=self.host)
            except (ssl.SSLError, OSError) as exc:
                sock.close()
                raise ServiceUnavailable(f"TLS to {self.host}:{self.port} failed: {exc}") from None
        self._sock, self._buf = sock, b""
        reply = self._exchange(encode_request(self._hello))
        if not reply.ok:
            self.close()
            raise AuthenticationFailed(reply.message)

    def _exchange(self, data: bytes) -> Reply:
        assert self._sock is not None
        self._sock.sendall(data)
        while b"\n" not in self._buf:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ConnectionError("the admin service closed the connection")
            self._buf += chunk
            if len(self._buf) > 64 * MAX_LINE:
                raise AdminProtocolError("reply too long")
        line, _, self._buf = self._buf.partition(b"\n")
        return parse_reply(line)

    def request(self, command: Command) -> Reply:
        """Send ``command``; reconnect and retry on a broken connection."""
        attempt = 0
        while True:
            try:
                if self._sock is None:
                    self._connect()
                return self._exchange(encode_request(command))
            except TimeoutError:
                self.close()
                raise AdminError(f"no reply from the bridge admin service within {self.timeout:g} s") from None
            except (ConnectionError, OSError, ServiceUnavailable) as exc:
                self.close()
                attempt += 1
                if attempt > self.retries:
                    if isinstance(exc, ServiceUnavailable):
                        raise
                    raise ServiceUnavailable(
                        f"the bridge admin service at {self.host}:{self.port} is not answering: {exc}"
                    ) from None
                time.sleep(self.retry_interval)

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
