"""Access control: the original's access control properties file, parsed and enforced.

The access control file (accesscontrol.properties, version=JMQFileAccessControlModel/100)
is parsed into AccessRules; AccessRules.decide walks them from the general to the specific
(the name *, names with * inside, the destinations a bridge protects, the exact name) and
denies what no rule decides. AccessControl is the one decision point of one connection
service (jms, stomp, admin): every front end asks it with the authenticated Principal.

Rules: a check must cost nothing per message (decisions are cached, the file is looked at
again only at a login); a file that no longer parses keeps the rules it had; each refusal
is logged once per (user, operation, destination).

Design notes: docs/security.md#internals-accesscontrolpy.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from .jms.destination import Destination
from .jms.errors import JMSSecurityException
from .jms.hostbroker import Principal

if TYPE_CHECKING:
    from .props import BrokerProperties

log = logging.getLogger(__name__)

VERSION = "JMQFileAccessControlModel/100"
DEFAULT_FILENAME = "accesscontrol.properties"
SHIPPED_FILE = Path(__file__).with_name(DEFAULT_FILENAME)  # copied to <instance>/etc at first start
SERVICES = ("jms", "stomp", "admin")  # imq.<service>.accesscontrol.* overrides
SERVICE_TYPES = {"jms": "NORMAL", "stomp": "NORMAL", "admin": "ADMIN"}
ADMIN_GROUP = "admin"
ALL = "*"

RESOURCES = ("connection", "queue", "topic", "durable")
OPERATIONS = {
    "queue": ("produce", "consume", "browse"),
    "topic": ("produce", "consume"),
    "durable": ("consume", "unsubscribe"),
}
CREATE = "create"
ACCESSES = ("allow", "deny")
PRINCIPAL_TYPES = ("user", "group")
CONNECTION_TYPES = ("NORMAL", "ADMIN", ALL)
MAX_LOGGED = 10_000  # refusals remembered for log-once; then forgotten and logged again


class AccessControlError(Exception):
    """An access control file that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class RuleKey:
    """The left-hand side of a rule. ``variant``: the service type (connection), the
    destination name or * (queue, topic), None for auto-create; ``operation``: None for
    connection rules, ``create`` for auto-create."""

    resource: str
    variant: str | None
    operation: str | None
    access: str
    principal_type: str

    def text(self) -> str:
        parts = [self.resource, self.variant, self.operation, self.access, self.principal_type]
        return ".".join(p for p in parts if p is not None)


def parse_key(key: str) -> RuleKey:
    """The RuleKey ``key`` spells; ValueError saying what is wrong."""
    parts = key.split(".")
    resource = parts[0]
    if resource not in RESOURCES:
        raise ValueError(f"a rule starts with {', '.join(RESOURCES)}, not {resource!r}")
    if len(parts) < 4:
        raise ValueError("a rule has the form <resource>.<name>[.<operation>].<allow|deny>.<user|group>")
    access, ptype = parts[-2], parts[-1]
    if access not in ACCESSES:
        raise ValueError(f"{access!r} must be allow or deny")
    if ptype not in PRINCIPAL_TYPES:
        raise ValueError(f"{ptype!r} must be user or group")
    if resource == "connection":
        if len(parts) != 4 or parts[1] not in CONNECTION_TYPES:
            raise ValueError(
                f"a connection rule names the service type {', '.join(CONNECTION_TYPES)}, not {'.'.join(parts[1:-2])!r}"
            )
        return RuleKey(resource, parts[1], None, access, ptype)
    if len(parts) == 4 and resource != "durable":
        if parts[1] != CREATE:
            raise ValueError(
                f"{resource} rules need an operation ({', '.join(OPERATIONS[resource])}), "
                f"or are {resource}.create rules"
            )
        return RuleKey(resource, None, CREATE, access, ptype)
    operation, name = parts[-3], ".".join(parts[1:-3])
    if operation not in OPERATIONS[resource]:
        raise ValueError(f"{resource} operation {operation!r} is not one of {', '.join(OPERATIONS[resource])}")
    if not name or "" in parts[1:-3]:
        raise ValueError(f"{name!r} is not a destination name")
    if resource == "durable" and len(parts) < 6 and name != ALL:
        raise ValueError(f"{name!r} does not name a subscription as <clientid>.<name> (or with *)")
    return RuleKey(resource, name, operation, access, ptype)


