"""The management port (console) under the issue's targets, with a real service; prints JSON.

    .venv/bin/python benchmarks/console.py [--rounds R] [--messages N] [--requests Q]
                                           [--bridges B] [--links L] [--only overview|api|cost]

One BridgeServiceManager in this process (embedded host broker on SQLite, no fsync, the
console on a free 127.0.0.1 port, HTTP Basic on keep-alive connections, as a script
would): B idle JMS bridges of L links each (default 50 x 4) and a bridge "bench" with
one link bench.src -> bench.dst on the host broker. Measurements:

- overview: what one refresh of the console's overview fetches (console.js: GET
  /api/v1/bridges?links=true, every bridge with its links in one answer; --per-bridge:
  GET /api/v1/bridges, then GET /api/v1/bridges/{b} for every bridge, six at a time as a
  browser does, as console.js did before), p50/p99/max over --requests refreshes, and
  the service's CPU time per refresh (its process's, less what it spends idle) and as a
  share of one core at one refresh every 2 s: what an open console costs;
- api_under_load: N persistent 1 KiB messages produced into bench.src while its link is
  paused, the link resumed; GET /api/v1/bridges/bench/links/l in a row (one connection)
  until the backlog has moved: p50/p99/max next to the link's msg/s over that span
  (N / (resume .. last on dst)) and the load average; the same request with the link
  idle for reference; api_under_load_wide_window: the same with a second bridge whose
  link has imq.bridge.benchwide.link.window=--window (4000; the default is 1000), a
  setting a user would choose for throughput; a line per run on stderr;
- console_cost: the same drain with no console client and with one client refreshing the
  overview every 2 s (REFRESH_MS), interleaved over --rounds; ratio = with / without.

Targets (issue 40): overview < 1 s; API p99 < 50 ms while a link moves 10,000 msg/s; an
open console costs the transfer < 3% msg/s (ratio >= 0.97).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import multiprocessing
import os
import resource
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchcommon import percentiles

from bridgemgr.admin.protocol import Command
from bridgemgr.jms import BytesMessage, DeliveryMode, Queue
from bridgemgr.props import LINK_WINDOW, load_properties
from bridgemgr.providers.embedded import EmbeddedConnectionFactory
from bridgemgr.service import BridgeServiceManager

PASSWORD = "bench-adm1n"
AUTH = {"Authorization": "Basic " + base64.b64encode(f"admin:{PASSWORD}".encode()).decode()}
REFRESH_S = 2.0  # console.js REFRESH_MS
BROWSER_CONNECTIONS = 6  # HTTP/1.1 connections a browser opens to one host


def bridge_xml(name: str, links: int) -> str:
    """An idle bridge: ``links`` links {name}.src{i} -> {name}.dst{i} on the host broker."""
    link = (
        '<link name="l{i}" transacted="false"><source connection-factory-ref="host" destination-ref="s{i}"/>'
        '<target connection-factory-ref="host" destination-ref="d{i}"/></link>'
    )
    dests = '<destination ref-name="s{i}" name="{n}.src{i}"/><destination ref-name="d{i}" name="{n}.dst{i}"/>'
    return (
        f'<jmsbridge name="{name}">'
        + "".join(link.format(i=i) for i in range(links))
        + '<connection-factory ref-name="host"/>'
        + "".join(dests.format(i=i, n=name) for i in range(links))
        + "</jmsbridge>"
    )


BENCH_XML = """<jmsbridge name="{name}"><link name="l" transacted="false">
  <source connection-factory-ref="host" destination-ref="src"/>
  <target connection-factory-ref="host" destination-ref="dst"/>
  </link><connection-factory ref-name="host"/>
  <destination ref-name="src" name="{name}.src"/><destination ref-name="dst" name="{name}.dst"/></jmsbridge>"""
BENCH = "bench"  # the bench link's bridge, at the defaults
WIDE = "benchwide"  # the same link with a wider confirm window (--window): a throughput setting


def start_service(base: Path, bridges: int, links: int, window: int) -> BridgeServiceManager:
    names = [f"b{i:02d}" for i in range(bridges)] + [BENCH] + ([WIDE] if window else [])
    overrides = [
        f"imq.varhome={base / 'var'}",
        "imq.portmapper.port=0",
        "imq.jms.tcp.port=0",
        "imq.bridge.enabled=true",
        "imq.bridge.activelist=" + ",".join(names),
        "imq.bridge.admin.user=admin",
        f"imq.bridge.admin.password={PASSWORD}",
        "imq.bridge.admin.port=0",
        "imq.console.port=0",
        "imq.console.login.timeout=60",
    ]
    for name in names:
        xml = base / f"{name}.xml"
        xml.write_text(BENCH_XML.format(name=name) if name in (BENCH, WIDE) else bridge_xml(name, links))
        overrides += [f"imq.bridge.{name}.type=jms", f"imq.bridge.{name}.xmlurl={xml}"]
    if window:
        overrides.append(f"imq.bridge.{WIDE}.link.window={window}")
    manager = BridgeServiceManager(load_properties(overrides=overrides))
    manager.start()
    deadline = time.monotonic() + 120
    while any(b["state"] != "STARTED" for b in manager.dispatch(Command("LIST")).data["bridges"]):
        if time.monotonic() > deadline:
            raise RuntimeError("the bridges did not start within 120 s")
        time.sleep(0.1)
    return manager


class Client:
    """One keep-alive HTTP connection to the management port, Basic credentials."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(self, method: str, path: str) -> Any:
        headers = dict(AUTH)
        if method != "GET":
            headers["Content-Type"] = "application/json"
        self.conn.request(method, "/api/v1" + path, body=b"{}" if method != "GET" else None, headers=headers)
        response = self.conn.getresponse()
        answer = json.loads(response.read())
        if response.status != 200:
            raise RuntimeError(f"{method} {path}: {response.status} {answer}")
        return answer["data"]

    def close(self) -> None:
        self.conn.close()


