"""A durable subscription belongs to the user who made it (issue 36): alice subscribes
durably (client id alice-cid, name alice-sub) and goes; mallory, with the same client
id, may neither attach to it (and read alice's message) nor unsubscribe it, over STOMP,
over mq:// (the jms service) or in process; an admin may (logged with both names), and
so may a user the access control file's durable rules grant it. The owner is in the
store (SQLite and PostgreSQL) and survives a restart; a store of schema version 1 opens,
and its subscriptions without an owner go to the first user who attaches."""

from __future__ import annotations

import logging
import sqlite3

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridgemgr.accesscontrol import AccessControl, AccessControlError, AccessControls, AccessRules
from bridgemgr.jms import TextMessage, Topic
from bridgemgr.jms.errors import JMSSecurityException
from bridgemgr.jms.hostbroker import Principal
from bridgemgr.netloop import NetLoop
from bridgemgr.providers.embedded import Broker
from bridgemgr.providers.embedded.client import EmbeddedConnectionFactory
from remote.support import Harness
from stomp_support import Raw, make_bridge
from stores import jdbc, open_at
from waiting import wait_for

NEWS = Topic("news")
CID, SUB = "alice-cid", "alice-sub"
PASSWORDS = {"alice": "alice-pw", "mallory": "mallory-pw", "root": "root-pw", "auditor": "auditor-pw"}
GROUPS = {"root": "admin"}
RULES = """version=JMQFileAccessControlModel/100
connection.NORMAL.allow.user=*
topic.*.produce.allow.user=*
topic.*.consume.allow.user=*
topic.create.allow.user=*
"""
GRANT = "durable.alice-cid.*.consume.allow.user=auditor\n"
OWNED = f"durable subscription '{SUB}' of client id '{CID}' is owned by another user"


def publish(broker: Broker, text: str) -> None:
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.create_session().create_producer(NEWS).send(TextMessage(text))
    conn.close()


# --- the access control file's durable rules ----------------------------------------------------


def test_durable_rules_parse_and_decide_on_clientid_dot_name():
    rules = AccessRules.parse(
        RULES + GRANT + "durable.*.unsubscribe.allow.group=admin\ndurable.a.b.consume.deny.user=auditor\n", "acl"
    )
    assert rules.decide("auditor", frozenset(), "durable", f"{CID}.{SUB}", "consume")
    assert not rules.decide("auditor", frozenset(), "durable", f"{CID}.{SUB}", "unsubscribe")
    assert not rules.decide("auditor", frozenset(), "durable", "a.b", "consume")
    assert not rules.decide("mallory", frozenset(), "durable", f"{CID}.{SUB}", "consume")
    assert rules.decide("x", frozenset({"admin"}), "durable", "any.thing", "unsubscribe")
    assert AccessRules.parse(rules.text(), "again") == rules


PART = st.text(st.sampled_from("abcXY_-"), min_size=1, max_size=6)


@given(PART, PART, PART, PART)
def test_a_durable_rule_grants_the_subscription_it_names_and_no_other(cid, name, other_cid, other_name):
    rules = AccessRules.parse(
        f"version=JMQFileAccessControlModel/100\ndurable.{cid}.{name}.consume.allow.user=auditor\n", "acl"
    )
    assert rules.decide("auditor", frozenset(), "durable", f"{cid}.{name}", "consume")
    assert not rules.decide("auditor", frozenset(), "durable", f"{cid}.{name}", "unsubscribe")
    assert not rules.decide("mallory", frozenset(), "durable", f"{cid}.{name}", "consume")
    assert rules.decide("auditor", frozenset(), "durable", f"{other_cid}.{other_name}", "consume") == (
        (other_cid, other_name) == (cid, name)
    )


@pytest.mark.parametrize(
    "line, why",
    [
        ("durable.alice-cid.produce.allow.user=x", "operation 'produce'"),
        ("durable.alice-cid.consume.allow.user=x", "<clientid>.<name>"),
        ("durable.create.allow.user=x", "operation"),
    ],
)
def test_a_bad_durable_rule_is_refused_naming_the_line(line, why):
    with pytest.raises(AccessControlError, match=f"acl:2: .*{why}"):
        AccessRules.parse(f"version=JMQFileAccessControlModel/100\n{line}\n", "acl")


# --- over mq:// (the jms service) ----------------------------------------------------------------


def authenticate(user, password):
    if user in PASSWORDS and PASSWORDS[user] == password:
        return Principal(user, frozenset({GROUPS.get(user, "user")}))
    return None


@pytest.fixture
def jms(tmp_path):
    (tmp_path / "acl.properties").write_text(RULES)
    broker = Broker(tmp_path / "store")
    harness = Harness(
        broker, authenticator=authenticate, access=AccessControls(jms=AccessControl("jms", tmp_path / "acl.properties"))
    )
    harness.rules = tmp_path / "acl.properties"  # type: ignore[attr-defined]
    yield harness
    harness.close()
    broker.close()


