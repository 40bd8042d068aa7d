"""Client ids and durable subscriptions reserved for the bridge service, in process: which
names a bridge configuration reserves, and the broker's checks where a client id is set and
a durable subscription is made or removed (the bridge service's own connections and its
service account pass; everyone else, STOMP's clients included, is refused)."""

from __future__ import annotations

import pytest

from bridgemgr.jms.destination import Queue, Topic
from bridgemgr.jms.errors import JMSSecurityException
from bridgemgr.jms.hostbroker import Principal
from bridgemgr.jmsbridge.config import parse_bridge_config
from bridgemgr.jmsbridge.resolve import host_client_names
from bridgemgr.providers.embedded import Broker
from bridgemgr.providers.embedded.host import EmbeddedHostBroker

XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb">
  <link name="durable">
    <source connection-factory-ref="host" destination-ref="t" durable-sub="sub1" clientid="src-id"/>
    <target connection-factory-ref="host" destination-ref="q" clientid="tgt-id"/>
  </link>
  <link name="off" enabled="false">
    <source connection-factory-ref="host" destination-ref="t" durable-sub="sub2" clientid="off-id"/>
    <target connection-factory-ref="far" destination-ref="q" clientid="far-id"/>
  </link>
  <dmq name="audit" connection-factory-ref="host" destination-ref="q" clientid="dmq-id"/>
  <connection-factory ref-name="host">
    <property name="imqConfiguredClientID" value="cf-id"/>
  </connection-factory>
  <connection-factory ref-name="far">
    <property name="imqAddressList" value="mq://elsewhere:7676"/>
    <property name="imqConfiguredClientID" value="far-cf-id"/>
  </connection-factory>
  <destination ref-name="t" name="orders" type="topic"/>
  <destination ref-name="q" name="out"/>
</jmsbridge>
"""


def test_a_configuration_reserves_what_its_links_use_on_the_host_broker():
    ids, durables = host_client_names(parse_bridge_config(XML.encode()))
    # the other broker's client ids (far-id, far-cf-id) are that broker's business
    assert ids == {"src-id", "tgt-id", "off-id", "dmq-id", "cf-id"}
    assert durables == {("src-id", "sub1"), ("off-id", "sub2")}


@pytest.fixture
def host():
    host = EmbeddedHostBroker(Broker())
    host.reserve("jb", {"src-id"}, {("src-id", "sub1")})
    yield host
    host.close()


def test_the_bridge_services_connections_use_what_is_reserved(host):
    conn = host.connection_factory().create_connection("anyone")
    conn.client_id = "src-id"
    session = conn.create_session()
    session.create_durable_subscriber(Topic("orders"), "sub1").close()
    session.unsubscribe("sub1")
    conn.close()


def test_other_clients_are_refused_by_name(host):
    plain = Principal("mallory", frozenset({"user"}))
    with pytest.raises(JMSSecurityException, match="client id 'src-id' is reserved for bridge jb"):
        host.connect(plain, "src-id")  # the STOMP bridge's way in
    client = host.connect(plain, "mine")
    host.subscribe(plain, client, Topic("orders"), durable_name="sub1")  # her own (mine, sub1)
    host.disconnect(plain, client)


def test_a_client_id_taken_before_the_reservation_still_cannot_touch_the_durable(host):
    """A client that set the id before the bridge loaded (serve opens its ports first)."""
    host.release("jb")
    early = host.connect(Principal("mallory"), "src-id")
    host.reserve("jb", {"src-id"}, {("src-id", "sub1")})
    with pytest.raises(JMSSecurityException, match="durable subscription 'sub1' of client id 'src-id'"):
        host.subscribe(Principal("mallory"), early, Topic("orders"), durable_name="sub1")
    with pytest.raises(JMSSecurityException, match="may not unsubscribe"):
        host.unsubscribe(Principal("mallory"), early, "sub1")


def test_the_service_account_passes_and_a_release_frees_the_names(host):
    host.set_service_users({"imqbridge-service"})
    host.disconnect(Principal(None), host.connect(Principal("imqbridge-service"), "src-id"))
    host.release("jb")
    host.disconnect(Principal(None), host.connect(Principal("mallory"), "src-id"))


def test_two_bridges_naming_one_id_keep_it_until_both_release(host):
    host.reserve("other", {"src-id"}, set())
    host.release("jb")
    with pytest.raises(JMSSecurityException, match="bridge other"):
        host.connect(Principal("mallory"), "src-id")


def test_the_service_reserves_a_bridges_names_before_any_port_opens(tmp_path, monkeypatch):
    """Bridges load after the ports open; a client quick enough must not find the
    client ids, durables and DMQs of the activelist's bridges free in between."""
    from bridgemgr.props import load_properties
    from bridgemgr.service import BridgeServiceManager

    xml = tmp_path / "jb.xml"
    xml.write_text(XML.replace('<target connection-factory-ref="far"', '<target connection-factory-ref="host"'))
    props = load_properties(
        overrides=[
            f"imq.varhome={tmp_path / 'var'}",
            "imq.portmapper.port=0",
            "imq.bridge.enabled=true",
            "imq.bridge.activelist=jb",
            "imq.bridge.jb.type=jms",
            f"imq.bridge.jb.xmlurl={xml}",
            "imq.bridge.jb.autostart=false",
            "imq.bridge.admin.user=admin",
            "imq.bridge.admin.password=secret",
        ]
    )
    manager = BridgeServiceManager(props)
    seen: list[str] = []
    open_front_ends = BridgeServiceManager._open_front_ends

    def at_the_first_port(self):
        for client_id in ("src-id", "cf-id"):
            with pytest.raises(JMSSecurityException, match=client_id):
                self.host_broker.connect(Principal("mallory"), client_id)
            seen.append(client_id)
        with pytest.raises(JMSSecurityException, match="consume"):
            self.host_broker.subscribe(
                Principal("mallory", frozenset({"user"}), service="stomp"),
                self.host_broker.connect(Principal("mallory", frozenset({"user"}), service="stomp")),
                Queue("out"),
            )
        seen.append("dmq")
        open_front_ends(self)

    monkeypatch.setattr(BridgeServiceManager, "_open_front_ends", at_the_first_port)
    try:
        manager.start()
    finally:
        manager.stop()
    assert seen == ["src-id", "cf-id", "dmq"]
