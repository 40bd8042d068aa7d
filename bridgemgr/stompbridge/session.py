"""The STOMP protocol state machine of one connection (sans-IO).

A StompSession is one client connection's protocol state, with no sockets: the server feeds
it bytes (receive_data), takes the bytes to write (data_to_send), runs the blocking calls it
asks for (take_call / complete_call) and ticks it for heart-beats; a test does the same by
hand. States and the frames each accepts are the TRANSITIONS table.

Rules: a receipt confirms work that is done (it waits for the store batch holding the
frame's persistent messages); every error inside is a LocalProtocolError that _process()
alone turns into an ERROR frame, after which the connection closes.

Design notes: docs/stomp-bridge.md#internals-stompbridgesessionpy.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from functools import partial
from typing import Any

from ..jms.destination import Destination
from ..jms.errors import JMSException, ProducerFlowControl
from ..jms.hostbroker import Delivery as Handle
from ..jms.hostbroker import Ticket, Transaction
from ..jms.message import Message
from ..logfiles import PER_MESSAGE
from ..transform import MessageTransformer
from ..version import __version__
from .convert import (
    NAMES_DROP,
    NAMES_ENCODE,
    Destinations,
    MessageRenderer,
    NotDeliverable,
    TransformFailed,
    from_send,
)
from .frames import (
    ABORT,
    ACK,
    BEGIN,
    COMMIT,
    CONNECT,
    CONNECTED,
    DEFAULT_LIMITS,
    DISCONNECT,
    ERROR,
    HEARTBEAT,
    NACK,
    PRE_CONNECT,
    RECEIPT,
    SEND,
    STOMP,
    SUBSCRIBE,
    UNSUBSCRIBE,
    V10,
    V11,
    V12,
    VERSIONS,
    Frame,
    HeaderNotEncodable,
    Limits,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    encode_frame,
    parse_frame,
)
from .host import HostConnection, Subscriber

log = logging.getLogger("imq.bridge.stomp.session")  # the STOMP bridge's log: bridges/stomp/log.txt


class State(Enum):
    AWAIT_CONNECT = "waiting for CONNECT"
    AUTHENTICATING = "authenticating"
    CONNECTED = "connected"
    CLOSED = "closed"
    ERROR = "closed after an error"


_READING = (State.AWAIT_CONNECT, State.CONNECTED)  # frames are read (not closed, not authenticating)
_IN_SESSION = dict.fromkeys((SEND, SUBSCRIBE, UNSUBSCRIBE, ACK, NACK, BEGIN, COMMIT, ABORT), State.CONNECTED)
TRANSITIONS: dict[State, dict[str, State]] = {
    State.AWAIT_CONNECT: {CONNECT: State.AUTHENTICATING, STOMP: State.AUTHENTICATING},
    State.CONNECTED: {**_IN_SESSION, DISCONNECT: State.CLOSED},
}
MIN_VERSION = {NACK: V11}
REQUIRED = {
    CONNECT: ("login", "passcode"),
    STOMP: ("login", "passcode"),
    SEND: ("destination",),
    SUBSCRIBE: ("destination",),
    BEGIN: ("transaction",),
    COMMIT: ("transaction",),
    ABORT: ("transaction",),
}
ACK_MODES = ("auto", "client", "client-individual")
DEFAULT_ID_PREFIX = "/subscription-to/"
SUPPORTED = ",".join(VERSIONS)
SEND_RUN = 64  # SENDs of a read sent in one broker call at most (the broker's lock held that long)


@dataclass(frozen=True)
class SessionConfig:
    """Per-connection settings (from the broker properties; see StompConfig)."""

    consumer_flow_limit: int = 1000
    heart_beat: tuple[int, int] = (1000, 1000)  # ms: we can send every / want to receive every
    heart_beat_grace: float = 2.0  # a peer is dead after this many missed intervals
    limits: Limits = DEFAULT_LIMITS
    server: str = f"imqbridge/{__version__}"
    transformer: Callable[[], MessageTransformer] | None = None  # one instance per thread
    invalid_header_names: str = NAMES_ENCODE  # imq.bridge.stomp.invalidHeaderNames


@dataclass(slots=True)
class Delivery:
    """One message rendered for a subscription (on its thread), waiting for the loop."""

    ack_no: int
    handle: Handle  # the host broker's delivery: acknowledged or redelivered through it
    message_id: str
    data: bytes | None  # the encoded MESSAGE frame; None when it cannot be delivered
    error: str = ""


@dataclass(eq=False)
class Subscription:
    id: str
    ack: str
    transacted: bool
    durable_name: str | None
    handle: Subscriber | None = None
    outstanding: dict[int, Delivery] = field(default_factory=dict)  # ack_no -> delivered, unacked
    by_message_id: dict[str, int] = field(default_factory=dict)
    held: int = 0  # transacted: ACKed in the open transaction, credit returns at commit
    closed: bool = False

    @property
    def auto(self) -> bool:
        return self.ack == "auto" and not self.transacted

    def take(self, ack_no: int, cumulative: bool) -> list[Delivery]:
        """Remove ``ack_no`` (and, cumulative, every earlier delivery) from outstanding."""
        if not cumulative:
            return [self.take_one(ack_no)]
        keys = list(itertools.takewhile(lambda k: k <= ack_no, self.outstanding))
        return [self.take_one(k) for k in keys]

    def take_one(self, ack_no: int) -> Delivery:
        """Remove delivery ``ack_no`` from outstanding (the per-message ACK's path)."""
        d = self.outstanding.pop(ack_no)
        if self.by_message_id.get(d.message_id) == ack_no:
            del self.by_message_id[d.message_id]
        return d

    def take_all(self) -> list[Delivery]:
        taken = list(self.outstanding.values())
        self.outstanding.clear()
        self.by_message_id.clear()
        return taken


@dataclass
class PendingCall:
    """A blocking call the driver must run off the loop, then report to complete_call().
    With ``wait`` the driver may instead hand ``wait`` a callback (called once, from any
    thread) and complete the call when it runs: no thread waits."""

    fn: Callable[[], Any]
    done: Callable[[Any], None]
    frame: Frame | None
    wait: Callable[[Callable[[], None]], None] | None = None
    quick: Callable[[], bool] | None = None  # tried on the loop first: True when fn now returns at once


def _wait_blocking(on_room: Callable[[Callable[[], None]], None]) -> None:
    """``fn`` of a held send, for a driver that runs every call in a thread."""
    ready = threading.Event()
    on_room(ready.set)
    ready.wait()


def _send_failed(frame: Frame, why: JMSException) -> LocalProtocolError:
    """The ERROR for a SEND the broker refused (other than holding it)."""
    return LocalProtocolError("send failed", f"SEND to {frame.get('destination')}: {why}")


@dataclass(slots=True)
class Queued:
    """A SEND waiting in _process's run: converted, or the error converting it gave."""

    frame: Frame
    message: Message | None
    destination: Destination | None
    error: LocalProtocolError | None = None


class Held:
    """A handler's answer when the broker holds the producer: ``retry`` after ``wait``
    (the send again, of what the frame was converted to: not converted twice)."""

    def __init__(self, wait: Callable[[Callable[[], None]], None], retry: Callable[[], Any]) -> None:
        self.wait = wait
        self.retry = retry


class Blocking:
    """A handler's answer: finish this call off the loop first; its result is the ticket."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn


class StompSession:
    """One STOMP connection's protocol state. Not thread-safe: the loop owns it."""

    def __init__(
        self,
        config: SessionConfig,
        *,
        authenticate: Callable[[str, str], object | None],
        open_host: Callable[[str | None, str], HostConnection],
        session_id: str,
        now: float = 0.0,
    ) -> None:
        self.config = config
        self.session_id = session_id
        self.state = State.AWAIT_CONNECT
        self.version: str | None = PRE_CONNECT
        self.error: RemoteProtocolError | None = None
        self.host: HostConnection | None = None
        self.destinations: Destinations | None = None
        self.subscriptions: dict[str, Subscription] = {}
        self.send_every = 0  # ms between our heart-beats; 0: none
        self.expect_every = 0  # ms between the client's heart-beats; 0: not checked
        self._authenticate = authenticate
        self._open_host = open_host
        self._buffer = bytearray()
        self._out: list[bytes] = []
        self._call: PendingCall | None = None
        self._running: PendingCall | None = None
        self._tx: tuple[str, Transaction] | None = None  # (transaction id, the host broker's)
        self._queued: list[Queued] = []  # SENDs parsed and converted, to send together (_process)
        self._acked: list[Handle] = []  # ACKed in this read's ACK run, not yet acknowledged (_process)
        self._acked_per_sub: dict[Subscription, int] = {}  # ... and the credit they return
        self._last_ticket: Ticket = None
        self._ack_numbers = itertools.count(1)
        self._inbound_transformer: MessageTransformer | None = None
        self._dropped_logged = False  # invalidHeaderNames=drop: one warning per connection
        self._last_received = self._last_sent = now

    # --- the driver's interface ----------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self.state in (State.CLOSED, State.ERROR)

    def receive_data(self, data: bytes, now: float) -> None:
        """Bytes from the client (b"" is not EOF here: use connection_lost)."""
        self._last_received = now
        if self.closed:
            return
        self._buffer += data
        self._process()

    def data_to_send(self, now: float) -> bytes:
        """Everything to write, as one write."""
        if not self._out:
            return b""
        self._last_sent = now
        data = self._out[0] if len(self._out) == 1 else b"".join(self._out)
        self._out.clear()
        return data

    def take_call(self) -> PendingCall | None:
        """The blocking call to run now, if any (frame processing waits for it)."""
        call, self._call = self._call, None
        if call is not None:
            self._running = call
        return call

    @property
    def waiting(self) -> bool:
        """A blocking call is pending or running: the driver should stop reading."""
        return self._call is not None or self._running is not None

    def complete_call(self, result: Any, exc: BaseException | None = None) -> None:
        call, self._running = self._running, None
        if call is None or self.closed:
            return
        try:
            if isinstance(exc, LocalProtocolError):
                raise exc
            if exc is not None:
                raise LocalProtocolError("operation failed", str(exc)) from exc
            call.done(result)
        except LocalProtocolError as error:
            self._fail(error, call.frame)
            return
        self._process()

    def connection_lost(self) -> None:
        self._shutdown(State.CLOSED)

    def fail(self, message: str, detail: str) -> None:
        """Close from our side with an ERROR frame (the bridge is stopping, ...)."""
        self._fail(LocalProtocolError(message, detail))

    def set_writable(self, writable: bool) -> None:
        """Transport flow control: subscribers stop taking messages while it is full."""
        for sub in self.subscriptions.values():
            if sub.handle is not None:
                sub.handle.set_writable(writable)

    def tick(self, now: float) -> None:
        """Heart-beats: send one when we have been quiet; fail a silent client."""
        if self.state is not State.CONNECTED:
            return
        if self.waiting:  # we are not reading (a held send, a store wait): the silence is ours
            self._last_received = now
        elif self.expect_every and now - self._last_received > self.expect_every / 1000 * self.config.heart_beat_grace:
            self._fail(
                LocalProtocolError(
                    "heart-beat timeout",
                    f"nothing received for "
                    f"{int((now - self._last_received) * 1000)} ms; the "
                    f"negotiated heart-beat is {self.expect_every} ms",
                )
            )
        elif self.send_every and now - self._last_sent >= self.send_every / 1000 and not self._out:
            self._out.append(HEARTBEAT)

    @property
    def tick_interval(self) -> float | None:
        """Seconds between tick() calls the server should make, or None for none."""
        beats = [b for b in (self.send_every, self.expect_every) if b]
        return min(beats) / 2000 if beats else None

    # --- processing ---------------------------------------------------------------------
    def _process(self) -> None:
        """Handle the buffered frames in order; a run of SENDs (outside a transaction) is
        queued converted and sent together (_send_queued), before any other frame, at a
        receipt, at SEND_RUN frames and when the buffer holds no whole frame more."""
        if self._queued:  # what a held send left of its run goes first
            self._send_queued()
        pos = 0
        buffer, limits, queued = self._buffer, self.config.limits, self._queued
        try:
            while self._call is None and self._running is None and self.state in _READING:
                start = pos
                try:
                    frame, pos = parse_frame(buffer, pos, self.version, limits)
                except LocalProtocolError:
                    if queued:  # the SENDs before the bad frame go first; its ERROR after them
                        self._send_queued()
                        if self.waiting or self.closed:
                            break
                    raise
                if frame is None:
                    break
                headers = frame.headers
                command = frame.command
                if (
                    command == SEND
                    and self.state is State.CONNECTED
                    and "destination" in headers
                    and "transaction" not in headers
                ):
                    if self._acked:
                        self._acknowledge_run()
                    try:
                        queued.append(Queued(frame, *self._convert(frame)))
                    except LocalProtocolError as exc:
                        queued.append(Queued(frame, None, None, exc))
                    if len(queued) >= SEND_RUN or queued[-1].error is not None:
                        self._send_queued()
                    continue
                if queued:
                    self._send_queued()
                    if self.waiting or self.closed:  # held: this frame waits its turn
                        pos = start
                        break
                if (
                    command == ACK
                    and self.state is State.CONNECTED
                    and "receipt" not in headers
                    and "transaction" not in headers
                ):
                    try:
                        if self._take_acked(frame):
                            continue
                    except LocalProtocolError as exc:
                        self._fail(exc, frame)  # (_shutdown acknowledges the run's earlier ACKs first)
                        continue
                if self._acked:
                    self._acknowledge_run()
                try:
                    self._handle(frame)
                except LocalProtocolError as exc:
                    self._fail(exc, frame)
            if queued:
                self._send_queued()
        except LocalProtocolError as exc:
            self._fail(exc)
        finally:
            if self._acked:
                self._acknowledge_run()
            if pos:
                del self._buffer[:pos]

    def _send_queued(self) -> None:
        """Send the queued SENDs in runs, each in one broker call (HostBroker.send_many),
        each frame as _handle would: a run ends at a frame that failed to convert (its
        ERROR follows the sends before it). The receipts its frames ask for wait for the
        run's ticket together (one store write for a pipelining client's whole read), then
        go in frame order. A send the broker refuses comes after the receipts of those
        before it; one it holds waits as a Held call, those after it queued until it is
        sent. A receipt-less run's ticket pauses processing while the store is behind, as
        one frame's does."""
        queued, host = self._queued, self.host
        assert host is not None
        while queued and not self.waiting and self.state is State.CONNECTED:
            head = queued[0]
            if head.error is not None:
                queued.clear()
                self._fail(head.error, head.frame)
                return
            run: list[tuple[Message, Destination]] = []
            for q in queued:
                if q.error is not None:
                    break
                assert q.message is not None and q.destination is not None
                run.append((q.message, q.destination))
            try:
                ticket, sent, refused = host.send_many(run)
            except JMSException as exc:  # the broker failed under the run (its store)
                queued.clear()
                self._fail(_send_failed(head.frame, exc), head.frame)
                return
            if ticket is not None:
                self._last_ticket = ticket
            receipts = [q.frame for q in queued[:sent] if "receipt" in q.frame.headers]
            del queued[:sent]
            if receipts or ticket is not None:
                self._confirm_run(receipts, ticket)
                if self.waiting:
                    continue  # the refused send, if any, is sent again once they are out
            if refused is None:
                continue
            q = queued.pop(0)
            assert q.message is not None and q.destination is not None
            if isinstance(refused, ProducerFlowControl):
                self._confirm(
                    q.frame,
                    Held(refused.on_room, partial(self._send, q.frame, None, q.message, q.destination)),
                    State.CONNECTED,
                )
            else:
                queued.clear()
                self._fail(_send_failed(q.frame, refused), q.frame)

    def _handle(self, frame: Frame) -> None:
        next_state = TRANSITIONS.get(self.state, {}).get(frame.command)
        if next_state is None:
            raise LocalProtocolError(
                f"unexpected {frame.command}",
                f"{frame.command} is not allowed while the connection is "
                f"{self.state.value}" + (" (send CONNECT first)" if self.state is State.AWAIT_CONNECT else ""),
            )
        minimum = MIN_VERSION.get(frame.command)
        if minimum and self.version is not None and VERSIONS.index(self.version) < VERSIONS.index(minimum):
            raise LocalProtocolError(
                f"unexpected {frame.command}",
                f"{frame.command} needs STOMP {minimum} or later; this connection speaks {self.version}",
            )
        headers = frame.headers
        for name in REQUIRED.get(frame.command, ()):
            if name not in headers:
                raise LocalProtocolError(f"missing {name}", f"{frame.command} requires the {name} header")
        result = HANDLERS[frame.command](self, frame)
        if next_state is State.AUTHENTICATING:
            self.state = next_state
        elif result is not None or next_state is not State.CONNECTED or "receipt" in headers:
            self._confirm(frame, result, next_state)
        # else (a SEND, ACK, ... done, no receipt asked for): nothing to confirm

    def _confirm(self, frame: Frame, result: Any, next_state: State) -> None:
        """Send the receipt once the frame's work is durable, then move on."""
        if isinstance(result, Blocking):
            self._call = PendingCall(result.fn, lambda ticket: self._confirm(frame, ticket, next_state), frame)
            return
        if isinstance(result, Held):
            retry = result.retry
            self._call = PendingCall(
                partial(_wait_blocking, result.wait),
                lambda _: self._confirm(frame, retry(), next_state),
                frame,
                result.wait,
            )
            return
        receipt = frame.headers.get("receipt")
        if result is not None and self.host is not None and (receipt is not None or self.host.store_behind()):
            self._call = PendingCall(
                partial(self.host.wait_durable, result),
                lambda _: self._confirm(frame, None, next_state),
                frame,
                quick=partial(self.host.write_now, result),
            )
            return
        if receipt is not None:
            self._emit(Frame(RECEIPT, {"receipt-id": receipt}))
        if next_state is State.CLOSED:
            self._shutdown(State.CLOSED)

    def _confirm_run(self, receipts: list[Frame], ticket: Ticket) -> None:
        """The receipts of a run of SENDs, in order, once ``ticket`` is durable (a wait
        that fails is the ERROR of the first of them). Without receipts the ticket pauses
        processing only while the store is behind."""
        host = self.host
        if ticket is not None and host is not None and (receipts or host.store_behind()):
            self._call = PendingCall(
                partial(host.wait_durable, ticket),
                lambda _: self._confirm_run(receipts, None),
                receipts[0] if receipts else None,
                quick=partial(host.write_now, ticket),
            )
            return
        for frame in receipts:
            self._emit(Frame(RECEIPT, {"receipt-id": frame.headers["receipt"]}))

    def _emit(self, frame: Frame) -> None:
        self._out.append(encode_frame(frame, self.version))

    def _fail(self, exc: ProtocolError, frame: Frame | None = None) -> None:
        """Answer with ERROR and close for good (the one place a local error becomes remote)."""
        if self.closed:
            return
        self.error = RemoteProtocolError(exc.message, exc.detail)
        body = exc.detail.encode("utf-8")
        headers = {"message": exc.message, "content-type": "text/plain;charset=utf-8", "content-length": str(len(body))}
        if frame is not None and frame.get("receipt") is not None:
            headers["receipt-id"] = frame.headers["receipt"]
        if exc.message == "unsupported version":
            headers["version"] = SUPPORTED
        self._emit(Frame(ERROR, headers, body))
        log.info(
            "STOMP session %s: ERROR %s: %s", self.session_id, exc.message, exc.detail, extra=PER_MESSAGE
        )  # one client's: the STOMP bridge's file only
        self._shutdown(State.ERROR)

    def _shutdown(self, state: State) -> None:
        if self.closed:
            return
        if self._acked:  # ACKed before the error or the end: consumed, not returned
            try:
                self._acknowledge_run()
            except JMSException as exc:  # the broker went away under us
                log.warning("STOMP session %s: acknowledging: %s", self.session_id, exc)
        self.state = state
        self._call = None
        self._queued.clear()
        for sub in list(self.subscriptions.values()):
            self._close_subscription(sub)
        host = self.host
        if host is not None:
            try:
                if self._tx is not None:
                    host.rollback(self._tx[1])
                host.close()
            except JMSException as exc:  # the broker went away under us: nothing left to return
                log.warning("STOMP session %s: closing: %s", self.session_id, exc)
        self._tx = None

    # --- CONNECT ----------------------------------------------------------------------------
    def _on_connect(self, frame: Frame) -> None:
        self.version = _negotiate_version(frame.get("accept-version"))
        if self.version != V10:
            self.send_every, self.expect_every = _negotiate_heart_beat(frame.get("heart-beat"), self.config.heart_beat)
        login, passcode = frame.headers["login"], frame.headers["passcode"]
        self._call = PendingCall(
            partial(self._authenticate, login, passcode), partial(self._authenticated, frame), frame
        )

    def _authenticated(self, frame: Frame, user: object | None) -> None:
        login = frame.headers["login"]
        if user is None:
            raise LocalProtocolError(
                "authentication failed", f"login {login[:80]!r} with the given passcode is not valid"
            )
        try:
            self.host = self._open_host(frame.get("client-id"), login)
        except JMSException as exc:
            raise LocalProtocolError("connect failed", str(exc)) from exc
        self.destinations = Destinations(self.host.create_temporary)
        if self.config.transformer is not None:
            self._inbound_transformer = self.config.transformer()
        self.state = State.CONNECTED
        sx, sy = self.config.heart_beat if self.version != V10 else (0, 0)
        headers = {
            "version": self.version or V10,
            "session": self.session_id,
            "server": self.config.server,
            "heart-beat": f"{sx},{sy}",
        }
        self._emit(Frame(CONNECTED, headers))
        if frame.get("receipt") is not None:
            self._emit(Frame(RECEIPT, {"receipt-id": frame.headers["receipt"]}))

    # --- SEND and transactions ----------------------------------------------------------------
    def _on_send(self, frame: Frame) -> Ticket | Held:
        """A SEND in a transaction (or one _process did not queue: it fails here)."""
        tx = frame.headers.get("transaction")
        work = self._work(tx) if tx is not None else None
        return self._send(frame, work, *self._convert(frame))

    def _convert(self, frame: Frame) -> tuple[Message, Destination]:
        """A SEND's message and destination (the transformer, if any, sees it now)."""
        assert self.destinations is not None
        mode = self.config.invalid_header_names
        inbound = from_send(frame, self.destinations, self._inbound_transformer, mode)
        if inbound.invalid and mode == NAMES_DROP and self._inbound_transformer is None and not self._dropped_logged:
            self._dropped_logged = True
            log.warning(
                "STOMP session %s: dropping SEND headers that are no JMS property names "
                "(%s; imq.bridge.stomp.invalidHeaderNames=drop; logged once per connection)",
                self.session_id,
                ", ".join(repr(n[:80]) for n in list(inbound.invalid)[:5]),
            )
        return inbound.message, inbound.destination

    def _send(
        self, frame: Frame, work: Transaction | None, message: Message, destination: Destination
    ) -> Ticket | Held:
        """Send a SEND's message (again, when the broker held it: ``frame`` is converted
        once, so a transformer sees each SEND once)."""
        assert self.host is not None
        try:
            if work is not None:
                self.host.send_in(work, message, destination)
                return None
            ticket = self.host.send(message, destination)
        except ProducerFlowControl as held:
            return Held(held.on_room, partial(self._send, frame, work, message, destination))
        except JMSException as exc:
            raise _send_failed(frame, exc) from exc
        if ticket is not None:
            self._last_ticket = ticket
        return ticket

    def _work(self, tx: str) -> Transaction:
        if self._tx is None or self._tx[0] != tx:
            current = f"the open transaction is {self._tx[0]!r}" if self._tx else "no transaction is open"
            raise LocalProtocolError(
                "unknown transaction", f"transaction {tx[:80]!r} has not been started with BEGIN ({current})"
            )
        return self._tx[1]

    def _on_begin(self, frame: Frame) -> None:
        assert self.host is not None
        tx = frame.headers["transaction"]
        if self._tx is not None:
            raise LocalProtocolError(
                "nested transaction",
                f"BEGIN {tx[:80]!r} while transaction {self._tx[0]!r} is open; transactions do not nest",
            )
        self._tx = (tx, self.host.begin())
        for sub in self._transacted():
            assert sub.handle is not None  # (subscribed)
            sub.handle.pause(False)

    def _on_commit(self, frame: Frame) -> Ticket:
        assert self.host is not None
        work = self._work(frame.headers["transaction"])
        try:
            ticket = self.host.commit(work)
        except JMSException as exc:
            raise LocalProtocolError("commit failed", f"COMMIT {frame.headers['transaction']!r}: {exc}") from exc
        self._tx = None
        for sub in self._transacted():
            assert sub.handle is not None  # (subscribed)
            sub.handle.pause(True)
            sub.handle.release(sub.held)
            sub.held = 0
        if ticket is not None:
            self._last_ticket = ticket
        return ticket

    def _on_abort(self, frame: Frame) -> None:
        assert self.host is not None
        work = self._work(frame.headers["transaction"])
        self._tx = None
        self.host.rollback(work)
        for sub in self._transacted():
            handle = sub.handle
            assert handle is not None
            handle.pause(True)
            returned = sub.take_all()
            self.host.redeliver([d.handle for d in returned])
            handle.release(len(returned) + sub.held)
            sub.held = 0

    def _transacted(self) -> list[Subscription]:
        return [s for s in self.subscriptions.values() if s.transacted]

    def _on_disconnect(self, frame: Frame) -> Ticket:
        """Subscriptions end now, not after the receipt's store wait: a client need not
        wait for the receipt, so a MESSAGE written meanwhile (consumed, if ack:auto)
        could be lost with it."""
        for sub in list(self.subscriptions.values()):
            self._close_subscription(sub)
        return self._last_ticket

    # --- subscriptions ------------------------------------------------------------------------
    def _on_subscribe(self, frame: Frame) -> None:
        assert self.host is not None and self.destinations is not None
        text = frame.headers["destination"]
        destination = self.destinations.to_jms(text)
        sub_id = frame.get("id") or DEFAULT_ID_PREFIX + text
        if sub_id in self.subscriptions:
            raise LocalProtocolError(
                "duplicate subscription", f"subscription id {sub_id[:80]!r} is already in use on this connection"
            )
        ack = frame.get("ack", "auto")
        if ack not in ACK_MODES:
            raise LocalProtocolError("invalid ack", f"ack {ack[:40]!r} is not one of {', '.join(ACK_MODES)}")
        tx = frame.get("transaction")
        if tx is not None:
            self._work(tx)
        durable = frame.get("durable-subscriber-name")
        if durable and not destination.is_topic:
            raise LocalProtocolError(
                "invalid durable subscription",
                f"durable-subscriber-name needs a /topic/ destination, not {text[:80]!r}",
            )
        if durable and self.host.client_id is None:
            raise LocalProtocolError("no client-id", "a durable subscription needs the client-id header on CONNECT")
        sub = Subscription(sub_id, ack, tx is not None, durable or None)
        render = self._renderer(sub, destination)
        try:
            sub.handle = self.host.subscribe(
                destination,
                frame.get("selector"),
                sub.durable_name,
                frame.get("no-local", "false").lower() == "true",
                self.config.consumer_flow_limit,
                render,
                partial(self._deliver, sub),
            )
        except JMSException as exc:
            raise LocalProtocolError("subscribe failed", f"SUBSCRIBE {text[:80]!r}: {exc}") from exc
        self.subscriptions[sub_id] = sub

    def _renderer(self, sub: Subscription, destination: Destination) -> Callable[[Handle], Delivery]:
        """The function a subscriber thread turns each message into frame bytes with."""
        numbers, version, destinations = self._ack_numbers, self.version, self.destinations
        assert destinations is not None
        transformer = self.config.transformer() if self.config.transformer else None
        ack_header = version == V12 and not sub.auto
        frames = MessageRenderer(
            sub.id, destinations, transformer, version, self.config.invalid_header_names == NAMES_ENCODE
        )

        def render(env: Handle) -> Delivery:
            ack_no = next(numbers)
            message = env.message
            message_id = message.message_id or ""
            try:
                data = frames.render(message, str(ack_no) if ack_header else None, env.delivery_count)
                return Delivery(ack_no, env, message_id, data)
            except (NotDeliverable, TransformFailed) as exc:
                return Delivery(ack_no, env, message_id, None, getattr(exc, "detail", str(exc)))
            except HeaderNotEncodable as exc:  # a value this client's version cannot carry
                return Delivery(ack_no, env, message_id, None, f"message {message.message_id}: {exc.detail}")
            except Exception as exc:  # a bug must close the connection, not lose the message
                log.exception("STOMP session %s: cannot render a message", self.session_id)
                return Delivery(ack_no, env, message_id, None, f"cannot deliver: {exc}")

        return render

    def _deliver(self, sub: Subscription, items: list[Delivery] | None) -> None:
        """A subscriber's batch arrives on the loop: write it, or give it back."""
        if items is None:
            self._fail(LocalProtocolError("internal error", "a subscriber failed; see the server log"))
            return
        host = self.host
        assert host is not None and sub.handle is not None
        sub.handle.batch_done()
        if self.closed or sub.closed or (sub.transacted and self._tx is None):
            host.redeliver([d.handle for d in items])
            if not sub.closed and sub.handle is not None:
                sub.handle.release(len(items))
            return
        acked: list[Handle] = []
        write, auto = self._out.append, sub.auto  # once per batch, not per message
        for i, d in enumerate(items):
            if d.data is None:
                host.redeliver([x.handle for x in items[i:]])
                self._fail(LocalProtocolError("message not deliverable", d.error))
                break
            write(d.data)
            if auto:
                acked.append(d.handle)
            else:
                sub.outstanding[d.ack_no] = d
                sub.by_message_id[d.message_id] = d.ack_no
        if acked:
            host.acknowledge(acked)
            assert sub.handle is not None
            sub.handle.release(len(acked))

    def _on_unsubscribe(self, frame: Frame) -> Blocking | None:
        assert self.host is not None
        durable = frame.get("durable-subscriber-name")
        if durable:
            if self.host.client_id is None:
                raise LocalProtocolError(
                    "no client-id", "unsubscribing a durable subscription needs the client-id header on CONNECT"
                )
            for sub in list(self.subscriptions.values()):
                if sub.durable_name == durable:
                    self._close_subscription(sub)
            host = self.host

            def unsubscribe() -> None:
                try:
                    host.unsubscribe(durable)
                except JMSException as exc:
                    raise LocalProtocolError("unsubscribe failed", f"UNSUBSCRIBE {durable[:80]!r}: {exc}") from exc

            return Blocking(unsubscribe)
        sub_id = frame.get("id")
        if sub_id is None and frame.get("destination"):
            sub_id = DEFAULT_ID_PREFIX + frame.headers["destination"]
        if sub_id is None:
            raise LocalProtocolError(
                "missing id",
                "UNSUBSCRIBE requires the id header (or, in STOMP 1.0, destination; or durable-subscriber-name)",
            )
        named = self.subscriptions.get(sub_id)
        if named is None:
            raise LocalProtocolError("unknown subscription", f"no subscription {sub_id[:80]!r} on this connection")
        self._close_subscription(named)
        return None

    def _close_subscription(self, sub: Subscription) -> None:
        sub.closed = True
        self.subscriptions.pop(sub.id, None)
        if sub.handle is not None:
            sub.handle.stop()
        if self.host is not None:
            self.host.redeliver([d.handle for d in sub.take_all()])

    # --- ACK and NACK -------------------------------------------------------------------------
    def _on_ack(self, frame: Frame) -> None:
        self._settle(frame, consume=True)

    def _on_nack(self, frame: Frame) -> None:
        self._settle(frame, consume=False)

    def _take_acked(self, frame: Frame) -> bool:
        """An ACK of _process's ACK run (no receipt, no transaction header): take what it
        acknowledges from its subscription now (so a later ACK of the same message is
        unknown, as before) and leave the host broker call and the credit to
        _acknowledge_run, once for the run. False for a transacted subscription's ACK:
        _handle settles it. Raises what _settle would."""
        sub, ack_no = self._find_delivery(frame)
        if sub.transacted:
            return False
        if sub.ack == "client":
            taken = sub.take(ack_no, cumulative=True)
            self._acked += [d.handle for d in taken]
            count = len(taken)
        else:
            self._acked.append(sub.take_one(ack_no).handle)
            count = 1
        per_sub = self._acked_per_sub
        per_sub[sub] = per_sub.get(sub, 0) + count
        return True

    def _acknowledge_run(self) -> None:
        """Acknowledge the ACK run's messages in one host broker call, then return their
        credit to their subscribers."""
        assert self.host is not None
        acked, per_sub = self._acked, self._acked_per_sub
        self._acked, self._acked_per_sub = [], {}
        self.host.acknowledge(acked)
        for sub, count in per_sub.items():
            if sub.handle is not None:
                sub.handle.release(count)

    def _settle(self, frame: Frame, consume: bool) -> None:
        assert self.host is not None
        sub, ack_no = self._find_delivery(frame)
        tx = frame.get("transaction")
        if sub.transacted:
            work = self._work(tx if tx is not None else self._open_tx(sub))
            taken = sub.take(ack_no, cumulative=True)
            if consume:
                self.host.hold(work, [d.handle for d in taken])
                sub.held += len(taken)
                return
        else:
            if tx is not None:
                raise LocalProtocolError(
                    "not a transacted subscription",
                    f"{frame.command} names "
                    f"transaction {tx[:80]!r} but subscription {sub.id[:80]!r} "
                    "was not created with a transaction header",
                )
            taken = sub.take(ack_no, cumulative=sub.ack == "client")
        envs = [d.handle for d in taken]
        if consume:
            self.host.acknowledge(envs)
        else:
            self.host.redeliver(envs)
        assert sub.handle is not None
        sub.handle.release(len(envs))

    def _open_tx(self, sub: Subscription) -> str:
        if self._tx is None:
            raise LocalProtocolError(
                "no transaction",
                f"subscription {sub.id[:80]!r} is transacted and no transaction is open; BEGIN one first",
            )
        return self._tx[0]

    def _find_delivery(self, frame: Frame) -> tuple[Subscription, int]:
        """The subscription and delivery an ACK/NACK names (1.2: id; before: message-id)."""
        ack_id = frame.get("id") if self.version == V12 else None
        if ack_id is not None:
            if ack_id.isdigit():
                ack_no = int(ack_id)
                for sub in self.subscriptions.values():
                    if ack_no in sub.outstanding:
                        return sub, ack_no
            raise LocalProtocolError(
                "unknown message",
                f"{frame.command} id {ack_id[:80]!r} names no message awaiting acknowledgement on this connection",
            )
        message_id = frame.get("message-id")
        if message_id is None:
            raise LocalProtocolError(
                f"missing {'id' if self.version == V12 else 'message-id'}",
                f"{frame.command} requires the "
                + ("id header (the MESSAGE's ack header)" if self.version == V12 else "message-id header"),
            )
        sub_id = frame.get("subscription")
        if sub_id is not None:
            named = self.subscriptions.get(sub_id)
            if named is None:
                raise LocalProtocolError(
                    "unknown subscription",
                    f"{frame.command} names subscription {sub_id[:80]!r}, which does not exist on this connection",
                )
            candidates = [named]
        else:  # STOMP 1.0: default-id subscriptions first (Table 12-11), then the others
            subs = list(self.subscriptions.values())
            candidates = [s for s in subs if s.id.startswith(DEFAULT_ID_PREFIX)] + [
                s for s in subs if not s.id.startswith(DEFAULT_ID_PREFIX)
            ]
        for sub in candidates:
            found = sub.by_message_id.get(message_id)
            if found is not None:
                return sub, found
        where = f"subscription {sub_id[:80]!r}" if sub_id is not None else "any subscription"
        raise LocalProtocolError(
            "unknown message",
            f"{frame.command}: message {message_id[:80]!r} is not awaiting acknowledgement on {where}",
        )


HANDLERS: dict[str, Callable[[StompSession, Frame], Any]] = {
    CONNECT: StompSession._on_connect,
    STOMP: StompSession._on_connect,
    SEND: StompSession._on_send,
    SUBSCRIBE: StompSession._on_subscribe,
    UNSUBSCRIBE: StompSession._on_unsubscribe,
    ACK: StompSession._on_ack,
    NACK: StompSession._on_nack,
    BEGIN: StompSession._on_begin,
    COMMIT: StompSession._on_commit,
    ABORT: StompSession._on_abort,
    DISCONNECT: StompSession._on_disconnect,
}


def _negotiate_version(accept: str | None) -> str:
    if accept is None:
        return V10
    offered = {v.strip() for v in accept.split(",")}
    for version in reversed(VERSIONS):
        if version in offered:
            return version
    raise LocalProtocolError(
        "unsupported version",
        f"accept-version {accept[:80]!r} names no version "
        f"this server speaks; supported protocol versions are {SUPPORTED}",
    )


def _negotiate_heart_beat(header: str | None, ours: tuple[int, int]) -> tuple[int, int]:
    """(ms between our beats, ms between the client's) from its heart-beat header."""
    if header is None:
        return 0, 0
    parts = header.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise LocalProtocolError(
            "invalid heart-beat",
            f"heart-beat {header[:40]!r} must be two whole numbers of milliseconds, such as 10000,10000",
        )
    cx, cy = (int(p) for p in parts)
    sx, sy = ours
    return (max(sx, cy) if sx and cy else 0), (max(cx, sy) if cx and sy else 0)
