"""The admin port's destination commands: create, update, query, list, purge, browse,
destroy, pause and resume the host broker's physical destinations; list its connections
and the instance's services.

How it works: the service hands CREATE_DST / UPDATE_DST / QUERY_DST / LIST_DST commands
here with its host broker. Attributes come as the original's names and strings
(``maxNumMsgs=1000``, ``maxTotalMsgBytes=10m``, ``limitBehavior=REMOVE_OLDEST``,
``useDMQ=false``; poison messages: ``backoutThreshold=3``, ``backoutQueue=NAME``,
``backoutDisposition=dmq|discard``; an HA cluster's ``localDeliveryPreferred``,
``isLocalOnly``), are checked with the properties' kinds, and go to the broker through
HostBroker.configure_destination (kept in its store). Create refuses a destination that
exists, update one that does not; update changes only the attributes it names. Purge
removes the waiting messages (paged-out ones too; those in delivery stay) through
HostBroker.purge_destination and says how many; browse shows the first N waiting messages
of a queue: headers, properties, body type and size, a short printable preview and the
whole body as JSON (text as it is, bytes base64; an ObjectMessage's serialized form is
never deserialized). Destroy, pause and resume (imqcmd's meaning) and list cxn / list svc:
docs/operations.md#destinations-connections-and-services.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .admin.protocol import BAD_REQUEST, NOT_FOUND, OK, Command, Reply
from .jms.destination import Destination, Queue, Topic
from .jms.errors import IllegalStateException, JMSException
from .jms.hostbroker import DestinationAttributes, HostBroker, Principal
from .jms.message import DeliveryMode, Message
from .props import BACKOUT_DISPOSITION, BOOL, COUNT, LIMIT, LIMIT_BEHAVIOR, SIZE, TEXT, Kind

if TYPE_CHECKING:
    from .admin.portmapper import ServiceEntry

# attribute name -> (DestinationAttributes field, kind)
ATTRIBUTES: dict[str, tuple[str, Kind[Any]]] = {
    "maxNumMsgs": ("max_num_msgs", LIMIT),
    "maxTotalMsgBytes": ("max_total_msg_bytes", SIZE),
    "maxBytesPerMsg": ("max_bytes_per_msg", SIZE),
    "limitBehavior": ("limit_behavior", LIMIT_BEHAVIOR),
    "useDMQ": ("use_dmq", BOOL),
    "backoutThreshold": ("backout_threshold", COUNT),
    "backoutQueue": ("backout_queue", TEXT),
    "backoutDisposition": ("backout_disposition", BACKOUT_DISPOSITION),
    "localDeliveryPreferred": ("local_delivery_preferred", BOOL),
    "isLocalOnly": ("is_local_only", BOOL),
}


def attributes_json(attributes: DestinationAttributes) -> dict[str, Any]:
    """Attributes under the original's names."""
    return {name: getattr(attributes, field) for name, (field, _) in ATTRIBUTES.items()}


def _updated(attributes: DestinationAttributes, values: dict[str, str]) -> DestinationAttributes:
    """``attributes`` with ``values`` (name -> text) applied; ValueError naming a bad one."""
    changes: dict[str, Any] = {}
    for name, text in values.items():
        row = ATTRIBUTES.get(name)
        if row is None:
            raise ValueError(f"unknown destination attribute {name!r}; known: {', '.join(ATTRIBUTES)}")
        field, kind = row
        try:
            changes[field] = kind.parse(text)
        except ValueError:
            raise ValueError(f"{name}={text!r}: {kind.expected}") from None
    return dataclasses.replace(attributes, **changes)


def _destination(cmd: Command) -> Destination:
    assert cmd.destination is not None  # (the protocol checks)
    return Topic(cmd.destination) if cmd.dst_type == "t" else Queue(cmd.destination)


def _what(cmd: Command) -> str:
    return f"{'topic' if cmd.dst_type == 't' else 'queue'} {cmd.destination}"


