"""A remote client run by tests/test_jmsservice_crash.py, to be killed with SIGKILL.

Usage: client_child.py URL MODE. It prints one line per step reached (flushed) and
then sleeps until killed; the parent checks what the broker gave back.
"""

from __future__ import annotations

import sys
import time

import bridgemgr
from bridgemgr.jms import AckMode, Queue, TextMessage, xa
from bridgemgr.jms.xa import Xid

SRC, DST = Queue("src"), Queue("dst")


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    url, mode = sys.argv[1], sys.argv[2]
    # the XA mode pulls, so that its second session finds the message the first left
    conn = bridgemgr.connect_xa(url, "app", "secret", prefetch=0 if mode == "xa" else 100)
    conn.start()
    if mode == "client_ack":  # three of the queue's messages delivered, none acknowledged
        consumer = conn.create_session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE).create_consumer(SRC)
        say("got " + ",".join(consumer.receive(5).text for _ in range(3)))
    elif mode == "auto":  # one consumed for good; the rest prefetched
        consumer = conn.create_session().create_consumer(SRC)
        say("got " + consumer.receive(5).text)
        time.sleep(0.3)  # let the consumed report reach the service
        say("acked")
    elif mode == "tx":  # a transaction that received and sent, never committed
        tx = conn.create_session(transacted=True)
        consumer = tx.create_consumer(SRC)
        producer = tx.create_producer(DST)
        for _ in range(2):
            producer.send(TextMessage(consumer.receive(5).text.upper()))
        tx.create_producer(DST).send(TextMessage("sent-in-tx"))
        conn.flush()
        say("in-tx")
    elif mode == "xa":  # one prepared branch, one still active
        s1, s2 = conn.create_xa_session(), conn.create_xa_session()
        prepared, active = Xid(7, b"crash-prepared", b"b"), Xid(7, b"crash-active", b"b")
        r1 = s1.xa_resource
        r1.start(prepared, xa.TMNOFLAGS)
        s1.create_producer(DST).send(TextMessage(s1.create_consumer(SRC).receive(5).text.upper()))
        r1.end(prepared, xa.TMSUCCESS)
        r1.prepare(prepared)
        say("prepared")
        r2 = s2.xa_resource
        r2.start(active, xa.TMNOFLAGS)
        s2.create_consumer(SRC).receive(5)
        s2.create_producer(DST).send(TextMessage("never"))
        conn.flush()
        say("active")
    elif mode == "temp":  # a temporary queue that must die with the process
        say("temp " + conn.create_session().create_temporary_queue().name)
    else:
        raise SystemExit(f"unknown mode {mode}")
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
