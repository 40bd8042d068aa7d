"""A link drained on the local runner and on Spark local[1] / local[2] / a standalone cluster,
in one run; prints JSON.

    .venv/bin/python benchmarks/spark.py [--messages N] [--trivial-messages M] [--batch B]
        [--pairs K] [--cluster-messages C] [--compare-query] [--shipped] [--size BYTES]

One embedded broker in this process with a persistent store and its jms connection
service on loopback (what a Spark link's processes reach the host broker through). Each
run fills its own source queue with N persistent 1 KiB TextMessages (an XML document),
then drains it through a non-transacted link to its own target queue:

- local: the local runner (a thread of this process, the broker in-process, as in the
  service), acknowledge per message as the chapter says;
- spark_local1, spark_local2: the same link drained as `imqbridgemgr drain` does
  (drainjob.py: the driver receives, logs and acknowledges; one Spark job per logged
  batch, whose tasks read their slice of the log, transform and send over the jms
  service), in a child process per master (one SparkSession per process), batches of
  --batch messages (50,000: what `imqbridgemgr drain` takes by default). msg/s = N /
  (drain start .. drain end); the session start-up (7-11 s) is left out, the first
  batch's set-up (Python workers, connections) is in; steady_msg_per_s leaves the first
  batch out. With --compare-query, spark_local2_query drains once as a streaming query
  with Trigger.AvailableNow (how drain ran before: query_start_s is Spark's Python
  processes for the data source before its first batch);
- the cluster row (--cluster-messages, 100,000): local, spark_cluster (a standalone
  master and two 1-core workers on loopback, started from the installed pyspark as the
  tests' cluster fixture does; its driver ships each slice's records, as on any master that
  is not local) and spark_local2, once each, with the heavy transformer.

The heavy transformer parses each message's XML with xml.dom.minidom and writes it out
again (~0.25 ms of pure-Python CPU per message on an idle core, ~0.6 ms on a busy machine): on this 2-core machine
the target is spark_local2 >= 1.6 x local (it must scale with cores). The trivial runs
(an identity transformer, --trivial-messages each) give the per-message cost of each
runner once running (steady, in microseconds), Spark's overhead per message over the
local runner's, and the first batch's seconds (Python workers, connections: fixed).

This machine is a shared virtual machine, and its speed moves while the runs go: one
process's rate of the heavy work varies by +-15% from one 2-second sample to the next, and
two processes get 1.5x to 2.7x of one. So the heavy local and spark_local2 runs are made
--pairs times each (2), in mirrored order (local, spark 2, spark 1, spark 2, local), and
the ratio is of their summed times; --shipped adds spark_local2_shipped beside each
spark_local2 run (heavy and trivial): the same with imq.bridge.spark.sourcelog=shipped (the
driver ships each slice's records in its task, as on a cluster whose executors cannot read
its disk; shipped_to_shared: its msg/s over spark_local2's); spark_local2_to_local_by_pair
shows how far single pairs stray. load_before/after: the load average each run saw (other processes' work takes
cores local[2] needs). spark_local2_steady_to_local compares Spark once running (its
batches after the first) with the local runner, and spark_local2_fixed_s is what each
Spark drain took beyond its steady rate: the query's start and the first batch's set-up.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bridgemgr.jms import DeliveryMode, Queue, TextMessage  # noqa: E402

HEAVY = "benchxml.ReserialiseXML"
TRIVIAL = "benchxml.Identity"
TRANSFORMERS = HERE / "transformers"


def document(size: int = 1024) -> str:
    """An XML order of about ``size`` characters."""
    items, i = [], 0
    head = '<?xml version="1.0"?><order id="42"><customer>ACME</customer>'
    length = len(head)
    while length < size - 60:
        items.append(f'<item id="{i}" kind="k{i % 7}"><name>item {i}</name><qty>{i * 3}</qty></item>')
        length += len(items[-1])
        i += 1
    body = head + "".join(items) + "</order>"
    return body + " " * max(0, size - len(body))


def bridge_xml(run: str, transformer: str) -> bytes:
    return f"""<jmsbridge name="bench" log-message-transfer="false">
      <link name="l" transacted="false">
        <source connection-factory-ref="host" destination-ref="src"/>
        <target connection-factory-ref="host" destination-ref="dst"
                message-transformer-class="{transformer}"/>
      </link>
      <connection-factory ref-name="host"/>
      <destination ref-name="src" name="src_{run}"/><destination ref-name="dst" name="dst_{run}"/>
    </jmsbridge>""".encode()


# --- the child: one Spark drain -------------------------------------------------------------------
def child(args: argparse.Namespace) -> None:
    from bridgemgr.spark.runner import link_options, parallelism
    from bridgemgr.spark.session import spark_session
    from bridgemgr.spark.slices import ships_log

    base = Path(args.work)
    conf = {
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.memory": "1g",
        "spark.local.dir": str(base / "spark-local"),
        "spark.sql.warehouse.dir": str(base / "warehouse"),
    }
    if args.master.startswith("spark://"):  # the loopback cluster's 1 GiB workers
        conf.update({"spark.driver.host": "127.0.0.1", "spark.executor.memory": "512m"})
    spark = spark_session(app_name="imqbridge-bench", master=args.master, conf=conf)
    checkpoint = base / "checkpoint"
    options = link_options(
        checkpoint,
        xmlurl=args.xml,
        bridge="bench",
        link="l",
        broker_url=args.broker_url,
        parallelism=parallelism(args.master, {}),
        max_per_batch=args.batch,
        receive_wait=1.0,
        transformer_path=str(TRANSFORMERS),
        ship_log=ships_log(args.master, args.sourcelog),
    )
    result = (drain_query if args.mode == "query" else drain_batches)(spark, options, checkpoint)
    print(json.dumps(result))
    spark.stop()


def drain_batches(spark, options, checkpoint: Path) -> dict:
    """`imqbridgemgr drain`'s way: Spark batch jobs over the source log (drainjob.py); the
    batches' times from the stats file (each line's time: its job's end)."""
    from bridgemgr.spark.drainjob import BatchDrain
    from bridgemgr.spark.sink import read_stats

    start, wall = time.perf_counter(), time.time()
    drain = BatchDrain(spark, options)
    drain.run()
    elapsed = time.perf_counter() - start
    lines = [line for _, line in sorted(read_stats(options.stats).items()) if line["rows"]]
    ends = [wall] + [line["at"] for line in lines]
    batch_s = [round(b - a, 2) for a, b in itertools.pairwise(ends)]
    later_s = ends[-1] - ends[1] if len(ends) > 2 else 0
    return {
        "seconds": elapsed,
        "batches": len(lines),
        "query_start_s": None,
        "first_batch_s": batch_s[0] if batch_s else None,
        "steady_msg_per_s": (round(sum(line["rows"] for line in lines[1:]) / later_s) if later_s else None),
        "batch_rows": [line["rows"] for line in lines],
        "batch_s": batch_s,
    }


