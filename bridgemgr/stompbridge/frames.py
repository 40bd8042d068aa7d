"""STOMP frames: the Frame value, the incremental parser and the encoder (no I/O).

parse_frame() is a pure function: given the bytes received so far and where the next frame
starts, it returns the frame and where the one after it starts, None when more bytes are
needed, or raises LocalProtocolError. The encoder escapes by the version's rules and
refuses (HeaderNotEncodable) a value the version cannot carry.

Rules: limits (frame size, header count and length) are checked as bytes arrive; a raw NUL,
or a carriage return that does not end a line, in a header is refused, never passed on.

Design notes: docs/stomp-bridge.md#internals-stompbridgeframespy.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import overload

V10, V11, V12 = "1.0", "1.1", "1.2"
VERSIONS = (V10, V11, V12)  # oldest first
PRE_CONNECT = None  # dialect of frames read before the version is negotiated

CONNECT, STOMP, SEND, SUBSCRIBE, UNSUBSCRIBE = "CONNECT", "STOMP", "SEND", "SUBSCRIBE", "UNSUBSCRIBE"
ACK, NACK, BEGIN, COMMIT, ABORT, DISCONNECT = "ACK", "NACK", "BEGIN", "COMMIT", "ABORT", "DISCONNECT"
CONNECTED, MESSAGE, RECEIPT, ERROR = "CONNECTED", "MESSAGE", "RECEIPT", "ERROR"
CLIENT_COMMANDS = frozenset({CONNECT, STOMP, SEND, SUBSCRIBE, UNSUBSCRIBE, ACK, NACK, BEGIN, COMMIT, ABORT, DISCONNECT})
SERVER_COMMANDS = frozenset({CONNECTED, MESSAGE, RECEIPT, ERROR})
COMMANDS = CLIENT_COMMANDS | SERVER_COMMANDS
UNESCAPED_COMMANDS = frozenset({CONNECT, STOMP, CONNECTED})  # never escaped (spec 1.1, 1.2)

HEARTBEAT = b"\n"


class ProtocolError(Exception):
    """A STOMP protocol violation. ``message`` is the short text of the ERROR frame's
    message header; ``detail`` its body. Not raised directly: see the two subclasses."""

    def __init__(self, message: str, detail: str = "") -> None:
        if type(self) is ProtocolError:
            raise TypeError("raise LocalProtocolError or RemoteProtocolError")
        super().__init__(message)
        self.message = message
        self.detail = detail or message


class LocalProtocolError(ProtocolError):
    """Raised inside the codec and the session; the session turns it into a
    RemoteProtocolError (the peer broke the protocol) and answers with ERROR."""


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol; the session is in ERROR for good."""


class HeaderNotEncodable(LocalProtocolError):
    """A header name or value the frame's version cannot carry; never written mangled."""

    def __init__(self, command: str, header: str, problem: str) -> None:
        super().__init__("header not encodable", f"{command}: the header {header[:80]!r} {problem}")
        self.header = header


@dataclass(frozen=True)
class Limits:
    """Bounds against abusive peers (also the bound on an incomplete frame)."""

    max_frame_size: int = 16 * 1024 * 1024  # command + headers + body, bytes
    max_headers: int = 1000
    max_header_length: int = 10240  # one header line, bytes


DEFAULT_LIMITS = Limits()


@dataclass(slots=True)
class Frame:
    """One STOMP frame. ``headers`` keeps the first value of each name, in order. Not
    frozen (a frozen dataclass's __init__ costs a parsed frame 0.3 µs): nothing changes one."""

    command: str
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""

    @overload
    def get(self, name: str) -> str | None: ...
    @overload
    def get(self, name: str, default: str) -> str: ...
    def get(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name, default)

    def __repr__(self) -> str:
        body = self.body if len(self.body) <= 60 else self.body[:60] + b"..."
        return f"Frame({self.command}, {dict(self.headers)!r}, {body!r})"


# --- header escaping ---------------------------------------------------------------------

_UNESCAPE = {V11: {"\\n": "\n", "\\c": ":", "\\\\": "\\"}, V12: {"\\n": "\n", "\\c": ":", "\\\\": "\\", "\\r": "\r"}}


def _escape_11(text: str) -> str:
    # str.replace behind "in" tests: several times faster than str.translate on short headers
    if "\\" in text:
        text = text.replace("\\", "\\\\")
    if "\n" in text:
        text = text.replace("\n", "\\n")
    if ":" in text:
        text = text.replace(":", "\\c")
    return text


