"""A JMS bridge: lifecycle, its links, connections and DMQs, and its log.

JMSBridge is what the Bridge Service Manager drives for one JMS bridge. start() performs
the chapter's steps ("Starting and Stopping JMS Bridges") in order: the XML, the links and
DMQs, the XA coordinator with its resource managers recovered (transacted links), the
connection factories and pools, the DMQs, then the links. stop() stops every link, closes
the DMQ senders and the connections once every lease is back; a housekeeping thread closes
idle pooled connections.

Rules: anything failing in a start undoes what was done and leaves the bridge STOPPED; the
bridge stays STARTING until every link has connected (or given up), and a stop cancels a
start under way; every command checks the state tables of states.py, and link commands are
legal only while the bridge is STARTED; per-link counters outlive restarts (runners.py).

Design notes: docs/jms-bridges.md#internals-jmsbridgebridgepy.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..jms import naming
from ..jms.destination import Destination, Queue
from ..jms.errors import JMSException
from ..jms.hostbroker import HostBroker
from ..props import BACKOUT_THRESHOLD, LINK_WINDOW, LINK_WINDOW_BYTES, BrokerProperties, clip, is_secret_name, shorten
from ..servicekeys import dmq_key
from ..transform import MessageTransformer
from ..xa.coordinator import name_tag
from ..xa.recovery import RecoverySource
from ..xa.registry import (
    BridgeTransactions,
    CommitRecord,
    FactoryEntry,
    in_doubt,
    logged_decisions,
    resolve,
    temporary_rms,
)
from ..xa.txlog import TxLogError
from . import link as _local_runner  # noqa: F401  (registers the link runner "local")
from .config import (
    BUILTIN_DMQ,
    BUILTIN_DMQ_DESTINATION,
    BridgeConfig,
    ConnectionFactoryConfig,
    LinkConfig,
    load_bridge,
)
from .connections import (
    BridgeConnections,
    Connector,
    configured_client_id,
    connection_kind,
)
from .counters import HISTORY_STEP, LinkCounters, LinkHistory
from .dmq import DeadMessageQueues, DMQSender
from .excuses import ExcusesStore
from .logs import LOGGING_CONFIG_PROPERTY, BridgeLog
from .pipeline import Interrupted
from .plugins import load_configured_transformer, plugin_folders
from .resolve import (
    HostFactory,
    Lookup,
    host_client_names,
    resolve_connection_factories,
    resolve_destination,
    with_host_broker,
)
from .runners import LOCAL, PARALLEL, LinkRunner, LinkSetup, LinkTuning, RunnerContext, link_runner, runner_names
from .states import BRIDGE_TRANSITIONS, Command, IllegalTransition, Lifecycle, State
from .transfer import TransactedLinkUnsupported, one_resource_manager, transaction_for

# A link no longer connecting: what start() waits for.
_CONNECTED_OR_DONE = frozenset(State) - {State.STARTING}


class BridgeStartError(JMSException, code="BRIDGE_START"):
    """The bridge cannot start; the message names the element and what to do."""


class NoSuchLink(JMSException, code="NO_SUCH_LINK"):
    """A link command named a link the bridge does not have."""


class JMSBridge:
    """One JMS bridge; thread-safe; driven by the service (start/stop/pause/resume)."""

    type = "JMS"

    def __init__(
        self,
        config: BridgeConfig | Callable[[], BridgeConfig],
        props: BrokerProperties | None = None,
        host_factory: HostFactory | None = None,
        *,
        host: HostBroker | None = None,
        name: str | None = None,
        lookup: Lookup = naming.lookup,
        tuning: LinkTuning = LinkTuning(),
        logging_config: str | Path | None = None,
        transformer_path: Sequence[str | Path] | None = None,
        reap_interval: float = 1.0,
        broker_url: str | None = None,
        excuses: ExcusesStore | None = None,
    ) -> None:
        self._loader = config if callable(config) else None
        self.config: BridgeConfig | None = None if callable(config) else config
        if name:
            self.name: str = name
        elif self.config is not None:
            self.name = self.config.name
        else:
            raise ValueError("give the bridge name when the configuration is loaded later")
        self.props = props
        if host_factory is None:
            if host is None:
                raise ValueError("a JMS bridge needs the host broker (host) or its factory (host_factory)")
            host_factory = _factory_of(host)
        self.host = host
        self.host_factory = host_factory
        self.lookup = with_host_broker(lookup, host_factory)
        self.tuning = tuning
        self.logging_config = logging_config or (props.raw.get(LOGGING_CONFIG_PROPERTY) if props is not None else None)
        if transformer_path is None and props is not None:
            transformer_path = plugin_folders(props)  # the service's: lib/ext, ...
        self.transformer_path = transformer_path
        self.reap_interval = reap_interval
        self.broker_url = broker_url  # the host broker's jms service, for runner=spark links
        self.excuses = excuses  # where links keep their excuses (an HA cluster's); None: files
        self.lifecycle = Lifecycle(f"bridge {self.name}", BRIDGE_TRANSITIONS)
        self.log = logging.getLogger(f"imq.bridge.{self.name}")
        self._bridge_log: BridgeLog | None = None
        self._links: dict[str, LinkRunner] = {}
        self._counters: dict[str, LinkCounters] = {}
        self._history: dict[str, LinkHistory] = {}  # by link name: the last hour, kept across restarts
        self._connections: BridgeConnections | None = None
        self._dmqs: DeadMessageQueues | None = None
        self._xa: BridgeTransactions | None = None
        self._housekeeping: threading.Thread | None = None
        self._halt = threading.Event()  # set by stop(): housekeeping ends, a start gives up
        self._lock = threading.RLock()  # one command at a time
        self._generation = 0  # bumped by each start, so a late waiter cannot finish a newer one

    @classmethod
    def from_properties(cls, props: BrokerProperties, name: str, **kwargs: Any) -> JMSBridge:
        """The bridge imq.bridge.<name>.* describes; its XML is read at every start."""
        return cls(lambda: load_bridge(props, name), props, name=name, **kwargs)

    # --- state ------------------------------------------------------------------------------
    @property
    def state(self) -> State:
        return self.lifecycle.state

    @property
    def links(self) -> list[LinkRunner]:
        """The enabled links of the last start, in file order."""
        return list(self._links.values())

    def link(self, name: str) -> LinkRunner:
        link = self._links.get(name)
        if link is None:
            known = [cfg.name for cfg in self.config.links] if self.config else []
            if name in known and self.state is State.STARTED:
                raise IllegalTransition(
                    f"link {name} of bridge {self.name} is not enabled "
                    '(enabled="false" in its XML); it cannot be started'
                )
            if name in known:
                raise IllegalTransition(
                    f"link {name} of bridge {self.name} is not running: the bridge is {self.state.value}"
                )
            raise NoSuchLink(f"bridge {self.name} has no link {name!r} (links: {', '.join(known) or 'none'})")
        return link

    def info(self) -> dict[str, Any]:
        """Name, type, state and every link (disabled ones UNINITIALIZED) with counters."""
        config = self.config
        rows = [self._link_info(config, cfg) for cfg in config.links] if config is not None else []
        return {"name": self.name, "type": self.type, "state": self.state.value, "links": rows}

    def link_info(self, name: str, now: bool = False) -> dict[str, Any] | None:
        """Link ``name``'s row of info() (KeyError: the configuration has no such link);
        ``now``: without a call that may block (LinkRunner.info_now), None when the link
        has published nothing fresh."""
        config = self.config
        cfg = next((c for c in config.links if c.name == name), None) if config is not None else None
        if config is None or cfg is None:
            raise KeyError(name)
        link = self._links.get(name)
        if link is not None and now:
            return link.info_now()
        return self._link_info(config, cfg)

    def _link_info(self, config: BridgeConfig, cfg: LinkConfig) -> dict[str, Any]:
        link = self._links.get(cfg.name)
        if link is not None:
            return link.info()
        return {
            "name": cfg.name,
            "state": State.UNINITIALIZED.value,
            "source": _label(config, cfg, "source"),
            "target": _label(config, cfg, "target"),
            "transacted": cfg.transacted,
            "counters": self._counters.get(cfg.name, LinkCounters()).snapshot(),
        }

    # --- reservations on the host broker ----------------------------------------------------------
    def reserve(self) -> None:
        """Keep on the host broker the client ids and durable subscriptions of the
        configuration's links for this bridge (reading the configuration now when no start
        has), so that no other user takes them while the bridge is loaded; every start
        renews it from the configuration it reads."""
        if self.host is None:
            return
        config = self.config if self.config is not None or self._loader is None else self._loader()
        if config is not None:
            self.host.reserve(self.name, *host_client_names(config))

    # --- bridge commands ----------------------------------------------------------------------
    def start(self, timeout: float | None = -1) -> State:
        """The start steps, then wait up to ``timeout`` seconds (tuning.start_timeout by
        default, None: as long as it takes) for the links to connect; the state then:
        STARTING while a link is still connecting (the bridge turns STARTED once every
        link has), STOPPED when stop() cancelled the start."""
        with self._lock:
            with self.lifecycle.cond:  # begin, clear and count as one step for stop()
                if self.lifecycle.begin(Command.START) is None:
                    return self.state
                self._halt.clear()
                self._generation += 1
                generation = self._generation
            try:
                self._start(generation)
            except BaseException as exc:
                if self.state is not State.STARTING and isinstance(exc, Exception):
                    return self.state  # stop() cancelled the start and tears it down
                self._teardown()
                self.lifecycle.move({State.STARTING}, State.STOPPED)
                raise
            links = list(self._links.values())
        # Outside the lock: stop() and list must not wait for a link that is connecting.
        deadline = (
            None if timeout is None else time.monotonic() + (self.tuning.start_timeout if timeout == -1 else timeout)
        )
        for link in links:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if link.lifecycle.wait_for(_CONNECTED_OR_DONE, remaining) is State.STARTING:
                return self.state  # still connecting: the housekeeping thread finishes
        self._started(generation)
        return self.state

    def _started(self, generation: int) -> None:
        """STARTING -> STARTED, unless a stop (or a stop and a new start) came first."""
        with self.lifecycle.cond:
            if generation != self._generation or not self.lifecycle.move({State.STARTING}, State.STARTED):
                return
        links = list(self._links.values())
        idle = [link for link in links if link.state is not State.STARTED]
        if not idle:
            self.log.info("bridge %s started with %d link(s)", self.name, len(links))
            return
        self.log.warning(
            "bridge %s started with %d of %d link(s) running; %s",
            self.name,
            len(links) - len(idle),
            len(links),
            "; ".join(_not_running(link) for link in idle),
        )

    def stop(self) -> State:
        with self.lifecycle.cond:
            cancel = self.lifecycle.state is State.STARTING
            if cancel:  # a start is under way: STOPPING now, and the start gives up
                self.lifecycle.begin(Command.STOP)
                self._halt.set()
        with self._lock:
            if not cancel and self.lifecycle.begin(Command.STOP) is None:
                return self.state
            self._teardown()
            self.lifecycle.set(State.STOPPED)
            return self.state

    def pause(self) -> State:
        with self._lock:
            if self.lifecycle.begin(Command.PAUSE) is None:
                return self.state
            for link in self._links.values():
                if link.state in (State.STARTED, State.STARTING, State.RESUMING):
                    link.pause()
            self.lifecycle.set(State.PAUSED)
            return self.state

    def resume(self) -> State:
        with self._lock:
            if self.lifecycle.begin(Command.RESUME) is None:
                return self.state
            for link in self._links.values():
                if link.state in (State.PAUSED, State.PAUSING):
                    link.resume()
            self.lifecycle.set(State.STARTED)
            return self.state

    # --- link commands -------------------------------------------------------------------------
    def _link_command(self, name: str, command: Command) -> LinkRunner:
        if self.state is not State.STARTED:
            raise IllegalTransition(
                f"cannot {command.value} link {name} of bridge {self.name}: "
                f"the bridge is {self.state.value} (link commands need "
                "it STARTED)"
            )
        return self.link(name)

    def start_link(self, name: str, timeout: float | None = -1) -> State:
        with self._lock:
            return self._link_command(name, Command.START).start(timeout)

    def stop_link(self, name: str, timeout: float | None = None) -> State:
        with self._lock:
            return self._link_command(name, Command.STOP).stop(timeout)

    def pause_link(self, name: str, timeout: float | None = -1) -> State:
        with self._lock:
            return self._link_command(name, Command.PAUSE).pause(timeout)

    def resume_link(self, name: str, timeout: float | None = -1) -> State:
        with self._lock:
            return self._link_command(name, Command.RESUME).resume(timeout)

    # --- the start steps ---------------------------------------------------------------------------
    def _go_on(self) -> None:
        """Between start steps: give up when stop() cancelled the start."""
        if self._halt.is_set():
            raise Interrupted(f"bridge {self.name} was stopped while starting")

    def _start(self, generation: int) -> None:
        """The start steps in order; between them, give up when stop() cancelled the start."""
        config = self._load_config()  # 1. parse and validate
        # 2. the enabled links and DMQs: destinations and transformers
        enabled = [link for link in config.links if link.enabled]
        dmqs = [d for d in config.dmqs if d.enabled or d.is_builtin]
        destinations = self._destinations(config, enabled, dmqs)
        transformers = self._link_transformers(enabled)
        self._go_on()
        # 3-7. factories; transacted links (coordinator, RMs, recovery); pools and shared
        connectors = self._connectors(config, enabled, dmqs)
        self._go_on()
        self._xa = self._start_xa(enabled, connectors)
        self._go_on()
        props = self.props  # (the links' settings from one reading of it)
        transactions = self._link_transactions(config, enabled, connectors, destinations, props)
        self._connections = BridgeConnections(connectors)
        self._connections.prepare()
        self._start_dmqs(dmqs, destinations)  # 8. the DMQs
        self._go_on()
        # 9. the links
        self._make_links(config, enabled, destinations, transactions, transformers, props)
        self._start_links(generation)

    def _load_config(self) -> BridgeConfig:
        """Start step 1: the configuration (read again when it comes from a loader), the
        host broker's names reserved for it, the bridge's log opened."""
        self._links = {}
        if self._loader is not None:
            self.config = self._loader()
        config = self.config
        assert config is not None
        if self.host is not None:
            self.host.reserve(self.name, *host_client_names(config))
        self._open_log(config)
        self.log.info("bridge %s starting (%s)", self.name, config.source or "configuration")
        return config

    def _link_transformers(self, links: list[LinkConfig]) -> dict[str, MessageTransformer | None]:
        """Start step 2: each link's transformer, loaded."""
        return {
            link.name: self._transformer(link.target.message_transformer_class, f"link {link.name}", link.target.line)
            for link in links
        }

    def _link_transactions(
        self,
        config: BridgeConfig,
        links: list[LinkConfig],
        connectors: dict[str, Connector],
        destinations: Mapping[str, Destination],
        props: BrokerProperties | None,
    ) -> dict[str, Any]:
        """Start step 7: each link's transaction class (transfer.transaction_for; local
        when imq.bridge.<name>.transaction.local allows and one RM serves both sides),
        and a durable subscription's client id checked."""
        transactions = {}
        bridge_props = props.bridge(self.name) if props is not None else None
        allow_local = bridge_props.transaction_local if bridge_props is not None else True
        for link in links:
            src, tgt = link.source.connection_factory_ref, link.target.connection_factory_ref
            local = allow_local and one_resource_manager(
                connectors[src].config, connectors[tgt].config, link.target.clientid
            )
            try:
                transactions[link.name] = transaction_for(
                    link.transacted, connectors[src].factory, connectors[tgt].factory, self._xa, src, tgt, local
                )
            except TransactedLinkUnsupported as exc:
                raise BridgeStartError(f"{_where(config, link.line)}link {link.name}: {exc}") from None
            if (
                destinations[link.source.destination_ref].is_topic
                and link.source.durable_sub
                and not link.source.clientid
            ):
                raise BridgeStartError(
                    f"{_where(config, link.source.line)}link {link.name}: "
                    f"durable-sub {link.source.durable_sub} needs the "
                    "source's clientid attribute; add clientid"
                )
        return transactions

    def _start_dmqs(self, dmqs: list[Any], destinations: Mapping[str, Destination]) -> None:
        """Start step 8: the DMQs' senders, and the built-in DMQ ready."""
        assert self._connections is not None
        senders = []
        dest: Destination
        key = dmq_key(self.props) if self.props is not None else None  # marks what we dead-letter
        for dmq in dmqs:
            if dmq.is_builtin:
                dest, ref = Queue(BUILTIN_DMQ_DESTINATION), BUILTIN_DMQ
            else:  # only the built-in DMQ has no destination and factory refs
                assert dmq.destination_ref is not None and dmq.connection_factory_ref is not None
                dest, ref = destinations[dmq.destination_ref], dmq.connection_factory_ref
            senders.append(
                DMQSender(
                    dmq,
                    dest,
                    ref,
                    self._connections,
                    self.log,
                    self._transformer(dmq.message_transformer_class, f"dmq {dmq.name}", dmq.line),
                    marker_key=key,
                )
            )
        self._dmqs = DeadMessageQueues(senders, self.log)
        try:
            self._dmqs.ready(self._halt)
        except Exception as exc:
            self._go_on()
            raise BridgeStartError(
                f"the built-in DMQ ({BUILTIN_DMQ_DESTINATION} on the host broker) is not ready: {exc}"
            ) from exc

    def _make_links(
        self,
        config: BridgeConfig,
        links: list[LinkConfig],
        destinations: dict[str, Destination],
        transactions: dict[str, Any],
        transformers: dict[str, MessageTransformer | None],
        props: BrokerProperties | None,
    ) -> None:
        """Start step 9: each link's runner, made with its setup (not started)."""
        connections, dmqs = self._connections, self._dmqs
        assert connections is not None and dmqs is not None
        bridge_props = props.bridge(self.name) if props is not None else None
        context = RunnerContext(
            self.name,
            self.props,
            connections,
            dmqs,
            self.log,
            self.tuning,
            self.broker_url,
            self.transformer_path,
            self.host,
            self.excuses,
        )
        for link in links:
            target = None if link.target.as_source else destinations[link.target.destination_ref]
            txn = transactions[link.name]
            batch = (
                (bridge_props.transaction_batch_size if bridge_props else 1)
                if txn.transacted
                else self.tuning.ack_batch
            )
            setup = LinkSetup(
                config=link,
                bridge=config,
                source=destinations[link.source.destination_ref],
                target=target,
                target_kind=connections.kind(
                    "target", link.target.connection_factory_ref, link.target.stay_connected, link.target.clientid
                ),
                transaction=txn,
                transformer=transformers[link.name],
                destinations=destinations,
                backout_threshold=(bridge_props.backout_threshold if bridge_props else BACKOUT_THRESHOLD),
                batch_size=batch,
                window=(
                    link.window
                    if link.window is not None
                    else bridge_props.link_window
                    if bridge_props
                    else LINK_WINDOW
                ),
                window_bytes=(
                    link.window_bytes
                    if link.window_bytes is not None
                    else bridge_props.link_window_bytes
                    if bridge_props
                    else LINK_WINDOW_BYTES
                ),
                parallelism=self._parallelism(config, link, txn.transacted, destinations),
                counters=self._counters.get(link.name),
            )
            runner = self._runner(bridge_props.runner if bridge_props is not None else LOCAL, setup)(setup, context)
            self._counters[link.name] = runner.counters  # those of its last start, if of its kind
            self._links[link.name] = runner

    def _start_links(self, generation: int) -> None:
        """Start step 9, last: the housekeeping thread, then every link (connecting goes on
        in the link's thread; start() waits for it)."""
        self._housekeeping = threading.Thread(
            target=self._housekeep, args=(generation,), daemon=True, name=f"bridge {self.name} housekeeping"
        )
        self._housekeeping.start()
        for runner in self._links.values():
            runner.start(0)

    def _parallelism(
        self, config: BridgeConfig, link: LinkConfig, transacted: bool, destinations: Mapping[str, Destination]
    ) -> int:
        """imq.bridge.<name>.link.<link>.parallelism, checked: more than 1 only for a
        non-transacted link from a queue that declared its order does not matter
        (imq.bridge.<name>.link.<link>.ordered=false)."""
        if self.props is None:
            return 1
        n: int = self.props.link_setting(self.name, link.name, "parallelism")
        if n == 1:
            return 1
        key = f"imq.bridge.{self.name}.link.{link.name}"
        why = (
            "it is transacted"
            if transacted
            else "its source is a topic"
            if destinations[link.source.destination_ref].is_topic
            else f"it keeps its order (set {key}.ordered=false if the order does not matter)"
            if self.props.link_setting(self.name, link.name, "ordered")
            else None
        )
        if why is not None:
            raise BridgeStartError(
                f"{_where(config, link.line)}link {link.name}: {key}.parallelism={n} "
                f"needs a non-transacted link from a queue whose order does not matter; {why}"
            )
        return n

    def _runner(self, name: str, setup: LinkSetup) -> Callable[[LinkSetup, RunnerContext], LinkRunner]:
        """The runner named ``name`` (imq.bridge.<name>.runner) for the link ``setup``
        describes; a transacted link runs on the local runner, a parallel one (parallelism
        > 1) on worker processes."""
        if setup.parallelism > 1:
            name = PARALLEL
        elif name != LOCAL and setup.config.transacted:
            self.log.info(
                "link %s is transacted: it runs on the local runner (a Spark "
                "link is at-least-once, a transacted one once-and-only-once)",
                setup.config.name,
            )
            name = LOCAL
        factory = link_runner(name)
        if factory is None:
            raise BridgeStartError(
                f"link {setup.config.name}: imq.bridge.{self.name}.runner={name} "
                f"names no registered link runner (registered: "
                f"{', '.join(runner_names())})"
            )
        return factory

    def _open_log(self, config: BridgeConfig) -> None:
        """The bridge's file, levels and password filter, for this start's configuration."""
        if self._bridge_log is not None:
            self._bridge_log.close()
        bp = self.props.bridge(self.name) if self.props is not None else None
        secrets = [
            secret
            for cf in config.connection_factories
            for secret in (cf.password, *(p.value for p in cf.properties if is_secret_name(p.name)))
            if secret
        ]
        self._bridge_log = BridgeLog(
            self.name,
            self.props.bridge_dir(self.name) if self.props is not None else None,
            bp.logfile_limit if bp else 0,
            bp.logfile_count if bp else 1,
            self.logging_config,
            secrets,
            bp.log_level if bp else None,
            json_lines=self.props is not None and self.props.get("imq.log.format") == "json",
        )
        self._bridge_log.open()

    def set_log_level(self, level: int) -> None:
        """imq.bridge.<name>.level changed (SIGHUP): a started bridge's loggers take it now."""
        if self._bridge_log is not None:
            self._bridge_log.set_level(level)

    def _destinations(self, config: BridgeConfig, links: list[LinkConfig], dmqs: list[Any]) -> dict[str, Destination]:
        """Every <destination>; one that a link or DMQ uses must resolve."""
        used = {ref for link in links for ref in (link.source.destination_ref, link.target.destination_ref)}
        used |= {d.destination_ref for d in dmqs if not d.is_builtin}
        found: dict[str, Destination] = {}
        for dest in config.destinations:
            try:
                found[dest.ref_name] = resolve_destination(dest, self.lookup)
            except Exception as exc:
                text = (
                    f"{_where(config, dest.line)}destination {shorten(dest.ref_name)} "
                    f"cannot be resolved ({type(exc).__name__}: {clip(str(exc), 200)})"
                )
                if dest.ref_name in used:
                    raise BridgeStartError(text + "; check lookup-name and its properties") from exc
                self.log.warning("%s; branch_to cannot use it", text)
        return found

    def _transformer(self, class_path: str | None, owner: str, line: int | None) -> MessageTransformer | None:
        if class_path is None:
            return None
        try:
            return load_configured_transformer(class_path, owner, self.transformer_path)
        except JMSException as exc:  # the same load and words as `check`
            raise BridgeStartError(f"{_where(self.config, line)}{exc}") from exc

    def _connectors(self, config: BridgeConfig, links: list[LinkConfig], dmqs: list[Any]) -> dict[str, Connector]:
        refs = {
            ref for link in links for ref in (link.source.connection_factory_ref, link.target.connection_factory_ref)
        }
        refs |= {d.connection_factory_ref for d in dmqs if not d.is_builtin}
        factories, problems = resolve_connection_factories(config, self.host_factory, self.lookup, refs)
        if problems:
            raise BridgeStartError("; ".join(str(p) for p in problems))
        connectors = {
            ref: Connector(config.connection_factory(ref), factory, self.log) for ref, factory in factories.items()
        }
        builtin = ConnectionFactoryConfig(BUILTIN_DMQ, connect_attempts=1)
        connectors[BUILTIN_DMQ] = Connector(builtin, self.host_factory({}), self.log)
        return connectors

    def _start_xa(self, links: list[LinkConfig], connectors: dict[str, Connector]) -> BridgeTransactions | None:
        """Start steps 3-6, when an enabled link is transacted."""
        if not any(link.transacted for link in links):
            return None
        props = self.props
        entries = [
            FactoryEntry(ref, c.config.multi_rm, c.factory, *c.config.login)
            for ref, c in connectors.items()
            if ref != BUILTIN_DMQ
        ]
        try:
            return BridgeTransactions.start(
                self.name,
                entries,
                props.bridge_dir(self.name) if props else None,
                props.bridge(self.name).tm_props if props else {},
                self.log,
                store=props.get("imq.persist.store") if props else "file",
                sql=self.host.txlog_sql() if self.host is not None else None,
            )
        except TxLogError as exc:
            raise BridgeStartError(f"bridge {self.name}: {exc}") from exc

    # --- in-doubt transactions by hand (imqbridgemgr list|commit|rollback txn) ------------------
    def transactions(self) -> dict[str, Any]:
        """The bridge's in-doubt transactions at its registered RMs, with what its log
        says; works while the bridge is stopped too (a damaged log stopped its start)."""
        with self._xa_view() as (rms, decisions, in_flight, running):
            rows, unreachable = in_doubt(rms, name_tag(self.name), decisions, in_flight)
        return {
            "bridge": self.name,
            "running": running,
            "unreachable": unreachable,
            "transactions": [row.to_json() for row in rows],
        }

    def resolve_transaction(self, txn: str, commit: bool) -> dict[str, Any]:
        """Commit or roll back in-doubt transaction ``txn`` by hand (heuristically)."""
        with self._xa_view() as (rms, _decisions, in_flight, _running):
            return resolve(rms, name_tag(self.name), txn, commit, in_flight, self.log).to_json()

    @contextmanager
    def _xa_view(
        self,
    ) -> Iterator[tuple[list[RecoverySource], dict[bytes, CommitRecord] | None, Callable[[bytes], bool], bool]]:
        """The registered RMs, the log's decisions and the in-flight test: the running
        coordinator's (one recovery pass at a time), else the configuration's RMs on
        connections of their own and the log read without changing it."""
        xa = self._xa
        if xa is not None:
            with xa.recovery.pass_lock:
                yield list(xa.rms), xa.coordinator.txlog.live(), xa.coordinator.in_flight, True
            return
        config = self.config if self._loader is None else self._loader()
        assert config is not None
        links = [link for link in config.links if link.enabled and link.transacted]
        if not links:
            raise BridgeStartError(f"bridge {self.name} has no enabled transacted link")
        connectors = self._connectors(config, links, [])
        props = self.props
        rms = temporary_rms(
            self.name,
            [
                FactoryEntry(ref, c.config.multi_rm, c.factory, *c.config.login)
                for ref, c in connectors.items()
                if ref != BUILTIN_DMQ
            ],
        )
        decisions = logged_decisions(
            props.bridge_dir(self.name) if props else None,
            self.name,
            self.host.txlog_sql() if self.host is not None else None,
        )
        try:
            yield list(rms), decisions, lambda gtrid: False, False
        finally:
            for rm in rms:
                rm.close()

    def _housekeep(self, generation: int) -> None:
        """Every reap_interval: finish a start whose links connected after start() stopped
        waiting, close idle pooled connections, write buffered log lines."""
        while not self._halt.wait(self.reap_interval):
            if self.state is State.STARTING and all(
                link.state is not State.STARTING for link in list(self._links.values())
            ):
                self._started(generation)
            connections = self._connections
            if connections is not None:
                closed = connections.reap()
                if closed:
                    self.log.debug("closed %d idle pooled connection(s)", closed)
            if self._bridge_log is not None:
                self._bridge_log.flush()
            self._sample_history(time.time())

    def _sample_history(self, now: float) -> None:
        """Each running link's counters into its history, when a sample is due."""
        for name, link in list(self._links.items()):
            history = self._history.setdefault(name, LinkHistory())
            if history.due(now):
                history.sample(link.counters.snapshot(), now)

    def history(self, link: str) -> dict[str, Any]:
        """The last hour of ``link``: intervals of msg/s and mean latency (LinkHistory);
        NoSuchLink for a link the configuration does not have."""
        known = [cfg.name for cfg in self.config.links] if self.config else list(self._links)
        if link not in known:
            raise NoSuchLink(f"bridge {self.name} has no link {link!r} (links: {', '.join(known) or 'none'})")
        found = self._history.get(link)
        return {
            "bridge": self.name,
            "link": link,
            "step": found.step if found is not None else HISTORY_STEP,
            "intervals": found.intervals() if found is not None else [],
        }

    def _teardown(self) -> None:
        """The stop steps: links, then DMQs, then every pooled and shared connection."""
        self._halt.set()
        for link in list(self._links.values()):
            try:
                link.stop()
            except Exception:
                self.log.exception("stopping link %s failed", link.name)
        if self._housekeeping is not None:
            self._housekeeping.join()
            self._housekeeping = None
        if self._xa is not None:
            try:
                self._xa.close()
            except Exception:
                self.log.exception("closing the XA coordinator of bridge %s failed", self.name)
            self._xa = None
        if self._dmqs is not None:
            self._dmqs.close()
            self._dmqs = None
        if self._connections is not None:
            if not self._connections.close(timeout=30):
                self.log.warning(
                    "bridge %s: some connections were not returned within 30 s; closing them anyway", self.name
                )
            self._connections = None
        if self._bridge_log is not None:
            self.log.info("bridge %s stopped", self.name)
            self._bridge_log.close()

    def metrics(self) -> dict[str, dict[str, Any]]:
        """Counters per link name (also of links not running now)."""
        return {name: c.snapshot() for name, c in self._counters.items()}


