"""Transformers for benchmarks/spark.py: a CPU-heavy one (XML parsed and written again
in pure Python, ~0.6 ms per 1 KiB message) and a trivial one (per-message overhead)."""

from __future__ import annotations

import xml.dom.minidom
from typing import Any

from bridgemgr.jms.message import Message, TextMessage
from bridgemgr.transform import MessageTransformer


class ReserialiseXML(MessageTransformer):
    """Parse the text as XML and send it re-serialised (a real format conversion's cost)."""

    def transform(self, message: Message, *args: Any) -> Message:
        assert isinstance(message, TextMessage) and message.text is not None
        out = message.copy()
        out.text = xml.dom.minidom.parseString(message.text).documentElement.toxml()
        return out


class Identity(MessageTransformer):
    """The message as it is."""

    def transform(self, message: Message, *args: Any) -> Message:
        return message
