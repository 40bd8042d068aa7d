"""Client ids and durable subscriptions of a loaded bridge's links belong to the bridge: a
real `serve` with a JMS bridge whose link reads a topic through a durable subscription, the
link stopped with imqbridgemgr, then a plain user tries to take that subscription over mq://
and over STOMP (client-id header, durable subscription, unsubscribe). Each is refused, the
messages stay for the link, and the user's own client ids and durables still work.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bridgemgr import connect
from bridgemgr.jms import TextMessage, Topic
from bridgemgr.jms.errors import JMSSecurityException
from bridgemgr.users import UserRepository
from service_support import Daemon, cli, one_bridge_files, take
from stomp_support import Raw

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb">
  <link name="l1">
    <source connection-factory-ref="host" destination-ref="src" durable-sub="jb-orders" clientid="jb-src"/>
    <target connection-factory-ref="host" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host">
    <property name="imqConfiguredClientID" value="jb-factory"/>
  </connection-factory>
  <destination ref-name="src" name="own.orders" type="topic"/>
  <destination ref-name="dst" name="own.out"/>
</jmsbridge>
"""
PASSWORD = "Own-Secret-1"
MALLORY = ("mallory", "Mallory-Pw-1")


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    base: Path = tmp_path_factory.mktemp("own")
    props, passfile = one_bridge_files(base, "own", XML, PASSWORD, "imq.bridge.stomp.tcp.port=0", activelist="jb,stomp")
    daemon = Daemon(props)
    try:
        assert daemon.bridges == {"jb": "STARTED", "stomp": "STARTED"}, daemon.lines
        UserRepository(base / "var" / "instances" / "own" / "etc" / "passwd").add(*MALLORY)
        r = cli(daemon, passfile, "stop", "link", "-bn", "jb", "-ln", "l1")
        assert r.returncode == 0, r.stdout + r.stderr
        yield daemon, passfile
    finally:
        daemon.stop()


def publish(daemon: Daemon, text: str) -> None:
    with connect(f"mq://{daemon.address}", username="admin", password=PASSWORD) as conn:
        conn.create_session().create_producer(Topic("own.orders")).send(TextMessage(text))


def stomp_port(daemon: Daemon) -> int:
    from bridgemgr.admin.portmapper import find_service

    host, port = daemon.address.split(":")
    return find_service(host, int(port), ("stomp",)).port


@pytest.mark.parametrize("client_id", ["jb-src", "jb-factory"])
def test_a_plain_user_cannot_set_a_links_client_id_over_mq(service, client_id):
    daemon, _ = service
    try_client_id(daemon, client_id)


def try_client_id(daemon: Daemon, client_id: str) -> None:
    """Mallory sets ``client_id`` over mq://, which is refused naming it."""
    with connect(f"mq://{daemon.address}", *MALLORY) as conn, pytest.raises(JMSSecurityException, match=client_id):
        conn.client_id = client_id


def test_a_plain_user_cannot_take_the_durable_subscription_over_stomp(service):
    daemon, _ = service
    port = stomp_port(daemon)
    raw = Raw(port)
    raw.frame("CONNECT", {"accept-version": "1.2", "login": MALLORY[0], "passcode": MALLORY[1], "client-id": "jb-src"})
    error = raw.wait(lambda f: f.command in ("ERROR", "CONNECTED"))
    raw.close()
    assert error.command == "ERROR", error
    assert "jb-src" in error.headers.get("message", "") + error.body.decode()


def test_the_link_keeps_its_messages_and_the_users_own_ids_still_work(service):
    """(Stands alone: it publishes before and after attempts of its own, and stops the link
    again, as the module's other tests expect it.)"""
    daemon, passfile = service
    publish(daemon, "kept for the link")
    for client_id in ("jb-src", "jb-factory"):
        try_client_id(daemon, client_id)
    publish(daemon, "after the attempts")
    # Mallory's own client id and durable subscription are hers to use and remove.
    with connect(f"mq://{daemon.address}", *MALLORY) as conn:
        conn.client_id = "mallory-1"
        session = conn.create_session()
        session.create_durable_subscriber(Topic("own.orders"), "mine").close()
        session.unsubscribe("mine")
    r = cli(daemon, passfile, "start", "link", "-bn", "jb", "-ln", "l1")
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        texts = [m.text for m in take(daemon, PASSWORD, "own.out", expect=2, wait=30, quiet=0.2)]
    finally:
        r = cli(daemon, passfile, "stop", "link", "-bn", "jb", "-ln", "l1")
        assert r.returncode == 0, r.stdout + r.stderr
    assert texts == ["kept for the link", "after the attempts"], texts
