"""The Bridge Service Manager process: broker properties -> the host broker, its
network front ends and its bridges; run until told to stop, then stop cleanly.

start() locks the instance directory, reads the access control files, opens the embedded
host broker (open_host_broker: the HostBroker every front end and bridge is given), starts
the network loop, the port mapper, the metrics port and the jms connection service, then,
when imq.bridge.enabled is true, the admin port and every bridge of imq.bridge.activelist.
dispatch() carries out admin commands (_BRIDGE_OPS, _LINK_OPS: bridge and link methods); SIGHUP
(reload) reads the properties and the XML of every stopped JMS bridge again, applies the log
levels and starts and stops the bridges the activelist adds and drops; stop() stops
the bridges, then the front ends, then the broker. In an HA cluster the ownership table
decides which JMS bridges this instance runs (providers/embedded/cluster.py).

Rules: a second service on the same var directory refuses to start; bridges start each on
its own thread, so one that cannot connect holds up no other, and one that fails to start
is logged and left STOPPED; a bridge XML that does not read cleanly at SIGHUP is logged
with file and line and the bridge keeps what it had; other changed properties wait for a
restart; every stop is bounded (STOP_TIMEOUT per bridge).

Design notes: docs/operations.md#internals-servicepy.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import fcntl
import logging
import os
import re
import signal
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable
from types import MappingProxyType
from typing import IO, TYPE_CHECKING, Any, Protocol

from .admin.protocol import (
    BAD_REQUEST,
    BROKER_COMMANDS,
    DMQ_MOVES,
    DST_COMMANDS,
    ERROR,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    OK,
    TXN_COMMANDS,
    UNAVAILABLE,
    Command,
    Reply,
)
from .guard import LoginThrottle, ServiceGuard
from .jms.errors import IllegalStateException, JMSException, StoreError, TransportException
from .jms.hostbroker import DestinationAttributes, Principal
from .netloop import NetLoop
from .private import DIR_MODE, open_private_text, private_dir, tighten
from .props import BrokerProperties, ConfigError, bridge_configuration, is_known_key
from .providers.embedded.host import EmbeddedHostBroker, open_host_broker

if TYPE_CHECKING:
    from .jmsbridge.config import BridgeConfig
    from .jmsbridge.logs import BridgeLog
    from .logfiles import ServiceLog
    from .providers.embedded.cluster import HACluster
    from .providers.embedded.clustercatalog import ClusterDestinations
    from .providers.embedded.clusterdst import ClusterQueues
    from .providers.embedded.clusterxa import ClusterXA
    from .users import User

log = logging.getLogger(__name__)

STOP_TIMEOUT = 30.0
SIGNAL_LOOK = 0.1  # s between run()'s looks at what a signal asked (signal handlers set flags)
ADMIN_START_WAIT = 5.0  # an admin start is answered within this (the CLI waits 10 s by default)


class ServiceError(Exception):
    """The service cannot start (the instance is locked, the store cannot open)."""


class ManagedBridge(Protocol):
    """What the service needs of a bridge (JMS or STOMP)."""

    name: str
    type: str

    @property
    def state(self) -> Any: ...
    def start(self) -> Any: ...
    def stop(self) -> Any: ...
    def info(self) -> dict[str, Any]: ...


# admin op -> method name on the bridge (bridge commands) / on the JMS bridge (link commands)
_BRIDGE_OPS = {"START": "start", "STOP": "stop", "PAUSE": "pause", "RESUME": "resume"}
_LINK_OPS = {"START": "start_link", "STOP": "stop_link", "PAUSE": "pause_link", "RESUME": "resume_link"}
# a link command took effect when the link is in one of these states afterwards
_LINK_OP_STATES = {
    "START": {"STARTED", "STARTING"},
    "RESUME": {"STARTED", "STARTING", "RESUMING"},
    "PAUSE": {"PAUSED", "PAUSING"},
    "STOP": {"STOPPED", "STOPPING"},
}


def _last_error(bridge: Any, link: str) -> str:
    """ "; <the link's last error>" (its first line), or "" when it has none."""
    try:
        error = bridge.link(link).counters.last_error
    except Exception:  # not a JMS bridge's link
        return ""
    return f"; {error.splitlines()[0][:300]}" if error else ""


class BridgeServiceManager:
    def __init__(
        self,
        props: BrokerProperties,
        *,
        bridge_factories: dict[str, BridgeFactory] | None = None,
        read_properties: Callable[[], BrokerProperties] | None = None,
        service_log: ServiceLog | None = None,
    ) -> None:
        """``read_properties``: the properties as they are now (their files read again),
        for SIGHUP; without it a reload keeps ``props`` and rereads only the XML files.
        ``service_log``: the service log serve opened (SIGHUP sets its level)."""
        self.props = props
        self.read_properties = read_properties
        self.service_log = service_log
        self.bridge_configs: dict[str, BridgeConfig] = {}  # JMS bridges' XML as last read
        self.instance_dir = props.instance_dir
        self.host_broker: EmbeddedHostBroker | None = None  # what every front end is given
        self.netloop: NetLoop | None = None
        self.portmapper: Any = None
        self.jms_services: list[Any] = []
        self.admin: Any = None
        self.metrics: Any = None  # the metrics port (metricshttp.MetricsServer), when on
        self.console: Any = None  # the management port (console/server.py), when on
        self.users: Any = None
        self.login_throttle = LoginThrottle()  # every front end's: guesses count across services
        self.bridges: dict[str, ManagedBridge] = {}
        self.bridge_factories = bridge_factories or default_bridge_factories()
        self.on_bridge_started: Callable[[ManagedBridge], None] | None = None
        self._starts: list[_Start] = []  # starts under way (and the last ones that ended)
        self._closing = threading.Event()  # stop() has begun: starts ending now go unreported
        self._lock_file: IO[str] | None = None
        self._stop = threading.Event()
        self._reload = threading.Event()
        # what a signal asked, as plain flags: a handler runs on the main thread between two
        # bytecodes, maybe inside run()'s Event.wait holding the Event's lock, and an
        # Event.set there waited for that lock forever (a SIGTERM once left serve running)
        self._stop_signalled = self._reload_signalled = False
        self.cluster: HACluster | None = None  # imq.cluster.ha: the HA cluster's membership
        self.cluster_queues: ClusterQueues | None = None  # ... and its cluster-wide queues
        self.cluster_destinations: ClusterDestinations | None = None  # ... and destinations (Table 4-2)
        self.cluster_xa: ClusterXA | None = None  # ... and XA branches
        self.activelist = props.activelist  # in an HA cluster: after the ownership rules
        self.taken_over_by: str | None = None  # HA: what replaced this instance's generation

    # --- start ---------------------------------------------------------------------------
    def start(self) -> None:
        private_dir(self.instance_dir)
        tighten(self.instance_dir, DIR_MODE)  # made by an older version, or by hand
        self._lock_instance()
        try:
            self._join_cluster()
            self._open_broker()
            if self.cluster is not None:
                assert self.host_broker is not None
                self.cluster.attach(self.host_broker)
                self._serve_cluster_queues()
            if self.props.enabled:
                self._guard_bridge_names()
            self._open_front_ends()
            if self.props.enabled:
                from .providers.java import configure_from_properties

                configure_from_properties(self.props)  # imq.bridge.java.classpath, lib/ext
                self._load_bridges()
            else:
                log.info("imq.bridge.enabled is false: no bridges, no admin port")
            if self.cluster is not None:  # heart-beats whether or not bridges run here
                wanted = self._cluster_bridges(self.props.activelist) if self.props.enabled else []
                self.cluster.start(self._took_over, self._lost_lease, self._owned, wanted)
        except BaseException:
            self.stop()
            raise

    @property
    def host(self) -> str:
        """Where every front end listens: imq.hostname, else loopback only (set
        imq.hostname=0.0.0.0 to listen on every interface)."""
        return self.props.get("imq.hostname") or "127.0.0.1"

    def _open_broker(self) -> None:
        from .accesscontrol import AccessControlError, open_access_controls

        try:
            access = open_access_controls(self.props)
        except AccessControlError as exc:
            raise ServiceError(f"access control: {exc}") from None
        if not access:
            log.warning(
                "access control is off (imq.accesscontrol.enabled=false): every user may "
                "use every destination, the bridges' DMQs included"
            )
        generation = self.cluster.generation if self.cluster is not None else None
        host_broker = self.host_broker = open_host_broker(self.props, access or None, generation)
        log.info(
            "host broker %s started, store %s (fsync %s)",
            host_broker.instance_name,
            host_broker.store_location() or "-",
            "on" if host_broker.fsync else "off",
        )

    def _open_front_ends(self) -> None:
        from .admin.portmapper import PortMapper, ServiceEntry

        self.netloop = NetLoop().start()
        host = self.host
        throttle = self.login_throttle
        self.portmapper = PortMapper(
            self.netloop,
            host,
            self.props.get("imq.portmapper.port"),
            self.props.get("imq.instancename"),
            self.props.get("imq.portmapper.max_unauthenticated_per_address"),
        ).start()
        from .servicekeys import dmq_key, ensure_service_account
        from .users import UserRepositoryError, open_repository

        self.users = open_repository(self.props)
        assert self.host_broker is not None  # opened first (start)
        # Spark links and CLI jobs log in as the service account; it may use what the
        # bridges reserve on the host broker. The DMQ marker key exists from the first start.
        try:
            account, _ = ensure_service_account(self.props, self.users)
            self.host_broker.set_service_users({account})
        except UserRepositoryError as exc:
            log.error("the service account cannot be set up, so Spark links and CLI jobs cannot log in: %s", exc)
        dmq_key(self.props)
        self._open_metrics()
        self._open_console()
        tls = self._tls("imq.jms.tls") if self.props.get("imq.jms.tls.enabled") else None
        for port, ctx in ((self.props.get("imq.jms.tcp.port"), None),) + (((0, tls),) if tls else ()):
            service = self.host_broker.jms_service(
                self.netloop,
                host,
                port,
                ssl_context=ctx,
                authenticator=self._jms_login,
                guard=ServiceGuard.from_props(self.props, "jms", throttle),
                brokerid=self.cluster.brokerid if self.cluster is not None else None,
                locate=self._locate if self.cluster is not None else None,
            )
            self.jms_services.append(service.start())
            self.portmapper.register(service.service_entry())
        if self.cluster is not None:  # where clients reach us: told to those of a broker we take over
            self.cluster.advertise(self._client_urls())
        if not self.props.enabled:
            return
        user, password = self.props.admin_user, self.props.admin_password
        if not (user and password):
            log.error(
                "the admin port stays closed: set imq.bridge.admin.user and "
                "imq.bridge.admin.password (or give -passfile)"
            )
            return
        from .admin.server import AdminServer

        tls = self._tls("imq.bridge.admin.tls") if self.props.get("imq.bridge.admin.tls.enabled") else None
        self.admin = AdminServer(
            self.netloop,
            self.dispatch,
            user,
            password,
            host=host,
            port=self.props.get("imq.bridge.admin.port"),
            ssl_context=tls,
            guard=ServiceGuard.from_props(self.props, "admin", throttle),
            admit=self._admin_admit,
        ).start()
        self.portmapper.register(
            ServiceEntry("bridgeadmin", "tls" if self.admin.secure else "tcp", "ADMIN", self.admin.port)
        )

    def _open_metrics(self) -> None:
        """The metrics port (imq.metrics.port; -1, the default: none), listed by the port
        mapper as ``metrics``."""
        port = self.props.get("imq.metrics.port")
        if port < 0:
            return
        from .admin.portmapper import ServiceEntry
        from .metrics import CONTENT_TYPE, readiness, registry, scrape
        from .metricshttp import MetricsServer, Pages

        assert self.netloop is not None and self.portmapper is not None
        reg = registry(self)
        pages = Pages(lambda: (scrape(reg), CONTENT_TYPE), lambda: readiness(self))
        tls = self._tls("imq.metrics.tls") if self.props.get("imq.metrics.tls.enabled") else None
        self.metrics = MetricsServer(
            self.netloop,
            pages,
            self.users.authenticate,
            self._metrics_admit,
            host=self.props.get("imq.metrics.host"),
            port=port,
            ssl_context=tls,
            guard=ServiceGuard.from_props(self.props, "metrics", self.login_throttle),
        ).start()
        self.portmapper.register(
            ServiceEntry("metrics", "https" if self.metrics.secure else "http", "METRICS", self.metrics.port)
        )

    def _open_console(self) -> None:
        """The management port (imq.console.port; -1, the default: none), listed by the
        port mapper as ``console``: the REST API over ``dispatch``, the admin port's commands."""
        port = self.props.get("imq.console.port")
        if port < 0:
            return
        from .admin.portmapper import ServiceEntry
        from .extras import require

        require("the management port (imq.console.port)", "starlette", "uvicorn", error=ServiceError)
        from .console.api import ConsoleAPI, Operations
        from .console.server import ConsoleServer
        from .console.sessions import SessionStore

        assert self.netloop is not None and self.portmapper is not None
        ops = Operations(
            self.dispatch,
            self.users.authenticate,
            self.users.verified,
            self._console_may_act,
            self._redacted,
            self.read_now,
        )
        tls = self._tls("imq.console.tls") if self.props.get("imq.console.tls.enabled") else None
        self.console = ConsoleServer(
            self.netloop,
            ConsoleAPI(ops, self.login_throttle, SessionStore(self.props.get("imq.console.session.timeout"))).app(),
            host=self.props.get("imq.console.host"),
            port=port,
            ssl_context=tls,
            guard=ServiceGuard.from_props(self.props, "console", self.login_throttle),
        ).start()
        self.portmapper.register(
            ServiceEntry("console", "https" if self.console.secure else "http", "CONSOLE", self.console.port)
        )

    def _redacted(self) -> dict[str, str]:
        """The properties in force now (SIGHUP may have changed some), secrets redacted."""
        return self.props.redacted()

    def _console_may_act(self, user: User, peer: str) -> str | None:
        """Who may change things on the management port: group admin, and the users the
        access rules let use the admin service (connection.ADMIN); others only read."""
        if user.group == "admin":
            return None
        access = self.host_broker.access if self.host_broker is not None else None
        if access is not None and access.get("admin") is not None:
            try:
                access.check_connection(Principal(user.name, frozenset({user.group}), peer, "admin"))
                return None
            except JMSException:
                pass
        return (
            f"user {user.name!r} may only read: changes need group admin "
            "(or connection.ADMIN of the access control file)"
        )

    def _metrics_admit(self, user: User) -> str | None:
        """Who may read the metrics port: group admin, and the users of imq.metrics.users
        (the page names every bridge, link and destination)."""
        if user.group == "admin" or user.name in self.props.get("imq.metrics.users"):
            return None
        return f"user {user.name!r} may not read metrics: only group admin and the users named in imq.metrics.users may"

    def _jms_login(self, user: str | None, password: str | None) -> Principal | None:
        """A jms client's login: its Principal, with its group from the user repository."""
        found = self.users.authenticate(user, password)
        return None if found is None else Principal(found.name, frozenset({found.group}), service="jms")

    def _admin_admit(self, user: str, peer: str) -> str | None:
        """Why the admin service's access rules (connection.ADMIN) refuse ``user``, or None.
        The configured admin user counts as group admin unless the repository says otherwise."""
        access = self.host_broker.access if self.host_broker is not None else None
        if access is None or access.get("admin") is None:
            return None
        found = self.users.get(user)
        groups = frozenset({found.group if found is not None else "admin"})
        try:
            access.check_connection(Principal(user, groups, peer, "admin"))
        except JMSException as exc:
            return str(exc)
        return None

    def _guard_bridge_names(self) -> None:
        """Before any port opens: the DMQs of the activelist's JMS bridges are admin-only
        and their client ids and durable subscriptions reserved, so that no client takes
        them in the moment before the bridges load (loading reads each XML again and
        renews both; a bridge whose XML cannot be read is reported then)."""
        from .jmsbridge.config import load_bridge
        from .jmsbridge.resolve import host_client_names

        assert self.host_broker is not None  # opened first (start)
        for name in self.activelist:
            if (self.props.bridge_type(name) or "").lower() != "jms":
                continue
            try:
                config = load_bridge(self.props, name)
            except (JMSException, ConfigError, OSError, ValueError):
                continue
            self.protect_dmqs(config)
            self.host_broker.reserve(name, *host_client_names(config))

    def protect_dmqs(self, config: BridgeConfig) -> None:
        """The destinations JMS bridge ``config`` names as its <dmq>s are admin-only (the
        built-in imq.bridge.jms.dmq is, by the default rules)."""
        access = self.host_broker.access if self.host_broker is not None else None
        if access is None:
            return
        from .jms.destination import Queue, Topic

        dests = []
        for dmq in config.dmqs:
            if dmq.is_builtin or dmq.destination_ref is None:
                continue
            dest = config.destination(dmq.destination_ref)
            if dest.lookup_name is None and dest.name:
                dests.append(Topic(dest.name) if dest.type.value == "topic" else Queue(dest.name))
        access.protect(dests)

    def _tls(self, prefix: str) -> ssl.SSLContext:
        """The server TLS context of ``<prefix>.certfile`` / ``<prefix>.keyfile``."""
        cert, key = self.props.get(f"{prefix}.certfile"), self.props.get(f"{prefix}.keyfile")
        if not cert:
            raise ServiceError(f"{prefix}.enabled needs {prefix}.certfile (and keyfile)")
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ctx.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise ServiceError(f"cannot load the TLS certificate {cert} ({prefix}): {exc}") from None
        return ctx

    def _load_bridges(self) -> None:
        self._load(self.activelist)
        for name, bridge in self.bridges.items():  # every bridge is listed before any starts
            if self.props.bridge(name).autostart:
                self._start_bridge(bridge, report=True)

    def _load(self, names: Iterable[str]) -> list[str]:
        """Load the bridges ``names`` (not started); those loaded (the others are logged)."""
        loaded = []
        for name in names:
            btype = (self.props.bridge_type(name) or "").lower()
            make = self.bridge_factories.get(btype)
            if make is None:
                log.error("bridge %s: imq.bridge.%s.type must be jms or stomp, not %r", name, name, btype)
                continue
            try:
                self.bridges = {**self.bridges, name: make(self, name)}
            except (JMSException, ConfigError, OSError, ValueError) as exc:
                log.error("bridge %s cannot be loaded: %s", name, exc)
                continue
            loaded.append(name)
        return loaded

    # --- HA cluster (providers/embedded/cluster.py) ---------------------------------------------
    def _join_cluster(self) -> None:
        """imq.cluster.ha: join the cluster, then the ownership rules decide which JMS bridges
        of imq.bridge.activelist run here (the STOMP bridge is every instance's own)."""
        from .providers.embedded.cluster import ClusterError, open_cluster

        try:
            self.cluster = open_cluster(
                self.props, f"{socket.gethostname()} pid {os.getpid()}", bridge_configuration(self.props)
            )
            if self.cluster is not None:  # renewed from now: a slow start is no lapse
                self.cluster.keep_alive()
            if self.cluster is not None and self.props.enabled:
                owned = self.cluster.claim(self._cluster_bridges(self.props.activelist))
                self.activelist = tuple(
                    n for n in self.props.activelist if n not in self._cluster_bridges(self.props.activelist)
                ) + tuple(owned)
        except ClusterError as exc:
            raise ServiceError(f"HA cluster: {exc}") from None

    def _serve_cluster_queues(self) -> None:
        """HA: queues are the cluster's (providers/embedded/clusterdst.py), and so are the
        destinations an administrator creates (providers/embedded/clustercatalog.py) and
        the XA branches (providers/embedded/clusterxa.py)."""
        from .providers.embedded.clustercatalog import open_cluster_destinations
        from .providers.embedded.clusterdst import open_cluster_queues
        from .providers.embedded.clusterxa import open_cluster_xa

        assert self.cluster is not None and self.host_broker is not None
        try:
            self.cluster_queues = open_cluster_queues(self.cluster, self.host_broker)
            self.cluster_destinations = open_cluster_destinations(
                self.cluster, self.host_broker, self.props.get("imq.autocreate.reaptime")
            )
            self.cluster_xa = open_cluster_xa(self.cluster, self.host_broker.broker)
        except StoreError as exc:
            raise ServiceError(f"HA cluster: {exc}") from None

    def _cluster_bridges(self, names: Iterable[str]) -> list[str]:
        """The JMS bridges among ``names``: those the ownership table assigns."""
        return [n for n in names if (self.props.bridge_type(n) or "").lower() == "jms"]

    def _owned(self, names: list[str]) -> None:
        """The cluster gave us these JMS bridges (a takeover, or a join again): load and
        start those not running here."""
        for name in names:
            if self._closing.is_set() or name in self.bridges or not self.props.enabled:
                continue
            try:
                bridge = self.bridge_factories["jms"](self, name)
            except (JMSException, ConfigError, OSError, ValueError, KeyError) as exc:
                log.error("bridge %s cannot be loaded: %s", name, exc)
                continue
            self.bridges = {**self.bridges, name: bridge}
            self._start_bridge(bridge, report=True)

    def _client_urls(self) -> str:
        """This instance as clients list it: its port mapper, then each jms service."""
        assert self.portmapper is not None
        host = self.host if self.host not in ("0.0.0.0", "::", "") else socket.getfqdn()
        host = f"[{host}]" if ":" in host else host
        urls = [f"mq://{host}:{self.portmapper.port}"]
        urls += [f"{'mqssl' if s.ssl_context else 'mqtcp'}://{host}:{s.port}" for s in self.jms_services]
        return ",".join(urls)

    def _locate(self, home: str) -> tuple[str, str] | None:
        """(the jms service, in its thread pool) where broker ``home``'s store is served."""
        from .providers.embedded.cluster import ClusterError

        assert self.cluster is not None
        try:
            return self.cluster.locate(home)
        except (ClusterError, StoreError) as exc:
            raise TransportException(str(exc)) from None

    def _took_over(self, broker: str, names: list[str]) -> None:
        catalog = self.cluster_destinations
        if catalog is not None:  # what we adopted as the catalog says (destroyed since, changed)
            try:
                catalog.reconcile()
            except StoreError as exc:
                log.warning("HA cluster: the destinations taken over from broker %s: %s", broker, exc)
        self._owned(names)

    def _lost_lease(self, replaced: str | None) -> None:
        """Our lease is gone (another instance may run our bridges now): stop and unload
        every JMS bridge before anything else touches the store. Replaced (``replaced``
        says by what: a takeover, or a new process of our broker id; our store is another's
        and every write of ours is fenced), the service stops and serve exits 1."""
        if replaced is not None:  # the one ERROR line, then the service's exit path
            log.error("%s: stopping; start it again to rejoin", replaced)
            for service in self.jms_services:  # its clients are cut first: nothing is theirs here now
                try:
                    service.stop()
                except Exception as exc:
                    log.warning("the jms service did not stop at once: %s", exc)
        for name, bridge in list(self.bridges.items()):
            if bridge.type != "JMS":
                continue
            _quietly(self._stop_bridge, name, bridge)()
            self.bridges = {k: v for k, v in self.bridges.items() if k != name}
            if self.host_broker is not None:
                self.host_broker.release(name)
        if replaced is not None:
            self.taken_over_by = replaced
            self.request_stop()

    def _start_bridge(self, bridge: ManagedBridge, report: bool = False) -> _Start:
        """Start ``bridge`` on a thread of its own; ``report``: tell on_bridge_started
        once the start has ended (for a JMS bridge: its links have connected)."""
        start = _Start(bridge, self if report else None)
        self._starts = [s for s in self._starts if s.thread.is_alive()] + [start]
        start.thread.start()
        return start

    def start_under_way(self, bridge: ManagedBridge) -> bool:
        """Has a start of ``bridge`` begun and not yet been reported as ended?"""
        return any(s.bridge is bridge and not s.ended.is_set() for s in self._starts)

    def wait_for_starts(self, timeout: float | None = None) -> None:
        """Until every start under way has ended (or ``timeout`` seconds)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for start in list(self._starts):
            start.thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _lock_instance(self) -> None:
        path = self.instance_dir / "lock"
        while True:
            handle = open_private_text(path, "a+")  # held open while the service runs: the lock
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.seek(0)
                holder = handle.read().strip() or "another process"
                handle.close()
                raise ServiceError(
                    f"{self.instance_dir} is in use by {holder}; stop that service "
                    "or give this one another imq.varhome / imq.instancename"
                ) from None
            if _same_file(handle, path):
                break
            handle.close()  # a service stopping meanwhile removed the file we locked: again
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        self._lock_file = handle

    def _unlock_instance(self) -> None:
        """The lock file removed (still locked: a start that opened it sees it gone), then
        unlocked."""
        if self._lock_file is not None:
            try:
                os.unlink(self.instance_dir / "lock")
            except OSError as exc:
                log.warning("the lock file cannot be removed: %s", exc)
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None

    # --- admin commands --------------------------------------------------------------------
    def dispatch(self, cmd: Command) -> Reply:
        """Carry out one admin command (called on a worker thread of the admin port)."""
        if cmd.op == "LIST":
            return self._list(cmd)
        if cmd.op == "CONFIG":
            return self._config(cmd)
        if cmd.op == "CLUSTER":
            return self._cluster_members()
        if cmd.op == "LIST_DMQ":
            return self._dead_messages(cmd)
        if cmd.op in DMQ_MOVES:
            return self._move_dead_messages(cmd)
        if cmd.op == "CHECK_XML":
            return self._check_xml(cmd)
        if cmd.op == "LINK_HISTORY":
            return self._link_history(cmd)
        if cmd.op in DST_COMMANDS or cmd.op in BROKER_COMMANDS:
            return self._destination(cmd)
        if cmd.op in TXN_COMMANDS:
            return self._transaction(cmd)
        bridge = self._find(cmd)
        if isinstance(bridge, Reply):
            return bridge
        table = _LINK_OPS if cmd.link else _BRIDGE_OPS
        method = getattr(bridge, table[cmd.op], None)
        what = f"link {cmd.link} of bridge {bridge.name}" if cmd.link else f"bridge {bridge.name}"
        if method is None:
            return Reply(
                NOT_IMPLEMENTED,
                f"the {bridge.type} bridge does not support {cmd.op.lower()}" + (" for links" if cmd.link else ""),
            )
        try:
            if cmd.link:
                state = method(cmd.link)
            elif cmd.op == "START":
                state = self._admin_start(bridge)
            else:
                state = method()
        except IllegalStateException as exc:
            return Reply(BAD_REQUEST, str(exc))
        except JMSException as exc:
            if exc.code == "NO_SUCH_LINK":
                return Reply(NOT_FOUND, str(exc))
            return Reply(ERROR, f"{cmd.op.lower()} {what} failed: {exc}")
        value = getattr(state, "value", state)
        if cmd.link and value not in _LINK_OP_STATES[cmd.op]:  # e.g. its Spark query did not start
            return Reply(
                ERROR,
                f"{cmd.op.lower()} {what} did not take effect: the link is {value}" + _last_error(bridge, cmd.link),
                {"state": value},
            )
        return Reply(OK, f"{what} is {getattr(state, 'value', state)}", {"state": getattr(state, "value", state)})

    def _destination(self, cmd: Command) -> Reply:
        """The dst commands, list cxn and list svc on the host broker, as the admin user."""
        if self.host_broker is None:
            return Reply(UNAVAILABLE, "the host broker is not running")
        from .dstadmin import destination_command

        auto = self.props.autocreate
        defaults = DestinationAttributes(
            auto.max_num_msgs, auto.max_total_msg_bytes, auto.max_bytes_per_msg, auto.limit_behavior, auto.use_dmq
        )
        admin = Principal(self.props.admin_user, frozenset({"admin"}), service="admin")
        services = self.portmapper.entries() if self.portmapper is not None else []
        instance = self.cluster.brokerid if self.cluster is not None else self.host_broker.instance_name
        return destination_command(
            self.host_broker, admin, cmd, defaults, services, self.cluster_destinations, instance
        )

    def _transaction(self, cmd: Command) -> Reply:
        """list|commit|rollback txn: a JMS bridge's in-doubt XA transactions, by hand."""
        from .jmsbridge.bridge import JMSBridge

        bridge = self._find(cmd)
        if isinstance(bridge, Reply):
            return bridge
        if not isinstance(bridge, JMSBridge):
            return Reply(
                BAD_REQUEST, f"bridge {bridge.name} is a {bridge.type} bridge; only a JMS bridge has XA transactions"
            )
        try:
            if cmd.op == "LIST_TXN":
                data = bridge.transactions()
                return Reply(OK, f"{len(data['transactions'])} transaction(s) in doubt", data)
            done = bridge.resolve_transaction(cmd.txn or "", cmd.op == "COMMIT_TXN")
        except ValueError as exc:
            return Reply(NOT_FOUND, str(exc))
        except (JMSException, RuntimeError) as exc:
            return Reply(ERROR, f"{cmd.op.lower().replace('_', ' ')} of bridge {bridge.name} failed: {exc}")
        return Reply(OK, f"transaction {done['id']} {'committed' if cmd.op == 'COMMIT_TXN' else 'rolled back'}", done)

    def _admin_start(self, bridge: ManagedBridge) -> Any:
        """Start ``bridge`` on its own thread; its state after at most ADMIN_START_WAIT
        seconds (STARTING while it is still connecting); a failed start raises."""
        start = self._start_bridge(bridge)
        start.thread.join(ADMIN_START_WAIT)
        if start.error is not None:
            raise start.error
        return bridge.state

    def _find(self, cmd: Command) -> ManagedBridge | Reply:
        name = cmd.bridge or (cmd.type.lower() if cmd.type == "STOMP" else None)
        if name is None:
            return Reply(BAD_REQUEST, "name the bridge (-bn)")
        bridge = self.bridges.get(name)
        if bridge is None:
            known = ", ".join(sorted(self.bridges)) or "none"
            return Reply(NOT_FOUND, f"no bridge named {name} (bridges: {known})", {"known": sorted(self.bridges)})
        if cmd.type is not None and bridge.type != cmd.type:
            return Reply(BAD_REQUEST, f"bridge {name} is a {bridge.type} bridge, not {cmd.type}")
        return bridge

    def _list(self, cmd: Command) -> Reply:
        if cmd.bridge is None:
            rows = [
                {"name": b.name, "type": b.type, "state": _value(b.state)}
                | ({"links": b.info().get("links", [])} if cmd.with_links else {})
                for b in self.bridges.values()
                if cmd.type is None or b.type == cmd.type
            ]
            if self.cluster is not None:  # every bridge of the cluster, with its owner
                try:
                    owners = self.cluster.owners()
                except StoreError as exc:
                    return Reply(UNAVAILABLE, f"the HA cluster's ownership table cannot be read: {exc}")
                for row in rows:
                    row["owner"] = owners.get(row["name"], self.cluster.brokerid)
                rows += [
                    {"name": n, "type": "JMS", "state": "-", "owner": o}
                    for n, o in owners.items()
                    if n not in self.bridges and cmd.type in (None, "JMS")
                ]
            return Reply(OK, f"{len(rows)} bridge(s)", {"bridges": rows})
        bridge = self._find(cmd)
        if isinstance(bridge, Reply):
            return bridge
        if cmd.link is not None and (one := self._link_row(bridge, cmd.link)) is not None:
            return Reply(OK, f"bridge {bridge.name}", {"bridge": self._head(bridge), "links": [one]})
        info = bridge.info()
        links = info.get("links", [])
        if cmd.link is not None:
            links = [x for x in links if x["name"] == cmd.link]
            if not links:
                known = ", ".join(x["name"] for x in info.get("links", [])) or "none"
                return Reply(NOT_FOUND, f"bridge {bridge.name} has no link {cmd.link} (links: {known})")
        head = {k: v for k, v in info.items() if k != "links"}
        return Reply(OK, f"bridge {bridge.name}", {"bridge": head, "links": links})

    def read_now(self, cmd: Command) -> Reply | None:
        """The answer to ``cmd`` when it is a read that can be given without any call that
        may block (a lock held by a link, the broker, a database): for the management port,
        which then answers on its event loop, not behind a worker thread. Today a link's
        LIST (GET .../links/{link}) while the link moves, from what its thread published
        (JMSBridge.link_info(now=True)); None: dispatch() it."""
        from .jmsbridge.bridge import JMSBridge

        if cmd.op != "LIST" or cmd.bridge is None or cmd.link is None:
            return None
        bridge = self.bridges.get(cmd.bridge)
        if not isinstance(bridge, JMSBridge) or cmd.type not in (None, bridge.type):
            return None
        try:
            row = bridge.link_info(cmd.link, now=True)
        except KeyError:
            return None
        if row is None:
            return None
        return Reply(OK, f"bridge {bridge.name}", {"bridge": self._head(bridge), "links": [row]})

    @staticmethod
    def _link_row(bridge: ManagedBridge, link: str) -> dict[str, Any] | None:
        """A JMS bridge's link ``link`` as `list link` shows it; None: not a JMS bridge's link."""
        from .jmsbridge.bridge import JMSBridge

        if not isinstance(bridge, JMSBridge):
            return None
        try:
            return bridge.link_info(link)
        except KeyError:
            return None

    @staticmethod
    def _head(bridge: ManagedBridge) -> dict[str, Any]:
        return {"name": bridge.name, "type": bridge.type, "state": _value(bridge.state)}

    def _dead_messages(self, cmd: Command) -> Reply:
        """A JMS bridge's DMQs: for each on the host broker (the built-in one, and <dmq>s
        whose connection factory means the host broker), its first ``count`` entries with
        their reason and JMS_SUN_JMSBRIDGE_* properties; the others are named only."""
        from .dstadmin import message_json
        from .jms.message import Message
        from .jmsbridge.bridge import JMSBridge
        from .jmsbridge.config import BUILTIN_DMQ_DESTINATION
        from .jmsbridge.dmq import DMQ_REASON, P
        from .jmsbridge.resolve import means_host_broker

        bridge = self._find(cmd)
        if isinstance(bridge, Reply):
            return bridge
        config = self.bridge_configs.get(bridge.name)
        if not isinstance(bridge, JMSBridge) or config is None or self.host_broker is None:
            return Reply(BAD_REQUEST, f"bridge {bridge.name} is a {bridge.type} bridge; only a JMS bridge has DMQs")
        admin = Principal(self.props.admin_user, frozenset({"admin"}), service="admin")
        dmqs: list[dict[str, Any]] = []
        count = 0
        for dmq in config.dmqs:
            queue: str | None = BUILTIN_DMQ_DESTINATION
            if not dmq.is_builtin:
                assert dmq.connection_factory_ref is not None and dmq.destination_ref is not None
                dest = config.destination(dmq.destination_ref)
                host = means_host_broker(config.connection_factory(dmq.connection_factory_ref))
                queue = dest.name if host and dest.lookup_name is None and dest.type.value == "queue" else None
            if queue is None:
                dmqs.append({"name": dmq.name, "destination": None, "entries": None})
                continue
            messages = self.host_broker.browse_destination(admin, queue, cmd.count or 1) or []
            entries = [
                {
                    "reason": m.properties.get(DMQ_REASON),
                    "bridgeProperties": {k: v for k, v in m.properties.items() if k.startswith(P)},
                    "message": message_json(m),
                    # the message that failed, as the DMQ message carries it (None: only its text)
                    "original": message_json(body) if isinstance(body := m.get_body(), Message) else None,
                }
                for m in messages
            ]
            count += len(entries)
            dmqs.append({"name": dmq.name, "destination": queue, "entries": entries})
        return Reply(OK, f"bridge {bridge.name}: {count} dead message(s) shown", {"bridge": bridge.name, "dmqs": dmqs})

    def _link_history(self, cmd: Command) -> Reply:
        """A JMS link's last hour: msg/s and mean latency per interval (LinkHistory)."""
        from .jmsbridge.bridge import JMSBridge

        bridge = self._find(cmd)
        if isinstance(bridge, Reply):
            return bridge
        if not isinstance(bridge, JMSBridge):
            return Reply(BAD_REQUEST, f"bridge {bridge.name} is a {bridge.type} bridge; only a JMS bridge has links")
        try:
            data = bridge.history(cmd.link or "")
        except JMSException as exc:
            return Reply(NOT_FOUND, str(exc))
        return Reply(OK, f"link {cmd.link} of bridge {bridge.name}: {len(data['intervals'])} interval(s)", data)

    def _check_xml(self, cmd: Command) -> Reply:
        """A dry-run check of a bridge XML as ``imqbridgemgr check FILE`` makes it (the same
        code and problems), with this service's transformer folders; nothing is started or
        looked up. 400 with the report when it has errors, as the CLI's --json."""
        from .jmsbridge.checkxml import check_bridge_xml

        report = check_bridge_xml((cmd.xml or "").encode("utf-8"), cmd.source or "bridge.xml", self.props)
        if not report.ok:
            return Reply(BAD_REQUEST, report.error_message(), report.to_json())
        return Reply(OK, f"{len(report.bridges)} bridge(s) checked: no errors", report.to_json())

    def _move_dead_messages(self, cmd: Command) -> Reply:
        """redrive|archive dmq: entries of a JMS bridge's DMQ on the host broker, named by
        JMSMessageID or all, back to their links' targets or into the DMQ's archive file
        (<instance>/dmqarchive/<bridge>/<dmq>.jsonl), each in a transaction of its own."""
        from .jmsbridge.bridge import JMSBridge
        from .jmsbridge.config import BUILTIN_DMQ
        from .jmsbridge.resolve import means_host_broker
        from .servicekeys import dmq_key
        from .spark.dmq import DMQJobError, dmq_endpoint
        from .spark.dmqmove import archive_entries, redrive_entries

        bridge = self._find(cmd)
        if isinstance(bridge, Reply):
            return bridge
        config = self.bridge_configs.get(bridge.name)
        if not isinstance(bridge, JMSBridge) or config is None or self.host_broker is None:
            return Reply(BAD_REQUEST, f"bridge {bridge.name} is a {bridge.type} bridge; only a JMS bridge has DMQs")
        name = cmd.dmq or BUILTIN_DMQ
        if name != BUILTIN_DMQ and any(q.name == name for q in config.dmqs):
            dmq = config.dmq(name)
            assert dmq.connection_factory_ref is not None
            if not means_host_broker(config.connection_factory(dmq.connection_factory_ref)):
                return Reply(
                    BAD_REQUEST, f"DMQ {name} of bridge {bridge.name} is on another broker: use imqbridgemgr dmq"
                )
        try:
            endpoint = dmq_endpoint(
                config, name, host_factory=bridge.host_factory, lookup=bridge.lookup, marker_key=dmq_key(self.props)
            )
        except DMQJobError as exc:
            return Reply(NOT_FOUND, str(exc))
        ids = None if cmd.all_entries else cmd.message_ids

        def on_host(ref: str) -> bool:
            return means_host_broker(config.connection_factory(ref))

        try:
            if cmd.op == "REDRIVE_DMQ":
                outcome = redrive_entries(endpoint, ids, on_host)
            else:
                safe = lambda text: re.sub(r"[^A-Za-z0-9_.-]|^\.", "_", text)  # noqa: E731  (a file name)
                path = self.instance_dir / "dmqarchive" / safe(bridge.name) / f"{safe(name)}.jsonl"
                outcome = archive_entries(endpoint, ids, path)
        except (JMSException, OSError) as exc:
            return Reply(ERROR, f"{cmd.op.lower().replace('_', ' ')} of bridge {bridge.name} failed: {exc}")
        data = {"bridge": bridge.name, "dmq": name, **outcome.as_dict()}
        done = "redriven" if cmd.op == "REDRIVE_DMQ" else "archived"
        failed = outcome.count("failed")
        message = f"DMQ {name} of bridge {bridge.name}: {outcome.moved} of {len(outcome.entries)} entries {done}"
        log.info("%s%s", message, f", {failed} failed" if failed else "")
        return Reply(ERROR if failed else OK, message + (f", {failed} failed" if failed else ""), data)

    def _cluster_members(self) -> Reply:
        """The HA cluster's instances, their leases, and the bridges' owners."""
        cluster = self.cluster
        if cluster is None:
            return Reply(NOT_FOUND, "this service is in no HA cluster (imq.cluster.ha is false)")
        try:
            data = cluster.members()
        except StoreError as exc:
            return Reply(UNAVAILABLE, f"the HA cluster's tables cannot be read: {exc}")
        data = {"clusterid": cluster.settings.clusterid, "instance": cluster.brokerid, **data}
        return Reply(OK, f"HA cluster {cluster.settings.clusterid}: {len(data['instances'])} instance(s)", data)

    def _config(self, cmd: Command) -> Reply:
        """What a CLI job (drain, dmq) needs to work on a JMS bridge from another process."""
        bridge = self._find(cmd)
        if isinstance(bridge, Reply):
            return bridge
        if bridge.type != "JMS":
            return Reply(
                BAD_REQUEST,
                f"bridge {bridge.name} is a {bridge.type} bridge; only a JMS bridge has a configuration to work with",
            )
        if not self.jms_services:
            return Reply(UNAVAILABLE, "the host broker's jms connection service is not running")
        from .spark.session import spark_settings

        settings = self.props.bridge(bridge.name)
        xmlurl = settings.xmlurl
        if xmlurl and "://" not in xmlurl and not xmlurl.startswith("file:") and settings.xml_base:
            xmlurl = str((settings.xml_base / xmlurl).resolve())
        from .servicekeys import SERVICE_ACCOUNT, dmq_key, service_password

        master, conf = spark_settings(self.props)
        return Reply(
            OK,
            f"bridge {bridge.name}",
            {
                "bridge": bridge.name,
                "type": bridge.type,
                "xmlurl": xmlurl,
                "runner": settings.runner,
                "backoutThreshold": settings.backout_threshold,
                "linkWindow": settings.link_window,
                "linkWindowBytes": settings.link_window_bytes,
                "jms": self.jms_url,
                "spark": {"master": master, "conf": conf},
                # the job's login on the host broker, and the key that marks dead messages
                "service": {
                    "user": SERVICE_ACCOUNT,
                    "password": service_password(self.props),
                    "dmqKey": dmq_key(self.props).hex(),
                },
            },
        )

    @property
    def jms_url(self) -> str:
        """The host broker's jms connection service, as other processes on this host reach it."""
        host = self.host if self.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        return f"mqtcp://{'[' + host + ']' if ':' in host else host}:{self.jms_services[0].port}"

    # --- running and stopping ------------------------------------------------------------------
    def handle_signals(self) -> None:
        """SIGTERM and SIGINT ask ``run()`` to stop, SIGHUP to reload, SIGQUIT prints every
        thread's stack to stderr (call from the main thread; a JVM started later leaves
        them to Python: providers/java/jvm.py's SIGNAL_OPTIONS)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._signalled_stop)
        signal.signal(signal.SIGHUP, self._signalled_reload)
        faulthandler.register(signal.SIGQUIT, file=sys.stderr, all_threads=True)

    def request_stop(self, *_: object) -> None:
        self._stop.set()

    def request_reload(self, *_: object) -> None:
        self._reload.set()

    def _signalled_stop(self, *_: object) -> None:
        self._stop_signalled = True  # (no lock in a signal handler: see __init__)

    def _signalled_reload(self, *_: object) -> None:
        self._reload_signalled = True

    def run(self) -> None:
        """Block until request_stop or a stop signal (once handle_signals was called; run()
        sees it within SIGNAL_LOOK), then stop; reload on request meanwhile."""
        try:
            while not (self._stop.wait(SIGNAL_LOOK) or self._stop_signalled):
                if self._reload_signalled or self._reload.is_set():
                    self._reload_signalled = False
                    self._reload.clear()
                    self.reload()
        finally:
            self.stop()

    def reload(self) -> None:
        """SIGHUP: the properties read again (module comment); never raises."""
        from .jmsbridge.bridge import JMSBridge

        log.info("SIGHUP: reading the properties and the XML files of stopped bridges again")
        try:
            new = self.read_properties() if self.read_properties is not None else self.props
        except ConfigError as exc:
            log.error("SIGHUP: nothing reloaded, the properties have errors:\n%s", exc)
            return
        old = self.props
        changed = {  # an unknown key is warned about by the reading, by name, and is no change
            k for k in set(old.raw) | set(new.raw) if old.raw.get(k) != new.raw.get(k) and is_known_key(k)
        }
        props, applied = self._reload_log_levels(old, new, changed)
        for name, bridge in self.bridges.items():
            if isinstance(bridge, JMSBridge) and _value(bridge.state) in ("STOPPED", "UNINITIALIZED"):
                props, applied = self._reload_bridge(bridge, props, new, changed, applied)
            elif isinstance(bridge, JMSBridge):
                log.info(
                    "SIGHUP: bridge %s is %s and keeps its configuration (stop it, then send SIGHUP again)",
                    name,
                    _value(bridge.state),
                )
        self._set_props(props)
        applied |= self._reload_activelist(new, changed)
        waiting = sorted(changed - applied)
        if waiting:
            log.warning(
                "SIGHUP: changed properties that take effect at the next start of the "
                "service (or of their bridge, after another SIGHUP): %s",
                ", ".join(waiting),
            )

    def _set_props(self, props: BrokerProperties) -> None:
        """The properties now in force, the JMS bridges' too."""
        from .jmsbridge.bridge import JMSBridge

        self.props = props
        for bridge in self.bridges.values():
            if isinstance(bridge, JMSBridge):
                bridge.props = props

    def _reload_log_levels(
        self, props: BrokerProperties, new: BrokerProperties, changed: set[str]
    ) -> tuple[BrokerProperties, set[str]]:
        """Each loaded bridge's imq.bridge.<name>.level and imq.log.level (unless serve
        -loglevel set it) take effect now, the service log last: once its line is out, every
        level is in force. The properties with them, and those keys."""
        from .logfiles import level_name

        applied = set[str]()
        for name, bridge in self.bridges.items():
            key = _level_key(name)
            set_log_level = getattr(bridge, "set_log_level", None)
            if key not in changed or set_log_level is None:
                continue
            level = new.bridge(name).log_level
            try:
                set_log_level(logging.INFO if level is None else level)
            except ConfigError as exc:  # its logging configuration file
                log.error("SIGHUP: bridge %s keeps its log level: %s", name, exc)
                continue
            log.info("SIGHUP: bridge %s logs at level %s now (%s)", name, level_name(level or logging.INFO), key)
            props, applied = _with_keys(props, new, key), applied | {key}
        if "imq.log.level" in changed and self.service_log is not None:
            level = new.get("imq.log.level")
            if self.service_log.pinned:
                log.warning(
                    "SIGHUP: imq.log.level is %s, but serve -loglevel set the service log's level: it stays",
                    level_name(level),
                )
            else:
                self.service_log.set_level(level)
                log.warning("SIGHUP: the service log is at level %s now (imq.log.level)", level_name(level))
            props, applied = _with_keys(props, new, "imq.log.level"), applied | {"imq.log.level"}
        return props, applied

    def _reload_bridge(
        self, bridge: Any, props: BrokerProperties, new: BrokerProperties, changed: set[str], applied: set[str]
    ) -> tuple[BrokerProperties, set[str]]:
        """A stopped JMS bridge's properties and XML read again: the properties with its
        keys, and the keys applied; a bridge whose XML cannot be used keeps what it had."""
        from .jmsbridge.config import load_bridge

        name = bridge.name
        prefix = f"imq.bridge.{name}."
        keys = {k for k in changed if k.startswith(prefix)}
        candidate = _with_keys(props, new, prefix)
        try:
            config = load_bridge(candidate, name)
        except (JMSException, ConfigError, OSError, ValueError) as exc:
            log.error("SIGHUP: bridge %s keeps its configuration; its XML cannot be used:\n%s", name, exc)
            return props, applied
        before = self.bridge_configs.get(name)
        self.bridge_configs[name] = config
        self.protect_dmqs(config)
        try:
            bridge.reserve()
        except JMSException as exc:
            log.error("SIGHUP: bridge %s: %s", name, exc)
        log.info(
            "SIGHUP: bridge %s reloaded from %s: %s", name, config.source, _config_changes(before, config, sorted(keys))
        )
        return candidate, applied | keys

    def _reload_activelist(self, new: BrokerProperties, changed: set[str]) -> set[str]:
        """imq.bridge.activelist changed: bridges no longer listed are stopped and unloaded,
        bridges new to it loaded (their properties as ``new`` has them) and, unless their
        autostart is false, started. In an HA cluster the ownership table decides what runs
        where: the change waits for a restart there. The keys applied."""
        key = "imq.bridge.activelist"
        if key not in changed or not self.props.enabled or self.cluster is not None:
            return set()
        gone = [n for n in self.bridges if n not in new.activelist]
        added = [n for n in new.activelist if n not in self.bridges]
        for name in gone:
            bridge = self.bridges[name]
            done = threading.Thread(target=_quietly(self._stop_bridge, name, bridge), name=f"stop:{name}")
            done.start()
            done.join(STOP_TIMEOUT)
            if done.is_alive():
                log.error("SIGHUP: bridge %s did not stop within %.0f s; unloaded anyway", name, STOP_TIMEOUT)
            self.bridges = {k: v for k, v in self.bridges.items() if k != name}
            self.bridge_configs.pop(name, None)
            if self.host_broker is not None:
                self.host_broker.release(name)
            log.info("SIGHUP: bridge %s is no longer in %s: stopped and unloaded", name, key)
        props = _with_keys(self.props, new, key)
        for name in added:
            props = _with_keys(props, new, f"imq.bridge.{name}.")
        self._set_props(props)
        self.activelist = props.activelist
        loaded = self._load(added)
        for name in loaded:
            log.info("SIGHUP: bridge %s is new in %s: loaded", name, key)
            if props.bridge(name).autostart:
                self._start_bridge(self.bridges[name], report=True)
        return {key} | {k for k in changed for n in added if k.startswith(f"imq.bridge.{n}.")}

    def stop(self) -> None:
        self._closing.set()
        cluster = self.cluster
        if cluster is not None:  # no takeover starts bridges while they stop
            cluster.halt()
        for name, bridge in reversed(list(self.bridges.items())):
            done = threading.Thread(target=_quietly(self._stop_bridge, name, bridge), name=f"stop:{name}")
            done.start()
            done.join(STOP_TIMEOUT)
            if done.is_alive():
                log.error("bridge %s did not stop within %.0f s; going on", name, STOP_TIMEOUT)
            if self.host_broker is not None:
                self.host_broker.release(name)  # unloaded: its client ids and durables are free
        self.bridges = {}
        if self.admin is not None:
            self.admin.stop()
            self.admin = None
        if self.metrics is not None:
            self.metrics.stop()
            self.metrics = None
        if self.console is not None:
            self.console.stop()
            self.console = None
        for service in self.jms_services:
            service.stop()
        self.jms_services = []
        if self.portmapper is not None:
            self.portmapper.stop()
            self.portmapper = None
        if self.netloop is not None:
            self.netloop.stop()
            self.netloop = None
        if self.cluster_xa is not None:
            self.cluster_xa.stop()
            self.cluster_xa = None
        if self.cluster_destinations is not None:
            self.cluster_destinations.stop()
            self.cluster_destinations = None
        if self.cluster_queues is not None:
            self.cluster_queues.stop()
            self.cluster_queues = None
        if self.host_broker is not None:
            log.info("stopping the host broker")
            host_broker, self.host_broker = self.host_broker, None
            host_broker.close()
        if cluster is not None:  # after the store's last batch: then a live instance may take over
            cluster.leave()
            self.cluster = None
        self._unlock_instance()

    def _stop_bridge(self, bridge: ManagedBridge) -> None:
        """Stop ``bridge``, cancelling a start under way; once that start has returned,
        stop again what it may have finished after the first stop."""
        bridge.stop()
        starts = [s for s in list(self._starts) if s.bridge is bridge and s.thread.is_alive()]
        for start in starts:
            start.thread.join(STOP_TIMEOUT)
        if starts:
            bridge.stop()

    def __enter__(self) -> BridgeServiceManager:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _same_file(handle: IO[str], path: os.PathLike[str]) -> bool:
    """Is the open ``handle`` still the file at ``path``?"""
    try:
        there = os.stat(path)
    except FileNotFoundError:
        return False
    here = os.fstat(handle.fileno())
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _value(state: Any) -> str:
    return getattr(state, "value", str(state))


