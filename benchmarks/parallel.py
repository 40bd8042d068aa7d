"""A parallel link (worker processes) against the local runner and Spark local[2], with the
CPU-heavy transformer of benchmarks/spark.py, in one run; prints JSON.

    PYTHONPATH=. .venv/bin/python benchmarks/parallel.py [--messages N] [--runs a,b]

One embedded broker in this process with a persistent store and its jms connection service
on loopback. Each run fills its own source queue with N persistent 1 KiB XML TextMessages
and drains it through a non-transacted link (ordered=false) to its own target queue:

- local: the local runner (a thread of this process, the broker in-process);
- workers1, workers2: the parallel runner (imq.bridge.<name>.link.<link>.parallelism) with
  one and two worker processes, each with its own connections over the jms service
  (workers1 is the runner forced to one process: the scaling baseline);
- spark_local2: the same link on Spark local[2] (benchmarks/spark.py's child process).

msg/s = N / (bridge start .. the last message on the target); worker start-up (~1 s of
imports) is in. The target: workers2 >= 1.6 x workers1 on 2 cores. The machine is shared:
load_before/after are the load averages each run saw; runs go in mirrored order (workers1,
workers2, local, spark_local2, workers2, workers1 with --pairs 2) and each runner's runs
are summed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import spark as sparkbench  # noqa: E402  (benchmarks/spark.py: fill, wait_depth, run_spark, document)

HEAVY = sparkbench.HEAVY


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


def run_link(broker, url: str, work: Path, run: str, n: int, workers: int) -> dict:
    """The link on the local runner (workers=0) or the parallel runner with ``workers``."""
    from bridgemgr.jmsbridge import bridge as bridge_module
    from bridgemgr.jmsbridge.config import load_bridge_config
    from bridgemgr.parallel.runner import parallel_link
    from bridgemgr.props import load_properties
    from bridgemgr.providers.embedded import EmbeddedConnectionFactory

    folder = work / run
    folder.mkdir()
    xml = folder / "bench.xml"
    xml.write_bytes(bridge_xml(run, HEAVY))
    props = load_properties(
        [],
        [
            f"imq.varhome={work / 'var'}",
            "imq.bridge.bench.type=jms",
            f"imq.bridge.bench.xmlurl={xml}",
            f"imq.bridge.bench.link.l.parallelism={max(workers, 1)}",
            "imq.bridge.bench.link.l.ordered=false",
        ],
    )
    bridge = bridge_module.JMSBridge(
        load_bridge_config(str(xml), bridge_name="bench"),
        props,
        name="bench",
        host_factory=lambda env: EmbeddedConnectionFactory(broker),
        broker_url=url,
        transformer_path=[sparkbench.TRANSFORMERS],
    )
    if workers == 1:  # the parallel runner with one process (parallelism=1 is the local runner)
        bridge._runner = lambda name, setup: parallel_link  # type: ignore[method-assign]
    before = os.times()
    start = time.perf_counter()
    bridge.start()
    end = sparkbench.wait_depth(broker, f"dst_{run}", n)
    bridge.stop()
    after = os.times()
    # CPU seconds of this process (broker, jms service, a local link) and of the workers
    return {
        "messages": n,
        "seconds": round(end - start, 2),
        "msg_per_s": round(n / (end - start)),
        "broker_cpu_s": round(after.user + after.system - before.user - before.system, 2),
        "workers_cpu_s": round(
            after.children_user + after.children_system - before.children_user - before.children_system, 2
        ),
    }


def run_order(pairs: int) -> list[str]:
    order = ["workers1", "workers2", "local", "spark_local2"]
    for i in range(1, pairs):
        order += ["workers2", "workers1"] if i % 2 else ["workers1", "workers2"]
    return order


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=50_000, help="Spark: messages per micro-batch at most")
    ap.add_argument("--pairs", type=int, default=2, help="workers1 and workers2 runs of each (mirrored)")
    ap.add_argument(
        "--runs", default="", help="only these runs, comma-separated (local, workers1, workers2, spark_local2)"
    )
    args = ap.parse_args()

    from bridgemgr.admin.portmapper import PortMapper
    from bridgemgr.netloop import NetLoop
    from bridgemgr.providers.embedded import Broker
    from bridgemgr.providers.embedded.jmsservice import JmsService

    text = sparkbench.document()
    out: dict = {"message_bytes": len(text.encode()), "messages": args.messages, "cpus": os.cpu_count(), "runs": {}}
    with tempfile.TemporaryDirectory(prefix="imq-parallel-bench-") as tmp:
        work = Path(tmp)
        broker = Broker(work / "store")
        netloop = NetLoop().start()
        service = JmsService(broker, netloop, "127.0.0.1", 0).start()
        portmapper = PortMapper(netloop, "127.0.0.1", 0, broker.instance_name).start()
        portmapper.register(service.service_entry())
        url = f"mq://127.0.0.1:{portmapper.port}"
        runs: dict = out["runs"]
        try:
            for i, name in enumerate(run_order(args.pairs)):
                if args.runs and name not in args.runs.split(","):
                    continue
                run = f"{name}_{i}"
                sparkbench.fill(broker, f"src_{run}", args.messages, text)
                load = os.getloadavg()[0]
                if name == "spark_local2":
                    result = sparkbench.run_spark(broker, url, work, run, HEAVY, args.messages, "local[2]", args.batch)
                    result = {k: result[k] for k in ("messages", "seconds", "msg_per_s", "duplicates")}
                else:
                    result = run_link(
                        broker, url, work, run, args.messages, {"local": 0, "workers1": 1, "workers2": 2}[name]
                    )
                result["load_before"] = round(load, 2)
                result["load_after"] = round(os.getloadavg()[0], 2)
                runs.setdefault(name, []).append(result)
                print(f"{run}: {result}", file=sys.stderr)
            for name, each in runs.items():
                runs[name] = sparkbench.combined(each)
        finally:
            service.stop()
            portmapper.stop()
            netloop.stop()
            broker.close()
    rate = {name: r["msg_per_s"] for name, r in runs.items()}
    if "workers1" in rate and "workers2" in rate:
        out["workers2_to_workers1"] = round(rate["workers2"] / rate["workers1"], 2)
        out["target_met"] = out["workers2_to_workers1"] >= 1.6
    if "local" in rate and "workers2" in rate:
        out["workers2_to_local"] = round(rate["workers2"] / rate["local"], 2)
    if "spark_local2" in rate and "workers2" in rate:
        out["workers2_to_spark_local2"] = round(rate["workers2"] / rate["spark_local2"], 2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
