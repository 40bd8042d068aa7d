"""Checking broker properties and bridge XML offline, before a restart or in CI.

run_check() is `imqbridgemgr check` without the command line. It parses the
broker properties (every problem kept, nothing raised), loads the XML of every JMS bridge
they define (relative xmlurls start at the properties file's folder), then any XML files
named on the command line that no bridge already covered, finds every message transformer
they name exactly as a bridge's start does (jmsbridge/plugins.py: the transformer folders, the
Python path, Java classes from imq.bridge.java.classpath and <instance>/lib/ext) and
checks the class from its module's source without importing it where it can (a warning
says so where it had to import it: the plugin's import-time code ran),
optionally resolves the connection factories of transacted links (JNDI lookups, so it
is opt-in), and returns a CheckReport: every problem with file and line, and one summary
line per bridge and link; an HA instance is compared with its cluster's live members.
Nothing is started, and no secret is ever part of the report.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from .jmsbridge.checkxml import CheckReport, XMLChecker
from .jmsbridge.config import load_bridge, load_bridge_config
from .jmsbridge.fetch import DEFAULT_TIMEOUT
from .jmsbridge.resolve import HostFactory
from .props import STOMP, BrokerProperties, Problem, bridge_configuration, parse_properties


def _state(props: BrokerProperties, name: str, btype: str) -> str:
    bridge = props.bridge(name)
    state = [btype, "active" if bridge.active else "not in imq.bridge.activelist"]
    if bridge.active:
        state.append("autostart" if bridge.autostart else "no autostart")
    return ", ".join(state)


def _stomp_summary(props: BrokerProperties) -> str:
    stomp = props.stomp
    tcp = f"tcp port {stomp.tcp_port}" if stomp.tcp_enabled else "tcp off"
    tls = f"tls port {stomp.tls_port}" if stomp.tls_enabled else "tls off"
    extra = f", transformer {stomp.message_transformer}" if stomp.message_transformer else ""
    return f"bridge {STOMP} ({_state(props, STOMP, STOMP)}): {tcp}, {tls}{extra}"


def _same_file(a: str, b: str) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except (OSError, ValueError):
        return a == b


def _cluster_check(props: BrokerProperties) -> list[Problem]:
    """An HA instance against its cluster's live members (the shared store): the same
    bridge configuration, a broker id of its own. A store out of reach is a warning."""
    from .jms.errors import StoreError
    from .providers.embedded.cluster import cluster_problems

    origin = props.origin("imq.cluster.ha")
    source, line = (origin.source, origin.line) if origin else ("command line", None)
    try:
        return [Problem(source, line, text) for text in cluster_problems(props, bridge_configuration(props))]
    except StoreError as exc:
        return [
            Problem(
                source,
                line,
                f"the HA store cannot be reached to compare this broker with the cluster's live members: {exc}",
                "warning",
            )
        ]


def run_check(
    props_files: Sequence[str | os.PathLike[str]] = (),
    overrides: Iterable[str] = (),
    xml_files: Sequence[str] = (),
    *,
    resolve: bool = False,
    host_factory: HostFactory | None = None,
    environ: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> CheckReport:
    """Check everything given; ``resolve`` also looks up the factories of transacted links."""
    # The Java provider registers the loader of Java transformers (as serve imports it).
    from .providers.java import configure_from_properties

    overrides = list(overrides)
    checker = XMLChecker(resolve=resolve, host_factory=host_factory, timeout=timeout)
    problems, summary = checker.problems, checker.summary

    if props_files or overrides:
        props, found = parse_properties(props_files, overrides, environ)
        checker.props = props
        problems += found
        if props.get("imq.cluster.ha") and not any(p.severity == "error" for p in found):
            problems += _cluster_check(props)
        configure_from_properties(props)  # Java transformers: the classpath `serve` gives
        for name in props.bridge_names:
            btype = props.bridge_type(name)
            if btype == STOMP:
                summary.append(_stomp_summary(props))
            elif btype == "jms" and props.bridge(name).xmlurl:
                checker.xml(_state(props, name, btype), load_bridge, props, name)
    for xml in xml_files:
        if not any(_same_file(xml, source) for source in checker.checked):
            checker.xml("jms, XML file", load_bridge_config, xml)
    return checker.report()
