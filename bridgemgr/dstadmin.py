"""The admin port's destination commands: create, update, query and list the host
broker's physical destinations and their limits.

How it works: the service hands CREATE_DST / UPDATE_DST / QUERY_DST / LIST_DST commands
here with its host broker. Attributes come as the original's names and strings
(``maxNumMsgs=1000``, ``maxTotalMsgBytes=10m``, ``limitBehavior=REMOVE_OLDEST``,
``useDMQ=false``), are checked with the properties' kinds, and go to the broker through
HostBroker.configure_destination (kept in its store). Create refuses a destination that
exists, update one that does not; update changes only the attributes it names.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .admin.protocol import BAD_REQUEST, NOT_FOUND, OK, Command, Reply
from .jms.destination import Destination, Queue, Topic
from .jms.errors import JMSException
from .jms.hostbroker import DestinationAttributes, HostBroker, Principal
from .props import BOOL, LIMIT, LIMIT_BEHAVIOR, SIZE, Kind

# attribute name -> (DestinationAttributes field, kind)
ATTRIBUTES: dict[str, tuple[str, Kind[Any]]] = {
    "maxNumMsgs": ("max_num_msgs", LIMIT),
    "maxTotalMsgBytes": ("max_total_msg_bytes", SIZE),
    "maxBytesPerMsg": ("max_bytes_per_msg", SIZE),
    "limitBehavior": ("limit_behavior", LIMIT_BEHAVIOR),
    "useDMQ": ("use_dmq", BOOL),
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


def destination_command(broker: HostBroker, principal: Principal, cmd: Command,
                        defaults: DestinationAttributes) -> Reply:
    """Carry out one destination command; ``defaults``: what create starts from (the
    imq.autocreate.destination.* attributes)."""
    if cmd.op == "LIST_DST":
        return _list(broker, principal, cmd)
    dest = _destination(cmd)
    found = broker.describe_destination(principal, dest)
    if cmd.op == "QUERY_DST":
        if found is None:
            return Reply(NOT_FOUND, f"{_what(cmd)} does not exist")
        attributes, counts = found
        return Reply(OK, _what(cmd), {"type": cmd.dst_type, "name": cmd.destination,
                                      "attributes": attributes_json(attributes), **counts})
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
    return Reply(OK, f"{_what(cmd)} {verb}", {"type": cmd.dst_type, "name": cmd.destination,
                                              "attributes": attributes_json(attributes)})


def _list(broker: HostBroker, principal: Principal, cmd: Command) -> Reply:
    rows = []
    for key in sorted(broker.destinations(principal)):
        kind, _, name = key.partition(":")
        if kind != "queue" or cmd.dst_type == "t":
            continue  # durable subscriptions are listed with their topic's query
        found = broker.describe_destination(principal, Queue(name))
        if found is not None:
            attributes, counts = found
            rows.append({"type": "q", "name": name, "attributes": attributes_json(attributes), **counts})
    return Reply(OK, f"{len(rows)} destination(s)", {"destinations": rows})
