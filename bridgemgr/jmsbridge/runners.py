"""Link runners: what a bridge runs a link with, registered by name, and their shared part.

A link runner is what runs one <link> of a started bridge: the local runner
(link.py's Link, a thread) or the Spark runner (bridgemgr/spark/runner.py's SparkLink, a
streaming query). The bridge resolves the link (LinkSetup) and asks the runner registered
under imq.bridge.<name>.runner for it (transacted links always run locally); each runner
module registers itself when imported, and the service imports the Spark one when a bridge
is configured with runner=spark, so jmsbridge never imports spark. Both runners share
RunnerBase: identity, state, counters, and the command step that checks the link state
table (states.py) before the runner's own _on_start/_on_stop/_on_pause/_on_resume.
Counters belong to the runner kind (new_counters): the bridge hands a link's counters of
its last start to the next runner (LinkSetup.counters), which keeps them only when they
are of its own kind, so they outlive restarts but not a change of runner (a SIGHUP that
changed the runner or the parallelism of a stopped bridge): those count from zero.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from ..jms.destination import Destination
from ..jms.hostbroker import HostBroker
from ..transform import MessageTransformer
from .config import BridgeConfig, LinkConfig
from .connections import ConnectionKind
from .counters import LinkCounters
from .states import LINK_TRANSITIONS, Command, Lifecycle, State
from .transfer import TransferTransaction

if TYPE_CHECKING:
    from ..props import BrokerProperties
    from .connections import BridgeConnections
    from .dmq import DeadMessageQueues
    from .excuses import ExcusesStore

LOCAL = "local"  # imq.bridge.<name>.runner's default: a thread per link
PARALLEL = "parallel"  # a link with parallelism > 1: worker processes (bridgemgr/parallel)


@dataclass(frozen=True)
class LinkTuning:
    """Knobs the chapter does not have; the defaults follow the chapter."""

    poll_interval: float = 0.2  # an idle link looks at its commands this often (s)
    ack_batch: int = 1  # non-transacted: messages per CLIENT_ACKNOWLEDGE
    retry_deadline: float = 30.0  # how long a retriable failure is retried (s)
    backoff_initial: float = 0.3
    backoff_max: float = 10.0
    start_timeout: float = 30.0  # how long start() of a link or bridge waits for connecting (s)


@dataclass(frozen=True)
class LinkSetup:
    """What the bridge resolved for one link at start."""

    config: LinkConfig
    bridge: BridgeConfig
    source: Destination
    target: Destination | None  # None: AS_SOURCE
    target_kind: ConnectionKind
    transaction: type[TransferTransaction]
    transformer: MessageTransformer | None = None
    destinations: Mapping[str, Destination] = field(default_factory=dict)
    backout_threshold: int = 0
    batch_size: int = 1
    window: int = 1  # confirm window (link.py), non-transacted links
    window_bytes: int = -1  # bytes that fill a unit and window (link.py); -1: no bound
    parallelism: int = 1  # worker processes (imq.bridge.<name>.link.<link>.parallelism)
    counters: LinkCounters | None = None  # the link's of its last start: kept by a runner of that kind

    @property
    def source_label(self) -> str:
        """`list link`'s Source column: <cf-ref>:D:<queue:|topic:><name>."""
        return f"{self.config.source.connection_factory_ref}:D:{self.source.kind}:{self.source.name}"

    @property
    def target_label(self) -> str:
        where = f"{self.target.kind}:{self.target.name}" if self.target is not None else "AS_SOURCE"
        return f"{self.config.target.connection_factory_ref}:{self.target_kind.value}:{where}"


@dataclass(frozen=True)
class RunnerContext:
    """What a bridge gives every runner of its links besides the link's own setup."""

    bridge: str
    props: BrokerProperties | None
    connections: BridgeConnections
    dmqs: DeadMessageQueues
    log: logging.Logger
    tuning: LinkTuning
    broker_url: str | None  # the host broker's jms service, for runners in other processes
    transformer_path: Sequence[str | Path] | None = None
    host: HostBroker | None = None  # the service's host broker (a Spark link's source backlog)
    excuses: ExcusesStore | None = None  # where links keep excuses (excuses.py); None: a file each


class LinkRunner(Protocol):
    """A running link's public face: what the bridge and the admin commands use."""

    runner: ClassVar[str]
    name: str
    lifecycle: Lifecycle
    counters: LinkCounters

    @property
    def state(self) -> State: ...

    def start(self, timeout: float | None = -1) -> State: ...

    def stop(self, timeout: float | None = None) -> State: ...

    def pause(self, timeout: float | None = -1) -> State: ...

    def resume(self, timeout: float | None = -1) -> State: ...

    def info(self) -> dict[str, object]: ...

    def info_now(self) -> dict[str, object] | None: ...