def _level_key(bridge: str) -> str:
    return f"imq.bridge.{bridge}.level"


def _with_keys(props: BrokerProperties, source: BrokerProperties, prefix: str) -> BrokerProperties:
    """``props`` with the keys under ``prefix`` as ``source`` has them (set, changed or gone)."""

    def merged(mine: Any, theirs: Any) -> MappingProxyType[str, Any]:
        out = {k: v for k, v in mine.items() if not k.startswith(prefix)}
        out.update((k, v) for k, v in theirs.items() if k.startswith(prefix))
        return MappingProxyType(out)

    return dataclasses.replace(
        props,
        values=merged(props.values, source.values),
        raw=merged(props.raw, source.raw),
        origins=merged(props.origins, source.origins),
    )


def _config_changes(before: BridgeConfig | None, after: BridgeConfig, keys: list[str]) -> str:
    """What a reload changed, in a line: links added, removed and changed; other parts;
    the bridge's properties."""
    parts = []
    if before is None:
        parts.append(f"links {', '.join(link.name for link in after.links) or 'none'}")
    else:
        old, new = {x.name: x for x in before.links}, {x.name: x for x in after.links}
        for what, names in (
            ("added", [n for n in new if n not in old]),
            ("removed", [n for n in old if n not in new]),
            ("changed", [n for n in new if n in old and new[n] != old[n]]),
        ):
            if names:
                parts.append(f"links {what}: {', '.join(names)}")
        for field in ("dmqs", "connection_factories", "destinations"):
            if getattr(before, field) != getattr(after, field):
                parts.append(f"{field.replace('_', ' ')} changed")
    if keys:
        parts.append(f"properties changed: {', '.join(keys)}")
    return "; ".join(parts) or "no change"