class Overview:
    """The overview page's refresh: every bridge with its links in one request (or, with
    ``per_bridge``, the bridge list, then each bridge over six connections)."""

    per_bridge = False  # set by --per-bridge (in the client process: by run_client)

    def __init__(self, port: int) -> None:
        self.clients = [Client(port) for _ in range(BROWSER_CONNECTIONS)]
        self.free = list(self.clients)
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(BROWSER_CONNECTIONS)

    def _get(self, path: str) -> Any:
        with self.lock:
            client = self.free.pop()
        try:
            return client.call("GET", path)
        finally:
            with self.lock:
                self.free.append(client)

    def refresh(self) -> None:
        if not self.per_bridge:
            self._get("/bridges?links=true")
            return
        bridges = self._get("/bridges")["bridges"]
        list(self.pool.map(lambda b: self._get("/bridges/" + b["name"]), bridges))

    def close(self) -> None:
        self.pool.shutdown()
        for client in self.clients:
            client.close()


def with_max(samples: list[float]) -> dict[str, float | None]:
    """p50/p99/mean/max in ms; None each when no GET fell in the span (a short run's link
    may move every message before the first GET begins)."""
    if not samples:
        return {"p50_ms": None, "p99_ms": None, "mean_ms": None, "max_ms": None}
    return {**percentiles(samples), "max_ms": round(max(samples) * 1e3, 3)}


class Clients:
    """A client process (spawned: its HTTP and JSON work do not share the service's
    interpreter, as a browser's would not): ``overview`` refreshes the overview page every
    ``period`` s, ``link`` GETs the bench link in a row, from go() to stop(); each sample
    is (start, seconds) on the machine's monotonic clock (perf_counter, shared)."""

    def __init__(self, port: int, mode: str, period: float = 0.0, limit: int = 0, bridge: str = BENCH) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.ready, self.started, self.halt = ctx.Event(), ctx.Event(), ctx.Event()
        self.results, child = ctx.Pipe(duplex=False)
        self.process = ctx.Process(
            target=run_client,
            args=(port, mode, period, limit, self.ready, self.started, self.halt, child, Overview.per_bridge, bridge),
        )
        self.process.start()
        if not self.ready.wait(60):
            raise RuntimeError("the client process did not start within 60 s")

    def go(self) -> None:
        self.started.set()

    def stop(self) -> list[tuple[float, float]]:
        """Stop it now: its samples."""
        self.halt.set()
        return self.stop_after()

    def stop_after(self) -> list[tuple[float, float]]:
        """Its samples once it has taken its ``limit`` of them."""
        samples: list[tuple[float, float]] = self.results.recv()
        self.halt.set()
        self.process.join(30)
        return samples


def run_client(
    port: int,
    mode: str,
    period: float,
    limit: int,
    ready: Any,
    started: Any,
    halt: Any,
    out: Any,
    per_bridge: bool,
    bridge: str,
) -> None:
    Overview.per_bridge = per_bridge
    page = Overview(port) if mode == "overview" else None
    client = Client(port)
    link = f"/bridges/{bridge}/links/l"
    if page is not None:
        page.refresh()  # warm: connections open, credentials verified once
    client.call("GET", link)
    ready.set()
    started.wait()
    samples: list[tuple[float, float]] = []
    while not samples or (not halt.is_set() and (not limit or len(samples) < limit)):  # one at least
        start = time.perf_counter()
        if page is not None:
            page.refresh()
        else:
            client.call("GET", link)
        samples.append((start, time.perf_counter() - start))
        if period:
            halt.wait(period)  # the page's setInterval pace, not a wait for an event
    out.send(samples)
    client.close()
    if page is not None:
        page.close()


