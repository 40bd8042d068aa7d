"""Resolving connection factories after parsing: JNDI lookups through the public naming
API, the host broker's factory, and the rule that transacted links need XA factories."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import pytest

from bridgemgr.jms import naming
from bridgemgr.jms.errors import NamingException
from bridgemgr.jms.spi import ConnectionFactory, XAConnectionFactory
from bridgemgr.jmsbridge.config import DOCTYPE, parse_bridge_config
from bridgemgr.jmsbridge.resolve import check_xa, resolve_connection_factories

pytestmark = pytest.mark.timeout(30)
CONTEXT = "tests.config.plain-and-xa"


class PlainFactory(ConnectionFactory):
    def create_connection(self, username=None, password=None):  # type: ignore[no-untyped-def]
        raise NotImplementedError("never connects in these tests")


class XAFactory(XAConnectionFactory):
    def create_connection(self, username=None, password=None):  # type: ignore[no-untyped-def]
        raise NotImplementedError("never connects in these tests")

    def create_xa_connection(self, username=None, password=None):  # type: ignore[no-untyped-def]
        raise NotImplementedError("never connects in these tests")


LOOKUPS: list[tuple[str, dict[str, str]]] = []


class Context(naming.Context):
    BOUND: ClassVar[dict[str, object]] = {"PlainCF": PlainFactory(), "XACF": XAFactory(), "jms/Queue": object()}

    def __init__(self, environment: Mapping[str, str]) -> None:
        self.environment = dict(environment)

    def lookup(self, name: str) -> Any:
        LOOKUPS.append((name, self.environment))
        try:
            return self.BOUND[name]
        except KeyError:
            raise NamingException(f"{name!r} is not bound") from None


class ContextFactory(naming.InitialContextFactory):
    def get_initial_context(self, environment: Mapping[str, str]) -> naming.Context:
        return Context(environment)


@pytest.fixture(autouse=True)
def registered():
    naming.register_context_factory(CONTEXT, ContextFactory)
    LOOKUPS.clear()


def cf(ref: str, lookup: str | None) -> str:
    if lookup is None:
        return (
            f'<connection-factory ref-name="{ref}"><property name="imqConfiguredClientID" '
            f'value="c1"/></connection-factory>'
        )
    return (
        f'<connection-factory ref-name="{ref}" lookup-name="{lookup}">'
        f'<property name="java.naming.factory.initial" value="{CONTEXT}"/>'
        f'<property name="java.naming.provider.url" value="test://{ref}"/>'
        f"</connection-factory>"
    )


def bridge_with(links: str) -> bytes:
    return (
        f'{DOCTYPE}\n<jmsbridge name="b">\n{links}\n'
        f"{cf('plain', 'PlainCF')}\n{cf('xa', 'XACF')}\n{cf('host', None)}\n"
        f"{cf('missing', 'NoSuchCF')}\n{cf('notcf', 'jms/Queue')}\n"
        '<destination ref-name="q" name="Q"/>\n</jmsbridge>\n'
    ).encode()


def link(name: str, src: str, tgt: str, attrs: str = "") -> str:
    return (
        f'<link name="{name}"{attrs}><source connection-factory-ref="{src}" '
        f'destination-ref="q"/><target connection-factory-ref="{tgt}" '
        'destination-ref="q"/></link>'
    )


def test_every_non_xa_factory_of_a_transacted_link_is_reported_with_file_and_line():
    config = parse_bridge_config(
        bridge_with(
            "\n".join(
                [
                    link("ok", "xa", "xa"),
                    link("both-plain", "plain", "plain"),
                    link("plain-target", "xa", "plain"),
                    link("not-transacted", "plain", "plain", ' transacted="false"'),
                    link("disabled", "plain", "plain", ' enabled="false"'),
                ]
            )
        ),
        "b.xml",
    )
    problems = check_xa(config)
    assert [str(p) for p in problems] == [
        "b.xml:4: link 'both-plain' is transacted but its source connection factory 'plain' "
        "(line 8) is a PlainFactory, which cannot do XA; use an XA connection factory or set "
        'transacted="false"',
        "b.xml:4: link 'both-plain' is transacted but its target connection factory 'plain' "
        "(line 8) is a PlainFactory, which cannot do XA; use an XA connection factory or set "
        'transacted="false"',
        "b.xml:5: link 'plain-target' is transacted but its target connection factory 'plain' "
        "(line 8) is a PlainFactory, which cannot do XA; use an XA connection factory or set "
        'transacted="false"',
    ]
    # The lookups went through the public naming API with the <property> environment.
    assert ("XACF", {"java.naming.factory.initial": CONTEXT, "java.naming.provider.url": "test://xa"}) in LOOKUPS


def test_host_factories_come_from_the_caller():
    config = parse_bridge_config(bridge_with(link("l", "host", "xa")))
    assert check_xa(config) == []  # no host factory given: the host is not checked
    seen: list[dict[str, str]] = []

    def host(environment: Mapping[str, str]) -> ConnectionFactory:
        seen.append(dict(environment))
        return PlainFactory()

    (problem,) = check_xa(config, host_factory=host)
    assert "source connection factory 'host'" in problem.message
    assert seen == [{"imqConfiguredClientID": "c1"}]
    assert check_xa(config, host_factory=lambda env: XAFactory()) == []


def test_failed_lookups_are_problems_and_the_rest_still_resolve():
    config = parse_bridge_config(bridge_with(link("l1", "missing", "notcf")), "b.xml")
    factories, problems = resolve_connection_factories(config)
    assert set(factories) == {"plain", "xa"}  # host skipped without a host factory
    text = "\n".join(str(p) for p in problems)
    assert (
        "b.xml:7: lookup-name 'NoSuchCF' of connection-factory 'missing' cannot be found "
        "(NamingException: 'NoSuchCF' is not bound); check lookup-name" in text
    )
    assert (
        "b.xml:8: lookup-name 'jms/Queue' of connection-factory 'notcf' is not a "
        "connection factory (it is a builtins.object); check lookup-name" in text
    )
    assert len(check_xa(config)) == 2  # only the factories the transacted link uses


def test_a_crashing_host_factory_is_reported_not_raised():
    config = parse_bridge_config(bridge_with(link("l", "host", "host")))

    def broken(environment: Mapping[str, str]) -> ConnectionFactory:
        raise RuntimeError("host broker is not running")

    (problem,) = check_xa(config, host_factory=broken)
    assert (
        "the host broker's factory for connection-factory 'host' cannot be found "
        "(RuntimeError: host broker is not running)" in problem.message
    )


def test_resolution_is_a_separate_step_parsing_looks_nothing_up():
    parse_bridge_config(bridge_with(link("l", "plain", "plain")))
    assert LOOKUPS == []
