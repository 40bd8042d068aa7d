"""The demo `imqbridgemgr serve` runs when started without a properties file.

It moves messages through the embedded host broker the way a JMS bridge link will:
a producer sends orders to ``demo.orders``; a mover receives them and, in one local
transaction each, sends the priority ones on to ``demo.priority`` and the rest to
``demo.standard`` (a selector picks them); a consumer drains both. It prints what
it did, so a first run shows the broker working end to end.
"""

from __future__ import annotations

import time

from .jms import DeliveryMode, Queue, TextMessage
from .providers.embedded import Broker, EmbeddedConnectionFactory

ORDERS, PRIORITY, STANDARD = Queue("demo.orders"), Queue("demo.priority"), Queue("demo.standard")


def run_demo(broker: Broker, count: int = 1000, echo=print) -> dict[str, int]:
    conn = EmbeddedConnectionFactory(broker).create_connection()
    try:
        conn.start()
        producer = conn.create_session().create_producer(ORDERS)
        start = time.perf_counter()
        for i in range(count):
            order = TextMessage(f"order {i}")
            order.set_int_property("amount", (i * 37) % 1000)
            producer.send(order, delivery_mode=DeliveryMode.PERSISTENT)
        tx = conn.create_session(transacted=True)
        moved = {PRIORITY.name: 0, STANDARD.name: 0}
        for selector, target in (("amount >= 900", PRIORITY), ("amount < 900", STANDARD)):
            consumer = tx.create_consumer(ORDERS, selector)
            out = tx.create_producer(target)
            while (msg := consumer.receive_no_wait()) is not None:
                out.send(msg)
                tx.commit()
                moved[target.name] += 1
            consumer.close()
        check = conn.create_session()
        received = sum(1 for q in (PRIORITY, STANDARD)
                       for _ in iter(check.create_consumer(q).receive_no_wait, None))
        elapsed = time.perf_counter() - start
        echo(f"demo: sent {count} persistent orders to {ORDERS.name}; moved {moved[PRIORITY.name]} "
             f"to {PRIORITY.name} and {moved[STANDARD.name]} to {STANDARD.name} in one transaction "
             f"each; received {received} ({count / elapsed:,.0f} orders/s end to end)")
        return {"sent": count, "received": received, **moved}
    finally:
        conn.close()
