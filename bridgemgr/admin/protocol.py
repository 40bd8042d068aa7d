"""The admin command protocol: JSON lines over TCP (or TLS), sans-IO.

The client sends one JSON object per line and the server answers each with one JSON object
per line, in order. The first request must be HELLO with the admin credentials; anything
else before a successful HELLO (a failed HELLO too) gets 400 and the connection closes.
Then any number of commands: the bridge ops (LIST, START, STOP, PAUSE, RESUME, and CONFIG
for CLI jobs), the host broker's physical destinations (CREATE_DST, UPDATE_DST, QUERY_DST,
LIST_DST, PURGE_DST, BROWSE_DST, DESTROY_DST, PAUSE_DST, RESUME_DST), its connections and
the instance's services (LIST_CXN, LIST_SVC), a bridge's in-doubt XA transactions
(LIST_TXN, COMMIT_TXN, ROLLBACK_TXN), a bridge's dead messages (LIST_DMQ; REDRIVE_DMQ and
ARCHIVE_DMQ of entries by JMSMessageID or all), a dry-run check of a bridge XML
(CHECK_XML), a link's last hour (LINK_HISTORY) and the HA cluster's instances and owners
(CLUSTER). A reply is ``{"status": ..., "message": ..., "data": ...}``, with the original
product's status codes.

Rule: a line longer than ``MAX_LINE`` bytes, bytes that are not UTF-8 JSON, or an object of
the wrong shape get 400; the connection is closed after a 400 on an unparseable line.

Design notes: docs/operations.md#internals-adminprotocolpy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

VERSION = 1
MAX_LINE = 64 * 1024

OK, BAD_REQUEST, NOT_FOUND, ERROR, NOT_IMPLEMENTED, UNAVAILABLE = 200, 400, 404, 500, 501, 503

DST_COMMANDS = (
    "CREATE_DST",
    "UPDATE_DST",
    "QUERY_DST",
    "LIST_DST",
    "PURGE_DST",
    "BROWSE_DST",
    "DESTROY_DST",
    "PAUSE_DST",
    "RESUME_DST",
)
BROKER_COMMANDS = ("LIST_CXN", "LIST_SVC")  # the host broker's connections, the instance's services
TXN_COMMANDS = ("LIST_TXN", "COMMIT_TXN", "ROLLBACK_TXN")
DMQ_MOVES = ("REDRIVE_DMQ", "ARCHIVE_DMQ")  # chosen DMQ entries back to their targets, or to a file
COMMANDS = (
    "LIST",
    "START",
    "STOP",
    "PAUSE",
    "RESUME",
    "CONFIG",
    "CLUSTER",
    "LIST_DMQ",
    "CHECK_XML",
    "LINK_HISTORY",
    *DMQ_MOVES,
    *DST_COMMANDS,
    *BROKER_COMMANDS,
    *TXN_COMMANDS,
)
PAUSE_TYPES = ("PRODUCERS", "CONSUMERS", "ALL")  # PAUSE_DST, RESUME_DST: what (imqcmd's -pst)
MAX_BROWSE = 1000  # messages one browse shows at most
MAX_IDS = 1000  # JMSMessageIDs one REDRIVE_DMQ / ARCHIVE_DMQ names at most
TYPES = ("JMS", "STOMP")
DST_TYPES = ("q", "t")


class AdminProtocolError(Exception):
    """A request that cannot be understood; carries the status to answer with."""

    def __init__(self, message: str, status: int = BAD_REQUEST) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Hello:
    version: int
    user: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class Command:
    op: str
    type: str | None = None
    bridge: str | None = None
    link: str | None = None
    dst_type: str | None = None  # destination commands: q or t
    destination: str | None = None  # ... its name
    attributes: dict[str, str] = field(default_factory=dict)  # ... name=value to set
    count: int | None = None  # BROWSE_DST: how many messages
    after: str | None = None  # BROWSE_DST: those after the message with this JMSMessageID
    txn: str | None = None  # COMMIT_TXN, ROLLBACK_TXN: the transaction's id
    pause_type: str | None = None  # PAUSE_DST, RESUME_DST: PRODUCERS, CONSUMERS or ALL
    temporary: bool = False  # LIST_DST: temporary destinations too
    service: str | None = None  # LIST_CXN: only the connections of this service
    dmq: str | None = None  # REDRIVE_DMQ, ARCHIVE_DMQ: the DMQ's name (None: the built-in one)
    message_ids: tuple[str, ...] = ()  # ... the entries' JMSMessageIDs
    all_entries: bool = False  # ... instead: every entry
    xml: str | None = field(default=None, repr=False)  # CHECK_XML: a bridge XML document
    source: str | None = None  # ... the name its problems give it
    with_links: bool = False  # LIST of every bridge: each one's links too (the console's overview)

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"op": self.op, "type": self.type, "bridge": self.bridge, "link": self.link}
        if self.op in DST_COMMANDS:
            obj.update(dst_type=self.dst_type, destination=self.destination, attributes=self.attributes)
            if self.count is not None:
                obj["count"] = self.count
            if self.after is not None:
                obj["after"] = self.after
            if self.pause_type is not None:
                obj["pause_type"] = self.pause_type
            if self.temporary:
                obj["temporary"] = True
        if self.service is not None:
            obj["service"] = self.service
        if self.with_links:
            obj["links"] = True
        if self.op == "LIST_DMQ":
            obj["count"] = self.count
        if self.op == "CHECK_XML":
            obj.update(xml=self.xml, source=self.source)
        if self.op in DMQ_MOVES:
            obj.update(dmq=self.dmq, message_ids=list(self.message_ids), all=self.all_entries)
        if self.txn is not None:
            obj["txn"] = self.txn
        return obj


@dataclass(frozen=True)
class Reply:
    status: int
    message: str
    data: Any = None

    @property
    def ok(self) -> bool:
        return self.status == OK

    def encode(self) -> bytes:
        return (
            json.dumps(
                {"status": self.status, "message": self.message, "data": self.data}, separators=(",", ":")
            ).encode()
            + b"\n"
        )


def _name(obj: dict[str, Any], key: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 255:
        raise AdminProtocolError(f"'{key}' must be a non-empty string of at most 255 characters")
    return value


def parse_request(line: bytes) -> Hello | Command:
    """One request line -> Hello or Command; AdminProtocolError(400) when malformed."""
    if len(line) > MAX_LINE:
        raise AdminProtocolError(f"request longer than {MAX_LINE} bytes")
    try:
        obj = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise AdminProtocolError(f"not a JSON request: {exc}") from None
    if not isinstance(obj, dict):
        raise AdminProtocolError("a request must be a JSON object")
    op = obj.get("op")
    if op == "HELLO":
        version, user, password = obj.get("version"), obj.get("user"), obj.get("password")
        if version != VERSION:
            raise AdminProtocolError(f"protocol version {version!r} is not supported (this service speaks {VERSION})")
        if not isinstance(user, str) or not isinstance(password, str):
            raise AdminProtocolError("HELLO needs 'user' and 'password' strings")
        return Hello(version, user, password)
    if op not in COMMANDS:
        raise AdminProtocolError(f"unknown operation {op!r}; expected HELLO or one of {', '.join(COMMANDS)}")
    btype = obj.get("type")
    if btype is not None:
        if not isinstance(btype, str) or btype.upper() not in TYPES:
            raise AdminProtocolError(f"bridge type {btype!r} is not JMS or STOMP")
        btype = btype.upper()
    if op in DST_COMMANDS:
        return _dst_command(op, obj)
    if op in BROKER_COMMANDS:
        service = _name(obj, "service")
        if service is not None and op != "LIST_CXN":
            raise AdminProtocolError(f"{op} takes no 'service'")
        return Command(op, service=service)
    if op in TXN_COMMANDS:
        bridge, txn = _name(obj, "bridge"), _name(obj, "txn")
        if bridge is None:
            raise AdminProtocolError(f"{op} needs 'bridge'")
        if (txn is None) != (op == "LIST_TXN"):
            raise AdminProtocolError(f"{op} {'takes no' if op == 'LIST_TXN' else 'needs'} 'txn'")
        return Command(op, bridge=bridge, txn=txn)
    if op == "LIST_DMQ":
        bridge, count = _name(obj, "bridge"), obj.get("count")
        if bridge is None:
            raise AdminProtocolError("LIST_DMQ needs 'bridge'")
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_BROWSE:
            raise AdminProtocolError(f"LIST_DMQ needs 'count', a number from 1 to {MAX_BROWSE}")
        return Command(op, bridge=bridge, count=count)
    if op in DMQ_MOVES:
        return _dmq_move(op, obj)
    if op == "LINK_HISTORY":
        bridge, link = _name(obj, "bridge"), _name(obj, "link")
        if bridge is None or link is None:
            raise AdminProtocolError("LINK_HISTORY needs 'bridge' and 'link'")
        return Command(op, bridge=bridge, link=link)
    if op == "CHECK_XML":
        xml, source = obj.get("xml"), _name(obj, "source")
        if not isinstance(xml, str) or not xml.strip():
            raise AdminProtocolError("CHECK_XML needs 'xml', the text of a bridge XML document")
        return Command(op, xml=xml, source=source)
    links = obj.get("links", False)
    if not isinstance(links, bool) or (links and (op != "LIST" or obj.get("bridge") is not None)):
        raise AdminProtocolError("'links' is true or false, for LIST of every bridge only")
    cmd = Command(op, btype, _name(obj, "bridge"), _name(obj, "link"), with_links=links)
    if cmd.link is not None and cmd.bridge is None:
        raise AdminProtocolError("a link command needs the bridge name too")
    return cmd


def _dmq_move(op: str, obj: dict[str, Any]) -> Command:
    bridge, dmq, ids, every = _name(obj, "bridge"), _name(obj, "dmq"), obj.get("message_ids") or [], obj.get("all")
    if bridge is None:
        raise AdminProtocolError(f"{op} needs 'bridge'")
    if (
        not isinstance(ids, list)
        or len(ids) > MAX_IDS
        or not all(isinstance(i, str) and 0 < len(i) <= 255 for i in ids)
    ):
        raise AdminProtocolError(f"'message_ids' must be a list of at most {MAX_IDS} JMSMessageIDs")
    if every not in (None, True, False) or bool(ids) == bool(every):
        raise AdminProtocolError(f"{op} needs 'message_ids' (the entries' JMSMessageIDs) or 'all': true, not both")
    return Command(op, bridge=bridge, dmq=dmq, message_ids=tuple(ids), all_entries=bool(every))


def _dst_command(op: str, obj: dict[str, Any]) -> Command:
    dst_type, name, attributes = obj.get("dst_type"), _name(obj, "destination"), obj.get("attributes") or {}
    everyone = op in ("PAUSE_DST", "RESUME_DST") and dst_type is None and name is None  # every destination
    if op != "LIST_DST" and not everyone and (dst_type not in DST_TYPES or name is None):
        raise AdminProtocolError(f"{op} needs 'dst_type' (q or t) and 'destination'")
    if dst_type is not None and dst_type not in DST_TYPES:
        raise AdminProtocolError(f"destination type {dst_type!r} is not q or t")
    if not isinstance(attributes, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in attributes.items()
    ):
        raise AdminProtocolError("'attributes' must be an object of strings")
    count = obj.get("count")
    if op == "BROWSE_DST":
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_BROWSE:
            raise AdminProtocolError(f"BROWSE_DST needs 'count', a number from 1 to {MAX_BROWSE}")
    elif count is not None:
        raise AdminProtocolError(f"{op} takes no 'count'")
    after = _name(obj, "after")
    if after is not None and op != "BROWSE_DST":
        raise AdminProtocolError(f"{op} takes no 'after'")
    pause_type = obj.get("pause_type")
    if op in ("PAUSE_DST", "RESUME_DST"):
        pause_type = "ALL" if pause_type is None else pause_type
        if pause_type not in PAUSE_TYPES:
            raise AdminProtocolError(f"pause type {pause_type!r} is not one of {', '.join(PAUSE_TYPES)}")
    elif pause_type is not None:
        raise AdminProtocolError(f"{op} takes no 'pause_type'")
    temporary = obj.get("temporary", False)
    if not isinstance(temporary, bool) or (temporary and op != "LIST_DST"):
        raise AdminProtocolError("'temporary' is true or false, for LIST_DST only")
    return Command(
        op,
        dst_type=dst_type,
        destination=name,
        attributes=attributes,
        count=count,
        after=after,
        pause_type=pause_type,
        temporary=temporary,
    )


def encode_request(request: Hello | Command) -> bytes:
    if isinstance(request, Hello):
        obj: dict[str, Any] = {
            "op": "HELLO",
            "version": request.version,
            "user": request.user,
            "password": request.password,
        }
    else:
        obj = request.to_json()
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def parse_reply(line: bytes) -> Reply:
    try:
        obj = json.loads(line.decode("utf-8"))
        return Reply(int(obj["status"]), str(obj["message"]), obj.get("data"))
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise AdminProtocolError(f"the service sent an unreadable reply: {exc}", ERROR) from None
