"""One client connection of the host broker's ``jms`` service, with no sockets (sans-IO).

A :class:`ClientConnection` is one remote client's protocol state: its :class:`wire.Wire`
(bytes in, frames out), its state (HANDSHAKE, AUTHENTICATING, REFUSED, OPEN, CLOSED), its
sessions, consumers and browsers, and one handler per request op (``HANDLERS``). It does no
I/O and knows no threads or timers; its driver (the service's asyncio protocol, or a test)
feeds it what the socket read (``receive_data``), writes what it has to send
(``data_to_send``), runs the blocking calls it asks for (``take_calls``) in a thread pool
and reports each (``complete``), runs on the loop what the connection ``post``s from any
thread (consumer pumps, a broker failure), calls ``tick`` every half heart-beat interval,
and closes the socket once ``closed`` is true.

Rules: after HELLO the connection owns one :class:`EmbeddedConnection` of the broker, and
every remote session, consumer, transaction and XA branch is the embedded one, so the
broker's rules hold over the wire unchanged and closing the socket gives back what the
client held; a persistent send or commit is answered only once its store batch is written;
nothing but HELLO is accepted before authentication (frames of 64 KiB at most until then);
passwords are never logged.

Design notes: docs/embedded-broker.md#internals-providersembeddedclientconnpy.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import partial
from typing import TYPE_CHECKING, Any

from ...accesscontrol import durable_override
from ...jms import codec, xa
from ...jms.destination import Destination, Queue, Topic
from ...jms.errors import (
    IllegalStateException,
    InvalidDestinationException,
    JMSException,
    JMSSecurityException,
    ProducerFlowControl,
    TransactionRolledBackException,
    TransportException,
    XAException,
)
from ...jms.hostbroker import Principal
from ...jms.message import Message
from ...jms.spi import AckMode
from ...jms.xa import Xid
from ...version import __version__
from . import wire
from .broker import Broker, Sent
from .client import EmbeddedConnection, EmbeddedConsumer, EmbeddedSession, EmbeddedXASession
from .queues import Envelope

if TYPE_CHECKING:
    from ...accesscontrol import AccessControls

log = logging.getLogger(__name__)

# (user, password) -> the Principal (with the user's groups) or True when the password
# is right; False or None when not.
Authenticate = Callable[[str | None, str | None], "Principal | bool | None"]
# HA (cluster.py's locate): where the store of the broker a client was last connected to
# is served now: None here, else (broker id, its mq:// URLs); TransportException while
# that broker is not taken over yet.
Locate = Callable[[str], "tuple[str, str] | None"]
SERVICE = "jms"  # the connection service whose access rules apply
Post = Callable[[Callable[[], None]], None]

MIN_HEARTBEAT = 0.05
BROWSE_PAGE_MESSAGES = 500
BROWSE_PAGE_BYTES = 1 << 20
MAX_PREFETCH = 65536
_HELLO, _INDIVIDUAL = wire.Op.HELLO, AckMode.INDIVIDUAL_ACKNOWLEDGE


class State(Enum):
    HANDSHAKE = "waiting for HELLO"
    AUTHENTICATING = "authenticating"
    REFUSED = "login refused"  # the driver counts the failure and fails it
    OPEN = "open"
    CLOSED = "closed"


@dataclass(slots=True, eq=False)
class BlockingCall:
    """Work the driver runs in its thread pool, then reports with ``complete``; ``quick``,
    when given, is tried on the loop first: True when it did what ``fn`` would wait for,
    so ``fn`` runs there too and returns at once."""

    fn: Callable[[], Any]
    done: Callable[[Any, BaseException | None], None]
    quick: Callable[[], bool] | None = None


class Deferred:
    """A handler's answer that must wait: run ``fn`` off the loop, reply its result."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn


class Durable:
    """A handler's answer once store batch ``ticket`` is durable (see the module notes);
    a send's (Sent) is withdrawn if the store cannot write it (Broker.wait_all)."""

    __slots__ = ("ticket",)

    def __init__(self, ticket: int | Sent) -> None:
        self.ticket = ticket


def _durable(ticket: int | Sent | None) -> Durable | None:
    """Answer once ``ticket`` is durable, or at once when there is nothing to wait for."""
    return None if ticket is None else Durable(ticket)


class RemoteSession:
    """Service-side state of a remote session beside its embedded session."""

    __slots__ = ("by_tag", "failed", "s", "sid", "tags")

    def __init__(self, sid: int, session: EmbeddedSession) -> None:
        self.sid = sid
        self.s = session
        self.tags = itertools.count(1)
        self.by_tag: dict[int, Envelope] = {}  # INDIVIDUAL_ACKNOWLEDGE: consumed, unacked
        self.failed: JMSException | None = None  # an asynchronous send of the transaction failed


