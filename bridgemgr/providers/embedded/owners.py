"""The owner of a durable subscription: who may attach to it or remove it.

A durable subscription records the user who made it (Subscription.owner, the store's
subs.owner). Wherever one is attached to or removed (the broker's durable_queue and
unsubscribe, so every front end: in process, STOMP, the jms service), the broker asks
DurableOwners.check with its lock held. The owner passes; so do the bridge service's own
connections (reserve.py), logged when the subscription is another user's. Anyone else needs
the connection's durable_override (set by the front end that authenticated it:
accesscontrol.durable_override, admins and the access control file's durable rules), and is
logged with both user names; without it, JMSSecurityException says the subscription is owned
by another user, never whose. A connection without a user name (in process, no login) owns
as "". A subscription whose owner is unknown (a store of schema version 1) belongs to the
first user who attaches to it (logged); to remove one before that takes an admin or a grant.
"""

from __future__ import annotations

import logging
from typing import Any

from ...jms.errors import JMSSecurityException
from .reserve import FirstTimes

log = logging.getLogger(__name__)

OPERATIONS = {"subscribe to": "consume", "unsubscribe": "unsubscribe"}  # action -> access rule operation


def owner_name(connection: Any) -> str:
    """The owner a subscription ``connection`` makes gets: its user ("" without one)."""
    return connection.username or ""


class DurableOwners:
    """The ownership check, with its log-once memory of refusals (thread-safe)."""

    def __init__(self) -> None:
        self._logged = FirstTimes()

    def check(
        self, connection: Any, client_id: str, name: str, owner: str | None, action: str, service: bool
    ) -> str | None:
        """May ``connection`` ``action`` (subscribe to, unsubscribe) durable subscription
        ``name`` of ``client_id``, owned by ``owner`` (None: unknown)? Returns the owner to
        record when it claims an unowned one, None when nothing changes;
        JMSSecurityException when it may not. ``service``: the bridge service's own."""
        user = owner_name(connection)
        what = f"durable subscription {name!r} of client id {client_id!r}"
        if owner == user:
            return None
        if owner is None and action == "subscribe to":
            log.warning("%s had no owner (made before owners were recorded): user %r claims it", what, user)
            return user
        if service:
            log.info("the bridge service (user %r) may %s %s, owned by %s", user, action, what, _shown(owner))
            return None
        override = getattr(connection, "durable_override", None)
        why = override(client_id, name, OPERATIONS[action]) if override is not None else None
        if why is not None:
            log.warning("user %r, %s, may %s %s, owned by %s", user, why, action, what, _shown(owner))
            return None
        if self._logged.first((user, action, client_id, name)):
            log.warning("refused: user %r may not %s %s, owned by %s", user, action, what, _shown(owner))
        whose = (
            "owned by another user"
            if owner is not None
            else "not claimed yet (only an admin or a granted user may remove it)"
        )
        raise JMSSecurityException(f"{what} is {whose}: user {user!r} may not {action} it")


def _shown(owner: str | None) -> str:
    if owner is None:
        return "nobody yet"
    return f"user {owner!r}" if owner else "a connection without a user"
