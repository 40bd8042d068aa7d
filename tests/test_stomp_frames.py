"""The sans-IO STOMP codec: any split of the stream, bodies, escaping per version, limits."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from unittest import mock

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bridgemgr.stompbridge import frames as codec
from bridgemgr.stompbridge.frames import (
    CONNECT,
    CONNECTED,
    MESSAGE,
    PRE_CONNECT,
    SEND,
    V10,
    V11,
    V12,
    Frame,
    HeaderNotEncodable,
    Limits,
    LocalProtocolError,
    encode_frame,
    parse_frame,
)


def parse_all(data: bytes, version: str | None = V12, limits: Limits = Limits()) -> list[Frame]:
    frames, pos = [], 0
    while True:
        frame, pos = parse_frame(data, pos, version, limits)
        if frame is None:
            assert pos <= len(data)
            return frames
        frames.append(frame)


@contextmanager
def refused(kind: type[LocalProtocolError], detail: str) -> Iterator[None]:
    """The block raises ``kind`` whose detail (the ERROR frame's body) contains ``detail``."""
    with pytest.raises(kind) as info:
        yield
    assert detail in info.value.detail, info.value.detail


def feed_in_pieces(data: bytes, cuts: list[int], version: str | None = V12) -> list[Frame]:
    """What a session does: append each piece, parse what is complete, drop what is used."""
    buf, frames, last = bytearray(), [], 0
    for cut in [*sorted(set(cuts)), len(data)]:
        buf += data[last:cut]
        last = cut
        pos = 0
        while True:
            frame, pos = parse_frame(buf, pos, version)
            if frame is None:
                break
            frames.append(frame)
        del buf[:pos]
    return frames


def test_a_simple_frame_and_the_need_for_more_bytes():
    data = b"SEND\ndestination:/queue/a\n\nhello\0"
    assert parse_all(data) == [Frame(SEND, {"destination": "/queue/a"}, b"hello")]
    for i in range(len(data)):
        assert parse_frame(data[:i], 0, V12) == (None, 0)


def test_content_length_bodies_may_hold_nuls():
    body = b"a\0b\0\0c"
    data = b"SEND\ndestination:/queue/a\ncontent-length:6\n\n" + body + b"\0"
    assert parse_all(data)[0].body == body
    assert parse_frame(data[:-1], 0, V12) == (None, 0)


def test_content_length_must_end_with_nul():
    with pytest.raises(LocalProtocolError, match="malformed frame"):
        parse_all(b"SEND\ncontent-length:2\n\nabc\0")


@pytest.mark.parametrize("value", ["-1", "x", "1.5", "", "١"])  # noqa: RUF001  (an Arabic-Indic digit: not ASCII)
def test_content_length_must_be_a_number(value):
    with pytest.raises(LocalProtocolError, match="invalid content-length"):
        parse_all(f"SEND\ncontent-length:{value}\n\nabc\0".encode())


def test_heart_beat_eols_between_frames_are_skipped():
    data = b"\n\r\n\nSEND\n\nx\0\n\n\r\nSEND\n\ny\0\n"
    assert [f.body for f in parse_all(data, V12)] == [b"x", b"y"]


def test_crlf_line_ends_only_in_1_2_and_before_connect():
    data = b"SEND\r\ndestination:/queue/a\r\n\r\nx\0"
    assert parse_all(data, V12)[0].headers == {"destination": "/queue/a"}
    assert parse_all(b"CONNECT\r\nlogin:u\r\npasscode:p\r\n\r\n\0", PRE_CONNECT)[0].headers == {
        "login": "u",
        "passcode": "p",
    }
    # in 1.1 a \r before the \n is no line end: a raw carriage return in a header, refused
    with refused(LocalProtocolError, "SEND: the header 'destination' holds a carriage return"):
        parse_all(b"SEND\ndestination:/queue/a\r\n\nx\0", V11)
    with pytest.raises(LocalProtocolError):
        parse_all(b"\r\nSEND\n\nx\0", V11)


def test_repeated_headers_keep_the_first_value():
    frame = parse_all(b"SEND\ndestination:/queue/a\ndestination:/queue/b\nfoo:1\nfoo:2\n\n\0")[0]
    assert frame.headers == {"destination": "/queue/a", "foo": "1"}


@pytest.mark.parametrize(
    "version,raw,value",
    [
        (V11, r"a\cb\nc\\d", "a:b\nc\\d"),
        (V12, r"a\cb\nc\\d\re", "a:b\nc\\d\re"),
        (V10, r"a\cb\nc", r"a\cb\nc"),
    ],
)
def test_header_unescaping_per_version(version, raw, value):
    frame = parse_all(f"SEND\nk:{raw}\n\n\0".encode(), version)[0]
    assert frame.headers["k"] == value


def test_connect_and_connected_are_never_escaped():
    frame = parse_all(b"CONNECT\nlogin:a\\cb\npasscode:p\\q\n\n\0", V12)[0]
    assert frame.headers == {"login": "a\\cb", "passcode": "p\\q"}
    assert encode_frame(Frame(CONNECTED, {"server": "x:y"}), V12) == b"CONNECTED\nserver:x:y\n\n\0"


@pytest.mark.parametrize("version,escape", [(V11, r"\r"), (V11, r"\t"), (V12, r"\t"), (V12, "\\")])
def test_undefined_escapes_are_fatal(version, escape):
    with pytest.raises(LocalProtocolError, match="invalid header escape"):
        parse_all(f"SEND\nk:a{escape}\n\n\0".encode(), version)


@pytest.mark.parametrize(
    "data,message",
    [
        (b"HELLO\n\n\0", "unknown command"),
        (b"\xff\xfe\n\n\0", "malformed frame"),
        (b"SEND\nnocolon\n\n\0", "malformed header"),
        (b"SEND\n:value\n\n\0", "malformed header"),
    ],
)
def test_malformed_frames(data, message):
    with pytest.raises(LocalProtocolError, match=message):
        parse_all(data)


def test_limits_frame_size_headers_and_header_length():
    small = Limits(max_frame_size=100, max_headers=3, max_header_length=20)
    with pytest.raises(LocalProtocolError, match="frame too large"):
        parse_all(b"SEND\n\n" + b"x" * 200 + b"\0", V12, small)
    with pytest.raises(LocalProtocolError, match="frame too large"):  # refused before the body arrives
        parse_frame(b"SEND\ncontent-length:5000\n\nabc", 0, V12, small)
    with pytest.raises(LocalProtocolError, match="frame too large"):  # an endless body without NUL
        parse_frame(b"SEND\n\n" + b"x" * 150, 0, V12, small)
    with pytest.raises(LocalProtocolError, match="too many headers"):
        parse_all(b"SEND\na:1\nb:2\nc:3\nd:4\n\n\0", V12, small)
    with pytest.raises(LocalProtocolError, match="header too long"):
        parse_all(b"SEND\na:" + b"y" * 30 + b"\n\n\0", V12, small)
    with pytest.raises(LocalProtocolError, match="header too long"):  # an endless header line
        parse_frame(b"SEND\na:" + b"y" * 30, 0, V12, small)
    with pytest.raises(LocalProtocolError, match="too many headers"):  # endless headers
        parse_frame(b"SEND\n" + b"a:1\n" * 10, 0, V12, small)
    with pytest.raises(LocalProtocolError, match="header too long"):  # garbage without newlines
        parse_frame(b"\x01" * 50, 0, V12, small)


def test_encoding_escapes_per_version():
    frame = Frame(MESSAGE, {"k:1": "a\nb:c\\d\re"}, b"body")
    assert encode_frame(frame, V12) == b"MESSAGE\nk\\c1:a\\nb\\cc\\\\d\\re\n\nbody\0"
    assert encode_frame(Frame(MESSAGE, {"k:1": "a\nb:c\\d"}), V11) == b"MESSAGE\nk\\c1:a\\nb\\cc\\\\d\n\n\0"
    assert encode_frame(Frame(MESSAGE, {"k": "b:c\\d"}), V10) == b"MESSAGE\nk:b:c\\d\n\n\0"


@pytest.mark.parametrize(
    "version,headers,problem",
    [
        (V12, {"k": "a\0b"}, "'k' value holds a NUL byte"),
        (V11, {"k": "a\rb"}, "'k' value holds a carriage return, which STOMP 1.1 cannot carry"),
        (V10, {"k": "a\nb"}, "'k' value holds a line feed, which STOMP 1.0"),
        (V10, {"k": "a\rb"}, "'k' value holds a carriage return, which STOMP 1.0"),
        (V10, {"k:1": "a"}, "'k:1' name holds a colon"),
        (PRE_CONNECT, {"k": "a\nb"}, "'k' value holds a line feed"),
        (V12, {"": "a"}, "'' has an empty name"),
    ],
)
def test_a_header_the_version_cannot_carry_is_refused_not_mangled(version, headers, problem):
    with refused(HeaderNotEncodable, f"MESSAGE: the header {problem}"):
        encode_frame(Frame(MESSAGE, headers, b"body"), version)
    with refused(HeaderNotEncodable, "CONNECTED: the header 'k' value holds a line feed, which a CONNECTED frame"):
        encode_frame(Frame(CONNECTED, {"k": "a\nb"}), V12)


@pytest.mark.parametrize("version", [PRE_CONNECT, V10, V11, V12])
@pytest.mark.parametrize(
    "raw,what", [(b"a\0MESSAGE", "a NUL byte"), (b"a\rb", "a carriage return"), (b"a\r", "a carriage return")]
)
def test_a_raw_nul_or_bare_cr_in_a_header_is_refused(version, raw, what):
    if raw == b"a\r" and version in (PRE_CONNECT, V12):
        return  # there "\r\n" ends the line: no CR in the value
    data = b"SEND\ndestination:/queue/a\nx:" + raw + b"\nforged:yes\n\nbody\0"
    with refused(LocalProtocolError, f"SEND: the header 'x' holds {what} written raw"):
        parse_all(data, version)
    with refused(
        LocalProtocolError,
        f"SEND: the header 'na\\x00me' holds {what}"
        if b"\0" in raw
        else "SEND: the header 'na\\rme' holds a carriage return",
    ):
        parse_all(b"SEND\n" + (b"na\0me" if b"\0" in raw else b"na\rme") + b":v\n\n\0", version)


# Header texts with the characters that matter here far more often than chance would give.
any_header_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12) | st.sampled_from(
    ["\0", "\r", "\n", "\r\n", ":", "\\", "\\n", "a\0MESSAGE\nx:y", "v\r", " padded "]
)


