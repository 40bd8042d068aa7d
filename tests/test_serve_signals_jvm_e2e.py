"""End to end: signals to a real `serve` whose JVM is loaded, by a Java transformer (on a
link between two host queues) and a Java provider (ActiveMQ's own client, on a link to a
real ActiveMQ). SIGHUP reloads and SIGQUIT prints the threads' stacks while the process
goes on; SIGTERM and SIGINT stop it cleanly (exit 0, "Stopped cleanly.", the lock file
gone); and every send a client over mq:// saw confirmed before a SIGTERM is in the store at
the next start. Without -Xrs the JVM's own handlers end the process instead (exit 129, 143,
130)."""

from __future__ import annotations

import shutil
import signal
import sys
import threading
import time
import zipfile
from pathlib import Path
from xml.sax.saxutils import escape

import pytest

import bridgemgr
from bridgemgr.jms import DeliveryMode, Queue, TextMessage
from service_support import Daemon, link_row, send, take

sys.path.insert(0, str(Path(__file__).parent / "real"))
from servers import JMS_API_JAR, ActiveMQ, missing_package

from test_provider_java import ROUTER, compile_against_base

pytest.importorskip("jpype")
if missing_package("activemq"):  # ActiveMQ, its client jars and the JMS API jar
    pytest.skip(missing_package("activemq"), allow_module_level=True)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
PASSWORD = "Signals-Secret-1"

XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb">
  <link name="tx" transacted="false">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst" message-transformer-class="com.example.Router">
      <property name="region" value="emea"/>
    </target>
  </link>
  <link name="amq" transacted="false">
    <source connection-factory-ref="host" destination-ref="out"/>
    <target connection-factory-ref="amq" destination-ref="far"/>
  </link>
  <connection-factory ref-name="host"/>
  <connection-factory ref-name="amq" lookup-name="ConnectionFactory">{env}</connection-factory>
  <destination ref-name="src" name="sig.src"/>
  <destination ref-name="dst" name="sig.dst"/>
  <destination ref-name="out" name="sig.out"/>
  <destination ref-name="far" lookup-name="dynamicQueues/sig.far">{env}</destination>
</jmsbridge>
"""


@pytest.fixture(scope="module")
def activemq(tmp_path_factory):
    broker = ActiveMQ(tmp_path_factory.mktemp("activemq")).start()
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def service(activemq, tmp_path_factory):
    """The files of a service whose bridge jb has both links: (properties, instance dir)."""
    from service_support import one_bridge_files

    base = tmp_path_factory.mktemp("jvmsignals")
    instance = base / "var" / "instances" / "sig"
    lib_ext = instance / "lib" / "ext"
    lib_ext.mkdir(parents=True)
    shutil.copy(JMS_API_JAR, lib_ext / "jms-api.jar")
    classes, _ = compile_against_base(base / "build", {"com/example/Router.java": ROUTER})
    with zipfile.ZipFile(lib_ext / "router.jar", "w") as jar:
        for f in classes.rglob("*.class"):
            jar.write(f, str(f.relative_to(classes)))
    env = "".join(f'<property name="{escape(k)}" value="{escape(v)}"/>' for k, v in activemq.jndi().items())
    props, _ = one_bridge_files(base, "sig", XML.format(env=env), PASSWORD, "imq.bridge.jb.autostart=true")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(base / "cache"))  # where serve compiles the base class
        yield props, instance


def start_with_jvm(props: Path, instance: Path) -> Daemon:
    """serve, once both links of jb run and the transformer has transformed a message: the
    JVM is loaded, with ActiveMQ's client connected."""
    daemon = Daemon(props)
    assert daemon.bridges.get("jb") == "STARTED", daemon.lines
    passfile = instance.parents[2] / "pw.properties"
    assert link_row(daemon, passfile, "tx")[1] == "STARTED"
    assert link_row(daemon, passfile, "amq")[1] == "STARTED"
    send(daemon, PASSWORD, "sig.src", "plain")
    assert [m.text for m in take(daemon, PASSWORD, "sig.dst", expect=1, quiet=0.2)] == ["PLAIN"]
    lock = instance / "lock"
    assert lock.read_text().strip() == f"pid {daemon.proc.pid}"
    return daemon


