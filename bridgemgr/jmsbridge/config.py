"""The JMS bridge XML configuration: DTD validation, defaults, and the rules beyond the DTD.

load_bridge_config() reads the bytes an xmlurl names (fetch.py) and parse_bridge_config()
turns them into frozen dataclasses: parse safely with lxml, validate against our DTD
(dtd/sun_jmsbridge_1_0.dtd) with libxml2's messages reworded (MESSAGE_RULES), build the
dataclasses with the DTD's defaults and ATTRIBUTE_KINDS, then run the rules a DTD cannot
express (CHECKS). Resolving connection factories is a separate step (resolve.py).

Rules: no file or URL but the one the config names is ever read (no network, no entities,
a DOCTYPE absent or exactly the original's); every problem carries file and line, and all
are raised together in one ConfigError; an imq* property a factory does not honour is an
error (imqcf.py), never silently ignored.

Design notes: docs/jms-bridges.md#internals-jmsbridgeconfigpy.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.resources
import io
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from lxml import etree

from ..jms.destination import NAME_RULE, name_problem
from ..jms.naming import INITIAL_CONTEXT_FACTORY
from ..props import (
    BYTE_BOUND,
    CLASS_NAME,
    INT32_MAX,
    INT64_MAX,
    TEXT,
    BrokerProperties,
    ConfigError,
    Kind,
    Problem,
    clip,
    integer,
    is_secret_name,
    raise_if_errors,
    shorten,
)
from .fetch import DEFAULT_TIMEOUT, MAX_CONFIG_BYTES, read_xmlurl
from .imqcf import IMQSettings, imq_settings

DTD_SYSTEM_ID = "sun_jmsbridge_1_0.dtd"
DOCTYPE = f'<!DOCTYPE jmsbridge SYSTEM "{DTD_SYSTEM_ID}">'
BUILTIN_DMQ = "built-in-dmq"
BUILTIN_DMQ_DESTINATION = "imq.bridge.jms.dmq"
AS_SOURCE = "AS_SOURCE"
# Reserved names (compared case-insensitively) and what each one means.
RESERVED_NAMES: Mapping[str, str] = {
    BUILTIN_DMQ: "the built-in DMQ",
    BUILTIN_DMQ_DESTINATION: "the built-in DMQ's destination",
    AS_SOURCE.lower(): "the source message's destination",
}
MAX_PROBLEMS = 100  # per file: a random file can have thousands


# --- the configuration ------------------------------------------------------------------


class DestinationType(str, Enum):
    QUEUE = "queue"
    TOPIC = "topic"


@dataclass(frozen=True)
class Property:
    """A <property name value/>: JNDI environment, host factory setting or transformer input."""

    name: str
    value: str
    line: int | None = field(default=None, compare=False)

    def __repr__(self) -> str:
        value = "********" if is_secret_name(self.name) else self.value
        return f"Property({self.name!r}, {value!r})"


def _environment(properties: tuple[Property, ...]) -> dict[str, str]:
    return {p.name: p.value for p in properties}


@dataclass(frozen=True)
class ConnectionFactoryConfig:
    """A <connection-factory>: a JNDI lookup, or (no lookup-name) the host broker's factory
    or the brokers of its imqAddressList, configured by imq* properties (imqcf.py)."""

    ref_name: str
    lookup_name: str | None = None
    multi_rm: bool = False
    connect_attempts: int = -1  # -1: forever
    connect_attempt_interval_in_seconds: int = 5
    idle_timeout_in_seconds: int = 1800  # 0: never
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    properties: tuple[Property, ...] = ()
    description: str | None = None
    line: int | None = field(default=None, compare=False)

    @property
    def environment(self) -> dict[str, str]:
        """The property elements as a JNDI environment (or host factory settings)."""
        return _environment(self.properties)

    @property
    def imq(self) -> IMQSettings:
        """The imq* settings of a factory without lookup-name (their problems are the
        configuration's: check_connection_factories)."""
        return imq_settings(self.properties)[0] if self.lookup_name is None else IMQSettings()

    @property
    def login(self) -> tuple[str | None, str | None]:
        """Who connections log in as: the username/password attributes (the original's
        createConnection(user, password)), else imqDefaultUsername/imqDefaultPassword."""
        imq = self.imq
        if self.username is None and imq.default_username is not None:
            return imq.default_username, imq.default_password
        return self.username, self.password


@dataclass(frozen=True)
class DestinationConfig:
    """A <destination>: by name and type, or by JNDI lookup-name (name and type then ignored)."""

    ref_name: str
    name: str | None = None
    lookup_name: str | None = None
    type: DestinationType = DestinationType.QUEUE
    properties: tuple[Property, ...] = ()
    description: str | None = None
    line: int | None = field(default=None, compare=False)

    @property
    def environment(self) -> dict[str, str]:
        return _environment(self.properties)


@dataclass(frozen=True)
class SourceConfig:
    connection_factory_ref: str
    destination_ref: str
    selector: str | None = None
    durable_sub: str | None = None
    clientid: str | None = None
    description: str | None = None
    line: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class TargetConfig:
    connection_factory_ref: str
    destination_ref: str  # a destination ref-name, or AS_SOURCE
    stay_connected: bool = True
    clientid: str | None = None
    retain_replyto: bool = False
    message_transformer_class: str | None = None
    consume_no_transfer_on_transform_error: bool = False
    properties: tuple[Property, ...] = ()  # passed to the transformer
    description: str | None = None
    line: int | None = field(default=None, compare=False)

    @property
    def as_source(self) -> bool:
        """The target destination is each source message's own destination."""
        return self.destination_ref == AS_SOURCE


@dataclass(frozen=True)
class LinkConfig:
    name: str
    source: SourceConfig
    target: TargetConfig
    enabled: bool = True
    transacted: bool = True
    window: int | None = None  # <property name="window">; None: the bridge's link.window
    window_bytes: int | None = None  # <property name="windowBytes">; None: link.windowBytes
    description: str | None = None
    line: int | None = field(default=None, compare=False)


# The settings a <link> takes as <property name=... value=.../> after its <target>.
LINK_PROPERTIES: Mapping[str, Kind[int]] = {"window": integer(1, INT32_MAX), "windowBytes": BYTE_BOUND}
# Their LinkConfig fields where the XML name is not one.
_LINK_FIELDS: Mapping[str, str] = {"windowBytes": "window_bytes"}


@dataclass(frozen=True)
class DMQConfig:
    """A <dmq>. For the built-in DMQ the refs are None and enabled/stay-connected are True:
    it is the host broker's queue imq.bridge.jms.dmq, whatever the file says."""

    name: str
    connection_factory_ref: str | None
    destination_ref: str | None
    enabled: bool = True
    stay_connected: bool = True
    time_to_live_in_millis: int = 0  # 0: forever
    clientid: str | None = None
    send_attempts: int = 3
    send_attempt_interval_in_seconds: int = 5
    message_transformer_class: str | None = None
    properties: tuple[Property, ...] = ()
    description: str | None = None
    line: int | None = field(default=None, compare=False)

    @property
    def is_builtin(self) -> bool:
        return self.name == BUILTIN_DMQ


@dataclass(frozen=True)
class BridgeConfig:
    """One JMS bridge's XML configuration, defaults applied and cross-references checked."""

    name: str
    links: tuple[LinkConfig, ...]
    dmqs: tuple[DMQConfig, ...]  # the built-in DMQ first, then the file's order
    connection_factories: tuple[ConnectionFactoryConfig, ...]
    destinations: tuple[DestinationConfig, ...]
    message_transfer_tag_bridge_name: bool = False
    log_message_transfer: bool = True
    source: str = field(default="", compare=False)  # the file or URL it was read from
    line: int | None = field(default=None, compare=False)
    warnings: tuple[Problem, ...] = field(default=(), compare=False)

    def connection_factory(self, ref_name: str) -> ConnectionFactoryConfig:
        return _find(self.connection_factories, "ref_name", ref_name)

    def destination(self, ref_name: str) -> DestinationConfig:
        return _find(self.destinations, "ref_name", ref_name)

    def link(self, name: str) -> LinkConfig:
        return _find(self.links, "name", name)

    def dmq(self, name: str) -> DMQConfig:
        return _find(self.dmqs, "name", name)

    @property
    def builtin_dmq(self) -> DMQConfig:
        return self.dmqs[0]


_Item = TypeVar("_Item")


def _find(items: tuple[_Item, ...], attr: str, value: str) -> _Item:
    for item in items:
        if getattr(item, attr) == value:
            return item
    raise KeyError(value)


# --- the DTD ------------------------------------------------------------------------------


def dtd_text() -> bytes:
    """Our DTD: from the installed package bridgemgr.dtd, else from <repo>/dtd/."""
    try:
        resource = importlib.resources.files("bridgemgr.dtd") / DTD_SYSTEM_ID
        if resource.is_file():
            return resource.read_bytes()
    except ModuleNotFoundError:
        pass
    return (Path(__file__).resolve().parents[2] / "dtd" / DTD_SYSTEM_ID).read_bytes()


@functools.cache
def _dtd() -> etree.DTD:
    return etree.DTD(io.BytesIO(dtd_text()))


_dtd_lock = threading.Lock()  # an lxml DTD keeps one error log: validate one file at a time


@functools.cache
def dtd_attributes() -> dict[str, dict[str, Any]]:
    """element -> attribute -> its DTD declaration (default_value, default, values())."""
    return {el.name: {a.name: a for a in el.iterattributes()} for el in _dtd().iterelements()}


def _default(element: str, attribute: str) -> str | None:
    value: str | None = dtd_attributes()[element][attribute].default_value  # (lxml is untyped)
    return value


# --- step 1: parsing, safely --------------------------------------------------------------


class _RefuseAll(etree.Resolver):  # type: ignore[misc]  # lxml has no type information: Resolver is Any
    """Answers every external load with nothing and remembers what was asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.requested: list[str] = []

    def resolve(self, system_url: str, public_id: str, context: Any) -> Any:
        if system_url != DTD_SYSTEM_ID:
            self.requested.append(system_url or public_id or "?")
        return self.resolve_string("", context)


_UNDECLARED = re.compile(r"Entity '(.*)' not defined")


def _parse(data: bytes, source: str) -> etree._ElementTree:
    resolver = _RefuseAll()
    parser = etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        dtd_validation=False,
        huge_tree=False,
        collect_ids=False,
        remove_comments=True,
        remove_pis=True,
    )
    parser.resolvers.add(resolver)
    try:
        root = etree.fromstring(data, parser)
    except etree.LxmlError as exc:  # XMLSyntaxError, and the rarer parser failures
        line = getattr(exc, "lineno", None) or None
        message = str(getattr(exc, "msg", None) or exc).split(", line ")[0]
        hint = (
            "save it as UTF-8 or declare its encoding" if re.search("encod|UTF|Char|Bytes", message) else "fix the XML"
        )
        raise ConfigError(
            [Problem(source, line, f"the file is not well-formed XML ({clip(message, 200)}); {hint}")]
        ) from None
    if root is None:
        raise ConfigError([Problem(source, None, "the file is empty; write a <jmsbridge>")])
    tree = root.getroottree()
    problems = _doctype_problems(tree, source, data)
    if not problems:
        problems = [
            Problem(source, None, f"the file asks to load {shorten(url)}, which is refused; remove the reference")
            for url in dict.fromkeys(resolver.requested)
        ]
    # Undeclared entities stay unexpanded (in attributes they would silently vanish).
    problems += [
        Problem(
            source,
            e.line or None,
            f"the entity reference &{clip(m[1])}; is refused; write the text itself (or &amp; for &)",
        )
        for e in parser.error_log
        if (m := _UNDECLARED.match(e.message))
    ]
    raise_if_errors(problems)
    return tree


def _doctype_line(data: bytes) -> int | None:
    """The line of the DOCTYPE (in ASCII-compatible encodings; else unknown)."""
    at = data.find(b"<!DOCTYPE")
    return data.count(b"\n", 0, at) + 1 if at >= 0 else None


def _doctype_problems(tree: etree._ElementTree, source: str, data: bytes) -> list[Problem]:
    info = tree.docinfo
    subset = info.internalDTD  # the DOCTYPE's name and declarations, if there is a DOCTYPE
    if subset is None:
        return []
    if subset.name != "jmsbridge" or info.public_id or info.system_url not in (None, DTD_SYSTEM_ID):
        shown = f'<!DOCTYPE {subset.name} ... "{info.system_url or ""}">'
        return [
            Problem(
                source, _doctype_line(data), f"the DOCTYPE is {shorten(shown, 120)}; write {DOCTYPE} or leave it out"
            )
        ]
    head = etree.tostring(tree, encoding=str)[: len(info.doctype) + 2]
    if next(subset.iterelements(), None) or next(subset.iterentities(), None) or "[" in head[len(info.doctype) - 1 :]:
        return [
            Problem(
                source,
                _doctype_line(data),
                "the DOCTYPE has an internal subset "
                "(entity or other declarations), which is refused; write "
                f"{DOCTYPE} with nothing in brackets",
            )
        ]
    return []


# --- step 2: the DTD, with messages a user can act on --------------------------------------


def _hint(word: str, choices: Iterable[str]) -> str:
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {found[0]}?)" if found else ""


def _missing_attribute(m: re.Match[str]) -> str:
    return f"<{m[1]}> needs the attribute {m[2]}"


def _unknown_attribute(m: re.Match[str]) -> str:
    known = dtd_attributes().get(m[2], {})
    return f"<{m[2]}> has no attribute {clip(m[1])}{_hint(m[1], known)}; remove it"


def _bad_value(m: re.Match[str]) -> str:
    decl = dtd_attributes().get(m[3], {}).get(m[2])
    choices = " or ".join(decl.values()) if decl is not None else "a listed value"
    return f"<{m[3]}> attribute {m[2]} is {shorten(m[1])}; write {choices}"


def _unknown_element(m: re.Match[str]) -> str:
    return f"there is no element <{clip(m[1])}> in a JMS bridge configuration{_hint(m[1], dtd_attributes())}; remove it"


def _content(m: re.Match[str]) -> str:
    got = ", ".join(m[3].split()) or "nothing"
    expected = " ".join(m[2].split()).replace(" ,", ",")
    return f"<{m[1]}> must contain {expected}, in that order, but contains ({got})"


MESSAGE_RULES: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], str]], ...] = (
    (re.compile(r"Element (\S+) does not carry attribute (\S+)"), _missing_attribute),
    (re.compile(r"No declaration for attribute (\S+) of element (\S+)"), _unknown_attribute),
    (re.compile(r'Value "(.*)" for attribute (\S+) of (\S+) is not among', re.S), _bad_value),
    (re.compile(r"No declaration for element (\S+)"), _unknown_element),
    (re.compile(r"Element (\S+) content does not follow the DTD, expecting (.*), got \((.*)\)", re.S), _content),
)


def _dtd_message(message: str) -> str:
    for pattern, rewrite in MESSAGE_RULES:
        match = pattern.match(message)
        if match:
            return rewrite(match)
    return f"{clip(message.strip(), 200)} (see {DTD_SYSTEM_ID})"


def _validate(tree: etree._ElementTree, source: str) -> list[Problem]:
    problems = []
    root = tree.getroot()
    if root.tag != "jmsbridge":
        tag = root.tag if isinstance(root.tag, str) else "?"
        problems.append(
            Problem(
                source,
                root.sourceline,
                f"the top element is <{clip(tag)}>; a bridge configuration starts with <jmsbridge name=...>",
            )
        )
    with _dtd_lock:
        dtd = _dtd()
        if not dtd.validate(tree):
            problems += [Problem(source, e.line or None, _dtd_message(e.message)) for e in dtd.error_log]
    return problems


# --- step 3: building the dataclasses -------------------------------------------------------

SECONDS = integer(0, INT32_MAX)
# Kinds of the attributes that are not plain text (booleans: the DTD enumerates true|false).
ATTRIBUTE_KINDS: Mapping[str, Kind[Any]] = {
    "connect-attempts": integer(-1, INT32_MAX),
    "connect-attempt-interval-in-seconds": SECONDS,
    "idle-timeout-in-seconds": SECONDS,
    "time-to-live-in-millis": integer(0, INT64_MAX),
    "send-attempts": integer(1, INT32_MAX),
    "send-attempt-interval-in-seconds": SECONDS,
    "message-transformer-class": CLASS_NAME,
}
KEEP_EMPTY = frozenset({"password"})  # password="" is a password; other empty values are unset


class _Builder:
    """Turns a (possibly invalid) tree into dataclasses, noting conversion problems."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[Problem] = []

    def attrs(self, el: etree._Element | None, tag: str, skip: Iterable[str] = ()) -> dict[str, Any]:
        """Every DTD attribute of ``tag`` as a dataclass keyword, defaults applied."""
        result: dict[str, Any] = {}
        for name, decl in dtd_attributes()[tag].items():
            if name in skip:
                continue
            value = el.get(name) if el is not None else None
            if value is None:
                value = decl.default_value
            elif value == "" and decl.default == "implied" and name not in KEEP_EMPTY:
                value = None
            if value is None and decl.default == "required":
                value = ""  # the DTD check has reported it
            result[name.replace("-", "_")] = self.convert(el, tag, name, value, decl)
        result["description"] = self.description(el)
        result["line"] = el.sourceline if el is not None else None
        return result

    def convert(self, el: etree._Element | None, tag: str, name: str, value: str | None, decl: Any) -> Any:
        choices = decl.values()
        if choices and value not in choices:  # the DTD check has reported it
            value = decl.default_value
        if value is None:
            return None
        if choices:
            return value == "true" if choices == ["true", "false"] else value
        kind = ATTRIBUTE_KINDS.get(name, TEXT)
        try:
            return kind.parse(value)
        except ValueError:
            line = el.sourceline if el is not None else None
            self.problems.append(
                Problem(self.source, line, f"<{tag}> attribute {name} is {shorten(value)}; {kind.expected}")
            )
            return decl.default_value and kind.parse(decl.default_value)

    @staticmethod
    def description(el: etree._Element | None) -> str | None:
        text = el.findtext("description") if el is not None else None
        return text.strip() if text and text.strip() else None

    def properties(self, el: etree._Element) -> tuple[Property, ...]:
        found: dict[str, Property] = {}
        for prop in el.findall("property"):
            name, value = prop.get("name", ""), prop.get("value", "")
            if name in found:
                self.problems.append(
                    Problem(
                        self.source,
                        prop.sourceline,
                        f"property {shorten(name)} is set twice in <{el.tag}>; the last one wins, remove the other",
                        "warning",
                    )
                )
                del found[name]
            found[name] = Property(name, value, prop.sourceline)
        return tuple(found.values())

    def bridge(self, root: etree._Element) -> BridgeConfig:
        attrs = self.attrs(root, "jmsbridge")
        dmqs = [self.dmq(el) for el in root.findall("dmq")]
        builtin = [d for d in dmqs if d.is_builtin][:1] or [
            DMQConfig(BUILTIN_DMQ, None, None, **self.attrs(None, "dmq", ("name", *DMQ_IGNORED)))
        ]
        return BridgeConfig(
            name=attrs["name"],
            links=tuple(self.link(el) for el in root.findall("link")),
            dmqs=tuple(builtin + [d for d in dmqs if d is not builtin[0]]),
            connection_factories=tuple(
                ConnectionFactoryConfig(**self.attrs(el, "connection-factory"), properties=self.properties(el))
                for el in root.findall("connection-factory")
            ),
            destinations=tuple(self.destination(el) for el in root.findall("destination")),
            message_transfer_tag_bridge_name=attrs["message_transfer_tag_bridge_name"],
            log_message_transfer=attrs["log_message_transfer"],
            source=self.source,
            line=root.sourceline,
        )

    def link(self, el: etree._Element) -> LinkConfig:
        source, target = el.find("source"), el.find("target")
        return LinkConfig(
            **self.attrs(el, "link"),
            source=SourceConfig(**self.attrs(source, "source")),
            target=TargetConfig(
                **self.attrs(target, "target"), properties=self.properties(target) if target is not None else ()
            ),
            **self.link_settings(el),
        )

    def link_settings(self, el: etree._Element) -> dict[str, Any]:
        """The <link>'s own property elements (LINK_PROPERTIES) as LinkConfig keywords."""
        settings: dict[str, Any] = {}
        where = f'<link name="{clip(el.get("name", ""))}">'
        for prop in self.properties(el):
            kind = LINK_PROPERTIES.get(prop.name)
            if kind is None:
                self.problems.append(
                    Problem(
                        self.source,
                        prop.line,
                        f'{where} has <property name="{clip(prop.name)}">, '
                        f"which is no link setting{_hint(prop.name, LINK_PROPERTIES)}; a link takes "
                        f"{', '.join(LINK_PROPERTIES)} (transformer input goes in <target>)",
                    )
                )
                continue
            try:
                settings[_LINK_FIELDS.get(prop.name, prop.name)] = kind.parse(prop.value)
            except ValueError:
                self.problems.append(
                    Problem(
                        self.source,
                        prop.line,
                        f'{where} <property name="{prop.name}"> has value {shorten(prop.value)}; {kind.expected}',
                    )
                )
        return settings

    def dmq(self, el: etree._Element) -> DMQConfig:
        if el.get("name") == BUILTIN_DMQ:
            for name in DMQ_IGNORED[2:]:
                if el.get(name) not in (None, _default("dmq", name)):
                    self.problems.append(
                        Problem(
                            self.source, el.sourceline, f"{name} is ignored for the built-in DMQ; remove it", "warning"
                        )
                    )
            attrs = self.attrs(el, "dmq", DMQ_IGNORED)
            return DMQConfig(connection_factory_ref=None, destination_ref=None, **attrs, properties=self.properties(el))
        return DMQConfig(**self.attrs(el, "dmq"), properties=self.properties(el))

    def destination(self, el: etree._Element) -> DestinationConfig:
        attrs = self.attrs(el, "destination")
        attrs["type"] = DestinationType(attrs["type"] or DestinationType.QUEUE.value)
        return DestinationConfig(**attrs, properties=self.properties(el))


# The built-in DMQ ignores these (and always is enabled and stays connected).
DMQ_IGNORED = ("connection-factory-ref", "destination-ref", "enabled", "stay-connected")


# --- step 4: the rules beyond the DTD -------------------------------------------------------


def _named(config: BridgeConfig) -> Iterator[tuple[str, str, str, int | None]]:
    """(kind, attribute, name, line) of everything that has a name of its own."""
    yield "jmsbridge", "name", config.name, config.line
    for link in config.links:
        yield "link", "name", link.name, link.line
    for dmq in config.dmqs:
        if dmq.line is not None:
            yield "dmq", "name", dmq.name, dmq.line
    for cf in config.connection_factories:
        yield "connection-factory", "ref-name", cf.ref_name, cf.line
    for dest in config.destinations:
        yield "destination", "ref-name", dest.ref_name, dest.line


def check_unique(config: BridgeConfig) -> Iterator[Problem]:
    first: dict[tuple[str, str], int | None] = {}
    for kind, attr, name, line in _named(config):
        if (kind, name) in first and name:
            yield Problem(
                config.source,
                line,
                f"{kind} {attr} {shorten(name)} is used again "
                f"(first at line {first[kind, name]}); give each {kind} its own {attr}",
            )
        first.setdefault((kind, name), line)


def check_reserved(config: BridgeConfig) -> Iterator[Problem]:
    for kind, attr, name, line in _named(config):
        meaning = RESERVED_NAMES.get(name.lower())
        if meaning is None or (kind == "dmq" and name == BUILTIN_DMQ):
            continue
        extra = (
            (f"; write {BUILTIN_DMQ} exactly to configure the built-in DMQ, or choose another name")
            if kind == "dmq" and name.lower() == BUILTIN_DMQ
            else ("; choose another name")
        )
        yield Problem(config.source, line, f"{kind} {attr} {shorten(name)} is reserved for {meaning}{extra}")


def _ref_problem(
    config: BridgeConfig, where: str, line: int | None, attr: str, ref: str, known: list[str], hints: Iterable[str] = ()
) -> Iterator[Problem]:
    if ref == AS_SOURCE and attr == "destination-ref":
        yield Problem(
            config.source,
            line,
            f"{where} destination-ref is {AS_SOURCE}, which only a <target> may use; name a <destination>",
        )
    elif ref and ref not in known:
        kind = "connection-factory" if attr == "connection-factory-ref" else "destination"
        hints = list(hints)
        hint = f" (did you mean {hints[0]}?)" if hints else _hint(ref, known)
        yield Problem(
            config.source,
            line,
            f"{where} {attr} {shorten(ref)} matches no <{kind} ref-name=...>{hint}; add it or fix the name",
        )


def check_refs(config: BridgeConfig) -> Iterator[Problem]:
    cfs = [cf.ref_name for cf in config.connection_factories]
    dests = [d.ref_name for d in config.destinations]
    for link in config.links:
        for end, tag in ((link.source, "source"), (link.target, "target")):
            where = f"the {tag} of link {shorten(link.name)}"
            yield from _ref_problem(config, where, end.line, "connection-factory-ref", end.connection_factory_ref, cfs)
            if not (tag == "target" and end.destination_ref == AS_SOURCE):
                hints = [AS_SOURCE] if tag == "target" and end.destination_ref.upper() == AS_SOURCE else []
                yield from _ref_problem(config, where, end.line, "destination-ref", end.destination_ref, dests, hints)
    for dmq in config.dmqs:
        if not dmq.is_builtin:
            where = f"dmq {shorten(dmq.name)}"
            yield from _ref_problem(
                config, where, dmq.line, "connection-factory-ref", dmq.connection_factory_ref or "", cfs
            )
            yield from _ref_problem(config, where, dmq.line, "destination-ref", dmq.destination_ref or "", dests)


def check_connection_factories(config: BridgeConfig) -> Iterator[Problem]:
    for cf in config.connection_factories:
        name = f"connection-factory {shorten(cf.ref_name)}"
        if cf.username is not None and cf.password is None:
            yield Problem(
                config.source,
                cf.line,
                f'{name} sets username but not password; add password (password="" for an empty one)',
            )
        if cf.password is not None and cf.username is None:
            yield Problem(
                config.source,
                cf.line,
                f"{name} sets password but not username, so the password is not used; add username or remove password",
                "warning",
            )
        yield from _lookup_environment(config, name, cf.lookup_name, cf.environment, cf.line)
        if cf.lookup_name is None:
            yield from imq_settings(cf.properties, config.source, cf.line, cf.ref_name)[1]


def _lookup_environment(
    config: BridgeConfig, name: str, lookup_name: str | None, environment: Mapping[str, str], line: int | None
) -> Iterator[Problem]:
    if lookup_name is not None and not environment.get(INITIAL_CONTEXT_FACTORY):
        yield Problem(
            config.source,
            line,
            f"{name} has lookup-name {shorten(lookup_name)} but "
            f'no <property name="{INITIAL_CONTEXT_FACTORY}" value=...>; add the JNDI '
            "environment as property elements",
        )


def check_destinations(config: BridgeConfig) -> Iterator[Problem]:
    for dest in config.destinations:
        name = f"destination {shorten(dest.ref_name)}"
        if dest.name is None and dest.lookup_name is None:
            yield Problem(config.source, dest.line, f"{name} has neither name nor lookup-name; set one of them")
        elif dest.name is not None and dest.lookup_name is not None:
            yield Problem(
                config.source,
                dest.line,
                f"{name} has both name and lookup-name; name is ignored, remove one of them",
                "warning",
            )
        yield from _lookup_environment(config, name, dest.lookup_name, dest.environment, dest.line)


def _host_destinations(config: BridgeConfig) -> set[str]:
    """The ref-names of destinations a link or DMQ uses with a connection factory without
    lookup-name (the host broker, or the OpenMQ brokers of its imqAddressList)."""
    host_cfs = {cf.ref_name for cf in config.connection_factories if cf.lookup_name is None}
    ends: list[tuple[str | None, str | None]] = [
        (end.connection_factory_ref, end.destination_ref) for link in config.links for end in (link.source, link.target)
    ]
    ends += [(dmq.connection_factory_ref, dmq.destination_ref) for dmq in config.dmqs]
    return {dest for cf, dest in ends if cf in host_cfs and dest is not None}


def check_destination_names(config: BridgeConfig) -> Iterator[Problem]:
    """A destination name the host broker would refuse to create, refused here."""
    used = _host_destinations(config)
    for dest in config.destinations:
        if dest.ref_name not in used or dest.name is None or dest.lookup_name is not None:
            continue
        problem = name_problem(dest.name, dest.type is DestinationType.TOPIC)
        if problem is not None:
            yield Problem(
                config.source,
                dest.line,
                f"destination {shorten(dest.ref_name)} has "
                f"name {shorten(dest.name)}, which the broker refuses: {problem}; "
                f"{NAME_RULE}",
            )


def check_durable_subscriptions(config: BridgeConfig) -> Iterator[Problem]:
    dests = {d.ref_name: d for d in config.destinations}
    for link in config.links:
        dest = dests.get(link.source.destination_ref)
        if (
            link.source.durable_sub is not None
            and dest is not None
            and dest.lookup_name is None
            and dest.type is DestinationType.QUEUE
        ):
            yield Problem(
                config.source,
                link.source.line,
                f"link {shorten(link.name)} has "
                f"durable-sub but its source {shorten(dest.ref_name)} is a queue, so "
                "it is ignored; remove it or make the destination a topic",
                "warning",
            )


CHECKS: tuple[Callable[[BridgeConfig], Iterable[Problem]], ...] = (
    check_unique,
    check_reserved,
    check_refs,
    check_connection_factories,
    check_destinations,
    check_destination_names,
    check_durable_subscriptions,
)


# --- entry points -----------------------------------------------------------------------------


def _limit(problems: list[Problem], source: str) -> list[Problem]:
    problems.sort(key=lambda p: (p.line or 0, p.severity))
    if len(problems) <= MAX_PROBLEMS:
        return problems
    return [
        *problems[:MAX_PROBLEMS],
        Problem(source, None, f"{len(problems) - MAX_PROBLEMS} more problems are not shown; fix these first"),
    ]


def parse_bridge_config(data: bytes, source: str = "<bridge xml>", bridge_name: str | None = None) -> BridgeConfig:
    """The configuration in ``data``; ConfigError lists every problem with its line.

    ``bridge_name`` (the name in the broker properties) must equal the jmsbridge name.
    """
    if not isinstance(data, bytes):
        raise TypeError("parse_bridge_config() takes the file's bytes")
    tree = _parse(data, source)
    problems = _validate(tree, source)
    builder = _Builder(source)
    config = builder.bridge(tree.getroot())
    problems += builder.problems
    if bridge_name is not None and config.name and config.name != bridge_name:
        problems.append(
            Problem(
                source,
                tree.getroot().sourceline,
                f"the jmsbridge name is "
                f"{shorten(config.name)} but this file is the configuration of "
                f"bridge {shorten(bridge_name)}; make them the same",
            )
        )
    for check in CHECKS:
        problems += check(config)
    problems = _limit(problems, source)
    raise_if_errors(problems)
    return dataclasses.replace(config, warnings=tuple(problems))


def load_bridge_config(
    xmlurl: str,
    *,
    bridge_name: str | None = None,
    base_dir: str | os.PathLike[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    max_bytes: int = MAX_CONFIG_BYTES,
) -> BridgeConfig:
    """Read the XML an xmlurl names (a path, file: or http(s): URL) and parse it.

    Relative paths are taken relative to ``base_dir`` (the properties file's folder).
    """
    data, source = read_xmlurl(xmlurl, base_dir=base_dir, timeout=timeout, max_bytes=max_bytes)
    return parse_bridge_config(data, source, bridge_name)


def load_bridge(props: BrokerProperties, name: str, *, timeout: float = DEFAULT_TIMEOUT) -> BridgeConfig:
    """The configuration of JMS bridge ``name`` as its broker properties describe it."""
    bridge = props.bridge(name)
    if not bridge.xmlurl:
        key = f"imq.bridge.{name}.xmlurl"
        origin = props.origin(f"imq.bridge.{name}.type")
        raise ConfigError(
            [
                Problem(
                    origin.source if origin else "properties",
                    origin.line if origin else None,
                    f"JMS bridge {name} has no {key}; set it to its XML file",
                )
            ]
        )
    return load_bridge_config(bridge.xmlurl, bridge_name=name, base_dir=bridge.xml_base, timeout=timeout)
