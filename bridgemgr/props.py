"""Broker properties: parsing, the schema of every bridge property, and defaults.

Broker properties come from Java .properties files (read with javaproperties, later files
winning) and then from `-Dkey=value` overrides. Every key we understand is a row of a schema
table: its kind (how to parse and what to tell the user when the value is wrong) and its
default. Keys come in three shapes: fixed keys (imq.bridge.enabled), per-bridge keys
(imq.bridge.<name>.xmlurl) and prefix families (imq.bridge.spark.conf.*). load_properties()
parses every value once, collects every problem of every file (file and line), raises
ConfigError with all errors together, and otherwise returns a frozen BrokerProperties
holding typed values, with grouped views (BridgeProperties, StompProperties,
AutocreateProperties) for the code that uses them. A key under imq. that no schema row knows
is a warning naming the closest known key (`check` prints it, `serve` logs it); the schema
is the one list of known keys. A file that is not a properties file (a NUL byte, XML, or no
line that is key=value or key:value) is refused naming the file and line. Secrets (the admin
password) never appear in repr, str, logs or messages.

``ConfigError`` and ``Problem`` live here because the broker properties are the root of
all configuration: the bridge XML loader (``bridgemgr.jmsbridge.config``) reports its
problems with the same classes, so a caller catches one error type for everything.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import keyword
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Generic, Literal, TypeVar

import javaproperties

log = logging.getLogger(__name__)

Severity = Literal["error", "warning"]
COMMAND_LINE = "command line"
REDACTED = "********"


# --- problems ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a configuration, where it is, and what to do about it."""

    source: str  # a file path, a URL, or COMMAND_LINE
    line: int | None
    message: str
    severity: Severity = "error"

    def __str__(self) -> str:
        where = self.source if self.line is None else f"{self.source}:{self.line}"
        kind = "warning: " if self.severity == "warning" else ""
        return f"{where}: {kind}{self.message}"


class ConfigError(Exception):
    """A configuration cannot be used; carries every problem found (errors and warnings)."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    @property
    def errors(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.severity == "error")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.problems,))


def raise_if_errors(problems: Iterable[Problem]) -> None:
    """Raise ConfigError when ``problems`` has an error (the warnings go along with it)."""
    problems = list(problems)
    if any(p.severity == "error" for p in problems):
        raise ConfigError(problems)


def clip(value: str, limit: int = 60) -> str:
    """``value`` cut to ``limit`` characters, so a message stays one readable line."""
    return value if len(value) <= limit else value[:limit] + "..."


def shorten(value: str, limit: int = 60) -> str:
    """A value quoted for a message, cut like clip()."""
    return repr(clip(value, limit))


SECRET_WORDS = ("pass", "pwd", "credential", "secret")


def is_secret_name(name: str) -> bool:
    """Names whose values are never shown (admin password, JNDI credentials, ...)."""
    lowered = name.lower()
    return any(word in lowered for word in SECRET_WORDS)


# --- kinds of values: how to parse, and what to tell the user ------------------------------

_V = TypeVar("_V")


@dataclass(frozen=True)
class Kind(Generic[_V]):
    """How a property value is parsed; ``expected`` completes "...; <expected>"."""

    parse: Callable[[str], _V]
    expected: str


_INT = re.compile(r"[+-]?[0-9]+\Z")
_SIZE = re.compile(r"([+-]?[0-9]+)\s*([bkmg]?)\Z", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+\Z", re.ASCII)
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError
    return lowered == "true"


def integer(lo: int, hi: int) -> Kind[int]:
    """Whole numbers in [lo, hi], written as Java's Integer.parseInt reads them."""

    def parse(text: str) -> int:
        text = text.strip()
        if not _INT.match(text) or not lo <= int(text) <= hi:
            raise ValueError
        return int(text)

    return Kind(parse, f"write a whole number from {lo} to {hi}")


def parse_size(text: str) -> int:
    """OpenMQ byte sizes: 512, 512b, 10k, 10m, 1g (units of 1024); -1 means unlimited."""
    match = _SIZE.match(text.strip())
    if not match:
        raise ValueError
    number = int(match.group(1))
    if number == -1:
        return -1
    if number < 0:
        raise ValueError
    return number * _SIZE_UNITS[match.group(2).lower()]


def _enum(*values: str, upper: bool = False) -> Kind[str]:
    def parse(text: str) -> str:
        norm = text.strip().upper() if upper else text.strip().lower()
        if norm not in values:
            raise ValueError
        return norm

    return Kind(parse, "write one of " + ", ".join(values))


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def parse_key_values(text: str) -> dict[str, str]:
    """``k1=v1, k2=v2`` as used by imq.bridge.tm.props."""
    result: dict[str, str] = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError
        result[key.strip()] = value.strip()
    return result


def _class_name(text: str) -> str:
    text = text.strip()
    if not _DOTTED.match(text) or any(keyword.iskeyword(p) for p in text.split(".")):
        raise ValueError
    return text


def _text(text: str) -> str:
    return text


def _checked(text: str, pattern: re.Pattern[str]) -> str:
    if not pattern.match(text):
        raise ValueError
    return text


BOOL = Kind(_bool, "write true or false")
COUNT = integer(0, INT32_MAX)
POSITIVE = integer(1, INT32_MAX)
LIMIT = integer(-1, INT32_MAX)
PERCENT = integer(0, 100)
PORT = integer(0, 65535)  # 0: any free port (tests)
SIZE = Kind(parse_size, "write a byte size such as 512, 512b, 10k, 10m or 1g, or -1 for unlimited")


def parse_bound(text: str) -> int:
    """A byte size that bounds something: as parse_size, but 0 bounds nothing sensible."""
    size = parse_size(text)
    if size == 0:
        raise ValueError
    return size


BYTE_BOUND = Kind(parse_bound, "write a byte size of at least 1 such as 512k, 16m or 1g, or -1 for no byte bound")
TEXT = Kind(_text, "write any text")
NAMES = Kind(_names, "write names separated by commas")
CLUSTER_ID = Kind(
    lambda text: _checked(text.strip(), re.compile(r"[A-Za-z0-9_]{1,24}\Z")), "write 1 to 24 letters, digits or _"
)
KEY_VALUES = Kind(parse_key_values, "write key=value pairs separated by commas")
LIMIT_BEHAVIORS = ("FLOW_CONTROL", "REMOVE_OLDEST", "REJECT_NEWEST", "REMOVE_LOW_PRIORITY")
LIMIT_BEHAVIOR = _enum(*LIMIT_BEHAVIORS, upper=True)
BACKOUT_DISPOSITION = _enum("dmq", "discard")  # a destination's backoutDisposition (dstadmin.py)
CLASS_NAME = Kind(
    _class_name, "write a dotted class name such as bridgemgr.transformers.uppercase.UppercaseTransformer"
)


@dataclass(frozen=True)
class Prop:
    """One row of the schema: a key, its kind, its default and why it exists."""

    key: str
    kind: Kind[Any]
    default: Any
    doc: str
    secret: bool = False


# --- the schema -----------------------------------------------------------------------------

