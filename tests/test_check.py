"""`imqbridgemgr check`: offline validation of broker properties and bridge XML."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from bridgemgr.check import run_check
from bridgemgr.cli import main
from bridgemgr.jms import naming
from bridgemgr.jms.spi import ConnectionFactory
from bridgemgr.jmsbridge.config import DOCTYPE

pytestmark = pytest.mark.timeout(30)
PASSWORD = "admin-pw-9c1e-not-for-eyes"
CF_PASSWORD = "cf-pw-77aa-not-for-eyes"

GOOD_XML = f"""<?xml version="1.0"?>
{DOCTYPE}
<jmsbridge name="b1">
  <link name="out" transacted="false">
    <source connection-factory-ref="host" destination-ref="in" selector="x = 1"/>
    <target connection-factory-ref="host" destination-ref="out"
            message-transformer-class="transformers.uppercase.UppercaseTransformer"/>
  </link>
  <link name="back" enabled="false">
    <source connection-factory-ref="host" destination-ref="out"/>
    <target connection-factory-ref="host" destination-ref="AS_SOURCE"/>
  </link>
  <connection-factory ref-name="host" username="u" password="{CF_PASSWORD}"/>
  <destination ref-name="in" name="orders.in"/>
  <destination ref-name="out" lookup-name="jms/Out">
    <property name="java.naming.factory.initial" value="imq.embedded"/>
  </destination>
