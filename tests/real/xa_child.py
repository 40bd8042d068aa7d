"""Child process of the XA recovery test: prepares XA branches on ActiveMQ through the Java
provider, says so, and waits to be killed with SIGKILL before it can commit anything.

argv: JNDI environment (repr of a dict), source queue, target queue, then one gtrid (hex)
per branch: each branch receives one message from the source and sends one to the target."""

from __future__ import annotations

import ast
import sys
import time

from bridgemgr.jms import naming
from bridgemgr.jms.destination import Queue
from bridgemgr.jms.message import TextMessage
from bridgemgr.jms.xa import TMNOFLAGS, TMSUCCESS, XA_OK, Xid

FORMAT_ID = 0x494D51  # "IMQ"


def main() -> None:
    env, source, target, *gtrids = sys.argv[1:]
    factory = naming.lookup("XAConnectionFactory", ast.literal_eval(env))
    conn = factory.create_xa_connection()
    conn.start()
    for gtrid in gtrids:
        xid = Xid(FORMAT_ID, bytes.fromhex(gtrid), b"branch-1")
        session = conn.create_xa_session()
        resource = session.xa_resource
        resource.start(xid, TMNOFLAGS)
        got = session.create_consumer(Queue(source)).receive(10)
        assert got is not None, "the source queue is empty"
        session.create_producer(Queue(target)).send(TextMessage(f"moved {got.text} in {gtrid}"))
        resource.end(xid, TMSUCCESS)
        assert resource.prepare(xid) == XA_OK
        print(f"prepared {gtrid} {got.text}", flush=True)
    print("ready", flush=True)
    time.sleep(3600)  # killed here, with every branch prepared and none committed


if __name__ == "__main__":
    main()