IMQ_PREFIX = "imq."  # every key under it is ours: an unknown one is a warning
BRIDGE_PREFIX = "imq.bridge."
VARHOME_ENV = "IMQ_VARHOME"
DEFAULT_VARHOME = "var"  # relative to the current directory, as the broker's own default
# imq.bridge.<name>.backoutThreshold: a message backed out (redelivered) this many times
# goes to the DMQ the next time it comes, as WebSphere MQ's BOTHRESH. 5, not MQ's 20: a
# transacted link backs off between tries (doubling from 0.3 s), so 5 holds the link
# behind a poison message for about 10 s, where 20 would hold it for minutes.
BACKOUT_THRESHOLD = 5
# imq.bridge.<name>.link.window: a non-transacted link sends this many messages without
# waiting for each answer, and acknowledges them once confirmed. 1000 from
# benchmarks/providers.py (RabbitMQ -> RabbitMQ, 50,000 messages at 100 / 300 / 1000): a
# window must cover what moves while the target's confirms wait for its disk (RabbitMQ's
# ~25 ms at Shovel's ~10,000 msg/s: 250 at least); 100 ran at half of Shovel, 300 at
# 5,300-5,700 msg/s and 1000 at 6,400-8,400 (a loaded machine). Later, quiet: 2000 and
# 4000 added 5-10% for 1 KiB messages, not worth two to four times the memory held.
# The price: a crash sends up to one window twice, and the source prefetches three.
LINK_WINDOW = 1000
# imq.bridge.<name>.link.windowBytes: a link's open unit (and confirm window) is full at
# this many bytes of messages too, however few they are, so that a backlog of big messages
# does not hold `window` of them (1000 x 1 MiB: 1 GB) plus the source's prefetch.
# 16 MiB from benchmarks/memory.py and benchmarks/link.py (docs/benchmarks.md): 1,000
# messages of 1 KiB hold about 1.2 MiB, far below it (no throughput change), while 1 MiB
# messages make units of 16: 2,000 of them moved with a peak RSS of 380-550 MB instead of
# 2.5 GB, and a 1 MiB bound saved nothing more.
LINK_WINDOW_BYTES = 16 * 1024**2

MEMORY_STATES = ("green", "yellow", "orange", "red")

# Log level names, java.util.logging's and Python's, as imq.log.level, imq.bridge.<name>.level
# and logging configuration files take them (docs/operations.md, "Logs").
LOG_LEVELS: Mapping[str, int] = MappingProxyType(
    {
        "OFF": logging.CRITICAL + 10,
        "SEVERE": logging.ERROR,
        "WARNING": logging.WARNING,
        "INFO": logging.INFO,
        "CONFIG": logging.INFO - 5,
        "FINE": logging.DEBUG,
        "FINER": logging.DEBUG - 3,
        "FINEST": logging.DEBUG - 5,
        "ALL": 1,
        "CRITICAL": logging.CRITICAL,
        "ERROR": logging.ERROR,
        "WARN": logging.WARNING,
        "DEBUG": logging.DEBUG,
    }
)


