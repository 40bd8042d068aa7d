"""The original's imq* connection factory attributes, for factories without lookup-name.

imq_settings() reads the Message Queue ConnectionFactory attributes of a factory's
<property> elements (imqAddressList and its behaviour and iterations, reconnects, default
login, client id, ping interval, connection type, consumer flow limit, ack timeout) into
IMQSettings. With an address list, AddressListFactory is the XA-capable factory the bridge
connects with (resolve.py): one mq:// client factory per address, walked as the settings say.

Rules: every attribute it cannot honour is a Problem (file and line of the <property>, its
name, never a password), so `check` and a start refuse it instead of ignoring it quietly;
unlimited iterations or attempts (-1) are refused (a connect could not be stopped).

Design notes: docs/jms-bridges.md#internals-jmsbridgeimqcfpy.
"""

from __future__ import annotations

import difflib
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..jms import naming
from ..jms.errors import BrokerMoved, JMSException, JMSSecurityException, TransportException
from ..jms.spi import XAConnectionFactory
from ..props import Problem, Severity, clip, integer, shorten

if TYPE_CHECKING:
    from .config import Property

EMBEDDED_CONTEXT = "imq.embedded"  # java.naming.factory.initial of the embedded broker
ADDRESS_LIST = "imqAddressList"
ADDRESS_LIST_BEHAVIOR = "imqAddressListBehavior"
ADDRESS_LIST_ITERATIONS = "imqAddressListIterations"
RECONNECT_ENABLED = "imqReconnectEnabled"
RECONNECT_ATTEMPTS = "imqReconnectAttempts"
RECONNECT_INTERVAL = "imqReconnectInterval"
DEFAULT_USERNAME = "imqDefaultUsername"
DEFAULT_PASSWORD = "imqDefaultPassword"
CONFIGURED_CLIENT_ID = "imqConfiguredClientID"
PING_INTERVAL = "imqPingInterval"
CONNECTION_TYPE = "imqConnectionType"
CONSUMER_FLOW_LIMIT = "imqConsumerFlowLimit"
ACK_TIMEOUT = "imqAckTimeout"
SUPPORTED = (
    ADDRESS_LIST,
    ADDRESS_LIST_BEHAVIOR,
    ADDRESS_LIST_ITERATIONS,
    RECONNECT_ENABLED,
    RECONNECT_ATTEMPTS,
    RECONNECT_INTERVAL,
    DEFAULT_USERNAME,
    DEFAULT_PASSWORD,
    CONFIGURED_CLIENT_ID,
    PING_INTERVAL,
    CONNECTION_TYPE,
    CONSUMER_FLOW_LIMIT,
    ACK_TIMEOUT,
)
# Settings of how the address list is reached: nothing to do for the in-process host broker.
LIST_ONLY = (
    ADDRESS_LIST_BEHAVIOR,
    ADDRESS_LIST_ITERATIONS,
    RECONNECT_ENABLED,
    RECONNECT_ATTEMPTS,
    RECONNECT_INTERVAL,
    PING_INTERVAL,
    CONNECTION_TYPE,
    CONSUMER_FLOW_LIMIT,
    ACK_TIMEOUT,
)
DEFAULT_FLOW_LIMIT = 100  # the mq:// client's prefetch
# What to write instead of an attribute of the original that we do not take.
INSTEAD = {
    "imqBrokerHostName": f"write {ADDRESS_LIST}=mq://host:port",
    "imqBrokerHostPort": f"write {ADDRESS_LIST}=mq://host:port",
    "imqBrokerServicePort": f"write {ADDRESS_LIST}=mqtcp://host:port",
    "imqSSLIsHostTrusted": "the broker's certificate is always verified; give its CA "
    "with the SSL_CERT_FILE environment variable",
}
DEFAULT_MQ_PORT = 7676
DEFAULT_PING_SECONDS = 30


class AddressListBehavior(str, Enum):
    PRIORITY = "PRIORITY"
    RANDOM = "RANDOM"


