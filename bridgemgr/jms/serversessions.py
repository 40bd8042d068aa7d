"""A ready server session pool: a thread per session, each session with its listener.

How it works: the pool opens ``size`` sessions of one connection (transacted,
CLIENT_ACKNOWLEDGE, AUTO/DUPS_OK, or XA) and gives each a listener made by
``make_listener(session)`` (so the listener can send in the session's transaction) and a
thread. A connection consumer takes a free server session (get_server_session waits for
one), loads it and calls start(); the session's thread then runs the session and
completes its work as its kind says: a transacted session commits, or rolls back when
the listener raised; CLIENT_ACKNOWLEDGE acknowledges, or recovers; an XA session runs in
a branch of its own, committed in one phase, or rolled back (TMFAIL); AUTO/DUPS_OK
sessions need nothing (a failing message is given back at once). Every rollback and
recover is a backout the broker counts towards the destination's backoutThreshold.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable

from .errors import JMSException
from .spi import (
    AckMode,
    Connection,
    MessageListener,
    ServerSession,
    ServerSessionPool,
    Session,
    XAConnection,
    XASession,
)
from .xa import TMFAIL, TMNOFLAGS, TMSUCCESS, Xid

log = logging.getLogger(__name__)

ListenerFactory = Callable[[Session], MessageListener]


class ThreadServerSession(ServerSession):
    """One session of a :class:`ThreadServerSessionPool` and the thread that runs it."""

    def __init__(self, pool: ThreadServerSessionPool, session: Session, index: int) -> None:
        self.pool = pool
        self.session = session
        self.index = index
        self._go = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name=f"server-session-{index}")
        self._thread.start()

    def get_session(self) -> Session:
        return self.session

    def start(self) -> None:
        self._go.set()

    def _serve(self) -> None:
        while True:
            self._go.wait()
            self._go.clear()
            if self.pool.closed:
                return
            try:
                self._run_once()
            except JMSException as exc:
                if not self.pool.closed:
                    log.warning("server session %d: %s", self.index, exc)
            finally:
                self.pool.give_back(self)

    def _run_once(self) -> None:
        session = self.session
        if isinstance(session, XASession):
            self._run_xa(session)
            return
        try:
            session.run()
        except Exception as exc:
            if not isinstance(exc, JMSException):
                log.warning("server session %d: the listener failed (%s); backing out", self.index, exc)
            if session.transacted:
                session.rollback()
            elif session.ack_mode is AckMode.CLIENT_ACKNOWLEDGE:
                session.recover()
            if isinstance(exc, JMSException):
                raise
            return
        if session.transacted:
            session.commit()
        elif session.ack_mode is AckMode.CLIENT_ACKNOWLEDGE:
            session.acknowledge()

    def _run_xa(self, session: XASession) -> None:
        resource = session.xa_resource
        xid = Xid(0x4153, os.urandom(16), self.index.to_bytes(4, "big"))
        resource.start(xid, TMNOFLAGS)
        try:
            session.run()
        except Exception as exc:
            log.warning("server session %d: the listener failed (%s); rolling back its branch", self.index, exc)
            resource.end(xid, TMFAIL)
            resource.rollback(xid)
            return
        resource.end(xid, TMSUCCESS)
        resource.commit(xid, True)


class ThreadServerSessionPool(ServerSessionPool):
    """``size`` server sessions of ``connection``, a thread and a listener each (see the
    module notes); ``xa`` needs an XAConnection. close() stops the threads and closes the
    sessions (close the connection consumers using the pool first)."""

    def __init__(
        self,
        connection: Connection,
        size: int,
        make_listener: ListenerFactory,
        *,
        transacted: bool = False,
        ack_mode: AckMode = AckMode.AUTO_ACKNOWLEDGE,
        xa: bool = False,
    ) -> None:
        if size < 1:
            raise JMSException(f"a server session pool needs at least one session, not {size}")
        if xa and not isinstance(connection, XAConnection):
            raise JMSException(f"an XA server session pool needs an XA connection, not {connection!r}")
        self.closed = False
        self._free: queue.Queue[ThreadServerSession | None] = queue.Queue()
        self.sessions: list[ThreadServerSession] = []
        for i in range(size):
            if xa:
                assert isinstance(connection, XAConnection)
                session: Session = connection.create_xa_session()
            else:
                session = connection.create_session(transacted, ack_mode)
            session.set_message_listener(make_listener(session))
            server_session = ThreadServerSession(self, session, i)
            self.sessions.append(server_session)
            self._free.put(server_session)

    def get_server_session(self) -> ServerSession | None:
        """A free server session, waiting for one; None once the pool is closed."""
        if self.closed:
            return None
        server_session = self._free.get()
        if server_session is None:
            self._free.put(None)  # the next waiter hears it too
        return server_session

    def give_back(self, server_session: ThreadServerSession) -> None:
        if not self.closed:
            self._free.put(server_session)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._free.put(None)
        for server_session in self.sessions:
            server_session.start()  # wakes its thread, which ends
        for server_session in self.sessions:
            if server_session._thread is not threading.current_thread():
                server_session._thread.join(timeout=5)
            try:
                server_session.session.close()
            except JMSException:
                pass

    def __enter__(self) -> ThreadServerSessionPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
