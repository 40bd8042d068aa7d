"""The bridge XML loader: the DTD, defaults, the rules beyond the DTD, and error reports."""

from __future__ import annotations

import dataclasses
import importlib.resources
from pathlib import Path

import pytest

from bridgemgr.jmsbridge import config as C
from bridgemgr.jmsbridge.config import (
    AS_SOURCE,
    BUILTIN_DMQ,
    BridgeConfig,
    ConfigError,
    DestinationType,
    parse_bridge_config,
)

pytestmark = pytest.mark.timeout(30)
DATA = Path(__file__).parent / "data" / "config"
REPO = Path(__file__).resolve().parents[1]

CF = '<connection-factory ref-name="cf"/>'
DEST = '<destination ref-name="q" name="Q"/>'


def bridge(body: str = "", name: str = "b", doctype: bool = True, attrs: str = "") -> bytes:
    head = f"{C.DOCTYPE}\n" if doctype else ""
    return f'<?xml version="1.0"?>\n{head}<jmsbridge name="{name}"{attrs}>\n{body}\n</jmsbridge>\n'.encode()


def link(
    name: str = "l",
    src: str = 'connection-factory-ref="cf" destination-ref="q"',
    tgt: str = 'connection-factory-ref="cf" destination-ref="q"',
    attrs: str = "",
) -> str:
    return f'<link name="{name}"{attrs}><source {src}/><target {tgt}/></link>'