</jmsbridge>
"""


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    (tmp_path / "xml").mkdir()
    (tmp_path / "xml" / "b1.xml").write_text(GOOD_XML)
    (tmp_path / "broker.properties").write_text(
        "imq.bridge.enabled=true\n"
        "imq.bridge.admin.user=admin\n"
        f"imq.bridge.admin.password={PASSWORD}\n"
        "imq.bridge.activelist=b1,stomp\n"
        "imq.bridge.b1.type=jms\n"
        "imq.bridge.b1.xmlurl=xml/b1.xml\n"
        "imq.bridge.stomp.tcp.port=17672\n"
    )
    return tmp_path


def run(*args: str) -> Any:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_a_good_configuration_prints_one_line_per_bridge_and_link(conf):
    result = run("check", "-props", str(conf / "broker.properties"))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"bridge b1 (jms, active, autostart): {conf / 'xml' / 'b1.xml'}: 2 links, 1 DMQ, "
        "1 connection factory, 2 destinations",
        "  link out (enabled, not transacted): host queue:orders.in -> host lookup:jms/Out, "
        "selector 'x = 1', transformer transformers.uppercase.UppercaseTransformer",
        "  link back (disabled, transacted): host lookup:jms/Out -> host AS_SOURCE",
        "bridge stomp (stomp, active, autostart): tcp port 17672, tls off",
    ]
    assert result.stderr == ""


def test_errors_with_file_and_line_exit_1(conf):
    (conf / "xml" / "b1.xml").write_text(GOOD_XML.replace('destination-ref="in"', 'destination-ref="inn"'))
    result = run("check", "-props", str(conf / "broker.properties"), "-Dimq.bridge.stomp.tls.port=x")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "command line: imq.bridge.stomp.tls.port is 'x'; write a whole number from 0 to 65535",
        f"{conf / 'xml' / 'b1.xml'}:5: the source of link 'out' destination-ref 'inn' matches "
        "no <destination ref-name=...> (did you mean in?); add it or fix the name",
    ]


def test_overrides_apply_and_warnings_do_not_fail(conf):
    result = run(
        "check",
        "-props",
        str(conf / "broker.properties"),
        "-Dimq.bridge.b1.autostart=false",
        "-D",
        "imq.bridge.b1.xmlurll=x",
    )
    assert result.exit_code == 0
    assert "bridge b1 (jms, active, no autostart)" in result.stdout
    assert result.stderr == (
        "command line: warning: unknown property imq.bridge.b1.xmlurll; did you mean imq.bridge.b1.xmlurl?\n"
    )


def test_xml_files_alone_and_not_twice(conf):
    xml = str(conf / "xml" / "b1.xml")
    result = run("check", xml)
    assert result.exit_code == 0
    assert result.stdout.startswith(f"bridge b1 (jms, XML file): {xml}: 2 links")
    both = run("check", "-props", str(conf / "broker.properties"), xml)
    assert both.stdout.count(": 2 links") == 1


def test_an_xml_file_of_another_bridge_name_is_fine_alone_but_not_as_b1(conf):
    (conf / "xml" / "b1.xml").write_text(GOOD_XML.replace('name="b1"', 'name="other"'))
    assert run("check", str(conf / "xml" / "b1.xml")).exit_code == 0
    result = run("check", "-props", str(conf / "broker.properties"))
    assert result.exit_code == 1
    assert "the jmsbridge name is 'other' but this file is the configuration of bridge 'b1'" in result.stderr


def test_json_report(conf):
    (conf / "xml" / "b1.xml").write_text(GOOD_XML.replace('enabled="false"', 'enabled="no"'))
    result = run("check", "--json", "-props", str(conf / "broker.properties"))
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False
    assert report["problems"] == [
        {
            "source": str(conf / "xml" / "b1.xml"),
            "line": 9,
            "severity": "error",
            "message": "<link> attribute enabled is 'no'; write true or false",
        }
    ]


def test_secrets_never_appear_in_any_output(conf):
    (conf / "broker.properties").write_text(
        (conf / "broker.properties").read_text() + f"imq.bridge.admin.passwrd={PASSWORD}\n"
    )  # a misspelt key: still a secret
    for args in (
        ["check", "-props", str(conf / "broker.properties")],
        ["check", "--json", "-props", str(conf / "broker.properties")],
        ["check", "-Dimq.bridge.admin.password=" + PASSWORD, str(conf / "xml" / "b1.xml")],
    ):
        result = run(*args)
        assert PASSWORD not in result.output and CF_PASSWORD not in result.output


def test_nothing_to_check_is_a_usage_error():
    result = run("check")
    assert result.exit_code == 2 and "nothing to check" in result.output


def test_help_names_the_options():
    result = run("check", "-h")
    assert result.exit_code == 0
    for option in ("-props", "-D", "-resolve", "--json", "XMLFILE"):
        assert option in result.output


def test_missing_files_are_reported_not_raised(tmp_path):
    result = run("check", "-props", str(tmp_path / "none.properties"), str(tmp_path / "n.xml"))
    assert result.exit_code == 1
    assert "cannot read the properties file" in result.stderr
    assert "cannot read the bridge XML file" in result.stderr


class _Plain(ConnectionFactory):
    def create_connection(self, username=None, password=None):  # type: ignore[no-untyped-def]
        raise NotImplementedError


class _Context(naming.Context):
    def lookup(self, name: str) -> Any:
        return _Plain()


class _Factory(naming.InitialContextFactory):
    def get_initial_context(self, environment: Mapping[str, str]) -> naming.Context:
        return _Context()


def test_resolve_reports_non_xa_factories_of_transacted_links(tmp_path):
    naming.register_context_factory("tests.check.plain", _Factory)
    xml = tmp_path / "b.xml"
    xml.write_text(f"""{DOCTYPE}
<jmsbridge name="b">
  <link name="l"><source connection-factory-ref="ext" destination-ref="q"/>
    <target connection-factory-ref="ext" destination-ref="q"/></link>
  <connection-factory ref-name="ext" lookup-name="CF">
    <property name="java.naming.factory.initial" value="tests.check.plain"/>
  </connection-factory>
  <destination ref-name="q" name="Q"/>
