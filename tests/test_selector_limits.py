"""What a selector may cost, over every front end: imq.selector.max_size on the host
broker (in-process sessions, mq:// consumers and browsers, STOMP SUBSCRIBE) and the
bounds jms.selector puts on compiling any selector (tokens, LIKE patterns, nesting)."""

from __future__ import annotations

import re
import sys
import time

import pytest

from bridgemgr.jms import Queue, TextMessage, Topic
from bridgemgr.jms.errors import InvalidSelectorError
from bridgemgr.jms.selector import MAX_DEPTH, MAX_PATTERN_CHARS, MAX_SIZE, MAX_TOKENS, check_size, compile_selector
from bridgemgr.netloop import NetLoop
from bridgemgr.props import load_properties
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory
from bridgemgr.providers.embedded.host import open_host_broker
from remote.support import Harness
from stomp_support import Raw, make_bridge, make_users, qname

LIMIT = 8 * 1024


def literal_selector(size: int) -> str:
    """A selector of ``size`` bytes with three tokens (cheap to lex, long to read)."""
    return "p = '" + "x" * (size - len("p = ''")) + "'"


def or_selector(terms: int) -> str:
    return " OR ".join(f"p = 'v{i}'" for i in range(terms))


# --- the bounds on compiling, whoever asks ------------------------------------------------------


def test_tokens_beyond_the_limit_are_refused_while_lexing():
    ok = "-" * (MAX_TOKENS - 3) + "1 = a"  # MAX_TOKENS tokens (signs of a literal fold: no depth)
    assert compile_selector.__wrapped__(ok) is not None
    too_many = "-" + ok
    with pytest.raises(InvalidSelectorError, match=f"more than {MAX_TOKENS} tokens") as info:
        compile_selector.__wrapped__(too_many)
    assert info.value.position == len(too_many) - 1  # at the token past the limit


def test_a_three_megabyte_selector_of_ors_is_refused_at_its_token_limit():
    text = or_selector(200_000)[: 3 * 1024 * 1024]
    started = time.perf_counter()
    with pytest.raises(InvalidSelectorError, match="tokens") as info:
        compile_selector.__wrapped__(text)
    elapsed = time.perf_counter() - started
    assert info.value.position < 20_000  # refused at about token 4096 (old code: 12-40 s of parsing)
    assert elapsed < 2.0, elapsed


