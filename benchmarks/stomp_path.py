"""The STOMP bridge's data path without sockets: CPU per message, persistent and not; prints JSON.

    PYTHONPATH=. .venv/bin/python benchmarks/stomp_path.py [--messages N] [--rounds R]
                                   [--acks auto,client-individual,client] [--acks-per-read K]

One process: a producer StompSession feeds SEND frames (1 KiB bodies, 100 frames per
read) into the embedded broker (SQLite store with fsync, as stomp.py's bridge runs it)
while a consumer StompSession subscribed with ack:auto takes them (its subscriber thread
renders MESSAGE frames; what the event loop would run, this process runs inline, as
tests/stomp_support.Driver does; a SEND the broker holds waits as the server's does,
without blocking the loop: the consumer's batches keep being delivered meanwhile).
cpu_us_per_msg is the process's user + system CPU (every thread: loop work, subscriber
thread, store writer) per message; rows_written, the store rows inserted and deleted (a
message consumed before its batch was cut needs none).
--acks adds consumers that acknowledge: client-individual ACKs every MESSAGE, client the
last of each group; --acks-per-read ACK frames (client: groups of MESSAGEs) per read, as a
client's ACKs that pile up in the socket while the loop is busy arrive together (in
benchmarks/stomp.py's run a consumer's read carries ~50). The process also plays the
client, so an ACK's bytes (~0.3 us) count too.
Without client processes and sockets its noise on a shared machine is a few µs, so it
shows what the persistent path costs over the non-persistent one (benchmarks/stomp.py's
ratios move with the load). Each mode runs --rounds times, interleaved; medians reported.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# benchmarks/stomp.py is beside this file: keep the folder off the path so `import stomp`
# (tests/stomp_support's client library) is stomp.py the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "tests"))

BODY = b"x" * 1024
READ = 100  # SEND frames per read


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run(messages: int, persistent: bool, ack: str = "auto", acks_per_read: int = 1) -> dict[str, float]:
    """One producer, one consumer with ``ack``, ``messages`` SENDs; CPU per message and rows."""
    from bridgemgr.providers.embedded import Broker
    from bridgemgr.stompbridge.frames import Frame, encode_frame
    from stomp_support import Driver

    class Producer(Driver):
        """A held SEND (pacing, flow control) waits for the broker's call back while the
        loop runs on (here: the consumer's batches are delivered), as the server does."""

        def _drain(self) -> list:
            call = self.session.take_call()
            if call is not None and call.wait is not None:
                ready = threading.Event()
                call.wait(ready.set)
                while not ready.is_set():
                    nonlocal received
                    received += taken(consumer.pump(0.001))
                self.session.complete_call(None)
            elif call is not None:
                self.session.complete_call(call.fn())
            return super()._drain()

    def taken(frames: list[Frame]) -> int:
        """The MESSAGEs among ``frames``, acknowledged as ``ack`` says."""
        msgs = [f for f in frames if f.command == "MESSAGE"]
        if ack != "auto":
            for i in range(0, len(msgs), acks_per_read):
                group = msgs[i : i + acks_per_read] if ack == "client-individual" else [msgs[i : i + acks_per_read][-1]]
                consumer.feed(b"".join(b"ACK\nid:%s\n\n\0" % m.headers["ack"].encode() for m in group))
        return len(msgs)

    received = 0
    with tempfile.TemporaryDirectory(prefix="stomp-path-") as directory:
        broker = Broker(Path(directory) / "store", sync=True)
        try:
            consumer = Driver(broker, name="consumer")
            consumer.connect()
            consumer.send("SUBSCRIBE", {"destination": "/queue/q", "id": "1", "ack": ack})
            producer = Producer(broker, name="producer")
            producer.connect()
            headers = {"destination": "/queue/q", "persistent": "true" if persistent else "false"}
            started = cpu()
            for _ in range(0, messages, READ):
                producer.feed(
                    b"".join(
                        encode_frame(Frame("SEND", {**headers, "ts": repr(time.time())}, BODY), producer.version)
                        for _ in range(READ)
                    )
                )
                received += taken(consumer.pump(0))
            while received < messages:
                received += taken(consumer.pump(0.05))
            assert broker.store is not None
            broker.store.flush()
            used = cpu() - started
            rows = broker.store.stats()["rows"]
            producer.close()
            consumer.close()
        finally:
            broker.close()
    return {"cpu_us_per_msg": used / received * 1e6, "rows_written": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20000, help="SEND frames per run (a multiple of 100)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each mode, interleaved")
    parser.add_argument(
        "--acks",
        default="auto",
        help="the consumer's ack modes, comma-separated "
        "(auto, client-individual, client); modes other than auto are reported as "
        "persistent_ack_MODE, ...",
    )
    parser.add_argument("--acks-per-read", type=int, default=1, help="ACK frames per read the consumer feeds")
    args = parser.parse_args()
    if args.messages <= 0 or args.messages % READ:
        parser.error(f"--messages must be a positive multiple of {READ}")
    acks = args.acks.split(",")
    if not set(acks) <= {"auto", "client-individual", "client"} or args.acks_per_read < 1:
        parser.error("--acks takes auto, client-individual and client; --acks-per-read is 1 or more")
    runs: dict[str, list[dict[str, float]]] = {}
    for _ in range(args.rounds):
        for ack in acks:
            for mode in ("persistent", "non_persistent"):
                name = mode if ack == "auto" else f"{mode}_ack_{ack}"
                runs.setdefault(name, []).append(run(args.messages, mode == "persistent", ack, args.acks_per_read))
    out = {
        mode: {key: round(statistics.median(r[key] for r in rows), 1) for key in rows[0]} for mode, rows in runs.items()
    }
    if "auto" in acks:
        out["persistent_extra_us_per_msg"] = round(
            out["persistent"]["cpu_us_per_msg"] - out["non_persistent"]["cpu_us_per_msg"], 1
        )
    print(
        json.dumps(
            {"messages": args.messages, "rounds": args.rounds, "acks_per_read": args.acks_per_read, **out}, indent=2
        )
    )


if __name__ == "__main__":
    main()