def _escape_12(text: str) -> str:
    text = _escape_11(text)
    return text.replace("\r", "\\r") if "\r" in text else text


_ESCAPE: dict[str, Callable[[str], str]] = {V11: _escape_11, V12: _escape_12}
_ESCAPE_SEQ = re.compile(r"\\.?", re.DOTALL)


def unescape(text: str, version: str) -> str:
    """Undo 1.1/1.2 header escaping; an undefined escape is a fatal protocol error.

    A NUL (which the parser refuses raw in a header) stands in for the escaped
    backslashes while the other escapes are replaced: str.replace is several times
    faster than a regular expression with a callback."""
    if "\\" not in text:
        return text
    if "\0" in text:
        return _unescape_each(text, version)
    plain = text.replace("\\\\", "\0")  # left to right, as a reader pairs them
    if "\\n" in plain:
        plain = plain.replace("\\n", "\n")
    if "\\c" in plain:
        plain = plain.replace("\\c", ":")
    if version == V12 and "\\r" in plain:
        plain = plain.replace("\\r", "\r")
    if "\\" in plain:  # an escape the version does not define: the regex names it
        return _unescape_each(text, version)
    return plain.replace("\0", "\\") if "\0" in plain else plain


def _unescape_each(text: str, version: str) -> str:
    """unescape() one escape sequence at a time: the reference, and the error message."""
    table = _UNESCAPE[version]

    def one(match: re.Match[str]) -> str:
        seq = match.group(0)
        if seq not in table:
            raise LocalProtocolError(
                "invalid header escape",
                f"the header {text[:80]!r} has the escape {seq!r}, which STOMP "
                f"{version} does not define (use \\n, \\c, \\\\" + (", \\r" if version == V12 else "") + ")",
            )
        return table[seq]

    return _ESCAPE_SEQ.sub(one, text)


def escaper(version: str | None) -> Callable[[str], str] | None:
    """``version``'s header escape function; None for 1.0 and PRE_CONNECT (no escapes)."""
    return _ESCAPE.get(version or "")


def escape(text: str, version: str | None) -> str:
    """Escape a header name or value for ``version`` (1.0 and PRE_CONNECT: unchanged; see
    encode_frame for what they cannot carry)."""
    if version in _ESCAPE:
        return _ESCAPE[version](text)
    return text


# --- parsing -------------------------------------------------------------------------------


def parse_frame(
    buf: bytes | bytearray, pos: int, version: str | None, limits: Limits = DEFAULT_LIMITS
) -> tuple[Frame | None, int]:
    """The frame starting at ``pos`` (after any heart-beat EOLs) and the offset just past
    its NUL; or (None, offset of the incomplete frame) when more bytes are needed.

    ``version`` is the negotiated version, or PRE_CONNECT. Raises LocalProtocolError.
    """
    if buf.startswith(_ACK_ID, pos):
        ack = _usual_ack(buf, pos, limits)
        if ack is not None:
            return ack
    return _parse_general(buf, pos, version, limits)


_ACK_ID = b"ACK\nid:"
_ACK_DIGITS = 20  # the longest id _usual_ack matches (ours are counters)


def _usual_ack(buf: bytes | bytearray, pos: int, limits: Limits) -> tuple[Frame, int] | None:
    """The frame at ``pos`` when it is exactly "ACK\nid:DIGITS\n\n\0" within ``limits``
    (no escape, CR, NUL or length rule can apply to it, in any version), else None."""
    start = pos + len(_ACK_ID)
    end = buf.find(b"\n\n\0", start, start + _ACK_DIGITS + 3)
    if end <= start:
        return None
    digits = buf[start:end]
    if (
        not digits.isdigit()
        or end + 3 - pos > limits.max_frame_size
        or end - pos - 4 > limits.max_header_length
        or limits.max_headers < 1
    ):
        return None
    return Frame(ACK, {"id": digits.decode("ascii")}), end + 3


