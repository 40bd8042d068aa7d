"""End to end: a Java transformer jar built against the original's base class
(com.sun.messaging.bridge.service.MessageTransformer) in the instance's lib/ext, with the
base class left out (the service compiles its own, for javax.jms or jakarta.jms) or inside
(as when the original's jar is there too), on the link of a real `serve` process whose target
is a second `serve` process's broker. The transformer upper-cases one message (with the bridge name and a <property> it
was given), branches one to a ref-name and one to a queue it creates, drops one
(noTransfer) and replaces one with a message it creates; the audit copies of the first
branch and the first drop land in the source service's built-in DMQ."""

from __future__ import annotations

import shutil
import sys
import time
import zipfile
from pathlib import Path

import pytest

import bridgemgr
from bridgemgr.jms import DeliveryMode, Queue, TextMessage
from bridgemgr.jmsbridge.config import BUILTIN_DMQ_DESTINATION
from service_support import Daemon, cli, one_bridge_files

sys.path.insert(0, str(Path(__file__).parent / "real"))
from jakarta_jars import rename_jar
from servers import JMS_API_JAR, missing_package

from test_provider_java import ROUTER, compile_against_base

pytest.importorskip("jpype")
if missing_package("activemq"):  # the JMS API jar comes with it
    pytest.skip(missing_package("activemq"), allow_module_level=True)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
PASSWORD = "Javatx-Secret-1"

FAR_XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb">
  <link name="idle" transacted="false">
    <source connection-factory-ref="host" destination-ref="a"/>
    <target connection-factory-ref="host" destination-ref="b"/>
  </link>
  <connection-factory ref-name="host"/>
  <destination ref-name="a" name="far.a"/>
  <destination ref-name="b" name="far.b"/>
</jmsbridge>
"""

NEAR_XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb">
  <link name="l1" transacted="false">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="far" destination-ref="dst" message-transformer-class="com.example.Router">
      <property name="region" value="emea"/>
    </target>
  </link>
  <connection-factory ref-name="host"/>
  <connection-factory ref-name="far" lookup-name="ConnectionFactory" username="admin" password="{password}">
    <property name="java.naming.factory.initial" value="imq.embedded"/>
    <property name="java.naming.provider.url" value="mq://{far}"/>
  </connection-factory>
  <destination ref-name="src" name="tx.src"/>
  <destination ref-name="dst" name="tx.dst"/>
  <destination ref-name="other" name="tx.other"/>
</jmsbridge>
"""


@pytest.fixture(scope="module", params=["javax.jms", "javax.jms, base class in lib/ext", "jakarta.jms"])
def services(request, tmp_path_factory):
    api, _, base_in_jar = request.param.partition(", ")
    base = tmp_path_factory.mktemp("javatx")
    (base / "far").mkdir()
    props, _ = one_bridge_files(base / "far", "far", FAR_XML, PASSWORD, "imq.bridge.jb.autostart=false")
    far = Daemon(props)
    try:
        near_dir = base / "near"
        near_dir.mkdir()
        lib_ext = near_dir / "var" / "instances" / "near" / "lib" / "ext"
        lib_ext.mkdir(parents=True)
        api_jar = lib_ext / "jms-api.jar"
        if api == "jakarta.jms":  # no jakarta.jms jar here: the javax one renamed
            rename_jar(JMS_API_JAR, api_jar)
        else:
            shutil.copy(JMS_API_JAR, api_jar)
        classes, base_classes = compile_against_base(
            base / "build", {"com/example/Router.java": ROUTER.replace("javax.jms", api)}, api, str(api_jar)
        )
        with zipfile.ZipFile(lib_ext / "router.jar", "w") as jar:
            for folder in [classes] + ([base_classes] if base_in_jar else []):
                for f in folder.rglob("*.class"):
                    jar.write(f, str(f.relative_to(folder)))
        props, passfile = one_bridge_files(
            near_dir,
            "near",
            NEAR_XML.format(password=PASSWORD, far=far.address),
            PASSWORD,
            "imq.bridge.jb.autostart=true",
        )
        with pytest.MonkeyPatch.context() as env:
            env.setenv("XDG_CACHE_HOME", str(base / "cache"))  # where the service compiles the base class
            near = Daemon(props)
        try:
            yield near, far, passfile, api, bool(base_in_jar), base / "cache" / "imqbridge" / "java"
        finally:
            near.stop()
    finally:
        far.stop()


