"""The original's imq* connection factory attributes on a <connection-factory> without
lookup-name: what they map to, what is refused (file:line, the property's name, never a
password), the login's precedence, and the address list walked over real sockets."""

from __future__ import annotations

import dataclasses
import time

import pytest

from bridgemgr.guard import LoginThrottle, ServiceGuard, ThrottleSettings
from bridgemgr.jms import Queue, TextMessage, naming
from bridgemgr.jms.errors import JMSSecurityException, NamingException, TransportException
from bridgemgr.jms.spi import is_xa_capable
from bridgemgr.jmsbridge.config import DOCTYPE, Property, parse_bridge_config
from bridgemgr.jmsbridge.connections import Connector, configured_client_id
from bridgemgr.jmsbridge.imqcf import (
    AddressListBehavior,
    AddressListFactory,
    BrokerAddress,
    IMQSettings,
    parse_address,
)
from bridgemgr.jmsbridge.resolve import check_xa, resolve_connection_factories
from bridgemgr.props import ConfigError
from ports import free_port
from remote.support import Harness

SECRET = "cf-default-pw-5e1d-never-shown"


def bridge(cf_body: str, cf_attrs: str = "") -> bytes:
    """A bridge whose link targets connection-factory "cf"; its properties start at line 5."""
    return (
        f'{DOCTYPE}\n<jmsbridge name="b">\n'
        '<link name="l" transacted="false"><source connection-factory-ref="cf" '
        'destination-ref="q"/><target connection-factory-ref="cf" destination-ref="q"/></link>\n'
        f'<connection-factory ref-name="cf"{cf_attrs}>\n'
        f"{cf_body}\n</connection-factory>\n"
        '<destination ref-name="q" name="Q"/>\n</jmsbridge>\n'
    ).encode()


def props(**values: str) -> str:
    return "\n".join(f'<property name="{k}" value="{v}"/>' for k, v in values.items())


def problems_of(data: bytes) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_bridge_config(data, "b.xml")
    return [str(p) for p in info.value.problems]


def test_every_supported_property_maps_onto_the_mq_client():
    config = parse_bridge_config(
        bridge(
            props(
                imqAddressList="b1:7677, mqtcp://b2:9000/jms,mqssl://b3:9443, mq://b4/ssljms, [::1]",
                imqAddressListBehavior="random",
                imqAddressListIterations="3",
                imqReconnectEnabled="true",
                imqReconnectAttempts="2",
                imqReconnectInterval="250",
                imqDefaultUsername="u",
                imqDefaultPassword=SECRET,
                imqConfiguredClientID="cid",
                imqPingInterval="-1",
                imqConnectionType="TCP",
                imqConsumerFlowLimit="7",
                imqAckTimeout="2500",
            )
        ),
        "b.xml",
    )
    assert config.warnings == ()
    cf = config.connection_factory("cf")
    assert cf.imq == IMQSettings(
        addresses=(
            BrokerAddress("mq://b1:7677"),
            BrokerAddress("mqtcp://b2:9000"),
            BrokerAddress("mqssl://b3:9443", True),
            BrokerAddress("mq://b4:7676", True),
            BrokerAddress("mq://[::1]:7676"),
        ),
        behavior=AddressListBehavior.RANDOM,
        iterations=3,
        reconnect_enabled=True,
        reconnect_attempts=2,
        reconnect_interval_ms=250,
        default_username="u",
        default_password=SECRET,
        client_id="cid",
        ping_interval_s=0,
        consumer_flow_limit=7,
        ack_timeout_ms=2500,
    )
    assert cf.imq.tries_per_address == 3
    assert configured_client_id(cf) == "cid"
    assert SECRET not in repr(cf) and SECRET not in repr(cf.imq)
    factory = AddressListFactory(cf.imq)
    assert [b.url for b in factory.brokers][:2] == ["mq://b1:7677", "mqtcp://b2:9000"]
    assert [b.ssl_context is not None for b in factory.brokers] == [False, False, True, True, False]
    assert {b.heartbeat for b in factory.brokers} == {0.0}  # the service's interval
    assert {b.prefetch for b in factory.brokers} == {7}  # the source side's prefetch
    assert {b.xa_timeout for b in factory.brokers} == {2.5}  # an XA call's wait for its answer


