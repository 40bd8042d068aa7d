"""What one unit of an ActiveMQ -> ActiveMQ link costs, part by part; prints JSON.

    PYTHONPATH=. .venv/bin/python benchmarks/activemq_unit.py [--messages N] [--rounds R]

One real ActiveMQ (as tests/real/servers.py starts it, disk sync as shipped), N persistent
1 KiB messages preloaded per loop, and three loops over the Java client alone (JPype, no
bridge), interleaved --rounds times (the machine is shared: compare within a round):

- convert: a transacted unit with transaction batch 1 on the local-transaction path as
  the link ran it before it resent delivered messages: receive on a transacted session,
  our message model and back (to_python, to_java), send, commit (the one round trip:
  BEGIN, the send and the acknowledgement go out without waiting);
- resend: the link's unit now: to our model (the link's steps read it), then the
  received Java message itself is sent (the Java provider's resend, client.py);
- pass: the same unit sending the received Java message itself, no conversion: the floor
  of a one-acknowledgement-one-send transaction from Python;
- sync: ActiveMQ's jmsBridgeConnector's cycle: AUTO_ACKNOWLEDGE receive and a synchronous
  persistent send (its acknowledgement goes out without waiting).

Per loop: µs per unit spent in each part (receive, convert, send, commit) and msg/s. The
bridge's own per-unit cost is providers.py's XA batch-1 row minus the resend loop.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "real"))

from providers import preload  # noqa: E402  (this folder's; it hides benchmarks/stomp.py)
from servers import ActiveMQ  # noqa: E402

from bridgemgr.jms import naming  # noqa: E402
from bridgemgr.providers.java.convert import to_java, to_python  # noqa: E402

PERSISTENT, DEFAULT_PRIORITY = 2, 4
LOOPS = ("convert", "resend", "pass", "sync")


def unit_loop(factory: Any, jconn: Any, loop: str, src: str, dst: str, n: int) -> dict[str, Any]:
    """N units of ``loop``; µs per unit in each part."""
    transacted = loop != "sync"
    session = jconn.createSession(transacted, 0 if transacted else 1)  # AUTO_ACKNOWLEDGE
    consumer = session.createConsumer(session.createQueue(src))
    producer = session.createProducer(session.createQueue(dst))
    flavor = factory.flavor
    clock = time.perf_counter_ns
    spent = dict.fromkeys(("receive", "convert", "send", "commit"), 0)
    try:
        started = clock()
        for _ in range(n):
            t0 = clock()
            jmsg = consumer.receive(5000)
            t1 = clock()
            if loop == "resend":
                to_python(jmsg, flavor)
            elif loop == "convert":
                jmsg = to_java(to_python(jmsg, flavor), session, flavor, lambda dest: None)
            t2 = clock()
            producer.send(jmsg, PERSISTENT, DEFAULT_PRIORITY, 0)
            t3 = clock()
            if transacted:
                session.commit()
            t4 = clock()
            spent["receive"] += t1 - t0
            spent["convert"] += t2 - t1
            spent["send"] += t3 - t2
            spent["commit"] += t4 - t3
        elapsed = clock() - started
    finally:
        session.close()
    return {
        **{f"{part}_us": round(ns / n / 1000, 1) for part, ns in spent.items()},
        "unit_us": round(elapsed / n / 1000, 1),
        "msg_per_s": round(n * 1e9 / elapsed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    out: dict[str, Any] = {"messages": args.messages, "rounds": []}
    with tempfile.TemporaryDirectory() as tmp:
        amq = ActiveMQ(Path(tmp) / "activemq", name="unit").start()
        try:
            factory = naming.lookup("ConnectionFactory", amq.jndi())
            jconn = factory.java.createConnection()
            jconn.start()
            try:
                for r in range(args.rounds):
                    row: dict[str, Any] = {}
                    for loop in LOOPS:
                        src, dst = f"{loop}{r}.src", f"{loop}{r}.dst"
                        preload(factory, src, args.messages)
                        row[loop] = unit_loop(factory, jconn, loop, src, dst, args.messages)
                    for loop in LOOPS[:-1]:
                        row[f"ratio_{loop}_to_sync"] = round(row[loop]["msg_per_s"] / row["sync"]["msg_per_s"], 3)
                    out["rounds"].append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
            finally:
                jconn.close()
        finally:
            amq.stop()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
