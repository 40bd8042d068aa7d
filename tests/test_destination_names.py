"""The names a new physical destination may have (jms.destination.name_problem), checked
at every entry point: auto-create by send, consume and browse (in-process, mq://,
STOMP), admin create, and the bridge XML. The system destinations, temporary
destinations and what the store already holds keep working."""

from __future__ import annotations

import re
import sqlite3
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridgemgr.admin.protocol import BAD_REQUEST, OK, Command
from bridgemgr.dstadmin import destination_command
from bridgemgr.jms import Queue, TextMessage, Topic
from bridgemgr.jms.destination import NAME_RULE, SYSTEM_QUEUES, check_name, name_problem
from bridgemgr.jms.errors import InvalidDestinationException
from bridgemgr.jms.hostbroker import DestinationAttributes, Principal
from bridgemgr.jmsbridge.config import ConfigError, parse_bridge_config
from bridgemgr.netloop import NetLoop
from bridgemgr.providers.embedded import DMQ_NAME, Broker, EmbeddedConnectionFactory
from bridgemgr.providers.embedded.host import EmbeddedHostBroker
from remote.support import Harness
from stomp_support import Raw, make_bridge, make_users, qname

FIRST = string.ascii_letters + "_$"
REST = string.ascii_letters + string.digits + "_$."
BAD = [
    "",
    " mq.sys.dmq",
    "MQ.SYS.DMQ",
    "Mq.Sys.Dmq",
    "mq.sys.dmq ",
    "IMQ.BRIDGE.JMS.DMQ",
    "imq.bridge.jms.dmq\n",
    'a"b',
    "a\nb",
    "a b",
    "a-b",
    "a/b",
    "1abc",
    ".a",
    "mq.x",
    "MQ.",
    "caf\u00e9",
    "\u0430bc",
]
# every name the project's docs, examples and DMQs use
GOOD = ["demo.in", "demo.out", "orders", "imq.bridge.jms.dmq", "_x", "$x.y_1", "Q", "a..b"]


# --- the rule ------------------------------------------------------------------------------------


@given(st.sampled_from(FIRST), st.text(REST, max_size=40))
def test_names_of_letters_digits_underscore_dollar_and_dots_are_accepted(first, rest):
    name = first + rest
    expected_ok = not name.lower().startswith("mq.")
    assert (name_problem(name) is None) == expected_ok
    assert (name_problem(name, is_topic=True) is None) == expected_ok


@given(st.text(max_size=30), st.text(max_size=30), st.characters(exclude_characters=REST))
def test_a_character_outside_the_rule_is_refused_and_named(before, after, bad):
    name = "a" + before + bad + after
    problem = name_problem(name)
    assert problem is not None
    first = next(i for i, c in enumerate(name) if c not in REST)
    if "differs from the system destination" not in problem:
        assert problem == f"it contains {name[first]!r} at offset {first}"


@given(st.sampled_from(sorted(SYSTEM_QUEUES)), st.data())
def test_names_differing_from_a_system_queue_by_case_or_spaces_are_refused(system, data):
    variant = "".join(c.upper() if data.draw(st.booleans()) else c for c in system)
    variant = data.draw(st.sampled_from(["", " ", "\t"])) + variant + data.draw(st.sampled_from(["", " ", "\n"]))
    assert (name_problem(variant) is None) == (variant == system)


@pytest.mark.parametrize("name", BAD)
def test_bad_names(name):
    assert name_problem(name) is not None
    with pytest.raises(InvalidDestinationException) as info:
        check_name(Queue(name))
    assert repr(name) in str(info.value) and NAME_RULE in str(info.value)


@pytest.mark.parametrize("name", GOOD)
def test_the_project_s_names_are_good(name):
    assert name_problem(name) is None


def test_system_queues_are_queues_only_and_temporary_destinations_are_not_checked():
    assert name_problem(DMQ_NAME) is None and "mq." in str(name_problem(DMQ_NAME, is_topic=True))
    memory_only = Broker(None)
    conn = EmbeddedConnectionFactory(memory_only).create_connection()
    check_name(conn.create_session().create_temporary_queue())
    conn.close()
    memory_only.close()


