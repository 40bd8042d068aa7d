"""How imqbridgemgr fails: a ClickException that carries a status code, and the JSON
error object that ``--json`` prints for any failure.

How it works: a command that fails raises click.ClickException (exit 1) or
click.UsageError (exit 2). With ``--json`` anywhere on the command line (cli.py's group)
the message is printed instead as ``{"error": {"message": ..., "code": ...}}`` on stdout,
with the same exit status. ``code`` uses the admin protocol's status codes (the original
product's): the service's own status when it answered, 400 for a usage error, 503 when
the service cannot be reached, 500 for anything else.
"""

from __future__ import annotations

from typing import Any

import click

from .protocol import BAD_REQUEST, ERROR, Reply


class CommandFailed(click.ClickException):
    """A failure with the status code ``--json`` reports (exit status 1)."""

    def __init__(self, message: str, status: int = ERROR) -> None:
        super().__init__(message)
        self.status = status


def error_object(exc: click.ClickException) -> dict[str, Any]:
    """``exc`` as the JSON error object ``--json`` prints."""
    if isinstance(exc, click.UsageError):
        message = exc.format_message()
        if exc.ctx is not None:  # the usage line says which command it was
            message = f"{exc.ctx.command_path}: {message}"
        return {"error": {"message": message, "code": BAD_REQUEST}}
    return {"error": {"message": exc.format_message(), "code": getattr(exc, "status", ERROR)}}


def reply_object(reply: Reply) -> dict[str, Any]:
    """A reply as ``--json`` prints it and the management API answers: status, message and
    data; a failed one also as the JSON error object above."""
    obj: dict[str, Any] = {"status": reply.status, "message": reply.message, "data": reply.data}
    if not reply.ok:
        obj["error"] = {"message": reply.message, "code": reply.status}
    return obj