class _Start:
    """One bridge's start on a thread of its own, and how it ended."""

    def __init__(self, bridge: ManagedBridge, report_to: BridgeServiceManager | None) -> None:
        self.bridge = bridge
        self.error: Exception | None = None
        self._report_to = report_to
        self.ended = threading.Event()  # set before on_bridge_started hears of it
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"start:{bridge.name}")

    def _run(self) -> None:
        bridge = self.bridge
        try:
            bridge.start()
        except IllegalStateException as exc:  # refused in its state (already STARTING)
            self.error = exc
        except Exception as exc:  # the others still start (chapter)
            self.error = exc
            log.error("bridge %s failed to start and stays STOPPED: %s", bridge.name, exc)
        if self._report_to is None:
            self.ended.set()
            return
        while _value(bridge.state) in ("STARTING", "STOPPING"):  # links still connecting, or a stop
            time.sleep(0.2)
        self.ended.set()
        hook = self._report_to.on_bridge_started
        if hook is not None and not self._report_to._closing.is_set():
            hook(bridge)


def _quietly(fn: Callable[..., Any], name: str, *args: Any) -> Callable[[], None]:
    def run() -> None:
        try:
            fn(*args)
        except Exception as exc:
            log.error("bridge %s: stop failed: %s", name, exc)

    return run