class RemoteConsumer(EmbeddedConsumer):
    """An embedded consumer whose messages go to a remote client (see the module notes)."""

    def __init__(
        self,
        client: ClientConnection,
        session: RemoteSession,
        cid: int,
        destination: Destination,
        selector: str | None,
        prefetch: int,
        durable_name: str | None,
        prefetch_bytes: int = 0,
    ) -> None:
        super().__init__(session.s, destination, selector, durable_name)
        self.client = client
        self.remote = session
        self.cid = cid
        self.prefetch = prefetch  # 0: a pull consumer (see wire's notes)
        self.refill = max(1, prefetch // 4)  # CONSUMED refills the window in batches this big
        self.credit = 0  # PULL credits of a pull consumer
        self.inflight: dict[int, Envelope] = {}
        self.prefetch_bytes = prefetch_bytes  # > 0: no delivery while inflight holds that many
        self.inflight_bytes = 0
        self.sizes: dict[int, int] = {}  # tag -> blob bytes (with prefetch_bytes only)
        self._scheduled = False

    def room(self) -> int:
        if self.prefetch_bytes and self.inflight_bytes >= self.prefetch_bytes:
            return 0
        if not self.prefetch:
            return self.credit
        flow = self.queue.limits.consumer_flow_limit  # the destination's cap on the window
        return (flow if 0 < flow < self.prefetch else self.prefetch) - len(self.inflight)

    def taken(self, tags: list[int]) -> list[Envelope]:
        """Take ``tags`` out of the in-flight messages (CONSUMED, RETURN)."""
        inflight = self.inflight
        if self.prefetch_bytes:
            sizes = self.sizes
            self.inflight_bytes -= sum(sizes.pop(t, 0) for t in tags)
        return [inflight.pop(t) for t in tags if t in inflight]

    # called by the broker under its lock, from any thread
    def can_take(self, message: Message | None) -> bool:
        return self.room() > 0 and not self.client.paused and super().can_take(message)

    def notify(self) -> None:
        self.schedule()

    def schedule(self) -> None:
        if not self._scheduled and not self.closed:
            self._scheduled = True
            self.client.post(self.pump)

    def pump(self) -> None:
        """Deliver while the window has room; then wait in the queue for the next message."""
        self._scheduled = False
        client = self.client
        if self.closed or client.closed:
            return
        out = []
        broker, inflight, tags = self.broker, self.inflight, self.remote.tags
        while self.room() > 0 and not client.paused:
            env = broker.receive(self, 0, False)
            if env is None:
                with broker.lock:  # park, then look once more: no wake-up can be missed
                    if self not in self.queue.waiters:
                        self.queue.waiters.append(self)
                env = broker.receive(self, 0, False)
                if env is None:
                    break
            tag = next(tags)
            inflight[tag] = env
            if not self.prefetch:
                self.credit -= 1
            blob = env.wire if env.wire is not None else codec.encode(env.message)
            if self.prefetch_bytes:
                self.sizes[tag] = len(blob)
                self.inflight_bytes += len(blob)
            out.append(wire.delivery(self.cid, tag, env.dcount, blob))
        if out:
            client._out.append(b"".join(out))

    def give_back(self, seen: bool) -> None:
        """Return in-flight messages to the queue; ``seen=False``: as never delivered."""
        envs = list(self.inflight.values())
        self.inflight.clear()
        self.sizes.clear()
        self.inflight_bytes = 0
        self.credit = 0
        if not seen:
            for env in envs:
                env.dcount -= 1
        if envs:
            self.broker.redeliver(envs)

    def close(self) -> None:
        if not self.closed:
            self.give_back(seen=True)
            with self.broker.lock:  # unpark: the queue keeps waiters that cannot take
                waiters = self.queue.waiters
                while self in waiters:
                    waiters.remove(self)
        super().close()


_NO_CALLS: tuple[BlockingCall, ...] = ()


class ClientConnection:
    """One remote client's connection (see the module notes). Not thread-safe: the loop
    owns it; other threads reach it through ``post`` only."""

    def __init__(
        self,
        broker: Broker,
        *,
        authenticate: Authenticate,
        post: Post,
        access: AccessControls | None = None,
        locate: Locate | None = None,
        brokerid: str | None = None,
        heartbeat: float = 30.0,
        max_frame: int = wire.DEFAULT_MAX_FRAME,
        peer: str = "?",
        now: float = 0.0,
    ) -> None:
        self.broker = broker
        self.post = post
        self.peer = peer
        self.heartbeat = heartbeat  # ours, in seconds; HELLO negotiates the interval
        self.max_frame = max_frame
        self.embedded: EmbeddedConnection | None = None
        self.user: str | None = None
        self.login_user: str | None = None  # the user HELLO names, authenticated or not
        self.principal = Principal(None, address=peer, service=SERVICE)
        self.interval = 0.0  # the negotiated heart-beat interval, once OPEN
        self.refusal: JMSException | None = None
        self.paused = False  # the socket takes nothing more for now
        self.sessions: dict[int, RemoteSession] = {}
        self.consumers: dict[int, RemoteConsumer] = {}
        self.browsers: dict[int, Iterator[Message]] = {}  # read as the client asks
        self._authenticate = authenticate
        self._locate = locate
        self.brokerid = brokerid  # HA: told in HELLO's answer (a client's next HELLO names it)
        self._moved: tuple[str, str] | JMSException | None = None  # HELLO's home, located
        self._access = access.get(SERVICE) if access is not None else None
        self._wire = wire.Wire(wire.Role.SERVER, max_frame)
        self._state = State.HANDSHAKE
        self._reading = True  # HANDSHAKE or OPEN: requests are handled
        self._closing = False  # CLOSE handled: CLOSED once its reply is queued
        self._browser_ids = itertools.count(1)
        self._out: list[bytes] = [wire.PREAMBLE]
        self._calls: list[BlockingCall] = []
        self._durable: list[tuple[int, int | None, int | Sent]] = []  # (call, sid, ticket) answered once durable
        self._durable_wait = False  # a blocking call waits for the store for some of them
        self._last_read = self._last_write = now
        self._held: wire.Request | None = None  # a SEND the broker holds, sent again on resume_held
        self._hold: Callable[[Callable[[], None]], None] | None = None  # ... its on_room, for take_hold

    # --- the driver's interface ------------------------------------------------------------
    @property
    def state(self) -> State:
        return self._state

    @state.setter
    def state(self, state: State) -> None:
        self._state = state
        self._reading = state is State.HANDSHAKE or state is State.OPEN

    @property
    def closed(self) -> bool:
        """Nothing more is read or handled: write what is queued, then close the socket."""
        return self._state is State.CLOSED

    def receive_data(self, data: bytes | memoryview, now: float) -> None:
        """Bytes from the client: handle every complete request they finish."""
        self._last_read = now
        self._wire.receive_data(data)
        self._process()

    @property
    def has_output(self) -> bool:
        return bool(self._out)

    def data_to_send(self, now: float) -> bytes:
        """Everything to write, as one write (a system call wakes the client, which costs
        more than the bytes)."""
        out = self._out
        if not out:
            return b""
        self._last_write = now
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        return data

    def take_calls(self) -> Sequence[BlockingCall]:
        """The blocking calls to start now. One waits for the store for everything to be
        answered once durable; what comes while it waits is waited for by the next, when it
        is done (one pool job per store batch, not one per read)."""
        if self._durable and not self._durable_wait:
            waiting, self._durable = self._durable, []
            self._durable_wait = True
            tickets = [t for _, _, t in waiting]
            self._calls.append(
                BlockingCall(
                    partial(self.broker.wait_all, tickets),
                    partial(self._durable_done, waiting),
                    partial(self.broker.write_now, tickets),
                )
            )
        if not self._calls:
            return _NO_CALLS
        calls, self._calls = self._calls, []
        return calls

    def take_hold(self) -> Callable[[Callable[[], None]], None] | None:
        """The broker holds a send: stop reading, and pass the returned function a callback
        that runs ``resume_held`` on the loop (from any thread, once)."""
        hold, self._hold = self._hold, None
        return hold

    @property
    def held(self) -> bool:
        return self._held is not None

    def resume_held(self, now: float) -> None:
        """Send the held request again, then handle what was read meanwhile."""
        req, self._held = self._held, None
        if req is None or self.closed:
            return
        self._last_read = now
        self._request(req)
        self._process()

    def complete(self, call: BlockingCall, result: Any, exc: BaseException | None = None) -> None:
        """A call of ``take_calls`` is done (``exc``: it raised)."""
        if not self.closed:
            call.done(result, exc)

    def set_writable(self, writable: bool) -> None:
        """Transport flow control: consumers take nothing while the socket is full."""
        self.paused = not writable
        if writable:
            for consumer in self.consumers.values():
                consumer.schedule()

    def tick(self, now: float) -> None:
        """Heart-beats: fail a client silent for three intervals; beat when we were quiet."""
        if self._state is not State.OPEN:
            return
        if self._held is not None:  # we are not reading: the silence is ours
            self._last_read = now
        silent = now - self._last_read
        if silent > 3 * self.interval:
            log.warning("jms client %s sent nothing for %.1f s; taking it for dead", self.peer, silent)
            self.fail(TransportException(f"no heart-beat from the client for {silent:.1f} s"))
        elif now - self._last_write >= self.interval * 0.9:
            self._out.append(wire.HEARTBEAT)

    def handshake_expired(self, timeout: float) -> None:
        """The driver's handshake timer ran out: fail unless HELLO was accepted."""
        if self.embedded is None and not self.closed:
            self.fail(wire.ProtocolError(f"no HELLO within {timeout:g} s"))

    def fail(self, exc: JMSException) -> None:
        """Tell the client why (a fatal ERROR frame) and stop; the driver closes the socket."""
        if self.closed:
            return
        self._out.append(wire.failure(0, exc, fatal=True))
        self.state = State.CLOSED

    def connection_lost(self, exc: BaseException | None = None) -> None:
        """The socket is gone: closing the embedded connection gives back what the client held."""
        self.state = State.CLOSED
        self._calls.clear()
        self._durable.clear()
        conn, self.embedded = self.embedded, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                log.exception("jms client %s: releasing its connection failed", self.peer)
            log.info("jms client %s (user %s) disconnected%s", self.peer, self.user, f": {exc}" if exc else "")

    # --- processing --------------------------------------------------------------------------
    def _process(self) -> None:
        """Handle every complete request received (until the state stops reading)."""
        wire_ = self._wire
        try:
            while self._reading and self._held is None and (event := wire_.next_event()) is not None:
                if event.__class__ is wire.Request:
                    self._request(event)
        except wire.ProtocolError as exc:
            log.warning("jms client %s broke the protocol: %s", self.peer, exc)
            self.fail(exc)
            return
        if self._closing:
            self.state = State.CLOSED

    def _request(self, req: wire.Request) -> None:
        op = req.op
        if op is _HELLO:
            self._hello(req)
            return
        sid = req.args[0] if op in _SESSION_OPS else None
        try:
            result = HANDLERS[op](self, *req.args)
        except ProducerFlowControl as held:
            self._held, self._hold = req, held.on_room
            return
        except JMSException as exc:
            self._answer_error(req.call, sid, exc)
            return
        except Exception as exc:  # a bug here must not take the service down
            log.exception("jms client %s: %s failed", self.peer, op.name)
            self._answer_error(req.call, sid, JMSException(f"internal error in {op.name}: {exc}"))
            return
        if result.__class__ is Durable:
            self._durable.append((req.call, sid, result.ticket))
        elif result.__class__ is Deferred:
            self._calls.append(BlockingCall(result.fn, partial(self._answer, req.call, sid)))
        elif req.call:
            self._out.append(wire.reply(req.call, result))

    def _answer_error(self, call: int, sid: int | None, exc: JMSException) -> None:
        if call:
            self._out.append(wire.failure(call, exc))
            return
        session = self.sessions.get(sid) if sid is not None else None
        if session is not None and session.s._work_now() is not None:
            session.failed = session.failed or exc  # its commit (or XA end) fails with it
            return
        self._out.append(wire.failure(0, exc, session=sid))

    def _answer(self, call: int, sid: int | None, result: Any, exc: BaseException | None) -> None:
        if exc is None:
            if call:
                self._out.append(wire.reply(call, result))
        elif isinstance(exc, JMSException):
            self._answer_error(call, sid, exc)
        else:
            log.error("jms client %s: request failed", self.peer, exc_info=exc)
            self._answer_error(call, sid, JMSException(f"internal error: {exc}"))

    def _durable_done(
        self, waiting: list[tuple[int, int | None, int | Sent]], result: Any, exc: BaseException | None
    ) -> None:
        self._durable_wait = False
        for call, sid, _ in waiting:
            self._answer(call, sid, None, exc)

    # --- HELLO ---------------------------------------------------------------------------------
    def _hello(self, req: wire.Request) -> None:
        """Authenticate off the loop (checking a password may be slow on purpose); read
        nothing more until that is done."""
        user, password = req.args[:2]
        home = req.args[4] if len(req.args) > 4 else None
        self.login_user = user
        self.state = State.AUTHENTICATING
        self._calls.append(BlockingCall(partial(self._login, user, password, home), partial(self._hello_done, req)))

    def _login(self, user: str | None, password: str | None, home: str | None = None) -> Principal | None:
        """Blocking: the principal of a right password whose user may use this service;
        None for a wrong password; JMSSecurityException when the access rules refuse. Then
        (HA) where the store of ``home``, the client's last broker, is served now."""
        ok = self._authenticate(user, password)
        if not ok:
            return None
        groups = ok.groups if isinstance(ok, Principal) else frozenset()
        principal = Principal(user, groups, self.peer, SERVICE)
        if self._access is not None:
            self._access.check_connection(principal)
        if home and self._locate is not None:
            try:
                self._moved = self._locate(home)
            except JMSException as exc:
                self._moved = exc
        return principal

    def _hello_done(self, req: wire.Request, ok: Any, exc: BaseException | None) -> None:
        user, _, heartbeat_ms, client = req.args[:4]
        if isinstance(exc, JMSSecurityException):  # the access rules refuse the user (logged)
            self.refusal = exc
            self.state = State.REFUSED
            return
        if exc is not None:
            log.error("jms client %s: the authenticator failed", self.peer, exc_info=exc)
        if exc is not None or not ok:
            log.warning("jms client %s (%s): authentication failed for user %r", self.peer, client, user)
            self.refusal = JMSSecurityException(f"authentication failed for user {user!r}")
            self.state = State.REFUSED
            return
        moved = self._moved
        if isinstance(moved, JMSException):  # its home's store is not served anywhere yet
            self.fail(moved)
            return
        if moved is not None:  # served by another instance: the client goes there
            home = req.args[4]
            log.info(
                "jms client %s (%s): broker %s's store is served by broker %s now", self.peer, client, home, moved[0]
            )
            self._wire.open()
            self._out.append(
                wire.reply(
                    req.call,
                    {"rm_id": self.broker.rm_id, "moved": {"home": home, "broker": moved[0], "urls": moved[1]}},
                )
            )
            self.state = State.CLOSED
            return
        try:
            conn = EmbeddedConnection(self.broker, user)
            conn.origin_service, conn.origin_host = SERVICE, self.peer
            self.broker.attach(conn)
        except JMSException as error:
            self.fail(error)
            return
        conn.set_exception_listener(self._broker_gone)
        conn.durable_override = partial(durable_override, self._access, ok)
        self.embedded, self.user, self.principal = conn, user, ok
        self._wire.open()
        mine, theirs = self.heartbeat, heartbeat_ms / 1000
        self.interval = max(MIN_HEARTBEAT, min(x for x in (mine, theirs, 3600.0) if x > 0))
        log.info("jms client %s (%s) connected as %r", self.peer, client, user)
        self._out.append(
            wire.reply(
                req.call,
                {
                    "instance": self.broker.instance_name,
                    "broker": self.brokerid,
                    "rm_id": self.broker.rm_id,
                    "provider": Broker.provider_name,
                    "version": __version__,
                    "protocol": wire.VERSION,
                    "heartbeat_ms": int(self.interval * 1000),
                    "max_frame": self.max_frame,
                    "prefetch_bytes": True,
                    "browser": True,
                },
            )
        )
        self.state = State.OPEN
        self._process()

    def _broker_gone(self, exc: JMSException) -> None:
        self.post(partial(self.fail, exc))

    # --- lookups and checks ---------------------------------------------------------------------
    def _conn(self) -> EmbeddedConnection:
        conn = self.embedded
        assert conn is not None, "requests are handled only after HELLO"
        return conn

    def _session(self, sid: int) -> RemoteSession:
        session = self.sessions.get(sid)
        if session is None:
            raise IllegalStateException(f"session {sid} does not exist (closed?)")
        return session

    def _check(self, operation: str, dest: Destination) -> None:
        """JMSSecurityException unless the access rules let this client ``operation`` ``dest``."""
        access = self._access
        if access is not None:
            access.check(self.principal, operation, dest, self.broker.would_autocreate)

    @staticmethod
    def _give_back_unseen(consumers: Iterable[RemoteConsumer]) -> None:
        for consumer in list(consumers):
            consumer.give_back(seen=False)

    # --- handlers (one per op; arguments as wire.ARGS lists them) ---------------------------------
    def _close(self) -> None:
        conn, self.embedded = self._conn(), None
        self._give_back_unseen(self.consumers.values())
        self.consumers.clear()
        conn.close()
        self._closing = True

    def _set_client_id(self, client_id: str) -> None:
        self._conn().client_id = client_id

    def _start(self) -> None:
        self._conn().start()
        for consumer in self.consumers.values():
            consumer.schedule()

    def _stop(self) -> None:
        self._conn().stop()

    def _new_session(self, sid: int, transacted: bool, ack_mode: int, xa: bool) -> None:
        if sid in self.sessions:
            raise IllegalStateException(f"session {sid} already exists")
        conn = self._conn()
        try:
            mode = AckMode(ack_mode)
        except ValueError:
            raise IllegalStateException(f"unknown acknowledge mode {ack_mode}") from None
        session = conn.create_xa_session() if xa else conn.create_session(transacted, mode)
        self.sessions[sid] = RemoteSession(sid, session)

    def _close_session(self, sid: int) -> None:
        session = self.sessions.pop(sid, None)
        if session is None:
            return
        mine = [c for c in self.consumers.values() if c.remote is session]
        self._give_back_unseen(mine)
        for consumer in mine:
            del self.consumers[consumer.cid]
        session.s.close()

    def _new_consumer(
        self,
        sid: int,
        cid: int,
        dest: Destination,
        selector: str | None,
        no_local: bool,
        durable_name: str | None,
        prefetch: int,
        prefetch_bytes: int = 0,
    ) -> None:
        session = self._session(sid)
        if cid in self.consumers:
            raise IllegalStateException(f"consumer {cid} already exists")
        if not 0 <= prefetch <= MAX_PREFETCH:
            raise IllegalStateException(f"prefetch {prefetch} is outside 0..{MAX_PREFETCH}")
        if prefetch_bytes < 0:
            raise IllegalStateException(f"prefetch bytes {prefetch_bytes} is below 0")
        session.s._check_open()
        self._check("consume", dest)
        consumer = RemoteConsumer(self, session, cid, dest, selector, prefetch, durable_name, prefetch_bytes)
        if durable_name is not None:
            if not isinstance(dest, Topic):
                raise InvalidDestinationException(f"a durable subscription needs a topic, not {dest}")
            consumer.queue = self.broker.durable_queue(consumer, dest, durable_name, selector, no_local)
        else:
            consumer.queue = self.broker.queue_for_consumer(consumer, dest, selector, no_local)
        session.s.consumers.append(consumer)
        self.consumers[cid] = consumer
        consumer.schedule()

    def _new_group_consumer(
        self,
        sid: int,
        cid: int,
        dest: Destination,
        selector: str | None,
        durable_name: str | None,
        prefetch: int,
        group: str,
        retain: bool,
    ) -> None:
        """A connection consumer's consumer (broker.group_queue); its group is this
        connection's, so two clients never share one by naming the same group."""
        session = self._session(sid)
        if cid in self.consumers:
            raise IllegalStateException(f"consumer {cid} already exists")
        if not 0 <= prefetch <= MAX_PREFETCH:
            raise IllegalStateException(f"prefetch {prefetch} is outside 0..{MAX_PREFETCH}")
        session.s._check_open()
        self._check("consume", dest)
        consumer = RemoteConsumer(self, session, cid, dest, selector, prefetch, durable_name)
        consumer.retain = retain
        consumer.queue = self.broker.group_queue(consumer, dest, selector, durable_name, f"{id(self):x}:{group}")
        session.s.consumers.append(consumer)
        self.consumers[cid] = consumer
        consumer.schedule()

    def _close_consumer(self, sid: int, cid: int) -> None:
        consumer = self.consumers.pop(cid, None)
        if consumer is not None:
            consumer.give_back(seen=False)
            consumer.close()

    def _unsubscribe(self, sid: int, name: str) -> Deferred:
        session = self._session(sid)
        return Deferred(partial(session.s.unsubscribe, name))

    def _temp_create(self, sid: int, topic: bool) -> Destination:
        session = self._session(sid).s
        return session.create_temporary_topic() if topic else session.create_temporary_queue()

    def _temp_delete(self, sid: int, dest: Destination) -> None:
        self._session(sid).s.delete_temporary(dest)

    def _send(self, sid: int, blob: bytes) -> Durable | None:
        session = self._session(sid)
        s = session.s
        s._check_open()
        message = codec.decode(blob)
        dest = message.destination
        if dest is None:
            raise InvalidDestinationException("a SEND without a destination header")
        self._check("produce", dest)
        s.producing(dest)
        work = s._work_now()
        if work is None:  # ProducerFlowControl: held (not blocking the loop as s._send would)
            ticket = self.broker.send(s.connection, message, dest, blob)
            return _durable(ticket)
        self.broker.check_room(s.connection, message, dest)
        work.sends.append((message, dest, s.connection, blob))  # routed at commit
        return None

    def _consumed(self, sid: int, cid: int, tags: list[int]) -> None:
        session = self._session(sid)
        consumer = self.consumers.get(cid)
        if consumer is None:
            return  # closed meanwhile: what it had in flight went back already
        envs = consumer.taken(tags)
        s = session.s
        if s._acks_now():
            self.broker.acknowledge(envs)
        else:
            work = s._work_now() or s._work
            individual = s.ack_mode is _INDIVIDUAL and work is s._work
            for tag, env in zip(tags, envs):
                env.owner = work
                work.acks.append(env)
                if individual:
                    session.by_tag[tag] = env
        if consumer.room() >= consumer.refill:
            consumer.schedule()

    def _return(self, sid: int, cid: int, tags: list[int], seen: bool) -> None:
        consumer = self.consumers.get(cid)
        if consumer is None:
            return
        envs = consumer.taken(tags)
        if not seen:
            for env in envs:
                env.dcount -= 1
        self.broker.redeliver(envs)
        consumer.schedule()

    def _pull(self, sid: int, cid: int, n: int) -> None:
        consumer = self.consumers.get(cid)
        if consumer is None:
            return
        if n < 0:
            consumer.credit = 0
        elif n > 0:
            consumer.credit += n if not consumer.prefetch else 0
            consumer.schedule()
        elif consumer.prefetch:  # n == 0: deliver now, before this request's reply
            consumer.pump()
        else:
            consumer.credit = 1
            consumer.pump()
            consumer.credit = 0

    def _acknowledge(self, sid: int) -> Durable | None:
        session = self._session(sid)
        session.by_tag.clear()
        return _durable(self.broker.acknowledge_work(session.s._work))

    def _ack_oldest(self, sid: int, count: int) -> Durable | None:
        """CLIENT_ACKNOWLEDGE of the ``count`` oldest consumed messages (in CONSUMED order)."""
        session = self._session(sid)
        return _durable(self.broker.acknowledge_work(session.s._work, oldest=count))

    def _ack_one(self, sid: int, tag: int) -> Durable | None:
        session = self._session(sid)
        env = session.by_tag.pop(tag, None)
        return None if env is None else _durable(self.broker.acknowledge_work(session.s._work, env))

    def _restart_session(self, session: RemoteSession, undo: Callable[[], None]) -> None:
        """recover/rollback: in-flight messages go back unseen, then the session's work is undone."""
        mine = [c for c in self.consumers.values() if c.remote is session]
        self._give_back_unseen(mine)
        session.by_tag.clear()
        session.failed = None
        undo()
        for consumer in mine:
            consumer.schedule()

    def _recover(self, sid: int) -> None:
        session = self._session(sid)
        self._restart_session(session, session.s.recover)

    def _rollback(self, sid: int) -> None:
        session = self._session(sid)
        self._restart_session(session, session.s.rollback)

    def _commit(self, sid: int) -> Durable | None:
        session = self._session(sid)
        if session.failed is not None:
            failed = session.failed
            self._rollback(sid)
            raise TransactionRolledBackException(
                f"the transaction was rolled back because a send in it failed: {failed}"
            )
        ticket = session.s.commit_no_wait()
        return _durable(ticket)

    def _browser(self, sid: int, queue: Queue, selector: str | None) -> None:
        """Session.create_browser: refused here, at creation, not when first iterated."""
        session = self._session(sid).s
        session._check_open()
        self._check("browse", queue)
        session.create_browser(queue, selector).close()

    def _browse(self, sid: int, queue: Queue, selector: str | None) -> list[Any]:
        self._session(sid).s._check_open()
        self._check("browse", queue)
        messages = self.broker.browse(queue, self.broker.compile_selector(selector))
        bid = next(self._browser_ids)
        self.browsers[bid] = messages
        return [bid, *self._browse_more(bid)]

    def _browse_more(self, bid: int) -> list[Any]:
        messages = self.browsers.get(bid)
        if messages is None:
            raise IllegalStateException(f"browser {bid} is closed")
        page: list[bytes] = []
        size = 0
        done = False
        while len(page) < BROWSE_PAGE_MESSAGES and size < BROWSE_PAGE_BYTES:
            message = next(messages, None)
            if message is None:
                done = True
                break
            blob = codec.encode(message)
            page.append(blob)
            size += len(blob)
        if done:
            del self.browsers[bid]
        return [page, done]

    def _browse_close(self, bid: int) -> None:
        self.browsers.pop(bid, None)

    def _xa_session(self, sid: int) -> EmbeddedXASession:
        s = self._session(sid).s
        if not isinstance(s, EmbeddedXASession):
            raise IllegalStateException(f"session {sid} is not an XA session")
        return s

    def _xa_start(self, sid: int, xid: Xid, flags: int) -> None:
        self._xa_session(sid).xa_resource.start(xid, flags)

    def _xa_end(self, sid: int, xid: Xid, flags: int) -> None:
        s = self._xa_session(sid)
        session = self.sessions[sid]
        failed, session.failed = session.failed, None
        if failed is not None and not flags & xa.TMFAIL:
            s.xa_resource.end(xid, xa.TMFAIL)
            raise XAException(
                f"end: branch {xid} is rollback-only because a send in it failed: {failed}", xa.XA_RBROLLBACK
            )
        s.xa_resource.end(xid, flags)

    def _xa_prepare(self, xid: Xid) -> Deferred:
        return Deferred(partial(self.broker.xa_prepare, xid))

    def _xa_commit(self, xid: Xid, one_phase: bool) -> Deferred:
        return Deferred(partial(self.broker.xa_commit, xid, one_phase))

    def _xa_rollback(self, xid: Xid) -> Deferred:
        return Deferred(partial(self.broker.xa_rollback, xid))

    def _xa_recover(self, flags: int) -> Deferred:
        # (off the loop: on an HA instance it reads the peers' stores, clusterxa.py)
        return Deferred(lambda: [[x.format_id, x.gtrid, x.bqual] for x in self.broker.xa_recover()])

    def _xa_forget(self, xid: Xid) -> None:
        self.broker.xa_forget(xid)


HANDLERS: dict[wire.Op, Callable[..., Any]] = {
    wire.Op.CLOSE: ClientConnection._close,
    wire.Op.SET_CLIENT_ID: ClientConnection._set_client_id,
    wire.Op.START: ClientConnection._start,
    wire.Op.STOP: ClientConnection._stop,
    wire.Op.SESSION: ClientConnection._new_session,
    wire.Op.SESSION_CLOSE: ClientConnection._close_session,
    wire.Op.CONSUMER: ClientConnection._new_consumer,
    wire.Op.CONSUMER_CLOSE: ClientConnection._close_consumer,
    wire.Op.GROUP_CONSUMER: ClientConnection._new_group_consumer,
    wire.Op.UNSUBSCRIBE: ClientConnection._unsubscribe,
    wire.Op.TEMP_CREATE: ClientConnection._temp_create,
    wire.Op.TEMP_DELETE: ClientConnection._temp_delete,
    wire.Op.SEND: ClientConnection._send,
    wire.Op.CONSUMED: ClientConnection._consumed,
    wire.Op.RETURN: ClientConnection._return,
    wire.Op.PULL: ClientConnection._pull,
    wire.Op.ACKNOWLEDGE: ClientConnection._acknowledge,
    wire.Op.ACK_ONE: ClientConnection._ack_one,
    wire.Op.ACK_OLDEST: ClientConnection._ack_oldest,
    wire.Op.RECOVER: ClientConnection._recover,
    wire.Op.COMMIT: ClientConnection._commit,
    wire.Op.ROLLBACK: ClientConnection._rollback,
    wire.Op.BROWSER: ClientConnection._browser,
    wire.Op.BROWSE: ClientConnection._browse,
    wire.Op.BROWSE_MORE: ClientConnection._browse_more,
    wire.Op.BROWSE_CLOSE: ClientConnection._browse_close,
    wire.Op.XA_START: ClientConnection._xa_start,
    wire.Op.XA_END: ClientConnection._xa_end,
    wire.Op.XA_PREPARE: ClientConnection._xa_prepare,
    wire.Op.XA_COMMIT: ClientConnection._xa_commit,
    wire.Op.XA_ROLLBACK: ClientConnection._xa_rollback,
    wire.Op.XA_RECOVER: ClientConnection._xa_recover,
    wire.Op.XA_FORGET: ClientConnection._xa_forget,
}

# Ops whose first argument is a session id (an asynchronous failure names it).
_SESSION_OPS = frozenset(
    {
        wire.Op.SEND,
        wire.Op.CONSUMED,
        wire.Op.RETURN,
        wire.Op.SESSION_CLOSE,
        wire.Op.CONSUMER,
        wire.Op.CONSUMER_CLOSE,
        wire.Op.ACKNOWLEDGE,
        wire.Op.ACK_ONE,
        wire.Op.ACK_OLDEST,
        wire.Op.COMMIT,
        wire.Op.ROLLBACK,
        wire.Op.RECOVER,
        wire.Op.GROUP_CONSUMER,
    }
)
