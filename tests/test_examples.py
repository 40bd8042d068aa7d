"""Every example loads: its broker properties, and the XML of every JMS bridge they name
(parsing and validation only; the ActiveMQ lookups are not resolved)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from click.testing import CliRunner

from bridgemgr.cli import main
from bridgemgr.jmsbridge.config import load_bridge
from bridgemgr.props import load_properties

pytestmark = pytest.mark.timeout(30)
REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
PROPERTIES = sorted(EXAMPLES.glob("*/broker.properties"))


def test_the_examples_are_there():
    assert {p.parent.name for p in PROPERTIES} >= {"embedded", "activemq", "stomp"}
    readme = (EXAMPLES / "README.md").read_text()
    for path in PROPERTIES:
        assert f"## {path.parent.name}/" in readme


@pytest.mark.parametrize("path", PROPERTIES, ids=lambda p: p.parent.name)
def test_every_example_loads_without_warnings(path):
    props = load_properties([path], environ={})
    assert props.warnings == ()
    assert props.enabled and props.bridge_names
    for name in props.bridge_names:
        if props.bridge_type(name) == "jms":
            config = load_bridge(props, name)
            assert config.name == name and config.warnings == ()
            assert config.links


@pytest.mark.parametrize("path", PROPERTIES, ids=lambda p: p.parent.name)
def test_check_passes_on_every_example(path, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # relative xmlurls start at the properties file
    result = CliRunner().invoke(main, ["check", "-props", str(path)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("bridge ")


def test_embedded_example_has_a_transformer_and_a_second_dmq():
    props = load_properties([EXAMPLES / "embedded" / "broker.properties"], environ={})
    config = load_bridge(props, "orders")
    assert [d.name for d in config.dmqs] == ["built-in-dmq", "audit-dmq"]
    classes = {link.target.message_transformer_class for link in config.links} - {None}
    assert classes == {"bridgemgr.transformers.uppercase.UppercaseTransformer"}
    assert all(cf.lookup_name is None for cf in config.connection_factories)  # host broker
    assert props.autocreate.max_total_msg_bytes == 64 * 1024 * 1024


def test_the_named_transformer_exists():
    source = (REPO / "bridgemgr" / "transformers" / "uppercase.py").read_text()
    tree = ast.parse(source)
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    transformer = classes["UppercaseTransformer"]
    assert [b.id for b in transformer.bases if isinstance(b, ast.Name)] == ["MessageTransformer"]
    assert "transform" in {n.name for n in transformer.body if isinstance(n, ast.FunctionDef)}


def test_activemq_example_uses_jndi_lookups():
    props = load_properties([EXAMPLES / "activemq" / "broker.properties"], environ={})
    config = load_bridge(props, "amq")
    lookups = {cf.ref_name: (cf.lookup_name, cf.environment) for cf in config.connection_factories if cf.lookup_name}
    env = {
        "java.naming.factory.initial": "org.apache.activemq.jndi.ActiveMQInitialContextFactory",
        "java.naming.provider.url": "tcp://127.0.0.1:61616",
    }
    assert lookups == {"activemq-xa": ("XAConnectionFactory", env), "activemq": ("ConnectionFactory", env)}
    transacted = [link for link in config.links if link.transacted]
    assert [link.target.connection_factory_ref for link in transacted] == ["activemq-xa"]


def test_stomp_example():
    props = load_properties([EXAMPLES / "stomp" / "broker.properties"], environ={})
    assert props.bridge_names == ("stomp",)
    assert (props.stomp.tcp_enabled, props.stomp.tcp_port, props.stomp.tls_enabled) == (True, 7672, False)
