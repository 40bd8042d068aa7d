"""The Java provider without a server: classpath assembly, Java exceptions -> ours, lossless
message conversion through ActiveMQ's real message classes (hypothesis), real JNDI
lookups, connect failures, Java transformers compiled with javac, threads calling Java.

The JVM starts once per process (JPype), so every test reaches the ActiveMQ client classes
through the same isolated class loader the provider gives a lookup environment."""

from __future__ import annotations

import math
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import threading
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridgemgr.jms import naming
from bridgemgr.jms.destination import Queue, Topic
from bridgemgr.jms.errors import (
    IllegalStateException,
    InvalidSelectorError,
    JMSException,
    MessageNotWriteableException,
    NamingException,
    TransportException,
    XAException,
)
from bridgemgr.jms.message import (
    BytesMessage,
    JavaSerialized,
    MapMessage,
    Message,
    ObjectMessage,
    PropertyType,
    StreamMessage,
    TextMessage,
)
from bridgemgr.jms.spi import is_xa_capable
from bridgemgr.props import load_properties
from bridgemgr.transform import load_transformer

sys.path.insert(0, str(Path(__file__).parent / "real"))
from servers import ACTIVEMQ_CLIENT_JARS, ACTIVEMQ_JNDI, JMS_API_JAR, missing_package

pytest.importorskip("jpype")
if missing_package("activemq"):
    pytest.skip(missing_package("activemq"), allow_module_level=True)

from bridgemgr.providers import java
from bridgemgr.providers.java import convert, jvm

# Slow: the tests start the JVM (3-4 s) or use it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
CLASSPATH = os.pathsep.join(ACTIVEMQ_CLIENT_JARS)


def jndi(url: str = "tcp://127.0.0.1:1", **extra: str) -> dict[str, str]:
    return {
        naming.INITIAL_CONTEXT_FACTORY: ACTIVEMQ_JNDI,
        naming.PROVIDER_URL: url,
        java.CLASSPATH_PROPERTY: CLASSPATH,
        **extra,
    }


@pytest.fixture(scope="module")
def loader():
    return jvm.isolated_loader(ACTIVEMQ_CLIENT_JARS)


@pytest.fixture(scope="module")
def flavor(loader):
    return convert.flavor_for("javax.jms", loader)


# --- classpath ----------------------------------------------------------------------------------


def test_classpath_entries_and_folders(tmp_path, monkeypatch):
    for name in ("b.jar", "a.jar", "notes.txt"):
        (tmp_path / name).write_text("x")
    assert jvm.split_classpath(f"x.jar{os.pathsep} y.jar,z.jar") == ["x.jar", "y.jar", "z.jar"]
    assert jvm.split_classpath(None) == []
    assert jvm.expand([f"{tmp_path}/*", "/opt/classes"]) == [
        str(tmp_path / "a.jar"),
        str(tmp_path / "b.jar"),
        "/opt/classes",
    ]
    assert jvm.expand([str(tmp_path / "?.jar")]) == [str(tmp_path / "a.jar"), str(tmp_path / "b.jar")]
    home = tmp_path / "imq"
    (home / "lib" / "ext").mkdir(parents=True)
    monkeypatch.setenv("IMQ_HOME", str(home))
    instance = tmp_path / "instance"
    assert jvm.ext_folders(instance) == [str(home / "lib" / "ext" / "*")]
    (instance / "lib" / "ext").mkdir(parents=True)
    assert jvm.ext_folders(instance)[-1] == str(instance / "lib" / "ext" / "*")


def test_broker_properties_feed_the_classpath(tmp_path, monkeypatch):
    monkeypatch.delenv("IMQ_HOME", raising=False)
    classes = tmp_path / "classes"
    classes.mkdir()
    props = load_properties(overrides=[f"imq.bridge.java.classpath={classes}", f"imq.varhome={tmp_path / 'var'}"])
    (props.instance_dir / "lib" / "ext").mkdir(parents=True)
    (props.instance_dir / "lib" / "ext" / "driver.jar").write_bytes(b"PK\x05\x06" + b"\0" * 18)
    plugins = tmp_path / "plugins"  # imq.bridge.transformer.path: Python modules and jars
    plugins.mkdir()
    (plugins / "shout.jar").write_bytes(b"PK\x05\x06" + b"\0" * 18)
    props = load_properties(
        overrides=[
            f"imq.bridge.java.classpath={classes}",
            f"imq.bridge.transformer.path={plugins}",
            f"imq.varhome={tmp_path / 'var'}",
        ]
    )
    java.configure_from_properties(props)
    assert str(classes) in jvm.classpath()
    assert str(props.instance_dir / "lib" / "ext" / "driver.jar") in jvm.classpath()
    assert str(plugins / "shout.jar") in jvm.classpath()


