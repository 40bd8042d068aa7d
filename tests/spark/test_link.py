"""runner=spark links: the source log, the slicing, and a link run by the bridge on the
session's Spark (transfer with the source id stamped, DMQ reasons, pause/resume, progress;
a transacted link stays local)."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pytest

from bridgemgr.jmsbridge.bridge import JMSBridge
from bridgemgr.jmsbridge.dmq import DMQ_REASON, verify_marker
from bridgemgr.jmsbridge.link import Link
from bridgemgr.jmsbridge.states import State
from bridgemgr.props import load_properties
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory
from bridgemgr.servicekeys import SERVICE_ACCOUNT, dmq_key, service_password
from bridgemgr.spark.log import SourceLog, SourceLogError
from bridgemgr.spark.options import SOURCE_ID_PROPERTY, LinkOptions
from bridgemgr.spark.runner import link_options, parallelism
from bridgemgr.spark.source import LinkStreamReader, LogSlice, slices
from bridgemgr.spark.transfer import offset_runs

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS / "remote")]
from support import Harness  # noqa: E402

from jmsbridge_support import BUILTIN_DMQ, FAST, bridge_xml, drain, link_xml, send, wait_until  # noqa: E402


# --- the source log ---------------------------------------------------------------------------
def test_log_appends_reads_slices_across_segments_and_deletes_committed(tmp_path):
    log = SourceLog(tmp_path / "sourcelog").open()
    assert log.bounds() is None
    end = log.append(0, [(f"ID:{i}", bytes([i])) for i in range(5)], "P1")
    end = log.append(end, [(f"ID:{i}", bytes([i])) for i in range(5, 8)], "P2")
    assert (end, log.bounds()) == (8, (0, 8))
    got = [(r.offset, r.message_id, r.blob, p) for r, p in log.read(3, 7)]
    assert got == [
        (3, "ID:3", b"\x03", "P1"),
        (4, "ID:4", b"\x04", "P1"),
        (5, "ID:5", b"\x05", "P2"),
        (6, "ID:6", b"\x06", "P2"),
    ]
    assert log.delete_through(6) == 1  # the first segment (0..4) only
    assert log.bounds() == (5, 8)
    with pytest.raises(SourceLogError, match=r"records 0 .. 1 are not there"):
        list(log.read(0, 2))


def test_log_drops_a_crashed_write_and_names_a_damaged_segment(tmp_path):
    folder = tmp_path / "sourcelog"
    log = SourceLog(folder).open()
    log.append(0, [("ID:a", b"x" * 10)], "P")
    (folder / ".tmp-00000000000000000001").write_bytes(b"half a segment")
    assert SourceLog(folder).open().bounds() == (0, 1)
    assert not list(folder.glob(".tmp-*"))
    seg = next(folder.glob("*.seg"))
    seg.write_bytes(seg.read_bytes()[:-3])
    with pytest.raises(SourceLogError, match=f"{seg.name} is damaged"):
        list(log.read(0, 1))


@pytest.mark.parametrize(
    "lo,hi,parts,expect",
    [
        (0, 0, 2, []),
        (0, 1, 2, [(0, 1)]),
        (10, 20, 2, [(10, 15), (15, 20)]),
        (0, 7, 3, [(0, 2), (2, 4), (4, 7)]),
        (5, 7, 8, [(5, 6), (6, 7)]),
    ],
)
def test_slices_cover_the_range_once(lo, hi, parts, expect):
    assert [(s.lo, s.hi) for s in slices(lo, hi, parts)] == expect


def test_a_slice_is_read_as_its_offsets_and_the_sink_reads_them_back_as_runs(tmp_path):
    """Rows carry only log offsets (the message bytes stay out of the JVM): read() yields
    exactly the slice's offsets, without importing pandas in the worker; the sink's task
    turns its rows back into runs of the log to read."""
    import subprocess

    options = link_options(tmp_path, xmlurl="/x.xml", bridge="b", link="l", broker_url="mq://h:1")
    batches = list(LinkStreamReader(options).read(LogSlice(5, 20_000)))
    offsets = [o for b in batches for o in b.column("offset").to_pylist()]
    assert offsets == list(range(5, 20_000)) and batches[0].schema.names == ["offset"]
    assert offset_runs(iter(batches)) == [(5, 20_000)]
    gapped = [pa.record_batch([pa.array(v, pa.int64())], names=["offset"]) for v in ([1, 2, 3], [4, 9], [10, 11], [])]
    assert offset_runs(iter(gapped)) == [(1, 5), (9, 12)]
    code = (
        "import sys; from bridgemgr.spark.source import LinkStreamReader, LogSlice; "
        "from bridgemgr.spark.options import LinkOptions; "
        "o = LinkOptions(xmlurl='x', bridge='b', link='l', broker_url='mq://h:1', "
        "source_log='s', stats='t'); list(LinkStreamReader(o).read(LogSlice(0, 10))); "
        "print('pandas' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_options_travel_as_strings_and_parallelism_follows_the_master(tmp_path):
    options = link_options(
        tmp_path,
        xmlurl="/x.xml",
        bridge="b",
        link="l",
        broker_url="mq://h:1",
        max_per_batch=7,
        receive_wait=0.25,
        broker_password="secret",
    )
    strings = options.to_options()
    assert all(isinstance(v, str) for v in strings.values())
    assert LinkOptions.from_options({k.lower(): v for k, v in strings.items()}) == options
    assert options.source_log == str(tmp_path / "sourcelog")
    with pytest.raises(ValueError, match="needs the option xmlurl"):
        LinkOptions.from_options({"bridge": "b"})
    assert [parallelism(m, {}) for m in ("local[3]", "local[2,4]", "local", "yarn")] == [3, 2, 1, 2]
    assert parallelism("local[1]", {"spark.default.parallelism": "6"}) == 6


# --- a bridge with runner=spark ---------------------------------------------------------------
FAILING = "transformers_for_tests.FailOnBad"


@pytest.fixture
def service(tmp_path, spark):
    """A broker with its jms service (recording who logs in), broker properties with
    runner=spark, the bridge XML."""
    broker = Broker(tmp_path / "store")
    logins: list[tuple[str | None, str | None]] = []
    harness = Harness(broker, authenticator=lambda user, password: logins.append((user, password)) or True)
    harness.logins = logins
    (tmp_path / "tx").mkdir()
    (tmp_path / "tx" / "transformers_for_tests.py").write_text(
        "from bridgemgr.transform import MessageTransformer\n"
        "class FailOnBad(MessageTransformer):\n"
        "    def transform(self, message, *args):\n"
        "        if message.text.startswith('bad'):\n"
        "            raise ValueError('bad message')\n"
        "        return message\n"
    )
    yield broker, harness, tmp_path
    harness.close()
    broker.close()


def make_spark_bridge(broker, harness, tmp_path, links: str, dests: str = "") -> JMSBridge:
    xml = tmp_path / "b.xml"
    xml.write_bytes(bridge_xml(links, dests=dests))
    props_file = tmp_path / "broker.properties"
    props_file.write_text(
        f"imq.varhome={tmp_path / 'var'}\nimq.bridge.b.type=jms\n"
        f"imq.bridge.b.xmlurl={xml}\nimq.bridge.b.runner=spark\n"
        "imq.bridge.spark.master=local[2]\n"
    )
    props = load_properties([props_file], environ={})
    return JMSBridge.from_properties(
        props,
        "b",
        host_factory=lambda env: EmbeddedConnectionFactory(broker),
        tuning=FAST,
        broker_url=harness.url,
        transformer_path=[tmp_path / "tx"],
    )


def test_spark_link_transfers_stamps_dead_letters_halts_pauses_and_resumes(service):
    broker, harness, tmp_path = service
    links = (
        link_xml(
            "l", target_attrs=f'message-transformer-class="{FAILING}" consume-no-transfer-on-transform-error="true"'
        )
        + link_xml("tx", src="other", dst="other", transacted="true")
        + link_xml(
            "halts",
            src="hsrc",
            dst="hdst",
            target_attrs=f'message-transformer-class="{FAILING}" consume-no-transfer-on-transform-error="false"',
        )
    )
    bridge = make_spark_bridge(
        broker,
        harness,
        tmp_path,
        links,
        dests="".join(f'<destination ref-name="{d}" name="{d}"/>' for d in ("hsrc", "hdst")),
    )
    sent = send(broker, "src", [f"m{i}" for i in range(40)] + ["bad1"])
    send(broker, "hsrc", ["bad, and the link must not consume it"])
    try:
        bridge.start()
        assert isinstance(bridge.link("tx"), Link)  # transacted: stays on the local runner
        spark_link = bridge.link("l")
        assert not isinstance(spark_link, Link) and spark_link.runner == "spark"
        got = drain(broker, "dst", expect=40, total=120)
        assert sorted(m.text for m in got) == sorted(f"m{i}" for i in range(40))
        ids = {m.text: m.message_id for m in sent}
        assert all(m.get_string_property(SOURCE_ID_PROPERTY) == ids[m.text] for m in got)
        dead = drain(broker, BUILTIN_DMQ, expect=1, total=60)
        assert [m.get_string_property(DMQ_REASON) for m in dead] == ["TRANSFORM_FAILURE"]
        assert verify_marker(dead[0], dmq_key(bridge.props))  # the Spark side marks it too
        # every connection of the Spark link's processes logged in as the service account
        assert set(harness.logins) == {(SERVICE_ACCOUNT, service_password(bridge.props))}
        info = wait_until(
            lambda: (i := spark_link.info())["counters"]["transferred"] == 40 and i["counters"]["to_dmq"] == 1 and i,
            60,
            "the counters",
        )
        assert info["progress"]["batches"] >= 1
        assert info["progress"]["input_rows"] == 41

        halting = bridge.link("halts")  # a transformer failure that must stop the link
        wait_until(lambda: halting.state is State.STOPPED, 120, "the halting link to stop")
        assert "LinkHalted" in halting.info()["counters"]["last_error"]
        assert drain(broker, "hdst", total=0.5) == [] and halting.info()["counters"]["transferred"] == 0

        assert bridge.pause_link("l") is State.PAUSED
        send(broker, "src", ["while paused"])
        assert drain(broker, "dst", total=1) == []
        assert bridge.resume_link("l") is State.STARTED
        assert [m.text for m in drain(broker, "dst", expect=1, total=120)] == ["while paused"]
    finally:
        bridge.stop()
    assert spark_link.state is State.STOPPED
