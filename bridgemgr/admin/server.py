"""The admin command port: a thin asyncio shell around admin/protocol.py.

How it works: the port listens with guard.py's accept loop. A connection over
imq.admin.max_connections gets 503 and is closed, and so, at once, does one more from an
address that already has imq.admin.max_unauthenticated_per_address connections that
have not authenticated. Each connection must first
authenticate with HELLO within imq.admin.login.timeout seconds (else it is closed):
the HELLO waits its turn in the service's shared login throttle (failed logins per
address and per user, across connections and services), then user and password are
compared in constant time and the outcome counted; with ``admit``, the access rules
may still refuse the user this service (connection.ADMIN). Then each request line is parsed
and handed to ``dispatch`` on a worker thread (bridge operations block: they wait for
in-flight transfers), and its Reply is written back. Malformed or oversize lines get
400; a line that cannot be framed closes the connection. The password never reaches a
log.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import ssl
from collections.abc import Callable

from ..guard import Admission, ServiceGuard, StreamServer
from ..netloop import NetLoop
from .protocol import (
    BAD_REQUEST,
    ERROR,
    MAX_LINE,
    OK,
    UNAVAILABLE,
    AdminProtocolError,
    Command,
    Hello,
    Reply,
    parse_request,
)

log = logging.getLogger(__name__)

Dispatch = Callable[[Command], Reply]


class AdminServer(StreamServer):
    def __init__(
        self,
        netloop: NetLoop,
        dispatch: Dispatch,
        user: str,
        password: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        ssl_context: ssl.SSLContext | None = None,
        guard: ServiceGuard | None = None,
        admit: Callable[[str, str], str | None] | None = None,
    ) -> None:
        """``admit(user, peer)``: why the access rules refuse ``user`` the admin service, or None."""
        if not user or not password:
            raise ValueError(
                "the admin port needs an admin user and password "
                "(imq.bridge.admin.user / imq.bridge.admin.password or -passfile)"
            )
        super().__init__(netloop, host, port, ssl_context, guard or ServiceGuard("admin"))
        self.dispatch = dispatch
        self._user = user.encode()
        self._password = password.encode()
        self.admit = admit

    def start(self) -> AdminServer:
        self._listen(MAX_LINE + 2, "admin port")
        log.info("admin command port listening on %s:%d%s", self.host, self.port, " (TLS)" if self.ssl_context else "")
        return self

    # --- one connection ----------------------------------------------------------------
    def _authentic(self, hello: Hello) -> bool:
        user_ok = hmac.compare_digest(hello.user.encode(), self._user)
        password_ok = hmac.compare_digest(hello.password.encode(), self._password)
        return user_ok and password_ok

    async def _log_in(self, peer: str, hello: Hello) -> bool:
        """Check ``hello`` once the throttle lets it through, and count the outcome."""
        async with self.guard.throttle.attempt(peer, hello.user) as attempt:
            attempt.outcome(self._authentic(hello))
        if not attempt.ok:
            log.warning(
                "admin login failed for user %r from %s (%d recent failures from there)",
                hello.user,
                peer,
                attempt.count,
            )
        return bool(attempt.ok)

    def _refusal(self, reason: str) -> bytes:
        return Reply(UNAVAILABLE, reason).encode()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, admission: Admission) -> None:
        peer = str((writer.get_extra_info("peername") or ("?",))[0])
        refusal = self.guard.refusal(len(self._writers), peer)
        if refusal is not None:
            try:
                await self._reply(writer, Reply(UNAVAILABLE, refusal))
                await _linger(reader, writer)
            except ConnectionError:
                pass
            writer.close()
            return
        self._writers.add(writer)
        authenticated = False
        login_deadline = asyncio.get_running_loop().time() + self.guard.login_timeout
        try:
            while True:
                try:
                    async with asyncio.timeout_at(None if authenticated else login_deadline):
                        line = await reader.readuntil(b"\n")
                except asyncio.IncompleteReadError:
                    return
                except TimeoutError:
                    await self._reply(writer, Reply(BAD_REQUEST, self.guard.login_timed_out(peer)))
                    return
                except asyncio.LimitOverrunError:
                    await self._reply(writer, Reply(BAD_REQUEST, f"request longer than {MAX_LINE} bytes"))
                    await _linger(reader, writer)
                    return
                try:
                    request = parse_request(line)
                except AdminProtocolError as exc:
                    await self._reply(writer, Reply(exc.status, str(exc)))
                    if not authenticated:
                        await _linger(reader, writer)
                        return
                    continue
                if not authenticated:
                    if not isinstance(request, Hello):
                        await self._reply(writer, Reply(BAD_REQUEST, "authenticate with HELLO first"))
                        await _linger(reader, writer)
                        return
                    try:
                        async with asyncio.timeout_at(login_deadline):
                            ok = await self._log_in(peer, request)
                    except TimeoutError:
                        await self._reply(writer, Reply(BAD_REQUEST, self.guard.login_timed_out(peer)))
                        return
                    if not ok:
                        await self._reply(
                            writer, Reply(BAD_REQUEST, "authentication failed: wrong user name or password")
                        )
                        await _linger(reader, writer)
                        return
                    refusal = self.admit(request.user, peer) if self.admit is not None else None
                    if refusal is not None:
                        await self._reply(writer, Reply(BAD_REQUEST, refusal))
                        await _linger(reader, writer)
                        return
                    authenticated = True
                    admission.release()
                    await self._reply(writer, Reply(OK, "welcome"))
                    continue
                if isinstance(request, Hello):
                    await self._reply(writer, Reply(BAD_REQUEST, "already authenticated"))
                    continue
                try:
                    reply = await asyncio.to_thread(self.dispatch, request)
                except Exception as exc:  # a bug in a bridge must not take the port down
                    log.exception("admin command %s failed", request)
                    reply = Reply(ERROR, f"the operation failed: {exc}")
                await self._reply(writer, reply)
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            self._writers.discard(writer)
            writer.close()

    @staticmethod
    async def _reply(writer: asyncio.StreamWriter, reply: Reply) -> None:
        writer.write(reply.encode())
        await writer.drain()


async def _linger(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seconds: float = 1.0, limit: int = 1 << 20
) -> None:
    """Before closing on an error: half-close and drop what the peer still sends, so
    the error reply is not lost to a TCP reset."""
    if writer.can_write_eof():
        writer.write_eof()
    dropped = 0
    try:
        async with asyncio.timeout(seconds):
            while dropped < limit and (chunk := await reader.read(65536)):
                dropped += len(chunk)
    except (TimeoutError, ConnectionError, asyncio.LimitOverrunError, ValueError):
        pass