def _logical_lines(text: str) -> Iterable[tuple[int, str]]:
    """(first line number, line) of a properties text: comments and blank lines left out,
    a line ending in an odd number of backslashes continued on the next."""
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.lstrip() if pending else raw.strip()
        if not pending:
            if not line or line[0] in "#!":
                continue
            start = number
        stripped = line.rstrip()
        trailing = len(stripped) - len(stripped.rstrip("\\"))
        if trailing % 2:
            pending += stripped[:-1]
            continue
        yield start, pending + stripped
        pending = ""
    if pending:
        yield start, pending


_SEPARATOR = re.compile(r"\s*[=:]\s*|\s+")


@dataclass(frozen=True)
class AccessRules:
    """The rules of one access control file (see the module notes for how they decide)."""

    rules: Mapping[RuleKey, frozenset[str]]
    source: str = field(default="<rules>", compare=False)

    @classmethod
    def parse(cls, text: str, source: str) -> AccessRules:
        """The rules in ``text`` (a file's contents; ``source`` names it in errors)."""
        rules: dict[RuleKey, frozenset[str]] = {}
        version: str | None = None
        for number, line in _logical_lines(text):
            match = _SEPARATOR.search(line)
            key, value = (line[: match.start()], line[match.end() :]) if match else (line, "")
            if key == "version":
                if value.strip() != VERSION:
                    raise AccessControlError(
                        f"{source}:{number}: version is {value.strip()!r}; this file format is version={VERSION}"
                    )
                version = value
                continue
            try:
                rule = parse_key(key)
            except ValueError as exc:
                raise AccessControlError(f"{source}:{number}: {key[:200]!r} is not an access rule: {exc}") from None
            names = frozenset(n.strip() for n in value.split(",") if n.strip())
            if not names:
                raise AccessControlError(
                    f"{source}:{number}: {key} lists no {rule.principal_type}s "
                    f"(write names separated by commas, or * for every {rule.principal_type})"
                )
            rules[rule] = names
        if version is None:
            raise AccessControlError(
                f"{source}:1: the file does not start with version={VERSION}; is it an access control file?"
            )
        return cls(rules, source)

    def text(self) -> str:
        """The rules as a file (parse(text()) gives them back)."""
        lines = [f"version={VERSION}"]
        keys = sorted(self.rules, key=RuleKey.text)
        lines += [f"{k.text()}={','.join(sorted(self.rules[k]))}" for k in keys]
        return "\n".join(lines) + "\n"

    # --- deciding -------------------------------------------------------------------------
    def decide(
        self,
        user: str,
        groups: frozenset[str],
        resource: str,
        variant: str | None,
        operation: str | None,
        protected: frozenset[str] = frozenset(),
    ) -> bool:
        """May ``user`` (in ``groups``) do ``operation`` on the resource? ``protected``:
        destination names of this resource that are admin-only unless named exactly."""
        decided: bool | None = None
        for level in self._levels(resource, variant, operation, protected):
            verdict = (ADMIN_GROUP in groups) if isinstance(level, _AdminOnly) else self._level(user, groups, level)
            if verdict is not None:
                decided = verdict
        return decided is True

    def _levels(
        self, resource: str, variant: str | None, operation: str | None, protected: frozenset[str]
    ) -> Iterable[tuple[str, str | None, str | None] | _AdminOnly]:
        if resource == "connection" or operation == CREATE:
            if variant is not None:
                yield resource, ALL, operation
            yield resource, variant, operation
            return
        assert variant is not None
        yield resource, ALL, operation
        for pattern in self._patterns(resource, operation):
            if pattern.fullmatch(variant):
                yield resource, pattern.pattern_text, operation
        if variant in protected:
            yield _ADMIN_ONLY
        yield resource, variant, operation

    def _patterns(self, resource: str, operation: str | None) -> list[_Pattern]:
        return self._pattern_index.get((resource, operation), [])

    @cached_property
    def _pattern_index(self) -> dict[tuple[str, str | None], list[_Pattern]]:
        """The names with * inside, per (resource, operation), fewest literal characters first."""
        index: dict[tuple[str, str | None], list[_Pattern]] = {}
        names = {
            (k.resource, k.operation, k.variant)
            for k in self.rules
            if k.variant is not None and k.variant != ALL and ALL in k.variant
        }
        for resource, operation, name in sorted(names, key=lambda r: (len(r[2].replace(ALL, "")), r[2])):
            index.setdefault((resource, operation), []).append(_Pattern(name))
        return index

    def _level(self, user: str, groups: frozenset[str], level: tuple[str, str | None, str | None]) -> bool | None:
        """One level's verdict: the user's own rule, else their groups', else user=*,
        else group=* (None: the level does not decide)."""
        resource, variant, operation = level
        get = self.rules.get

        def names(access: str, ptype: str) -> frozenset[str]:
            return get(RuleKey(resource, variant, operation, access, ptype), frozenset())

        uallow, udeny = names("allow", "user"), names("deny", "user")
        for verdict in (
            _one(user in uallow, user in udeny),
            self._groups(groups, names),
            _one(ALL in uallow, ALL in udeny),
        ):
            if verdict is not None:
                return verdict
        if groups:
            return _one(ALL in names("allow", "group"), ALL in names("deny", "group"))
        return None

    @staticmethod
    def _groups(groups: frozenset[str], names: Callable[[str, str], frozenset[str]]) -> bool | None:
        """The user's groups together: allowed if one allows and none denies, and so on."""
        if not groups:
            return None
        gallow, gdeny = names("allow", "group"), names("deny", "group")
        each = [_one(g in gallow, g in gdeny) for g in groups]
        return _one(True in each, False in each)