def _parse_general(buf: bytes | bytearray, pos: int, version: str | None, limits: Limits) -> tuple[Frame | None, int]:
    """parse_frame() for any bytes."""
    n = len(buf)
    crlf = version is None or version == V12  # \r\n line ends allowed
    while pos < n:
        byte = buf[pos]
        if byte == 10:
            pos += 1
        elif byte == 13 and crlf:
            if pos + 1 >= n:
                return None, pos
            if buf[pos + 1] != 10:
                raise LocalProtocolError("malformed frame", "a carriage return not followed by a line feed")
            pos += 2
        else:
            break
    if pos >= n:
        return None, pos
    head_end = buf.find(b"\n\n", pos)
    sep = 2
    if crlf:
        stop = n if head_end < 0 else head_end
        crlf_end = buf.find(b"\n\r\n", pos, stop + 1)
        if crlf_end >= 0:
            head_end, sep = crlf_end, 3
    if head_end < 0:
        _check_incomplete_head(buf, pos, n, limits)
        return None, pos
    try:
        head = buf[pos:head_end].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LocalProtocolError("malformed frame", f"the command and headers are not UTF-8 ({exc})") from None
    headers = None
    if "\r" not in head and "\0" not in head:  # the usual head: no CR to strip, no NUL to refuse
        command, _, rest = head.partition("\n")
        if command not in COMMANDS:
            _refuse_command(command)
        if head_end - pos <= limits.max_header_length:  # no line can be too long
            headers = _plain_headers(rest, command, version, limits)
    if headers is None:
        lines = head.split("\n")
        if crlf:
            lines = [line[:-1] if line.endswith("\r") else line for line in lines]
        command = lines[0]
        if command not in COMMANDS:
            _refuse_command(command)
        headers = _parse_headers(lines, command, version, limits)
    body_start = head_end + sep
    length_text = headers.get("content-length")
    if length_text is not None:
        length = _content_length(length_text, limits)
        end = body_start + length
        if end - pos > limits.max_frame_size:
            raise _too_big(end - pos, limits)
        if end >= n:
            return None, pos
        if buf[end] != 0:
            raise LocalProtocolError(
                "malformed frame",
                f"{command}: content-length is {length} but the "
                "byte after that many body bytes is not the NUL that ends a frame",
            )
    else:
        end = buf.find(b"\0", body_start)
        if end < 0:
            if n - pos > limits.max_frame_size:
                raise _too_big(n - pos, limits)
            return None, pos
        if end - pos > limits.max_frame_size:
            raise _too_big(end - pos, limits)
    return Frame(command, headers, bytes(buf[body_start:end])), end + 1


def _check_incomplete_head(buf: bytes | bytearray, pos: int, n: int, limits: Limits) -> None:
    last_nl = buf.rfind(b"\n", pos, n)
    line_start = pos if last_nl < 0 else last_nl + 1
    if n - line_start > limits.max_header_length:
        raise LocalProtocolError(
            "header too long", f"a command or header line is longer than {limits.max_header_length} bytes"
        )
    if buf.count(b"\n", pos, n) > limits.max_headers + 1:
        raise LocalProtocolError("too many headers", f"a frame has more than {limits.max_headers} headers")
    if n - pos > limits.max_frame_size:
        raise _too_big(n - pos, limits)


def _refuse_command(command: str) -> None:
    shown = command if len(command) <= 40 else command[:40] + "..."
    raise LocalProtocolError(
        "unknown command", f"{shown!r} is not a STOMP command; expected one of " + ", ".join(sorted(CLIENT_COMMANDS))
    )


def _plain_headers(text: str, command: str, version: str | None, limits: Limits) -> dict[str, str] | None:
    """The headers of the usual frame, or None for _parse_headers() to decide (and name
    what is wrong). ``text`` is the header lines; the caller has seen no CR or NUL in
    them, and no more bytes than one line may have. A line without a colon, an empty
    name, a repeated name or an undefined escape declines. dict() of a list of
    [name, value] pairs builds the headers in C."""
    if not text:
        return {}
    lines = text.split("\n")
    if len(lines) > limits.max_headers:
        return None
    try:
        headers = dict([line.split(":", 1) for line in lines])
    except ValueError:  # a line without a colon
        return None
    if len(headers) != len(lines) or "" in headers:
        return None
    if "\\" in text and version in _UNESCAPE and command not in UNESCAPED_COMMANDS:
        try:
            if "\\" in "".join(headers):  # an escaped name: rebuilt, in order
                return {unescape(name, version): unescape(value, version) for name, value in headers.items()}
            for name in [name for name, value in headers.items() if "\\" in value]:  # the usual: a value or two
                headers[name] = unescape(headers[name], version)
        except LocalProtocolError:
            return None
    return headers


