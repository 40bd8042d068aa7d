"""A MessageTransformer plugin for the examples: upper-cases the text of a message.

Named in a bridge XML as
``message-transformer-class="bridgemgr.transformers.uppercase.UppercaseTransformer"``
(its old name ``transformers.uppercase.UppercaseTransformer`` still works). A TextMessage's
text is upper-cased; so is a BytesMessage whose content type is ``text/plain`` (a STOMP
SEND with content-length, which stomp.py adds by default, and that content-type), decoded in
the content type's charset (UTF-8 if it names none) and encoded back, so it stays a
BytesMessage of the same content type. Bytes that charset cannot decode (or upper case
it cannot encode) are a transform failure. Other messages pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bridgemgr.jms.errors import MessageFormatException
from bridgemgr.jms.message import BytesMessage, Message, TextMessage
from bridgemgr.transform import MessageTransformer

# where a message's content type is: the STOMP bridge's and STOMP provider's, the AMQP provider's
CONTENT_TYPE_PROPERTIES = ("JMS_STOMP_CONTENT_TYPE", "JMS_AMQP_CONTENT_TYPE")


def text_charset(message: Message) -> str | None:
    """The charset of a message whose content type is text/plain (UTF-8 unless it names
    one); None for any other content type, or none."""
    for name in CONTENT_TYPE_PROPERTIES:
        value = message.get_object_property(name)
        if isinstance(value, str):
            media, *parameters = (part.strip() for part in value.split(";"))
            if media.lower() != "text/plain":
                return None
            for parameter in parameters:
                key, _, charset = parameter.partition("=")
                if key.strip().lower() == "charset":
                    return charset.strip().strip('"')
            return "utf-8"
    return None


class UppercaseTransformer(MessageTransformer):
    """Upper-cases a TextMessage's body, or a text/plain BytesMessage's; ``properties`` are
    the target's <property> elements."""

    def transform(
        self,
        message: Message,
        read_only: bool,
        charset_name: str | None,
        source: str,
        target: str,
        properties: Mapping[str, Any] | None,
    ) -> Message:
        if isinstance(message, BytesMessage):
            return self._bytes(message, read_only)
        if not isinstance(message, TextMessage) or message.text is None:
            return message
        text = message.text
        if read_only:  # the body may not be changed: send a copy
            message = message.copy()
        message.text = text.upper()
        return message

    @staticmethod
    def _bytes(message: BytesMessage, read_only: bool) -> Message:
        charset = text_charset(message)
        if charset is None:
            return message
        try:
            body = message.get_body().decode(charset).upper().encode(charset)
        except LookupError:
            raise MessageFormatException(f"content type text/plain names an unknown charset {charset!r}") from None
        except UnicodeDecodeError as exc:
            raise MessageFormatException(f"a text/plain body that is not {charset}: {exc}") from None
        except UnicodeEncodeError as exc:
            raise MessageFormatException(f"the upper-cased text cannot be encoded as {charset}: {exc}") from None
        if read_only:
            message = message.copy()
        message.clear_body()
        message.write_bytes(body)
        return message