</jmsbridge>
""")
    assert run("check", str(xml)).exit_code == 0  # no lookups without -resolve
    result = run("check", "-resolve", str(xml))
    assert result.exit_code == 1
    assert f"{xml}:3: link 'l' is transacted but its source connection factory 'ext' (line 5)" in result.stderr
    report = run_check(xml_files=[str(xml)], resolve=True)
    assert not report.ok and len(report.problems) == 2 and report.summary


# --- connection factory properties and transformers: loaded as a start loads them -------------


def xml_with(tmp_path: Path, target: str = "", cf: str = "", dmq: str = "", link_attrs: str = "") -> Path:
    """A bridge XML: link l (line 3, its target on line 5), DMQ d (line 7), cf host (line 8,
    its properties from line 9)."""
    xml = tmp_path / "t.xml"
    xml.write_text(f"""{DOCTYPE}
<jmsbridge name="t">
  <link name="l" transacted="false"{link_attrs}>
    <source connection-factory-ref="host" destination-ref="q"/>
    <target connection-factory-ref="host" destination-ref="q" {target}/>
  </link>
  <dmq name="d" connection-factory-ref="host" destination-ref="q" {dmq}/>
  <connection-factory ref-name="host">
    {cf}
  </connection-factory>
  <destination ref-name="q" name="Q"/>
