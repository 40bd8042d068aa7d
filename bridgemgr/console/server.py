"""The management port's HTTP server: uvicorn's HTTP/1.1 protocol (h11) on the service's
network loop, accepting through guard.py's Listener like every other port.

What the guards add to uvicorn: a connection over imq.console.max_connections gets 503
and is closed; one more from an address that already has
imq.console.max_unauthenticated_per_address connections without a request that carried
good credentials is closed at once; a connection that has sent no such request within
imq.console.login.timeout seconds is closed (and an idle one after as long). Forwarded
headers are not trusted: the throttle counts the socket's address. TLS is the service's
context (imq.console.tls.*), handshakes bounded by the login timeout.

Design notes: docs/console.md#internals-console.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from typing import Any

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..admin.clierror import reply_object
from ..admin.protocol import UNAVAILABLE, Reply
from ..guard import Admission, Listener, ServiceGuard, listen, peer_address, refuse
from ..netloop import NetLoop

log = logging.getLogger(__name__)

MAX_HEAD = 16384  # bytes of a request head still incomplete; more is refused (400, h11)
STOP_TIMEOUT = 10.0


class Connection(H11Protocol):
    """One client connection: uvicorn's protocol plus its place under the guards. The
    API finds it in its requests' ``state`` and calls ``logged_in()`` on good credentials."""

    def __init__(self, server: ConsoleServer, admission: Admission, **kwargs: Any) -> None:
        state: dict[str, Any] = {}
        super().__init__(app_state=state, **kwargs)
        state["connection"] = self
        self.console = server
        self.admission = admission
        self.refused = False
        self.peer = admission.address
        self._login_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.peer = peer_address(transport)
        refusal = self.console.guard.refusal(len(self.connections), self.peer)
        if refusal is not None:
            self.refused = True
            refuse(transport, _refusal_bytes(refusal))
            return
        super().connection_made(transport)
        self._login_timer = self.loop.call_later(self.console.guard.login_timeout, self._login_expired)

    def logged_in(self) -> None:
        """A request carried good credentials: no longer counted against its address."""
        if self._login_timer is not None:
            self._login_timer.cancel()
            self._login_timer = None
        self.admission.release()

    def _login_expired(self) -> None:
        self._login_timer = None
        self.console.guard.login_timed_out(self.peer)
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if not self.refused:
            super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._login_timer is not None:
            self._login_timer.cancel()
            self._login_timer = None
        self.admission.release()
        if not self.refused:
            super().connection_lost(exc)


def _refusal_bytes(reason: str) -> bytes:
    body = json.dumps(reply_object(Reply(UNAVAILABLE, reason))).encode() + b"\n"
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class _Server(uvicorn.Server):
    """uvicorn's server with its listening done by guard.py's Listener."""

    def __init__(self, config: uvicorn.Config, console: ConsoleServer) -> None:
        super().__init__(config)
        self.console = console
        self.listener: Listener | None = None

    async def startup(self, sockets: Any = None) -> None:
        console, config = self.console, self.config

        def connection(admission: Admission) -> Connection:
            return Connection(console, admission, config=config, server_state=self.server_state)

        self.listener = await listen(
            connection,
            console.host,
            console.requested_port,
            name="management port",
            pending=console.guard.unauthenticated,
            refusal=_refusal_bytes,
            ssl_context=console.ssl_context,
            handshake_timeout=console.guard.login_timeout,
        )
        self.servers = [_Closing(self.listener)]  # type: ignore[list-item]
        self.started = True


class _Closing:
    """What uvicorn's shutdown does with a server: close it, wait until it is closed."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener

    def close(self) -> None:
        self.listener.close()

    async def wait_closed(self) -> None:
        return None


class ConsoleServer:
    """The management port: ``start()`` listens (OSError when it cannot bind), ``port``,
    ``stop()`` closes it and its connections (requests under way get STOP_TIMEOUT s)."""

    def __init__(
        self,
        netloop: NetLoop,
        app: ASGIApp,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        ssl_context: ssl.SSLContext | None = None,
        guard: ServiceGuard | None = None,
    ) -> None:
        self.netloop = netloop
        self.host = host
        self.requested_port = port
        self.ssl_context = ssl_context
        self.guard = guard or ServiceGuard("console")
        self.config = uvicorn.Config(
            app,
            http="h11",
            ws="none",
            lifespan="off",
            log_config=None,
            access_log=False,
            proxy_headers=False,  # X-Forwarded-For must not choose the address the throttle counts
            server_header=False,
            timeout_keep_alive=int(self.guard.login_timeout),
            timeout_graceful_shutdown=int(STOP_TIMEOUT),
            h11_max_incomplete_event_size=MAX_HEAD,
        )
        self._server = _Server(self.config, self)
        self._task: asyncio.Task[None] | None = None

    @property
    def secure(self) -> bool:
        return self.ssl_context is not None

    @property
    def port(self) -> int:
        assert self._server.listener is not None, "not started"
        return self._server.listener.port

    def start(self) -> ConsoleServer:
        server = self._server

        async def start() -> None:
            self.config.load()
            server.lifespan = self.config.lifespan_class(self.config)
            await server.startup()
            self._task = asyncio.get_running_loop().create_task(self._run())

        self.netloop.run(start())
        log.info(
            "management port listening on %s://%s:%d (/api/v1)",
            "https" if self.secure else "http",
            self.host,
            self.port,
        )
        if self.host not in ("127.0.0.1", "::1", "localhost") and not self.secure:
            log.warning(
                "the management port listens on %s without TLS: HTTP Basic passwords cross "
                "the network in the clear (set imq.console.tls.enabled)",
                self.host,
            )
        return self

    async def _run(self) -> None:
        await self._server.main_loop()
        await self._server.shutdown()

    def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return

        async def stop() -> None:
            self._server.should_exit = True
            await task

        self.netloop.run(stop(), timeout=STOP_TIMEOUT + 5)
