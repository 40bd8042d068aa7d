"""A MessageTransformer for content-based routing: the first route whose JMS selector
matches the message sends it there (branch_to); the target's <property> elements
describe the routes:

=================================  ====================================================
``route.N.selector`` = SELECTOR    a JMS message selector (routes are tried by N)
``route.N.to`` = WHERE             a <destination> ref-name of the bridge, or
                                   ``queue:NAME`` / ``topic:NAME``
``default`` = ``target``           no route matched: the link's own target (the default)
``default`` = ``drop``             no route matched: consume, do not transfer
``default`` = WHERE                no route matched: WHERE
=================================  ====================================================

A route without a selector or destination, or a bad selector, is a transform failure.
An example: docs/transformers.md#contentrouter-content-based-routing.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from bridgemgr.jms.destination import Destination, Queue, Topic
from bridgemgr.jms.errors import JMSException
from bridgemgr.jms.message import Message
from bridgemgr.jms.selector import Selector, compile_selector
from bridgemgr.transform import MessageTransformer

Route = tuple[Selector | None, "Destination | str"]


def parse_where(where: str) -> Destination | str:
    """``queue:NAME`` / ``topic:NAME`` as a destination; anything else is a ref-name."""
    kind, sep, name = where.partition(":")
    if sep and name and kind in ("queue", "topic"):
        return Queue(name) if kind == "queue" else Topic(name)
    return where


def parse_routes(properties: Mapping[str, Any]) -> tuple[list[Route], str]:
    """The routes in order of N, and the default."""
    numbers: set[int] = set()
    for key in properties:
        parts = key.split(".")
        if len(parts) == 3 and parts[0] == "route":
            if not parts[1].isdigit() or parts[2] not in ("selector", "to"):
                raise JMSException(f"ContentRouter: property {key} is not route.N.selector or route.N.to")
            numbers.add(int(parts[1]))
    routes: list[Route] = []
    for n in sorted(numbers):
        selector, to = properties.get(f"route.{n}.selector"), properties.get(f"route.{n}.to")
        if not selector or not to:
            raise JMSException(f"ContentRouter: route {n} needs both route.{n}.selector and route.{n}.to")
        routes.append((compile_selector(selector), parse_where(to)))
    return routes, str(properties.get("default", "target"))


class ContentRouter(MessageTransformer):
    """Routes each message by the first matching selector."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._cache: dict[frozenset[tuple[str, Any]], tuple[list[Route], str]] = {}

    def _routes(self, properties: Mapping[str, Any]) -> tuple[list[Route], str]:
        key = frozenset(properties.items())
        with self._lock:
            found = self._cache.get(key)
            if found is None:
                found = self._cache[key] = parse_routes(properties)
            return found

    def transform(
        self,
        message: Message,
        read_only: bool,
        charset_name: str | None,
        source: str,
        target: str,
        properties: Mapping[str, Any] | None,
    ) -> Message:
        routes, default = self._routes(properties or {})
        for selector, where in routes:
            if selector is None or selector.matches(message):
                self.branch_to(where)
                return message
        if default == "drop":
            self.no_transfer()
        elif default != "target":
            self.branch_to(parse_where(default))
        return message
