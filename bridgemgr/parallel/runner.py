"""The parallel link runner: worker processes, each running the link (worker.py).

A link with imq.bridge.<name>.link.<link>.parallelism=N > 1 (allowed for a
non-transacted link from a queue that set ...ordered=false; bridge.py checks) runs as N
worker processes (worker.py), not threads: a pure-Python transformer holds the GIL, so
threads of one process would take turns. Each worker runs the local runner over its own
connections to the host broker's jms service (mq://), so the workers are competing
consumers of the source queue: each message goes to one of them, and order across them
is lost (hence ordered=false). Commands go to every worker and the link is in a state
once all of them are; the counters are the workers' summed (the last report of a
worker that ended stays counted). A worker that dies while the link is STARTED is
started again after a backoff; what it had not acknowledged comes back from the
source to the others (at-least-once, as the local runner across a crash).
The link's _lock guards its workers and what it wants; a command takes it to send to
the workers and waits for them without it (its settle thread may stop the link, a
reader thread start a worker again: both take it). ParallelCounters are written by the
reader and settle threads, each write under the counters' own lock.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..jmsbridge.counters import LATENCY_BOUNDS_MS, SharedCounters
from ..jmsbridge.runners import PARALLEL, LinkSetup, LinkTuning, RunnerBase, RunnerContext, register_link_runner
from ..jmsbridge.states import State
from .worker import WorkerOptions

ROOT = Path(__file__).resolve().parents[2]  # the folder holding the bridgemgr package


class ParallelCounters(SharedCounters):
    """The workers' counters summed: their last reports, plus those of ended workers;
    the link's own (restarts, errors) are written by its reader and settle threads."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, dict[str, Any]] = {}  # worker index -> its last snapshot
        self.ended: list[dict[str, Any]] = []

    def report(self, index: int, snapshot: dict[str, Any]) -> None:
        with self.lock:
            self.live[index] = snapshot

    def worker_ended(self, index: int) -> None:
        with self.lock:
            last = self.live.pop(index, None)
            if last is not None:
                self.ended.append(last)

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            own = super().snapshot()
            live = list(self.live.values())
            parts = [*self.ended, *live]
        for key in (
            "received",
            "transferred",
            "consumed_only",
            "to_dmq",
            "dmq_lost",
            "redelivered",
            "rolled_back",
            "reconnects",
        ):
            own[key] += sum(p.get(key, 0) for p in parts)
        own["rate"] = round(own["rate"] + sum(p.get("rate", 0) for p in live), 3)  # not an ended one's
        reasons: dict[str, int] = dict(own["dmq_reasons"])
        buckets = [0] * (len(LATENCY_BOUNDS_MS) + 1)
        total_ms = 0
        for p in parts:
            for reason, n in p.get("dmq_reasons", {}).items():
                reasons[reason] = reasons.get(reason, 0) + n
            buckets = [a + b for a, b in zip(buckets, p["latency_ms"]["buckets"])]
            total_ms += p["latency_ms"]["sum"]
            if p.get("last_error_at") and (own["last_error_at"] or 0) < p["last_error_at"]:
                own["last_error"], own["last_error_at"] = p["last_error"], p["last_error_at"]
            if p.get("last_transfer_at") and (own["last_transfer_at"] or 0) < p["last_transfer_at"]:
                own["last_transfer_at"] = p["last_transfer_at"]
        own["dmq_reasons"] = reasons
        own["latency_ms"] = {"bounds": list(LATENCY_BOUNDS_MS), "buckets": buckets, "sum": total_ms}
        return own