def destination_command(
    broker: HostBroker,
    principal: Principal,
    cmd: Command,
    defaults: DestinationAttributes,
    services: Sequence[ServiceEntry] = (),
) -> Reply:
    """Carry out one destination command (or LIST_CXN, LIST_SVC); ``defaults``: what
    create starts from (the imq.autocreate.destination.* attributes); ``services``: the
    port mapper's table (LIST_SVC)."""
    if cmd.op == "LIST_DST":
        return _list(broker, principal, cmd)
    if cmd.op == "LIST_CXN":
        return _connections(broker, principal, cmd)
    if cmd.op == "LIST_SVC":
        rows = [
            {"name": e.name, "protocol": e.protocol, "type": e.type, "port": e.port, "state": "RUNNING"}
            for e in services
        ]
        return Reply(OK, f"{len(rows)} service(s)", {"services": rows})
    if cmd.op in ("PAUSE_DST", "RESUME_DST"):
        return _pause(broker, principal, cmd)
    if cmd.op == "DESTROY_DST":
        return _destroy(broker, principal, cmd)
    if cmd.op == "PURGE_DST":
        return _purge(broker, principal, cmd)
    if cmd.op == "BROWSE_DST":
        return _browse(broker, principal, cmd)
    dest = _destination(cmd)
    found = broker.describe_destination(principal, dest)
    if cmd.op == "QUERY_DST":
        if found is None:
            return Reply(NOT_FOUND, f"{_what(cmd)} does not exist")
        attributes, counts = found
        return Reply(
            OK,
            _what(cmd),
            {
                "type": cmd.dst_type,
                "name": cmd.destination,
                "state": broker.destination_state(principal, dest),
                "temporary": False,
                "attributes": attributes_json(attributes),
                **counts,
            },
        )
    if cmd.op == "CREATE_DST" and found is not None:
        return Reply(BAD_REQUEST, f"{_what(cmd)} already exists (use update dst to change it)")
    if cmd.op == "UPDATE_DST" and found is None:
        return Reply(NOT_FOUND, f"{_what(cmd)} does not exist (use create dst)")
    try:
        attributes = _updated(found[0] if found is not None else defaults, cmd.attributes)
        broker.configure_destination(principal, dest, attributes)
    except ValueError as exc:
        return Reply(BAD_REQUEST, f"{_what(cmd)}: {exc}")
    except JMSException as exc:
        return Reply(BAD_REQUEST, f"{_what(cmd)}: {exc}")
    verb = "created" if cmd.op == "CREATE_DST" else "updated"
    return Reply(
        OK,
        f"{_what(cmd)} {verb}",
        {"type": cmd.dst_type, "name": cmd.destination, "attributes": attributes_json(attributes)},
    )


def _rows(broker: HostBroker, principal: Principal, dst_type: str | None, temporary: bool) -> list[dict[str, Any]]:
    """list dst's rows: queues (``dst_type`` q), topics (t) or both (None), by name."""
    return [
        {
            "type": "t" if dest.is_topic else "q",
            "name": dest.name,
            "state": state,
            "temporary": dest.is_temporary,
            "attributes": attributes_json(attributes),
            **counts,
        }
        for dest, attributes, counts, state in broker.list_destinations(
            principal, queues=dst_type != "t", topics=dst_type != "q", temporary=temporary
        )
    ]


def _list(broker: HostBroker, principal: Principal, cmd: Command) -> Reply:
    rows = _rows(broker, principal, cmd.dst_type, cmd.temporary)
    return Reply(OK, f"{len(rows)} destination(s)", {"destinations": rows})


def _pause(broker: HostBroker, principal: Principal, cmd: Command) -> Reply:
    """pause|resume dst [-t T -n NAME] [-pst PRODUCERS|CONSUMERS|ALL]: one destination, or
    every one without a name."""
    pause, what = cmd.op == "PAUSE_DST", cmd.pause_type or "ALL"
    dest = _destination(cmd) if cmd.destination is not None else None
    done = broker.pause_destinations(principal, dest, what, pause)
    if done is None:
        return Reply(NOT_FOUND, f"{_what(cmd)} does not exist")
    verb = "paused" if pause else "resumed"
    rows = [{"type": "t" if d.is_topic else "q", "name": d.name, "state": state} for d, state in done]
    where = _what(cmd) if dest is not None else f"{len(rows)} destination(s)"
    return Reply(OK, f"{where}: {what.lower()} {verb}", {"pause_type": what, "destinations": rows})