def _not_running(link: LinkRunner) -> str:
    """A link of a started bridge that is not running, its state and why."""
    error = link.counters.current_error or link.counters.last_error
    return f"link {link.name} is {link.state.value}" + (f": {error}" if error else "")


def _where(config: BridgeConfig | None, line: int | None) -> str:
    if config is None or not config.source:
        return ""
    return f"{config.source}:{line}: " if line is not None else f"{config.source}: "


def _label(config: BridgeConfig, link: LinkConfig, role: str) -> str:
    """`list link`'s Source/Target column from the configuration alone."""
    end = link.source if role == "source" else link.target
    cf = config.connection_factory(end.connection_factory_ref)
    if role == "source":
        kind = connection_kind("source")
    else:
        kind = connection_kind("target", link.target.stay_connected, link.target.clientid, configured_client_id(cf))
    if role == "target" and link.target.as_source:
        return f"{cf.ref_name}:{kind.value}:AS_SOURCE"
    dest = config.destination(end.destination_ref)
    kind_name = dest.type.value if dest.lookup_name is None else "lookup"
    return f"{cf.ref_name}:{kind.value}:{kind_name}:{dest.name or dest.lookup_name}"


def _factory_of(host: HostBroker) -> HostFactory:
    """The host broker's connection factory, whatever a <connection-factory> says."""
    factory = host.connection_factory()
    return lambda environment: factory