@dataclass(frozen=True)
class BrokerAddress:
    """One imqAddressList entry: a URL of the mq:// client, and whether it speaks TLS."""

    url: str
    tls: bool = False


@dataclass(frozen=True)
class IMQSettings:
    """What the imq* properties of a <connection-factory> without lookup-name say."""

    addresses: tuple[BrokerAddress, ...] = ()  # empty: the host broker
    behavior: AddressListBehavior = AddressListBehavior.PRIORITY
    iterations: int = 1
    reconnect_enabled: bool = False
    reconnect_attempts: int = 0
    reconnect_interval_ms: int = 3000
    default_username: str | None = None
    default_password: str | None = field(default=None, repr=False)
    client_id: str | None = None
    ping_interval_s: int = DEFAULT_PING_SECONDS
    consumer_flow_limit: int = DEFAULT_FLOW_LIMIT
    ack_timeout_ms: int | None = None  # None: the mq:// client's (10000)

    @property
    def tries_per_address(self) -> int:
        return 1 + self.reconnect_attempts if self.reconnect_enabled else 1


def parse_address(entry: str, tls: bool = False) -> BrokerAddress:
    """An OpenMQ address (``[scheme://][host][:port][/service]``, scheme mq by default) as
    our client's URL; ``tls``: imqConnectionType=TLS. ValueError says what is wrong."""
    text = entry.strip()
    if not text:
        raise ValueError("has an empty entry")
    parts = urlsplit(text if "://" in text else f"mq://{text}")
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):
        raise ValueError(
            f"entry {shorten(text)}: HTTP tunnelling is not supported; write "
            "mq://host:port (the port mapper) or mqtcp:// / mqssl://host:port"
        )
    if scheme not in ("mq", "mqtcp", "mqssl"):
        raise ValueError(
            f"entry {shorten(text)}: write mq://host:port (the port mapper), "
            "mqtcp://host:port or mqssl://host:port (the jms service itself)"
        )
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"entry {shorten(text)} has a bad port") from None
    service = parts.path.strip("/") or ("ssljms" if scheme == "mqssl" else "jms")
    if service not in ("jms", "ssljms") or parts.query or parts.fragment or parts.username:
        raise ValueError(
            f"entry {shorten(text)}: the service after the address must be jms or ssljms, and nothing else may follow"
        )
    host = parts.hostname or "localhost"
    host = f"[{host}]" if ":" in host else host
    tls = tls or scheme == "mqssl" or service == "ssljms"
    if scheme == "mq":
        return BrokerAddress(f"mq://{host}:{port if port is not None else DEFAULT_MQ_PORT}", tls)
    if port is None:
        raise ValueError(f"entry {shorten(text)}: {scheme}:// needs the jms service's port")
    return BrokerAddress(f"{'mqssl' if scheme == 'mqssl' else 'mqtcp'}://{host}:{port}", tls)


_BOOLEAN = {"true": True, "false": False}


def _did_you_mean(name: str) -> str | None:
    """The supported property ``name`` probably means (clientID, username: their imq* ones)."""
    bare = name.lower().replace(".", "").removeprefix("imq")
    for known in SUPPORTED:
        if len(bare) > 3 and known.lower().endswith(bare):
            return known
    close = difflib.get_close_matches(name, SUPPORTED, n=1)
    return close[0] if close else None


