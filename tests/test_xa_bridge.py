"""Transacted links of a JMS bridge through the XA coordinator, between two embedded
brokers: resource manager registration and recovery at start (before any link moves a
message), the chapter's failure rules (a failed send or prepare rolls back, a poison message
reaches the DMQ through the backout threshold, a failed commit goes to the DMQ as
COMMIT_FAILURE), transaction.batchSize, tm.props, pooled targets, a stop in the
middle of a stream, and a full disk under the log (a real EFBIG, in a subprocess): the link
stops with a clear error and no message is lost."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from bridgemgr.jms import ObjectMessage, Queue, xa
from bridgemgr.jms.errors import XAException
from bridgemgr.jms.spi import ConnectionFactory
from bridgemgr.jms.xa import Xid
from bridgemgr.jmsbridge.bridge import BridgeStartError, JMSBridge
from bridgemgr.jmsbridge.config import parse_bridge_config
from bridgemgr.jmsbridge.states import State
from bridgemgr.props import load_properties
from bridgemgr.providers.embedded import Broker, DestinationLimits, EmbeddedConnectionFactory
from bridgemgr.transform import MessageTransformer
from bridgemgr.xa.coordinator import FORMAT_ID, make_gtrid
from bridgemgr.xa.txlog import CommitRecord, FileTxLog, Participant, txlog_path
from jmsbridge_support import BUILTIN_DMQ, FAST, bridge_xml, drain, send, texts, wait_until

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[1]


def cross_link(transacted: str = "true", target_attrs: str = "") -> str:
    return (
        f'<link name="l" transacted="{transacted}">'
        '<source connection-factory-ref="host" destination-ref="src"/>'
        f'<target connection-factory-ref="far" destination-ref="dst" {target_attrs}/></link>'
    )


JNDI = '<property name="java.naming.factory.initial" value="test"/>'
FAR = f'<connection-factory ref-name="far" lookup-name="XAConnectionFactory">{JNDI}</connection-factory>'


@pytest.fixture
def pair(tmp_path):
    a, b = Broker(tmp_path / "a"), Broker(tmp_path / "b")
    yield a, b
    a.close()
    b.close()


def props_for(tmp_path: Path, *extra: str):
    return load_properties(
        [],
        [f"imq.varhome={tmp_path / 'var'}", "imq.bridge.b.type=jms", "imq.bridge.b.xmlurl=b.xml", *extra],
        environ={},
    )


def make(a: Broker, b: Broker | ConnectionFactory, xml: bytes, props=None, **kw) -> JMSBridge:
    far = b if isinstance(b, ConnectionFactory) else EmbeddedConnectionFactory(b)
    return JMSBridge(
        parse_bridge_config(xml, "b.xml"),
        props,
        host_factory=lambda env: EmbeddedConnectionFactory(a),
        lookup=lambda name, env: far,
        tuning=FAST,
        **kw,
    )


@pytest.fixture
def bridges():
    started: list[JMSBridge] = []
    yield started
    for br in started:
        br.stop()


# --- start: registration, recovery, refusals ---------------------------------------------------


class Plain(ConnectionFactory):
    """A provider without XA."""

    def __init__(self, broker: Broker) -> None:
        self.inner = EmbeddedConnectionFactory(broker)

    def create_connection(self, username=None, password=None):
        return self.inner.create_connection(username, password)


def test_a_transacted_link_needs_xa_factories_at_both_ends(pair):
    a, b = pair
    br = make(a, Plain(b), bridge_xml(cross_link(), cfs=FAR))
    with pytest.raises(
        BridgeStartError,
        match=r"b.xml:1: link l: connection-factory far is not "
        "an XAConnectionFactory",
    ):
        br.start()
    assert br.state is State.STOPPED and not a.connections and not b.connections


def test_non_transacted_links_need_no_coordinator(pair, bridges, tmp_path):
    a, b = pair
    send(a, "src", ["m"])
    br = make(a, Plain(b), bridge_xml(cross_link("false"), cfs=FAR), props_for(tmp_path))
    bridges.append(br)
    br.start()
    assert texts(drain(b, "dst", expect=1)) == ["m"]
    assert not (tmp_path / "var" / "instances" / "imqbroker" / "bridges" / "b" / "txlog.b").exists()


def leave_in_doubt(a: Broker, b: Broker, gtrid: bytes) -> tuple[Xid, Xid]:
    """One message moved a:src -> b:dst in two prepared branches (a crash's leftovers)."""
    xids = Xid(FORMAT_ID, gtrid, b"host#1"), Xid(FORMAT_ID, gtrid, b"far#2")
    ca = EmbeddedConnectionFactory(a).create_xa_connection()
    ca.start()
    cb = EmbeddedConnectionFactory(b).create_xa_connection()
    sa, sb = ca.create_xa_session(), cb.create_xa_session()
    sa.xa_resource.start(xids[0], 0)
    sb.xa_resource.start(xids[1], 0)
    sb.create_producer(Queue("dst")).send(sa.create_consumer(Queue("src")).receive(1))
    for s, x in ((sa, xids[0]), (sb, xids[1])):
        s.xa_resource.end(x, 0x04000000)
        s.xa_resource.prepare(x)
    ca.close()
    cb.close()
    return xids


def test_recovery_runs_before_the_links_start(pair, bridges, tmp_path, caplog):
    a, b = pair
    send(a, "src", ["decided", "undecided", "next"])
    props = props_for(tmp_path)
    decided, undecided = make_gtrid(b"b", b"crashed", 1), make_gtrid(b"b", b"crashed", 2)
    xids = leave_in_doubt(a, b, decided)
    leave_in_doubt(a, b, undecided)
    log = FileTxLog(txlog_path(props.bridge_dir("b"), "b"))
    log.open()
    log.log_commit(CommitRecord(decided, (Participant("b:host", xids[0]), Participant("b:far", xids[1]))))
    log.close()
    caplog.set_level(logging.INFO)
    br = make(a, b, bridge_xml(cross_link(), cfs=FAR), props)
    bridges.append(br)
    br.start()
    left = [x for x in a.xa_recover() + b.xa_recover() if x.gtrid in (decided, undecided)]
    assert left == []  # by the time start() returns (the link's own may be in doubt now)
    names = caplog.text.split("; resource managers ")[1].splitlines()[0]
    assert sorted(names.split(", ")) == ["b:far", "b:host"]
    assert caplog.text.index("XA recovery of b:host") < caplog.text.index("link l connected")
    got = texts(drain(b, "dst", expect=3))
    assert sorted(got) == ["decided", "next", "undecided"]  # each exactly once
    assert got[0] == "decided"  # committed by recovery, before the link moved anything


def test_a_multi_rm_factory_is_not_registered(pair, bridges, caplog):
    a, b = pair
    caplog.set_level(logging.INFO)
    cfs = FAR.replace("lookup-name=", 'multi-rm="true" lookup-name=')
    br = make(a, b, bridge_xml(cross_link(), cfs=cfs))
    bridges.append(br)
    br.start()
    assert caplog.text.split("; resource managers ")[1].splitlines()[0] == "b:host"
    assert 'connection-factory far: multi-rm="true": not registered' in caplog.text
    send(a, "src", ["m"])
    assert texts(drain(b, "dst", expect=1)) == ["m"]  # it still takes part in transactions


# --- the chapter's failure rules -------------------------------------------------------------------


class Unsendable(MessageTransformer):
    """'bad...' becomes an ObjectMessage the codec cannot encode: the send fails."""

    def transform(self, message, read_only, charset_name, source, target, properties):
        return ObjectMessage({1, 2}) if message.text.startswith("bad") else message


@pytest.mark.slow
def test_a_failed_send_rolls_back_instead_of_the_dmq(pair, bridges, tmp_path):
    a, b = pair
    send(a, "src", ["bad", "ok"])
    xml = bridge_xml(cross_link(target_attrs=f'message-transformer-class="{__name__}.Unsendable"'), cfs=FAR)
    br = make(a, b, xml, props_for(tmp_path, "imq.bridge.b.backoutThreshold=0"))
    bridges.append(br)
    br.start()
    wait_until(lambda: br.links[0].counters.rolled_back >= 2, what="rollbacks")
    br.stop()
    assert drain(a, BUILTIN_DMQ) == [] and drain(b, "dst") == []
    assert texts(drain(a, "src")) == ["bad", "ok"]
    assert a.xa_recover() == [] and b.xa_recover() == []


@pytest.mark.slow
def test_a_refused_prepare_rolls_back_and_nothing_goes_to_the_dmq(pair, bridges, tmp_path):
    """A prepare that fails is no commit failure: nothing was committed anywhere, the
    message comes back, so it is not in the DMQ as well (backoutThreshold=0: it stays)."""
    a, b = pair
    b.configure_destination(Queue("dst"), DestinationLimits(max_num_msgs=1))
    send(a, "src", ["first", "second"])
    br = make(a, b, bridge_xml(cross_link(), cfs=FAR), props_for(tmp_path, "imq.bridge.b.backoutThreshold=0"))
    bridges.append(br)
    br.start()
    wait_until(lambda: br.links[0].counters.rolled_back >= 3, what="rollbacks")
    br.stop()
    assert drain(a, BUILTIN_DMQ) == [] and not br.links[0].counters.dmq_reasons
    assert "queue://dst is full" in br.links[0].counters.last_error
    assert texts(drain(a, "src")) == ["second"] and texts(drain(b, "dst")) == ["first"]
    assert a.xa_recover() == [] and b.xa_recover() == []


@pytest.mark.slow
def test_a_target_refusing_at_prepare_backs_out_the_poison_message_alone(pair, bridges, tmp_path):
    """A refusal at the target's prepare rolls the whole batch back (no DMQ: nothing was
    committed); the link then moves that batch's messages one per transaction, so only the
    refused one is backed out, and after the default backoutThreshold it goes to the DMQ
    once, BACKOUT_THRESHOLD_REACHED; the messages behind it follow in order."""
    a, b = pair
    b.configure_destination(Queue("dst"), DestinationLimits(max_bytes_per_msg=20 * 1024))
    send(a, "src", ["good1", "big" + "x" * 30 * 1024, "good2"])
    br = make(a, b, bridge_xml(cross_link(), cfs=FAR), props_for(tmp_path, "imq.bridge.b.transaction.batchSize=3"))
    bridges.append(br)
    br.start()
    link = br.links[0]
    got = drain(b, "dst", expect=2)
    assert texts(got) == ["good1", "good2"]
    (dead,) = drain(a, BUILTIN_DMQ, expect=1)
    assert dead.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_REASON") == "BACKOUT_THRESHOLD_REACHED"
    assert dead.object.text.startswith("big") and "backoutThreshold=5" in dead.get_string_property(
        "JMS_SUN_JMSBRIDGE_DMQ_EXCEPTION"
    )
    # good2 did not overtake it: it was sent after the poison message went to the DMQ
    assert got[1].timestamp >= dead.get_long_property("JMS_SUN_JMSBRIDGE_DMQ_TIMESTAMP")
    # the batch once, then the big one alone 4 more times: its neighbours only once
    assert link.counters.rolled_back == 3 + 4
    send(a, "src", ["later"])
    assert texts(drain(b, "dst", expect=1)) == ["later"]
    assert link.state is State.STARTED
    assert dict(link.counters.dmq_reasons) == {"BACKOUT_THRESHOLD_REACHED": 1}
    assert link.counters.transferred == 3
    assert drain(a, BUILTIN_DMQ) == [] and drain(a, "src") == []
    assert a.xa_recover() == [] and b.xa_recover() == []


class Refusing(MessageTransformer):
    """'bad...' cannot be transformed."""

    def transform(self, message, read_only, charset_name, source, target, properties):
        if message.text.startswith("bad"):
            raise ValueError(f"cannot transform {message.text}")
        return message


@pytest.mark.slow
def test_a_dead_message_of_a_rolled_back_batch_goes_to_the_dmq_once(pair, bridges, tmp_path):
    """A message that went to the DMQ in a batch that was rolled back afterwards comes
    back with the batch: it is consumed then, not copied to the DMQ a second time."""
    a, b = pair
    b.configure_destination(Queue("dst"), DestinationLimits(max_bytes_per_msg=20 * 1024))
    send(a, "src", ["good1", "bad", "big" + "x" * 30 * 1024, "good2"])
    attrs = f'message-transformer-class="{__name__}.Refusing" consume-no-transfer-on-transform-error="true"'
    br = make(
        a,
        b,
        bridge_xml(cross_link(target_attrs=attrs), cfs=FAR),
        props_for(tmp_path, "imq.bridge.b.transaction.batchSize=4"),
    )
    bridges.append(br)
    br.start()
    assert texts(drain(b, "dst", expect=2)) == ["good1", "good2"]
    dead = drain(a, BUILTIN_DMQ, expect=2)
    assert [(d.object.text[:3], d.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_REASON")) for d in dead] == [
        ("bad", "TRANSFORM_FAILURE"),
        ("big", "BACKOUT_THRESHOLD_REACHED"),
    ]
    assert dict(br.links[0].counters.dmq_reasons) == {"TRANSFORM_FAILURE": 1, "BACKOUT_THRESHOLD_REACHED": 1}
    assert drain(a, BUILTIN_DMQ) == [] and drain(a, "src") == []


@pytest.mark.slow
@pytest.mark.parametrize("call", ["xa_end", "xa_prepare"])
def test_a_target_lost_before_the_commit_decision_leaves_nothing_in_the_dmq(pair, bridges, tmp_path, monkeypatch, call):
    """The target unreachable while ending or preparing: the transaction is rolled back
    everywhere, the link reconnects and moves the batch again; no COMMIT_FAILURE copies."""
    a, b = pair
    send(a, "src", [f"m{i}" for i in range(10)])
    real, failed = getattr(b, call), []

    def lost_once(*args, **kwargs):
        if not failed:
            failed.append(args)
            raise XAException(f"{call}: connection lost", xa.XAER_RMFAIL)
        return real(*args, **kwargs)

    monkeypatch.setattr(b, call, lost_once)
    br = make(a, b, bridge_xml(cross_link(), cfs=FAR), props_for(tmp_path, "imq.bridge.b.transaction.batchSize=5"))
    bridges.append(br)
    br.start()
    assert texts(drain(b, "dst", expect=10)) == [f"m{i}" for i in range(10)]
    link = br.links[0]
    assert drain(a, BUILTIN_DMQ) == [] and not link.counters.dmq_reasons
    assert failed and link.counters.reconnects == 1 and link.counters.rolled_back == 5


# --- batches, settings, pooled targets, stopping -----------------------------------------------------


def test_batches_move_in_order_once(pair, bridges, tmp_path):
    a, b = pair
    send(a, "src", [f"m{i}" for i in range(23)])
    br = make(a, b, bridge_xml(cross_link(), cfs=FAR), props_for(tmp_path, "imq.bridge.b.transaction.batchSize=5"))
    bridges.append(br)
    br.start()
    assert texts(drain(b, "dst", expect=23)) == [f"m{i}" for i in range(23)]
    wait_until(lambda: br.links[0].counters.transferred == 23, what="counters")
    assert br._xa is not None and br._xa.coordinator.counts["logged"] <= 6  # 5 per transaction


@pytest.mark.parametrize("tm", ["txlogSync=false", "txlogMmap=true, txlogSize=64k"])
def test_tm_props_reach_the_log(pair, bridges, tmp_path, tm):
    a, b = pair
    send(a, "src", [f"m{i}" for i in range(50)])
    props = props_for(tmp_path, f"imq.bridge.b.tm.props={tm}")
    br = make(a, b, bridge_xml(cross_link(), cfs=FAR), props)
    bridges.append(br)
    br.start()
    assert len(drain(b, "dst", expect=50)) == 50
    log = br._xa.coordinator.txlog
    path = txlog_path(props.bridge_dir("b"), "b")
    assert log.path == path
    if "Mmap" in tm:
        assert path.stat().st_size == 64 * 1024 and log.settings.mmap
    else:
        assert log.settings.sync is False


@pytest.mark.slow
def test_a_pooled_target_goes_back_while_idle_and_returns(pair, bridges):
    a, b = pair
    xml = bridge_xml(cross_link(target_attrs='stay-connected="false"'), cfs=FAR)
    br = make(a, b, xml)
    bridges.append(br)
    br.start()
    for round_ in range(3):
        send(a, "src", [f"r{round_}"])
        assert texts(drain(b, "dst", expect=1)) == [f"r{round_}"]
        wait_until(lambda: br._connections.pooled_idle("far") == 1, what="pooled")
    assert a.xa_recover() == [] and b.xa_recover() == []


@pytest.mark.slow
def test_stopping_in_the_middle_loses_and_doubles_nothing(pair, tmp_path):
    a, b = pair
    send(a, "src", [str(i) for i in range(3000)])
    br = make(a, b, bridge_xml(cross_link(), cfs=FAR), props_for(tmp_path))
    br.start()
    wait_until(lambda: b.queue_depth("dst") > 100, what="some transferred")
    br.stop()
    assert a.xa_recover() == [] and b.xa_recover() == []
    moved, left = texts(drain(b, "dst")), texts(drain(a, "src"))
    assert moved + left == [str(i) for i in range(3000)]
    log = FileTxLog(txlog_path(props_for(tmp_path).bridge_dir("b"), "b"))
    assert log.open() == {}


FULL_DISK_CHILD = textwrap.dedent("""
    import json, resource, signal, sys, time
    sys.path.insert(0, sys.argv[2])
    from bridgemgr.jms import Queue
    from bridgemgr.jmsbridge.states import State
    from bridgemgr.providers.embedded import Broker
    from test_xa_bridge import FAR, cross_link, make, props_for
    from jmsbridge_support import bridge_xml, send
    from pathlib import Path
    a, b = Broker(None), Broker(None)  # in memory: only the bridge's own files are written
    send(a, "src", [str(i) for i in range(5000)])
    br = make(a, b, bridge_xml(cross_link(), cfs=FAR, log_message_transfer="false"),
              props_for(Path(sys.argv[1]), "imq.bridge.b.tm.props=txlogSize=-1"))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the kernel answers EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (6000, 6000))
    br.start()
    link = br.links[0]
    deadline = time.monotonic() + 20
    while link.state is not State.STOPPED and time.monotonic() < deadline:
        time.sleep(0.02)
    state, error = link.state.value, link.counters.last_error
    br.stop()
    excused = props_for(Path(sys.argv[1])).bridge_dir("b") / "excused.l"
    print(json.dumps({"state": state, "error": error, "src": a.queue_depth("src"),
                      "dst": b.queue_depth("dst"), "doubt": len(a.xa_recover() + b.xa_recover()),
                      "dmq": a.queue_depth("imq.bridge.jms.dmq"),
                      "excused": json.loads(excused.read_text()) if excused.exists() else {}}))
""")


@pytest.mark.slow
def test_a_full_disk_under_the_log_stops_the_link_and_loses_nothing(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", FULL_DISK_CHILD, str(tmp_path), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["state"] == "STOPPED"
    assert "TxLogFull" in result["error"] and "cannot write the transaction log" in result["error"]
    assert 0 < result["dst"] < 5000 and result["src"] + result["dst"] == 5000
    assert result["doubt"] == 0 and result["dmq"] == 0
    # the unit the log could not commit is no fault of its messages: excused, on disk, so
    # that the link started again (the disk freed) does not count its rollback
    assert len(result["excused"]) >= 1


@pytest.mark.slow
def test_a_commit_failing_behind_the_link_goes_to_the_dmq_and_the_rest_stays_in_order(pair, bridges, monkeypatch):
    """Between in-process brokers the commit phase runs behind the link (xa/completer.py):
    a commit that fails there still reaches the DMQ as COMMIT_FAILURE (the chapter), and
    the messages after it, rolled back behind it, arrive in order."""
    a, b = pair
    send(a, "src", [f"m{i}" for i in range(10)])
    commit, seen = b.xa_commit, []

    def heuristic_third(xid, one_phase, *args, **kwargs):
        seen.append(threading.current_thread().name)
        if len(seen) == 3 and not one_phase:  # the target's RM rolls it back on its own
            b.xa_rollback(xid)
            raise XAException("simulated heuristic rollback", xa.XA_HEURRB)
        return commit(xid, one_phase, *args, **kwargs)

    monkeypatch.setattr(b, "xa_commit", heuristic_third)
    br = make(a, b, bridge_xml(cross_link(), cfs=FAR))
    bridges.append(br)
    br.start()
    wait_until(lambda: b.queue_depth("dst") >= 9 and a.queue_depth("src") == 0, what="transfer")
    br.stop()
    assert texts(drain(b, "dst")) == [f"m{i}" for i in range(10) if i != 2]
    dead = drain(a, BUILTIN_DMQ)
    assert [(d.object.text, d.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_REASON")) for d in dead] == [
        ("m2", "COMMIT_FAILURE")
    ]
    assert br.links[0].counters.transferred == 9
    assert a.xa_recover() == [] and b.xa_recover() == []
    assert all(name.startswith("xa completer") for name in seen)  # behind the link