def problems_of(data: bytes, bridge_name: str | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_bridge_config(data, "t.xml", bridge_name)
    return [str(p) for p in info.value.problems]


# --- the DTD ----------------------------------------------------------------------------


def test_dtd_describes_the_documented_structure():
    attrs = C.dtd_attributes()
    assert set(attrs) == {
        "jmsbridge",
        "link",
        "source",
        "target",
        "dmq",
        "connection-factory",
        "destination",
        "property",
        "description",
    }
    expected = {
        "jmsbridge": {"name": None, "message-transfer-tag-bridge-name": "false", "log-message-transfer": "true"},
        "link": {"name": None, "enabled": "true", "transacted": "true"},
        "source": {
            "connection-factory-ref": None,
            "destination-ref": None,
            "selector": None,
            "durable-sub": None,
            "clientid": None,
        },
        "target": {
            "connection-factory-ref": None,
            "destination-ref": None,
            "stay-connected": "true",
            "clientid": None,
            "retain-replyto": "false",
            "message-transformer-class": None,
            "consume-no-transfer-on-transform-error": "false",
        },
        "dmq": {
            "name": None,
            "connection-factory-ref": None,
            "destination-ref": None,
            "enabled": "true",
            "stay-connected": "true",
            "time-to-live-in-millis": "0",
            "clientid": None,
            "send-attempts": "3",
            "send-attempt-interval-in-seconds": "5",
            "message-transformer-class": None,
        },
        "connection-factory": {
            "ref-name": None,
            "lookup-name": None,
            "multi-rm": "false",
            "connect-attempts": "-1",
            "connect-attempt-interval-in-seconds": "5",
            "idle-timeout-in-seconds": "1800",
            "username": None,
            "password": None,
        },
        "destination": {"ref-name": None, "name": None, "lookup-name": None, "type": None},
        "property": {"name": None, "value": None},
        "description": {},
    }
    assert {el: {a: d.default_value for a, d in decls.items()} for el, decls in attrs.items()} == expected
    assert attrs["destination"]["type"].values() == ["queue", "topic"]
    required = {(el, a) for el, decls in attrs.items() for a, d in decls.items() if d.default == "required"}
    assert required == {
        ("jmsbridge", "name"),
        ("link", "name"),
        ("dmq", "name"),
        ("source", "connection-factory-ref"),
        ("source", "destination-ref"),
        ("target", "connection-factory-ref"),
        ("target", "destination-ref"),
        ("dmq", "connection-factory-ref"),
        ("dmq", "destination-ref"),
        ("connection-factory", "ref-name"),
        ("destination", "ref-name"),
        ("property", "name"),
        ("property", "value"),
    }


@pytest.mark.parametrize(
    "cls,tag",
    [
        (C.LinkConfig, "link"),
        (C.SourceConfig, "source"),
        (C.TargetConfig, "target"),
        (C.DMQConfig, "dmq"),
        (C.ConnectionFactoryConfig, "connection-factory"),
        (C.DestinationConfig, "destination"),
        (BridgeConfig, "jmsbridge"),
    ],
)
def test_dataclass_defaults_equal_the_dtd_defaults(cls, tag):
    fields = {f.name: f.default for f in dataclasses.fields(cls)}
    for name, decl in C.dtd_attributes()[tag].items():
        field = name.replace("-", "_")
        if decl.default == "required":
            continue
        want = decl.default_value
        want = {"true": True, "false": False}.get(want, want)
        if field == "type":
            want = DestinationType.QUEUE  # the chapter: missing type means queue
        elif isinstance(fields[field], int) and not isinstance(fields[field], bool):
            want = int(want)
        assert fields[field] == want, (tag, name)


def test_the_installed_package_and_the_repo_hold_the_same_dtd(monkeypatch):
    repo_text = (REPO / "dtd" / C.DTD_SYSTEM_ID).read_bytes()
    assert C.dtd_text() == repo_text

    def missing(name):
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(importlib.resources, "files", missing)
    assert C.dtd_text() == repo_text  # running from the source tree


def test_dtd_is_found_through_the_package_when_installed(monkeypatch, tmp_path):
    (tmp_path / C.DTD_SYSTEM_ID).write_bytes(b"<!-- installed copy -->")
    monkeypatch.setattr(importlib.resources, "files", lambda name: tmp_path)
    assert C.dtd_text() == b"<!-- installed copy -->"


# --- a full configuration, as written for the original product ----------------------------


def test_a_config_of_the_original_product_loads_with_every_value():
    config = C.load_bridge_config(str(DATA / "original-product.xml"), bridge_name="mq2external")
    assert (config.name, config.message_transfer_tag_bridge_name, config.log_message_transfer) == (
        "mq2external",
        True,
        False,
    )
    link1, link2 = config.links
    assert (link1.name, link1.enabled, link1.transacted, link1.description) == (
        "link1",
        False,
        False,
        "Outbound orders",
    )
    assert link1.source == C.SourceConfig("mqcf", "orders", "color = 'red'", "sub1", "src-client", "the source")
    target = link1.target
    assert target.as_source and target.destination_ref == AS_SOURCE
    assert (
        target.stay_connected,
        target.clientid,
        target.retain_replyto,
        target.message_transformer_class,
        target.consume_no_transfer_on_transform_error,
        target.description,
    ) == (False, "tgt-client", True, "com.example.MyTransformer", True, "the target")
    assert [(p.name, p.value) for p in target.properties] == [("p1", "v1"), ("p2", "v2")]
    assert (link2.enabled, link2.transacted, link2.target.stay_connected) == (True, True, True)

    builtin, mydmq = config.dmqs
    assert builtin.is_builtin and builtin is config.builtin_dmq
    assert (
        builtin.connection_factory_ref,
        builtin.destination_ref,
        builtin.enabled,
        builtin.time_to_live_in_millis,
        builtin.send_attempts,
    ) == (None, None, True, 1000, 1)
    assert mydmq == C.DMQConfig(
        "mydmq",
        "mqcf",
        "deadq",
        False,
        False,
        86400000,
        "dmq-client",
        7,
        9,
        "com.example.DmqTransformer",
        (C.Property("x", "y"),),
        "second DMQ",
    )
    mqcf, extcf = config.connection_factories
    assert (
        mqcf.multi_rm,
        mqcf.connect_attempts,
        mqcf.connect_attempt_interval_in_seconds,
        mqcf.idle_timeout_in_seconds,
        mqcf.username,
        mqcf.password,
        mqcf.lookup_name,
    ) == (True, 3, 10, 0, "guest", "s3cret-pw", None)
    assert mqcf.environment == {"imqAddressList": "mq://localhost:7676"}
    assert extcf.lookup_name == "jms/XACF" and extcf.connect_attempts == -1
    assert config.destination("orders").type is DestinationType.TOPIC
    assert config.destination("deadq").type is DestinationType.QUEUE
    assert config.destination("replies").lookup_name == "jms/Replies"
    assert config.warnings == ()


def test_secrets_are_not_in_the_repr():
    config = C.load_bridge_config(str(DATA / "original-product.xml"))
    text = repr(config)
    assert "s3cret-pw" not in text and "jndi-secret" not in text and "guest" in text


def test_a_file_without_doctype_is_validated_all_the_same():
    assert parse_bridge_config(bridge(CF + DEST, doctype=False)).name == "b"
    assert "<link> needs the attribute name" in "\n".join(
        problems_of(
            bridge(
                '<link><source connection-factory-ref="cf" destination-ref="q"/>'
                '<target connection-factory-ref="cf" destination-ref="q"/></link>' + CF + DEST,
                doctype=False,
            )
        )
    )


def test_defaults_of_a_minimal_config():
    config = parse_bridge_config(bridge(link() + CF + DEST))
    (only,) = config.links
    assert (only.enabled, only.transacted, only.target.stay_connected, only.target.retain_replyto) == (
        True,
        True,
        True,
        False,
    )
    assert [d.name for d in config.dmqs] == [BUILTIN_DMQ]
    assert config.dmqs[0] == C.DMQConfig(BUILTIN_DMQ, None, None)
    cf = config.connection_factory("cf")
    assert (cf.connect_attempts, cf.connect_attempt_interval_in_seconds, cf.idle_timeout_in_seconds, cf.multi_rm) == (
        -1,
        5,
        1800,
        False,
    )
    assert config.destination("q").type is DestinationType.QUEUE
    with pytest.raises(KeyError):
        config.link("missing")


def test_the_builtin_dmq_comes_first_whatever_the_file_order():
    body = (
        '<dmq name="d1" connection-factory-ref="cf" destination-ref="q"/>'
        '<dmq name="built-in-dmq" connection-factory-ref="cf" destination-ref="q" '
        'send-attempts="9"/>'
        '<dmq name="d2" connection-factory-ref="cf" destination-ref="q"/>' + CF + DEST
    )
    config = parse_bridge_config(bridge(body))
    assert [d.name for d in config.dmqs] == [BUILTIN_DMQ, "d1", "d2"]
    assert config.builtin_dmq.send_attempts == 9


def test_empty_optional_attributes_are_unset_but_an_empty_password_is_a_password():
    body = (
        link(src='connection-factory-ref="cf" destination-ref="q" selector=""')
        + '<connection-factory ref-name="cf" lookup-name="" username="u" password=""/>'
        + DEST
    )
    config = parse_bridge_config(bridge(body))
    cf = config.connection_factory("cf")
    assert (cf.lookup_name, cf.username, cf.password) == (None, "u", "")
    assert config.links[0].source.selector is None


# --- the rules beyond the DTD, with file and line ----------------------------------------------

EXPECTED_MANY = [
    "t.xml:3: <jmsbridge> must contain (link*, dmq*, connection-factory*, destination*), in "
    "that order, but contains (link, link, link, dmq, dmq, connection-factory, "
    "connection-factory, destination, destination, foo)",
    "t.xml:3: the jmsbridge name is 'wrong' but this file is the configuration of bridge 'right'; make them the same",
    "t.xml:4: <link> attribute transacted is 'yes'; write true or false",
    "t.xml:5: the source of link 'l1' destination-ref is AS_SOURCE, which only a <target> may "
    "use; name a <destination>",
    "t.xml:6: the target of link 'l1' connection-factory-ref 'cff' matches no "
    "<connection-factory ref-name=...> (did you mean cf?); add it or fix the name",
    "t.xml:6: the target of link 'l1' destination-ref 'as_source' matches no <destination "
    "ref-name=...> (did you mean AS_SOURCE?); add it or fix the name",
    "t.xml:8: link name 'l1' is used again (first at line 4); give each link its own name",
    "t.xml:10: <target> attribute message-transformer-class is 'notaclass'; write a dotted "
    "class name such as bridgemgr.transformers.uppercase.UppercaseTransformer",
    "t.xml:12: link name 'Built-In-DMQ' is reserved for the built-in DMQ; choose another name",
    "t.xml:14: the target of link 'Built-In-DMQ' destination-ref 'qq' matches no <destination "
    "ref-name=...> (did you mean q?); add it or fix the name",
    "t.xml:16: <dmq> attribute send-attempts is '0'; write a whole number from 1 to 2147483647",
    "t.xml:16: dmq name 'BUILT-IN-DMQ' is reserved for the built-in DMQ; write built-in-dmq "
    "exactly to configure the built-in DMQ, or choose another name",
    "t.xml:17: <dmq> attribute time-to-live-in-millis is '1.5'; write a whole number from 0 to 9223372036854775807",
    "t.xml:18: <connection-factory> attribute connect-attempts is '-2'; write a whole number from -1 to 2147483647",
    "t.xml:18: connection-factory 'cf' sets username but not password; add password (password=\"\" for an empty one)",
    "t.xml:18: connection-factory 'cf' has lookup-name 'CF' but no <property "
    'name="java.naming.factory.initial" value=...>; add the JNDI environment as property '
    "elements",
    "t.xml:19: connection-factory ref-name 'cf' is used again (first at line 18); give each "
    "connection-factory its own ref-name",
    "t.xml:19: warning: connection-factory 'cf' sets password but not username, so the "
    "password is not used; add username or remove password",
    "t.xml:20: <destination> attribute type is 'Queue'; write queue or topic",
    "t.xml:20: destination 'q' has neither name nor lookup-name; set one of them",
    "t.xml:21: destination ref-name 'imq.bridge.JMS.dmq' is reserved for the built-in DMQ's "
    "destination; choose another name",
    "t.xml:22: there is no element <foo> in a JMS bridge configuration; remove it",
]


def test_all_problems_of_a_file_come_together_sorted_by_line():
    data = (DATA / "many-errors.xml").read_bytes()
    assert problems_of(data, "right") == EXPECTED_MANY


RULES = [
    (
        bridge(CF + DEST + '<destination ref-name="q" name="Q2"/>'),
        "t.xml:4: destination ref-name 'q' is used again (first at line 4)",
    ),
    (bridge(link() + link() + CF + DEST), "link name 'l' is used again"),
    (
        bridge('<dmq name="d" connection-factory-ref="cf" destination-ref="q"/>' * 2 + CF + DEST),
        "dmq name 'd' is used again",
    ),
    (bridge(link(name="as_source") + CF + DEST), "link name 'as_source' is reserved"),
    (bridge(CF + '<destination ref-name="Built-in-DMQ" name="x"/>'), "destination ref-name 'Built-in-DMQ' is reserved"),
    (bridge(CF.replace('"cf"', '"AS_SOURCE"')), "connection-factory ref-name 'AS_SOURCE' is reserved"),
    (bridge(name="imq.bridge.jms.dmq"), "jmsbridge name 'imq.bridge.jms.dmq' is reserved"),
    (
        bridge('<dmq name="d" connection-factory-ref="nocf" destination-ref="AS_SOURCE"/>' + CF + DEST),
        "dmq 'd' connection-factory-ref 'nocf' matches no",
    ),
    (
        bridge('<dmq name="d" connection-factory-ref="cf" destination-ref="AS_SOURCE"/>' + CF + DEST),
        "dmq 'd' destination-ref is AS_SOURCE, which only a <target> may use",
    ),
    (
        bridge(link(src='connection-factory-ref="cf" destination-ref="nope"') + CF + DEST),
        "the source of link 'l' destination-ref 'nope' matches no <destination",
    ),
    (
        bridge(CF + '<destination ref-name="q" lookup-name="jms/Q"/>'),
        "destination 'q' has lookup-name 'jms/Q' but no <property",
    ),
    (
        bridge(
            '<dmq name="d" connection-factory-ref="cf" destination-ref="q" '
            'send-attempt-interval-in-seconds="-1"/>' + CF + DEST
        ),
        "send-attempt-interval-in-seconds is '-1'; write a whole number from 0",
    ),
    (
        bridge('<connection-factory ref-name="cf" idle-timeout-in-seconds="99999999999"/>' + DEST),
        "idle-timeout-in-seconds is '99999999999'",
    ),
    (
        bridge('<connection-factory ref-name="cf" connect-attempt-interval-in-seconds="5s"/>' + DEST),
        "connect-attempt-interval-in-seconds is '5s'",
    ),
    (
        bridge(
            link(tgt='connection-factory-ref="cf" destination-ref="q" message-transformer-class="a.b-c.D"') + CF + DEST
        ),
        "message-transformer-class is 'a.b-c.D'",
    ),
    (
        bridge(
            '<dmq name="d" connection-factory-ref="cf" destination-ref="q" '
            'message-transformer-class="x.import.Y"/>' + CF + DEST
        ),
        "message-transformer-class is 'x.import.Y'",
    ),
    (
        bridge("", attrs=' bogus="1" log-message-transfer="TRUE"'),
        "<jmsbridge> attribute log-message-transfer is 'TRUE'; write true or false",
    ),
    (
        bridge("", attrs=' log-message-tranfser="true"'),
        "<jmsbridge> has no attribute log-message-tranfser (did you mean log-message-transfer?)",
    ),
    (bridge("<lnk/>"), "there is no element <lnk> in a JMS bridge configuration (did you mean link?)"),
    (
        bridge('<link name="l"><target connection-factory-ref="cf" destination-ref="q"/></link>' + CF + DEST),
        "<link> must contain (description?, source, target, property*), in that order, but contains (target)",
    ),
    (
        bridge(CF + '<destination ref-name="q" name="Q">text</destination>'),
        "<destination> must contain (description?, property*), in that order",
    ),
    (b'<link name="x"/>', "the top element is <link>; a bridge configuration starts with <jmsbridge name=...>"),
]


@pytest.mark.parametrize("data,expected", RULES)
def test_rules(data, expected):
    found = "\n".join(problems_of(data))
    assert expected in found


WARNINGS = [
    (
        bridge(link(src='connection-factory-ref="cf" destination-ref="q" durable-sub="s"') + CF + DEST),
        "has durable-sub but its source 'q' is a queue",
    ),
    (
        bridge(
            CF + '<destination ref-name="q" name="Q" lookup-name="jms/Q">'
            '<property name="java.naming.factory.initial" value="x.Y"/></destination>'
        ),
        "destination 'q' has both name and lookup-name; name is ignored",
    ),
    (
        bridge(
            '<dmq name="built-in-dmq" connection-factory-ref="cf" destination-ref="q" '
            'stay-connected="false"/>' + CF + DEST
        ),
        "stay-connected is ignored for the built-in DMQ",
    ),
    (
        bridge(
            '<connection-factory ref-name="cf"><property name="imqConfiguredClientID" '
            'value="1"/><property name="imqConfiguredClientID" value="2"/>'
            "</connection-factory>" + DEST
        ),
        "property 'imqConfiguredClientID' is set twice in <connection-factory>; the last one wins",
    ),
]


@pytest.mark.parametrize("data,expected", WARNINGS)
def test_warnings_do_not_fail_the_load(data, expected):
    config = parse_bridge_config(data, "t.xml")
    assert any(expected in str(w) and w.severity == "warning" for w in config.warnings)


def test_a_duplicated_property_keeps_the_last_value():
    config = parse_bridge_config(
        bridge(
            '<connection-factory ref-name="cf"><property name="imqConfiguredClientID" value="1"/>'
            '<property name="imqDefaultUsername" value="2"/>'
            '<property name="imqConfiguredClientID" value="3"/></connection-factory>'
        )
    )
    assert config.connection_factory("cf").environment == {"imqDefaultUsername": "2", "imqConfiguredClientID": "3"}


def test_the_bridge_name_must_match_when_given():
    data = bridge(CF + DEST, name="b")
    assert parse_bridge_config(data, bridge_name="b").name == "b"
    assert parse_bridge_config(data).name == "b"
    assert "make them the same" in problems_of(data, "other")[0]


def test_a_flood_of_errors_is_cut_to_a_readable_report():
    body = "".join(
        f'<link name="l{i}"><source connection-factory-ref="x{i}" destination-ref'
        f'="y{i}"/><target connection-factory-ref="x" destination-ref="y"/></link>\n'
        for i in range(200)
    )
    found = problems_of(bridge(body))
    assert len(found) == C.MAX_PROBLEMS + 1
    assert found[-1].endswith("more problems are not shown; fix these first")


def test_parse_wants_bytes():
    with pytest.raises(TypeError):
        parse_bridge_config(bridge().decode())  # type: ignore[arg-type]


def test_load_bridge_uses_the_broker_properties(tmp_path):
    from bridgemgr.props import load_properties

    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "b1.xml").write_bytes(bridge(CF + DEST, name="b1"))
    props_file = tmp_path / "broker.properties"
    props_file.write_text(
        "imq.bridge.b1.type=jms\nimq.bridge.b1.xmlurl=conf/b1.xml\n"
        "imq.bridge.b2.type=jms\nimq.bridge.b2.xmlurl=conf/b1.xml\n"
    )
    props = load_properties([props_file], environ={})
    assert C.load_bridge(props, "b1").source == str(tmp_path / "conf" / "b1.xml")
    with pytest.raises(ConfigError, match="is the configuration of bridge 'b2'"):
        C.load_bridge(props, "b2")
    with pytest.raises(ConfigError, match=r"has no imq.bridge.b3.xmlurl"):
        C.load_bridge(props, "b3")


