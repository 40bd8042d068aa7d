"""The host broker over the wire (mq:// client -> jms service) next to in-process; prints JSON.

    .venv/bin/python benchmarks/remote.py [--messages N] [--size BYTES] [--latency-messages N]

For each delivery mode one broker serves both runs: first in-process (the embedded
client in this process), then over the wire (a client in a child process, as a Spark
executor or a CLI job would be, talking to the jms service running in this process on
the service's asyncio loop). Workloads (1 KiB BytesMessages through one queue):

- flat-out produce+consume: one producer thread and one consumer thread at once (AUTO
  acknowledge); msg/s = messages / (first send .. last receive). With fsync (``sync``)
  eight producer threads, since group commit needs concurrent writers;
- latency: a producer paced at 1,000 msg/s, send-to-receive p50/p99 (both ends in one
  process, so one clock).

Each persistent mode runs remotely twice: ``remote``, where every persistent send waits
for the service's answer (JMS's rule, the client's default), and
``remote_send_window_64``, where up to 64 persistent sends per session are in flight
(``send_window``; refusals surface at the next send or at close). Non-persistent sends
are never waited for. The remote consumer prefetches 100 messages.

``ratio`` is remote msg/s / in-process msg/s of the same run; ``cpu_us_per_msg`` is the
CPU time of the process running the workload (the client, remotely) and
``service_cpu_us_per_msg`` that of the service's process during the remote run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bridgemgr.jms import BytesMessage, DeliveryMode, Queue  # noqa: E402
from bridgemgr.jms.spi import ConnectionFactory  # noqa: E402

from benchcommon import paced_latency, percentiles  # noqa: E402

Q = Queue("bench")
MODES = {
    "non_persistent": (DeliveryMode.NON_PERSISTENT, False, 1),
    "persistent": (DeliveryMode.PERSISTENT, False, 1),
    "persistent_sync": (DeliveryMode.PERSISTENT, True, 8),
}


def flat_out(factory: ConnectionFactory, n: int, body: bytes, mode: DeliveryMode, producers: int) -> dict:
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
    return {"messages": got, "producers": producers, "seconds": round(elapsed, 3),
            "msg_per_s": round(got / elapsed), "cpu_us_per_msg": round(cpu / got * 1e6, 1)}


def latency(factory: ConnectionFactory, n: int, body: bytes, mode: DeliveryMode, rate: int = 1000) -> dict:
    conn = factory.create_connection()
    conn.start()
    consumer = conn.create_session().create_consumer(Q)
    producer = conn.create_session().create_producer(Q)
    producer.delivery_mode = mode
    samples = paced_latency(producer, consumer, n, body, rate)
    conn.close()
    return {"rate_msg_per_s": rate, **percentiles(samples)}


def workloads(factory: ConnectionFactory, args: argparse.Namespace, mode_name: str) -> dict:
    mode, _, producers = MODES[mode_name]
    body = bytes(range(256)) * (args.size // 256) + b"x" * (args.size % 256)
    n = args.messages // (4 if producers > 1 else 1)
    return {"flat_out": flat_out(factory, n, body, mode, producers),
            "latency_at_1000_msg_per_s": latency(factory, args.latency_messages, body, mode)}


def child(args: argparse.Namespace) -> None:
    """The remote side: run the workloads against the service and print them as JSON."""
    from bridgemgr.providers.embedded.remote import RemoteConnectionFactory
    factory = RemoteConnectionFactory(args.child, prefetch=args.prefetch, send_window=args.send_window)
    print(json.dumps(workloads(factory, args, args.mode)))


def run_child(args: argparse.Namespace, mode: str, url: str, window: int) -> dict:
    """One remote run in a child process; the service's CPU time is measured here."""
    cmd = [sys.executable, __file__, "--child", url, "--mode", mode, "--messages", str(args.messages),
           "--size", str(args.size), "--latency-messages", str(args.latency_messages),
           "--prefetch", str(args.prefetch), "--send-window", str(window)]
    cpu0 = time.process_time()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"the remote run of {mode} failed:\n{done.stderr}")
    remote = json.loads(done.stdout)
    remote["flat_out"]["service_cpu_us_per_msg"] = round(
        (time.process_time() - cpu0) / remote["flat_out"]["messages"] * 1e6, 1)
    remote["send_window"] = window
    return remote


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--latency-messages", type=int, default=3000)
    ap.add_argument("--prefetch", type=int, default=100)
    ap.add_argument("--send-window", type=int, default=64,
                    help="window of the pipelined persistent runs (the strict runs wait for every send)")
    ap.add_argument("--mode", choices=sorted(MODES))
    ap.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return

    from bridgemgr.admin.portmapper import PortMapper
    from bridgemgr.netloop import NetLoop
    from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory
    from bridgemgr.providers.embedded.jmsservice import JmsService

    out: dict = {"message_bytes": args.size, "messages": args.messages, "prefetch": args.prefetch,
                 "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp, NetLoop() as netloop:
        for name in ([args.mode] if args.mode else MODES):
            _, sync, _ = MODES[name]
            broker = Broker(Path(tmp) / name, sync=sync)
            local = workloads(EmbeddedConnectionFactory(broker), args, name)
            service = JmsService(broker, netloop, "127.0.0.1", 0).start()
            mapper = PortMapper(netloop, "127.0.0.1", 0, "bench").start()
            mapper.register(service.service_entry())
            result = {"in_process": local}
            variants = {"remote": 0}
            if MODES[name][0] == DeliveryMode.PERSISTENT:
                variants[f"remote_send_window_{args.send_window}"] = args.send_window
            for label, window in variants.items():
                remote = run_child(args, name, f"mq://127.0.0.1:{mapper.port}", window)
                remote["ratio"] = round(remote["flat_out"]["msg_per_s"] / local["flat_out"]["msg_per_s"], 2)
                result[label] = remote
            service.stop()
            mapper.stop()
            broker.close()
            out[name] = result
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
