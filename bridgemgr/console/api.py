"""The management REST API under /api/v1: a Starlette app over the admin port's commands.

Each endpoint turns its path, query and JSON body into the admin protocol's request
object, checks it with the same parser (admin/protocol.py) and hands it to the service's
``dispatch``: the admin CLI and the API run one code path, and answer with the same
status codes and texts (the ``--json`` object of admin/clierror.py).

Rules: every request needs HTTP Basic credentials of the user repository (scripts) or
the cookie of a session opened at /api/v1/session (the browser console); logins wait in
the service's shared throttle (per address and user), off the loop. A request that
changes something must say ``Content-Type: application/json`` and, when it has an
Origin, come from this port's own origin; with a session cookie also echo the session's
CSRF token in X-CSRF-Token. Changes, and browsing message bodies, need a user allowed to
act (``Operations.may_act``); others only read. Every change is logged with its user.
Passwords never reach an answer or a log; properties come redacted.

Design notes: docs/console.md#internals-console.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..admin.clierror import reply_object
from ..admin.protocol import (
    BAD_REQUEST,
    ERROR,
    MAX_BROWSE,
    NOT_FOUND,
    OK,
    AdminProtocolError,
    Command,
    Reply,
    parse_request,
)
from ..guard import LoginThrottle, basic_credentials
from ..users import User
from ..version import __version__
from . import pages
from .pages import PAGE_CSP
from .sessions import COOKIE, CSRF_HEADER, SessionStore, csrf_ok

log = logging.getLogger(__name__)

PREFIX = "/api/v1"
SESSION = "/session"
MAX_BODY = 64 * 1024
DEFAULT_BROWSE = 100
REALM = 'Basic realm="imqbridge management", charset="UTF-8"'
UNAUTHORIZED, FORBIDDEN, TOO_LARGE, UNSUPPORTED = 401, 403, 413, 415
API_CSP = b"default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]
CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclass(frozen=True)
class Operations:
    """What the service gives the API. ``dispatch``: the admin port's commands (blocking);
    ``authenticate(user, password)``: the user repository's check (blocking: a hash);
    ``verified(user, password)``: the user when those credentials passed it before (quick);
    ``may_act(user, peer)``: why ``user`` may not change anything, or None;
    ``properties()``: the effective broker properties, secrets redacted;
    ``read_now``: the answer to a command that needs no blocking call (answered on the
    event loop, not by ``dispatch`` on a worker thread), or None."""

    dispatch: Callable[[Command], Reply]
    authenticate: Callable[[str, str], User | None]
    verified: Callable[[str, str], User | None]
    may_act: Callable[[User, str], str | None]
    properties: Callable[[], dict[str, str]]
    read_now: Callable[[Command], Reply | None]


@dataclass(frozen=True)
class Call:
    """One request, as an endpoint sees it."""

    params: dict[str, str]
    query: dict[str, str]
    body: dict[str, Any]


# An endpoint's work: the admin request object to dispatch, or its Reply.
Work = Callable[[Call], "dict[str, Any] | Reply"]


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str  # under PREFIX, Starlette's {param} syntax
    summary: str
    work: Work
    act: bool = False  # needs the right to act (every change; browsing message bodies)
    query: tuple[tuple[str, str], ...] = ()  # (name, description) of query parameters
    body: bool = False  # takes a JSON object


class Failure(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _int(call: Call, name: str, default: int) -> int:
    text = call.query.get(name)
    if text is None:
        return default
    if not re.fullmatch(r"[0-9]{1,9}", text):
        raise Failure(BAD_REQUEST, f"query parameter {name!r} must be a number, not {text[:40]!r}")
    return int(text)


def _flag(call: Call, name: str) -> bool:
    text = call.query.get(name, "false")
    if text not in ("true", "false"):
        raise Failure(BAD_REQUEST, f"query parameter {name!r} must be true or false, not {text[:40]!r}")
    return text == "true"


def _attributes(call: Call) -> Any:
    return call.body.get("attributes", {})


def _pause_work(op: str) -> Work:
    return lambda c: {
        "op": op,
        "dst_type": c.params["type"],
        "destination": c.params["name"],
        "pause_type": c.query.get("what", "ALL"),
    }


def _dmq_move(op: str) -> Work:
    return lambda c: {
        "op": op,
        "bridge": c.params["bridge"],
        "dmq": c.body.get("dmq"),
        "message_ids": c.body.get("message_ids"),
        "all": c.body.get("all"),
    }


def _bridge_op(op: str) -> Work:
    return lambda c: {"op": op, "bridge": c.params["bridge"]}


def _link_op(op: str) -> Work:
    return lambda c: {"op": op, "bridge": c.params["bridge"], "link": c.params["link"]}


def _endpoints() -> list[Endpoint]:
    bridge_actions = ("start", "stop", "pause", "resume")
    out = [
        Endpoint(
            "GET",
            "/bridges",
            "Every bridge: name, type, state (and owner in an HA cluster)",
            lambda c: {"op": "LIST", "type": c.query.get("type"), "links": _flag(c, "links")},
            query=(
                ("type", "JMS or STOMP: only bridges of that type"),
                ("links", "true: each bridge's links too, as GET /bridges/{bridge} gives them (one request)"),
            ),
        ),
        Endpoint(
            "GET",
            "/bridges/{bridge}",
            "A bridge and its links: state, counters, rates, backlog, last error",
            lambda c: {"op": "LIST", "bridge": c.params["bridge"]},
        ),
        Endpoint(
            "GET",
            "/bridges/{bridge}/links/{link}",
            "One link: state, counters, rates, backlog, last error",
            lambda c: {"op": "LIST", "bridge": c.params["bridge"], "link": c.params["link"]},
        ),
    ]
    out.append(
        Endpoint(
            "GET",
            "/bridges/{bridge}/links/{link}/history",
            "A link's last hour, kept by the service: msg/s and mean latency per 5-second interval",
            lambda c: {"op": "LINK_HISTORY", "bridge": c.params["bridge"], "link": c.params["link"]},
        )
    )
    for action in bridge_actions:
        out.append(
            Endpoint(
                "POST",
                f"/bridges/{{bridge}}/{action}",
                f"{action.capitalize()} a bridge (as imqbridgemgr {action} bridge)",
                _bridge_op(action.upper()),
                act=True,
            )
        )
        out.append(
            Endpoint(
                "POST",
                f"/bridges/{{bridge}}/links/{{link}}/{action}",
                f"{action.capitalize()} a link (as imqbridgemgr {action} link)",
                _link_op(action.upper()),
                act=True,
            )
        )
    out += [
        Endpoint(
            "GET",
            "/bridges/{bridge}/transactions",
            "A JMS bridge's in-doubt XA transactions",
            lambda c: {"op": "LIST_TXN", "bridge": c.params["bridge"]},
        ),
        Endpoint(
            "POST",
            "/bridges/{bridge}/transactions/{txn}/commit",
            "Commit an in-doubt XA transaction (as imqbridgemgr commit txn)",
            lambda c: {"op": "COMMIT_TXN", "bridge": c.params["bridge"], "txn": c.params["txn"]},
            act=True,
        ),
        Endpoint(
            "POST",
            "/bridges/{bridge}/transactions/{txn}/rollback",
            "Roll back an in-doubt XA transaction (as imqbridgemgr rollback txn)",
            lambda c: {"op": "ROLLBACK_TXN", "bridge": c.params["bridge"], "txn": c.params["txn"]},
            act=True,
        ),
        Endpoint(
            "GET",
            "/destinations",
            "The host broker's physical destinations with their counts",
            lambda c: {"op": "LIST_DST", "dst_type": c.query.get("type")},
            query=(("type", "q or t: only queues or only topics"),),
        ),
        Endpoint(
            "POST",
            "/destinations",
            'Create a destination: {"type": "q"|"t", "name": ..., "attributes": {"maxNumMsgs": "1000", ...}}',
            lambda c: {
                "op": "CREATE_DST",
                "dst_type": c.body.get("type"),
                "destination": c.body.get("name"),
                "attributes": _attributes(c),
            },
            act=True,
            body=True,
        ),
        Endpoint(
            "GET",
            "/destinations/{type}/{name}",
            "One destination: attributes and counts (as imqbridgemgr query dst)",
            lambda c: {"op": "QUERY_DST", "dst_type": c.params["type"], "destination": c.params["name"]},
        ),
        Endpoint(
            "PATCH",
            "/destinations/{type}/{name}",
            'Change the attributes named: {"attributes": {"maxNumMsgs": "5000"}}',
            lambda c: {
                "op": "UPDATE_DST",
                "dst_type": c.params["type"],
                "destination": c.params["name"],
                "attributes": _attributes(c),
            },
            act=True,
            body=True,
        ),
        Endpoint(
            "POST",
            "/destinations/{type}/{name}/purge",
            "Remove a destination's waiting messages (as imqbridgemgr purge dst)",
            lambda c: {"op": "PURGE_DST", "dst_type": c.params["type"], "destination": c.params["name"]},
            act=True,
        ),
        Endpoint(
            "GET",
            "/destinations/{type}/{name}/messages",
            "A page of a queue's waiting messages: headers, properties, body (as imqbridgemgr browse dst); "
            "data.next is the cursor of the next page (null: the last)",
            lambda c: {
                "op": "BROWSE_DST",
                "dst_type": c.params["type"],
                "destination": c.params["name"],
                "count": _int(c, "count", DEFAULT_BROWSE),
                "after": c.query.get("after"),
            },
            act=True,
            query=(
                ("count", f"how many messages, 1 to {MAX_BROWSE} (default {DEFAULT_BROWSE})"),
                (
                    "after",
                    "the cursor: the JMSMessageID of the last message of the page before (its answer's "
                    "data.next); the messages after it. 404 when that message is no longer waiting",
                ),
            ),
        ),
        Endpoint(
            "DELETE",
            "/destinations/{type}/{name}",
            "Destroy a destination and its messages (as imqbridgemgr destroy dst -f)",
            lambda c: {"op": "DESTROY_DST", "dst_type": c.params["type"], "destination": c.params["name"]},
            act=True,
        ),
        *(
            Endpoint(
                "POST",
                f"/destinations/{{type}}/{{name}}/{verb}",
                f"{verb.capitalize()} a destination's PRODUCERS, CONSUMERS or ALL (as imqbridgemgr {verb} dst -pst)",
                _pause_work(op),
                act=True,
                query=(("what", "PRODUCERS, CONSUMERS or ALL (default ALL)"),),
            )
            for verb, op in (("pause", "PAUSE_DST"), ("resume", "RESUME_DST"))
        ),
        Endpoint(
            "GET",
            "/connections",
            "The host broker's connections: id, user, service, producers, consumers, host (as imqbridgemgr list cxn)",
            lambda c: {"op": "LIST_CXN", **({"service": c.query["service"]} if "service" in c.query else {})},
            act=True,  # who is connected from where: the admin's to see
            query=(("service", "only this service's connections (jms, stomp, bridge, embedded)"),),
        ),
        Endpoint(
            "GET",
            "/services",
            "The instance's services with their ports and states (as imqbridgemgr list svc)",
            lambda c: {"op": "LIST_SVC"},
        ),
        Endpoint(
            "GET",
            "/dmq/{bridge}",
            "A JMS bridge's DMQs: the first entries of each on the host broker, with their reason and "
            "JMS_SUN_JMSBRIDGE_* properties",
            lambda c: {"op": "LIST_DMQ", "bridge": c.params["bridge"], "count": _int(c, "count", DEFAULT_BROWSE)},
            act=True,
            query=(("count", f"entries per DMQ, 1 to {MAX_BROWSE} (default {DEFAULT_BROWSE})"),),
        ),
        *(
            Endpoint(
                "POST",
                f"/dmq/{{bridge}}/{verb}",
                f"{text} (as imqbridgemgr {verb} dmq): "
                '{"message_ids": ["ID:..."]} or {"all": true}, and "dmq": a <dmq>\'s name (default the built-in one)',
                _dmq_move(f"{verb.upper()}_DMQ"),
                act=True,
                body=True,
            )
            for verb, text in (
                ("redrive", "Send DMQ entries back to their links' targets, each in one transaction"),
                ("archive", "Move DMQ entries into the service's archive file"),
            )
        ),
        Endpoint(
            "POST",
            "/check",
            'A dry-run check of a bridge XML, as imqbridgemgr check FILE: {"xml": "<jmsbridge ...>", '
            '"name": "a name for its problems (default bridge.xml)"}; starts nothing',
            lambda c: {"op": "CHECK_XML", "xml": c.body.get("xml"), "source": c.body.get("name")},
            act=True,  # its transformers are found (a module may be imported) as a start finds them
            body=True,
        ),
        Endpoint(
            "GET",
            "/cluster",
            "The HA cluster: its instances with their leases, and each bridge's owner",
            lambda c: {"op": "CLUSTER"},
        ),
    ]
    return out


def _properties(ops: Operations) -> Endpoint:
    return Endpoint(
        "GET",
        "/properties",
        "The effective broker properties; passwords and other secrets redacted",
        lambda c: Reply(OK, "broker properties", {"properties": ops.properties()}),
    )


def _peer(request: Request) -> str:
    """The socket's address (forwarded headers are not believed)."""
    connection = request.scope.get("state", {}).get("connection")
    if connection is not None:
        return str(connection.peer)
    return request.client.host if request.client else "?"