def drain_query(spark, options, checkpoint: Path) -> dict:
    """The streaming way (a link's query with Trigger.AvailableNow), for comparison."""
    from bridgemgr.spark.runner import start_query

    start, wall = time.perf_counter(), time.time()
    query = start_query(spark, options, checkpoint, available_now=True)
    query.awaitTermination()
    elapsed = time.perf_counter() - start
    batches = [p for p in query.recentProgress if p.get("numInputRows")]
    later = batches[1:]
    later_s = sum(p["durationMs"]["triggerExecution"] for p in later) / 1000
    # from start_query until the first batch begins: Spark's Python processes for the data
    # source's lookup and creation, the driver's source runner (receiver connected)
    first_at = datetime.fromisoformat(batches[0]["timestamp"].replace("Z", "+00:00")).timestamp() if batches else None
    return {
        "seconds": elapsed,
        "batches": len(batches),
        "query_start_s": round(first_at - wall, 2) if first_at else None,
        "first_batch_s": (batches[0]["durationMs"]["triggerExecution"] / 1000 if batches else None),
        "steady_msg_per_s": (round(sum(p["numInputRows"] for p in later) / later_s) if later_s else None),
        "batch_rows": [p["numInputRows"] for p in batches],
        "batch_s": [p["durationMs"]["triggerExecution"] / 1000 for p in batches],
    }


# --- the parent ---------------------------------------------------------------------------------
def fill(broker, queue: str, n: int, text: str) -> None:
    from bridgemgr.providers.embedded import EmbeddedConnectionFactory

    conn = EmbeddedConnectionFactory(broker).create_connection()
    producer = conn.create_session().create_producer(Queue(queue))
    producer.delivery_mode = DeliveryMode.PERSISTENT
    for _ in range(n):
        producer.send(TextMessage(text))
    conn.close()
    if broker.store is not None:
        broker.store.flush()


