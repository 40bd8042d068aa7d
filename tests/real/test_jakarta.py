"""The jakarta.jms flavour against the real ActiveMQ: ActiveMQ's client renamed to
jakarta.jms (tests/real/jakarta_jars.py) in a class loader of its own, in the same JVM as the
javax.jms one; messages cross between the two flavours, XA works, and a Java transformer
compiled against jakarta.jms sees jakarta messages."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest
from jakarta_jars import rename_jar
from servers import ACTIVEMQ_CLIENT_JARS, JMS_API_JAR

from bridgemgr.jms import naming
from bridgemgr.jms.destination import Queue
from bridgemgr.jms.message import JavaSerialized, MapMessage, ObjectMessage, PropertyType, TextMessage
from bridgemgr.jms.spi import is_xa_capable
from bridgemgr.jms.xa import TMNOFLAGS, TMSUCCESS, XA_OK, Xid
from bridgemgr.transform import load_transformer

pytest.importorskip("jpype")
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def jakarta_jars(tmp_path_factory):
    out = tmp_path_factory.mktemp("jakarta")
    return [str(rename_jar(jar, out / ("jakarta-" + os.path.basename(jar)))) for jar in ACTIVEMQ_CLIENT_JARS]


@pytest.fixture(scope="module")
def jakarta_env(activemq, jakarta_jars):
    return activemq.jndi(**{"imq.bridge.java.classpath": os.pathsep.join(jakarta_jars)})


def test_a_jakarta_provider_next_to_a_javax_one(activemq, jakarta_env):
    jakarta = naming.lookup("ConnectionFactory", jakarta_env)
    javax = naming.lookup("ConnectionFactory", activemq.jndi())
    assert jakarta.flavor.package == "jakarta.jms" and javax.flavor.package == "javax.jms"
    q = Queue(f"jakarta.{uuid.uuid4().hex[:8]}")
    sent = [TextMessage("from jakarta"), MapMessage({"n": 1}), ObjectMessage(["x"])]
    sent[0].set_short_property("s", 5)
    with jakarta.create_connection() as conn:
        producer = conn.create_session().create_producer(q)
        for m in sent:
            producer.send(m)
    with javax.create_connection() as conn:
        conn.start()
        consumer = conn.create_session().create_consumer(q)
        got = [consumer.receive(5) for _ in sent]
    assert got[0].text == "from jakarta" and got[0].get_property_type("s") is PropertyType.SHORT
    assert got[1].get_body() == {"n": 1} and isinstance(got[2].object, JavaSerialized)


def test_jakarta_xa(jakarta_env):
    factory = naming.lookup("XAConnectionFactory", jakarta_env)
    assert is_xa_capable(factory) and factory.flavor.package == "jakarta.jms"
    with factory.create_xa_connection() as conn:
        session = conn.create_xa_session()
        xid = Xid(7, uuid.uuid4().bytes, b"j")
        session.xa_resource.start(xid, TMNOFLAGS)
        session.create_producer(Queue("jakarta.xa")).send(TextMessage("x"))
        session.xa_resource.end(xid, TMSUCCESS)
        assert session.xa_resource.prepare(xid) == XA_OK
        session.xa_resource.rollback(xid)


def test_a_jakarta_java_transformer(jakarta_jars, tmp_path):
    if shutil.which("javac") is None:
        pytest.skip("javac is not installed (Debian package default-jdk-headless)")
    api = rename_jar(JMS_API_JAR, tmp_path / "jakarta.jms-api.jar")
    (tmp_path / "JakartaStamp.java").write_text(
        "import jakarta.jms.*;\nimport java.util.Properties;\n"
        "public class JakartaStamp {\n"
        "  public Message transform(Message m, boolean r, String c, String s, String t, Properties p)\n"
        "      throws JMSException {\n"
        '    m.clearProperties(); m.setStringProperty("api", m.getClass().getInterfaces()[0].getName());\n'
        "    return m;\n  }\n}\n"
    )
    subprocess.run(
        ["javac", "-cp", str(api), "-d", str(tmp_path), str(tmp_path / "JakartaStamp.java")],
        check=True,
        capture_output=True,
        timeout=120,
    )
    from bridgemgr.providers import java

    java.configure([str(tmp_path), str(api)])
    transformer = load_transformer("bridgemgr.providers.java.classes.JakartaStamp")
    assert transformer.flavor.package == "jakarta.jms"
    out = transformer.transform(TextMessage("x"), False, None, "a", "b", {})
    assert out.get_string_property("api") == "jakarta.jms.TextMessage"