def test_like_patterns_are_bounded_in_all():
    half = "%a" * (MAX_PATTERN_CHARS // 4)
    assert compile_selector.__wrapped__(f"p LIKE '{half}' OR q LIKE '{half}'") is not None
    with pytest.raises(InvalidSelectorError, match=f"LIKE patterns have more than {MAX_PATTERN_CHARS}"):
        compile_selector.__wrapped__(f"p LIKE '{half}' OR q LIKE '{half}x'")
    with pytest.raises(InvalidSelectorError, match="LIKE patterns"):
        compile_selector.__wrapped__("p LIKE '" + "%a" * 30_000 + "'")


def test_nesting_within_the_limit_needs_a_bounded_stack():
    """Compiling and matching a selector nested MAX_DEPTH deep fits in 400 frames."""
    texts = ["NOT " * MAX_DEPTH + "p", "(p OR " * (MAX_DEPTH // 2) + "p" + " AND p)" * (MAX_DEPTH // 2)]
    old = sys.getrecursionlimit()
    depth = len(_frames())
    try:
        sys.setrecursionlimit(depth + 400)
        for text in texts:
            selector = compile_selector.__wrapped__(text)
            assert selector is not None
            selector.matches(TextMessage("x"))
    finally:
        sys.setrecursionlimit(old)


def test_a_nearly_full_stack_is_an_invalid_selector_never_a_recursion_error():
    text = "(p OR " * (MAX_DEPTH // 2) + "p" + " AND p)" * (MAX_DEPTH // 2)
    old = sys.getrecursionlimit()
    depth = len(_frames())
    try:
        sys.setrecursionlimit(depth + 120)
        with pytest.raises(InvalidSelectorError, match="nested too deeply for this thread's stack"):
            compile_selector.__wrapped__(text)
    finally:
        sys.setrecursionlimit(old)


def _frames() -> list:
    frames, frame = [], sys._getframe()
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames


@pytest.mark.parametrize("text, size", [("p = 'x'", 7), ("p = '\u00e9'", 8), ("p = '\U0001f600'", 10)])
def test_check_size_counts_utf8_bytes(text, size):
    check_size(text, size, "imq.selector.max_size")
    expected = re.escape(f"{size} bytes, more than imq.selector.max_size={size - 1}")
    with pytest.raises(InvalidSelectorError, match=expected):
        check_size(text, size - 1, "imq.selector.max_size")
    check_size(text * 1000, -1, "imq.selector.max_size")


# --- imq.selector.max_size on the host broker ---------------------------------------------------


@pytest.fixture
def small(tmp_path):
    b = Broker(tmp_path / "store", max_selector_size=LIMIT)
    yield b
    b.close()


def test_in_process_consumers_and_browsers_get_the_limit(small):
    conn = EmbeddedConnectionFactory(small).create_connection()
    conn.client_id = "c1"
    session = conn.create_session()
    q, t = Queue(qname()), Topic(qname("t"))
    assert session.create_consumer(q, literal_selector(LIMIT)) is not None
    big = literal_selector(LIMIT + 1)
    expected = re.escape(f"{LIMIT + 1} bytes, more than imq.selector.max_size={LIMIT}")
    for make in (
        lambda: session.create_consumer(q, big),
        lambda: session.create_consumer(t, big),
        lambda: session.create_durable_subscriber(t, "d", big),
        lambda: session.create_browser(q, big),
    ):
        with pytest.raises(InvalidSelectorError, match=expected):
            make()
    assert not small.durable  # the refused durable subscription was not made
    conn.close()


def test_the_default_and_the_property_reach_the_host_broker(tmp_path):
    memory_only = Broker(None)
    assert memory_only.max_selector_size == MAX_SIZE == 64 * 1024
    memory_only.close()
    props = load_properties([], [f"imq.varhome={tmp_path}", "imq.selector.max_size=1k"], environ={})
    host = open_host_broker(props)
    try:
        conn = host.connection_factory().create_connection()
        session = conn.create_session()
        session.create_consumer(Queue("a"), literal_selector(1024)).close()
        with pytest.raises(InvalidSelectorError, match=re.escape("imq.selector.max_size=1024")):
            session.create_consumer(Queue("a"), literal_selector(1025))
        conn.close()
    finally:
        host.close()


def test_mq_consumers_and_browsers_get_the_limit_and_the_connection_lives_on(small):
    with Harness(small) as harness, harness.factory().create_connection() as conn:
        conn.start()
        session = conn.create_session()
        q = Queue(qname())
        big = literal_selector(LIMIT + 1)
        with pytest.raises(InvalidSelectorError, match=re.escape(f"more than imq.selector.max_size={LIMIT}")):
            session.create_consumer(q, big)
        with pytest.raises(InvalidSelectorError, match=re.escape(f"more than imq.selector.max_size={LIMIT}")):
            list(session.create_browser(q, big))
        # a 3 MB selector is refused by its size before anything is parsed
        started = time.perf_counter()
        with pytest.raises(InvalidSelectorError, match="3145728 bytes"):
            session.create_consumer(q, literal_selector(3 * 1024 * 1024))
        assert time.perf_counter() - started < 2.0
        consumer = session.create_consumer(q, "p = 'yes'")
        message = TextMessage("picked")
        message.set_string_property("p", "yes")
        session.create_producer(q).send(message)
        received = consumer.receive(5)
        assert received is not None and received.text == "picked"


@pytest.fixture
def stomp_port(tmp_path, small):
    with NetLoop("stomp-selector-limits") as loop:
        bridge = make_bridge(loop, small, make_users(tmp_path))
        try:
            yield bridge.tcp_port
        finally:
            bridge.stop()


@pytest.mark.parametrize(
    "selector, message",
    [
        (literal_selector(LIMIT + 1), f"{LIMIT + 1} bytes, more than imq.selector.max_size={LIMIT}"),
        ("-" * MAX_TOKENS + "a = 1", f"more than {MAX_TOKENS} tokens"),
    ],
)
def test_stomp_subscribe_beyond_a_limit_gets_an_error_frame(stomp_port, selector, message):
    raw = Raw(stomp_port)
    try:
        raw.connect()
        raw.frame("SUBSCRIBE", {"destination": "/queue/" + qname(), "id": "s", "selector": selector})
        error = raw.wait(lambda f: f.command == "ERROR")
        assert error.headers["message"] == "subscribe failed"
        assert message in error.body.decode()
        assert selector not in error.body.decode()  # the selector is not echoed back
        raw.until_closed()
    finally:
        raw.close()