@pytest.mark.parametrize("body, xa_timeout", [("", 10.0), (props(imqAckTimeout="0"), None)])
def test_xa_calls_wait_10_s_for_an_answer_unless_imq_ack_timeout_says_otherwise(body, xa_timeout):
    """0 is the original's "wait indefinitely"; absent, a hung broker is noticed in 10 s."""
    cf = parse_bridge_config(bridge(props(imqAddressList="mq://h:7676") + "\n" + body)).connection_factory("cf")
    assert [b.xa_timeout for b in AddressListFactory(cf.imq).brokers] == [xa_timeout]


@pytest.mark.parametrize("value, xa_timeout", [(None, 10.0), ("1500", 1.5), ("0", None)])
def test_a_jndi_mq_factory_takes_imq_ack_timeout_from_its_environment(value, xa_timeout):
    environment = {"java.naming.factory.initial": "imq.embedded", "java.naming.provider.url": "mq://h:7676"}
    if value is not None:
        environment["imqAckTimeout"] = value
    assert naming.lookup("XAConnectionFactory", environment).xa_timeout == xa_timeout


def test_a_bad_imq_ack_timeout_in_a_jndi_environment_names_the_property():
    with pytest.raises(
        NamingException,
        match=r"imqAckTimeout='soon': write a whole number of "
        r"milliseconds from 0 \(no limit\)",
    ):
        naming.lookup(
            "XAConnectionFactory",
            {
                "java.naming.factory.initial": "imq.embedded",
                "java.naming.provider.url": "mq://h:7676",
                "imqAckTimeout": "soon",
            },
        )


def test_a_jndi_mq_factory_takes_the_clients_settings_from_its_environment():
    """imqcf.py reaches each broker of an address list through this context, as a bridge
    XML's lookup does: heart-beats, prefetch and TLS come from the environment."""
    environment = {"java.naming.factory.initial": "imq.embedded", "java.naming.provider.url": "mq://h:7676"}
    plain = naming.lookup("XAConnectionFactory", environment)
    assert (plain.heartbeat, plain.prefetch, plain.ssl_context) == (30.0, 100, None)
    tuned = naming.lookup(
        "XAConnectionFactory",
        {**environment, "imqPingInterval": "0", "imqConsumerFlowLimit": "7", "imqConnectionType": "tls"},
    )
    assert (tuned.heartbeat, tuned.prefetch, tuned.ssl_context is not None) == (0.0, 7, True)


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("imqPingInterval", "-1", r"imqPingInterval='-1': write a whole number of seconds"),
        ("imqConsumerFlowLimit", "70000", r"imqConsumerFlowLimit='70000': write a whole number of messages"),
        ("imqConnectionType", "HTTP", r"imqConnectionType='HTTP': write TCP or TLS"),
    ],
)
def test_a_bad_client_setting_in_a_jndi_environment_names_the_property(key, value, says):
    with pytest.raises(NamingException, match=says):
        naming.lookup(
            "XAConnectionFactory",
            {"java.naming.factory.initial": "imq.embedded", "java.naming.provider.url": "mq://h:7676", key: value},
        )


def test_connection_type_tls_puts_every_address_on_tls():
    assert parse_address("h:1", tls=True) == BrokerAddress("mq://h:1", True)
    cf = parse_bridge_config(bridge(props(imqAddressList="mqtcp://h:2", imqConnectionType="TLS"))).connection_factory(
        "cf"
    )
    assert cf.imq.addresses == (BrokerAddress("mqtcp://h:2", True),)


def test_unsupported_properties_are_refused_with_file_line_and_name():
    data = bridge(
        props(imqAddressList="mq://h:7676", imqSSLIsHostTrusted="true")
        + "\n"
        + props(clientID="c", imqBrokerHostName="h")
        + "\n"
        + props(**{"java.naming.factory.initial": "imq.embedded"})
    )
    assert problems_of(data) == [
        "b.xml:6: connection-factory 'cf': property 'imqSSLIsHostTrusted' is not supported for "
        "a connection factory without lookup-name (the broker's certificate is always "
        "verified; give its CA with the SSL_CERT_FILE environment variable); remove it",
        "b.xml:7: connection-factory 'cf': property 'clientID' is not supported for a "
        "connection factory without lookup-name (did you mean imqConfiguredClientID?); "
        "remove it",
        "b.xml:8: connection-factory 'cf': property 'imqBrokerHostName' is not supported for "
        "a connection factory without lookup-name (write imqAddressList=mq://host:port); "
        "remove it",
        "b.xml:9: connection-factory 'cf': property 'java.naming.factory.initial' is not "
        "supported for a connection factory without lookup-name (a JNDI environment needs "
        "lookup-name); remove it",
    ]


