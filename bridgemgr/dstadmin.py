"""The admin port's destination commands: create, update, query, list, purge, browse,
destroy, pause and resume the host broker's physical destinations; list its connections
and the instance's services.

How it works: the service hands CREATE_DST / UPDATE_DST / QUERY_DST / LIST_DST commands
here with its host broker. Attributes come as the original's names and strings
(``maxNumMsgs=1000``, ``maxTotalMsgBytes=10m``, ``limitBehavior=REMOVE_OLDEST``,
``useDMQ=false``; poison messages: ``backoutThreshold=3``, ``backoutQueue=NAME``,
``backoutDisposition=dmq|discard``; an HA cluster's ``localDeliveryPreferred``,
``isLocalOnly``; ``maxNumProducers``, ``maxNumActiveConsumers``, ``maxNumBackupConsumers``,
``consumerFlowLimit``), are checked with the properties' kinds, and go to the broker through
HostBroker.configure_destination (kept in its store). Create refuses a destination that
exists, update one that does not; update changes only the attributes it names. Purge
removes the waiting messages (paged-out ones too; those in delivery stay) through
HostBroker.purge_destination and says how many; browse shows the first N waiting messages
of a queue: headers, properties, body type and size, a short printable preview and the
whole body as JSON (text as it is, bytes base64; an ObjectMessage's serialized form is
never deserialized). Destroy, pause and resume (imqcmd's meaning) and list cxn / list svc:
docs/operations.md#destinations-connections-and-services. On an HA instance (a
ClusterCatalog given) create, update and destroy go to every instance and list shows the
cluster's destinations, each with its instances' counts (docs/ha.md).
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .admin.protocol import BAD_REQUEST, NOT_FOUND, OK, UNAVAILABLE, Command, Reply
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
    "maxNumProducers": ("max_num_producers", LIMIT),
    "maxNumActiveConsumers": ("max_num_active_consumers", LIMIT),
    "maxNumBackupConsumers": ("max_num_backup_consumers", LIMIT),
    "consumerFlowLimit": ("consumer_flow_limit", LIMIT),
}


COUNTED = (  # what list dst sums over an HA cluster's instances
    "pending",
    "unacked",
    "bytes",
    "producers_waiting",
    "producers",
    "consumers",
    "subscriptions",
    "durable_subscriptions",
)
_FIELDS = frozenset(f.name for f in dataclasses.fields(DestinationAttributes))


class ClusterCatalog(Protocol):
    """An HA cluster's destinations (providers/embedded/clustercatalog.py)."""

    def record(self, destination: Destination, destroyed: bool) -> list[str]:
        """Propagate an administrator's change made here; the live instances not caught up."""
        ...

    def peer_rows(self) -> list[tuple[str, float, list[dict[str, Any]]]]:
        """The other live instances': (broker id, age in seconds, list dst rows)."""
        ...

    def consumers_elsewhere(self, destination: Destination) -> dict[str, int]: ...


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
    cluster: ClusterCatalog | None = None,
    instance: str = "",
) -> Reply:
    """Carry out one destination command (or LIST_CXN, LIST_SVC); ``defaults``: what
    create starts from (the imq.autocreate.destination.* attributes); ``services``: the
    port mapper's table (LIST_SVC); ``cluster``: an HA instance's; ``instance``: this
    instance's broker id (or name), as list dst names it."""
    if cmd.op == "LIST_DST":
        return _list(broker, principal, cmd, cluster, instance)
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
        return _destroy(broker, principal, cmd, cluster)
    if cmd.op == "PURGE_DST":
        return _purge(broker, principal, cmd)
    if cmd.op == "BROWSE_DST":
        return _browse(broker, principal, cmd)
    dest = _destination(cmd)
    found = broker.describe_destination(principal, dest)
    if cmd.op == "QUERY_DST":
        return _query(broker, principal, cmd, found, cluster, instance)
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
    behind = _propagate(cluster, dest, False, f"{_what(cmd)} {verb} here")
    if isinstance(behind, Reply):
        return behind
    return Reply(
        OK,
        f"{_what(cmd)} {verb}{_not_yet(behind)}",
        {"type": cmd.dst_type, "name": cmd.destination, "attributes": attributes_json(attributes)}
        | ({"not_yet": behind} if behind else {}),
    )


def _query(
    broker: HostBroker,
    principal: Principal,
    cmd: Command,
    found: tuple[DestinationAttributes, dict[str, Any]] | None,
    cluster: ClusterCatalog | None,
    instance: str,
) -> Reply:
    """query dst: the destination's attributes and counts; on an HA instance the cluster's,
    as list dst gives them (the sums, and ``instances``: each live instance's counts)."""
    dest = _destination(cmd)
    rows = []
    if found is not None:
        attributes, counts = found
        state = broker.destination_state(principal, dest)
        rows.append(
            {
                "type": cmd.dst_type,
                "name": cmd.destination,
                "state": state,
                "temporary": False,
                "attributes": attributes_json(attributes),
                **counts,
            }
        )
    if cluster is not None:
        try:
            peers = cluster.peer_rows()
        except JMSException as exc:
            return Reply(UNAVAILABLE, f"the HA cluster's destinations cannot be read: {exc}")
        wanted = [
            (b, age, [r for r in theirs if (r["type"], r["name"]) == (cmd.dst_type, cmd.destination)])
            for b, age, theirs in peers
        ]
        rows = cluster_rows(rows, instance, wanted)
    if not rows:
        return Reply(NOT_FOUND, f"{_what(cmd)} does not exist")
    return Reply(OK, _what(cmd), rows[0])


