"""The one asyncio loop of the service's network front ends (STOMP bridge, jms
connection service, admin port, port mapper), running in its own thread.

Broker and link threads hand work to it with ``call_soon`` (thread-safe); code on
other threads runs a coroutine there and waits for its result with ``run``. A client
that resets its connection or leaves mid-read is routine on a public port: where it
escapes a front end's callback, the loop logs it at DEBUG in one line, not as an
ERROR with a traceback.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import logging
import ssl
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)

# What a socket of a client that went away raises (ENOTCONN: shutdown after a reset).
_GONE_ERRNOS = frozenset(
    {errno.ECONNRESET, errno.EPIPE, errno.ENOTCONN, errno.ECONNABORTED, errno.ESHUTDOWN, errno.ETIMEDOUT}
)


def client_gone(exc: BaseException) -> bool:
    """Whether ``exc`` only says that the peer closed or reset its connection."""
    if isinstance(exc, (ConnectionError, asyncio.IncompleteReadError, ssl.SSLEOFError)):
        return True
    return isinstance(exc, OSError) and exc.errno in _GONE_ERRNOS


def _log_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    exc = context.get("exception")
    if exc is not None and client_gone(exc):
        log.debug("a client left: %s: %s", context.get("message", "?").splitlines()[0], str(exc) or type(exc).__name__)
        return
    loop.default_exception_handler(context)


class NetLoop:
    def __init__(self, name: str = "imqbridge-net") -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(_log_exception)
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._started = threading.Event()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        self.loop.run_forever()
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    def start(self) -> NetLoop:
        self._thread.start()
        self._started.wait()
        return self

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop from another thread and return its result."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def stop(self, timeout: float = 10) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)

    def __enter__(self) -> NetLoop:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
