"""STOMP bridge against ActiveMQ's and RabbitMQ's STOMP, same load, same run; prints JSON.

    .venv/bin/python benchmarks/stomp.py [--messages N] [--rate R] [--seconds S]
                                         [--acks auto,client-individual]
                                         [--only imqbridge|activemq|rabbitmq[,...]]
                                         [--store-sync on|off] [--receipts last|every]

The load: 4 producer and 4 consumer stomp.py 1.2 connections, one process
per connection (threads would be GIL-bound), TCP_NODELAY on the clients, 1 KiB bodies,
one shared queue (competing consumers), persistent and non-persistent:

- throughput: every producer sends N messages flat out; msg/s = messages received /
  (common start .. last message received);
- latency: the producers together send R msg/s (paced) for S seconds; each message carries
  its send time; p50/p99 of receive minus send, on one clock (one machine). --seconds 0
  skips it;
- CPU: microseconds of CPU (user + system) per message of the broker's process tree and of
  the client processes during the flat-out run. The machine is shared and the brokers run
  one after the other, so msg/s moves with the load; CPU per message hardly does, and when
  clients and broker share the cores (flat out) msg/s follows 1 / (client + broker CPU).

--receipts every: each SEND asks a receipt (pipelined: the producer does not wait for one
before its next SEND), so every persistent message waits for its store write before its
receipt; last (the default): only each producer's last SEND asks one.

Brokers: our bridge in its own process (embedded broker, SQLite store with fsync per group
commit, so persistent means on disk, as ActiveMQ's KahaDB journal syncs by default;
--store-sync off runs it as a service's default settings do: written, not fsynced), and
ActiveMQ 5.x from the Debian package, started as docs/architecture.md says with a STOMP
connector on a free port (transport.tcpNoDelay=true) in a temporary activemq.base, and
RabbitMQ from the Debian package with its STOMP plugin (tests/real/servers.py: a node on
free loopback ports in a temporary directory; /queue/NAME is a durable queue, persistent
messages go to its message store, subscriptions have no prefetch limit), each stopped at
the end. The brokers run one after the other on the same cores; "ratio" divides our msg/s
by each peer's and by the faster peer's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# This file is called stomp.py: keep its folder off the path so `import stomp` is stomp.py.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "tests" / "real"))

HOST = "127.0.0.1"
BODY = b"x" * 1024
PRODUCERS = CONSUMERS = 4
ACTIVEMQ_JAR = Path("/usr/share/activemq/bin/activemq.jar")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


# --- client processes ---------------------------------------------------------------------


def _connect(port: int, auth: Sequence[str]):
    """A stomp.py 1.2 connection, connected with ``auth``: login, passcode and the host
    header (RabbitMQ's virtual host; stomp.py would send the IP address)."""
    import stomp

    conn = stomp.Connection12([(HOST, port)], heartbeats=(0, 0), auto_decode=False, vhost=auth[2])
    return conn


def _nodelay(conn) -> None:
    sock = getattr(conn.transport, "socket", None)
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def producer(
    port: int,
    auth: Sequence[str],
    queue: str,
    count: int,
    rate: float,
    persistent: str,
    start_at: float,
    receipts: str = "last",
) -> dict:
    import threading

    import stomp

    confirmed = threading.Event()

    class Listener(stomp.ConnectionListener):
        def on_receipt(self, frame):
            if frame.headers.get("receipt-id") == "last":
                confirmed.set()

    conn = _connect(port, auth)
    conn.set_listener("l", Listener())
    conn.connect(auth[0], auth[1], wait=True)
    _nodelay(conn)
    while time.time() < start_at:
        time.sleep(0.001)
    begin = time.time()
    for i in range(count):
        if rate:
            delay = begin + i / rate - time.time()
            if delay > 0:
                time.sleep(delay)
        headers = {"persistent": persistent, "ts": repr(time.time())}
        if i == count - 1:
            headers["receipt"] = "last"  # the broker has taken every SEND when it answers
        elif receipts == "every":
            headers["receipt"] = str(i)
        conn.send(queue, BODY, headers=headers)
    confirmed.wait(600)
    conn.disconnect()
    return {"sent": count, "seconds": time.time() - begin}


def consumer(port: int, auth: Sequence[str], queue: str, ack: str, start_at: float) -> dict:
    import threading

    import stomp

    done = threading.Event()
    stats = {"received": 0, "first": None, "last": None, "latencies": []}
    conn = _connect(port, auth)

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame):
            now = time.time()
            headers = frame.headers
            if headers.get("kind") == "stop":
                if ack != "auto":
                    conn.ack(headers["ack"])
                done.set()
                return
            if done.is_set():
                return
            stats["received"] += 1
            stats["last"] = now
            if stats["first"] is None:
                stats["first"] = now
            stats["latencies"].append(now - float(headers["ts"]))
            if ack != "auto":
                conn.ack(headers["ack"])

    conn.set_listener("l", Listener())
    conn.connect(auth[0], auth[1], wait=True)
    _nodelay(conn)
    conn.subscribe(queue, id="1", ack=ack)
    done.wait(600)
    conn.disconnect()
    return stats