@pytest.mark.slow
@settings(max_examples=500, deadline=None)
@given(
    st.sampled_from([SEND, MESSAGE, "ERROR", "RECEIPT", CONNECT, CONNECTED]),
    st.dictionaries(any_header_text.filter(lambda k: k != "content-length"), any_header_text, max_size=5),
    st.sampled_from([PRE_CONNECT, V10, V11, V12]),
)
def test_any_headers_encode_to_exactly_one_equal_frame_or_a_clear_refusal(command, headers, version):
    frame = Frame(command, headers, b"body")
    try:
        data = encode_frame(frame, version)
    except HeaderNotEncodable as exc:
        assert exc.header in headers and exc.detail.startswith(f"{command}: the header {exc.header[:80]!r}")
        name, value = exc.header, headers[exc.header]
        escaped = version in (V11, V12) and command not in (CONNECT, CONNECTED)
        assert (
            not name
            or "\0" in name + value
            or ("\r" in name + value and version != V12)
            or (not escaped and ("\n" in name + value or "\r" in name + value or ":" in name))
        )
        return
    got, end = parse_frame(data, 0, version)
    assert end == len(data) and got == frame


header_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0\r"), max_size=20)
frames = st.builds(
    Frame,
    st.sampled_from([SEND, MESSAGE, "SUBSCRIBE", "ACK", "ERROR", "RECEIPT"]),
    st.dictionaries(header_text.filter(bool), header_text, max_size=5),
    st.binary(max_size=100),
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    st.lists(frames, min_size=1, max_size=5),
    st.sampled_from([V11, V12]),
    st.lists(st.integers(0, 2000), max_size=8),
    st.booleans(),
)
def test_round_trip_over_any_split(frame_list, version, cuts, heart_beats):
    """Encoded frames (bodies with content-length, so NULs are allowed) come back equal
    however the stream is cut."""
    wire = []
    for f in frame_list:
        headers = {"content-length": str(len(f.body)), **{k: v for k, v in f.headers.items() if k != "content-length"}}
        wire.append(encode_frame(Frame(f.command, headers, f.body), version) + (b"\n" if heart_beats else b""))
    data = b"".join(wire)
    got = feed_in_pieces(data, [c % (len(data) + 1) for c in cuts], version)
    assert [(g.command, g.body) for g in got] == [(f.command, f.body) for f in frame_list]
    for g, f in zip(got, frame_list):
        for k, v in f.headers.items():
            if k != "content-length":
                assert g.headers[k] == v


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.sampled_from([PRE_CONNECT, V10, V11, V12]))
def test_garbage_never_raises_anything_but_a_protocol_error(data, version):
    try:
        parse_all(data, version, Limits(max_frame_size=200, max_headers=5, max_header_length=50))
    except LocalProtocolError as exc:
        assert exc.message and exc.detail