def jms_login(harness: Harness, user: str):
    conn = harness.factory().create_connection(user, PASSWORDS[user])
    conn.client_id = CID
    conn.start()
    return conn


def alice_subscribed(harness: Harness) -> None:
    """alice's durable subscription, made and left, with one message waiting for her."""
    conn = jms_login(harness, "alice")
    conn.create_session().create_durable_subscriber(NEWS, SUB).close()
    conn.close()
    wait_for(lambda: CID not in harness.broker.client_ids)
    publish(harness.broker, "for alice")


def test_mallory_may_neither_attach_nor_unsubscribe_over_mq(jms, caplog):
    alice_subscribed(jms)
    conn = jms_login(jms, "mallory")
    session = conn.create_session()
    with pytest.raises(JMSSecurityException, match=OWNED) as attached:
        session.create_durable_subscriber(NEWS, SUB)
    assert "alice" not in str(attached.value).replace(CID, "").replace(SUB, "")  # not whose
    with pytest.raises(JMSSecurityException, match=f"{OWNED}: user 'mallory' may not unsubscribe"):
        session.unsubscribe(SUB)
    conn.close()
    wait_for(lambda: CID not in jms.broker.client_ids)
    conn = jms_login(jms, "alice")
    got = conn.create_session().create_durable_subscriber(NEWS, SUB).receive(5)
    assert got is not None and got.text == "for alice"
    conn.close()
    refusals = [r.getMessage() for r in caplog.records if "refused: user 'mallory'" in r.getMessage()]
    assert refusals == [
        f"refused: user 'mallory' may not subscribe to durable subscription '{SUB}' of "
        f"client id '{CID}', owned by user 'alice'",
        f"refused: user 'mallory' may not unsubscribe durable subscription '{SUB}' of "
        f"client id '{CID}', owned by user 'alice'",
    ]


def test_an_admin_may_attach_and_unsubscribe_and_is_logged_with_both_names(jms, caplog):
    alice_subscribed(jms)
    caplog.set_level(logging.WARNING, "bridgemgr.providers.embedded.owners")
    conn = jms_login(jms, "root")
    session = conn.create_session()
    consumer = session.create_durable_subscriber(NEWS, SUB)
    got = consumer.receive(5)
    assert got is not None and got.text == "for alice"
    consumer.close()
    session.unsubscribe(SUB)
    conn.close()
    assert (CID, SUB) not in jms.broker.durable
    logged = [r.getMessage() for r in caplog.records if r.name.endswith("owners")]
    assert logged == [
        f"user 'root', an admin, may subscribe to durable subscription '{SUB}' of client id "
        f"'{CID}', owned by user 'alice'",
        f"user 'root', an admin, may unsubscribe durable subscription '{SUB}' of client id "
        f"'{CID}', owned by user 'alice'",
    ]


def test_a_durable_rule_grants_attaching_but_not_unsubscribing(jms, caplog):
    alice_subscribed(jms)
    conn = jms_login(jms, "auditor")
    with pytest.raises(JMSSecurityException, match=OWNED):
        conn.create_session().create_durable_subscriber(NEWS, SUB)
    conn.close()
    wait_for(lambda: CID not in jms.broker.client_ids)
    jms.rules.write_text(RULES + GRANT)  # read again at the next login
    conn = jms_login(jms, "auditor")
    session = conn.create_session()
    consumer = session.create_durable_subscriber(NEWS, SUB)
    got = consumer.receive(5)
    assert got is not None and got.text == "for alice"
    consumer.close()
    with pytest.raises(JMSSecurityException, match="user 'auditor' may not unsubscribe"):
        session.unsubscribe(SUB)
    conn.close()
    assert any(
        "user 'auditor', granted by" in r.getMessage() and "owned by user 'alice'" in r.getMessage()
        for r in caplog.records
    )


# --- over STOMP -----------------------------------------------------------------------------------


@pytest.fixture
def stomp(tmp_path):
    from bridgemgr.users import UserRepository

    users = UserRepository(tmp_path / "passwd")
    for user, password in PASSWORDS.items():
        users.add(user, password, GROUPS.get(user, "user"))
    broker = Broker(tmp_path / "store")
    netloop = NetLoop().start()
    bridge = make_bridge(netloop, broker, users)
    yield broker, bridge.tcp_port
    bridge.stop()
    netloop.stop()
    broker.close()


def stomp_login(port: int, user: str) -> Raw:
    client = Raw(port)
    client.connect("1.2", login=user, passcode=PASSWORDS[user], **{"client-id": CID})
    return client


def stomp_durable(client: Raw, command: str) -> str:
    """``command`` (SUBSCRIBE, UNSUBSCRIBE) on alice's subscription: "ok", or the ERROR's text."""
    headers = {"durable-subscriber-name": SUB, "receipt": command, "id": "s1"}
    if command == "SUBSCRIBE":
        headers["destination"] = "/topic/news"
    client.frame(command, headers)
    frame = client.wait(lambda f: f.command in ("RECEIPT", "ERROR"))
    return "ok" if frame.command == "RECEIPT" else f"{frame.headers.get('message')}: {frame.body.decode()}"


