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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .jms.errors import JMSException
from .jmsbridge.config import AS_SOURCE, BridgeConfig, load_bridge, load_bridge_config
from .jmsbridge.fetch import DEFAULT_TIMEOUT
from .jmsbridge.plugins import inspect_configured_transformer, plugin_folders, transformer_uses
from .jmsbridge.resolve import HostFactory, check_xa
from .props import STOMP, BrokerProperties, ConfigError, Problem, bridge_configuration, parse_properties


@dataclass(frozen=True)
class CheckReport:
    """What a check found: problems (errors and warnings) and a summary of what is fine."""

    problems: tuple[Problem, ...] = ()
    summary: tuple[str, ...] = ()
    bridges: tuple[BridgeConfig, ...] = field(default=(), repr=False)

    @property
    def ok(self) -> bool:
        return not any(p.severity == "error" for p in self.problems)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "problems": [
                {"source": p.source, "line": p.line, "severity": p.severity, "message": p.message}
                for p in self.problems
            ],
            "summary": list(self.summary),
        }


def _count(count: int, singular: str, plural: str) -> str:
    return f"{count} {singular if count == 1 else plural}"


def _destination(config: BridgeConfig, ref: str) -> str:
    if ref == AS_SOURCE:
        return AS_SOURCE
    dest = config.destination(ref)
    if dest.lookup_name is not None:
        return f"lookup:{dest.lookup_name}"
    return f"{dest.type.value}:{dest.name}"


def summarize(config: BridgeConfig, state: str) -> list[str]:
    """One line for the bridge, one per link: what an operator checks before a restart."""
    counts = ", ".join(
        [
            _count(len(config.links), "link", "links"),
            _count(len(config.dmqs), "DMQ", "DMQs"),
            _count(len(config.connection_factories), "connection factory", "connection factories"),
            _count(len(config.destinations), "destination", "destinations"),
        ]
    )
    lines = [f"bridge {config.name} ({state}): {config.source}: {counts}"]
    for link in config.links:
        flags = ", ".join(
            ["enabled" if link.enabled else "disabled", "transacted" if link.transacted else "not transacted"]
        )
        src, tgt = link.source, link.target
        line = (
            f"  link {link.name} ({flags}): {src.connection_factory_ref} "
            f"{_destination(config, src.destination_ref)} -> "
            f"{tgt.connection_factory_ref} {_destination(config, tgt.destination_ref)}"
        )
        if src.selector:
            line += f", selector {src.selector!r}"
        if tgt.message_transformer_class:
            line += f", transformer {tgt.message_transformer_class}"
        lines.append(line)
    return lines


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


def check_transformers(config: BridgeConfig, props: BrokerProperties | None = None) -> list[Problem]:
    """A problem for every transformer that does not load as a start would load it (a
    warning for a disabled link or DMQ, which a start does not load), and a warning for
    each one whose module had to be imported to tell; ``props`` give the plugin folders
    (lib/ext ...)."""
    problems = []
    folders = plugin_folders(props) if props is not None else None
    for use in transformer_uses(config):
        try:
            inspected = inspect_configured_transformer(use.class_path, use.owner, folders)
            if inspected.imported:
                problems.append(
                    Problem(
                        config.source,
                        use.line,
                        (
                            f"{use.owner}: transformer {use.class_path} was imported to check it, so its "
                            f"module's import-time code ran here: {inspected.imported}"
                        ),
                        "warning",
                    )
                )
        except JMSException as exc:
            if use.enabled:
                problems.append(Problem(config.source, use.line, str(exc)))
            else:
                problems.append(
                    Problem(
                        config.source,
                        use.line,
                        f"{exc} (a start does not load it while {use.owner} is disabled)",
                        "warning",
                    )
                )
    return problems


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
    problems: list[Problem] = []
    summary: list[str] = []
    configs: list[BridgeConfig] = []
    checked: list[str] = []  # the XML files and URLs read so far
    props: BrokerProperties | None = None  # their plugin folders are the transformers'

    def check_xml(state: str, load: Callable[..., BridgeConfig], *args: Any) -> None:
        try:
            config = load(*args, timeout=timeout)
        except ConfigError as exc:
            problems.extend(exc.problems)
            return
        problems.extend(config.warnings)
        problems.extend(check_transformers(config, props))
        if resolve:
            problems.extend(check_xa(config, host_factory))
        configs.append(config)
        summary.extend(summarize(config, state))
        checked.append(config.source)

    if props_files or overrides:
        props, found = parse_properties(props_files, overrides, environ)
        problems += found
        if props.get("imq.cluster.ha") and not any(p.severity == "error" for p in found):
            problems += _cluster_check(props)
        configure_from_properties(props)  # Java transformers: the classpath `serve` gives
        for name in props.bridge_names:
            btype = props.bridge_type(name)
            if btype == STOMP:
                summary.append(_stomp_summary(props))
            elif btype == "jms" and props.bridge(name).xmlurl:
                check_xml(_state(props, name, btype), load_bridge, props, name)
    for xml in xml_files:
        if not any(_same_file(xml, source) for source in checked):
            check_xml("jms, XML file", load_bridge_config, xml)
    return CheckReport(tuple(problems), tuple(summary), tuple(configs))