def cpu_seconds() -> float:
    """CPU time of this process (the service: the clients are processes of their own)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def overview(manager: BridgeServiceManager, requests: int) -> dict:
    clients = Clients(manager.console.port, "overview", limit=requests)
    wall, used = time.perf_counter(), cpu_seconds()
    time.sleep(3)  # the service's own CPU while nobody asks (idle links, housekeeping)
    idle_rate = (cpu_seconds() - used) / (time.perf_counter() - wall)
    wall, used = time.perf_counter(), cpu_seconds()
    clients.go()
    samples = [seconds for _, seconds in clients.stop_after()]
    per_refresh = max(0.0, (cpu_seconds() - used - idle_rate * (time.perf_counter() - wall)) / len(samples))
    return {
        "refreshes": len(samples),
        **with_max(samples),
        "service_cpu_per_refresh_ms": round(per_refresh * 1e3, 2),
        "open_console_cpu_share": round(per_refresh / REFRESH_S, 4),
    }


class Drain:
    """n messages into {bridge}.src while its link is paused (over the API), then resumed."""

    def __init__(self, manager: BridgeServiceManager, n: int, body: bytes, bridge: str = BENCH) -> None:
        assert manager.host_broker is not None
        self.broker = manager.host_broker.broker
        self.admin = Client(manager.console.port)
        self.n = n
        self.bridge = bridge
        self.dst = f"{bridge}.dst"
        self.start = 0.0  # resume()
        self.run: dict = {}  # link_gets: what finish() answered
        self.admin.call("POST", f"/bridges/{bridge}/links/l/pause")
        conn = EmbeddedConnectionFactory(self.broker).create_connection()
        producer = conn.create_session().create_producer(Queue(f"{bridge}.src"))
        producer.delivery_mode = DeliveryMode.PERSISTENT
        for _ in range(n):
            producer.send(BytesMessage(body))
        conn.close()
        if self.broker.store is not None:
            self.broker.store.flush()
        self.base = self.broker.queue_depth(self.dst)

    def moved(self) -> int:
        return self.broker.queue_depth(self.dst) - self.base

    def resume(self) -> None:
        self.admin.call("POST", f"/bridges/{self.bridge}/links/l/resume")
        self.start = time.perf_counter()

    def finish(self) -> dict:
        """Wait for the whole backlog on dst, empty dst; msg/s of the drain."""
        deadline = time.monotonic() + 600
        while self.moved() < self.n:  # coarse: a busy poller would slow the link
            if time.monotonic() > deadline:
                raise RuntimeError(f"the link moved {self.moved()} of {self.n} in 600 s")
            time.sleep(0.005)
        elapsed = time.perf_counter() - self.start
        self.admin.close()
        conn = EmbeddedConnectionFactory(self.broker).create_connection()
        conn.start()
        consumer = conn.create_session().create_consumer(Queue(self.dst))
        for got in range(self.n + self.base):
            if consumer.receive(10) is None:
                raise RuntimeError(f"{self.dst} stalled after {got} messages")
        conn.close()
        return {"messages": self.n, "seconds": round(elapsed, 3), "msg_per_s": round(self.n / elapsed)}


def link_gets(manager: BridgeServiceManager, requests: int, drain: Drain | None, bridge: str = BENCH) -> list[float]:
    """GET the bench link in a row from a client process: ``requests`` of them, or while
    ``drain`` moves (those begun before its last message arrived)."""
    clients = Clients(manager.console.port, "link", limit=0 if drain else requests, bridge=bridge)
    if drain is None:
        clients.go()
        return [seconds for _, seconds in clients.stop_after()]
    clients.go()
    drain.resume()
    run = drain.finish()
    drain.run = run
    return [seconds for start, seconds in clients.stop() if drain.start <= start < drain.start + run["seconds"]]


def api_under_load(
    manager: BridgeServiceManager, n: int, requests: int, body: bytes, window: int, bridge: str = BENCH
) -> dict:
    """The link's GET idle, then while the link drains n messages: p50/p99/max next to the
    link's msg/s over the same span (the GETs counted are those begun while it moved)."""
    idle = link_gets(manager, requests, None, bridge)
    drain = Drain(manager, n, body, bridge)
    load = round(os.getloadavg()[0], 2)
    samples = link_gets(manager, requests, drain, bridge)
    loaded = with_max(samples)
    p99 = loaded["p99_ms"]
    return {
        "link_window": window,
        "idle": {"requests": len(idle), **with_max(idle)},
        "under_load": {
            "requests": len(samples),
            **loaded,
            "link_msg_per_s": drain.run["msg_per_s"],
            "load_average_1m": [load, round(os.getloadavg()[0], 2)],
        },
        "link": drain.run,
        "target_met_p99_50ms_at_10000": p99 is not None and p99 < 50 and drain.run["msg_per_s"] >= 10_000,
    }