def test_connect_frames_of_every_version_parse_before_the_version_is_known():
    for data in (b"CONNECT\nlogin:a\npasscode:b\n\n\0", b"STOMP\naccept-version:1.2\nhost:h\n\n\0"):
        assert parse_all(data, PRE_CONNECT)[0].command in (CONNECT, "STOMP")


# --- the fast paths against the general ones -----------------------------------------------

escape_text = st.text(st.sampled_from([*"ab:\\ncrt \0\ré"]), max_size=10)


@pytest.mark.slow
@settings(max_examples=1000, deadline=None)
@given(escape_text, st.sampled_from([V11, V12]))
def test_unescape_equals_the_escape_by_escape_reference(text, version):
    """unescape() replaces whole strings; _unescape_each() reads one escape at a time (and
    names the bad one): same value, or the same refusal."""
    assert outcome(lambda: codec._unescape_each(text, version)) == outcome(lambda: codec.unescape(text, version))


header_line = escape_text | st.sampled_from(
    [
        "content-length:3",
        "content-length:4",
        "content-length:x",
        "destination:/queue/a",
        "a:1",
        "a:2",
        "b:",
        "c:1",
        "k:a\\cb",
        "k\\c:\\\\n",
        "x:\\t",
        ":v",
        "nocolon",
        "message-id:ID\\c1",
        "long:" + "y" * 40,
    ]
)
LIMITS = [Limits(), Limits(max_frame_size=80, max_headers=3, max_header_length=30)]


