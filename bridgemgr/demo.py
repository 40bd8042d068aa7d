"""The ready demo `imqbridgemgr serve` runs when started without a properties file.

``demo_overrides`` makes a demo configuration under the var directory: the embedded
host broker, the STOMP bridge on 7672, and a JMS bridge ``demo`` whose link moves
``demo.in`` to ``demo.out`` (upper-casing text with the shipped transformer); the
admin user ``admin`` gets a random password kept in a passfile there (nothing prints
it). ``run_demo`` then sends orders to ``demo.in`` and reads them back from
``demo.out``, so a first run shows a message crossing a JMS bridge end to end, and
``how_to_reach`` tells the user how to talk to the running service.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import time
from pathlib import Path

import javaproperties

from .jms import DeliveryMode, Queue, TextMessage
from .jms.hostbroker import HostBroker
from .private import private_dir, write_private

DEMO_IN, DEMO_OUT = Queue("demo.in"), Queue("demo.out")
PASSWORD_KEY = "imq.imqbridgemgr.password"

DEMO_XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<!-- The demo JMS bridge: demo.in -> demo.out in the host broker, text upper-cased. -->
<jmsbridge name="demo">
  <link name="upper" transacted="false">
    <source connection-factory-ref="host" destination-ref="in"/>
    <target connection-factory-ref="host" destination-ref="out"
            message-transformer-class="bridgemgr.transformers.uppercase.UppercaseTransformer"/>
  </link>
  <connection-factory ref-name="host"/>
  <destination ref-name="in" name="demo.in"/>
  <destination ref-name="out" name="demo.out"/>
</jmsbridge>
"""


def demo_files(instance_dir: Path) -> tuple[Path, Path]:
    """Write (once) the demo bridge XML and the admin passfile; return their paths."""
    etc = instance_dir / "etc"
    private_dir(etc)
    xml = etc / "demo-bridge.xml"
    write_private(xml, DEMO_XML)
    passfile = etc / "demo-admin.properties"
    if not passfile.exists():
        write_private(passfile, javaproperties.dumps({PASSWORD_KEY: secrets.token_urlsafe(12)}, timestamp=False))
    return xml, passfile


def demo_overrides(instance_dir: Path) -> list[str]:
    """-D style properties of the demo service."""
    xml, passfile = demo_files(instance_dir)
    password = javaproperties.loads(passfile.read_text())[PASSWORD_KEY]
    return [
        "imq.bridge.enabled=true",
        "imq.bridge.activelist=stomp,demo",
        "imq.bridge.admin.user=admin",
        f"imq.bridge.admin.password={password}",
        "imq.bridge.stomp.tcp.port=7672",
        "imq.bridge.demo.type=jms",
        f"imq.bridge.demo.xmlurl={xml}",
        "imq.bridge.demo.autostart=true",
    ]


INVOKED_AS = "IMQBRIDGEMGR_INVOKED_AS"  # set by a clone's ./imqbridgemgr script to its $0


def invoked_as(argv0: str | None = None) -> str:
    """The command the user started us with, to print commands they can paste: a clone's
    script as they typed it (./imqbridgemgr), an installed console script by its name when
    that name finds it on the PATH (else by its path), ``python -m bridgemgr`` as that."""
    wrapper = os.environ.get(INVOKED_AS)
    if wrapper:
        return wrapper
    script = Path(sys.argv[0] if argv0 is None else argv0)
    if script.suffix == ".py":  # python -m bridgemgr (or bridgemgr.cli)
        return "python -m bridgemgr"
    found = shutil.which(script.name)
    if found is not None and Path(found).resolve() == script.resolve():
        return script.name
    return str(script)


def how_to_reach(instance_dir: Path, portmapper: str, stomp_port: int | None) -> list[str]:
    passfile = instance_dir / "etc" / "demo-admin.properties"
    lines = []
    if stomp_port:
        lines.append(
            f"STOMP bridge: 127.0.0.1:{stomp_port} (login admin; the password is {PASSWORD_KEY} "
            f"in {passfile}); send to /queue/demo.in, read /queue/demo.out"
        )
    lines.append(f"Operate it:  {invoked_as()} list bridge -b {portmapper} -u admin -passfile {passfile}")
    return lines


def run_demo(host: HostBroker, count: int = 1000, echo=print) -> dict[str, int]:
    """Send ``count`` orders to demo.in and read them back, upper-cased, from demo.out."""
    conn = host.connection_factory().create_connection()
    try:
        conn.start()
        session = conn.create_session()
        producer = session.create_producer(DEMO_IN)
        start = time.perf_counter()
        for i in range(count):
            producer.send(TextMessage(f"order {i}"), delivery_mode=DeliveryMode.PERSISTENT)
        consumer = session.create_consumer(DEMO_OUT)
        received, last = 0, None
        while received < count and (msg := consumer.receive(5)) is not None:
            received, last = received + 1, msg
        elapsed = time.perf_counter() - start
        sample = f" (last: {last.text!r})" if isinstance(last, TextMessage) else ""
        echo(
            f"demo: sent {count} persistent orders to demo.in; the JMS bridge 'demo' moved "
            f"{received} to demo.out{sample} in {elapsed:.2f} s"
        )
        return {"sent": count, "received": received}
    finally:
        conn.close()