def drain_with(manager: BridgeServiceManager, n: int, body: bytes, console_open: bool) -> dict:
    drain = Drain(manager, n, body)
    clients = Clients(manager.console.port, "overview", period=REFRESH_S) if console_open else None
    if clients is not None:
        clients.go()
    drain.resume()
    run = drain.finish()
    refreshes = clients.stop() if clients is not None else []
    return {**run, "overview_refreshes": len(refreshes)}


def console_cost(manager: BridgeServiceManager, n: int, rounds: int, body: bytes) -> dict:
    without: list[dict] = []
    with_console: list[dict] = []
    for i in range(rounds):  # interleaved, alternating which goes first
        pair = [False, True] if i % 2 == 0 else [True, False]
        for console_open in pair:
            (with_console if console_open else without).append(drain_with(manager, n, body, console_open))
    median = lambda runs: sorted(r["msg_per_s"] for r in runs)[len(runs) // 2]  # noqa: E731
    ratio = round(median(with_console) / median(without), 3)
    return {
        "no_console_msg_per_s": median(without),
        "console_open_msg_per_s": median(with_console),
        "all_no_console": [r["msg_per_s"] for r in without],
        "all_console_open": [r["msg_per_s"] for r in with_console],
        "overview_refreshes_per_run": [r["overview_refreshes"] for r in with_console],
        "ratio": ratio,
        "target_met_cost_under_3pct": ratio >= 0.97,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved console_cost rounds")
    ap.add_argument("--messages", type=int, default=30_000, help="backlog the link drains per run")
    ap.add_argument("--requests", type=int, default=1000, help="API requests; overview refreshes are a tenth")
    ap.add_argument("--bridges", type=int, default=50)
    ap.add_argument("--links", type=int, default=4)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--only", choices=("overview", "api", "cost"))
    ap.add_argument("--per-bridge", action="store_true", help="the overview as one request per bridge (the old way)")
    ap.add_argument(
        "--window",
        type=int,
        default=4000,
        help="api: also drain a link with this link.window (a throughput setting; 0: not)",
    )
    args = ap.parse_args()
    Overview.per_bridge = args.per_bridge
    body = bytes(range(256)) * (args.size // 256) + b"x" * (args.size % 256)
    out: dict = {
        "bridges": f"{args.bridges} x {args.links} idle links + 1 bench link",
        "overview_requests": "one per bridge" if args.per_bridge else "one (links=true)",
        "message_bytes": args.size,
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        window = args.window if args.only in (None, "api") else 0
        manager = start_service(Path(tmp), args.bridges, args.links, window)
        out["service_start_s"] = round(time.perf_counter() - start, 2)
        try:
            if args.only in (None, "overview"):
                out["overview"] = overview(manager, max(1, args.requests // 10))
                out["overview"]["target_met_under_1s"] = out["overview"]["max_ms"] < 1000
            if args.only in (None, "api"):
                out["api_under_load"] = api_under_load(manager, args.messages, args.requests, body, LINK_WINDOW)
                if window:
                    out["api_under_load_wide_window"] = api_under_load(
                        manager, args.messages, args.requests, body, window, WIDE
                    )
                for key in ("api_under_load", "api_under_load_wide_window"):
                    if key in out:
                        run = out[key]["under_load"]
                        print(
                            f"{key}: link.window {out[key]['link_window']}: link GET p50 {run['p50_ms']} ms, "
                            f"p99 {run['p99_ms']} ms, max {run['max_ms']} ms ({run['requests']} GETs) while the "
                            f"link moved {run['link_msg_per_s']} msg/s; load average {run['load_average_1m']}",
                            file=sys.stderr,
                        )
            if args.only in (None, "cost"):
                out["console_cost"] = console_cost(manager, args.messages, args.rounds, body)
        finally:
            manager.stop()
    out["load_average_1m_after"] = round(os.getloadavg()[0], 2)
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