def run_role(args: argparse.Namespace) -> None:
    spec = json.loads(args.role)
    role, out = spec.pop("role"), spec.pop("out")
    result = producer(**spec) if role == "producer" else consumer(**spec)
    Path(out).write_text(json.dumps(result))  # a file: a pipe would block on big results


class Client:
    """One client process; its result lands in a file."""

    def __init__(self, spec: dict) -> None:
        fd, self.out = tempfile.mkstemp(prefix="stomp-bench-", suffix=".json")
        os.close(fd)
        self.proc = subprocess.Popen([sys.executable, __file__, "--role", json.dumps({**spec, "out": self.out})])

    def poll(self) -> int | None:
        return self.proc.poll()

    def result(self) -> dict:
        self.proc.wait(900)
        try:
            return json.loads(Path(self.out).read_text())
        finally:
            os.unlink(self.out)


def spawn(spec: dict) -> Client:
    return Client(spec)


def stop_consumers(port: int, auth: Sequence[str], queue: str, consumers: list[Client]) -> None:
    """Send stop messages (after every producer's last message) until every consumer left;
    one consumer may take several, so send more while any is still there."""
    conn = _connect(port, auth)
    conn.connect(auth[0], auth[1], wait=True)
    while any(proc.poll() is None for proc in consumers):
        for _ in range(CONSUMERS):
            conn.send(queue, b"", headers={"kind": "stop", "persistent": "false", "ts": "0"})
        time.sleep(0.5)
    conn.disconnect()


