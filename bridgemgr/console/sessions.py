"""The browser console's login sessions: an opaque token in an HttpOnly cookie, a CSRF
token that every changing request must echo in X-CSRF-Token, and an idle timeout.

Rules: tokens are 256 random bits (the CSRF token compared in constant time); a session unused for
``timeout`` seconds is gone; at most ``max_sessions`` exist (a new one pushes out the
least recently used), so logins cannot grow the table without bound. Used on the
service's network loop only (no lock).
"""

from __future__ import annotations

import collections
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..users import User

COOKIE = "imqconsole"
CSRF_HEADER = "x-csrf-token"
MAX_SESSIONS = 1000


@dataclass
class Session:
    user: User
    csrf: str
    last_used: float


class SessionStore:
    def __init__(
        self, timeout: float, max_sessions: int = MAX_SESSIONS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.timeout = timeout
        self.max_sessions = max_sessions
        self._clock = clock
        self._sessions: collections.OrderedDict[str, Session] = collections.OrderedDict()

    def open(self, user: User) -> tuple[str, Session]:
        """A new session of ``user``: its cookie token and the session (its CSRF token)."""
        while len(self._sessions) >= self.max_sessions:
            self._sessions.popitem(last=False)
        token = secrets.token_urlsafe(32)
        session = self._sessions[token] = Session(user, secrets.token_urlsafe(32), self._clock())
        return token, session

    def find(self, token: str | None) -> Session | None:
        """The live session of cookie ``token`` (its idle time starts again), or None."""
        if not token:
            return None
        now = self._clock()
        for key, session in list(self._sessions.items()):  # oldest first: drop the expired
            if now - session.last_used < self.timeout:
                break
            del self._sessions[key]
        found = self._sessions.get(token)  # 256 random bits: a hash lookup gives no timing hint worth having
        if found is None:
            return None
        found.last_used = now
        self._sessions.move_to_end(token)
        return found

    def close(self, token: str | None) -> bool:
        """End the session of cookie ``token``; whether there was one."""
        if self.find(token) is None:
            return False
        del self._sessions[token]  # type: ignore[arg-type]  # (found: not None)
        return True

    def __len__(self) -> int:
        return len(self._sessions)


def csrf_ok(session: Session, header: str | None) -> bool:
    return header is not None and hmac.compare_digest(session.csrf, header)