def _logged_in(request: Request) -> None:
    connection = request.scope.get("state", {}).get("connection")
    if connection is not None:
        connection.logged_in()


def _reply_response(reply: Reply, *headers: tuple[str, str]) -> JSONResponse:
    return JSONResponse(reply_object(reply), status_code=reply.status, headers=dict(headers))


def _failure(status: int, message: str, *headers: tuple[str, str]) -> JSONResponse:
    return _reply_response(Reply(status, message), *headers)


class _SecurityHeaders:
    """Adds SECURITY_HEADERS, the CSP (the API's, or the pages' outside /api) and HSTS on
    TLS to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        csp = API_CSP if scope["path"].startswith(PREFIX) else PAGE_CSP.encode()
        extra = [(b"content-security-policy", csp), *SECURITY_HEADERS]
        if scope.get("scheme") == "https":
            extra.append((b"strict-transport-security", b"max-age=31536000"))

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)


class ConsoleAPI:
    """The endpoints, their security, and the OpenAPI document that lists them."""

    def __init__(self, ops: Operations, throttle: LoginThrottle, sessions: SessionStore) -> None:
        self.ops = ops
        self.throttle = throttle
        self.sessions = sessions
        self.endpoints = [*_endpoints(), _properties(ops)]

    def app(self) -> ASGIApp:
        routes: list[BaseRoute] = [
            Route(PREFIX + e.path, self._handler(e), methods=[e.method], name=f"{e.method} {e.path}")
            for e in self.endpoints
        ]
        routes.append(Route(PREFIX + "/openapi.json", self._openapi, methods=["GET"], name="openapi"))
        routes.append(Route(PREFIX + SESSION, self._session, methods=["GET", "POST", "DELETE"], name="session"))
        routes += pages.routes(self.sessions)

        async def http_error(request: Request, exc: Exception) -> Response:
            assert isinstance(exc, HTTPException)
            if exc.status_code == NOT_FOUND:
                return _failure(NOT_FOUND, f"no such resource {request.url.path[:200]!r}: see {PREFIX}/openapi.json")
            return _failure(exc.status_code, str(exc.detail))

        starlette = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
        return _SecurityHeaders(starlette)

    # --- security ------------------------------------------------------------------------------
    async def _log_in(self, request: Request) -> User | JSONResponse:
        """The request's user (HTTP Basic, else the session cookie; a changing request
        with a cookie must echo its CSRF token), or the 401 or 403 to answer."""
        authorization = request.headers.get("authorization")
        token = request.cookies.get(COOKIE)
        if authorization is None and token is not None:
            session = self.sessions.find(token)
            if session is None:
                return _failure(UNAUTHORIZED, "the session has expired or is unknown: log in again")
            if request.method in CHANGING and not csrf_ok(session, request.headers.get(CSRF_HEADER)):
                return _failure(FORBIDDEN, "a request that changes something must send the session's X-CSRF-Token")
            _logged_in(request)
            return session.user
        credentials = basic_credentials(authorization)
        if credentials is None:
            return _failure(
                UNAUTHORIZED,
                "authentication required: HTTP Basic with a user of the user repository",
                ("WWW-Authenticate", REALM),
            )
        found = await self._check_password(request, *credentials)
        if found is None:
            return _failure(
                UNAUTHORIZED, "authentication failed: wrong user name or password", ("WWW-Authenticate", REALM)
            )
        return found

    async def _check_password(self, request: Request, name: str, password: str) -> User | None:
        """The user, once the throttle let the check run and it passed; None when it failed."""
        peer = _peer(request)
        found: User | None = None
        async with self.throttle.attempt(peer, name) as attempt:
            found = self.ops.verified(name, password) or await asyncio.to_thread(self.ops.authenticate, name, password)
            attempt.outcome(found is not None)
        if found is None:
            log.warning(
                "management login failed for user %r from %s (%d recent failures from there)",
                name,
                peer,
                attempt.count,
            )
            return None
        _logged_in(request)
        return found

    async def _session(self, request: Request) -> Response:
        """/api/v1/session: POST logs in ({"user", "password"}) and sets the cookie, GET
        says who the cookie's user is, DELETE logs out."""
        if request.method == "POST":
            if (why := self._cross_site(request)) is not None:
                return _failure(FORBIDDEN, why)
            try:
                body = await self._body(request)
            except Failure as exc:
                return _failure(exc.status, str(exc))
            name, password = body.get("user"), body.get("password")
            if not isinstance(name, str) or not isinstance(password, str) or not name:
                return _failure(BAD_REQUEST, 'log in with {"user": ..., "password": ...}')
            found = await self._check_password(request, name, password)
            if found is None:
                return _failure(UNAUTHORIZED, "authentication failed: wrong user name or password")
            token, session = self.sessions.open(found)
            log.info("management port: user %r from %s logged in (session)", found.name, _peer(request))
            response = self._who(request, found, session.csrf, f"logged in as {found.name}")
            response.set_cookie(
                COOKIE,
                token,
                max_age=int(self.sessions.timeout),
                path="/",
                secure=request.url.scheme == "https",
                httponly=True,
                samesite="strict",
            )
            return response
        if request.method == "DELETE" and (why := self._cross_site(request)) is not None:
            return _failure(FORBIDDEN, why)
        user = await self._log_in(request)
        if isinstance(user, Response):
            return user
        if request.method == "GET":
            current = self.sessions.find(request.cookies.get(COOKIE))
            return self._who(request, user, current.csrf if current is not None else None, f"user {user.name}")
        self.sessions.close(request.cookies.get(COOKIE))
        log.info("management port: user %r from %s logged out", user.name, _peer(request))
        response = _reply_response(Reply(OK, "logged out"))
        response.delete_cookie(COOKIE, path="/", secure=request.url.scheme == "https", httponly=True, samesite="strict")
        return response

    def _who(self, request: Request, user: User, csrf: str | None, message: str) -> JSONResponse:
        may_act = self.ops.may_act(user, _peer(request)) is None
        data = {"user": user.name, "group": user.group, "mayAct": may_act, "csrfToken": csrf}
        return _reply_response(Reply(OK, message, data))

    @staticmethod
    def _cross_site(request: Request) -> str | None:
        """Why a changing request may come from another site's page (None: it cannot)."""
        media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media != "application/json":
            return (
                "a request that changes something must say Content-Type: application/json "
                "(protection against cross-site requests)"
            )
        origin = request.headers.get("origin")
        if origin is not None:
            own = f"{request.url.scheme}://{request.headers.get('host', '')}"
            if origin.lower() != own.lower():
                return f"cross-site request refused: Origin {origin[:100]!r} is not {own!r}"
        if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
            return "cross-site request refused (Sec-Fetch-Site)"
        return None

    async def _body(self, request: Request) -> dict[str, Any]:
        data = b""
        async for chunk in request.stream():
            data += chunk
            if len(data) > MAX_BODY:
                raise Failure(TOO_LARGE, f"a request body may have at most {MAX_BODY} bytes")
        if not data.strip():
            return {}
        try:
            body = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise Failure(BAD_REQUEST, f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise Failure(BAD_REQUEST, "the body must be a JSON object")
        return body

    # --- requests ------------------------------------------------------------------------------
    def _handler(self, endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            changing = request.method in CHANGING
            if changing and (why := self._cross_site(request)) is not None:
                log.warning(
                    "management port: %s %s from %s refused: %s",
                    request.method,
                    request.url.path,
                    _peer(request),
                    why,
                )
                return _failure(FORBIDDEN, why)
            user = await self._log_in(request)
            if isinstance(user, Response):
                return user
            peer = _peer(request)
            if endpoint.act and (why := self.ops.may_act(user, peer)) is not None:
                log.warning(
                    "management port: user %r from %s refused %s %s: %s",
                    user.name,
                    peer,
                    request.method,
                    request.url.path,
                    why,
                )
                return _failure(FORBIDDEN, why)
            try:
                body = await self._body(request) if changing else {}
                call = Call(dict(request.path_params), dict(request.query_params), body)
                work = endpoint.work(call)
                reply = work if isinstance(work, Reply) else await self._dispatch(work)
            except Failure as exc:
                reply = Reply(exc.status, str(exc))
            if changing:
                log.info(
                    "management port: user %r from %s: %s %s -> %d %s",
                    user.name,
                    peer,
                    request.method,
                    request.url.path,
                    reply.status,
                    reply.message,
                )
            return _reply_response(reply)

        return handle

    async def _dispatch(self, request: dict[str, Any]) -> Reply:
        try:
            command = parse_request(json.dumps(request).encode())
        except AdminProtocolError as exc:
            return Reply(exc.status, str(exc))
        assert isinstance(command, Command)  # an endpoint never asks for HELLO
        try:
            reply = self.ops.read_now(command)  # a link's GET while it moves: on the loop
            return reply if reply is not None else await asyncio.to_thread(self.ops.dispatch, command)
        except Exception as exc:  # a bug in a bridge must not take the port down
            log.exception("management port: %s failed", command)
            return Reply(ERROR, f"the operation failed: {exc}")

    async def _openapi(self, request: Request) -> Response:
        user = await self._log_in(request)
        if isinstance(user, Response):
            return user
        return JSONResponse(self.openapi())

    # --- the OpenAPI document ------------------------------------------------------------------
    def openapi(self) -> dict[str, Any]:
        paths: dict[str, dict[str, Any]] = {}
        reply = {"$ref": "#/components/schemas/Reply"}
        for e in self.endpoints:
            params = [
                {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                for name in re.findall(r"{(\w+)}", e.path)
            ]
            params += [
                {"name": name, "in": "query", "required": False, "description": text, "schema": {"type": "string"}}
                for name, text in e.query
            ]
            responses: dict[str, Any] = {
                str(code): {"description": text, "content": {"application/json": {"schema": reply}}}
                for code, text in (
                    (200, "done"),
                    (400, "bad request"),
                    (401, "no or wrong credentials"),
                    (404, "no such bridge, link, destination or transaction"),
                    (500, "the operation failed"),
                    (503, "unavailable"),
                )
            }
            if e.act or e.method in CHANGING:
                responses["403"] = {
                    "description": "the user may not act, or a cross-site request",
                    "content": {"application/json": {"schema": reply}},
                }
            operation: dict[str, Any] = {
                "summary": e.summary,
                "operationId": f"{e.method.lower()}{re.sub(r'[^A-Za-z0-9]+', '_', e.path)}",
                "parameters": params,
                "responses": responses,
            }
            if e.body or e.method in CHANGING:
                operation["requestBody"] = {
                    "required": e.body,
                    "content": {"application/json": {"schema": {"type": "object"}}},
                }
            paths.setdefault(PREFIX + e.path, {})[e.method.lower()] = operation
        session = {"content": {"application/json": {"schema": reply}}}
        paths[PREFIX + SESSION] = {
            "post": {
                "summary": 'Log in for the browser console: {"user": ..., "password": ...}; sets the session '
                "cookie and answers the CSRF token to send as X-CSRF-Token",
                "operationId": "post_session",
                "security": [],
                "requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}},
                "responses": {"200": {"description": "logged in", **session}, "401": {"description": "no", **session}},
            },
            "get": {
                "summary": "Who is logged in, whether they may act, the session's CSRF token",
                "operationId": "get_session",
                "responses": {"200": {"description": "the user", **session}},
            },
            "delete": {
                "summary": "Log out",
                "operationId": "delete_session",
                "responses": {"200": {"description": "logged out", **session}},
            },
        }
        paths[PREFIX + "/openapi.json"] = {
            "get": {
                "summary": "This document",
                "operationId": "get_openapi",
                "responses": {"200": {"description": "the OpenAPI document", "content": {"application/json": {}}}},
            }
        }
        return {
            "openapi": "3.1.0",
            "info": {"title": "imqbridge management API", "version": __version__},
            "security": [{"basic": []}, {"session": []}],
            "paths": paths,
            "components": {
                "securitySchemes": {
                    "basic": {"type": "http", "scheme": "basic"},
                    "session": {"type": "apiKey", "in": "cookie", "name": COOKIE},
                },
                "schemas": {
                    "Reply": {
                        "type": "object",
                        "required": ["status", "message", "data"],
                        "properties": {
                            "status": {"type": "integer"},
                            "message": {"type": "string"},
                            "data": {},
                            "error": {
                                "type": "object",
                                "properties": {"message": {"type": "string"}, "code": {"type": "integer"}},
                            },
                        },
                    }
                },
            },
        }