_runs = iter(range(1, 10**6))


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` and its descendants."""
    children: dict[int, list[int]] = {}
    for line in subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout.splitlines():
        if line.strip():
            child, parent = map(int, line.split())
            children.setdefault(parent, []).append(child)
    pids, total, tick = [pid], 0.0, os.sysconf("SC_CLK_TCK")
    for p in pids:
        pids += children.get(p, [])
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def clients_cpu() -> float:
    """CPU seconds of the client processes waited for so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_load(
    port: int,
    auth: Sequence[str],
    send_prefix: str,
    *,
    count: int,
    rate: float,
    persistent: bool,
    ack: str,
    receipts: str = "last",
) -> dict:
    """One run on a fresh queue (stop messages of one run never reach the next); producers
    send to ``send_prefix`` + its name."""
    name = f"bench{next(_runs)}"
    queue, send_to = "/queue/" + name, send_prefix + name
    start_at = time.time() + 2.0
    p = "true" if persistent else "false"
    consumers = [
        spawn({"role": "consumer", "port": port, "auth": auth, "queue": queue, "ack": ack, "start_at": start_at})
        for _ in range(CONSUMERS)
    ]
    time.sleep(1.0)  # subscribed before the first send
    per_rate = rate / PRODUCERS if rate else 0
    producers = [
        spawn(
            {
                "role": "producer",
                "port": port,
                "auth": auth,
                "queue": send_to,
                "count": count,
                "rate": per_rate,
                "persistent": p,
                "start_at": start_at,
                "receipts": receipts,
            }
        )
        for _ in range(PRODUCERS)
    ]
    for proc in producers:
        proc.result()
    stop_consumers(port, auth, send_to, consumers)
    results = [proc.result() for proc in consumers]
    received = sum(r["received"] for r in results)
    last = max(r["last"] for r in results if r["last"])
    latencies = sorted(x for r in results for x in r["latencies"])
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000  # noqa: E731
    return {
        "messages": received,
        "expected": count * PRODUCERS,
        "msg_per_s": round(received / (last - start_at)),
        "p50_ms": round(pick(0.50), 2),
        "p99_ms": round(pick(0.99), 2),
        "mean_ms": round(statistics.fmean(latencies) * 1000, 2),
    }


# --- the brokers ---------------------------------------------------------------------------


def serve_bridge(directory: str, port: int) -> None:
    """Our bridge in this process until SIGTERM (the --serve-bridge role)."""
    import logging

    from bridgemgr import gcpolicy
    from bridgemgr.netloop import NetLoop
    from bridgemgr.providers.embedded import Broker
    from bridgemgr.providers.embedded.host import EmbeddedHostBroker
    from bridgemgr.stompbridge import StompBridge, StompConfig
    from bridgemgr.users import UserRepository

    logging.basicConfig(level=logging.INFO if os.environ.get("STOMP_BENCH_LOG") else logging.WARNING)
    gcpolicy.tune()  # as `serve` does
    broker = Broker(Path(directory) / "store", sync=os.environ.get("STOMP_BENCH_SYNC", "on") == "on")
    users = UserRepository(Path(directory) / "passwd")
    users.add("admin", "secret", "admin")
    loop = NetLoop().start()
    access = None
    if os.environ.get("STOMP_BENCH_ACCESS_CONTROL"):  # benchmarks/acl.py: the shipped rules checked
        from bridgemgr.accesscontrol import SHIPPED_FILE, AccessControl, AccessControls

        access = AccessControls(stomp=AccessControl("stomp", SHIPPED_FILE))
    bridge = StompBridge(StompConfig(hostname=HOST, tcp_port=port), EmbeddedHostBroker(broker, access), users, loop)
    bridge.start()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    print("ready", flush=True)
    while not stop:
        time.sleep(0.2)
    bridge.stop()
    loop.stop()
    broker.close()


def wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((HOST, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"nothing listens on {HOST}:{port} after {timeout} s")


class OurBridge:
    name = "imqbridge"
    auth = ("admin", "secret", "/")
    send_prefix = "/queue/"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def __enter__(self) -> int:
        self.dir = tempfile.mkdtemp(prefix="stomp-bench-")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-bridge", self.dir, str(self.port)], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout.readline().strip() == "ready"
        return self.port

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        shutil.rmtree(self.dir, ignore_errors=True)


class ActiveMQ:
    name = "activemq"
    auth = ("admin", "secret", "/")  # ActiveMQ's STOMP connector checks no login by default
    send_prefix = "/queue/"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def __enter__(self) -> int:
        self.base = Path(tempfile.mkdtemp(prefix="activemq-bench-"))
        conf = self.base / "conf"
        conf.mkdir()
        self.port = free_port()
        (conf / "activemq.xml").write_text(
            textwrap.dedent(f"""\
            <beans xmlns="http://www.springframework.org/schema/beans"
              xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
              xsi:schemaLocation="http://www.springframework.org/schema/beans http://www.springframework.org/schema/beans/spring-beans-2.0.xsd
              http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
              <bean class="org.springframework.beans.factory.config.PropertyPlaceholderConfigurer"/>
              <broker xmlns="http://activemq.apache.org/schema/core" useJmx="false" brokerName="bench"
                      dataDirectory="{self.base}/data">
                <persistenceAdapter><kahaDB directory="{self.base}/data/kahadb"/></persistenceAdapter>
                <transportConnectors>
                  <transportConnector name="stomp" uri="stomp://{HOST}:{self.port}?transport.tcpNoDelay=true"/>
                </transportConnectors>
              </broker>
            </beans>
            """)
        )
        log4j = Path("/etc/activemq/instances-available/main/log4j2.properties")
        if log4j.exists():
            shutil.copy(log4j, conf / "log4j2.properties")
        self.proc = subprocess.Popen(
            [
                "java",
                "-Xms512M",
                "-Xmx512M",
                f"-Dactivemq.base={self.base}",
                f"-Dactivemq.conf={conf}",
                f"-Dactivemq.data={self.base / 'data'}",
                "-Dactivemq.home=/usr/share/activemq",
                "-jar",
                str(ACTIVEMQ_JAR),
                "start",
                f"xbean:file:{conf / 'activemq.xml'}",
            ],
            stdout=open(self.base / "out.log", "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_port(self.port, 90)
        except RuntimeError:
            self.__exit__()
            raise
        return self.port

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.base, ignore_errors=True)


class RabbitMQ:
    """RabbitMQ with its STOMP plugin (tests/real/servers.py), in a temporary directory."""

    name = "rabbitmq"
    auth = ("guest", "guest", "/")
    # /queue/NAME on SEND declares the queue again, durable only for persistent:true (a
    # non-persistent SEND to the durable queue the consumers declared is refused);
    # /amq/queue/NAME sends to the existing queue
    send_prefix = "/amq/queue/"

    @property
    def pid(self) -> int:
        assert self.node.proc is not None
        return self.node.proc.pid

    def __enter__(self) -> int:
        from servers import RabbitMQ as Node

        self.base = Path(tempfile.mkdtemp(prefix="rabbitmq-bench-"))  # user rabbitmq must reach it
        self.node = Node(self.base).start()
        return self.node.stomp_port

    def __exit__(self, *exc: object) -> None:
        self.node.stop()
        shutil.rmtree(self.base, ignore_errors=True)


BROKERS = {"imqbridge": OurBridge, "activemq": ActiveMQ, "rabbitmq": RabbitMQ}


def missing(name: str) -> str | None:
    """Why peer ``name`` cannot run here, or None."""
    if name == "imqbridge":
        return None
    from servers import missing_package

    return missing_package("activemq" if name == "activemq" else "rabbitmq-server")


def bench(broker, args: argparse.Namespace) -> dict:
    out: dict = {}
    with broker as port:
        auth, prefix, pid = broker.auth, broker.send_prefix, broker.pid
        for persistent in (True, False):  # warm up (the JVM's JIT, our caches); not reported
            run_load(port, auth, prefix, count=max(200, args.messages // 10), rate=0, persistent=persistent, ack="auto")
        for ack in args.acks.split(","):
            for persistent in (True, False):
                key = f"{'persistent' if persistent else 'non_persistent'}_ack_{ack}"
                server, clients = tree_cpu(pid), clients_cpu()
                flat = run_load(
                    port,
                    auth,
                    prefix,
                    count=args.messages,
                    rate=0,
                    persistent=persistent,
                    ack=ack,
                    receipts=args.receipts,
                )
                n = max(1, flat["messages"])
                out[key] = {
                    "msg_per_s": flat["msg_per_s"],
                    "flat_out_p50_ms": flat["p50_ms"],
                    "received": f"{flat['messages']}/{flat['expected']}",
                    "broker_cpu_us_per_msg": round((tree_cpu(pid) - server) / n * 1e6, 1),
                    "client_cpu_us_per_msg": round((clients_cpu() - clients) / n * 1e6, 1),
                }
                if args.seconds > 0:
                    paced = run_load(
                        port,
                        auth,
                        prefix,
                        count=int(args.rate * args.seconds / PRODUCERS),
                        rate=args.rate,
                        persistent=persistent,
                        ack=ack,
                        receipts=args.receipts,
                    )
                    out[key][f"at_{int(args.rate)}_msg_per_s"] = {k: paced[k] for k in ("p50_ms", "p99_ms", "mean_ms")}
                    out[key]["paced_received"] = f"{paced['messages']}/{paced['expected']}"
                print(f"{broker.name} {key}: {out[key]}", file=sys.stderr, flush=True)
    return out


def ratios(result: dict) -> dict:
    """Our msg/s over each peer's and over the faster peer's, per workload."""
    ours = result["imqbridge"]
    peers = {
        name: rows
        for name, rows in result.items()
        if name in BROKERS and name != "imqbridge" and isinstance(rows, dict)
    }
    out = {}
    for key, row in ours.items() if isinstance(ours, dict) else ():
        theirs = {name: rows[key]["msg_per_s"] for name, rows in peers.items() if key in rows}
        if not theirs:
            continue
        entry: dict = {f"vs_{name}_x": round(row["msg_per_s"] / rate, 2) for name, rate in theirs.items()}
        faster = max(theirs, key=lambda name: theirs[name])
        entry["faster_peer"] = faster
        entry["vs_faster_peer_x"] = round(row["msg_per_s"] / theirs[faster], 2)
        entry["broker_cpu_us_per_msg"] = {
            "imqbridge": row["broker_cpu_us_per_msg"],
            **{name: rows[key]["broker_cpu_us_per_msg"] for name, rows in peers.items() if key in rows},
        }
        out[key] = entry
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000, help="per producer, flat out")
    parser.add_argument("--rate", type=float, default=1000.0, help="msg/s of all producers together")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the paced run; 0: none")
    parser.add_argument("--acks", default="auto", help="ack modes to run, comma separated")
    parser.add_argument("--only", help="brokers to run, comma separated (imqbridge, activemq, rabbitmq)")
    parser.add_argument(
        "--store-sync",
        choices=("on", "off"),
        default="on",
        help="our store fsyncs each batch (on) or only writes it (off: the service's default)",
    )
    parser.add_argument(
        "--receipts",
        choices=("last", "every"),
        default="last",
        help="which SENDs ask a receipt: each producer's last, or every one (pipelined)",
    )
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("--serve-bridge", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        return run_role(args)
    if args.serve_bridge:
        return serve_bridge(*args.serve_bridge[:1], int(args.serve_bridge[1]))
    os.environ["STOMP_BENCH_SYNC"] = args.store_sync  # read by the --serve-bridge process
    only = args.only.split(",") if args.only else list(BROKERS)
    if unknown := set(only) - set(BROKERS):
        parser.error(f"--only: unknown broker {', '.join(sorted(unknown))}; choose from {', '.join(BROKERS)}")
    result: dict = {
        "load": {
            "producers": PRODUCERS,
            "consumers": CONSUMERS,
            "body_bytes": len(BODY),
            "messages_per_producer": args.messages,
            "paced_rate": args.rate,
            "paced_seconds": args.seconds,
            "client": "stomp.py 1.2, one process per connection",
            "store_sync": args.store_sync,
            "receipts": args.receipts,
        },
        "load_average": os.getloadavg(),
    }
    for name, broker in BROKERS.items():
        if name not in only:
            result[name] = "skipped (--only)"
        elif (why := missing(name)) is not None:
            result[name] = f"skipped: {why}"
        else:
            result[name] = bench(broker(), args)
    result["ratio"] = ratios(result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
