"""The client ids and durable subscriptions reserved for the bridge service.

The bridge service keeps for itself the client ids and durable subscriptions that its loaded
bridges' links use on the host broker (the service reserves them when a bridge loads and
releases them when it unloads, through the HostBroker interface). The Broker consults this
registry, one place, wherever a client id is set and a durable subscription is made or
removed, whatever the front end (in process, STOMP, the jms service). A connection is the
service's own when it came from the factory the bridges are given
(EmbeddedConnection.service) or when it logged in as a service account (the account Spark
links and jobs use over mq://); any other is refused with JMSSecurityException naming what
is reserved and for which bridge. Each refusal is logged once per user and name, so a client
retrying in a loop does not flood the log.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable, Iterable
from typing import Any

from ...jms.errors import JMSSecurityException

log = logging.getLogger(__name__)

_LOGGED_LIMIT = 10_000  # distinct refusals remembered for log-once; then forgotten and relogged


class FirstTimes:
    """Which keys were met before (a refusal logged once each), thread-safe; past ``limit``
    keys everything is forgotten (and logged again), so memory stays bounded."""

    def __init__(self, limit: int = _LOGGED_LIMIT) -> None:
        self._lock = threading.Lock()
        self._seen: set[Hashable] = set()
        self._limit = limit

    def first(self, key: Hashable) -> bool:
        with self._lock:
            if key in self._seen:
                return False
            if len(self._seen) >= self._limit:
                self._seen.clear()
            self._seen.add(key)
            return True


class Reservations:
    """Who owns each reserved client id and durable subscription (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owned: dict[str, tuple[frozenset[str], frozenset[tuple[str, str]]]] = {}
        self._client_ids: dict[str, str] = {}
        self._durables: dict[tuple[str, str], str] = {}
        self._logged = FirstTimes()
        self.service_users: frozenset[str] = frozenset()

    def reserve(self, owner: str, client_ids: Iterable[str], durables: Iterable[tuple[str, str]]) -> None:
        """``owner``'s client ids and (client id, name) durables, replacing what it had."""
        with self._lock:
            self._drop(owner)
            ids, subs = frozenset(client_ids), frozenset(durables)
            self._owned[owner] = (ids, subs)
            for client_id in ids:
                self._client_ids.setdefault(client_id, owner)
            for key in subs:
                self._durables.setdefault(key, owner)

    def release(self, owner: str) -> None:
        with self._lock:
            self._drop(owner)

    def _drop(self, owner: str) -> None:
        ids, subs = self._owned.pop(owner, (frozenset(), frozenset()))
        for client_id in ids:
            if self._client_ids.get(client_id) == owner:
                del self._client_ids[client_id]
        for key in subs:
            if self._durables.get(key) == owner:
                del self._durables[key]
        for other, (o_ids, o_subs) in self._owned.items():  # another bridge names it too
            for client_id in o_ids & ids:
                self._client_ids.setdefault(client_id, other)
            for key in o_subs & subs:
                self._durables.setdefault(key, other)

    def is_service(self, connection: Any) -> bool:
        return bool(getattr(connection, "service", False)) or connection.username in self.service_users

    def check_client_id(self, connection: Any, client_id: str) -> None:
        """JMSSecurityException when ``client_id`` is reserved and ``connection`` is not the service's."""
        owner = self._client_ids.get(client_id)
        if owner is not None and not self.is_service(connection):
            self._refuse(connection, f"client id {client_id!r}", owner, "set")

    def check_durable(self, connection: Any, client_id: str, name: str, action: str) -> None:
        """Likewise for durable subscription ``name`` of ``client_id`` (``action``: subscribe, unsubscribe)."""
        owner = self._durables.get((client_id, name)) or self._client_ids.get(client_id)
        if owner is not None and not self.is_service(connection):
            self._refuse(connection, f"durable subscription {name!r} of client id {client_id!r}", owner, action)

    def _refuse(self, connection: Any, what: str, owner: str, action: str) -> None:
        user = connection.username
        if self._logged.first((user, f"{action} {what}")):
            log.warning("refused: user %r may not %s %s, reserved for bridge %s", user, action, what, owner)
        raise JMSSecurityException(f"{what} is reserved for bridge {owner}: user {user!r} may not {action} it")