def test_a_missing_jar_in_a_lookup_classpath_is_named():
    with pytest.raises(NamingException, match=r"/nowhere/x.jar does not exist"):
        naming.lookup("ConnectionFactory", jndi(**{java.CLASSPATH_PROPERTY: "/nowhere/x.jar"}))


# --- Java exceptions -> ours ------------------------------------------------------------------------


def test_java_exceptions_become_ours(loader):
    def make(name: str, *args):
        return jvm.jclass(name, loader)(*args)

    assert type(jvm.translate(make("javax.jms.InvalidSelectorException", "bad"))) is InvalidSelectorError
    assert type(jvm.translate(make("javax.jms.IllegalStateException", "closed"))) is IllegalStateException
    failed = make("javax.jms.JMSException", "send failed")
    failed.initCause(make("java.net.SocketException", "Connection reset"))
    exc = jvm.translate(failed, "send")
    assert type(exc) is TransportException
    assert "send: javax.jms.JMSException: send failed" in str(exc) and "Connection reset" in str(exc)
    xa = jvm.translate(make("javax.transaction.xa.XAException", -4))
    assert type(xa) is XAException and xa.errorcode == -4
    assert type(jvm.translate(make("javax.naming.NameNotFoundException", "x"))) is NamingException
    assert type(jvm.translate(make("java.lang.RuntimeException", "odd"))) is JMSException


# --- messages -----------------------------------------------------------------------------------------