def _parse_headers(lines: list[str], command: str, version: str | None, limits: Limits) -> dict[str, str]:
    if len(lines) - 1 > limits.max_headers:
        raise LocalProtocolError(
            "too many headers", f"{command} has {len(lines) - 1} headers; at most {limits.max_headers} are allowed"
        )
    escaped = version if version in _UNESCAPE and command not in UNESCAPED_COMMANDS else None
    headers: dict[str, str] = {}
    raw_controls = any("\0" in line or "\r" in line for line in lines)
    for line in lines[1:]:
        if raw_controls:
            _refuse_raw_controls(line, command)
        if len(line) > limits.max_header_length and len(line.encode()) > limits.max_header_length:
            raise LocalProtocolError(
                "header too long", f"{command}: a header line is longer than {limits.max_header_length} bytes"
            )
        name, colon, value = line.partition(":")
        if not colon or not name:
            raise LocalProtocolError("malformed header", f"{command}: the header line {line[:80]!r} is not name:value")
        if escaped is not None:
            name, value = unescape(name, escaped), unescape(value, escaped)
        if name not in headers:
            headers[name] = value
    return headers


def _refuse_raw_controls(line: str, command: str) -> None:
    """A raw NUL or CR in a header line (its line-ending CR already removed) is refused."""
    for char, what in (("\0", "a NUL byte"), ("\r", "a carriage return")):
        if char in line:
            name = line.partition(":")[0]
            raise LocalProtocolError(
                "invalid header",
                f"{command}: the header {name[:80]!r} holds "
                f"{what} written raw; a STOMP header cannot contain a NUL "
                "(it ends a frame) nor a bare carriage return (in STOMP 1.2 "
                "write it as the escape \\r)",
            )


def _content_length(text: str, limits: Limits) -> int:
    text = text.strip()
    if not text.isdigit() or not text.isascii():
        raise LocalProtocolError(
            "invalid content-length", f"content-length {text[:40]!r} is not a whole number of bytes"
        )
    length = int(text)
    if length > limits.max_frame_size:
        raise _too_big(length, limits)
    return length


def _too_big(size: int, limits: Limits) -> LocalProtocolError:
    return LocalProtocolError(
        "frame too large", f"a frame of {size} bytes or more exceeds the limit of {limits.max_frame_size} bytes"
    )


# --- encoding ------------------------------------------------------------------------------


def encode_frame(frame: Frame, version: str | None) -> bytes:
    """The bytes of ``frame`` in ``version``'s dialect (PRE_CONNECT: unescaped). Raises
    HeaderNotEncodable rather than write a header the peer would read differently."""
    headers = frame.headers
    esc = _ESCAPE.get(version or "") if frame.command not in UNESCAPED_COMMANDS else None
    escaped = esc is not None
    parts = [frame.command]
    if esc is not None:
        parts += [f"{esc(k)}:{esc(v)}" for k, v in headers.items()]
    else:
        parts += [f"{k}:{v}" for k, v in headers.items()]
    parts.append("\n")
    head = "\n".join(parts)
    # one scan of the whole head in the usual case; the culprit is looked for on failure
    if (
        "\0" in head
        or "\r" in head
        or "" in headers
        or (not escaped and (head.count("\n") != len(headers) + 2 or any(":" in k for k in headers)))
    ):
        _refuse_unencodable(frame, version, escaped)
    return head.encode("utf-8") + frame.body + b"\0"


def _refuse_unencodable(frame: Frame, version: str | None, escaped: bool) -> None:
    """Raise HeaderNotEncodable for the first header ``version`` cannot carry."""
    if escaped:
        where = f"STOMP {version}"
    elif version in _ESCAPE:
        where = f"a {frame.command} frame (its headers are never escaped)"
    elif version == V10:
        where = "STOMP 1.0 (it has no header escapes)"
    else:
        where = "a frame written before the version is negotiated (unescaped)"
    for name, value in frame.headers.items():
        if not name:
            raise HeaderNotEncodable(frame.command, name, "has an empty name")
        for text, part in ((name, "name"), (value, "value")):
            if "\0" in text:
                raise HeaderNotEncodable(
                    frame.command, name, f"{part} holds a NUL byte, which no STOMP version can carry in a header"
                )
            if "\r" in text and (not escaped or version == V11):
                raise HeaderNotEncodable(
                    frame.command,
                    name,
                    f"{part} holds a carriage return, which {where} cannot carry (only STOMP 1.2 escapes it)",
                )
            if "\n" in text and not escaped:
                raise HeaderNotEncodable(
                    frame.command,
                    name,
                    f"{part} holds a line feed, which {where} cannot carry; connect with STOMP 1.1 or 1.2",
                )
        if ":" in name and not escaped:
            raise HeaderNotEncodable(frame.command, name, f"name holds a colon, which {where} cannot carry")
    raise AssertionError(f"no unencodable header in {frame!r}")  # pragma: no cover