# --- the host broker: every way a destination is made ----------------------------------------------


@pytest.fixture
def broker(tmp_path):
    b = Broker(tmp_path / "store")
    yield b
    b.close()


def refused(name: str) -> str:
    return re.escape(f"name {name!r} is refused")


@pytest.mark.parametrize("name", [" mq.sys.dmq", "MQ.SYS.DMQ", 'a"b', "a\nb"])
def test_in_process_sends_consumers_browsers_and_durables_cannot_create_bad_names(broker, name):
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.client_id = "c"
    session = conn.create_session()
    before = broker.destinations()
    for make in (
        lambda: session.create_producer(Queue(name)).send(TextMessage("x")),
        lambda: session.create_producer(Topic(name)).send(TextMessage("x")),
        lambda: session.create_consumer(Queue(name)),
        lambda: session.create_consumer(Topic(name)),
        lambda: session.create_durable_subscriber(Topic(name), "d"),
        lambda: list(session.create_browser(Queue(name))),
    ):
        with pytest.raises(InvalidDestinationException, match=refused(name)):
            make()
    assert broker.destinations() == before
    assert name not in broker.known_topics and not broker.durable
    conn.close()


def test_system_and_temporary_destinations_keep_working(broker):
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    session = conn.create_session()
    for dest in (
        Queue(DMQ_NAME),
        Queue("imq.bridge.jms.dmq"),
        session.create_temporary_queue(),
        session.create_temporary_topic(),
    ):
        consumer = session.create_consumer(dest)
        session.create_producer(dest).send(TextMessage("kept"))
        received = consumer.receive(5)
        assert received is not None and received.text == "kept"
    conn.close()


def test_names_the_store_already_holds_keep_working(tmp_path):
    first = Broker(tmp_path / "store")
    first.configure_destination(Queue("good"), first._limits("q:good"))
    first.close()
    with sqlite3.connect(tmp_path / "store" / "store.db") as db:  # as an older version wrote them
        db.execute("INSERT INTO dests SELECT ' legacy', config FROM dests WHERE qkey = 'q:good'")
        db.execute("UPDATE dests SET qkey = 'q: legacy' WHERE qkey = ' legacy'")
    second = Broker(tmp_path / "store")
    try:
        conn = EmbeddedConnectionFactory(second).create_connection()
        conn.start()
        session = conn.create_session()
        consumer = session.create_consumer(Queue(" legacy"))
        session.create_producer(Queue(" legacy")).send(TextMessage("still here"))
        received = consumer.receive(5)
        assert received is not None and received.text == "still here"
        with pytest.raises(InvalidDestinationException, match=refused(" other")):
            session.create_consumer(Queue(" other"))
        conn.close()
    finally:
        second.close()


def test_admin_create_refuses_bad_names_and_backout_queues(broker):
    host, admin = EmbeddedHostBroker(broker), Principal("admin")
    for dst_type, name in (("q", " mq.sys.dmq"), ("t", "MQ.SYS.DMQ"), ("q", "a\nb")):
        reply = destination_command(
            host, admin, Command("CREATE_DST", dst_type=dst_type, destination=name), DestinationAttributes()
        )
        assert reply.status == BAD_REQUEST and f"name {name!r} is refused" in reply.message
        assert NAME_RULE in reply.message
    reply = destination_command(
        host,
        admin,
        Command("CREATE_DST", dst_type="q", destination="orders", attributes={"backoutQueue": "MQ.SYS.DMQ"}),
        DestinationAttributes(),
    )
    assert reply.status == BAD_REQUEST and "name 'MQ.SYS.DMQ' is refused" in reply.message
    listed = destination_command(host, admin, Command("LIST_DST", dst_type="q"), DestinationAttributes())
    assert [row["name"] for row in listed.data["destinations"]] == [DMQ_NAME]
    ok = destination_command(
        host, admin, Command("CREATE_DST", dst_type="q", destination="demo.in"), DestinationAttributes()
    )
    assert ok.status == OK