class StompService:
    """The STOMP bridge as the service manages it: listed in the port mapper while started,
    logging to <instance>/bridges/stomp/log.txt while started (imq.bridge.stomp.logfile.*,
    imq.bridge.stomp.level, or the logging configuration file's imq.bridge.stomp.level),
    its buffered lines written every FLUSH_EVERY seconds."""

    type = "STOMP"
    FLUSH_EVERY = 1.0

    def __init__(self, manager: BridgeServiceManager, name: str) -> None:
        from .stompbridge import StompBridge, StompConfig

        assert manager.netloop is not None and manager.host_broker is not None
        self.name = name
        self._manager = manager
        config = StompConfig.from_props(manager.props)
        config = dataclasses.replace(config, hostname=config.hostname or manager.host)
        self.bridge = StompBridge(
            config,
            manager.host_broker,
            manager.users,
            manager.netloop,
            ServiceGuard.from_props(manager.props, "stomp", manager.login_throttle),
        )
        self._lock = threading.Lock()  # a start-up start, admin commands and stop() may meet
        self._log = stomp_log(manager.props)
        self._flusher: tuple[threading.Thread, threading.Event] | None = None

    @property
    def state(self) -> str:
        return self.bridge.state

    @property
    def connections(self) -> int:
        """Open STOMP connections (metrics)."""
        return len(self.bridge.connections)

    def start(self) -> str:
        from .admin.portmapper import ServiceEntry

        with self._lock:
            self._log.open()
            if self._flusher is None:
                halt = threading.Event()
                thread = threading.Thread(target=self._flush, args=(halt,), daemon=True, name="stomp-log")
                thread.start()
                self._flusher = thread, halt
            self.bridge.start()
            for row in self.bridge.service_entries():
                self._manager.portmapper.register(ServiceEntry(*row))
            return self.state

    def stop(self) -> str:
        with self._lock:
            for row in self.bridge.service_entries():
                self._manager.portmapper.unregister(row[0])
            self.bridge.stop()
            if self._flusher is not None:
                thread, halt = self._flusher
                halt.set()
                thread.join()
                self._flusher = None
            self._log.close()
            return self.state

    def _flush(self, halt: threading.Event) -> None:
        """Write the log's buffered lines (below WARNING) every FLUSH_EVERY seconds: nothing
        else writes them while the bridge runs."""
        while not halt.wait(self.FLUSH_EVERY):
            self._log.flush()

    def set_log_level(self, level: int) -> None:
        """imq.bridge.stomp.level changed (SIGHUP): it applies now."""
        self._log.set_level(level)

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "state": self.state,
            "ports": {row[0]: row[3] for row in self.bridge.service_entries()},
        }