def parse_log_level(text: str) -> int:
    """A level name of LOG_LEVELS (either case) or a number, as logging takes it."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    if text.upper() not in LOG_LEVELS:
        raise ValueError
    return LOG_LEVELS[text.upper()]


LOG_LEVEL = Kind(parse_log_level, "write a level: " + ", ".join(LOG_LEVELS))
# The service log (<instance>/log/log.txt): rolled over weekly, as the original broker's.
LOG_ROLLOVER_SECS = 7 * 24 * 3600

FIXED_PROPS: tuple[Prop, ...] = (
    # The Bridge Service Manager (the chapter's "To Enable the Bridge Service Manager").
    Prop("imq.bridge.enabled", BOOL, False, "run the Bridge Service Manager at all"),
    Prop("imq.bridge.activelist", NAMES, (), "bridges loaded at broker start, by name"),
    Prop("imq.bridge.admin.user", TEXT, None, "user of the admin command port"),
    Prop("imq.bridge.admin.password", TEXT, None, "password of the admin user", secret=True),
    Prop("imq.bridge.admin.port", PORT, 0, "admin command port; 0 = any free port (the port mapper tells)"),
    Prop("imq.bridge.admin.tls.enabled", BOOL, False, "the admin port speaks TLS (imqbridgemgr -secure)"),
    Prop("imq.bridge.admin.tls.certfile", TEXT, None, "PEM certificate chain of the TLS admin port"),
    Prop("imq.bridge.admin.tls.keyfile", TEXT, None, "PEM private key of the TLS admin port"),
    Prop("imq.bridge.tm.props", KEY_VALUES, {}, "XA coordinator settings for every bridge"),
    Prop("imq.bridge.spark.master", TEXT, None, "Spark master URL for runner=spark links"),
    Prop(
        "imq.bridge.spark.sourcelog",
        _enum("auto", "shared", "shipped"),
        "auto",
        "executors read Spark links' source logs themselves (shared) or get the records "
        "from the driver (shipped); auto: shared on a local master only",
    ),
    Prop("imq.bridge.java.classpath", TEXT, None, "jars of Java JMS providers (JPype)"),
    Prop(
        "imq.bridge.transformer.path",
        TEXT,
        None,
        "plugin folders searched for transformers before lib/ext (Python modules and jars)",
    ),
    # The STOMP bridge (Table 12-10).
    Prop("imq.bridge.stomp.hostname", TEXT, None, "overrides imq.hostname for STOMP"),
    Prop("imq.bridge.stomp.tcp.enabled", BOOL, True, "accept plain TCP connections"),
    Prop("imq.bridge.stomp.tcp.port", PORT, 7672, "TCP port"),
    Prop("imq.bridge.stomp.tls.enabled", BOOL, False, "accept TLS connections"),
    Prop("imq.bridge.stomp.tls.port", PORT, 7673, "TLS port"),
    Prop("imq.bridge.stomp.tls.requireClientAuth", BOOL, False, "TLS clients need a certificate"),
    Prop("imq.bridge.stomp.tls.certfile", TEXT, None, "PEM certificate chain of the STOMP TLS port"),
    Prop("imq.bridge.stomp.tls.keyfile", TEXT, None, "PEM private key of the STOMP TLS port"),
    Prop(
        "imq.bridge.stomp.tls.cafile",
        TEXT,
        None,
        "PEM CA certificates whose client certificates requireClientAuth accepts",
    ),
    Prop("imq.bridge.stomp.consumerFlowLimit", POSITIVE, 1000, "unacknowledged messages per transacted subscription"),
    Prop("imq.bridge.stomp.messageTransformer", CLASS_NAME, None, "MessageTransformer class"),
    # The service log (docs/operations.md, "Logs").
    Prop("imq.log.level", LOG_LEVEL, logging.INFO, "level of the service log and the console (serve -loglevel)"),
    Prop(
        "imq.log.format",
        _enum("text", "json"),
        "text",
        "text, or json: one JSON object per line (service log file and console log lines)",
    ),
    Prop(
        "imq.log.file.rolloverbytes",
        SIZE,
        -1,
        "bytes at which <instance>/log/log.txt (and spark.log) rolls over; -1 = no size limit",
    ),
    Prop(
        "imq.log.file.rolloversecs",
        LIMIT,
        LOG_ROLLOVER_SECS,
        "seconds after which <instance>/log/log.txt (and spark.log) rolls over; -1 = never by age",
    ),
    Prop(
        "imq.bridge.stomp.invalidHeaderNames",
        _enum("error", "drop", "encode"),
        "encode",
        "SEND headers that are no JMS property names: encoded (reversibly), dropped, or an ERROR",
    ),
    # The host broker.
    Prop("imq.instancename", TEXT, "imqbroker", "broker instance: names its var directory"),
    Prop("imq.hostname", TEXT, None, "host or address the broker's services listen on"),
    Prop("imq.portmapper.port", PORT, 7676, "the port mapper (admin clients start here)"),
    Prop("imq.jms.tcp.port", PORT, 0, "the jms connection service (mq:// clients); 0: any free port"),
    Prop("imq.jms.tls.enabled", BOOL, False, "also offer the jms service over TLS (ssljms, any free port)"),
    Prop("imq.jms.tls.certfile", TEXT, None, "PEM certificate chain of the ssljms service"),
    Prop("imq.jms.tls.keyfile", TEXT, None, "PEM private key of the ssljms service"),
    # Connection limits of the front ends (imq.<service>.*, see docs/operations.md).
    Prop("imq.jms.login.timeout", POSITIVE, 10, "seconds a jms connection may stay without logging in"),
    Prop("imq.jms.max_connections", POSITIVE, 1000, "open jms connections; more are refused"),
    Prop("imq.stomp.login.timeout", POSITIVE, 10, "seconds a STOMP connection may stay without logging in"),
    Prop("imq.stomp.max_connections", POSITIVE, 1000, "open STOMP connections; more are refused"),
    Prop("imq.admin.login.timeout", POSITIVE, 10, "seconds an admin connection may stay without logging in"),
    Prop("imq.admin.max_connections", POSITIVE, 1000, "open admin port connections; more are refused"),
    # The metrics port (docs/operations.md "Metrics").
    Prop(
        "imq.metrics.port",
        integer(-1, 65535),
        -1,
        "HTTP port of /metrics, /healthz, /readyz; -1 = off, 0 = any free port (the port mapper tells)",
    ),
    Prop("imq.metrics.host", TEXT, "127.0.0.1", "address the metrics port listens on (loopback only by default)"),
    Prop("imq.metrics.users", NAMES, (), "users besides group admin who may read /metrics and /readyz"),
    Prop("imq.metrics.tls.enabled", BOOL, False, "the metrics port speaks HTTPS"),
    Prop("imq.metrics.tls.certfile", TEXT, None, "PEM certificate chain of the HTTPS metrics port"),
    Prop("imq.metrics.tls.keyfile", TEXT, None, "PEM private key of the HTTPS metrics port"),
    Prop(
        "imq.metrics.login.timeout",
        POSITIVE,
        10,
        "seconds a metrics connection may take to send a request (and stay idle between them)",
    ),
    Prop("imq.metrics.max_connections", POSITIVE, 100, "open metrics port connections; more are refused"),
    # The management port (docs/console.md).
    Prop(
        "imq.console.port",
        integer(-1, 65535),
        -1,
        "HTTP port of the management REST API (/api/v1); -1 = off, 0 = any free port (the port mapper tells)",
    ),
    Prop("imq.console.host", TEXT, "127.0.0.1", "address the management port listens on (loopback only by default)"),
    Prop("imq.console.tls.enabled", BOOL, False, "the management port speaks HTTPS"),
    Prop("imq.console.tls.certfile", TEXT, None, "PEM certificate chain of the HTTPS management port"),
    Prop("imq.console.tls.keyfile", TEXT, None, "PEM private key of the HTTPS management port"),
    Prop(
        "imq.console.login.timeout",
        POSITIVE,
        10,
        "seconds a management port connection may stay without a request with good credentials",
    ),
    Prop("imq.console.max_connections", POSITIVE, 100, "open management port connections; more are refused"),
    Prop(
        "imq.console.session.timeout",
        POSITIVE,
        1800,
        "seconds a browser console session may stay unused before it ends (log in again)",
    ),
    # Connections not logged in yet, per source address (an IPv6 client's /64), per service
    # (docs/security.md "One client cannot lock everyone out").
    *(
        Prop(
            f"imq.{service}.max_unauthenticated_per_address",
            POSITIVE,
            64,
            f"{what} connections from one address that have not logged in; more are closed at once",
        )
        for service, what in (
            ("jms", "jms"),
            ("stomp", "STOMP"),
            ("admin", "admin port"),
            ("metrics", "metrics port"),
            ("console", "management port"),
            ("portmapper", "port mapper"),
        )
    ),
    Prop("imq.varhome", TEXT, None, "var directory; else $IMQ_VARHOME; else ./var"),
    Prop("imq.user_repository.file", TEXT, None, "user repository; else <instance>/etc/passwd"),
    Prop("imq.accesscontrol.enabled", BOOL, True, "check the access control file (docs/security.md)"),
    Prop(
        "imq.accesscontrol.file.filename",
        TEXT,
        None,
        "access control file, relative to <instance>/etc; else accesscontrol.properties",
    ),
    *(
        row
        for service in ("jms", "stomp", "admin")
        for row in (
            Prop(
                f"imq.{service}.accesscontrol.enabled",
                BOOL,
                None,
                f"access control for the {service} service; else imq.accesscontrol.enabled",
            ),
            Prop(
                f"imq.{service}.accesscontrol.file.filename",
                TEXT,
                None,
                f"access control file of the {service} service; else imq.accesscontrol.file.filename",
            ),
        )
    ),
    # HA broker clusters (docs/ha.md): instances sharing one jdbc store and their bridges.
    Prop("imq.cluster.ha", BOOL, False, "this broker is an instance of an HA cluster"),
    Prop("imq.cluster.clusterid", CLUSTER_ID, None, "the HA cluster's name (the same on every instance)"),
    Prop("imq.brokerid", CLUSTER_ID, None, "this instance's id in the HA cluster (unique)"),
    Prop(
        "imq.cluster.url",
        TEXT,
        None,
        "central cluster properties (file: or http:): every bridge property but the per-instance ones",
    ),
    Prop("imq.cluster.heartbeat.interval", POSITIVE, 2, "seconds between renewals of an instance's lease"),
    Prop("imq.cluster.monitor.interval", POSITIVE, 30, "seconds without renewal after which an instance is taken over"),
    Prop(
        "imq.cluster.brokerlist",
        TEXT,
        None,
        "the original's conventional cluster (not supported: an error without imq.cluster.ha, ignored with it)",
    ),
    Prop("imq.persist.store", _enum("file", "jdbc"), "file", "SQLite under var, or PostgreSQL"),
    Prop("imq.persist.file.sync.enabled", BOOL, False, "fsync every store commit"),
    Prop(
        "imq.destination.memory.window",
        POSITIVE,
        30000,
        "waiting messages a destination keeps in memory; persistent ones beyond wait in the store",
    ),
    Prop("imq.persist.jdbc.dbVendor", _enum("postgresql"), "postgresql", "database of the jdbc store"),
    Prop(
        "imq.persist.jdbc.postgresql.property.url",
        TEXT,
        None,
        "jdbc:postgresql://host:port/database of the jdbc store",
        secret=True,
    ),
    Prop("imq.persist.jdbc.postgresql.user", TEXT, None, "user of the jdbc store"),
    Prop("imq.persist.jdbc.postgresql.password", TEXT, None, "password of the jdbc store", secret=True),
    Prop(
        "imq.persist.jdbc.postgresql.needpassword",
        BOOL,
        False,
        "the jdbc store needs a password (kept for the original's files)",
    ),
    Prop("imq.autocreate.queue", BOOL, True, "create queues on first use"),
    Prop("imq.autocreate.topic", BOOL, True, "create topics on first use"),
    Prop("imq.autocreate.destination.maxNumMsgs", LIMIT, -1, "messages per destination"),
    Prop("imq.autocreate.destination.maxTotalMsgBytes", SIZE, -1, "bytes per destination"),
    Prop("imq.autocreate.destination.maxBytesPerMsg", SIZE, -1, "bytes per message"),
    Prop("imq.autocreate.destination.limitBehavior", LIMIT_BEHAVIOR, "FLOW_CONTROL", "what a full destination does"),
    Prop("imq.autocreate.destination.useDMQ", BOOL, True, "removed messages go to the DMQ"),
    Prop(
        "imq.autocreate.reaptime",
        POSITIVE,
        120,
        "HA cluster: seconds an auto-created queue stays without consumers, producers or messages before it is deleted",
    ),
    # System-wide limits and memory states (docs/operations.md, "Memory protection").
    Prop("imq.system.max_count", LIMIT, -1, "messages held in memory only, all destinations; -1 = no limit"),
    Prop(
        "imq.system.max_size",
        SIZE,
        None,
        "bytes of messages held in memory only; else a quarter of the memory budget; -1 = no limit",
    ),
    Prop("imq.message.max_size", SIZE, 70 * 1024**2, "largest message body accepted; -1 = no limit"),
    Prop(
        "imq.selector.max_size",
        SIZE,
        64 * 1024,
        "longest message selector a consumer or browser may give, in bytes; -1 = no limit",
    ),
    Prop("imq.system.max_memory", SIZE, None, "memory budget of the memory states; else the cgroup limit or MemTotal"),
    *(
        Prop(f"imq.{state}.threshold", PERCENT, threshold, f"percent of the memory budget that starts {state}")
        for state, threshold in zip(MEMORY_STATES, (0, 80, 90, 98), strict=True)
    ),
    *(
        Prop(f"imq.{state}.count", COUNT, count, f"messages per batch a producer may send in {state}")
        for state, count in zip(MEMORY_STATES, (5000, 500, 50, 0), strict=True)
    ),
    # Passfile keys: the CLIs read them; a passfile may also be given to serve.
    Prop("imq.imqbridgemgr.password", TEXT, None, "the admin CLI's password (-passfile)", secret=True),
    Prop("imq.imqusermgr.password", TEXT, None, "a new user's password (user add -passfile)", secret=True),
)

# imq.bridge.<name>.<suffix> (Table 12-2, the STOMP logfile rows, and ours for later issues).
BRIDGE_PROPS: tuple[Prop, ...] = (
    Prop("type", _enum("jms", "stomp"), None, "JMS or STOMP (either case)"),
    Prop("xmlurl", TEXT, None, "the bridge XML: a path, file: or http(s): URL"),
    Prop("autostart", BOOL, True, "start the bridge with the broker"),
    Prop("logfile.limit", COUNT, 0, "bytes per log file; 0 = no limit"),
    Prop("logfile.count", POSITIVE, 1, "log files cycled through"),
    Prop("level", LOG_LEVEL, None, "level of the bridge's log; a logging configuration file's line wins; else INFO"),
    Prop("tm.props", KEY_VALUES, {}, "XA coordinator settings; win over imq.bridge.tm.props"),
    Prop(
        "backoutThreshold",
        COUNT,
        BACKOUT_THRESHOLD,
        "backouts (redeliveries) after which a message goes to the DMQ; 0 = never",
    ),
    Prop("runner", _enum("local", "spark"), "local", "run links in threads or on Spark"),
    Prop("transaction.batchSize", POSITIVE, 1, "messages per XA transaction"),
    Prop(
        "transaction.local",
        BOOL,
        True,
        "a transacted link whose ends are one resource manager commits each unit as one "
        "local transaction (one session); false = always XA",
    ),
    Prop(
        "link.window", POSITIVE, LINK_WINDOW, "sends a non-transacted link has unconfirmed at once; 1 = wait for each"
    ),
    Prop(
        "link.windowBytes",
        BYTE_BOUND,
        LINK_WINDOW_BYTES,
        "bytes of messages at which a link's unit (and confirm window) is full, however few; -1 = count only",
    ),
)

# imq.bridge.<name>.link.<link>.<suffix>: per-link settings (jmsbridge's parallel runner).
LINK_PROPS: tuple[Prop, ...] = (
    Prop("parallelism", POSITIVE, 1, "worker processes running this non-transacted link; > 1 needs ordered=false"),
    Prop("ordered", BOOL, True, "false: the link's messages may reach the target out of order"),
)

# imq.bridge.spark.conf.<spark key>=<value>: passed to SparkConf as they are.
PREFIX_FAMILIES: tuple[Prop, ...] = (Prop("imq.bridge.spark.conf.", TEXT, None, "Spark configuration entries"),)

# tm.props keys the file transaction log understands (the chapter), with their kinds.
TM_KEYS: Mapping[str, Kind] = MappingProxyType(
    {
        "txlogSize": SIZE,
        "txlogSync": BOOL,
        "txlogMmap": BOOL,
    }
)

# Segments after imq.bridge. that are not bridge names (they start fixed keys).
RESERVED_BRIDGE_NAMES = frozenset({"enabled", "activelist", "admin", "tm", "spark", "java"})
BRIDGE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*\Z")
STOMP = "stomp"


def is_bridge_name(name: str) -> bool:
    """Usable as <name> in imq.bridge.<name>.* (and as a folder name under var)."""
    return bool(BRIDGE_NAME.match(name)) and name not in RESERVED_BRIDGE_NAMES


_FIXED = {p.key: p for p in FIXED_PROPS}
_PER_BRIDGE = {p.key: p for p in BRIDGE_PROPS}
_PER_LINK = {p.key: p for p in LINK_PROPS}


def schema_row(key: str) -> tuple[Prop, str | None] | None:
    """The schema row of ``key`` and the bridge name it is about (None if unknown)."""
    if key in _FIXED:
        return _FIXED[key], None
    for family in PREFIX_FAMILIES:
        if key.startswith(family.key) and len(key) > len(family.key):
            return family, None
    if key.startswith(BRIDGE_PREFIX):
        name, _, suffix = key[len(BRIDGE_PREFIX) :].partition(".")
        if suffix in _PER_BRIDGE and name not in RESERVED_BRIDGE_NAMES:
            return _PER_BRIDGE[suffix], name
        link, _, setting = suffix.removeprefix("link.").rpartition(".")
        if suffix.startswith("link.") and link and setting in _PER_LINK and name not in RESERVED_BRIDGE_NAMES:
            return _PER_LINK[setting], name
    return None


def is_known_key(key: str) -> bool:
    """Whether ``key`` means something: a schema key, or a key outside imq.* (a logging
    configuration file, a JVM setting). An unknown imq.* key (a misspelling) is ignored."""
    return not key.startswith(IMQ_PREFIX) or schema_row(key) is not None


def _closest_key(key: str, bridge_names: Iterable[str]) -> str | None:
    """The known key ``key`` was most likely meant to be: a fixed key, or a per-bridge
    key of an active bridge (or of the bridge ``key`` itself names)."""
    guessed, dot, _ = key[len(BRIDGE_PREFIX) :].partition(".") if key.startswith(BRIDGE_PREFIX) else ("", "", "")
    names = (({guessed} if dot else set()) | set(bridge_names)) - RESERVED_BRIDGE_NAMES
    candidates = [*_FIXED, *(f"{BRIDGE_PREFIX}{n}.{s}" for n in names for s in _PER_BRIDGE)]
    found = difflib.get_close_matches(key, candidates, n=1, cutoff=0.75)
    return found[0] if found else None


# --- reading --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Origin:
    """Where a property value came from: a file and line, or the command line."""

    source: str
    line: int | None

    @property
    def directory(self) -> Path | None:
        """The folder relative paths in this value are resolved against (files only)."""
        return None if self.source == COMMAND_LINE else Path(self.source).parent


_NEWLINES = re.compile(r"\r\n|\r|\n")


def read_properties_file(path: str | os.PathLike[str]) -> list[tuple[str, str, Origin]]:
    """(key, value, origin) for every entry of a .properties file, in file order.

    Read as UTF-8, falling back to ISO-8859-1 (Java's encoding for .properties) when
    the file is not valid UTF-8; ``\\uXXXX`` escapes work in both.
    """
    source = os.fspath(path)
    try:
        data = Path(source).read_bytes()
    except OSError as exc:
        raise ConfigError([Problem(source, None, f"cannot read the properties file: {exc.strerror or exc}")]) from None
    return parse_properties_bytes(source, data)


def parse_properties_bytes(source: str, data: bytes) -> list[tuple[str, str, Origin]]:
    """read_properties_file's work on bytes read from ``source`` (a file or a URL)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("iso-8859-1")
    _refuse_non_properties(source, data, text)
    entries: list[tuple[str, str, Origin]] = []
    line = 1
    separated = False  # some entry is key=value or key:value
    try:
        for element in javaproperties.parse(text):
            if isinstance(element, javaproperties.KeyValue):
                entries.append((element.key, element.value, Origin(source, line)))
                separated = separated or "=" in element.source or ":" in element.source
            line += len(_NEWLINES.findall(element.source))
    except javaproperties.InvalidUEscapeError as exc:
        raise ConfigError([Problem(source, line, f"{exc}; write \\u followed by four hexadecimal digits")]) from None
    if entries and not separated:
        raise ConfigError(
            [
                Problem(
                    source,
                    entries[0][2].line,
                    "not a properties file: no line is key=value or key:value (or a # comment)",
                )
            ]
        )
    return entries


def _refuse_non_properties(source: str, data: bytes, text: str) -> None:
    """ConfigError when ``data`` is plainly no properties file: a NUL byte (binary, or
    UTF-16 text), or XML/HTML (its first line that is not blank or a comment starts with <).
    javaproperties would read either as keys, silently."""
    nul = data.find(b"\0")
    if nul >= 0:
        raise ConfigError(
            [
                Problem(
                    source,
                    data.count(b"\n", 0, nul) + 1,
                    "not a properties "
                    "file: it holds a NUL byte (a binary file, or text saved as "
                    "UTF-16; save it as UTF-8 or ISO-8859-1)",
                )
            ]
        )
    for number, line in enumerate(_NEWLINES.split(text), 1):
        stripped = line.strip()
        if not stripped or stripped[0] in "#!":
            continue
        if stripped.startswith("<"):
            raise ConfigError(
                [
                    Problem(
                        source,
                        number,
                        f"not a properties file: it starts like XML "
                        f"or HTML ({shorten(stripped, 40)}); a bridge's XML file "
                        "belongs in imq.bridge.<name>.xmlurl",
                    )
                ]
            )
        return


def parse_overrides(overrides: Iterable[str]) -> tuple[list[tuple[str, str, Origin]], list[Problem]]:
    """``key=value`` strings from -D options."""
    entries, problems = [], []
    for item in overrides:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            problems.append(Problem(COMMAND_LINE, None, f"-D{clip(item)} is not key=value; write -Dkey=value"))
            continue
        entries.append((key.strip(), value, Origin(COMMAND_LINE, None)))
    return entries, problems


CLUSTER_URL = "imq.cluster.url"
# Keys each instance of an HA cluster may set for itself; every other bridge key belongs in
# the central file, so that all instances run the same bridges (the chapter's rules). Each
# instance runs its own STOMP bridge: where it listens is its own (two on one host).
PER_INSTANCE_BRIDGE_KEYS = (
    "imq.bridge.activelist",
    "imq.bridge.admin.",
    "imq.bridge.stomp.hostname",
    "imq.bridge.stomp.tcp.port",
    "imq.bridge.stomp.tls.port",
)
PER_INSTANCE_KEYS = ("imq.brokerid", "imq.bridge.activelist")
CLUSTER_URL_TIMEOUT = 10.0


def bridge_configuration(props: BrokerProperties) -> dict[str, str]:
    """What must be the same on every instance of an HA cluster: every bridge property but
    the per-instance ones (as written), imq.bridge.enabled, and a digest of each local
    bridge XML file. The service tells the cluster (providers/embedded/cluster.py) this."""
    config = {
        key: value
        for key, value in props.raw.items()
        if key.startswith(BRIDGE_PREFIX) and not key.startswith(PER_INSTANCE_BRIDGE_KEYS)
    }
    config["imq.bridge.enabled"] = str(props.enabled).lower()
    for name in props.bridge_names:
        settings = props.bridge(name)
        if settings.type != "jms" or not settings.xmlurl or "://" in settings.xmlurl:
            continue
        path = Path(settings.xmlurl.removeprefix("file:"))
        if not path.is_absolute() and settings.xml_base is not None:
            path = settings.xml_base / path
        try:
            config[f"{BRIDGE_PREFIX}{name}.xmlurl (sha256 of the file)"] = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            pass  # check and the bridge's start report an unreadable file
    return config


def read_cluster_properties(url: str, origin: Origin) -> list[tuple[str, str, Origin]]:
    """The entries of the central cluster properties file imq.cluster.url names: a
    file: or http(s): URL, or a path (relative to the file that set it)."""
    from urllib.parse import unquote, urlsplit
    from urllib.request import urlopen

    parts = urlsplit(url)
    if parts.scheme in ("http", "https"):
        try:
            with urlopen(url, timeout=CLUSTER_URL_TIMEOUT) as reply:
                data = reply.read()
        except (OSError, ValueError) as exc:
            raise ConfigError(
                [
                    Problem(
                        origin.source,
                        origin.line,
                        f"{CLUSTER_URL} {shorten(url)}: cannot read the cluster properties: {exc}",
                    )
                ]
            ) from None
        return parse_properties_bytes(url, data)
    if parts.scheme == "file":
        path = Path(unquote(parts.path))
    elif parts.scheme and len(parts.scheme) > 1:
        raise ConfigError(
            [
                Problem(
                    origin.source,
                    origin.line,
                    f"{CLUSTER_URL} is {shorten(url)}; write a file: or http(s): URL, or a path",
                )
            ]
        )
    else:
        path = Path(url)
        if not path.is_absolute() and origin.directory is not None:
            path = origin.directory / path
    return read_properties_file(path)


# --- the result -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BridgeProperties:
    """The imq.bridge.<name>.* properties of one bridge, defaults applied."""

    name: str
    type: str | None  # "jms" or "stomp", lowercased
    xmlurl: str | None
    xml_base: Path | None  # folder of the file that set xmlurl: relative paths start there
    autostart: bool
    active: bool  # named in imq.bridge.activelist
    logfile_limit: int
    logfile_count: int
    log_level: int | None  # imq.bridge.<name>.level
    tm_props: Mapping[str, str]  # imq.bridge.tm.props, then this bridge's (which win)
    backout_threshold: int
    runner: str
    transaction_batch_size: int
    transaction_local: bool  # one resource manager at both ends: a local transaction, not XA
    link_window: int  # sends a non-transacted link has unconfirmed at once (the confirm window)
    link_window_bytes: int  # bytes of messages that fill a link's unit and window; -1: no bound


@dataclass(frozen=True)
class StompProperties:
    """The STOMP bridge's settings (Table 12-10)."""

    hostname: str | None  # imq.bridge.stomp.hostname, else imq.hostname
    tcp_enabled: bool
    tcp_port: int
    tls_enabled: bool
    tls_port: int
    tls_require_client_auth: bool
    tls_certfile: str | None
    tls_keyfile: str | None
    tls_cafile: str | None
    consumer_flow_limit: int
    message_transformer: str | None
    invalid_header_names: str  # error | drop | encode
    logfile_limit: int
    logfile_count: int


@dataclass(frozen=True)
class AutocreateProperties:
    """imq.autocreate.*: whether the host broker creates destinations on first use, and the
    limits it gives them (field names as in the embedded broker's DestinationLimits)."""

    autocreate_queue: bool
    autocreate_topic: bool
    max_num_msgs: int  # -1: unlimited
    max_total_msg_bytes: int  # -1: unlimited
    max_bytes_per_msg: int  # -1: unlimited
    limit_behavior: str  # one of LIMIT_BEHAVIORS
    use_dmq: bool


@dataclass(frozen=True)
class BrokerProperties:
    """Validated broker properties: typed values plus where each came from."""

    values: Mapping[str, Any] = field(repr=False)  # every key set, parsed
    raw: Mapping[str, str] = field(repr=False)  # every key set (incl. non-bridge ones)
    origins: Mapping[str, Origin] = field(repr=False)
    warnings: tuple[Problem, ...] = ()
    environ_varhome: str | None = field(default=None, repr=False)

    def get(self, key: str) -> Any:
        """The typed value of a schema key: the set value or the default."""
        row = schema_row(key)
        if row is None:
            raise KeyError(f"{key} is not a known broker property")
        return self.values[key] if key in self.values else row[0].default

    def is_set(self, key: str) -> bool:
        return key in self.raw

    def origin(self, key: str) -> Origin | None:
        return self.origins.get(key)

    def redacted(self) -> dict[str, str]:
        """Every raw property for display and logs, secrets replaced. Unknown imq.* keys
        are hidden too: a misspelt password key must not show its password."""
        return {
            k: REDACTED if is_secret_name(k) or (k.startswith(IMQ_PREFIX) and schema_row(k) is None) else v
            for k, v in sorted(self.raw.items())
        }

    def __repr__(self) -> str:
        return f"BrokerProperties({self.redacted()!r})"

    __str__ = __repr__

    # --- grouped views ---
    @property
    def enabled(self) -> bool:
        return self.get("imq.bridge.enabled")

    @property
    def activelist(self) -> tuple[str, ...]:
        return self.get("imq.bridge.activelist")

    @property
    def admin_user(self) -> str | None:
        return self.get("imq.bridge.admin.user")

    @property
    def admin_password(self) -> str | None:
        return self.get("imq.bridge.admin.password")

    def bridge_type(self, name: str) -> str | None:
        """jms or stomp; the bridge named stomp is the STOMP bridge without saying so."""
        return self.get(f"{BRIDGE_PREFIX}{name}.type") or (STOMP if name == STOMP else None)

    @property
    def bridge_names(self) -> tuple[str, ...]:
        """The active bridges in activelist order, then other bridges with a type, sorted."""
        typed = {name for key in self.values if (row := schema_row(key)) and (name := row[1]) and key.endswith(".type")}
        active = tuple(n for n in dict.fromkeys(self.activelist) if is_bridge_name(n))
        return active + tuple(sorted(n for n in typed - set(active) if is_bridge_name(n)))

    def bridge(self, name: str) -> BridgeProperties:
        def get(suffix: str) -> Any:
            return self.get(f"{BRIDGE_PREFIX}{name}.{suffix}")

        xml_origin = self.origin(f"{BRIDGE_PREFIX}{name}.xmlurl")
        return BridgeProperties(
            name=name,
            type=self.bridge_type(name),
            xmlurl=get("xmlurl"),
            xml_base=xml_origin.directory if xml_origin else None,
            autostart=get("autostart"),
            active=name in self.activelist,
            logfile_limit=get("logfile.limit"),
            logfile_count=get("logfile.count"),
            log_level=get("level"),
            tm_props=MappingProxyType({**self.get("imq.bridge.tm.props"), **get("tm.props")}),
            backout_threshold=get("backoutThreshold"),
            runner=get("runner"),
            transaction_batch_size=get("transaction.batchSize"),
            transaction_local=get("transaction.local"),
            link_window=get("link.window"),
            link_window_bytes=get("link.windowBytes"),
        )

    def link_setting(self, bridge: str, link: str, setting: str) -> Any:
        """imq.bridge.<bridge>.link.<link>.<setting> (LINK_PROPS), its default when unset."""
        return self.get(f"{BRIDGE_PREFIX}{bridge}.link.{link}.{setting}")

    @property
    def stomp(self) -> StompProperties:
        def get(suffix: str) -> Any:
            return self.get(f"{BRIDGE_PREFIX}stomp.{suffix}")

        return StompProperties(
            hostname=get("hostname") or self.get("imq.hostname"),
            tcp_enabled=get("tcp.enabled"),
            tcp_port=get("tcp.port"),
            tls_enabled=get("tls.enabled"),
            tls_port=get("tls.port"),
            tls_require_client_auth=get("tls.requireClientAuth"),
            tls_certfile=get("tls.certfile"),
            tls_keyfile=get("tls.keyfile"),
            tls_cafile=get("tls.cafile"),
            consumer_flow_limit=get("consumerFlowLimit"),
            message_transformer=get("messageTransformer"),
            invalid_header_names=get("invalidHeaderNames"),
            logfile_limit=get("logfile.limit"),
            logfile_count=get("logfile.count"),
        )

    @property
    def autocreate(self) -> AutocreateProperties:
        def get(suffix: str) -> Any:
            return self.get(f"imq.autocreate.{suffix}")

        return AutocreateProperties(
            autocreate_queue=get("queue"),
            autocreate_topic=get("topic"),
            max_num_msgs=get("destination.maxNumMsgs"),
            max_total_msg_bytes=get("destination.maxTotalMsgBytes"),
            max_bytes_per_msg=get("destination.maxBytesPerMsg"),
            limit_behavior=get("destination.limitBehavior"),
            use_dmq=get("destination.useDMQ"),
        )

    @property
    def spark_conf(self) -> dict[str, str]:
        """imq.bridge.spark.conf.<key> entries as SparkConf keys and values."""
        prefix = PREFIX_FAMILIES[0].key
        return {k[len(prefix) :]: v for k, v in self.values.items() if k.startswith(prefix)}

    @property
    def var_home(self) -> Path:
        """imq.varhome, else $IMQ_VARHOME, else ./var (relative to the current directory)."""
        return Path(self.get("imq.varhome") or self.environ_varhome or DEFAULT_VARHOME)

    @property
    def instance_dir(self) -> Path:
        return self.var_home / "instances" / self.get("imq.instancename")

    def bridge_dir(self, name: str) -> Path:
        """IMQ_VARHOME/instances/<instance>/bridges/<name>: the bridge's logs and txlog."""
        return self.instance_dir / "bridges" / name


# --- loading and the checks across properties --------------------------------------------


def load_properties(
    files: Sequence[str | os.PathLike[str]] = (),
    overrides: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> BrokerProperties:
    """Read ``files`` (later ones win), apply ``-D`` ``overrides``, validate everything.

    Raises ConfigError listing every problem of every file; warnings alone are logged
    and kept in ``BrokerProperties.warnings``.
    """
    props, problems = parse_properties(files, overrides, environ)
    raise_if_errors(problems)
    for warning in props.warnings:
        log.warning("%s", warning)
    return props


def parse_properties(
    files: Sequence[str | os.PathLike[str]] = (),
    overrides: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> tuple[BrokerProperties, list[Problem]]:
    """Like load_properties, but never raises: wrong values are left out (their defaults
    apply) and every problem is returned, so a checker can go on to the bridges."""
    environ = os.environ if environ is None else environ
    problems: list[Problem] = []
    entries: list[tuple[str, str, Origin]] = []
    for path in files:
        try:
            entries += read_properties_file(path)
        except ConfigError as exc:
            problems += exc.problems
    cli_entries, cli_problems = parse_overrides(overrides)
    entries += cli_entries
    problems += cli_problems
    cluster_url = [(value, origin) for key, value, origin in entries if key == CLUSTER_URL]
    if cluster_url:  # the central file first: this broker's own files and -D win over it
        try:
            entries = read_cluster_properties(*cluster_url[-1]) + entries
        except ConfigError as exc:
            problems += exc.problems

    raw: dict[str, str] = {}
    origins: dict[str, Origin] = {}
    for key, value, origin in entries:
        raw[key], origins[key] = value, origin

    values: dict[str, Any] = {}
    unknown: list[str] = []
    for key, value in raw.items():
        row = schema_row(key)
        if row is None:
            if key.startswith(IMQ_PREFIX):
                unknown.append(key)
            continue
        prop = row[0]
        try:
            values[key] = prop.kind.parse(value)
        except ValueError:
            secret = prop.secret or is_secret_name(key)
            shown = "a value that is not shown" if secret else shorten(value)
            origin = origins[key]
            problems.append(Problem(origin.source, origin.line, f"{key} is {shown}; {prop.kind.expected}"))
    props = BrokerProperties(
        MappingProxyType(values), MappingProxyType(raw), MappingProxyType(origins), (), environ.get(VARHOME_ENV) or None
    )
    problems += _unknown_key_warnings(unknown, props)
    problems += _cross_checks(props)
    warnings = tuple(p for p in problems if p.severity == "warning")
    return dataclasses.replace(props, warnings=warnings), problems


def _problem(props: BrokerProperties, key: str, message: str, severity: Severity = "error") -> Problem:
    origin = props.origin(key) or Origin(COMMAND_LINE, None)
    return Problem(origin.source, origin.line, message, severity)


def _unknown_key_warnings(keys: list[str], props: BrokerProperties) -> list[Problem]:
    names = [n for n in props.activelist if is_bridge_name(n)]
    found = []
    for key in keys:
        closest = _closest_key(key, names)
        hint = f"did you mean {closest}?" if closest else "it is ignored"
        found.append(_problem(props, key, f"unknown property {key}; {hint}", "warning"))
    return found


def _cross_checks(props: BrokerProperties) -> list[Problem]:
    """What single values cannot show: names, types and xmlurls of bridges, tm.props keys."""
    found: list[Problem] = []
    active_key = "imq.bridge.activelist"
    seen: set[str] = set()
    for name in props.activelist:
        if name in seen:
            found.append(
                _problem(props, active_key, f"bridge {name} is listed twice in {active_key}; list it once", "warning")
            )
        seen.add(name)
        if not is_bridge_name(name):
            found.append(
                _problem(
                    props,
                    active_key,
                    f"{shorten(name)} in {active_key} is not a "
                    "usable bridge name; use letters, digits, _ and - (not "
                    + ", ".join(sorted(RESERVED_BRIDGE_NAMES))
                    + ")",
                )
            )
        elif props.bridge_type(name) is None:
            found.append(
                _problem(
                    props,
                    active_key,
                    f"bridge {name} is in {active_key} but "
                    f"{BRIDGE_PREFIX}{name}.type is not set; set it to jms or stomp",
                )
            )
    bridge_keys: dict[str, str] = {}
    for key in props.values:
        row = schema_row(key)
        if row and row[1] is not None:
            bridge_keys.setdefault(row[1], key)
    for name, first_key in sorted(bridge_keys.items()):
        found += _bridge_checks(props, name, first_key)
    for key in props.values:
        row = schema_row(key)
        if row and row[0].kind is KEY_VALUES:
            found += _tm_props_checks(props, key)
    if props.enabled and not props.admin_user:
        found.append(
            _problem(
                props,
                "imq.bridge.enabled",
                "imq.bridge.enabled is true but "
                "imq.bridge.admin.user is not set; imqbridgemgr cannot log in "
                "until it is",
                "warning",
            )
        )
    if props.activelist and not props.enabled:
        found.append(
            _problem(
                props,
                active_key,
                f"{active_key} names bridges but imq.bridge.enabled is not true; no bridge will run",
                "warning",
            )
        )
    found += _cluster_checks(props)
    thresholds = [props.get(f"imq.{state}.threshold") for state in MEMORY_STATES]
    if thresholds != sorted(thresholds):
        found.append(
            _problem(
                props,
                "imq.yellow.threshold",
                "the memory thresholds must rise from green "
                "to red: imq.green/yellow/orange/red.threshold are " + "/".join(map(str, thresholds)),
            )
        )
    url_key = "imq.persist.jdbc.postgresql.property.url"
    if props.get("imq.persist.store") == "jdbc" and not props.get(url_key):
        found.append(
            _problem(
                props,
                "imq.persist.store",
                f"{url_key} is not set, and imq.persist.store=jdbc needs it: jdbc:postgresql://host:port/database",
            )
        )
    return found


def _cluster_checks(props: BrokerProperties) -> list[Problem]:
    """An HA instance (imq.cluster.ha=true) needs a cluster id, a broker id and the jdbc
    store; its bridge properties come from the central file only (the same on every
    instance), which must not set what is per instance."""
    found: list[Problem] = []
    central = props.origin(CLUSTER_URL)
    for key in PER_INSTANCE_KEYS:
        if _from_central(props, key):
            found.append(
                _problem(
                    props,
                    key,
                    f"{key} is set in the cluster properties ({CLUSTER_URL}); set it in each broker's own properties",
                )
            )
    brokerlist = "imq.cluster.brokerlist"
    if props.get(brokerlist) and not props.get("imq.cluster.ha"):
        found.append(
            _problem(
                props,
                brokerlist,
                f"{brokerlist} is set but imq.cluster.ha is not true: the conventional cluster "
                "model (brokers that route messages to each other, no shared store) is not "
                "supported, so this broker would run alone and a message sent to it would reach "
                "only its own consumers and bridges; remove the property, or make the brokers an "
                "HA cluster (imq.cluster.ha=true, a shared jdbc store: docs/ha.md)",
            )
        )
    if not props.get("imq.cluster.ha"):
        return found
    ha_key = "imq.cluster.ha"
    if props.get(brokerlist):
        found.append(
            _problem(
                props,
                brokerlist,
                f"{brokerlist} is ignored in an HA cluster: its instances find each other in the shared store",
                "warning",
            )
        )
    for key in ("imq.cluster.clusterid", "imq.brokerid"):
        if not props.get(key):
            found.append(
                _problem(props, ha_key, f"imq.cluster.ha is true but {key} is not set; set it (letters, digits and _)")
            )
    if props.get("imq.persist.store") != "jdbc":
        found.append(
            _problem(
                props,
                ha_key,
                "imq.cluster.ha is true but imq.persist.store is not "
                "jdbc; the instances of an HA cluster share one PostgreSQL store",
            )
        )
    if props.get("imq.cluster.heartbeat.interval") >= props.get("imq.cluster.monitor.interval"):
        found.append(
            _problem(
                props,
                "imq.cluster.heartbeat.interval",
                "imq.cluster.heartbeat.interval must be shorter than "
                "imq.cluster.monitor.interval, or live instances are taken over",
            )
        )
    if not props.enabled:
        return found
    if central is None:
        found.append(
            _problem(
                props,
                ha_key,
                f"imq.cluster.ha is true with bridges but {CLUSTER_URL} is "
                "not set; put every bridge property except imq.bridge.activelist in "
                "that central file, so every instance has the same bridges",
            )
        )
        return found
    for key in sorted(props.raw):
        if (
            key.startswith(BRIDGE_PREFIX)
            and not key.startswith(PER_INSTANCE_BRIDGE_KEYS)
            and not _from_central(props, key)
        ):
            found.append(
                _problem(
                    props,
                    key,
                    f"{key} is set for this broker only; in an HA cluster "
                    f"every bridge property but imq.bridge.activelist, imq.bridge.admin.* and the "
                    f"STOMP bridge's hostname and ports belongs in the "
                    f"cluster properties ({CLUSTER_URL}): the same on every instance",
                )
            )
    return found


def _from_central(props: BrokerProperties, key: str) -> bool:
    """Whether ``key``'s value came from the central cluster properties."""
    origin = props.origin(key)
    return origin is not None and props.origin(CLUSTER_URL) is not None and origin.source in _central_sources(props)


def _central_sources(props: BrokerProperties) -> tuple[str, ...]:
    """How the central file's entries name their source: its URL, or its path."""
    url = props.raw.get(CLUSTER_URL, "")
    central = props.origin(CLUSTER_URL)
    if url.startswith(("http:", "https:")):
        return (url,)
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(url)
    path = Path(unquote(parts.path)) if parts.scheme == "file" else Path(url)
    if not path.is_absolute() and central is not None and central.directory is not None:
        path = central.directory / path
    return (os.fspath(path),)


def _bridge_checks(props: BrokerProperties, name: str, first_key: str) -> list[Problem]:
    found: list[Problem] = []
    type_key = f"{BRIDGE_PREFIX}{name}.type"
    btype = props.bridge_type(name)
    if not BRIDGE_NAME.match(name):
        found.append(
            _problem(
                props,
                first_key,
                f"{shorten(name)} in {first_key} is not a usable bridge name; use letters, digits, _ and -",
            )
        )
    elif btype is None:
        found.append(
            _problem(
                props,
                first_key,
                f"{first_key} is set but {type_key} is not; set {type_key} or check the bridge name",
                "warning",
            )
        )
    elif btype == "jms" and name == STOMP:
        found.append(
            _problem(
                props,
                type_key,
                f"{type_key} is jms; the name stomp belongs to "
                "the STOMP bridge, so choose another name for a JMS bridge",
            )
        )
    elif btype == STOMP and name != STOMP:
        found.append(
            _problem(
                props, type_key, f"{type_key} is stomp; the STOMP bridge must be named stomp (there is one per broker)"
            )
        )
    elif btype == "jms" and not props.get(f"{BRIDGE_PREFIX}{name}.xmlurl"):
        found.append(
            _problem(props, type_key, f"JMS bridge {name} has no {BRIDGE_PREFIX}{name}.xmlurl; set it to its XML file")
        )
    return found


def _tm_props_checks(props: BrokerProperties, key: str) -> list[Problem]:
    found = []
    for tm_key, value in props.values[key].items():
        kind = TM_KEYS.get(tm_key)
        if kind is None:
            found.append(
                _problem(
                    props,
                    key,
                    f"{key} has the unknown key {shorten(tm_key)}; known keys are " + ", ".join(TM_KEYS),
                    "warning",
                )
            )
            continue
        try:
            kind.parse(value)
        except ValueError:
            found.append(_problem(props, key, f"{key} sets {tm_key} to {shorten(value)}; {kind.expected}"))
    return found
