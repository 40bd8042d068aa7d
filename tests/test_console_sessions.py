"""The browser console's session table (console/sessions.py): idle expiry, the cap on
sessions, logout, and the CSRF token check."""

from __future__ import annotations

from bridgemgr.console.sessions import SessionStore, csrf_ok
from bridgemgr.users import User

ALICE = User("alice", "admin")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_ends_after_its_idle_timeout_and_each_use_restarts_it():
    clock = Clock()
    store = SessionStore(60, clock=clock)
    token, session = store.open(ALICE)
    clock.now += 59
    assert store.find(token) is session  # used: 60 s more from now
    clock.now += 59
    assert store.find(token) is session
    clock.now += 60
    assert store.find(token) is None and len(store) == 0


def test_sessions_are_capped_and_the_least_recently_used_goes():
    store = SessionStore(60, max_sessions=3, clock=Clock())
    tokens = [store.open(ALICE)[0] for _ in range(3)]
    store.find(tokens[0])  # the first is now the most recently used
    fourth, _ = store.open(ALICE)
    assert len(store) == 3 and store.find(tokens[1]) is None
    assert all(store.find(t) is not None for t in (tokens[0], tokens[2], fourth))


def test_logout_ends_the_session_and_tokens_are_unguessable():
    store = SessionStore(60, clock=Clock())
    token, session = store.open(ALICE)
    other, other_session = store.open(ALICE)
    assert len({token, other, session.csrf, other_session.csrf}) == 4 and len(token) >= 43  # 256 bits
    assert store.close(token) and store.find(token) is None and not store.close(token)
    assert store.find(other) is other_session and store.find("") is None and store.find(None) is None


def test_the_csrf_token_must_match_exactly():
    _, session = SessionStore(60, clock=Clock()).open(ALICE)
    assert csrf_ok(session, session.csrf)
    assert not csrf_ok(session, None) and not csrf_ok(session, "") and not csrf_ok(session, session.csrf[:-1])
