"""The browser console's pages: one HTML shell at / and its static JS and CSS
(bridgemgr/console/static/, package data), which call the /api/v1 endpoints with the
session cookie and its CSRF token. No build step: plain HTML, CSS and JavaScript.

Rules: pages get PAGE_CSP (scripts, styles, images and requests of this origin only: no
inline script or style); the shell says whether the request's cookie names a live
session (``data-session``) so a browser without one is shown the login form without a
failed request; no page holds a password, key or token.

Design notes: docs/console.md#internals-console.
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from .sessions import COOKIE, SessionStore

PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
STATIC = "/static"


def _static_dir() -> str:
    return str(resources.files(__package__) / "static")


def routes(sessions: SessionStore) -> list[BaseRoute]:
    """/ (the shell) and /static/* (its files)."""
    shell = (resources.files(__package__) / "static" / "index.html").read_text(encoding="utf-8")

    async def index(request: Request) -> Response:
        live = sessions.find(request.cookies.get(COOKIE)) is not None
        return HTMLResponse(shell.replace("{{session}}", "yes" if live else "none"))

    return [
        Route("/", index, methods=["GET"], name="console"),
        Mount(STATIC, StaticFiles(directory=_static_dir()), name="static"),
    ]