def read_until(daemon: Daemon, *markers: str) -> None:
    """Read serve's output until a line holds each of ``markers`` (in any order); fails
    when the process ends first."""
    missing = set(markers)
    for line in daemon.proc.stdout:
        daemon.lines.append(line.rstrip())
        missing = {m for m in missing if m not in line}
        if not missing:
            return
    raise AssertionError(
        f"serve ended (exit {daemon.proc.wait()}) before printing {sorted(missing)}: " + "\n".join(daemon.lines[-40:])
    )


def kill(daemon: Daemon) -> None:
    """End a serve a test left running (a failed one): SIGTERM may not end it."""
    if daemon.proc.poll() is None:
        daemon.proc.kill()
        daemon.proc.communicate()


def stopped_cleanly(daemon: Daemon, instance: Path, sig: signal.Signals) -> list[str]:
    daemon.proc.send_signal(sig)
    rest, _ = daemon.proc.communicate(timeout=120)
    lines = daemon.lines + rest.splitlines()
    assert daemon.proc.returncode == 0, "\n".join(lines[-40:])
    assert "Stopped cleanly." in rest
    assert not any("terminate called" in line for line in lines)
    assert not (instance / "lock").exists()
    return lines


def test_sighup_reloads_sigquit_dumps_threads_and_sigterm_stops_cleanly_with_the_jvm_loaded(service):
    props, instance = service
    daemon = start_with_jvm(props, instance)
    try:
        daemon.proc.send_signal(signal.SIGHUP)
        read_until(daemon, "SIGHUP: reading the properties", "SIGHUP: bridge jb is STARTED and keeps its configuration")
        daemon.proc.send_signal(signal.SIGQUIT)
        read_until(daemon, "(most recent call first)", "in run")
        assert daemon.proc.poll() is None
        send(daemon, PASSWORD, "sig.src", "after")  # still moving messages through Java
        assert [m.text for m in take(daemon, PASSWORD, "sig.dst", expect=1, quiet=0.2)] == ["AFTER"]
        stopped_cleanly(daemon, instance, signal.SIGTERM)
    finally:
        kill(daemon)


def test_sigint_stops_cleanly_with_the_jvm_loaded(service):
    props, instance = service
    daemon = start_with_jvm(props, instance)
    try:
        stopped_cleanly(daemon, instance, signal.SIGINT)
    finally:
        kill(daemon)


def test_every_send_confirmed_before_a_sigterm_is_kept(service):
    """A producer over mq:// sends persistent messages as fast as they are confirmed; SIGTERM
    comes after the first 1,000; at the next start every confirmed one is there."""
    props, instance = service
    daemon = start_with_jvm(props, instance)
    confirmed: list[str] = []
    ended: list[BaseException] = []

    def produce() -> None:
        try:
            with bridgemgr.connect(f"mq://{daemon.address}", "admin", PASSWORD) as conn:
                producer = conn.create_session().create_producer(Queue("sig.load"))
                for i in range(1_000_000):
                    producer.send(TextMessage(f"m{i}"), delivery_mode=DeliveryMode.PERSISTENT)
                    confirmed.append(f"m{i}")
        except BaseException as exc:  # the service went away under it: expected
            ended.append(exc)

    producer = threading.Thread(target=produce, name="load")
    try:
        producer.start()
        deadline = time.monotonic() + 60
        while len(confirmed) < 1000 and producer.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(confirmed) >= 1000, ended
        stopped_cleanly(daemon, instance, signal.SIGTERM)
        producer.join(60)
        assert not producer.is_alive() and ended  # the producer heard the service stop
    finally:
        kill(daemon)
    daemon = Daemon(props)
    try:
        kept = {m.text for m in take(daemon, PASSWORD, "sig.load", expect=len(confirmed), wait=120)}
        lost = [text for text in confirmed if text not in kept]
        assert lost == [], f"{len(lost)} of {len(confirmed)} confirmed sends lost: {lost[:10]}"
    finally:
        daemon.stop()
