"""A MessageTransformer that maps properties and headers, driven by the target's
<property> elements (the bridge passes them to transform()):

=====================================  ==============================================
``set.NAME`` = value                   set String property NAME
``rename.OLD`` = NEW                   rename property OLD (type kept)
``drop`` = NAME[,NAME...]              remove properties
``to-header.HEADER`` = NAME            set a header from property NAME
                                       (HEADER: JMSCorrelationID, JMSType, JMSPriority)
``from-header.HEADER`` = NAME          copy a header into String property NAME (HEADER:
                                       JMSMessageID, JMSCorrelationID, JMSType,
                                       JMSTimestamp, JMSDestination, JMSReplyTo)
=====================================  ==============================================

Rules apply in that order; other property names (JMS_SUN_JMSBRIDGE_NAME among them) are
ignored; a rule naming an unknown header is a transform failure (the link's
consume-no-transfer-on-transform-error decides what happens to the message).
An example: docs/transformers.md#headermapping-properties-and-headers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from bridgemgr.jms.errors import JMSException
from bridgemgr.jms.message import Message
from bridgemgr.transform import MessageTransformer

# Header name -> how to read it as a string (from-header) ...
READ_HEADERS: Mapping[str, Callable[[Message], Any]] = {
    "JMSMessageID": lambda m: m.message_id,
    "JMSCorrelationID": lambda m: m.correlation_id,
    "JMSType": lambda m: m.type,
    "JMSTimestamp": lambda m: str(m.timestamp),
    "JMSDestination": lambda m: str(m.destination) if m.destination else None,
    "JMSReplyTo": lambda m: str(m.reply_to) if m.reply_to else None,
}
# ... and how to write it from a property (to-header).
WRITE_HEADERS: Mapping[str, Callable[[Message, str], None]] = {
    "JMSCorrelationID": lambda m, name: setattr(m, "correlation_id", m.get_string_property(name)),
    "JMSType": lambda m, name: setattr(m, "type", m.get_string_property(name)),
    "JMSPriority": lambda m, name: setattr(m, "priority", m.get_int_property(name)),
}


class HeaderMapping(MessageTransformer):
    """Sets, renames and drops properties; copies between headers and properties."""

    def transform(
        self,
        message: Message,
        read_only: bool,
        charset_name: str | None,
        source: str,
        target: str,
        properties: Mapping[str, Any] | None,
    ) -> Message:
        rules = dict(properties or {})
        out = message.copy() if read_only else message
        for key, value in rules.items():
            if key.startswith("set."):
                out.set_string_property(key[4:], value)
        for key, new in rules.items():
            ptype = out.get_property_type(key[7:]) if key.startswith("rename.") else None
            if ptype is not None:  # a rename of a property this message has
                old = key[7:]
                value = out.get_object_property(old)
                _remove(out, old)
                out.set_typed_property(new, ptype, value)
        for name in filter(None, (n.strip() for n in rules.get("drop", "").split(","))):
            _remove(out, name)
        for key, prop in rules.items():
            if key.startswith("to-header."):
                _rule(WRITE_HEADERS, key[10:], key)(out, prop)
        for key, prop in rules.items():
            if key.startswith("from-header."):
                value = _rule(READ_HEADERS, key[12:], key)(message)
                if value is not None:
                    out.set_string_property(prop, value)
        return out


def _rule(table: Mapping[str, Any], header: str, key: str) -> Any:
    try:
        return table[header]
    except KeyError:
        raise JMSException(f"HeaderMapping: {key} names header {header!r}; use one of " + ", ".join(table)) from None


def _remove(message: Message, name: str) -> None:
    """Remove one property (JMS has no call for it: keep the others)."""
    kept = [(n, t, v) for n, t, v in message.typed_properties() if n != name]
    message.clear_properties()
    for n, t, v in kept:
        message.set_typed_property(n, t, v)
