"""MessageTransformers between TextMessage and BytesMessage with a character set, for
providers and clients that only take one of them.

``TextToBytes`` encodes a TextMessage's text into a BytesMessage; ``BytesToText`` decodes a
BytesMessage's body into a TextMessage. The charset is the target's
``<property name="charset" value="ISO-8859-1"/>``, else the charset_name the caller gives,
else UTF-8. Headers and properties are kept (and the String property ``JMS_IMQ_CHARSET``
names the charset used). Other message types pass through unchanged; text that the charset
cannot encode, or bytes it cannot decode, is a transform failure.
"""

from __future__ import annotations

import codecs
from collections.abc import Mapping
from typing import Any

from bridgemgr.jms.errors import MessageFormatException
from bridgemgr.jms.message import HEADER_FIELDS, BytesMessage, Message, TextMessage
from bridgemgr.transform import MessageTransformer

CHARSET_PROPERTY = "JMS_IMQ_CHARSET"


def charset_of(charset_name: str | None, properties: Mapping[str, Any] | None) -> str:
    name = (properties or {}).get("charset") or charset_name or "UTF-8"
    try:
        codecs.lookup(name)
    except LookupError:
        raise MessageFormatException(f"unknown charset {name!r}") from None
    return name


def _carry_over(source: Message, target: Message, charset: str) -> Message:
    """Headers and properties of ``source`` on ``target``."""
    for name in HEADER_FIELDS:
        setattr(target, name, getattr(source, name))
    for name, ptype, value in source.typed_properties():
        target.set_typed_property(name, ptype, value)
    target.set_string_property(CHARSET_PROPERTY, charset)
    return target


class TextToBytes(MessageTransformer):
    def transform(
        self,
        message: Message,
        read_only: bool,
        charset_name: str | None,
        source: str,
        target: str,
        properties: Mapping[str, Any] | None,
    ) -> Message:
        if not isinstance(message, TextMessage):
            return message
        charset = charset_of(charset_name, properties)
        try:
            body = (message.text or "").encode(charset)
        except UnicodeEncodeError as exc:
            raise MessageFormatException(f"the text cannot be encoded as {charset}: {exc}") from None
        return _carry_over(message, BytesMessage(body), charset)


class BytesToText(MessageTransformer):
    def transform(
        self,
        message: Message,
        read_only: bool,
        charset_name: str | None,
        source: str,
        target: str,
        properties: Mapping[str, Any] | None,
    ) -> Message:
        if not isinstance(message, BytesMessage):
            return message
        charset = charset_of(charset_name, properties)
        try:
            text = message.get_body().decode(charset)
        except UnicodeDecodeError as exc:
            raise MessageFormatException(f"the body is not {charset} text: {exc}") from None
        return _carry_over(message, TextMessage(text), charset)
