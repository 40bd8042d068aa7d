"""`imqbridgemgr check`: offline validation of broker properties and bridge XML."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import pytest
from click.testing import CliRunner

from bridgemgr.cli import main
from bridgemgr.jms import naming
from bridgemgr.jms.spi import ConnectionFactory
from bridgemgr.jmsbridge.check import run_check
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
        "imq.bridge.stomp.tcp.port=17672\n")
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
    (conf / "xml" / "b1.xml").write_text(GOOD_XML.replace('destination-ref="in"',
                                                          'destination-ref="inn"'))
    result = run("check", "-props", str(conf / "broker.properties"),
                 "-Dimq.bridge.stomp.tls.port=x")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "command line: imq.bridge.stomp.tls.port is 'x'; write a whole number from 0 to 65535",
        f"{conf / 'xml' / 'b1.xml'}:5: the source of link 'out' destination-ref 'inn' matches "
        "no <destination ref-name=...> (did you mean in?); add it or fix the name",
    ]


def test_overrides_apply_and_warnings_do_not_fail(conf):
    result = run("check", "-props", str(conf / "broker.properties"),
                 "-Dimq.bridge.b1.autostart=false", "-D", "imq.bridge.b1.xmlurll=x")
    assert result.exit_code == 0
    assert "bridge b1 (jms, active, no autostart)" in result.stdout
    assert result.stderr == ("command line: warning: unknown property imq.bridge.b1.xmlurll; "
                             "did you mean imq.bridge.b1.xmlurl?\n")


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
    assert "the jmsbridge name is 'other' but this file is the configuration of bridge 'b1'" \
        in result.stderr


def test_json_report(conf):
    (conf / "xml" / "b1.xml").write_text(GOOD_XML.replace('enabled="false"', 'enabled="no"'))
    result = run("check", "--json", "-props", str(conf / "broker.properties"))
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False
    assert report["problems"] == [{
        "source": str(conf / "xml" / "b1.xml"), "line": 9, "severity": "error",
        "message": "<link> attribute enabled is 'no'; write true or false"}]


def test_secrets_never_appear_in_any_output(conf):
    (conf / "broker.properties").write_text(
        (conf / "broker.properties").read_text()
        + f"imq.bridge.admin.passwrd={PASSWORD}\n")  # a misspelt key: still a secret
    for args in (["check", "-props", str(conf / "broker.properties")],
                 ["check", "--json", "-props", str(conf / "broker.properties")],
                 ["check", "-Dimq.bridge.admin.password=" + PASSWORD,
                  str(conf / "xml" / "b1.xml")]):
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
    assert f"{xml}:3: link 'l' is transacted but its source connection factory 'ext' (line 5)" \
        in result.stderr
    report = run_check(xml_files=[str(xml)], resolve=True)
    assert not report.ok and len(report.problems) == 2 and report.summary
