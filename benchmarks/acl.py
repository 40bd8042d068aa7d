"""What access control costs: STOMP and link throughput with it on and off; prints JSON.

    PYTHONPATH=. .venv/bin/python benchmarks/acl.py [--messages N] [--rounds R]

Each measurement runs --rounds times, off and on interleaved (this machine is shared and
noisy), and the median is reported with cost_percent = (off - on) / off * 100. "On" is the
shipped access control file (bridgemgr/accesscontrol.properties), checked as the service
checks it; "off" is imq.accesscontrol.enabled=false.

- stomp: benchmarks/stomp.py's load (4 producer and 4 consumer stomp.py processes, one
  queue, 1 KiB bodies, flat out, non-persistent and persistent, ack auto) against our
  STOMP bridge; every SEND and SUBSCRIBE goes through the host broker's check.
- link: a JMS bridge link src -> dst on the host broker, fed and drained as its users do:
  a producer sends N persistent 1 KiB messages to src over mq:// (the jms service, which
  checks every send) while a consumer over mq:// takes them from dst; msg/s = N / (first
  send .. last receive). The link's own host connections are the service itself and are
  not checked, so what access control costs here is the jms service's checks.
- host_send: the check alone, without sockets or other processes (whose noise on a shared
  machine is larger than the check): N non-persistent sends through the host broker's data
  path (what the STOMP bridge calls per SEND) into an in-memory broker, and check_ns, one
  cached decision (AccessControl.check) in nanoseconds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from link import make_bridge  # noqa: E402  (benchmarks/link.py)

from bridgemgr.accesscontrol import SHIPPED_FILE, AccessControl, AccessControls  # noqa: E402
from bridgemgr.jms import BytesMessage, DeliveryMode, Queue  # noqa: E402
from bridgemgr.jms.hostbroker import Principal  # noqa: E402
from bridgemgr.netloop import NetLoop  # noqa: E402
from bridgemgr.providers.embedded import Broker  # noqa: E402
from bridgemgr.providers.embedded.host import EmbeddedHostBroker  # noqa: E402
from bridgemgr.providers.embedded.remote import RemoteConnectionFactory  # noqa: E402


def _stomp_bench():
    """benchmarks/stomp.py as a module (its name would shadow the stomp package)."""
    spec = importlib.util.spec_from_file_location("stomp_bench", Path(__file__).with_name("stomp.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stomp_round(bench, messages: int, persistent: bool, access: bool) -> int:
    if access:
        os.environ["STOMP_BENCH_ACCESS_CONTROL"] = "1"
    else:
        os.environ.pop("STOMP_BENCH_ACCESS_CONTROL", None)
    with bench.OurBridge() as port:
        bench.run_load(port, count=max(200, messages // 10), rate=0, persistent=persistent, ack="auto")  # warm up
        return bench.run_load(port, count=messages, rate=0, persistent=persistent, ack="auto")["msg_per_s"]


def link_round(messages: int, access: bool) -> int:
    body = b"x" * 1024
    with tempfile.TemporaryDirectory(prefix="acl-bench-") as tmp:
        broker = Broker(Path(tmp) / "store")
        controls = AccessControls(jms=AccessControl("jms", SHIPPED_FILE)) if access else None
        host = EmbeddedHostBroker(broker, controls)
        loop = NetLoop().start()
        service = host.jms_service(
            loop, "127.0.0.1", 0, authenticator=lambda u, p: Principal(u, frozenset({"user"}), service="jms")
        ).start()
        bridge = make_bridge(broker, Path(tmp) / "var", 100, False)
        bridge.start()
        factory = RemoteConnectionFactory(f"mqtcp://127.0.0.1:{service.port}")
        done: list[float] = []

        def drain() -> None:
            conn = factory.create_connection("pat", "pw")
            conn.start()
            consumer = conn.create_session().create_consumer(Queue("dst"))
            for _ in range(messages):
                if consumer.receive(30) is None:
                    raise RuntimeError("the link stalled")
            done.append(time.perf_counter())
            conn.close()

        consumer = threading.Thread(target=drain)
        consumer.start()
        time.sleep(0.5)
        conn = factory.create_connection("pat", "pw")
        producer = conn.create_session().create_producer(Queue("src"))
        producer.delivery_mode = DeliveryMode.PERSISTENT
        start = time.perf_counter()
        for _ in range(messages):
            producer.send(BytesMessage(body))
        consumer.join()
        conn.close()
        bridge.stop()
        service.stop()
        loop.stop()
        broker.close()
        return round(messages / (done[0] - start))


def host_send_round(messages: int, access: bool) -> int:
    broker = Broker(None)
    controls = AccessControls(stomp=AccessControl("stomp", SHIPPED_FILE)) if access else None
    host = EmbeddedHostBroker(broker, controls)
    pat = Principal("pat", frozenset({"user"}), "127.0.0.1:1", "stomp")
    client = host.connect(pat)
    queue = Queue("orders")
    consumer = host.subscribe(pat, client, queue)  # keeps the queue short: taken as sent
    start = time.perf_counter()
    for _ in range(messages):
        host.send(pat, client, BytesMessage(b"x" * 1024), queue)
        host.acknowledge(pat, [host.receive(pat, consumer, 0)])
    elapsed = time.perf_counter() - start
    host.disconnect(pat, client)
    broker.close()
    return round(messages / elapsed)


def check_ns(calls: int = 200_000) -> float:
    control = AccessControl("stomp", SHIPPED_FILE)
    pat, queue = Principal("pat", frozenset({"user"}), service="stomp"), Queue("orders")
    start = time.perf_counter()
    for _ in range(calls):
        control.check(pat, "produce", queue)
    return round((time.perf_counter() - start) / calls * 1e9, 1)


def compare(rounds: int, run) -> dict:
    off, on = [], []
    for _ in range(rounds):
        off.append(run(False))
        on.append(run(True))
    m_off, m_on = statistics.median(off), statistics.median(on)
    return {
        "off_msg_per_s": round(m_off),
        "on_msg_per_s": round(m_on),
        "cost_percent": round((m_off - m_on) / m_off * 100, 1),
        "all_off": off,
        "all_on": on,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=3000, help="STOMP: per producer; link: in all (x5)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", choices=["host_send", "stomp", "link"], help="run one part only")
    args = ap.parse_args()
    bench = _stomp_bench()
    out: dict = {"rounds": args.rounds}
    if args.only in (None, "host_send"):
        out["host_send"] = compare(args.rounds * 3, lambda on: host_send_round(args.messages * 10, on))
        out["check_ns"] = check_ns()
        print(f"host_send: {out['host_send']}, check_ns: {out['check_ns']}", file=sys.stderr, flush=True)
    for persistent in (False, True) if args.only in (None, "stomp") else ():
        key = f"stomp_{'persistent' if persistent else 'non_persistent'}"
        out[key] = compare(args.rounds, lambda on, p=persistent: stomp_round(bench, args.messages, p, on))
        print(f"{key}: {out[key]}", file=sys.stderr, flush=True)
    if args.only in (None, "link"):
        out["link_over_mq"] = compare(args.rounds, lambda on: link_round(args.messages * 5, on))
    out["target_met"] = all(v["cost_percent"] < 5 for k, v in out.items() if isinstance(v, dict))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