class _Worker:
    """One worker process and what it last said."""

    def __init__(self, link: ParallelLink, index: int) -> None:
        self.link = link
        self.index = index
        self.state: str | None = None
        self.error: str | None = None
        self.changed = threading.Condition()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bridgemgr.parallel.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(link.options(index).to_json() + "\n")
        self.proc.stdin.flush()
        self.reader = threading.Thread(
            target=self._read, daemon=True, name=f"parallel link {link.bridge_name}/{link.name} worker {index}"
        )
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        log = self.link.log
        for line in self.proc.stdout:
            try:
                item = json.loads(line)
            except ValueError:
                log.warning("link %s worker %d: %s", self.link.name, self.index, line.rstrip())
                continue
            if "log" in item:
                level, text = item["log"]
                log.log(level, "link %s worker %d: %s", self.link.name, self.index, text)
            if "counters" in item:
                self.link.totals.report(self.index, item["counters"])
            if "state" in item or "error" in item:
                with self.changed:
                    self.state = item.get("state", self.state)
                    self.error = item.get("error", self.error)
                    self.changed.notify_all()
        self.proc.wait()
        with self.changed:
            self.state = None
            self.changed.notify_all()
        self.link.totals.worker_ended(self.index)
        self.link.worker_exited(self)

    def command(self, text: str) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(text + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):
            pass  # it ended: its reader tells the link

    def wait_for(self, states: set[str], timeout: float | None) -> str | None:
        """Its state once in ``states`` or ended (None) or ``timeout`` passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.changed:
            while self.state not in states and self.proc.poll() is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self.changed.wait(remaining if remaining is not None else 1.0)
            return self.state

    def end(self, timeout: float) -> None:
        self.command("stop")
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.link.log.warning(
                "link %s worker %d did not stop in %.0f s; killed", self.link.name, self.index, timeout
            )
            self.proc.kill()
            self.proc.wait()
        self.reader.join(timeout=5)


class ParallelLink(RunnerBase):
    """One <link> of a running bridge, run by ``setup.parallelism`` worker processes."""

    runner = PARALLEL

    def __init__(
        self, setup: LinkSetup, base: WorkerOptions, log: logging.Logger, tuning: LinkTuning = LinkTuning()
    ) -> None:
        super().__init__(setup, log, tuning)
        assert isinstance(self.counters, ParallelCounters)  # new_counters' (or the last start's)
        self.totals: ParallelCounters = self.counters
        self.base = base
        self.workers: dict[int, _Worker] = {}
        self._want = State.STOPPED
        self._lock = threading.RLock()

    def new_counters(self) -> ParallelCounters:
        return ParallelCounters()

    def options(self, index: int) -> WorkerOptions:
        return WorkerOptions(**{**self.base.__dict__, "index": index})

    # --- commands (RunnerBase checked the state table) -----------------------------------------
    # _lock guards workers and _want only: no command holds it while it waits for the
    # workers, since _settle's stop() and the reader threads' worker_exited() take it.
    def _on_start(self, timeout: float | None) -> State:
        with self._lock:
            self._want = State.STARTED
            for i in range(self.setup.parallelism):
                if i not in self.workers:
                    self.workers[i] = _Worker(self, i)
            self.log.info(
                "link %s runs on %d worker processes (%s -> %s)",
                self.name,
                len(self.workers),
                self.setup.source_label,
                self.setup.target_label,
            )
            self._all(State.STARTING, State.STARTED, None)
        return self._until(State.STARTED, timeout)

    def _on_resume(self, timeout: float | None) -> State:
        with self._lock:
            self._want = State.STARTED
            self._all(State.RESUMING, State.STARTED, "resume")
        return self._until(State.STARTED, timeout)

    def _on_pause(self, timeout: float | None) -> State:
        with self._lock:
            self._want = State.PAUSED
            self._all(State.PAUSING, State.PAUSED, "pause")
        return self._until(State.PAUSED, timeout)

    def _on_stop(self, timeout: float | None) -> State:
        with self._lock:
            self._want = State.STOPPED
            workers, self.workers = list(self.workers.values()), {}
        for worker in workers:
            worker.end(self.tuning.start_timeout)
        self.lifecycle.set(State.STOPPED)
        self.log.info("link %s stopped", self.name)
        return self.state

    def _all(self, transient: State, state: State, command: str | None) -> None:
        """(Under _lock) send ``command`` to every worker; the link is in ``state`` once
        each is (a thread waits for them); a worker that does not get there within the
        start timeout stops the link."""
        workers = list(self.workers.values())
        for worker in workers:
            if command is not None:
                worker.command(command)
        threading.Thread(
            target=self._settle,
            args=(workers, transient, state),
            daemon=True,
            name=f"parallel link {self.bridge_name}/{self.name} {state.value}",
        ).start()

    def _until(self, state: State, timeout: float | None) -> State:
        """A command's wait (not under _lock): until the link is in ``state`` or stopped
        (start(0) returns at once, as the local runner's)."""
        return self.lifecycle.wait_for({state, State.STOPPED}, self._wait(timeout))

    def _settle(self, workers: list[_Worker], transient: State, state: State) -> None:
        for worker in workers:
            got = worker.wait_for({state.value, State.STOPPED.value}, self.tuning.start_timeout)
            if self.lifecycle.state is not transient:
                return  # another command came
            if got != state.value:
                why = worker.error or f"it is {got or 'gone'}"
                self.counters.error(f"worker {worker.index}: {why}")
                self.log.error(
                    "link %s: worker %d did not reach %s (%s); the link stops",
                    self.name,
                    worker.index,
                    state.value,
                    why,
                )
                self.stop()
                return
        self.lifecycle.move({transient}, state)

    def worker_exited(self, worker: _Worker) -> None:
        """(A reader thread) a worker ended: started again while the link is STARTED."""
        with self._lock:
            if (
                self.workers.get(worker.index) is not worker
                or self._want is not State.STARTED
                or self.state is not State.STARTED
            ):
                return
        self.totals.restarted(
            f"worker {worker.index} ended (exit code {worker.proc.returncode}): {worker.error or 'no error reported'}"
        )
        self.log.warning(
            "link %s: worker %d ended (exit code %s); starting it again",
            self.name,
            worker.index,
            worker.proc.returncode,
        )
        time.sleep(self.tuning.backoff_max)
        with self._lock:
            if self.workers.get(worker.index) is worker and self._want is State.STARTED:
                self.workers[worker.index] = _Worker(self, worker.index)


def parallel_link(setup: LinkSetup, context: RunnerContext) -> ParallelLink:
    """A link with parallelism > 1: worker processes over the host broker's jms service."""
    from ..jmsbridge.bridge import BridgeStartError
    from ..servicekeys import SERVICE_ACCOUNT, dmq_key, service_password

    props = context.props
    if props is None or context.broker_url is None:
        raise BridgeStartError(
            f"link {setup.config.name}: imq.bridge.{context.bridge}.link."
            f"{setup.config.name}.parallelism={setup.parallelism} needs the service's "
            "host broker and its jms connection service (imq.jms.tcp.port)"
        )
    settings = props.bridge(context.bridge)
    xmlurl = settings.xmlurl or ""
    if xmlurl and "://" not in xmlurl and not xmlurl.startswith("file:") and settings.xml_base:
        xmlurl = str((settings.xml_base / xmlurl).resolve())
    base = WorkerOptions(
        xmlurl=xmlurl,
        bridge=context.bridge,
        link=setup.config.name,
        broker_url=context.broker_url,
        broker_user=SERVICE_ACCOUNT,
        broker_password=service_password(props),
        dmq_secret=dmq_key(props).hex(),
        transformer_path=os.pathsep.join(str(p) for p in context.transformer_path or ()),
        backout_threshold=setup.backout_threshold,
        window=setup.window,
        window_bytes=setup.window_bytes,
        index=0,
    )
    return ParallelLink(setup, base, context.log, context.tuning)


register_link_runner(PARALLEL, parallel_link)