def test_mq_clients_cannot_create_bad_names_and_the_connection_lives_on(broker):
    with Harness(broker) as harness, harness.factory().create_connection() as conn:
        conn.start()
        session = conn.create_session()
        with pytest.raises(InvalidDestinationException, match=refused(" mq.sys.dmq")):
            session.create_producer(Queue(" mq.sys.dmq")).send(TextMessage("x"))
        with pytest.raises(InvalidDestinationException, match=refused('a"b')):
            session.create_consumer(Topic('a"b'))
        with pytest.raises(InvalidDestinationException, match=refused("MQ.SYS.DMQ")):
            list(session.create_browser(Queue("MQ.SYS.DMQ")))
        q = Queue(qname())
        consumer = session.create_consumer(q)
        session.create_producer(q).send(TextMessage("fine"))
        received = consumer.receive(5)
        assert received is not None and received.text == "fine"
    assert " mq.sys.dmq" not in str(broker.destinations())


@pytest.fixture
def stomp_port(tmp_path, broker):
    with NetLoop("stomp-destination-names") as loop:
        bridge = make_bridge(loop, broker, make_users(tmp_path))
        try:
            yield bridge.tcp_port
        finally:
            bridge.stop()


@pytest.mark.parametrize(
    "command, destination, name",
    [
        ("SEND", "/queue/ mq.sys.dmq", " mq.sys.dmq"),
        ("SEND", "/topic/MQ.SYS.DMQ", "MQ.SYS.DMQ"),
        ("SUBSCRIBE", '/queue/a"b', 'a"b'),
        ("SUBSCRIBE", "/topic/mq.sys.dmq", "mq.sys.dmq"),
    ],
)
def test_stomp_gets_an_error_frame_naming_the_name(stomp_port, broker, command, destination, name):
    raw = Raw(stomp_port)
    try:
        raw.connect()
        raw.frame(command, {"destination": destination, "id": "s", "receipt": "r"}, b"x")
        error = raw.wait(lambda f: f.command == "ERROR")
        assert f"name {name!r} is refused" in error.body.decode()
        raw.until_closed()
    finally:
        raw.close()
    assert name not in (broker.queues if destination.startswith("/queue/") else broker.known_topics)


def test_stomp_temporary_queues_keep_working(stomp_port):
    raw = Raw(stomp_port)
    try:
        raw.connect()
        raw.frame("SUBSCRIBE", {"destination": "/temp-queue/replies", "id": "s"})
        raw.frame("SEND", {"destination": "/temp-queue/replies"}, b"back")
        message = raw.wait(lambda f: f.command == "MESSAGE")
        assert message.body == b"back"
    finally:
        raw.close()


# --- the bridge XML ----------------------------------------------------------------------------


def bridge_xml(dest_name: str, cf: str = '<connection-factory ref-name="cf"/>') -> bytes:
    return (
        f'<?xml version="1.0"?>\n<jmsbridge name="b">\n'
        f'<link name="l"><source connection-factory-ref="cf" destination-ref="in"/>'
        f'<target connection-factory-ref="cf" destination-ref="ok"/></link>\n{cf}\n'
        f'<destination ref-name="in" name="{dest_name}"/>\n'
        f'<destination ref-name="ok" name="demo.out"/>\n</jmsbridge>\n'
    ).encode()


@pytest.mark.parametrize(
    "name, shown",
    [
        (" mq.sys.dmq", "' mq.sys.dmq'"),
        ("a&quot;b", "'a\"b'"),
        ("MQ.SYS.DMQ", "'MQ.SYS.DMQ'"),
        ("orders-eu", "'orders-eu'"),
    ],
)
def test_bridge_xml_names_the_file_line_and_element(name, shown):
    with pytest.raises(ConfigError) as info:
        parse_bridge_config(bridge_xml(name), "bridge.xml")
    [problem] = info.value.errors
    assert str(problem).startswith(f"bridge.xml:5: destination 'in' has name {shown}, which the broker refuses")


def test_bridge_xml_leaves_other_providers_names_alone():
    foreign = (
        '<connection-factory ref-name="cf" lookup-name="ConnectionFactory">'
        '<property name="java.naming.factory.initial" value="imq.stomp"/></connection-factory>'
    )
    assert parse_bridge_config(bridge_xml("orders-eu", foreign), "bridge.xml").destinations[0].name == "orders-eu"
