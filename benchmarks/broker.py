"""Embedded broker throughput and latency, in-process and over the wire; prints one JSON object.

    .venv/bin/python benchmarks/broker.py [--messages N] [--size BYTES] [--rounds R]
                                          [--only MODE] [--send-window W] [--prefetch P]
                                          [--store file|jdbc]

Three store modes, each on a broker of its own: non_persistent (no store),
persistent_no_sync (the default store: each batch handed to the OS) and persistent_sync
(fsync per group commit). Workloads (1 KiB BytesMessages through one queue,
AUTO_ACKNOWLEDGE):
- flat-out produce+consume: one producer thread and one consumer thread at once;
  msg/s = messages / (first send .. last receive). With fsync also eight producer threads
  (group commit needs concurrent writers);
- backlog (in-process): produce everything, then consume everything (every persistent
  message is written to and deleted from the store);
- latency: a paced producer at 1,000 msg/s; send-to-receive p50/p99.

Remote runs (issue 8): the same broker, the same flat-out workloads with the same message
counts and sizes, and the latency run, from a client in a child process (as a Spark
executor or a CLI job would be) over the host broker's jms connection service running in
this process (mq://, through the port mapper). ``remote`` is the client as it comes:
every PERSISTENT send outside a transaction waits for the service's answer (JMS: a
persistent send returns when the provider has the message). The in-process and remote
runs alternate for --rounds rounds (this machine is shared and noisy) and the median is
reported. ``remote_send_window_W``
(persistent modes) is the opt-in ``send_window``: up to W persistent sends per session
unconfirmed, a refusal raised at the next send or at close; a send that returned may
still be on its way, so it is not the same guarantee (see remote.py) and is reported
beside, not instead. NON_PERSISTENT sends are never waited for. ``ratio`` = remote msg/s /
in-process msg/s of the same workload in this run; ``cpu_us_per_msg`` is the CPU time of
the process running the workload (the client, remotely) and ``service_cpu_us_per_msg``
that of this process (the broker and its jms service) during a remote run.
``remote_target_met``: issue 8's target, remote persistent (strict) >= 50% of in-process.

``--store jdbc`` runs the persistent modes on the host broker's PostgreSQL store
(imq.persist.store=jdbc) instead of SQLite: a PostgreSQL server of the Debian package is
started here on 127.0.0.1 in a temporary directory (tests/pgserver.py), each mode in a
schema of its own; persistent_sync is then synchronous_commit on, persistent_no_sync off.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from benchcommon import jdbc_broker, paced_latency, percentiles, postgresql

from bridgemgr.jms import BytesMessage, DeliveryMode, Queue
from bridgemgr.jms.spi import ConnectionFactory

Q = Queue("bench")
MODES = {  # name: (delivery mode, store, fsync)
    "non_persistent": (DeliveryMode.NON_PERSISTENT, False, False),
    "persistent_no_sync": (DeliveryMode.PERSISTENT, True, False),
    "persistent_sync": (DeliveryMode.PERSISTENT, True, True),
}


def flat_out(factory: ConnectionFactory, n: int, body: bytes, mode: DeliveryMode, producers: int = 1) -> dict:
    conn = factory.create_connection()
    conn.start()
    consumer = conn.create_session().create_consumer(Q)
    per = n // producers

    def produce() -> None:
        p = conn.create_session().create_producer(Q)
        p.delivery_mode = mode
        for _ in range(per):
            p.send(BytesMessage(body))

    threads = [threading.Thread(target=produce) for _ in range(producers)]
    cpu0 = time.process_time()
    start = time.perf_counter()
    for t in threads:
        t.start()
    got = 0
    while got < per * producers:
        if consumer.receive(10) is None:
            raise RuntimeError(f"stalled after {got} messages")
        got += 1
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    for t in threads:
        t.join()
    conn.close()
    return {
        "messages": got,
        "producers": producers,
        "seconds": round(elapsed, 3),
        "msg_per_s": round(got / elapsed),
        "cpu_us_per_msg": round(cpu / got * 1e6, 1),
    }


def backlog(factory: ConnectionFactory, flush: Callable[[], None], n: int, body: bytes, mode: DeliveryMode) -> dict:
    conn = factory.create_connection()
    conn.start()
    session = conn.create_session()
    producer = session.create_producer(Q)
    producer.delivery_mode = mode
    t0 = time.perf_counter()
    for _ in range(n):
        producer.send(BytesMessage(body))
    flush()
    t1 = time.perf_counter()
    consumer = session.create_consumer(Q)
    for _ in range(n):
        consumer.receive(5)
    flush()
    t2 = time.perf_counter()
    conn.close()
    return {
        "produce_msg_per_s": round(n / (t1 - t0)),
        "consume_msg_per_s": round(n / (t2 - t1)),
        "msg_per_s": round(n / (t2 - t0)),
    }


def latency(factory: ConnectionFactory, n: int, body: bytes, mode: DeliveryMode, rate: int = 1000) -> dict:
    conn = factory.create_connection()
    conn.start()
    consumer = conn.create_session().create_consumer(Q)
    producer = conn.create_session().create_producer(Q)
    producer.delivery_mode = mode
    samples = paced_latency(producer, consumer, n, body, rate)
    conn.close()
    return {"rate_msg_per_s": rate, **percentiles(samples)}


def flat_out_runs(mode_name: str, n: int) -> list[tuple[str, int, int]]:
    """(label, messages, producers) of a mode's flat-out runs."""
    if MODES[mode_name][2]:
        return [("flat_out_8_producers", n // 2, 8), ("flat_out_1_producer", n // 20, 1)]
    return [("flat_out", n, 1)]


def workloads(factory: ConnectionFactory, args: argparse.Namespace, mode_name: str) -> dict:
    """What both sides run: the flat-out runs and the latency run."""
    mode = MODES[mode_name][0]
    body = bytes(range(256)) * (args.size // 256) + b"x" * (args.size % 256)
    out = {
        label: flat_out(factory, m, body, mode, producers)
        for label, m, producers in flat_out_runs(mode_name, args.messages)
    }
    out["latency_at_1000_msg_per_s"] = latency(factory, args.latency_messages, body, mode)
    return out


def child(args: argparse.Namespace) -> None:
    """The remote side: run the workloads against the service; print them as JSON."""
    from bridgemgr.providers.embedded.remote import RemoteConnectionFactory

    factory = RemoteConnectionFactory(args.child, prefetch=args.prefetch, send_window=args.send_window)
    print(json.dumps(workloads(factory, args, args.mode)))


def remote_run(args: argparse.Namespace, mode: str, url: str, window: int) -> dict:
    """One remote run in a child process; this process's CPU time is the service's."""
    cmd = [
        sys.executable,
        __file__,
        "--child",
        url,
        "--mode",
        mode,
        "--messages",
        str(args.messages),
        "--size",
        str(args.size),
        "--latency-messages",
        str(args.latency_messages),
        "--prefetch",
        str(args.prefetch),
        "--send-window",
        str(window),
    ]
    cpu0 = time.process_time()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"the remote run of {mode} failed:\n{done.stderr}")
    cpu = time.process_time() - cpu0
    remote = json.loads(done.stdout)
    total = sum(remote[label]["messages"] for label, *_ in flat_out_runs(mode, args.messages))
    remote["service_cpu_us_per_msg"] = round(cpu / (total + args.latency_messages) * 1e6, 1)
    remote["send_window"] = window
    return remote


def medians(rounds: list[dict], mode: str, n: int) -> dict:
    """Per flat-out run the round with the median msg/s (and every round's msg/s); the
    latency run with the median p50; the rest from the last round."""
    out = dict(rounds[-1])
    for label, *_ in flat_out_runs(mode, n):
        ordered = sorted((r[label] for r in rounds), key=lambda r: r["msg_per_s"])
        out[label] = {**ordered[len(ordered) // 2], "all_msg_per_s": [r[label]["msg_per_s"] for r in rounds]}
    key = "latency_at_1000_msg_per_s"
    out[key] = sorted((r[key] for r in rounds), key=lambda r: r["p50_ms"])[len(rounds) // 2]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=30_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--latency-messages", type=int, default=3000)
    ap.add_argument("--prefetch", type=int, default=100, help="the remote consumer's window")
    ap.add_argument(
        "--send-window",
        type=int,
        default=64,
        help="the opt-in pipelined persistent runs (the strict ones wait for every send)",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", choices=sorted(MODES))
    ap.add_argument("--mode", choices=sorted(MODES), help=argparse.SUPPRESS)
    ap.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    ap.add_argument(
        "--store",
        choices=("file", "jdbc"),
        default="file",
        help="the persistent modes' store: SQLite (file) or PostgreSQL (jdbc)",
    )
    args = ap.parse_args()
    if args.child:
        child(args)
        return

    from bridgemgr.admin.portmapper import PortMapper
    from bridgemgr.netloop import NetLoop
    from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory
    from bridgemgr.providers.embedded.jmsservice import JmsService

    body = bytes(range(256)) * (args.size // 256) + b"x" * (args.size % 256)
    out: dict = {
        "message_bytes": args.size,
        "messages": args.messages,
        "prefetch": args.prefetch,
        "rounds": args.rounds,
        "store": args.store,
    }
    with tempfile.TemporaryDirectory() as tmp, NetLoop() as netloop, postgresql(args.store) as pg:
        for name in [args.only] if args.only else MODES:
            mode, stored, sync = MODES[name]
            if stored and pg is not None:
                broker = jdbc_broker(pg, f"imq_bench_{name}", sync)
            else:
                broker = Broker(Path(tmp) / name if stored else None, sync=sync)
            factory = EmbeddedConnectionFactory(broker)
            service = JmsService(broker, netloop, "127.0.0.1", 0).start()
            mapper = PortMapper(netloop, "127.0.0.1", 0, "bench").start()
            mapper.register(service.service_entry())
            url = f"mq://127.0.0.1:{mapper.port}"
            windows = {"remote": 0}
            if mode is DeliveryMode.PERSISTENT:
                windows[f"remote_send_window_{args.send_window}"] = args.send_window
            rounds: dict[str, list[dict]] = {"in_process": [], **{label: [] for label in windows}}
            for _ in range(args.rounds):  # interleaved: this machine is shared and noisy
                rounds["in_process"].append(workloads(factory, args, name))
                for label, window in windows.items():
                    rounds[label].append(remote_run(args, name, url, window))
            result: dict = {side: medians(runs, name, args.messages) for side, runs in rounds.items()}
            local = result["in_process"]
            for label in windows:
                for run, *_ in flat_out_runs(name, args.messages):
                    result[label][run]["ratio"] = round(result[label][run]["msg_per_s"] / local[run]["msg_per_s"], 2)
            if not sync:
                flush = broker.store.flush if broker.store is not None else (lambda: None)
                local["backlog"] = backlog(factory, flush, args.messages, body, mode)
            service.stop()
            mapper.stop()
            if broker.store is not None:
                result["store"] = broker.store.stats()
            broker.close()
            out[name] = result
    out["remote_target_met"] = {  # issue 8: remote persistent >= 50% of in-process
        f"{name}_{label}": out[name]["remote"][label]["ratio"] >= 0.5
        for name in out
        if name in MODES and MODES[name][0] is DeliveryMode.PERSISTENT
        for label, *_ in flat_out_runs(name, args.messages)
    }
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