def stomp_log(props: BrokerProperties) -> BridgeLog:
    """The STOMP bridge's log: its modules log as imq.bridge.stomp.*."""
    from .jmsbridge.logs import LOGGING_CONFIG_PROPERTY, BridgeLog
    from .props import STOMP

    bp = props.bridge(STOMP)
    return BridgeLog(
        STOMP,
        props.bridge_dir(STOMP),
        bp.logfile_limit,
        bp.logfile_count,
        props.raw.get(LOGGING_CONFIG_PROPERTY),
        level=bp.log_level,
        json_lines=props.get("imq.log.format") == "json",
    )


BridgeFactory = Callable[["BridgeServiceManager", str], ManagedBridge]


def default_bridge_factories() -> dict[str, BridgeFactory]:
    def jms(manager: BridgeServiceManager, name: str) -> ManagedBridge:
        from .jmsbridge.bridge import JMSBridge
        from .jmsbridge.config import load_bridge
        from .jmsbridge.excuses import shared_excuses

        if manager.props.bridge(name).runner == "spark":
            from .spark import runner  # noqa: F401  (registers the link runner "spark")
        from .parallel import runner as _parallel  # noqa: F401  (registers "parallel": links with parallelism > 1)

        def load() -> BridgeConfig:  # as last read (at load, or SIGHUP); its DMQs become admin-only
            config = manager.bridge_configs.get(name)
            if config is None:
                config = manager.bridge_configs[name] = load_bridge(manager.props, name)
            manager.protect_dmqs(config)
            return config

        # runner=spark links reach the host broker from Spark's processes over jms
        # on an instance of an HA cluster the links keep their excuses in the cluster's table
        cluster = manager.cluster
        bridge = JMSBridge(
            load,
            manager.props,
            name=name,
            host=manager.host_broker,
            broker_url=manager.jms_url if manager.jms_services else None,
            excuses=shared_excuses(cluster.jdbc.connect) if cluster is not None else None,
        )
        try:
            bridge.reserve()  # its links' client ids and durables, also before a start
        except (JMSException, ConfigError, OSError, ValueError) as exc:
            log.warning(
                "bridge %s: its configuration cannot be read yet (%s); its client ids "
                "and durable subscriptions are reserved at its first start",
                name,
                exc,
            )
        return bridge

    return {"jms": jms, "stomp": StompService}
