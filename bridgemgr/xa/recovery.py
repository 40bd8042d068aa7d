"""XA recovery of a JMS bridge: in-doubt branches committed or rolled back at start.

At bridge start, before any link starts, Recovery.start() runs one pass over every
registered resource manager: each prepared branch of this bridge is left alone (in flight),
committed (a live CommitRecord) or rolled back (presumed abort); decide() says which.
Passes repeat in the background, with a growing interval, until one is clean.

Rules: the live records are read after the in-flight check; commit records are forgotten
only after a pass without any failure; an unreachable RM delays its own recovery but never
fails the bridge.

Design notes: docs/jms-bridges.md#internals-xarecoverypy.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from ..jms import xa
from ..jms.errors import XAException
from ..jms.spi import XAResource
from ..jms.xa import Xid
from .coordinator import Coordinator
from .txlog import CommitRecord

log = logging.getLogger(__name__)


class Decision(str, Enum):
    COMMIT = "commit"
    ROLLBACK = "roll back"
    IN_FLIGHT = "leave (in flight)"
    NOT_OURS = "leave (not this bridge's)"


def decide(xid: Xid, coordinator: Coordinator, live: Mapping[bytes, CommitRecord]) -> Decision:
    """What recovery does with a prepared branch; ``live`` must be read after the branch
    was found not in flight (see the module comment)."""
    if not coordinator.is_ours(xid):
        return Decision.NOT_OURS
    if coordinator.in_flight(xid.gtrid):
        return Decision.IN_FLIGHT
    return Decision.COMMIT if xid.gtrid in live else Decision.ROLLBACK


class RecoverySource:
    """What recovery needs of a registered RM: a name and an XA resource to ask."""

    name: str

    def resource(self) -> XAResource:  # pragma: no cover - the protocol
        raise NotImplementedError

    def reset(self) -> None:
        """Drop the connection after a failure (the next resource() reconnects)."""


@dataclass
class Report:
    """One RM in one pass."""

    rm: str
    committed: list[Xid] = field(default_factory=list)
    rolled_back: list[Xid] = field(default_factory=list)
    in_flight: list[Xid] = field(default_factory=list)
    failed: list[tuple[Xid, str]] = field(default_factory=list)
    error: str | None = None  # the RM could not be asked

    @property
    def clean(self) -> bool:
        return self.error is None and not self.failed


class Recovery:
    """Runs recovery passes over the registered RMs of one coordinator."""

    def __init__(
        self,
        coordinator: Coordinator,
        rms: Sequence[RecoverySource],
        logger: logging.Logger | None = None,
        interval: float = 2.0,
        max_interval: float = 60.0,
    ) -> None:
        self.coordinator = coordinator
        self.rms = list(rms)
        self.log = logger or log
        self.interval = interval
        self.max_interval = max_interval
        self.passes = 0
        self.last: list[Report] = []
        self._wake = threading.Condition()
        self._wanted = False
        self._stop = False
        self._thread: threading.Thread | None = None
        self.pass_lock = threading.Lock()  # one pass (or a resolution by hand) at a time
        coordinator.on_in_doubt = lambda rms: self.retry()

    # --- one pass -------------------------------------------------------------------------------
    def run_pass(self) -> bool:
        """Scan every registered RM once; True when nothing is left to do."""
        with self.pass_lock:
            coordinator = self.coordinator
            settled = [g for g in coordinator.txlog.live() if not coordinator.in_flight(g)]
            reports = [self.recover_rm(rm) for rm in self.rms]
            self.passes += 1
            self.last = reports
            clean = all(r.clean for r in reports)
            if clean and settled:
                coordinator.forget(settled)
                coordinator.flush()
            return clean

    def recover_rm(self, rm: RecoverySource) -> Report:
        report = Report(rm.name)
        try:
            resource = rm.resource()
            found = resource.recover(xa.TMSTARTRSCAN | xa.TMENDRSCAN)
        except Exception as exc:
            rm.reset()
            report.error = f"{type(exc).__name__}: {exc}"
            self.log.warning(
                "XA recovery: resource manager %s cannot be asked for its in-doubt "
                "transactions (%s); trying again later",
                rm.name,
                report.error,
            )
            return report
        coordinator = self.coordinator
        ours = [x for x in found if coordinator.is_ours(x)]
        settled = [x for x in ours if not coordinator.in_flight(x.gtrid)]
        report.in_flight = [x for x in ours if x not in settled]
        live = coordinator.txlog.live() if settled else {}  # read after the in-flight checks
        for xid in settled:
            decision = decide(xid, coordinator, live)
            try:
                if decision is Decision.COMMIT:
                    commit_branch(resource, xid, self.log)
                    report.committed.append(xid)
                elif decision is Decision.ROLLBACK:
                    rollback_branch(resource, xid, self.log)
                    report.rolled_back.append(xid)
                else:
                    report.in_flight.append(xid)
            except Exception as exc:
                report.failed.append((xid, f"{type(exc).__name__}: {exc}"))
        if ours:
            self.log.info(
                "XA recovery of %s: %d in doubt; committed %d, rolled back %d, in flight %d, failed %d",
                rm.name,
                len(ours),
                len(report.committed),
                len(report.rolled_back),
                len(report.in_flight),
                len(report.failed),
            )
        for xid, error in report.failed:
            self.log.warning("XA recovery of %s: %s failed (%s); trying again later", rm.name, xid, error)
        return report

    # --- scheduling ------------------------------------------------------------------------------
    def start(self) -> bool:
        """The first pass (the bridge's start step 6); passes continue in the background
        until one is clean. True when the first pass was."""
        clean = self.run_pass()
        if not clean:
            self.retry()
        return clean

    def retry(self) -> None:
        """Ask for another pass soon (an RM was unreachable)."""
        with self._wake:
            if self._stop:
                return
            self._wanted = True
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._background, daemon=True, name=f"xa recovery {self.coordinator.bridge}"
                )
                self._thread.start()
            self._wake.notify_all()

    def _background(self) -> None:
        delay = self.interval
        while True:
            with self._wake:
                while not self._wanted and not self._stop:
                    self._wake.wait()
                if self._stop:
                    return
                self._wake.wait(delay)  # let the RM come back; stop cuts it short
                if self._stop:
                    return
                self._wanted = False
            try:
                clean = self.run_pass()
            except Exception:
                self.log.exception("XA recovery pass failed")
                clean = False
            if clean:
                delay = self.interval
            else:
                delay = min(delay * 2, self.max_interval)
                with self._wake:
                    self._wanted = True

    @property
    def pending(self) -> bool:
        """A pass is wanted or the last one left work."""
        with self._wake:
            return self._wanted or not all(r.clean for r in self.last)

    def close(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()


# XA error codes that finish a recovered branch anyway, per what recovery asked for:
# gone already, or already ending the way it was asked to. The heuristic outcomes against
# the decision finish it too, but are reported and forgotten.
DONE_ANYWAY = {
    "commit": frozenset({xa.XAER_NOTA, xa.XA_HEURCOM}),
    "rollback": frozenset({xa.XAER_NOTA, xa.XA_HEURRB, *range(xa.XA_RBROLLBACK, 108)}),
}
AGAINST = {
    "commit": frozenset({xa.XA_HEURRB, xa.XA_HEURMIX, *range(xa.XA_RBROLLBACK, 108)}),
    "rollback": frozenset({xa.XA_HEURCOM, xa.XA_HEURMIX}),
}


def commit_branch(resource: XAResource, xid: Xid, logger: logging.Logger) -> None:
    _finish("commit", lambda: resource.commit(xid, False), resource, xid, logger)


def rollback_branch(resource: XAResource, xid: Xid, logger: logging.Logger) -> None:
    _finish("rollback", lambda: resource.rollback(xid), resource, xid, logger)


def _finish(what: str, call: Callable[[], None], resource: XAResource, xid: Xid, logger: logging.Logger) -> None:
    try:
        call()
    except XAException as exc:
        if exc.errorcode in DONE_ANYWAY[what]:
            return
        if exc.errorcode not in AGAINST[what]:
            raise
        logger.error(
            "XA recovery: %s of %s ended heuristically against the decision (%s); "
            "messages of that transaction may be missing or duplicated",
            what,
            xid,
            exc,
        )
        if exc.errorcode in (xa.XA_HEURCOM, xa.XA_HEURRB, xa.XA_HEURMIX):
            try:
                resource.forget(xid)
            except Exception:
                pass