def stomp_leave(broker: Broker, client: Raw) -> None:
    client.frame("DISCONNECT")
    client.until_closed()
    client.close()
    wait_for(lambda: CID not in broker.client_ids)


@pytest.mark.slow
def test_mallory_may_neither_attach_nor_unsubscribe_over_stomp(stomp):
    broker, port = stomp
    alice = stomp_login(port, "alice")
    assert stomp_durable(alice, "SUBSCRIBE") == "ok"
    stomp_leave(broker, alice)
    publish(broker, "for alice")
    for command in ("SUBSCRIBE", "UNSUBSCRIBE"):
        mallory = stomp_login(port, "mallory")
        error = stomp_durable(mallory, command)
        action = "subscribe to" if command == "SUBSCRIBE" else "unsubscribe"
        assert f"{OWNED}: user 'mallory' may not {action} it" in error, error
        assert "'alice'" not in error
        mallory.until_closed()
        mallory.close()
        wait_for(lambda: CID not in broker.client_ids)
    alice = stomp_login(port, "alice")
    assert stomp_durable(alice, "SUBSCRIBE") == "ok"
    message = alice.wait(lambda f: f.command == "MESSAGE")
    assert message.body == b"for alice"
    stomp_leave(broker, alice)


def test_an_admin_may_unsubscribe_over_stomp(stomp):
    broker, port = stomp
    alice = stomp_login(port, "alice")
    assert stomp_durable(alice, "SUBSCRIBE") == "ok"
    stomp_leave(broker, alice)
    root = stomp_login(port, "root")
    assert stomp_durable(root, "UNSUBSCRIBE") == "ok"
    stomp_leave(broker, root)
    assert (CID, SUB) not in broker.durable


# --- the store: the owner survives a restart; version 1 stores ----------------------------------


def in_process(broker: Broker, user: str):
    conn = EmbeddedConnectionFactory(broker).create_connection(user)
    conn.client_id = CID
    conn.start()
    return conn


def test_the_owner_survives_a_restart(store_spec):
    broker = open_at(store_spec)
    conn = in_process(broker, "alice")
    conn.create_session().create_durable_subscriber(NEWS, SUB).close()
    conn.close()
    broker.close()
    broker = open_at(store_spec)
    try:
        assert broker.durable[(CID, SUB)].owner == "alice"
        conn = in_process(broker, "mallory")
        with pytest.raises(JMSSecurityException, match=OWNED):
            conn.create_session().create_durable_subscriber(NEWS, SUB)
        with pytest.raises(JMSSecurityException, match=OWNED):
            conn.create_session().unsubscribe(SUB)
        conn.close()
        conn = in_process(broker, "alice")
        conn.create_session().unsubscribe(SUB)
        conn.close()
    finally:
        broker.close()


def make_version_1(spec: str) -> None:
    """Turn the store at ``spec`` into what a broker of schema version 1 left: subs
    without the owner column."""
    settings = jdbc(spec)
    if settings is None:
        db = sqlite3.connect(f"{spec}/store.db")
        db.execute("ALTER TABLE subs DROP COLUMN owner")
        db.execute("UPDATE meta SET v = '1' WHERE k = 'schema'")
        db.commit()
        db.close()
        return
    conn = settings.connect()
    with conn.cursor() as cur:
        cur.execute("ALTER TABLE subs DROP COLUMN owner")
        cur.execute("UPDATE meta SET v = '1' WHERE k = 'schema'")
    conn.commit()
    conn.close()


def test_a_version_1_stores_subscription_goes_to_the_first_user_who_attaches(store_spec, caplog):
    broker = open_at(store_spec)
    conn = in_process(broker, "alice")
    conn.create_session().create_durable_subscriber(NEWS, SUB).close()
    conn.close()
    publish(broker, "from before")
    broker.close()
    make_version_1(store_spec)
    broker = open_at(store_spec)
    try:
        assert broker.durable[(CID, SUB)].owner is None
        conn = in_process(broker, "bob")
        with pytest.raises(JMSSecurityException, match="not claimed yet"):
            conn.create_session().unsubscribe(SUB)  # removing it needs an owner (or an admin)
        got = conn.create_session().create_durable_subscriber(NEWS, SUB).receive(5)
        assert got is not None and got.text == "from before"
        conn.close()
        assert any("user 'bob' claims it" in r.getMessage() for r in caplog.records)
        broker.close()
        broker = open_at(store_spec)
        assert broker.durable[(CID, SUB)].owner == "bob"
        conn = in_process(broker, "alice")
        with pytest.raises(JMSSecurityException, match=OWNED):
            conn.create_session().create_durable_subscriber(NEWS, SUB)
        conn.close()
    finally:
        broker.close()