</jmsbridge>
""")
    return xml


def test_a_property_a_factory_without_lookup_name_does_not_take_is_reported(tmp_path):
    xml = xml_with(
        tmp_path,
        cf='<property name="imqAddressList" value="mq://b:7676"/>\n'
        f'<property name="imqSSLIsHostTrusted" value="{CF_PASSWORD}"/>',
    )
    result = run("check", str(xml))
    assert result.exit_code == 1 and CF_PASSWORD not in result.output
    assert result.stderr.splitlines() == [
        f"{xml}:10: connection-factory 'host': property 'imqSSLIsHostTrusted' is not supported "
        "for a connection factory without lookup-name (the broker's certificate is always "
        "verified; give its CA with the SSL_CERT_FILE environment variable); remove it"
    ]


@pytest.mark.parametrize(
    "class_path, cause",
    [
        ("nosuchmodule_4d1f.Upper", "No module named 'nosuchmodule_4d1f'"),
        (
            "transformers.uppercase.NoSuchClass",
            "module 'bridgemgr.transformers.uppercase' has no attribute 'NoSuchClass'",
        ),
        ("transformers.uppercase", "is not a subclass of bridgemgr.transform.MessageTransformer"),
    ],
)
def test_a_transformer_that_does_not_load_is_reported_with_file_and_line(tmp_path, class_path, cause):
    xml = xml_with(
        tmp_path, target=f'message-transformer-class="{class_path}"', dmq=f'message-transformer-class="{class_path}"'
    )
    result = run("check", str(xml))
    assert result.exit_code == 1 and result.stdout == ""
    link, dmq = result.stderr.splitlines()
    assert link.startswith(f"{xml}:5: link l: ") and cause in link
    assert "put the module in <instance>/lib/ext" in link
    assert dmq.startswith(f"{xml}:7: dmq d: ") and cause in dmq


def test_a_valid_transformer_passes_from_where_serve_finds_it(tmp_path, monkeypatch):
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "stamp_9b2e.py").write_text(
        "from bridgemgr.transform import MessageTransformer\n"
        "class Stamp(MessageTransformer):\n"
        "    def transform(self, message, read_only, charset_name, source, target, props):\n"
        "        return message\n"
    )
    xml = xml_with(
        tmp_path,
        target='message-transformer-class="stamp_9b2e.Stamp"',
        dmq='message-transformer-class="transformers.uppercase.UppercaseTransformer"',
    )
    assert run("check", str(xml)).exit_code == 1  # not in a transformer folder
    monkeypatch.setenv("IMQ_BRIDGE_TRANSFORMER_PATH", str(folder))
    result = run("check", str(xml))
    assert result.exit_code == 0, result.output
    assert result.stderr == "" and ", transformer stamp_9b2e.Stamp" in result.stdout


@pytest.mark.parametrize("where", ["imq.bridge.transformer.path", "<instance>/lib/ext", "$IMQ_HOME/lib/ext"])
def test_check_finds_a_transformer_in_each_plugin_folder_of_the_properties(tmp_path, monkeypatch, where):
    """The chapter's lib/ext (of the instance and of IMQ_HOME) and imq.bridge.transformer.path,
    as serve looks there: a module in none of them fails the check, in any one it passes."""
    module = "plugin_" + re.sub(r"\W", "", where).lower()
    folder = {
        "imq.bridge.transformer.path": tmp_path / "plugins",
        "<instance>/lib/ext": tmp_path / "var" / "instances" / "imqbroker" / "lib" / "ext",
        "$IMQ_HOME/lib/ext": tmp_path / "home" / "lib" / "ext",
    }[where]
    folder.mkdir(parents=True)
    monkeypatch.delenv("IMQ_BRIDGE_TRANSFORMER_PATH", raising=False)
    monkeypatch.setenv("IMQ_HOME", str(tmp_path / "home"))
    xml = xml_with(tmp_path, target=f'message-transformer-class="{module}.Stamp"')
    props = tmp_path / "broker.properties"
    props.write_text(
        f"imq.varhome={tmp_path / 'var'}\nimq.bridge.transformer.path={tmp_path / 'plugins'}\n"
        f"imq.bridge.activelist=t\nimq.bridge.t.type=jms\nimq.bridge.t.xmlurl={xml}\n"
    )
    result = run("check", "-props", str(props))
    assert result.exit_code == 1 and str(folder) in result.stderr  # named where it looked
    (folder / f"{module}.py").write_text(
        "from bridgemgr.transform import MessageTransformer\n"
        "class Stamp(MessageTransformer):\n"
        "    def transform(self, message, read_only, charset_name, source, target, props):\n"
        "        return message\n"
    )
    try:
        result = run("check", "-props", str(props))
        assert result.exit_code == 0, result.output
    finally:
        sys.modules.pop(module, None)


def test_a_disabled_links_transformer_that_does_not_load_is_a_warning(tmp_path):
    xml = xml_with(
        tmp_path, target='message-transformer-class="nosuchmodule_4d1f.Upper"', link_attrs=' enabled="false"'
    )
    result = run("check", str(xml))
    assert result.exit_code == 0
    assert result.stderr.startswith(f"{xml}:5: warning: link l: cannot load message transformer")
    assert result.stderr.rstrip().endswith("(a start does not load it while link l is disabled)")


@pytest.mark.slow
def test_a_java_class_that_does_not_exist_is_reported_with_file_and_line(tmp_path):
    """As a process: the JVM and its classpath are the process's (imq.bridge.java.classpath
    and <instance>/lib/ext, as `serve` configures them)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("jpype")
    classes = tmp_path / "classes"
    classes.mkdir()
    xml = xml_with(tmp_path, target='message-transformer-class="com.example.NoSuchTransformer"')
    props = tmp_path / "broker.properties"
    props.write_text(
        f"imq.varhome={tmp_path / 'var'}\nimq.bridge.enabled=true\n"
        f"imq.bridge.activelist=t\nimq.bridge.t.type=jms\n"
        f"imq.bridge.t.xmlurl={xml}\nimq.bridge.java.classpath={classes}\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "bridgemgr.cli", "check", "-props", str(props)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])),
    )
    assert result.returncode == 1, result.stdout + result.stderr
    (line,) = [x for x in result.stderr.splitlines() if x.startswith(f"{xml}:")]
    assert line.startswith(f"{xml}:5: link l: cannot load message transformer com.example.NoSuchTransformer")
    assert (
        "nor is it a Java transformer: Java class com.example.NoSuchTransformer cannot be loaded" in line
        and str(classes) in line
    )