@pytest.mark.parametrize(
    "name, value, expected",
    [
        ("imqAddressList", "http://h:80/imq", "HTTP tunnelling is not supported"),
        ("imqAddressList", "mq://a:1,,mq://b:2", "property imqAddressList has an empty entry"),
        ("imqAddressList", "mqtcp://h", "mqtcp:// needs the jms service's port"),
        ("imqAddressList", "mq://h:7676/admin", "the service after the address must be jms or ssljms"),
        ("imqAddressList", "stomp://h:1", "write mq://host:port (the port mapper)"),
        ("imqAddressList", "mq://h:x", "entry 'mq://h:x' has a bad port"),
        ("imqAddressListBehavior", "ROUND", "property imqAddressListBehavior is 'ROUND'; write PRIORITY or RANDOM"),
        ("imqAddressListIterations", "-1", 'use the connection-factory\'s connect-attempts="-1"'),
        ("imqReconnectAttempts", "-1", "-1 (unlimited) is not taken"),
        (
            "imqReconnectInterval",
            "soon",
            "property imqReconnectInterval is 'soon'; write a whole number from 0 to 3600000",
        ),
        ("imqReconnectEnabled", "yes", "property imqReconnectEnabled is 'yes'; write true or false"),
        ("imqConnectionType", "HTTP", "property imqConnectionType is 'HTTP'; write TCP or TLS"),
        ("imqPingInterval", "x", "property imqPingInterval is 'x'"),
        ("imqConfiguredClientID", " ", "property imqConfiguredClientID is empty"),
        ("imqConsumerFlowLimit", "-1", "property imqConsumerFlowLimit is '-1'; write a whole number from 0 to 65536"),
        ("imqAckTimeout", "-1", "property imqAckTimeout is '-1'; write a whole number from 0 to 86400000"),
    ],
)
def test_bad_values_are_errors_on_the_property_line(name, value, expected):
    extra = {} if name == "imqAddressList" else {"imqAddressList": "mq://h:7676"}
    (problem,) = problems_of(bridge(props(**{name: value}) + "\n" + props(**extra)))
    assert problem.startswith("b.xml:5: connection-factory 'cf': ") and expected in problem


def test_settings_of_the_list_without_a_list_and_a_lone_default_password_are_warnings():
    config = parse_bridge_config(bridge(props(imqReconnectEnabled="true", imqDefaultPassword=SECRET)), "b.xml")
    assert [str(w) for w in config.warnings] == [
        "b.xml:5: warning: connection-factory 'cf': property imqReconnectEnabled has no effect "
        "without imqAddressList (the host broker is reached as the service's own); remove it "
        "or add imqAddressList",
        "b.xml:6: warning: connection-factory 'cf': sets imqDefaultPassword but not "
        "imqDefaultUsername, so the password is not used; add imqDefaultUsername or remove it",
    ]


def test_no_password_is_ever_part_of_a_problem():
    for body in (
        props(imqDefaultPassword=SECRET, imqAddressListBehavior=SECRET[:3]),
        props(imqPassword=SECRET),
        props(imqDefaultPasword=SECRET),
    ):
        with pytest.raises(ConfigError) as info:
            parse_bridge_config(bridge(body), "b.xml")
        assert SECRET not in str(info.value)


def test_a_factory_with_lookup_name_keeps_its_properties_as_jndi_environment():
    config = parse_bridge_config(
        bridge(
            props(**{"java.naming.factory.initial": "x.Y", "imqAddressList": "anything at all"}), ' lookup-name="CF"'
        )
    )
    assert config.connection_factory("cf").imq == IMQSettings()


@pytest.mark.parametrize(
    "attrs, body, login",
    [
        (' username="attr" password="p1"', props(imqDefaultUsername="def", imqDefaultPassword="p2"), ("attr", "p1")),
        ("", props(imqDefaultUsername="def", imqDefaultPassword="p2"), ("def", "p2")),
        ("", props(imqDefaultUsername="def"), ("def", None)),
        ("", "", (None, None)),
    ],
)
def test_the_username_attributes_come_before_imq_default_username(attrs, body, login):
    assert parse_bridge_config(bridge(body, attrs)).connection_factory("cf").login == login


