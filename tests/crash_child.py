"""A broker workload run in a subprocess by test_embedded_crash.py, to be killed with SIGKILL.

Usage: crash_child.py MODE STORE ROUND [SYNC]; STORE is a directory or a jdbc spec
(tests/stores.py). After each guarantee is reached it
prints one line (flushed) naming it; the parent kills the process at a random line
and then checks that everything printed survived and nothing uncommitted is visible.
"""

from __future__ import annotations

import os
import sys

from bridgemgr.jms import AckMode, Queue, TextMessage, xa
from bridgemgr.jms.xa import Xid
from bridgemgr.providers.embedded import EmbeddedConnectionFactory
from stores import open_at

SRC, DST = Queue("src"), Queue("dst")


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    mode, store, rnd = sys.argv[1], sys.argv[2], sys.argv[3]
    sync = len(sys.argv) < 5 or sys.argv[4] == "sync"
    # CRASH_MEMORY_WINDOW: a tiny window pages nearly every message (test_embedded_crash)
    broker = open_at(store, sync=sync, memory_window=int(os.environ.get("CRASH_MEMORY_WINDOW", "1000")))
    conn = EmbeddedConnectionFactory(broker).create_xa_connection()
    conn.start()
    say("ready")
    i = 0
    if mode == "send":
        producer = conn.create_session().create_producer(DST)
        while True:
            producer.send(TextMessage(f"{rnd}:{i}"))
            say(f"sent {rnd}:{i}")
            i += 1
    elif mode == "tx":
        tx = conn.create_session(transacted=True)
        producer = tx.create_producer(DST)
        while True:
            for k in range(10):
                m = TextMessage(f"{rnd}:{i}:{k}")
                m.set_string_property("batch", f"{rnd}:{i}")
                producer.send(m)
            tx.commit()
            say(f"committed {rnd}:{i}")
            i += 1
    elif mode == "consume":
        session = conn.create_session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE)
        consumer = session.create_consumer(SRC)
        while (m := consumer.receive(2)) is not None:
            say(f"got {m.text}")
            m.acknowledge()
            say(f"acked {m.text}")
        say("empty")
    elif mode == "xa":
        xs = conn.create_xa_session()
        res = xs.xa_resource
        consumer = xs.create_consumer(SRC)
        producer = xs.create_producer(DST)
        while True:
            x = Xid(7, f"{rnd}-{i}".encode(), b"rm")
            res.start(x, xa.TMNOFLAGS)
            m = consumer.receive(2)
            if m is None:
                res.end(x, xa.TMSUCCESS)
                res.rollback(x)
                say("empty")
                return
            producer.send(TextMessage(m.text))
            res.end(x, xa.TMSUCCESS)
            res.prepare(x)
            say(f"prepared {rnd}-{i} {m.text}")
            res.commit(x, False)
            say(f"committed {rnd}-{i} {m.text}")
            i += 1
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