def imq_settings(
    properties: Iterable[Property], source: str = "", line: int | None = None, name: str = ""
) -> tuple[IMQSettings, list[Problem]]:
    """The settings, and a problem for each property that is not honoured (``line``: the
    <connection-factory>'s, for properties without a line of their own)."""
    values: dict[str, str] = {}
    lines: dict[str, int | None] = {}
    problems: list[Problem] = []
    where = f"connection-factory {shorten(name)}"

    def problem(prop: str, text: str, severity: Severity = "error") -> None:
        problems.append(Problem(source, lines.get(prop, line), f"{where}: {text}", severity))

    for prop in properties:
        lines[prop.name] = prop.line if prop.line is not None else line
        if prop.name in SUPPORTED:
            values[prop.name] = prop.value
            continue
        hint = INSTEAD.get(prop.name)
        if hint is None and prop.name.startswith("java.naming."):
            hint = "a JNDI environment needs lookup-name"
        known = _did_you_mean(prop.name)
        if hint is None and known:
            hint = f"did you mean {known}?"
        problem(
            prop.name,
            f"property {shorten(prop.name)} is not supported for a connection "
            f"factory without lookup-name ({hint or 'it takes ' + ', '.join(SUPPORTED)}); "
            "remove it",
        )

    def number(prop: str, lo: int, hi: int, default: int, unlimited: bool = False) -> int:
        if prop not in values:
            return default
        kind = integer(lo, hi)
        try:
            return kind.parse(values[prop])
        except ValueError:
            extra = (
                "; -1 (unlimited) is not taken: use the connection-factory's "
                'connect-attempts="-1" to retry until the bridge stops'
                if unlimited and values[prop].strip() == "-1"
                else ""
            )
            problem(prop, f"property {prop} is {shorten(values[prop])}; {kind.expected}{extra}")
            return default

    def choice(prop: str, options: dict[str, Any], default: Any) -> Any:
        """One of ``options`` (written in any case; the message shows them as keyed)."""
        if prop not in values:
            return default
        text = values[prop].strip()
        for key, value in options.items():
            if text.lower() == key.lower():
                return value
        problem(prop, f"property {prop} is {shorten(text)}; write {' or '.join(options)}")
        return default

    behavior = choice(ADDRESS_LIST_BEHAVIOR, {b.value: b for b in AddressListBehavior}, AddressListBehavior.PRIORITY)
    tls = choice(CONNECTION_TYPE, {"TCP": False, "TLS": True}, False)
    addresses: list[BrokerAddress] = []
    if ADDRESS_LIST in values:
        try:
            addresses = [parse_address(e, tls) for e in values[ADDRESS_LIST].split(",")]
        except ValueError as exc:
            problem(ADDRESS_LIST, f"property {ADDRESS_LIST} {exc}")
    else:
        for setting in LIST_ONLY:
            if setting in values:
                problem(
                    setting,
                    f"property {setting} has no effect without {ADDRESS_LIST} (the host "
                    f"broker is reached as the service's own); remove it or add "
                    f"{ADDRESS_LIST}",
                    "warning",
                )
    ping = number(PING_INTERVAL, -1, 86400, DEFAULT_PING_SECONDS)
    if DEFAULT_PASSWORD in values and DEFAULT_USERNAME not in values:
        problem(
            DEFAULT_PASSWORD,
            f"sets {DEFAULT_PASSWORD} but not {DEFAULT_USERNAME}, so the "
            f"password is not used; add {DEFAULT_USERNAME} or remove it",
            "warning",
        )
    if CONFIGURED_CLIENT_ID in values and not values[CONFIGURED_CLIENT_ID].strip():
        problem(CONFIGURED_CLIENT_ID, f"property {CONFIGURED_CLIENT_ID} is empty; give the client id or remove it")
    ack_timeout = number(ACK_TIMEOUT, 0, 86_400_000, -1)  # -1: not given (or refused above)
    settings = IMQSettings(
        addresses=tuple(addresses),
        behavior=behavior,
        iterations=number(ADDRESS_LIST_ITERATIONS, 1, 1_000_000, 1, unlimited=True),
        reconnect_enabled=choice(RECONNECT_ENABLED, _BOOLEAN, False),
        reconnect_attempts=number(RECONNECT_ATTEMPTS, 0, 1_000_000, 0, unlimited=True),
        reconnect_interval_ms=number(RECONNECT_INTERVAL, 0, 3_600_000, 3000),
        default_username=values.get(DEFAULT_USERNAME),
        default_password=values.get(DEFAULT_PASSWORD),
        client_id=values.get(CONFIGURED_CLIENT_ID, "").strip() or None,
        ping_interval_s=max(0, ping),
        consumer_flow_limit=number(CONSUMER_FLOW_LIMIT, 0, 65536, DEFAULT_FLOW_LIMIT),
        ack_timeout_ms=ack_timeout if ack_timeout >= 0 else None,
    )
    return settings, problems