@pytest.mark.slow
@settings(max_examples=1000, deadline=None)
@given(
    st.sampled_from([SEND, MESSAGE, CONNECT, CONNECTED, "BOGUS"]),
    st.lists(header_line, max_size=6),
    st.sampled_from([b"abc\0", b"a\0c\0", b"\0", b"abc"]),
    st.sampled_from(["\n\n", "\r\n\r\n", "\n\r\n"]),
    st.sampled_from([PRE_CONNECT, V10, V11, V12]),
    st.sampled_from(LIMITS),
)
@example(SEND, ["a:1", "b:", "c:1", "k:a\\cb"], b"\0", "\n\n", V12, LIMITS[1])  # one header too many
def test_the_plain_header_path_parses_as_the_general_path(command, lines, body, end, version, limits):
    """Any frame head (escapes, repeated names, CRs, NULs, content-length, over-long lines)
    parses to the same frame, headers in the same order, or the same refusal, whether
    _plain_headers() takes it or declines and _parse_headers() reads it line by line."""
    data = "\n".join([command, *lines]).encode() + end.encode() + body

    def parse() -> tuple[str, list[tuple[str, str]], bytes, int] | None:
        frame, after = parse_frame(data, 0, version, limits)
        return None if frame is None else (frame.command, list(frame.headers.items()), frame.body, after)

    fast = outcome(parse)
    with mock.patch.object(codec, "_plain_headers", lambda *args: None):
        general = outcome(parse)
    assert fast == general


def outcome(fn: Callable[[], object]) -> tuple[object, ...]:
    try:
        return ("value", fn())
    except LocalProtocolError as exc:
        return ("refused", exc.message, exc.detail)


ack_id = st.text(st.sampled_from("0123456789\u0661\u0662x\n\\c:\r\0"), max_size=4) | st.sampled_from(
    ["", "7", "42", "9" * 20, "9" * 21, "1" * 40]
)
LIMITS_TIGHT = [
    *LIMITS,
    Limits(max_frame_size=12, max_headers=3, max_header_length=30),
    Limits(max_header_length=4),
    Limits(max_headers=0),
    Limits(max_frame_size=30),
]


@settings(max_examples=1000, deadline=None)
@given(
    st.sampled_from(["", "\n", "\r\n"]),
    ack_id,
    st.sampled_from(
        [
            "\n\n\0",
            "\n\n",
            "\n\n\0",
            "\n\nx\0",
            "\r\n\r\n\0",
            "\n\r\n\0",
            "\nreceipt:r\n\n\0",
            "\nid:2\n\n\0",
            "\n\n\0ACK\nid:1\n\n\0",
            "\ncontent-length:0\n\n\0",
        ]
    ),
    st.sampled_from([PRE_CONNECT, V10, V11, V12]),
    st.sampled_from(LIMITS_TIGHT),
)
@pytest.mark.slow
@example("", "9" * 20, "\n\n\0", V12, Limits(max_frame_size=30))  # 31 bytes: one too many
@example("", "12", "\n\n\0", V12, Limits(max_header_length=4))  # "id:12" is 5
def test_the_usual_ack_parses_as_the_general_path(before, ack, after, version, limits):
    """An ACK frame, usual ("ACK\\nid:DIGITS\\n\\n\\0") or nearly so (other ids, other headers, a
    body, CRs, heart-beats before it, tight limits), parses to the same frame and offset, or
    the same refusal, whether _usual_ack() takes it or the general path reads it."""
    data = (before + "ACK\nid:" + ack + after).encode()

    def parse() -> tuple[str, list[tuple[str, str]], bytes, int] | None:
        frame, end = parse_frame(data, 0, version, limits)
        return None if frame is None else (frame.command, list(frame.headers.items()), frame.body, end)

    fast = outcome(parse)
    with mock.patch.object(codec, "_usual_ack", lambda *args: None):
        general = outcome(parse)
    assert fast == general