def wait_depth(broker, queue: str, n: int, stall: float = 60.0) -> float:
    """Until ``queue`` holds n messages; the time then (RuntimeError after a stall)."""
    last, since = -1, time.perf_counter()
    while True:
        depth = broker.queue_depth(queue)
        now = time.perf_counter()
        if depth >= n:
            return now
        if depth != last:
            last, since = depth, now
        elif now - since > stall:
            raise RuntimeError(f"{queue} stalled at {depth} of {n}")
        time.sleep(0.05)


def run_local(broker, work: Path, run: str, transformer: str, n: int) -> dict:
    from bridgemgr.jmsbridge.bridge import JMSBridge
    from bridgemgr.jmsbridge.config import parse_bridge_config
    from bridgemgr.props import load_properties
    from bridgemgr.providers.embedded import EmbeddedConnectionFactory

    props = load_properties([], [f"imq.varhome={work / 'var'}"])
    bridge = JMSBridge(
        parse_bridge_config(bridge_xml(run, transformer)),
        props,
        host_factory=lambda env: EmbeddedConnectionFactory(broker),
        transformer_path=[TRANSFORMERS],
    )
    start = time.perf_counter()
    bridge.start()
    end = wait_depth(broker, f"dst_{run}", n)
    bridge.stop()
    return {"messages": n, "seconds": round(end - start, 2), "msg_per_s": round(n / (end - start))}


def run_spark(
    broker,
    url: str,
    work: Path,
    run: str,
    transformer: str,
    n: int,
    master: str,
    batch: int,
    mode: str = "batch",
    sourcelog: str = "auto",
) -> dict:
    folder = work / run
    folder.mkdir()
    xml = folder / "bench.xml"
    xml.write_bytes(bridge_xml(run, transformer))
    child = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--child",
            "--master",
            master,
            "--mode",
            mode,
            "--xml",
            str(xml),
            "--broker-url",
            url,
            "--work",
            str(folder),
            "--batch",
            str(batch),
            "--sourcelog",
            sourcelog,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    peaks = PeakRSS(child.pid).start()
    try:
        stdout, stderr = child.communicate(timeout=3600)
    finally:
        peaks.stop()
    if child.returncode != 0:
        raise RuntimeError(f"the Spark child failed:\n{stderr[-3000:]}")
    result = json.loads(stdout.strip().splitlines()[-1])
    depth = broker.queue_depth(f"dst_{run}")
    if depth < n:
        raise RuntimeError(f"{run}: {depth} of {n} messages reached the target")
    return {
        "messages": n,
        "seconds": round(result["seconds"], 2),
        "msg_per_s": round(n / result["seconds"]),
        "batches": result["batches"],
        "query_start_s": result["query_start_s"],
        "first_batch_s": result["first_batch_s"],
        "steady_msg_per_s": result["steady_msg_per_s"],
        "batch_rows": result["batch_rows"],
        "batch_s": result["batch_s"],
        "duplicates": depth - n,
        "peak_rss_mb": peaks.peaks,
    }


