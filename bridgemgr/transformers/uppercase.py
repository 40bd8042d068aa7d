"""A MessageTransformer plugin for the examples: upper-cases the text of TextMessages.

Named in a bridge XML as
``message-transformer-class="bridgemgr.transformers.uppercase.UppercaseTransformer"``
(its old name ``transformers.uppercase.UppercaseTransformer`` still works). Other message
types pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bridgemgr.jms.message import Message, TextMessage
from bridgemgr.transform import MessageTransformer


class UppercaseTransformer(MessageTransformer):
    """Upper-cases a TextMessage's body; ``properties`` are the target's <property> elements."""

    def transform(
        self,
        message: Message,
        read_only: bool,
        charset_name: str | None,
        source: str,
        target: str,
        properties: Mapping[str, Any] | None,
    ) -> Message:
        if not isinstance(message, TextMessage) or message.text is None:
            return message
        text = message.text
        if read_only:  # the body may not be changed: send a copy
            message = message.copy()
        message.text = text.upper()
        return message
