"""The wire protocol of the host broker's ``jms`` connection service (sans-IO).

Both sides first send a 5-byte preamble, ``b"IMQJ"`` and the protocol version (one byte),
then frames: ``u32 size | u8 kind | u32 channel | body``, of kind REQUEST, REPLY, ERROR,
DELIVER or HEARTBEAT. A request's arguments are a codec value list checked against the op's
row of ``ARGS`` (SEND and CONSUMED carry packed structs instead); every message is a
``jms.codec`` blob. ``_LEGAL`` says which frame kinds each side accepts in each state.

Rules: nothing is ever unpickled; a frame longer than the limit is refused as soon as its
size is read; anything wrong raises :class:`ProtocolError` naming the frame, the side that
reads it sends an ERROR frame and closes, and the state is ERROR for good.

Design notes: docs/embedded-broker.md#internals-providersembeddedwirepy.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from enum import Enum, IntEnum
from typing import Any, NamedTuple

from ...jms import codec
from ...jms.destination import Destination, Queue
from ...jms.errors import JMSException, TransportException, XAException, lookup
from ...jms.xa import Xid

MAGIC = b"IMQJ"
VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})
PREAMBLE = MAGIC + bytes((VERSION,))
HANDSHAKE_MAX_FRAME = 64 * 1024  # before HELLO is answered: nobody buffers much
DEFAULT_MAX_FRAME = 64 * 1024 * 1024

_HEAD = struct.Struct(">IBI")  # size, kind, channel
_SIZE = struct.Struct(">I")
_OP = struct.Struct(">B")
_SEND = struct.Struct(">BI")  # op, session
_CONSUMED = struct.Struct(">BII")  # op, session, consumer
_DELIVER = struct.Struct(">QI")  # tag, delivery count
_TAG = struct.Struct(">Q")


class ProtocolError(TransportException, code="WIRE_PROTOCOL"):
    """The peer broke the wire protocol (garbage, oversize frame, wrong version, bad order)."""


class Kind(IntEnum):
    __hash__ = int.__hash__  # (Enum's own hash is Python code: too slow per frame)

    REQUEST = 1
    REPLY = 2
    ERROR = 3
    DELIVER = 4
    HEARTBEAT = 5


class Op(IntEnum):
    __hash__ = int.__hash__

    HELLO = 1
    CLOSE = 2
    SET_CLIENT_ID = 3
    START = 4
    STOP = 5
    SESSION = 6
    SESSION_CLOSE = 7
    CONSUMER = 8
    CONSUMER_CLOSE = 9
    UNSUBSCRIBE = 10
    TEMP_CREATE = 11
    TEMP_DELETE = 12
    SEND = 13
    CONSUMED = 14
    RETURN = 15
    ACKNOWLEDGE = 16
    ACK_ONE = 17
    RECOVER = 18
    COMMIT = 19
    ROLLBACK = 20
    BROWSE = 21
    BROWSE_MORE = 22
    BROWSE_CLOSE = 23
    XA_START = 24
    XA_END = 25
    XA_PREPARE = 26
    XA_COMMIT = 27
    XA_ROLLBACK = 28
    XA_RECOVER = 29
    XA_FORGET = 30
    PULL = 31
    GROUP_CONSUMER = 32
    ACK_OLDEST = 33
    BROWSER = 34


_KINDS = {int(k): k for k in Kind}
_OPS = {int(o): o for o in Op}


class Role(Enum):
    CLIENT = "client"
    SERVER = "server"


class State(Enum):
    PREAMBLE = "PREAMBLE"  # waiting for the peer's preamble
    HANDSHAKE = "HANDSHAKE"  # server: waiting for HELLO; client: for its answer
    OPEN = "OPEN"
    ERROR = "ERROR"


# Which frame kinds each side accepts from its peer in each state.
_LEGAL: dict[tuple[Role, State], frozenset[Kind]] = {
    (Role.SERVER, State.HANDSHAKE): frozenset({Kind.REQUEST}),  # HELLO only (checked below)
    (Role.CLIENT, State.HANDSHAKE): frozenset({Kind.REPLY, Kind.ERROR}),
    (Role.SERVER, State.OPEN): frozenset({Kind.REQUEST, Kind.HEARTBEAT}),
    (Role.CLIENT, State.OPEN): frozenset({Kind.REPLY, Kind.ERROR, Kind.DELIVER, Kind.HEARTBEAT}),
}

# Argument types of each op sent as a value list; a tuple means "one of these".
_XID = "xid"  # [format_id, gtrid, bqual] -> Xid
_INTS = "ints"  # a list of ints
OptStr = (str, type(None))
ARGS: dict[Op, tuple[Any, ...]] = {
    Op.HELLO: (OptStr, OptStr, int, str, OptStr),  # user, password, heart-beat ms, client name, [home]
    Op.CLOSE: (),
    Op.SET_CLIENT_ID: (str,),
    Op.START: (),
    Op.STOP: (),
    Op.SESSION: (int, bool, int, bool),  # session, transacted, ack mode, xa
    Op.SESSION_CLOSE: (int,),
    Op.CONSUMER: (int, int, Destination, OptStr, bool, OptStr, int, int),  # session, consumer,
    Op.CONSUMER_CLOSE: (int, int),  # dest, selector, no_local, durable name, prefetch, [prefetch bytes]
    Op.UNSUBSCRIBE: (int, str),
    Op.TEMP_CREATE: (int, bool),  # session, topic
    Op.TEMP_DELETE: (int, Destination),
    Op.RETURN: (int, int, _INTS, bool),  # session, consumer, tags, seen by the app
    Op.ACKNOWLEDGE: (int,),
    Op.ACK_ONE: (int, int),  # session, tag
    Op.ACK_OLDEST: (int, int),  # session, count
    Op.RECOVER: (int,),
    Op.COMMIT: (int,),
    Op.ROLLBACK: (int,),
    Op.BROWSER: (int, Queue, OptStr),  # session, queue, selector: may it browse?
    Op.BROWSE: (int, Queue, OptStr),
    Op.BROWSE_MORE: (int,),
    Op.BROWSE_CLOSE: (int,),
    Op.XA_START: (int, _XID, int),  # session, xid, flags
    Op.XA_END: (int, _XID, int),
    Op.XA_PREPARE: (_XID,),
    Op.XA_COMMIT: (_XID, bool),
    Op.XA_ROLLBACK: (_XID,),
    Op.XA_RECOVER: (int,),
    Op.XA_FORGET: (_XID,),
    Op.PULL: (int, int, int),  # session, consumer, n (see above)
    # a connection consumer's consumer in a session (Session.create_group_consumer):
    # session, consumer, dest, selector, durable name, prefetch, group, message retention
    Op.GROUP_CONSUMER: (int, int, Destination, OptStr, OptStr, int, str, bool),
}


# Trailing arguments of an op that a peer may leave out (added later: see the notes).
OPTIONAL_ARGS: dict[Op, int] = {Op.CONSUMER: 1, Op.HELLO: 1}


# --- events ---------------------------------------------------------------------------


class Request(NamedTuple):
    call: int
    op: Op
    args: tuple[Any, ...]  # SEND: (session, message blob); CONSUMED: (session, consumer, tags)


class Reply(NamedTuple):
    call: int
    value: Any


class Failure(NamedTuple):
    call: int
    error: JMSException
    session: int | None  # an asynchronous request of this session failed
    fatal: bool  # the sender closes the connection after it


class Delivery(NamedTuple):
    consumer: int
    tag: int
    dcount: int
    blob: bytes


class Heartbeat(NamedTuple):
    pass


Event = Request | Reply | Failure | Delivery | Heartbeat
HEARTBEAT_EVENT = Heartbeat()


# --- encoding -------------------------------------------------------------------------


def _frame(kind: Kind, channel: int, body: bytes) -> bytes:
    return _HEAD.pack(len(body) + 5, kind, channel) + body


def request(call: int, op: Op, *args: Any) -> bytes:
    """A REQUEST frame for an op whose arguments are a value list (see ARGS)."""
    return _frame(
        Kind.REQUEST,
        call,
        _OP.pack(op) + codec.encode_value([[x.format_id, x.gtrid, x.bqual] if isinstance(x, Xid) else x for x in args]),
    )


def send_request(call: int, session: int, blob: bytes) -> bytes:
    """SEND: one encoded message (its destination header says where it goes)."""
    return _HEAD.pack(len(blob) + 10, Kind.REQUEST, call) + _SEND.pack(Op.SEND, session) + blob


def consumed_request(session: int, consumer: int, tags: list[int]) -> bytes:
    """CONSUMED (no reply): the application has these deliveries now."""
    body = _CONSUMED.pack(Op.CONSUMED, session, consumer) + b"".join(_TAG.pack(t) for t in tags)
    return _frame(Kind.REQUEST, 0, body)


def reply(call: int, value: Any = None) -> bytes:
    return _frame(Kind.REPLY, call, codec.encode_value(value))


def failure(call: int, exc: JMSException, *, session: int | None = None, fatal: bool = False) -> bytes:
    value: dict[str, Any] = {**_error_value(exc), "fatal": fatal}
    causes: list[dict[str, Any]] = []
    cause = exc.__cause__
    while isinstance(cause, JMSException) and len(causes) < MAX_CAUSES:
        causes.append(_error_value(cause))
        cause = cause.__cause__
    if causes:
        value["causes"] = causes
    if session is not None:
        value["sid"] = session
    return _frame(Kind.ERROR, call, codec.encode_value(value))


def _error_value(exc: JMSException) -> dict[str, Any]:
    value: dict[str, Any] = {"code": exc.code, "message": str(exc)}
    if isinstance(exc, XAException):
        value["xa"] = exc.errorcode
    return value


def delivery(consumer: int, tag: int, dcount: int, blob: bytes) -> bytes:
    return _HEAD.pack(len(blob) + 17, Kind.DELIVER, consumer) + _DELIVER.pack(tag, dcount) + blob


HEARTBEAT = _frame(Kind.HEARTBEAT, 0, b"")
MAX_CAUSES = 4  # the causes an ERROR frame carries


def error_from_value(value: Any) -> JMSException:
    """The exception an ERROR frame's value describes (its class found by code), with
    the causes it names as its chain of ``__cause__``."""
    exc = _error(value)
    causes = value.get("causes", [])
    if not isinstance(causes, list) or len(causes) > MAX_CAUSES:
        raise ProtocolError(f"an ERROR frame whose causes are not a list of at most {MAX_CAUSES}: {causes!r:.200}")
    last = exc
    for value in causes:
        cause = _error(value)
        last.__cause__ = cause
        last = cause
    return exc


def _error(value: Any) -> JMSException:
    code, message = (value.get("code"), value.get("message")) if isinstance(value, dict) else (None, None)
    if not isinstance(code, str) or not isinstance(message, str):
        raise ProtocolError(f"an ERROR frame without code and message: {value!r:.200}")
    if "xa" in value:
        if type(value["xa"]) is not int:
            raise ProtocolError(f"an ERROR frame whose xa code is not a number: {value!r:.200}")
        return XAException(message, value["xa"])
    cls = lookup(code)
    exc = cls.__new__(cls)
    JMSException.__init__(exc, message, code)
    return exc


# --- decoding --------------------------------------------------------------------------


def _check_args(op: Op, args: Any) -> tuple[Any, ...]:
    schema = ARGS[op]
    if not isinstance(args, list) or not len(schema) - OPTIONAL_ARGS.get(op, 0) <= len(args) <= len(schema):
        raise ProtocolError(f"{op.name} takes {len(schema)} arguments, not {args!r:.100}")
    out = []
    for i, (want, value) in enumerate(zip(schema, args)):
        if want is _XID:
            try:
                format_id, gtrid, bqual = value
                value = Xid(format_id, gtrid, bqual)
            except (TypeError, ValueError) as exc:
                raise ProtocolError(f"{op.name} argument {i + 1}: not an Xid ({exc})") from None
        elif want is _INTS:
            if not (isinstance(value, list) and all(type(v) is int for v in value)):
                raise ProtocolError(f"{op.name} argument {i + 1}: not a list of integers")
        elif (want is int and type(value) is not int) or not isinstance(value, want):
            raise ProtocolError(f"{op.name} argument {i + 1}: {type(value).__name__} is the wrong type")
        out.append(value)
    return tuple(out)


def _parse_request(call: int, body: bytes) -> Request:
    if not body:
        raise ProtocolError("an empty REQUEST frame")
    op = _OPS.get(body[0])
    if op is None:
        raise ProtocolError(f"unknown op {body[0]} in a REQUEST frame")
    if op is Op.SEND:
        if len(body) < _SEND.size:
            raise ProtocolError("a truncated SEND request")
        return Request(call, op, (_SEND.unpack_from(body)[1], body[_SEND.size :]))
    if op is Op.CONSUMED:
        if len(body) < _CONSUMED.size or (len(body) - _CONSUMED.size) % 8:
            raise ProtocolError("a malformed CONSUMED request")
        _, session, consumer = _CONSUMED.unpack_from(body)
        tags = [t for (t,) in _TAG.iter_unpack(body[_CONSUMED.size :])]
        return Request(call, op, (session, consumer, tags))
    try:
        args = codec.decode_value(body[1:])
    except JMSException as exc:
        raise ProtocolError(f"{op.name} request: undecodable arguments ({exc})") from None
    return Request(call, op, _check_args(op, args))


def _parse_value(kind: Kind, body: bytes) -> Any:
    try:
        return codec.decode_value(body)
    except JMSException as exc:
        raise ProtocolError(f"{kind.name} frame: undecodable value ({exc})") from None


def _parse_failure(call: int, body: bytes) -> Failure:
    value = _parse_value(Kind.ERROR, body)
    if not isinstance(value, dict):
        raise ProtocolError("an ERROR frame whose value is not a dict")
    sid = value.get("sid")
    return Failure(call, error_from_value(value), sid if type(sid) is int else None, bool(value.get("fatal")))


def _parse_delivery(consumer: int, body: bytes) -> Delivery:
    if len(body) < _DELIVER.size:
        raise ProtocolError("a truncated DELIVER frame")
    tag, dcount = _DELIVER.unpack_from(body)
    return Delivery(consumer, tag, dcount, body[_DELIVER.size :])


_PARSERS: dict[int, Callable[[int, bytes], Event]] = {
    Kind.REQUEST: _parse_request,
    Kind.REPLY: lambda call, body: Reply(call, _parse_value(Kind.REPLY, body)),
    Kind.ERROR: _parse_failure,
    Kind.DELIVER: _parse_delivery,
    Kind.HEARTBEAT: lambda channel, body: HEARTBEAT_EVENT,
}


_OPEN, _PREAMBLE, _ERROR, _HELLO = State.OPEN, State.PREAMBLE, State.ERROR, Op.HELLO


class Wire:
    """One side of a connection: bytes in, events out (``receive_data`` / ``next_event``)."""

    def __init__(self, role: Role, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.role = role
        self._state = State.PREAMBLE
        self.max_frame = max_frame  # applies once OPEN
        self.peer_version: int | None = None
        self._buf = bytearray()
        self._pos = 0
        self.frames = 0
        self._hello = False
        self._legal: frozenset[int] = frozenset()  # the frame kinds legal in this state
        self._server = role is Role.SERVER

    @property
    def state(self) -> State:
        return self._state

    @state.setter
    def state(self, state: State) -> None:
        self._state = state
        self._legal = frozenset(int(k) for k in _LEGAL.get((self.role, state), ()))

    def receive_data(self, data: bytes | memoryview) -> None:
        if self._pos > 65536 and self._pos * 2 > len(self._buf):
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def open(self) -> None:
        """The handshake is done (the server accepted HELLO / the client got its answer)."""
        if self.state is not State.HANDSHAKE:
            raise ProtocolError(f"open() in state {self.state.value}")
        self.state = State.OPEN

    def next_event(self) -> Event | None:
        """The next complete event, or None until more data arrives; ProtocolError if bad."""
        try:
            return self._next()
        except ProtocolError:
            self.state = State.ERROR
            raise

    def _next(self) -> Event | None:
        state = self._state
        if state is not _OPEN:
            if state is _PREAMBLE and not self._preamble():
                return None
            if state is _ERROR:
                raise ProtocolError("the connection already failed")
            state = self._state
        buf, pos = self._buf, self._pos
        if len(buf) - pos < 4:
            return None
        size = _SIZE.unpack_from(buf, pos)[0]
        limit = self.max_frame if state is _OPEN else HANDSHAKE_MAX_FRAME
        if size < 5 or size > limit:
            raise ProtocolError(f"frame {self.frames + 1}: size {size} is outside 5..{limit} bytes")
        end = pos + 4 + size
        if len(buf) < end:
            return None
        _, code, channel = _HEAD.unpack_from(buf, pos)
        if code not in self._legal:
            kind = _KINDS.get(code)
            what = (
                f"unknown frame kind {code}"
                if kind is None
                else f"a {kind.name} frame is not allowed in state {state.value}"
            )
            raise ProtocolError(f"frame {self.frames + 1}: {what}")
        body = bytes(buf[pos + 9 : end])
        if end == len(buf):
            buf.clear()
            self._pos = 0
        else:
            self._pos = end
        self.frames += 1
        try:
            event = _PARSERS[code](channel, body)
        except ProtocolError as exc:
            raise ProtocolError(f"frame {self.frames}: {exc}") from None
        if code == 1 and self._server and event.__class__ is Request and (state is not _OPEN or event.op is _HELLO):
            self._check_hello(event)
        return event

    def _check_hello(self, event: Request) -> None:
        """HELLO once, first, and nothing else until the handshake is done."""
        hello = event.op is Op.HELLO
        if self.state is State.HANDSHAKE and (not hello or self._hello):
            raise ProtocolError(
                f"frame {self.frames}: only one HELLO is allowed before the handshake is done, not {event.op.name}"
            )
        if self.state is State.OPEN and hello:
            raise ProtocolError(f"frame {self.frames}: HELLO after the handshake")
        self._hello = True

    def _preamble(self) -> bool:
        """Read the peer's preamble; False until all of it is here."""
        have = bytes(self._buf[self._pos : self._pos + len(PREAMBLE)])
        if not MAGIC.startswith(have[: len(MAGIC)]):
            raise ProtocolError(f"the peer does not speak the imqbridge jms protocol (it sent {have!r})")
        if len(have) < len(PREAMBLE):
            return False
        version = have[len(MAGIC)]
        self._pos += len(PREAMBLE)
        self.peer_version = version
        if version not in SUPPORTED_VERSIONS:
            raise ProtocolError(
                f"protocol version {version} is not supported "
                f"(this {self.role.value} speaks {sorted(SUPPORTED_VERSIONS)})"
            )
        self.state = State.HANDSHAKE
        return True

    def pending(self) -> int:
        """Bytes received and not yet turned into events."""
        return len(self._buf) - self._pos
