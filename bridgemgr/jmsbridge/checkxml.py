"""One bridge XML checked as `imqbridgemgr check` checks it, and the check's report.

XMLChecker loads each XML (a file, a URL, or bytes: the management API's POST /check),
keeps every problem with file and line (the DTD's and the rules', each transformer found
as a start finds it, optionally the XA capability of transacted links' factories) and a
summary line per bridge and link. check.py adds the broker properties and the cluster.
Nothing is started, and no secret is ever part of the report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..jms.errors import JMSException
from ..props import BrokerProperties, ConfigError, Problem
from .config import AS_SOURCE, BridgeConfig, parse_bridge_config
from .fetch import DEFAULT_TIMEOUT
from .plugins import inspect_configured_transformer, plugin_folders, transformer_uses
from .resolve import HostFactory, check_xa


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

    def error_message(self) -> str:
        """What a failed check says in its JSON error object (the CLI's and the API's)."""
        errors = [p for p in self.problems if p.severity == "error"] or list(self.problems)
        return str(errors[0]) if len(errors) == 1 else f"{len(errors)} problems, the first: {errors[0]}"


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


def check_bridge_xml(data: bytes, source: str, props: BrokerProperties | None = None) -> CheckReport:
    """One bridge XML given as bytes (the management API's POST /check), checked as
    ``check FILE`` checks a file, with ``props``' transformer folders; nothing is started
    and no lookup is made."""
    checker = XMLChecker(props=props)
    checker.xml("jms, XML file", lambda *, timeout: parse_bridge_config(data, source))
    return checker.report()


@dataclass
class XMLChecker:
    """The problems and summary lines of the bridge XML checked so far."""

    props: BrokerProperties | None = None  # their plugin folders are the transformers'
    resolve: bool = False
    host_factory: HostFactory | None = None
    timeout: float = DEFAULT_TIMEOUT
    problems: list[Problem] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)
    configs: list[BridgeConfig] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)  # the XML files and URLs read so far

    def xml(self, state: str, load: Callable[..., BridgeConfig], *args: Any) -> None:
        try:
            config = load(*args, timeout=self.timeout)
        except ConfigError as exc:
            self.problems.extend(exc.problems)
            return
        self.problems.extend(config.warnings)
        self.problems.extend(check_transformers(config, self.props))
        if self.resolve:
            self.problems.extend(check_xa(config, self.host_factory))
        self.configs.append(config)
        self.summary.extend(summarize(config, state))
        self.checked.append(config.source)

    def report(self) -> CheckReport:
        return CheckReport(tuple(self.problems), tuple(self.summary), tuple(self.configs))