LinkRunnerFactory = Callable[[LinkSetup, RunnerContext], LinkRunner]
_runners: dict[str, LinkRunnerFactory] = {}
_lock = threading.Lock()


def register_link_runner(name: str, factory: LinkRunnerFactory) -> None:
    """Make ``name`` usable as imq.bridge.<name>.runner."""
    with _lock:
        _runners[name] = factory


def link_runner(name: str) -> LinkRunnerFactory | None:
    """The factory registered as ``name``; None when no module registered it."""
    with _lock:
        return _runners.get(name)


def runner_names() -> list[str]:
    with _lock:
        return sorted(_runners)


class RunnerBase(ABC):
    """What every link runner shares: identity, state, counters, and the commands' first
    step (the link state table: a command that is not legal now raises IllegalTransition,
    one that changes nothing returns the state); the runner does the rest in _on_start,
    _on_stop, _on_pause and _on_resume."""

    runner: ClassVar[str]

    def __init__(self, setup: LinkSetup, log: logging.Logger, tuning: LinkTuning) -> None:
        self.setup = setup
        self.config = setup.config
        self.name = setup.config.name
        self.bridge_name = setup.bridge.name
        self.log = log
        self.tuning = tuning
        self.lifecycle = Lifecycle(f"link {self.name} of bridge {self.bridge_name}", LINK_TRANSITIONS, State.STOPPED)
        self.counters = self._counters(setup.counters)

    def new_counters(self) -> LinkCounters:
        """Counters of this runner's kind (the local runner's: its thread is their one writer)."""
        return LinkCounters()

    def _counters(self, previous: LinkCounters | None) -> LinkCounters:
        """``previous`` (the link's counters of its last start) when they are of this
        runner's kind, so that they outlive restarts; else new ones: a runner counts in
        its own way (a thread's increments, workers' reports, a stats file), and counters
        of another kind would drop what it counts."""
        fresh = self.new_counters()
        return previous if previous is not None and type(previous) is type(fresh) else fresh

    @property
    def state(self) -> State:
        return self.lifecycle.state

    @property
    def transacted(self) -> bool:
        return self.config.transacted

    def start(self, timeout: float | None = -1) -> State:
        if self.lifecycle.begin(Command.START) is None:
            return self.state
        return self._on_start(timeout)

    def stop(self, timeout: float | None = None) -> State:
        if self.lifecycle.begin(Command.STOP) is None:
            return self.state
        return self._on_stop(timeout)

    def pause(self, timeout: float | None = -1) -> State:
        if self.lifecycle.begin(Command.PAUSE) is None:
            return self.state
        return self._on_pause(timeout)

    def resume(self, timeout: float | None = -1) -> State:
        if self.lifecycle.begin(Command.RESUME) is None:
            return self.state
        return self._on_resume(timeout)

    @abstractmethod
    def _on_start(self, timeout: float | None) -> State: ...

    @abstractmethod
    def _on_stop(self, timeout: float | None) -> State: ...

    @abstractmethod
    def _on_pause(self, timeout: float | None) -> State: ...

    @abstractmethod
    def _on_resume(self, timeout: float | None) -> State: ...

    def _wait(self, timeout: float | None) -> float | None:
        """A command's wait: -1 is tuning.start_timeout, None as long as it takes."""
        return self.tuning.start_timeout if timeout == -1 else timeout

    def backlog(self) -> int | None:
        """Messages waiting at the source, where its provider can tell; else None."""
        return None

    def published_backlog(self) -> tuple[int | None] | None:
        """The source backlog as the runner's own thread read it moments ago (a 1-tuple,
        its value None where unknown), or None when only backlog() can tell: what a reader
        that must not block (the management port's event loop) may answer with."""
        return None

    def info(self) -> dict[str, object]:
        """What the admin `list link` shows, plus the counters and the source backlog."""
        return self._info(self.backlog())

    def info_now(self) -> dict[str, object] | None:
        """info() without a call that may block (the provider's backlog): the backlog the
        runner published (published_backlog()); None when it has none fresh."""
        published = self.published_backlog()
        return None if published is None else self._info(published[0])

    def _info(self, backlog: int | None) -> dict[str, object]:
        return {
            "name": self.name,
            "state": self.state.value,
            "source": self.setup.source_label,
            "target": self.setup.target_label,
            "transacted": self.transacted,
            "transaction": self.setup.transaction.kind,
            "counters": self.counters.snapshot(),
            "backlog": backlog,
        }