def test_an_address_list_resolves_to_its_brokers_not_the_host_broker():
    config = parse_bridge_config(bridge(props(imqAddressList="mq://h:7676")))
    called = []
    factories, problems = resolve_connection_factories(config, lambda env: called.append(env))
    assert problems == [] and called == []
    assert isinstance(factories["cf"], AddressListFactory) and is_xa_capable(factories["cf"])
    assert resolve_connection_factories(config)[0].keys() == {"cf"}  # no host factory needed
    assert check_xa(config) == []


def test_an_unchecked_bad_address_list_is_a_problem_not_the_host_broker():
    config = parse_bridge_config(bridge(props(imqAddressList="mq://h:7676")), "b.xml")
    cf = dataclasses.replace(config.connection_factory("cf"), properties=(Property("imqAddressList", "http://h", 5),))
    unchecked = dataclasses.replace(config, connection_factories=(cf,))
    factories, (problem,) = resolve_connection_factories(
        unchecked, lambda env: pytest.fail("the host broker instead of imqAddressList")
    )
    assert (
        factories == {}
        and "b.xml:5: connection-factory 'cf': property imqAddressList "
        "entry 'http://h': HTTP tunnelling is not supported"
        in str(problem)
    )


# --- the address list over real sockets ------------------------------------------------------


@pytest.fixture
def service(broker):
    users = {"alice": "right"}
    no_throttle = ServiceGuard("jms", LoginThrottle(ThrottleSettings(base_delay=0, max_delay=0)))
    with Harness(broker, authenticator=lambda u, p: users.get(u) == p, guard=no_throttle) as h:
        yield h


def factory(addresses: str, **imq) -> AddressListFactory:
    config = parse_bridge_config(bridge(props(imqAddressList=addresses, **imq)))
    return AddressListFactory(config.connection_factory("cf").imq)


def test_the_first_address_that_answers_wins_after_the_ones_that_do_not(service, broker):
    dead = f"mqtcp://127.0.0.1:{free_port()}"
    conn = factory(f"{dead}, {service.url}").create_connection("alice", "right")
    try:
        conn.create_session().create_producer(Queue("q")).send(TextMessage("hi"))
    finally:
        conn.close()
    assert broker.destinations()["queue:q"]["pending"] == 1


@pytest.mark.slow
def test_attempts_iterations_and_interval_when_nothing_answers():
    dead = ", ".join(f"mqtcp://127.0.0.1:{free_port()}" for _ in range(2))
    start = time.monotonic()
    with pytest.raises(
        TransportException,
        match=r"no broker of imqAddressList accepted a "
        r"connection \(12 attempt\(s\)\): Transport",
    ):
        factory(
            dead,
            imqAddressListIterations="2",
            imqReconnectEnabled="true",
            imqReconnectAttempts="2",
            imqReconnectInterval="50",
        ).create_connection()
    assert time.monotonic() - start >= 8 * 0.05  # two waits per address and iteration
    with pytest.raises(TransportException, match=r"\(2 attempt\(s\)\)"):
        factory(dead, imqReconnectAttempts="5").create_connection()  # reconnect not enabled


def test_random_behavior_tries_every_address(service):
    dead = ", ".join(f"mqtcp://127.0.0.1:{free_port()}" for _ in range(3))
    for _ in range(5):
        factory(f"{dead}, {service.url}", imqAddressListBehavior="RANDOM").create_connection("alice", "right").close()


def test_a_refused_login_fails_at_once_and_names_no_password(service):
    slow_dead = f"mqtcp://127.0.0.1:{free_port()}"
    with pytest.raises(JMSSecurityException) as info:
        factory(
            f"{service.url}, {slow_dead}",
            imqReconnectEnabled="true",
            imqReconnectAttempts="50",
            imqReconnectInterval="1000",
        ).create_connection("alice", "wrong-pw-7f3e")
    assert "authentication failed for user 'alice'" in str(info.value)
    assert "wrong-pw-7f3e" not in str(info.value)


def test_a_connector_logs_in_with_imq_default_username(service):
    import logging

    config = parse_bridge_config(
        bridge(
            props(
                imqAddressList=service.url,
                imqDefaultUsername="alice",
                imqDefaultPassword="right",
                imqConfiguredClientID="cid-9",
            )
        )
    )
    cf = config.connection_factory("cf")
    handle = Connector(cf, AddressListFactory(cf.imq), logging.getLogger("t")).connect(attempts=1)
    try:
        assert handle.connection.client_id == "cid-9"
        assert handle.connection.username == "alice"
    finally:
        handle.close()