class PeakRSS:
    """Samples the RSS of a Spark child's processes (every 0.1 s) and keeps each kind's
    peak, MB: the driver's Python process, its JVM, the largest executor Python worker."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peaks = {"driver": 0.0, "jvm": 0.0, "python_worker": 0.0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> PeakRSS:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for pid in self._tree():
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                    exe = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
                except OSError:
                    continue
                kb = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
                kind = "driver" if pid == self.pid else "jvm" if exe.endswith(b"java") else "python_worker"
                self.peaks[kind] = max(self.peaks[kind], round(kb / 1024, 1))

    def _tree(self) -> list[int]:
        """The child and its descendants (from /proc/*/stat's parent pids)."""
        parents: dict[int, int] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(stat.parent.name)] = int(fields[1])
        tree, grew = {self.pid}, True
        while grew:
            more = {pid for pid, ppid in parents.items() if ppid in tree} - tree
            grew, tree = bool(more), tree | more
        return sorted(tree)


# run name: (master, how the child drains); "cluster" is the loopback standalone cluster
MASTERS = {
    "spark_local1": ("local[1]", "batch"),
    "spark_local2": ("local[2]", "batch"),
    "spark_local2_query": ("local[2]", "query"),
    "spark_cluster": ("cluster", "batch"),
    "spark_local2_shipped": ("local[2]", "batch"),
}
SOURCELOG = {"spark_local2_shipped": "shipped"}  # the others: auto (shared on a local master)


def run_order(kind: str, pairs: int, query: bool, shipped: bool = False) -> list[str]:
    """heavy: local and spark_local2 ``pairs`` times, mirrored (local, spark 2, spark 1,
    spark 2, local, ...) so a machine speeding up or slowing down during the runs weighs on
    both alike; spark_local1 once, after the first pair (and spark_local2_query after it,
    with --compare-query); with ``shipped``, spark_local2_shipped beside each spark_local2
    (after it, then before it). trivial: local, spark_local2 (and spark_local2_shipped),
    spark_local1. cluster: local, spark_cluster, spark_local2."""
    if kind == "cluster":
        return ["local", "spark_cluster", "spark_local2"]
    order: list[str] = []
    for i in range(pairs if kind == "heavy" else 1):
        spark2 = ["spark_local2"]
        if shipped:
            spark2 = (
                ["spark_local2", "spark_local2_shipped"] if i % 2 == 0 else ["spark_local2_shipped", "spark_local2"]
            )
        order += ["local", *spark2] if i % 2 == 0 else [*spark2, "local"]
        if i == 0:
            order.append("spark_local1")
            if query and kind == "heavy":
                order.append("spark_local2_query")
    return order


def combined(each: list[dict]) -> dict:
    """One runner's runs as one: messages and seconds summed (msg/s over them all)."""
    if len(each) == 1:
        return each[0]
    messages, seconds = sum(r["messages"] for r in each), sum(r["seconds"] for r in each)
    return {"messages": messages, "seconds": round(seconds, 2), "msg_per_s": round(messages / seconds), "each": each}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--trivial-messages", type=int, default=50_000)
    ap.add_argument("--batch", type=int, default=50_000, help="messages per batch (Spark job) at most")
    ap.add_argument("--pairs", type=int, default=2, help="heavy local and spark_local2 runs of each (mirrored order)")
    ap.add_argument(
        "--cluster-messages",
        type=int,
        default=100_000,
        help="the cluster row: heavy drains of this many on the local runner, a "
        "loopback standalone cluster (a master, two 1-core workers) and "
        "local[2] (0: none)",
    )
    ap.add_argument(
        "--compare-query",
        action="store_true",
        help="also drain once as a streaming query (spark_local2_query: the way before drain ran as batch jobs)",
    )
    ap.add_argument(
        "--runs",
        default="",
        help="only these runs, comma-separated (e.g. heavy_local,heavy_spark_local2); "
        "the ratios need the runs they compare",
    )
    ap.add_argument("--shipped", action="store_true", help="also spark_local2 with the records shipped by the driver")
    ap.add_argument(
        "--size",
        type=int,
        default=1024,
        help="bytes per message (1 MiB with a few hundred --trivial-messages and "
        "--runs: the Spark processes' peak RSS with big messages)",
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--sourcelog", default="auto", help=argparse.SUPPRESS)
    ap.add_argument("--master", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="batch", help=argparse.SUPPRESS)
    ap.add_argument("--xml", help=argparse.SUPPRESS)
    ap.add_argument("--broker-url", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return

    from bridgemgr.admin.portmapper import PortMapper
    from bridgemgr.netloop import NetLoop
    from bridgemgr.providers.embedded import Broker
    from bridgemgr.providers.embedded.jmsservice import JmsService

    text = document(args.size)
    out: dict = {"message_bytes": len(text.encode()), "batch": args.batch, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="imq-spark-bench-") as tmp:
        work = Path(tmp)
        broker = Broker(work / "store")
        netloop = NetLoop().start()
        service = JmsService(broker, netloop, "127.0.0.1", 0).start()
        portmapper = PortMapper(netloop, "127.0.0.1", 0, broker.instance_name).start()
        portmapper.register(service.service_entry())
        url = f"mq://127.0.0.1:{portmapper.port}"
        kinds = [("heavy", HEAVY, args.messages), ("trivial", TRIVIAL, args.trivial_messages)]
        if args.cluster_messages:
            kinds.append(("cluster", HEAVY, args.cluster_messages))
        cluster = None
        try:
            for kind, transformer, n in kinds:
                runs = out["runs"][kind] = {}
                for i, name in enumerate(run_order(kind, args.pairs, args.compare_query, args.shipped)):
                    run = f"{kind}_{name}"
                    if args.runs and run not in args.runs.split(","):
                        continue
                    master, mode = MASTERS.get(name, ("", ""))
                    if master == "cluster":
                        cluster = cluster or start_cluster(work / "cluster")
                        master = cluster.url
                    fill(broker, f"src_{run}_{i}", n, text)
                    load = os.getloadavg()[0]
                    result = (
                        run_local(broker, work, f"{run}_{i}", transformer, n)
                        if name == "local"
                        else run_spark(
                            broker,
                            url,
                            work,
                            f"{run}_{i}",
                            transformer,
                            n,
                            master,
                            args.batch,
                            mode,
                            SOURCELOG.get(name, "auto"),
                        )
                    )
                    # others' work on this machine: a load above 1-2 starves the runs
                    result["load_before"] = round(load, 2)
                    result["load_after"] = round(os.getloadavg()[0], 2)
                    runs.setdefault(name, []).append(result)
                    print(f"{run}: {result}", file=sys.stderr)
                for name, each in runs.items():
                    runs[name] = combined(each)
        finally:
            if cluster is not None:
                cluster.stop()
            service.stop()
            portmapper.stop()
            netloop.stop()
            broker.close()
    if not args.runs:
        summarise(out)
    print(json.dumps(out, indent=2))


def start_cluster(base: Path):
    """A Spark standalone cluster on loopback: a master and two 1-core workers (the tests'
    tests/spark/spark_cluster.py), stopped by the caller."""
    sys.path.insert(0, str(HERE.parent / "tests" / "spark"))
    from spark_cluster import Cluster

    base.mkdir()
    return Cluster(base).start()


def summarise(out: dict) -> None:
    """The ratios of the heavy runs and the per-message costs of the trivial ones."""
    heavy, trivial = out["runs"]["heavy"], out["runs"]["trivial"]
    ratio = heavy["spark_local2"]["msg_per_s"] / heavy["local"]["msg_per_s"]
    out["spark_local2_to_local"] = round(ratio, 2)
    if "each" in heavy["local"]:  # each pair's own ratio: how much the machine moved
        out["spark_local2_to_local_by_pair"] = [
            round(local["seconds"] / spark["seconds"], 2)
            for local, spark in zip(heavy["local"]["each"], heavy["spark_local2"]["each"])
        ]
    out["spark_local2_to_local1"] = round(heavy["spark_local2"]["msg_per_s"] / heavy["spark_local1"]["msg_per_s"], 2)
    out["target_met"] = ratio >= 1.6
    # once running (the batches after the first) against the whole drain: what the fixed
    # start costs (query start, the first batch's set-up, beyond the steady rate)
    spark2 = heavy["spark_local2"].get("each", [heavy["spark_local2"]])
    # a drain of one batch has no steady rate: its own rate stands in (no fixed start shown)
    steady_s = [r["messages"] / (r.get("steady_msg_per_s") or r["msg_per_s"]) for r in spark2]
    steady = sum(r["messages"] for r in spark2) / sum(steady_s)
    out["spark_local2_steady_to_local"] = round(steady / heavy["local"]["msg_per_s"], 2)
    out["spark_local2_fixed_s"] = [round(r["seconds"] - s, 2) for r, s in zip(spark2, steady_s)]
    # per message once running (the first batch's set-up is a fixed cost, shown apart)
    rate = {name: r.get("steady_msg_per_s") or r["msg_per_s"] for name, r in trivial.items()}
    out["trivial_us_per_msg"] = {name: round(1e6 / r, 1) for name, r in rate.items()}
    out["spark_overhead_us_per_msg"] = {
        name: round(1e6 / rate[name] - 1e6 / rate["local"], 1) for name in ("spark_local1", "spark_local2")
    }
    out["spark_first_batch_s"] = {name: trivial[name]["first_batch_s"] for name in ("spark_local1", "spark_local2")}
    if "spark_local2_query" in heavy:  # the streaming query the drain was before
        query = heavy["spark_local2_query"]
        out["spark_local2_query_to_local"] = round(query["msg_per_s"] / heavy["local"]["msg_per_s"], 2)
        out["spark_local2_query_start_s"] = query["query_start_s"]
    if "spark_local2_shipped" in heavy:  # what shipping the records costs
        out["shipped_to_shared"] = round(
            heavy["spark_local2_shipped"]["msg_per_s"] / heavy["spark_local2"]["msg_per_s"], 2
        )
        out["shipped_overhead_us_per_msg"] = round(1e6 / rate["spark_local2_shipped"] - 1e6 / rate["spark_local2"], 1)
    cluster = out["runs"].get("cluster")
    if cluster:  # the cluster row: the standalone cluster and local[2] against the local runner
        out["cluster_to_local"] = round(cluster["spark_cluster"]["msg_per_s"] / cluster["local"]["msg_per_s"], 2)
        out["cluster_local2_to_local"] = round(cluster["spark_local2"]["msg_per_s"] / cluster["local"]["msg_per_s"], 2)


if __name__ == "__main__":
    main()