def drain(address: str, queue: str, expect: int, timeout: float = 60) -> list:
    """The messages on ``queue`` of the broker at ``address``, once ``expect`` arrived."""
    got: list = []
    with bridgemgr.connect(f"mq://{address}", "admin", PASSWORD) as conn:
        conn.start()
        consumer = conn.create_session().create_consumer(Queue(queue))
        deadline = time.monotonic() + timeout
        while len(got) < expect and time.monotonic() < deadline:
            m = consumer.receive(0.5)
            if m is not None:
                got.append(m)
        while (m := consumer.receive(0.5)) is not None:
            got.append(m)
    return got


def link_state(daemon: Daemon, passfile: Path) -> str:
    out = cli(daemon, passfile, "list", "link", "-bn", "jb").stdout
    return next(line.split()[1] for line in out.splitlines() if line.startswith("l1 "))


def test_a_java_subclass_of_the_original_base_class_branches_drops_and_transforms(services):
    near, far, passfile, api, base_in_jar, cache = services
    deadline = time.monotonic() + 30
    while (state := link_state(near, passfile)) != "STARTED" and time.monotonic() < deadline:
        time.sleep(0.3)
    assert state == "STARTED", "\n".join(near.lines)
    with bridgemgr.connect(f"mq://{near.address}", "admin", PASSWORD) as conn:
        producer = conn.create_session().create_producer(Queue("tx.src"))
        for text in ("plain", "ref:other", "queue:tx.made", "drop", "drop", "new", "ref:other"):
            producer.send(TextMessage(text), delivery_mode=DeliveryMode.PERSISTENT)

    dst = {m.text: m for m in drain(far.address, "tx.dst", expect=2)}
    plain = dst.pop("PLAIN")  # transformed, with the link's properties (bridge name, <property>)
    assert plain.properties["bridge"] == "jb" and plain.properties["region"] == "emea"
    route = plain.properties["route"]  # source>target providers:readOnly:(source is SUN_MQ,
    assert route.endswith(":true:false")  # the STOMP bridge's name for the host broker)
    assert list(dst) == [f"made for {route.split('>')[1].split(':')[0]}"]  # createJMSMessage()
    assert [m.text for m in drain(far.address, "tx.other", expect=2)] == ["ref:other", "ref:other"]
    assert [m.text for m in drain(far.address, "tx.made", expect=1)] == ["queue:tx.made"]

    audit = drain(near.address, BUILTIN_DMQ_DESTINATION, expect=2)
    by_reason = {d.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_REASON"): d for d in audit}
    assert set(by_reason) == {"FIRST_TRANSFORMER_BRANCHTO", "FIRST_TRANSFORMER_NOTRANSFER"}
    assert by_reason["FIRST_TRANSFORMER_BRANCHTO"].object.text == "ref:other"
    assert (
        by_reason["FIRST_TRANSFORMER_BRANCHTO"].get_string_property("JMS_SUN_JMSBRIDGE_TARGET_CURRENT_DESTINATION")
        == "tx.other"
    )
    assert by_reason["FIRST_TRANSFORMER_NOTRANSFER"].object.text == "drop"
    assert drain(near.address, "tx.src", expect=0) == []
    assert link_state(near, passfile) == "STARTED"
    compiled = [p.name.split("-")[0] for p in cache.iterdir()] if cache.exists() else []
    assert compiled == ([] if base_in_jar else [api])  # the jar's own base class is used as is
