"""One worker process of a parallel link: the local runner in its own process.

runner.py starts it as `python -m bridgemgr.parallel.worker`. Its first stdin line is its
WorkerOptions (JSON: the link's SharedLinkOptions and the worker's index; the service
account's password travels here, never on the command line). It rebuilds
the link from the bridge XML as a Spark link's processes do (jmsbridge/linkenv.py: the
destinations, the connection factories with the host broker over mq://, the
transformer, the DMQs) and runs it with the local runner (jmsbridge/link.py): the same
pipeline steps, confirm window, DMQ rules and backout threshold, its own connections
(its source consumer competes with the other workers' for the queue). Later stdin lines
are commands (pause, resume, stop); stdout carries JSON lines back: {"state": S} after
the start and each command, {"counters": {...}} twice a second, {"log": [level, text]}
for each log record. EOF on stdin (the service died) stops it.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from dataclasses import asdict, dataclass
from typing import IO, Any

from ..jmsbridge.linkoptions import SharedLinkOptions

COUNTERS_EVERY = 0.5  # seconds between counter reports


@dataclass(frozen=True, kw_only=True)
class WorkerOptions(SharedLinkOptions):
    """What a worker needs to rebuild its link (runner.py fills it from the service): the
    link's shared options and the worker's number."""

    index: int

    def to_json(self) -> str:
        return json.dumps(asdict(self))


class _Lines:
    """JSON lines to stdout, one writer at a time."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.lock = threading.Lock()

    def put(self, **item: Any) -> None:
        line = json.dumps(item, default=str)
        with self.lock:
            self.out.write(line + "\n")
            self.out.flush()


class _ToParent(logging.Handler):
    def __init__(self, lines: _Lines) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.put(log=[record.levelno, self.format(record)])
        except Exception:  # a closed pipe: the parent is gone
            pass


def run(options: WorkerOptions, commands: IO[str], lines: _Lines) -> None:
    from ..jmsbridge.connections import BridgeConnections
    from ..jmsbridge.link import Link
    from ..jmsbridge.linkenv import LinkEnvironment
    from ..jmsbridge.runners import LinkSetup, LinkTuning
    from ..jmsbridge.transfer import ClientAcknowledge
    from ..providers.embedded import HostBrokerFactory

    log = logging.getLogger(f"imq.bridge.{options.bridge}.{options.link}.worker{options.index}")
    env = LinkEnvironment(options, log, HostBrokerFactory)
    connections = BridgeConnections(env.connectors)
    connections.prepare()
    dmqs = env.dead_message_queues(connections)
    dmqs.ready()
    config = env.link
    tuning = LinkTuning()
    setup = LinkSetup(
        config=config,
        bridge=env.config,
        source=env.source,
        target=env.target,
        target_kind=connections.kind(
            "target", config.target.connection_factory_ref, config.target.stay_connected, config.target.clientid
        ),
        transaction=ClientAcknowledge,
        transformer=env.transformer(config.target.message_transformer_class),
        destinations=env.destinations,
        backout_threshold=options.backout_threshold,
        batch_size=tuning.ack_batch,
        window=options.window,
        window_bytes=options.window_bytes,
    )
    link = Link(setup, connections, dmqs, log, tuning)
    done = threading.Event()

    def report() -> None:
        while not done.wait(COUNTERS_EVERY):
            lines.put(counters=link.counters.snapshot(), state=link.state.value)

    threading.Thread(target=report, daemon=True, name="counters").start()
    lines.put(state=link.start().value)
    try:
        for command in commands:
            command = command.strip()
            if command == "pause":
                lines.put(state=link.pause().value)
            elif command == "resume":
                lines.put(state=link.resume().value)
            elif command == "stop":
                break
    finally:
        state = link.stop()
        done.set()
        dmqs.close()
        connections.close(timeout=10)
        lines.put(counters=link.counters.snapshot(), state=state.value)


def main() -> None:
    lines = _Lines(sys.stdout)
    handler = _ToParent(lines)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    first = sys.stdin.readline()
    try:
        options = WorkerOptions(**json.loads(first))
        run(options, sys.stdin, lines)
    except Exception as exc:
        lines.put(error=f"{type(exc).__name__}: {exc}")
        sys.exit(1)


if __name__ == "__main__":
    main()