def _one(allow: bool, deny: bool) -> bool | None:
    """One principal's verdict: allowed, denied, or (neither, or both: they cancel) None."""
    return None if allow == deny else allow


class _AdminOnly:
    """The level a bridge's protected destination adds: admins yes, everyone else no."""


_ADMIN_ONLY = _AdminOnly()


class _Pattern:
    """A destination name with * in it: * matches any run of characters."""

    def __init__(self, text: str) -> None:
        self.pattern_text = text
        self._re = re.compile(".*".join(re.escape(p) for p in text.split(ALL)), re.DOTALL)

    def fullmatch(self, name: str) -> bool:
        return self._re.fullmatch(name) is not None


# --- the decision point ------------------------------------------------------------------------


class AccessControl:
    """One connection service's access control: its file's rules, decisions cached."""

    def __init__(self, service: str, path: Path, service_type: str = "NORMAL") -> None:
        self.service = service
        self.path = path
        self.service_type = service_type
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._rules = AccessRules({}, str(path))
        self._cache: dict[tuple[str | None, frozenset[str], str, str | None, str | None], bool] = {}
        self._passed: set[tuple[str | None, frozenset[str], str, str, str]] = set()
        self._protected: dict[str, frozenset[str]] = {"queue": frozenset(), "topic": frozenset()}
        self._logged: set[tuple[str | None, str, str]] = set()
        self.refresh(strict=True)

    @property
    def rules(self) -> AccessRules:
        return self._rules

    def refresh(self, strict: bool = False) -> None:
        """Re-read the file when it changed. ``strict``: a broken file raises
        AccessControlError (start-up); else it is logged and the old rules stay."""
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp == self._stamp:
                return
            rules = AccessRules.parse(self.path.read_text(encoding="utf-8", errors="replace"), str(self.path))
        except (OSError, AccessControlError) as exc:
            text = str(exc) if isinstance(exc, AccessControlError) else f"cannot read {self.path}: {exc}"
            if strict:
                raise AccessControlError(text) from None
            if self._stamp is not None:
                log.error("access control (%s): %s; the rules read before stay in force", self.service, text)
                self._stamp = None  # logged once per change: the next refresh tries again quietly
            return
        with self._lock:
            if self._stamp is not None or not strict:
                log.info("access control (%s): read %s", self.service, self.path)
            self._rules, self._stamp = rules, stamp
            self._cache, self._passed = {}, set()

    def protect(self, destinations: Iterable[Destination]) -> None:
        """Make ``destinations`` admin-only (a bridge's DMQs) unless the file names them."""
        with self._lock:
            for dest in destinations:
                kind = "topic" if dest.is_topic else "queue"
                self._protected[kind] = self._protected[kind] | {dest.name}
            self._cache, self._passed = {}, set()

    def allowed(self, principal: Principal, resource: str, variant: str | None, operation: str | None) -> bool:
        key = (principal.user, principal.groups, resource, variant, operation)
        verdict = self._cache.get(key)
        if verdict is None:
            if principal.user is None or principal.user == ALL or ALL in principal.groups:
                verdict = False  # the original refuses a user or group named *
            else:
                verdict = self._rules.decide(
                    principal.user,
                    principal.groups,
                    resource,
                    variant,
                    operation,
                    self._protected.get(resource, frozenset()),
                )
            self._cache[key] = verdict
        return verdict

    def check_connection(self, principal: Principal) -> None:
        """Login: may ``principal`` use this service? JMSSecurityException if not."""
        self.refresh()
        if not self.allowed(principal, "connection", self.service_type, None):
            self._refused(principal, "connect", f"the {self.service} service ({self.service_type})")
            raise JMSSecurityException(
                f"access denied: user {principal.user!r} may not connect to "
                f"the {self.service} service (connection.{self.service_type})"
            )

    def check(
        self,
        principal: Principal,
        operation: str,
        destination: Destination,
        would_autocreate: Callable[[Destination], bool] | None = None,
    ) -> None:
        """May ``principal`` ``operation`` (produce, consume, browse) ``destination``, and,
        when ``would_autocreate(destination)`` says using it now creates it, have it
        created? JMSSecurityException naming the destination and operation if not.
        Temporary destinations are the client's own and always allowed.

        The fast path, once per message: a check passed for a destination that existed
        is remembered until the rules change (destinations are never deleted, so the
        auto-create question does not come back)."""
        key = (principal.user, principal.groups, operation, destination.kind, destination.name)
        if key in self._passed or destination.is_temporary:
            return
        resource = "topic" if destination.is_topic else "queue"
        autocreate = would_autocreate is not None and would_autocreate(destination)
        if autocreate and not self.allowed(principal, resource, None, CREATE):
            self._refused(principal, CREATE, str(destination))
            raise JMSSecurityException(
                f"access denied: user {principal.user!r} may not create {destination} (auto-create)"
            )
        if not self.allowed(principal, resource, destination.name, operation):
            self._refused(principal, operation, str(destination))
            raise JMSSecurityException(f"access denied: user {principal.user!r} may not {operation} {destination}")
        if not autocreate:
            self._passed.add(key)

    def is_admin(self, principal: Principal) -> bool:
        """May ``principal`` connect to the admin service (connection.ADMIN)?"""
        return self.allowed(principal, "connection", "ADMIN", None)

    def grants_durable(self, principal: Principal, client_id: str, name: str, operation: str) -> bool:
        """Does a durable rule let ``principal`` ``operation`` (consume, unsubscribe) the
        durable subscription ``name`` of ``client_id`` that another user owns?"""
        return self.allowed(principal, "durable", f"{client_id}.{name}", operation)

    def _refused(self, principal: Principal, operation: str, what: str) -> None:
        key = (principal.user, operation, what)
        if key in self._logged:
            return
        if len(self._logged) >= MAX_LOGGED:
            self._logged.clear()
        self._logged.add(key)
        log.warning(
            "access denied: user %r may not %s %s (%s service, from %s)",
            principal.user,
            operation,
            what,
            self.service,
            principal.address or "this process",
        )