def _destroy(broker: HostBroker, principal: Principal, cmd: Command) -> Reply:
    try:
        removed = broker.destroy_destination(principal, _destination(cmd))
    except JMSException as exc:
        return Reply(BAD_REQUEST, str(exc))
    if removed is None:
        return Reply(NOT_FOUND, f"{_what(cmd)} does not exist")
    return Reply(
        OK,
        f"{_what(cmd)} destroyed with {removed} message(s)",
        {"type": cmd.dst_type, "name": cmd.destination, "removed": removed},
    )


def _connections(broker: HostBroker, principal: Principal, cmd: Command) -> Reply:
    rows = [c for c in broker.connections(principal) if cmd.service is None or c["service"] == cmd.service]
    return Reply(OK, f"{len(rows)} connection(s)", {"connections": rows})


def _purge(broker: HostBroker, principal: Principal, cmd: Command) -> Reply:
    done = broker.purge_destination(principal, _destination(cmd))
    if done is None:
        return Reply(NOT_FOUND, f"{_what(cmd)} does not exist")
    removed, held = done
    kept = f"; {held} in delivery stay with their consumers" if held else ""
    return Reply(
        OK,
        f"{_what(cmd)}: {removed} message(s) purged{kept}",
        {"type": cmd.dst_type, "name": cmd.destination, "purged": removed, "in_delivery": held},
    )


def _browse(broker: HostBroker, principal: Principal, cmd: Command) -> Reply:
    if cmd.dst_type != "q":
        return Reply(
            BAD_REQUEST,
            f"{_what(cmd)}: only queues can be browsed (a topic keeps no messages "
            "of its own; its durable subscriptions do)",
        )
    assert cmd.destination is not None and cmd.count is not None  # (the protocol checks)
    try:
        messages = broker.browse_destination(principal, cmd.destination, cmd.count + 1, cmd.after)
    except IllegalStateException as exc:  # the page's cursor was consumed meanwhile
        return Reply(NOT_FOUND, f"{_what(cmd)}: {exc}")
    if messages is None:
        return Reply(NOT_FOUND, f"{_what(cmd)} does not exist")
    more = len(messages) > cmd.count
    messages = messages[: cmd.count]
    where = f"after {cmd.after}" if cmd.after else "the first"
    return Reply(
        OK,
        f"{_what(cmd)}: {where} {len(messages)} message(s)" + (" (more follow)" if more else ""),
        {
            "type": "q",
            "name": cmd.destination,
            "messages": [message_json(m) for m in messages],
            # the next page: browse with after=next (None: this was the last)
            "next": messages[-1].message_id if more and messages else None,
        },
    )


PREVIEW = 60  # characters of a body the browse table shows


def message_json(message: Message) -> dict[str, Any]:
    """One browsed message: headers, properties, body type and size, preview, body."""
    body = _body_json(message)
    return {
        "message_id": message.message_id,
        "timestamp": message.timestamp,
        "priority": message.priority,
        "persistent": message.delivery_mode == DeliveryMode.PERSISTENT,
        "redelivered": message.redelivered,
        "delivery_count": message.delivery_count,
        "expiration": message.expiration,
        "correlation_id": message.correlation_id,
        "type": message.type,
        "reply_to": str(message.reply_to) if message.reply_to is not None else None,
        "properties": dict(message.properties),
        "body_type": message.message_type,
        "body_size": message.body_size(),
        "preview": _preview(message),
        "body": body,
    }


def _body_json(message: Message) -> Any:
    body = message.get_body()
    if message.message_type == "OBJECT":  # serialized Java or Python: shown, never deserialized
        return {"base64": base64.b64encode(body).decode()} if isinstance(body, bytes | bytearray) else None
    return _jsonable(body)


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return {"base64": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def _preview(message: Message) -> str:
    """The start of the body as one printable line."""
    body = message.get_body()
    if body is None:
        return ""
    if message.message_type == "OBJECT":
        return "(serialized object)"
    if isinstance(body, bytes | bytearray):
        text = bytes(body[:PREVIEW]).decode("latin-1")
    elif isinstance(body, str):
        text = body[:PREVIEW]
    else:
        text = repr(body)[:PREVIEW]
    shown = "".join(c if c.isprintable() else "." for c in text)
    return shown + ("..." if message.body_size() > PREVIEW else "")