def test_a_link_takes_a_window_property_after_its_target():
    body = link().replace("</link>", '<property name="window" value="250"/></link>')
    config = parse_bridge_config(bridge(body + CF + DEST), "t.xml")
    assert config.link("l").window == 250
    assert parse_bridge_config(bridge(link() + CF + DEST), "t.xml").link("l").window is None


@pytest.mark.parametrize("value", ["0", "-5", "many", "", "99999999999"])
def test_a_bad_link_window_names_the_file_line_and_element(value):
    body = link().replace("</link>", f'\n<property name="window" value="{value}"/></link>')
    assert problems_of(bridge(body + CF + DEST)) == [
        f't.xml:5: <link name="l"> <property name="window"> has value {value!r}; write a whole '
        "number from 1 to 2147483647"
    ]


def test_a_link_takes_a_window_bytes_property_after_its_target():
    body = link().replace("</link>", '<property name="windowBytes" value="4m"/></link>')
    config = parse_bridge_config(bridge(body + CF + DEST), "t.xml")
    assert config.link("l").window_bytes == 4 * 1024 * 1024
    assert parse_bridge_config(bridge(link() + CF + DEST), "t.xml").link("l").window_bytes is None


@pytest.mark.parametrize("value", ["0", "-2", "big", "", "4 MB"])
def test_a_bad_link_window_bytes_names_the_file_line_and_element(value):
    body = link().replace("</link>", f'\n<property name="windowBytes" value="{value}"/></link>')
    assert problems_of(bridge(body + CF + DEST)) == [
        f't.xml:5: <link name="l"> <property name="windowBytes"> has value {value!r}; write a '
        "byte size of at least 1 such as 512k, 16m or 1g, or -1 for no byte bound"
    ]


def test_an_unknown_link_property_is_an_error_with_a_hint():
    body = link().replace("</link>", '\n<property name="windw" value="5"/></link>')
    [problem] = problems_of(bridge(body + CF + DEST))
    assert problem.startswith('t.xml:5: <link name="l"> has <property name="windw">')
    assert "did you mean window?" in problem and "transformer input goes in <target>" in problem