def durable_override(
    control: AccessControl | None, principal: Principal, client_id: str, name: str, operation: str
) -> str | None:
    """Why ``principal`` may ``operation`` (consume, unsubscribe) a durable subscription
    another user owns, said for the log: an admin (group admin, or connection.ADMIN in
    ``control``'s file), or a durable rule of ``control``'s file; None: they may not."""
    if principal.user is None or principal.user == ALL or ALL in principal.groups:
        return None
    if ADMIN_GROUP in principal.groups or (control is not None and control.is_admin(principal)):
        return "an admin"
    if control is not None and control.grants_durable(principal, client_id, name, operation):
        return f"granted by {control.path}"
    return None


class AccessControls(dict[str | None, AccessControl]):
    """The access control of each connection service that has it on, by service name
    (None: the broker-wide imq.accesscontrol.* settings). A service missing is open."""

    def check_connection(self, principal: Principal) -> None:
        control = self.get(principal.service)
        if control is not None:
            control.check_connection(principal)

    def protect(self, destinations: Iterable[Destination]) -> None:
        dests = list(destinations)
        for control in self.values():
            control.protect(dests)


def open_access_controls(props: BrokerProperties) -> AccessControls:
    """The access control of each service, as imq.accesscontrol.* and its per-service
    overrides imq.<service>.accesscontrol.* set it; the shipped default file is copied to
    the instance's etc/ (mode 0600) the first time it is needed. AccessControlError for a
    file missing or broken."""
    etc = props.instance_dir / "etc"
    controls = AccessControls()
    for service in (None, *SERVICES):

        def get(suffix: str, service: str | None = service) -> object:
            own = props.get(f"imq.{service}.accesscontrol.{suffix}") if service else None
            return own if own is not None else props.get(f"imq.accesscontrol.{suffix}")

        if not get("enabled"):
            continue
        name = str(get("file.filename") or DEFAULT_FILENAME)
        path = Path(name) if os.path.isabs(name) else etc / name
        if name == DEFAULT_FILENAME and not path.exists():
            _install_default(path)
        controls[service] = AccessControl(service or "broker", path, SERVICE_TYPES.get(service or "", "NORMAL"))
    return controls


def _install_default(path: Path) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out, SHIPPED_FILE.open("rb") as src:
        shutil.copyfileobj(src, out)
    os.replace(tmp, path)
    log.info("access control: installed the default rules in %s", path)
