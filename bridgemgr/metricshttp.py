"""The metrics port: /metrics (Prometheus text format), /healthz and /readyz over HTTP(S).

A small HTTP/1.1 server on the service's network loop, with guard.py's accept loop and
ServiceGuard("metrics"): a connection over imq.metrics.max_connections gets 503 and is
closed, and so, at once, does one more from an address that already has
imq.metrics.max_unauthenticated_per_address connections that have not yet made a request
with good credentials; a request head must arrive whole within imq.metrics.login.timeout
seconds of the connection opening (or of the previous response: keep-alive), else the
connection is closed, so idle or slow sockets cannot hold the cap. Heads over MAX_HEAD bytes
get 431, bodies and methods other than GET and HEAD 400 or 405, and the connection closes.
/healthz answers without credentials (it tells only that the process is up). Every other
path needs HTTP Basic credentials of the user repository: the check waits its turn in the
service's shared login throttle (failed logins per address and per user, across services)
and runs off the loop (a scrypt hash, cached for credentials seen before); then ``admit``
decides whether that user may read metrics (service.py: group admin, or a user named in
imq.metrics.users). A wrong password gets 401 whether or not the user exists; a valid user
not admitted gets 403. The page is built on a worker thread (it reads the bridges and the
broker). Passwords are never logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from .guard import Admission, ServiceGuard, StreamServer, basic_credentials
from .netloop import NetLoop
from .users import User

log = logging.getLogger(__name__)

MAX_HEAD = 8192
REALM = 'Basic realm="imqbridge metrics", charset="UTF-8"'
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


@dataclass
class Pages:
    """What the server serves, each called on a worker thread: the /metrics page (its
    bytes and content type), and why the service is not ready (empty: ready)."""

    metrics: Callable[[], tuple[bytes, str]]
    not_ready: Callable[[], list[str]]


def text(status: int, message: str, *headers: tuple[str, str]) -> Response:
    return Response(status, (message + "\n").encode(), headers=headers)


class MetricsServer(StreamServer):
    def __init__(
        self,
        netloop: NetLoop,
        pages: Pages,
        authenticate: Callable[[str, str], User | None],
        admit: Callable[[User], str | None],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        ssl_context: ssl.SSLContext | None = None,
        guard: ServiceGuard | None = None,
    ) -> None:
        """``authenticate(user, password)``: the user repository's check (blocking);
        ``admit(user)``: why ``user`` may not read metrics, or None."""
        super().__init__(netloop, host, port, ssl_context, guard or ServiceGuard("metrics"))
        self.pages = pages
        self.authenticate = authenticate
        self.admit = admit

    def start(self) -> MetricsServer:
        self._listen(MAX_HEAD, "metrics port")
        log.info(
            "metrics port listening on %s://%s:%d (/metrics, /healthz, /readyz)",
            "https" if self.secure else "http",
            self.host,
            self.port,
        )
        if self.host not in ("127.0.0.1", "::1", "localhost") and not self.secure:
            log.warning(
                "the metrics port listens on %s without TLS: HTTP Basic passwords cross "
                "the network in the clear (set imq.metrics.tls.enabled)",
                self.host,
            )
        return self

    # --- one connection ----------------------------------------------------------------
    def _refusal(self, reason: str) -> bytes:
        return _render(text(503, reason), "GET", close=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, admission: Admission) -> None:
        peer = str((writer.get_extra_info("peername") or ("?",))[0])
        refusal = self.guard.refusal(len(self._writers), peer)
        if refusal is not None:
            await self._send(writer, text(503, refusal), "GET", close=True)
            await _drop_input(reader)
            writer.close()
            return
        self._writers.add(writer)
        try:
            while True:
                try:
                    async with asyncio.timeout(self.guard.login_timeout):
                        head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, TimeoutError):
                    return  # closed, or idle / too slow: nothing more to say
                except asyncio.LimitOverrunError:
                    await self._send(writer, text(431, f"request head longer than {MAX_HEAD} bytes"), "GET", close=True)
                    await _drop_input(reader)
                    return
                method, path, headers, error = _parse(head)
                if error is not None:
                    await self._send(writer, error, method, close=True)
                    await _drop_input(reader)
                    return
                response = await self._respond(peer, method, path, headers, admission)
                close = headers.get("connection", "").lower() == "close" or response.status >= 400
                await self._send(writer, response, method, close=close)
                if close:
                    return
        except (ConnectionError, asyncio.CancelledError, ssl.SSLError):
            return
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _respond(
        self, peer: str, method: str, path: str, headers: dict[str, str], admission: Admission
    ) -> Response:
        if path == "/healthz":
            return text(200, "ok")
        if path not in ("/metrics", "/readyz"):
            return text(404, f"no such page {path[:100]!r}: /metrics, /healthz, /readyz")
        refusal = await self._log_in(peer, headers.get("authorization"))
        if refusal is not None:
            return refusal
        admission.release()  # logged in: no longer counted against its address
        try:
            if path == "/metrics":
                body, content_type = await asyncio.to_thread(self.pages.metrics)
                return Response(200, body, content_type)
            reasons = await asyncio.to_thread(self.pages.not_ready)
        except Exception as exc:  # a bug in a collector must not take the port down
            log.exception("metrics: %s failed", path)
            return text(500, f"{path} failed: {exc}")
        body = json.dumps({"ready": not reasons, "reasons": reasons}).encode() + b"\n"
        return Response(503 if reasons else 200, body, "application/json")

    async def _log_in(self, peer: str, authorization: str | None) -> Response | None:
        """None when the request's credentials are good and the user may read metrics;
        else the 401 or 403 to send."""
        credentials = basic_credentials(authorization)
        if credentials is None:
            return text(
                401,
                "authentication required: HTTP Basic with a user of the user repository",
                ("WWW-Authenticate", REALM),
            )
        name, password = credentials
        found: User | None = None
        async with self.guard.throttle.attempt(peer, name) as attempt:
            found = await asyncio.to_thread(self.authenticate, name, password)
            attempt.outcome(found is not None)
        if found is None:
            log.warning(
                "metrics login failed for user %r from %s (%d recent failures from there)", name, peer, attempt.count
            )
            return text(401, "authentication failed: wrong user name or password", ("WWW-Authenticate", REALM))
        refusal = self.admit(found)
        if refusal is not None:
            log.warning("metrics: refused user %r from %s: %s", name, peer, refusal)
            return text(403, refusal)
        return None

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, response: Response, method: str, *, close: bool) -> None:
        writer.write(_render(response, method, close=close))
        try:
            await writer.drain()
            if close and writer.can_write_eof():
                writer.write_eof()
        except OSError:  # the client left (a reset, ENOTCONN, a TLS error): nothing to tell it
            pass


def _render(response: Response, method: str, *, close: bool) -> bytes:
    """The response's head and (but for HEAD) body."""
    lines = [
        f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Error')}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
        "Cache-Control: no-store",
        f"Connection: {'close' if close else 'keep-alive'}",
        *(f"{k}: {v}" for k, v in response.headers),
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if method == "HEAD" else head + response.body


async def _drop_input(reader: asyncio.StreamReader, seconds: float = 1.0, limit: int = 1 << 20) -> None:
    """Before closing on an error: drop what the client still sends (for up to
    ``seconds``), so that the response is not lost to a TCP reset."""
    dropped = 0
    try:
        async with asyncio.timeout(seconds):
            while dropped < limit and (chunk := await reader.read(65536)):
                dropped += len(chunk)
    except (TimeoutError, ConnectionError, asyncio.LimitOverrunError, ValueError, ssl.SSLError):
        pass


def _parse(head: bytes) -> tuple[str, str, dict[str, str], Response | None]:
    """Method, path (no query), headers (lower-case names) of a request head; or the
    error response that ends the connection."""
    try:
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ")
    except ValueError:
        return "GET", "", {}, text(400, "malformed request line")
    if not version.startswith("HTTP/1."):
        return "GET", "", {}, text(400, f"unsupported protocol {version[:20]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            return method, "", {}, text(400, "malformed header line")
        headers[name.lower()] = value.strip()
    if method not in ("GET", "HEAD"):
        return "GET", "", headers, text(405, f"method {method[:20]!r} not allowed: use GET", ("Allow", "GET, HEAD"))
    if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
        return method, "", headers, text(400, "a request body is not accepted")
    return method, target.split("?", 1)[0], headers, None