class MessageMaker:
    """Plays the JMS session that makes messages and destinations: ActiveMQ's own classes."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def _new(self, name: str):
        return jvm.jclass(f"org.apache.activemq.command.ActiveMQ{name}", self.loader)()

    def createMessage(self):
        return self._new("Message")

    def createTextMessage(self):
        return self._new("TextMessage")

    def createBytesMessage(self):
        return self._new("BytesMessage")

    def createMapMessage(self):
        return self._new("MapMessage")

    def createStreamMessage(self):
        return self._new("StreamMessage")

    def createObjectMessage(self):
        return self._new("ObjectMessage")

    def createQueue(self, name):
        return jvm.jclass("org.apache.activemq.command.ActiveMQQueue", self.loader)(name)

    def createTopic(self, name):
        return jvm.jclass("org.apache.activemq.command.ActiveMQTopic", self.loader)(name)


def to_java(msg, loader, flavor):
    maker = MessageMaker(loader)
    return convert.to_java(msg, maker, flavor, lambda d: convert.to_java_destination(d, maker, flavor))


NAMES = st.from_regex(r"[a-z][A-Za-z0-9_]{0,11}", fullmatch=True).filter(
    lambda n: n.upper() not in ("NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE")
)
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
PROPERTY = st.one_of(
    st.tuples(st.just(PropertyType.BOOLEAN), st.booleans()),
    st.tuples(st.just(PropertyType.BYTE), st.integers(-128, 127)),
    st.tuples(st.just(PropertyType.SHORT), st.integers(-(2**15), 2**15 - 1)),
    st.tuples(st.just(PropertyType.INT), st.integers(-(2**31), 2**31 - 1)),
    st.tuples(st.just(PropertyType.LONG), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.just(PropertyType.FLOAT), st.floats(width=32)),
    st.tuples(st.just(PropertyType.DOUBLE), st.floats()),
    st.tuples(st.just(PropertyType.STRING), TEXT),
)
VALUE = st.one_of(
    PROPERTY,
    st.tuples(st.just(PropertyType.CHAR), st.characters(max_codepoint=0xFFFF, blacklist_categories=("Cs",))),
    st.tuples(st.just(PropertyType.BYTES), st.binary(max_size=20)),
)


@st.composite
def messages(draw):
    kind = draw(st.sampled_from(["text", "bytes", "map", "stream", "object", "plain"]))
    if kind == "text":
        msg: Message = TextMessage(draw(st.one_of(st.none(), TEXT)))
    elif kind == "bytes":
        msg = BytesMessage(draw(st.binary(max_size=100)))
    elif kind == "map":
        msg = MapMessage()
        for name, (ptype, value) in draw(st.dictionaries(NAMES, VALUE, max_size=6)).items():
            msg.set_typed(name, ptype, value)
    elif kind == "stream":
        msg = StreamMessage()
        for ptype, value in draw(st.lists(VALUE, max_size=6)):
            msg.write_typed(ptype, value)
    elif kind == "object":
        msg = ObjectMessage(
            draw(
                st.recursive(
                    st.one_of(st.integers(-(2**63), 2**63 - 1), TEXT, st.booleans(), st.binary(max_size=8)),
                    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(NAMES, c, max_size=3)),
                    max_leaves=6,
                )
            )
        )
    else:
        msg = Message()
    for name, (ptype, value) in draw(st.dictionaries(NAMES, PROPERTY, max_size=6)).items():
        msg.set_typed_property(name, ptype, value)
    msg.correlation_id = draw(st.one_of(st.none(), TEXT))
    msg.type = draw(st.one_of(st.none(), TEXT))
    msg.reply_to = draw(st.one_of(st.none(), st.builds(Queue, NAMES), st.builds(Topic, NAMES)))
    return msg


def canon(entries):
    """Typed entries, floats by their bits (-0.0 differs from 0.0); every NaN is one NaN
    (a NaN's payload bits are not kept by Java's float conversions, nor promised by JMS)."""

    def bits(value):
        return b"NaN" if math.isnan(value) else struct.pack(">d", value)

    return [(*e[:-1], bits(e[-1]) if isinstance(e[-1], float) else e[-1]) for e in entries]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(msg=messages())
def test_python_java_python_is_lossless(msg, loader, flavor):
    jmsg = to_java(msg, loader, flavor)
    back = convert.to_python(jmsg, flavor)
    assert type(back) is type(msg)
    assert canon(sorted(back.typed_properties())) == canon(sorted(msg.typed_properties()))
    assert (back.correlation_id, back.type, back.reply_to) == (msg.correlation_id, msg.type, msg.reply_to)
    if isinstance(msg, MapMessage):
        assert canon(sorted(back.typed_items())) == canon(sorted(msg.typed_items()))
    elif isinstance(msg, StreamMessage):
        assert canon(back.typed_items()) == canon(msg.typed_items())
    elif isinstance(msg, ObjectMessage):
        # A Python object body becomes Java objects, and comes back as their serial form.
        assert isinstance(back.object, JavaSerialized) and back.object[:4] == b"\xac\xed\x00\x05"
        again = convert.to_python(to_java(back, loader, flavor), flavor)
        assert again.object == back.object  # the Java form round-trips byte for byte
    else:
        assert back.get_body() == msg.get_body()
    assert back.is_read_only


def test_java_serialized_bodies_stay_opaque_bytes(loader, flavor):
    """The serial form of a class that nobody here has passes through untouched."""
    stream = (
        b"\xac\xed\x00\x05sr\x00\x14com.example.Secret42\x00\x00\x00\x00\x00\x00\x00\x01"
        b"\x02\x00\x01I\x00\x01xxp\x00\x00\x00\x07"
    )
    jmsg = to_java(ObjectMessage(JavaSerialized(stream)), loader, flavor)
    back = convert.to_python(jmsg, flavor)
    assert back.object == stream and type(back.object) is JavaSerialized
    compressed = MessageMaker(loader).createObjectMessage()  # as with jms.useCompression=true
    sequence = jvm.jclass("org.apache.activemq.util.ByteSequence", loader)
    compressed.setContent(sequence(zlib.compress(stream)))
    compressed.setCompressed(True)
    assert convert.to_python(compressed, flavor).object == stream


def test_headers_from_java(loader, flavor):
    jmsg = MessageMaker(loader).createTextMessage()
    jmsg.setJMSMessageID("ID:1")
    jmsg.setJMSTimestamp(17)
    jmsg.setJMSDeliveryMode(1)
    jmsg.setJMSPriority(7)
    jmsg.setJMSExpiration(99)
    jmsg.setJMSRedelivered(True)
    jmsg.setRedeliveryCounter(2)
    jmsg.setJMSDestination(MessageMaker(loader).createTopic("t"))
    msg = convert.to_python(jmsg, flavor)
    assert (msg.message_id, msg.timestamp, msg.delivery_mode, msg.priority, msg.expiration) == ("ID:1", 17, 1, 7, 99)
    assert msg.redelivered and msg.delivery_count == 3 and msg.destination == Topic("t")


# --- naming and connecting ------------------------------------------------------------------------------


def test_real_jndi_lookups():
    env = jndi(**{"queue.orders": "ORDERS.IN", "topic.news": "NEWS"})
    cf = naming.lookup("ConnectionFactory", env)
    assert isinstance(cf, java.JavaConnectionFactory) and not is_xa_capable(cf)
    assert is_xa_capable(naming.lookup("XAConnectionFactory", env))
    assert naming.lookup("orders", env) == Queue("ORDERS.IN")
    assert naming.lookup("news", env) == Topic("NEWS")
    assert naming.lookup("dynamicQueues/x.y", env) == Queue("x.y")
    with pytest.raises(NamingException, match="lookup 'nothing'"):
        naming.lookup("nothing", env)


def test_an_unknown_initial_context_factory_names_where_classes_come_from():
    env = jndi()
    env[naming.INITIAL_CONTEXT_FACTORY] = "com.example.NoSuchContextFactory"
    with pytest.raises(NamingException, match=r"classes from .*activemq-client.jar"):
        naming.lookup("ConnectionFactory", env)


def test_java_class_names_resolve_without_importing_the_provider_first():
    code = (
        "import sys; from bridgemgr.jms import naming; assert 'bridgemgr.providers.java' "
        f"not in sys.modules; print(type(naming.lookup('ConnectionFactory', {jndi()!r})).__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    assert out.stdout.strip() == "JavaConnectionFactory", out.stderr


def test_connection_refused_is_a_transport_error():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cf = naming.lookup("ConnectionFactory", jndi(f"tcp://127.0.0.1:{port}"))
    with pytest.raises(TransportException, match="Connection refused"):
        cf.create_connection()
    assert not jvm.OPEN  # nothing half-open is kept


def test_threads_share_the_jvm(loader, flavor):
    """Python threads attach to the JVM on their first call, concurrently."""
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(200):
                msg = MapMessage({"n": n, "i": i})
                back = convert.to_python(to_java(msg, loader, flavor), flavor)
                assert back.get_body() == {"n": n, "i": i}
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_a_test_run_that_leaves_java_busy_exits_0(tmp_path):
    """JPype stops the JVM at exit while Java threads run compiled code: HotSpot needs its
    own SIGSEGV handler then (safepoint polls fault on purpose). The tests' configuration
    (pyproject.toml's addopts, tests/conftest.py) must leave it in place; with pytest's
    faulthandler plugin this run ended with SIGSEGV after "1 passed", every time."""
    (tmp_path / "test_busy.py").write_text(
        textwrap.dedent("""
        import threading, time
        from bridgemgr.providers.java import jvm

        def test_busy_java_threads_at_exit():
            jvm.start()
            import jpype
            numbers = jpype.JClass("java.util.stream.LongStream").range(0, 10**15)
            threading.Thread(target=numbers.parallel().sum, daemon=True).start()
            time.sleep(2)
        """)
    )
    root = Path(__file__).parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "tests"), str(root)])}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(root / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            "-p",
            "conftest",
            "-p",
            "no:cacheprovider",
            "-q",
            str(tmp_path / "test_busy.py"),
        ],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
    )
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout + run.stderr


# --- Java transformers -----------------------------------------------------------------------------------

TRANSFORMERS = {
    "Upper": """
        public Message transform(Message m, boolean readOnly, String charset, String source,
                                 String target, Properties props) throws JMSException {
            TextMessage t = (TextMessage) m;
            String text = t.getText();
            t.clearBody();
            t.setText(text.toUpperCase() + props.getProperty("suffix", ""));
            Object n = t.getObjectProperty("n");
            t.clearProperties();
            t.setByteProperty("b", (byte) 7);
            t.setFloatProperty("f", 1.5f);
            t.setStringProperty("was", n == null ? "null" : n.getClass().getName());
            t.setStringProperty("route", source + ">" + target + ":" + readOnly);
            t.setJMSReplyTo(t.getJMSDestination());
            return t;
        }""",
    "Tamper": """
        public Message transform(Message m, boolean readOnly, String charset, String source,
                                 String target, Properties props) throws JMSException {
            ((TextMessage) m).setText("changed without clearBody()");
            return m;
        }""",
    "Router": """
        private String branch; private boolean drop;
        public String getBranchTo() { return branch; }
        public boolean isNoTransfer() { return drop; }
        public Message transform(Message m, boolean readOnly, String charset, String source,
                                 String target, Properties props) throws JMSException {
            String to = m.getStringProperty("to");
            branch = "other".equals(to) ? "other" : null;
            drop = "nowhere".equals(to);
            return "null".equals(to) ? null : m;
        }""",
    "Bodies": """
        public Message transform(Message m, boolean readOnly, String charset, String source,
                                 String target, Properties props) throws JMSException {
            if (m instanceof MapMessage) {
                MapMessage map = (MapMessage) m;
                String seen = map.getObject("c").getClass().getName() + "," + map.getShort("s");
                map.clearBody();
                map.setChar("c2", 'z'); map.setBytes("raw", new byte[]{1, 2}); map.setString("seen", seen);
            } else if (m instanceof StreamMessage) {
                StreamMessage s = (StreamMessage) m;
                long first = s.readLong(); Object second = s.readObject();
                s.clearBody();
                s.writeInt((int) first + 1); s.writeString(second.getClass().getName());
            } else if (m instanceof BytesMessage) {
                BytesMessage b = (BytesMessage) m;
                byte[] buf = new byte[(int) b.getBodyLength()];
                b.readBytes(buf);
                b.clearBody();
                b.writeInt(buf.length); b.writeUTF("ok");
            } else if (m instanceof ObjectMessage) {
                ObjectMessage o = (ObjectMessage) m;
                java.util.List<?> list = (java.util.List<?>) o.getObject();
                o.clearBody();
                o.setObject(new java.util.ArrayList<Object>(list.subList(0, 1)));
            }
            return m;
        }""",
}


@pytest.fixture(scope="module")
def java_classes(tmp_path_factory):
    if shutil.which("javac") is None:
        pytest.skip("javac is not installed (Debian package default-jdk-headless)")
    src = tmp_path_factory.mktemp("java-transformers")
    for name, body in TRANSFORMERS.items():
        (src / f"{name}.java").write_text(
            f"import javax.jms.*;\nimport java.util.Properties;\npublic class {name} {{\n{textwrap.dedent(body)}\n}}\n"
        )
    subprocess.run(
        ["javac", "-cp", JMS_API_JAR, "-d", str(src), *map(str, src.glob("*.java"))],
        check=True,
        capture_output=True,
        timeout=120,
    )
    java.configure([str(src), JMS_API_JAR])
    return src


def transformer(name: str):
    return load_transformer(f"bridgemgr.providers.java.classes.{name}")


def received(msg: Message) -> Message:
    msg.destination = Queue("in")
    msg.set_read_only()
    return msg


def test_a_java_class_is_a_message_transformer(java_classes):
    t = transformer("Upper")
    source = TextMessage("hello")
    source.set_int_property("n", 3)
    t.reset(in_bridge_link=True)
    out = t.transform(received(source), True, None, "SUN_MQ", "ActiveMQ", {"suffix": "!"})
    assert out.text == "HELLO!" and source.text == "hello"  # the original is untouched
    assert out.get_property_type("b") is PropertyType.BYTE and out.get_property_type("f") is PropertyType.FLOAT
    assert out.properties["was"] == "java.lang.Integer"
    assert out.properties["route"] == "SUN_MQ>ActiveMQ:true"
    assert out.reply_to == Queue("in")


def test_a_read_only_message_stays_read_only_in_java(java_classes):
    t = transformer("Tamper")
    t.reset(in_bridge_link=True)
    with pytest.raises(MessageNotWriteableException, match="read-only"):
        t.transform(received(TextMessage("x")), True, None, "a", "b", {})


@pytest.mark.parametrize(
    "to, result, branch, drop",
    [
        ("here", "kept", None, False),
        ("other", "kept", "other", False),
        ("nowhere", "kept", None, True),
        ("null", None, None, False),
    ],
)
def test_branch_to_no_transfer_and_null(java_classes, to, result, branch, drop):
    t = transformer("Router")
    msg = TextMessage("m")
    msg.set_string_property("to", to)
    t.reset(in_bridge_link=True)
    out = t.transform(received(msg), True, None, "a", "b", {})
    assert (out is not None) == (result == "kept")
    assert t.outcome().branch_to == branch and t.outcome().no_transfer == drop


def test_every_body_kind_through_java(java_classes):
    t = transformer("Bodies")
    m = MapMessage()
    m.set_char("c", "x")
    m.set_short("s", 9)
    out = t.transform(received(m), True, None, "a", "b", {})
    assert {n: p for n, p, _ in out.typed_items()} == {
        "c2": PropertyType.CHAR,
        "raw": PropertyType.BYTES,
        "seen": PropertyType.STRING,
    }
    assert out.get_body() == {"c2": "z", "raw": b"\x01\x02", "seen": "java.lang.Character,9"}
    s = StreamMessage()
    s.write_long(41)
    s.write_float(2.5)
    assert t.transform(received(s), True, None, "a", "b", {}).get_body() == [42, "java.lang.Float"]
    b = t.transform(received(BytesMessage(b"abc")), True, None, "a", "b", {})
    assert b.get_body() == b"\x00\x00\x00\x03\x00\x02ok"
    o = t.transform(received(ObjectMessage([5, "six"])), True, None, "a", "b", {})
    assert isinstance(o.object, JavaSerialized)


def test_a_missing_java_class_is_a_clear_load_error(java_classes):
    with pytest.raises(
        JMSException, match=r"Java class NoSuchTransformer cannot be loaded .*classpath is .*java-transformers"
    ):
        transformer("NoSuchTransformer")


def test_a_plain_java_class_name_loads_as_a_transformer(java_classes, tmp_path):
    """message-transformer-class="com.example.Upper": no Python module of that name, Java
    is configured, so the Java class is meant."""
    pkg = tmp_path / "com" / "example"
    pkg.mkdir(parents=True)
    (pkg / "Shout.java").write_text(
        "package com.example;\nimport javax.jms.*;\nimport java.util.Properties;\n"
        "public class Shout {\n public Message transform(Message m, boolean ro, String cs, String s,"
        " String t, Properties p) throws JMSException {\n"
        '  TextMessage tm = (TextMessage) m; tm.clearBody(); tm.setText("SHOUT"); return tm; }\n}\n'
    )
    subprocess.run(
        ["javac", "-cp", JMS_API_JAR, "-d", str(tmp_path), str(pkg / "Shout.java")],
        check=True,
        capture_output=True,
        timeout=120,
    )
    java.configure([str(tmp_path)])
    t = load_transformer("com.example.Shout")
    t.reset(in_bridge_link=True)
    assert t.transform(received(TextMessage("hi")), True, None, "a", "b", {}).text == "SHOUT"
    with pytest.raises(
        JMSException,
        match=r"(?s)No module named 'com'.*nor is it a Java transformer: "
        r"Java class com.example.Missing cannot be loaded",
    ):
        load_transformer("com.example.Missing")
    with pytest.raises(JMSException, match="has no attribute 'Nope'"):  # a Python module stays Python
        load_transformer("transformers.uppercase.Nope")


# --- Java transformers that extend the original's base class -------------------------------------------

ROUTER = """
package com.example;
import javax.jms.*;
import java.util.Properties;
import com.sun.messaging.bridge.service.MessageTransformer;

/** Routes by its text: ref:NAME branches to a ref-name, queue:NAME to a queue it makes, drop
 *  is consumed only, new is replaced by a message it makes, anything else is upper-cased and
 *  tagged with the bridge name, a configured property and the route. */
public class Router extends MessageTransformer<Message, Message> {
    public Message transform(Message m, boolean readOnly, String charsetName, String source,
                             String target, Properties props) throws Exception {
        String text = ((TextMessage) m).getText();
        if (text.startsWith("ref:")) { branchTo(text.substring(4)); return m; }
        if (text.startsWith("queue:")) { branchTo(createQueue(text.substring(6))); return m; }
        if (text.equals("drop")) { noTransfer(); return m; }
        if (text.equals("new")) {
            TextMessage made = (TextMessage) createJMSMessage(JMSMessageType.TEXTMESSAGE);
            made.setText("made for " + target);
            return made;
        }
        TextMessage t = (TextMessage) m;
        t.clearBody();
        t.clearProperties();
        t.setText(text.toUpperCase());
        t.setStringProperty("bridge", props.getProperty("JMS_SUN_JMSBRIDGE_NAME"));
        t.setStringProperty("region", props.getProperty("region"));
        t.setStringProperty("route", source + ">" + target + ":" + readOnly + ":" + (source.equals(SUN_MQ)));
        return t;
    }
}
"""


def compile_against_base(
    dest: Path, sources: dict[str, str], api: str = "javax.jms", api_jar: str = JMS_API_JAR
) -> tuple[Path, Path]:
    """Java ``sources`` (relative path -> text) compiled against the shipped base class for
    ``api`` (its classes in ``api_jar``): the folder of their classes only (a user's jar built
    against the original does not hold the base class), and the folder of the base classes."""
    from bridgemgr.providers.java.baseclass import sources as base_sources

    if shutil.which("javac") is None:
        pytest.skip("javac is not installed (Debian package default-jdk-headless)")
    src, base, classes = dest / "src", dest / "base", dest / "classes"
    for root, files in ((src, sources), (base, base_sources(api))):
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
    subprocess.run(
        ["javac", "-cp", api_jar, "-d", str(base / "out"), *map(str, base.rglob("*.java"))],
        check=True,
        capture_output=True,
        timeout=120,
    )
    subprocess.run(
        [
            "javac",
            "-cp",
            os.pathsep.join([api_jar, str(base / "out")]),
            "-d",
            str(classes),
            *map(str, src.rglob("*.java")),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return classes, base / "out"


@pytest.fixture(scope="module")
def router_classes(java_classes, tmp_path_factory):
    """com.example.Router on the classpath without the base class; the base class compiles
    into a fresh cache folder."""
    dest = tmp_path_factory.mktemp("router")
    classes, _ = compile_against_base(dest, {"com/example/Router.java": ROUTER})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(dest / "cache"))
        java.configure([str(classes)])
        yield load_transformer("com.example.Router"), dest / "cache"


def routed(t, text: str, in_bridge_link: bool = True, source: str = "SUN_MQ", target: str = "far"):
    msg = TextMessage(text)
    t.reset(in_bridge_link=in_bridge_link)
    out = t.transform(received(msg), True, None, source, target, {"region": "emea", "JMS_SUN_JMSBRIDGE_NAME": "jb"})
    return out, t.outcome()


def test_a_subclass_of_the_base_class_transforms(router_classes):
    t, cache = router_classes
    assert next(p.name for p in (cache / "imqbridge" / "java").iterdir()).startswith("javax.jms-")
    out, outcome = routed(t, "plain")
    assert out.text == "PLAIN" and outcome.branch_to is None and not outcome.no_transfer
    assert out.properties == {"bridge": "jb", "region": "emea", "route": "SUN_MQ>far:true:true"}
    made, _ = routed(t, "new")
    assert isinstance(made, TextMessage) and made.text == "made for far"


@pytest.mark.parametrize(
    "text, branch, drop",
    [
        ("ref:other", "other", False),
        ("queue:elsewhere", Queue("elsewhere"), False),
        ("drop", None, True),
    ],
)
def test_branch_to_and_no_transfer_of_the_base_class(router_classes, text, branch, drop):
    t, _ = router_classes
    out, outcome = routed(t, text)
    assert out.text == text
    assert outcome.branch_to == branch and outcome.no_transfer == drop
    _, after = routed(t, "plain")  # init() before each call resets both
    assert after.branch_to is None and not after.no_transfer


def test_branch_to_is_refused_on_the_stomp_bridge_and_ignored_in_a_dmq(router_classes):
    t, _ = router_classes
    with pytest.raises(
        JMSException, match=r"UnsupportedOperationException: branchTo.. is only available on a JMS bridge link"
    ):
        routed(t, "ref:other", in_bridge_link=False, source="STOMP", target="SUN_MQ")
    out, outcome = routed(t, "drop", in_bridge_link=False)  # a DMQ's transformer: as the original, no effect
    assert out.text == "drop" and not outcome.no_transfer


def test_one_jms_api_per_process(router_classes):
    from bridgemgr.providers.java import baseclass

    with pytest.raises(JMSException, match=r"built for javax.jms; a transformer built against jakarta.jms"):
        baseclass.install("jakarta.jms", jvm.default_loader())


def test_the_base_class_source_compiles_for_jakarta_jms(tmp_path):
    """No jakarta.jms jar here: a minimal API of the names the base class uses stands in."""
    from bridgemgr.providers.java.baseclass import sources

    if shutil.which("javac") is None:
        pytest.skip("javac is not installed (Debian package default-jdk-headless)")
    api = tmp_path / "api" / "jakarta" / "jms"
    api.mkdir(parents=True)
    for name in ("Message", "TextMessage", "BytesMessage", "MapMessage", "StreamMessage", "ObjectMessage"):
        (api / f"{name}.java").write_text(
            f"package jakarta.jms; public interface {name} {'' if name == 'Message' else 'extends Message '}{{}}\n"
        )
    for name in ("Destination", "Queue", "Topic"):
        (api / f"{name}.java").write_text(
            f"package jakarta.jms; public interface {name} "
            f"{'' if name == 'Destination' else 'extends Destination '}{{}}\n"
        )
    (api / "Session.java").write_text(
        "package jakarta.jms; public interface Session {\n"
        + "".join(
            f" {kind}Message create{kind}Message();\n" for kind in ("", "Text", "Bytes", "Map", "Stream", "Object")
        )
        + " Queue createQueue(String n); Topic createTopic(String n);\n}\n"
    )
    for rel, text in sources("jakarta.jms").items():
        assert "import javax" not in text
        (tmp_path / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / rel).write_text(text)
    subprocess.run(
        [
            "javac",
            "-d",
            str(tmp_path / "out"),
            *map(str, (tmp_path / "api").rglob("*.java")),
            *map(str, (tmp_path / "src").rglob("*.java")),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert (tmp_path / "out" / "com/sun/messaging/bridge/api/MessageTransformer$JMSMessageType.class").exists()
    assert (tmp_path / "out" / "com/sun/messaging/bridge/service/MessageTransformer.class").exists()


def test_a_transactions_xid_crosses_to_java_once(loader):
    """start, end and commit of a transaction, at each of its resources, hand the provider
    the same Java Xid: ActiveMQ compares the Xid of end() and commit() with the one
    associated, which is then an identity check instead of three calls back into Python a
    side (and the byte arrays go to the JVM once)."""
    from bridgemgr.jms.xa import Xid
    from bridgemgr.providers.java.xa import XID_CACHE, to_java_xid

    xid = Xid(0x494D5142, b"bench|1a2b.1", b"src#1")
    jxid = to_java_xid(xid)
    assert to_java_xid(Xid(xid.format_id, xid.gtrid, xid.bqual)) is jxid
    copy = jvm.jclass("org.apache.activemq.command.XATransactionId", loader)(jxid)
    assert (int(copy.getFormatId()), bytes(copy.getGlobalTransactionId()), bytes(copy.getBranchQualifier())) == (
        xid.format_id,
        xid.gtrid,
        xid.bqual,
    )
    for seq in range(XID_CACHE):  # a bounded cache: old transactions' Xids go
        to_java_xid(Xid(xid.format_id, b"bench|1a2b.%x" % (seq + 2), b"src#1"))
    assert to_java_xid(xid) is not jxid