def _place(url: str) -> tuple[str, str, int]:
    """An mq:// URL as (scheme, host, port) to compare: mq:// without a port is 7676."""
    parts = urlsplit(url.strip())
    try:
        port = parts.port
    except ValueError:
        port = None
    return parts.scheme.lower(), (parts.hostname or "").lower(), port or DEFAULT_MQ_PORT


class AddressListFactory(XAConnectionFactory):
    """The broker(s) of an imqAddressList through the mq:// client (XA-capable, as the
    host broker's factory is). Each connect walks the list as the settings say."""

    def __init__(self, settings: IMQSettings) -> None:
        if not settings.addresses:
            raise JMSException(f"{ADDRESS_LIST} is empty")
        self.settings = settings
        # each broker through the embedded broker's naming context for mq:// URLs;
        # heart-beats 0: the client proposes none and the service's interval applies
        client = {PING_INTERVAL: str(settings.ping_interval_s), CONSUMER_FLOW_LIMIT: str(settings.consumer_flow_limit)}
        if settings.ack_timeout_ms is not None:
            client[ACK_TIMEOUT] = str(settings.ack_timeout_ms)
        self.brokers = [
            naming.lookup(
                "XAConnectionFactory",
                {
                    naming.INITIAL_CONTEXT_FACTORY: EMBEDDED_CONTEXT,
                    naming.PROVIDER_URL: a.url,
                    CONNECTION_TYPE: "TLS" if a.tls else "TCP",
                    **client,
                },
            )
            for a in settings.addresses
        ]
        # HA cluster: the broker id our last connection reached (docs/ha.md#clients): every
        # address names it, and one that does not serve its store sends us on (BrokerMoved)
        self.home: str | None = None

    def create_connection(self, username: str | None = None, password: str | None = None) -> Any:
        """The first connection an address accepts; a refused login fails at once (the
        other addresses would refuse it too), TransportException when none answered."""
        s = self.settings
        order = list(self.brokers)
        last: dict[str, str] = {}
        tried = 0
        for _ in range(s.iterations):
            if s.behavior is AddressListBehavior.RANDOM:
                random.shuffle(order)
            for broker in order:
                for attempt in range(s.tries_per_address):
                    if attempt:
                        time.sleep(s.reconnect_interval_ms / 1000)
                    tried += 1
                    try:
                        return self._connect(broker, username, password)
                    except JMSSecurityException:
                        raise
                    except JMSException as exc:
                        last[broker.url] = f"{type(exc).__name__}: {clip(str(exc), 200)}"
        raise TransportException(
            f"no broker of {ADDRESS_LIST} accepted a connection ({tried} attempt(s)): {'; '.join(last.values())}"
        )

    def _connect(self, broker: Any, username: str | None, password: str | None) -> Any:
        """A connection through ``broker`` (one address), or through the address of ours
        that serves our home broker's store when ``broker`` says it does not."""
        if hasattr(broker, "home"):
            broker.home = self.home
        try:
            conn = broker.create_connection(username, password)
        except BrokerMoved as moved:
            there = {_place(url) for url in moved.urls.split(",") if url.strip()}
            target = next((b for b in self.brokers if _place(b.url) in there), None)
            if target is None:
                raise
            target.home = self.home
            conn = target.create_connection(username, password)
        self.home = getattr(conn, "broker", None) or self.home
        return conn

    create_xa_connection = create_connection

    def __repr__(self) -> str:
        return f"AddressListFactory({', '.join(a.url for a in self.settings.addresses)})"