def _propagate(cluster: ClusterCatalog | None, dest: Destination, destroyed: bool, done: str) -> list[str] | Reply:
    """An administrator's change made here, on every instance of the HA cluster: the
    instances that did not catch up in time, or the error reply."""
    if cluster is None:
        return []
    try:
        return cluster.record(dest, destroyed)
    except JMSException as exc:
        return Reply(UNAVAILABLE, f"{done}, but not on the HA cluster's other instances: {exc}")


def _not_yet(behind: list[str]) -> str:
    if not behind:
        return ""
    return f" (not yet on broker {', '.join(behind)}: it will be when it reads the cluster's destinations)"


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


def _list(
    broker: HostBroker, principal: Principal, cmd: Command, cluster: ClusterCatalog | None, instance: str
) -> Reply:
    rows = _rows(broker, principal, cmd.dst_type, cmd.temporary)
    try:
        peers = cluster.peer_rows() if cluster is not None else []
    except JMSException as exc:
        return Reply(UNAVAILABLE, f"the HA cluster's destinations cannot be read: {exc}")
    wanted = {"q", "t"} if cmd.dst_type is None else {cmd.dst_type}
    peers = [(b, age, [r for r in rows if r["type"] in wanted]) for b, age, rows in peers]
    rows = cluster_rows(rows, instance, peers)
    return Reply(OK, f"{len(rows)} destination(s)", {"destinations": rows})


def cluster_rows(
    local: list[dict[str, Any]], instance: str, peers: list[tuple[str, float, list[dict[str, Any]]]]
) -> list[dict[str, Any]]:
    """list dst's rows: each destination once, with ``instances`` (this one's counts, age
    0, then each peer's as published, with its age in seconds) and their sums."""
    merged: dict[tuple[str, str, bool], dict[str, Any]] = {}
    for row in local:
        merged[(row["type"], row["name"], row["temporary"])] = {**row, "instances": [_counts(instance, 0.0, row)]}
    for brokerid, age, rows in peers:
        for row in rows:
            entry = merged.get((row["type"], row["name"], False))
            if entry is None:
                attributes = DestinationAttributes(**{k: v for k, v in row["attributes"].items() if k in _FIELDS})
                entry = merged[(row["type"], row["name"], False)] = {
                    **row,
                    "temporary": False,
                    "attributes": attributes_json(attributes),
                    "instances": [],
                }
            entry["instances"].append(_counts(brokerid, age, row))
    for entry in merged.values():
        for key in COUNTED:
            if key in entry:
                entry[key] = sum(i.get(key, 0) for i in entry["instances"])
        if "durable_subscriptions" in entry:  # one in the cluster, which every instance holds
            durable = max(i.get("durable_subscriptions", 0) for i in entry["instances"])
            entry["subscriptions"] -= entry["durable_subscriptions"] - durable
            entry["durable_subscriptions"] = durable
    return sorted(merged.values(), key=lambda r: (r["name"], r["type"] == "t"))


def _counts(brokerid: str, age: float, row: dict[str, Any]) -> dict[str, Any]:
    return {"broker_id": brokerid, "age": round(age, 1), **{k: row[k] for k in COUNTED if k in row}}


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


def _destroy(broker: HostBroker, principal: Principal, cmd: Command, cluster: ClusterCatalog | None) -> Reply:
    dest = _destination(cmd)
    known = False  # another instance of the HA cluster has it
    if cluster is not None:
        try:
            elsewhere = cluster.consumers_elsewhere(dest)
            known = any(
                r["name"] == dest.name and r["type"] == cmd.dst_type for _, _, rows in cluster.peer_rows() for r in rows
            )
        except JMSException as exc:
            return Reply(UNAVAILABLE, f"the HA cluster's destinations cannot be read: {exc}")
        if elsewhere:
            where = ", ".join(f"{n} on broker {b}" for b, n in sorted(elsewhere.items()))
            return Reply(BAD_REQUEST, f"{_what(cmd)} has active consumer(s) ({where}); close them first")
    try:
        removed = broker.destroy_destination(principal, dest)
    except JMSException as exc:
        return Reply(BAD_REQUEST, str(exc))
    if removed is None and not known:
        return Reply(NOT_FOUND, f"{_what(cmd)} does not exist")
    behind = _propagate(cluster, dest, True, f"{_what(cmd)} destroyed here")
    if isinstance(behind, Reply):
        return behind
    removed = removed or 0
    return Reply(
        OK,
        f"{_what(cmd)} destroyed with {removed} message(s){' here, and on every instance' if cluster else ''}"
        + _not_yet(behind),
        {"type": cmd.dst_type, "name": cmd.destination, "removed": removed} | ({"not_yet": behind} if behind else {}),
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
