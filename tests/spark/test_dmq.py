"""The DMQ jobs against a real host broker reached over its jms connection service:
archive to Parquet (acknowledged only after the write), report from the DMQ and from an
archive, redrive of chosen dead messages (consumed only after their resend)."""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgemgr.jms import codec
from bridgemgr.jms.destination import Queue, Topic
from bridgemgr.jms.message import SELECTOR_RESERVED, DeliveryMode, ObjectMessage, TextMessage
from bridgemgr.jms.spi import CLIENT_ACKNOWLEDGE
from bridgemgr.jmsbridge.config import BUILTIN_DMQ_DESTINATION, parse_bridge_config
from bridgemgr.jmsbridge.dmq import DeadLetter, dmq_message
from bridgemgr.jmsbridge.pipeline import DMQReason
from bridgemgr.providers.embedded import Broker, DestinationLimits
from bridgemgr.spark import dmq as jobs
from bridgemgr.spark import dmqreport
from bridgemgr.spark.options import SOURCE_ID_PROPERTY
from bridgemgr.transform import MessageTransformer
from remote.support import Harness

XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="orders">
  <link name="to-shipping">
    <source connection-factory-ref="host" destination-ref="in"/>
    <target connection-factory-ref="host" destination-ref="ship"/>
  </link>
  <link name="to-billing">
    <source connection-factory-ref="host" destination-ref="in"/>
    <target connection-factory-ref="host" destination-ref="bill"/>
  </link>
  <dmq name="audit" connection-factory-ref="host" destination-ref="audit-q"/>
  <connection-factory ref-name="host"/>
  <destination ref-name="in" name="orders.in"/>
  <destination ref-name="ship" name="orders.ship"/>
  <destination ref-name="bill" name="orders.bill"/>
  <destination ref-name="audit-q" name="orders.audit"/>
</jmsbridge>
"""
DMQ = Queue(BUILTIN_DMQ_DESTINATION)
DAY1 = int(datetime(2026, 11, 20, 9, 30, tzinfo=UTC).timestamp() * 1000)
DAY2 = int(datetime(2026, 11, 21, 14, 5, tzinfo=UTC).timestamp() * 1000)
HOUR = 3_600_000
KEY = b"the instance's DMQ key, 32 bytes"  # what etc/dmq.key holds


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    broker = Broker(tmp_path_factory.mktemp("dmqbroker") / "store")
    # orders.bill refuses messages over 300 bytes: a target that refuses a send
    broker.configure_destination(Queue("orders.bill"), DestinationLimits(max_bytes_per_msg=300))
    harness = Harness(broker)
    yield harness
    harness.close()
    broker.close()


@pytest.fixture(scope="module")
def config():
    return parse_bridge_config(XML.encode())


@pytest.fixture
def endpoint(host, config):
    ep = jobs.dmq_endpoint(config, host_factory=lambda env: host.factory(), marker_key=KEY)
    yield ep
    drain(host, DMQ)
    for name in ("orders.ship", "orders.bill", "elsewhere"):
        drain(host, Queue(name))


def drain(host, queue) -> list:
    conn = host.factory().create_connection()
    conn.start()
    try:
        consumer = conn.create_session().create_consumer(queue)
        out = []
        while (m := consumer.receive_no_wait()) is not None:
            out.append(m)
        return out
    finally:
        conn.close()


def depth(host, queue=DMQ) -> int:
    """Messages in the queue, delivered or not."""
    found = host.broker.destinations().get(f"queue:{queue.name}")
    return found["pending"] + found["unacked"] if found else 0


def original(n: int, body_size: int = 10) -> TextMessage:
    """A message as a link received it: headers set, typed properties."""
    m = TextMessage(f"order {n} " + "x" * body_size)
    m.message_id = f"ID:orig-{n}"
    m.timestamp = 1_700_000_000_000 + n
    m.correlation_id = f"corr-{n}"
    m.type = "order"
    m.reply_to = Queue("orders.replies")
    m.priority = 7
    m.delivery_mode = DeliveryMode.NON_PERSISTENT
    m.set_byte_property("tiny", 5)
    m.set_float_property("ratio", 0.5)
    m.set_string_property("customer", f"c{n}")
    m.set_boolean_property("rush", n % 2 == 0)
    return m


def put_dead(
    host, n: int, reason: DMQReason, target: str, at_ms: int, *, body=None, queue=DMQ, key: bytes | None = KEY
) -> None:
    """What DMQSender sends: dmq_message() of a DeadLetter, the original as the body,
    marked with the instance's key (``key=None``: a forged one, without the marker)."""
    orig = original(n) if body is None else body
    letter = DeadLetter(
        orig,
        reason,
        "it broke" if reason is DMQReason.SEND_FAILURE else None,
        "orders",
        "?",
        "orders.in",
        target,
        None,
        "imqbridge embedded broker",
        "imqbridge embedded broker",
    )
    dead = dmq_message(letter, orig, at_ms, key)
    conn = host.factory().create_connection()
    try:
        conn.create_session().create_producer(queue).send(dead)
    finally:
        conn.close()


class NotSerialisable:
    pass


def fill(host) -> None:
    """Six dead messages: three SEND_FAILURE of to-shipping on day 1 (one hour apart),
    two MESSAGE_EXPIRED of to-billing on day 2, one TRANSFORM_FAILURE whose body is only
    text (the original's object could not be encoded)."""
    for i in range(3):
        put_dead(host, i, DMQReason.SEND_FAILURE, "orders.ship", DAY1 + i * HOUR)
    for i in range(3, 5):
        put_dead(host, i, DMQReason.MESSAGE_EXPIRED, "orders.bill", DAY2)
    unencodable = ObjectMessage(NotSerialisable())
    unencodable.message_id = "ID:orig-5"
    put_dead(host, 5, DMQReason.TRANSFORM_FAILURE, "orders.ship", DAY2, body=unencodable)


def test_archive_writes_then_acknowledges(spark, host, endpoint, tmp_path):
    fill(host)
    assert depth(host) == 6
    # A write that fails (the path is a file) acknowledges nothing.
    blocked = tmp_path / "blocked"
    blocked.write_text("not a directory")
    with pytest.raises(jobs.DMQJobError, match="stay in DMQ built-in-dmq"):
        jobs.archive(spark, endpoint, str(blocked), chunk_size=4, receive_timeout=0.5)
    assert depth(host) == 6

    path = str(tmp_path / "archive")
    result = jobs.archive(spark, endpoint, path, chunk_size=4, receive_timeout=0.5)
    assert (result.messages, result.chunks) == (6, 2)
    assert depth(host) == 0
    partitions = sorted(str(p.relative_to(path)) for p in Path(path).glob("day=*/reason=*"))
    assert partitions == [
        "day=2026-11-20/reason=SEND_FAILURE",
        "day=2026-11-21/reason=MESSAGE_EXPIRED",
        "day=2026-11-21/reason=TRANSFORM_FAILURE",
    ]

    df = jobs.read_archive(spark, path)
    rows = {r["JMS_SUN_JMSBRIDGE_SOURCE_MESSAGEID"]: r for r in df.collect()}
    assert len(rows) == 6
    first = rows["ID:orig-0"]
    assert (first["link"], first["bridge"], first["reason"], first["hour"]) == (
        "to-shipping",
        "orders",
        "SEND_FAILURE",
        "2026-11-20T09:00Z",
    )
    assert first["JMS_SUN_JMSBRIDGE_DMQ_EXCEPTION"] == "it broke"
    assert first["JMS_SUN_JMSBRIDGE_DMQ_TIMESTAMP"] == DAY1
    assert first["JMS_SUN_JMSBRIDGE_SOURCE_TIMESTAMP"] == 1_700_000_000_000
    assert codec.decode(bytes(first["message"])) == original(0)
    assert first["size"] == len(first["message"])
    assert rows["ID:orig-3"]["link"] == "to-billing"
    truncated = rows["ID:orig-5"]
    assert truncated["message"] is None and truncated["JMS_SUN_JMSBRIDGE_DMQ_BODY_TRUNCATED"]
    assert "NotSerialisable" in truncated["truncated_body"]


def test_a_crash_between_write_and_acknowledge_leaves_duplicates_not_losses(spark, host, endpoint, tmp_path):
    fill(host)
    path = str(tmp_path / "archive")
    # What a driver that dies after the write and before the acknowledge leaves behind:
    # the chunk in Parquet, its connection gone without acknowledging.
    conn = endpoint.connect()
    consumer = conn.create_session(ack_mode=CLIENT_ACKNOWLEDGE).create_consumer(DMQ)
    chunk = [consumer.receive(2) for _ in range(4)]
    jobs.write_rows(spark, [jobs.dead_row(m, endpoint) for m in chunk], path)
    conn.close()
    assert depth(host) == 6
    assert jobs.archive(spark, endpoint, path, receive_timeout=0.5).messages == 6
    assert depth(host) == 0
    assert spark.read.parquet(path).count() == 10
    archived = jobs.read_archive(spark, path)
    assert archived.count() == 6
    assert sorted(r[0] for r in archived.select("JMS_SUN_JMSBRIDGE_SOURCE_MESSAGEID").collect()) == [
        f"ID:orig-{i}" for i in range(6)
    ]


def expected_report() -> list[tuple]:
    return [
        ("2026-11-20T09:00Z", "SEND_FAILURE", "to-shipping", "orders.in", "orders.ship", 1),
        ("2026-11-20T10:00Z", "SEND_FAILURE", "to-shipping", "orders.in", "orders.ship", 1),
        ("2026-11-20T11:00Z", "SEND_FAILURE", "to-shipping", "orders.in", "orders.ship", 1),
        ("2026-11-21T14:00Z", "MESSAGE_EXPIRED", "to-billing", "orders.in", "orders.bill", 2),
        ("2026-11-21T14:00Z", "TRANSFORM_FAILURE", "to-shipping", "orders.in", "orders.ship", 1),
    ]


def test_report_from_the_dmq_consumes_nothing_and_matches_the_archive(spark, host, endpoint, tmp_path):
    fill(host)
    live = jobs.report(jobs.browse_frame(spark, endpoint))
    assert depth(host) == 6
    assert [(r.hour, r.reason, r.link, r.source, r.target, r.messages) for r in live] == expected_report()
    sizes = {r.reason: r.bytes for r in live}
    assert sizes["MESSAGE_EXPIRED"] == 2 * len(codec.encode(original(3)))

    path = str(tmp_path / "archive")
    jobs.archive(spark, endpoint, path, receive_timeout=0.5)
    archived = jobs.report(jobs.read_archive(spark, path))
    assert archived == live

    text = dmqreport.table(live)
    assert text.splitlines()[0].split() == list(dmqreport.HEADINGS)
    assert text.splitlines()[-1].split()[:2] == ["total", "6"]
    assert dmqreport.to_csv(live).splitlines()[1].startswith("2026-11-20T09:00Z,SEND_FAILURE,to-shipping")
    assert json.loads(dmqreport.to_json(live, path))["total"]["messages"] == 6
    page = dmqreport.to_html(live, path)
    assert page.count("<svg") == 2 and "MESSAGE_EXPIRED" in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert {r.verified for r in live} == {True}


def test_a_forged_dead_message_is_flagged_by_the_report_and_skipped_by_redrive(spark, host, endpoint):
    put_dead(host, 0, DMQReason.SEND_FAILURE, "orders.ship", DAY1)
    put_dead(host, 1, DMQReason.SEND_FAILURE, "orders.ship", DAY1, key=None)  # a user's, unmarked
    put_dead(host, 2, DMQReason.SEND_FAILURE, "orders.ship", DAY1, key=b"x" * 32)  # another key
    rows = jobs.report(jobs.browse_frame(spark, endpoint))
    assert sorted((r.verified, r.messages) for r in rows) == [(False, 2), (True, 1)]
    assert ",False," in dmqreport.to_csv(rows)
    factories = jobs.target_factories(None, lambda env: host.factory())
    done = jobs.redrive(endpoint, "SEND_FAILURE", DAY1, factories=factories)
    assert {i.source_message_id: i.status for i in done.items} == {
        "ID:orig-0": "sent",
        "ID:orig-1": "unverified",
        "ID:orig-2": "unverified",
    }
    assert done.as_dict()["unverified"] == 2 and "marker" in done.items[1].detail
    assert [m.text for m in drain(host, Queue("orders.ship"))] == [original(0).text]
    assert depth(host) == 2  # the forged ones are left in the DMQ


def test_an_unreadable_archive_is_named(spark, tmp_path):
    with pytest.raises(jobs.DMQJobError, match=f"the DMQ archive {tmp_path / 'none'} cannot be read"):
        jobs.read_archive(spark, str(tmp_path / "none"))
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "part-0.parquet").write_text("not Parquet")
    with pytest.raises(jobs.DMQJobError, match=f"the DMQ archive {junk} cannot be read"):
        jobs.read_archive(spark, str(junk))


class Stamp(MessageTransformer):
    def transform(self, message, read_only, charset_name, source, target, properties):
        message.set_string_property("redriven", "yes")
        return message


def test_redrive_restores_originals_and_consumes_only_what_was_resent(host, endpoint):
    fill(host)
    # to-billing's target refuses messages over 300 bytes: this one stays in the DMQ
    put_dead(host, 6, DMQReason.MESSAGE_EXPIRED, "orders.bill", DAY2, body=original(6, 400))
    put_dead(host, 7, DMQReason.SEND_FAILURE, "orders.nowhere", DAY1)  # no link goes there
    factories = jobs.target_factories(None, lambda env: host.factory())

    dry = jobs.redrive(endpoint, "MESSAGE_EXPIRED", DAY2, dry_run=True, factories=factories)
    assert [(i.source_message_id, i.status, i.destination) for i in dry.items] == [
        ("ID:orig-3", "would-send", "queue:orders.bill"),
        ("ID:orig-4", "would-send", "queue:orders.bill"),
        ("ID:orig-6", "would-send", "queue:orders.bill"),
    ]
    assert depth(host) == 8

    done = jobs.redrive(endpoint, "MESSAGE_EXPIRED", DAY2, DAY2 + 1, factories=factories)
    assert {i.source_message_id: i.status for i in done.items} == {
        "ID:orig-3": "sent",
        "ID:orig-4": "sent",
        "ID:orig-6": "failed",
    }
    assert depth(host) == 6
    got = drain(host, Queue("orders.bill"))
    assert len(got) == 2
    for m in got:
        want = original(int(m.correlation_id.split("-")[1]))
        assert m.text == want.text and m.get_property_type("tiny") == want.get_property_type("tiny")
        # (and the id it had at the source, as a Spark link's messages carry it)
        assert dict(m.properties) == {**dict(want.properties), SOURCE_ID_PROPERTY: want.message_id}
        assert (m.correlation_id, m.type, m.reply_to, m.priority, m.delivery_mode) == (
            want.correlation_id,
            want.type,
            want.reply_to,
            want.priority,
            want.delivery_mode,
        )

    # a time range picks the second hour of day 1 only; --to and a transformer
    picked = jobs.redrive(
        endpoint,
        "SEND_FAILURE",
        DAY1 + HOUR,
        DAY1 + 2 * HOUR,
        to=Queue("elsewhere"),
        transformer=Stamp(),
        factories=factories,
    )
    assert [(i.source_message_id, i.status) for i in picked.items] == [("ID:orig-1", "sent")]
    [m] = drain(host, Queue("elsewhere"))
    assert (m.text, m.get_string_property("redriven")) == (original(1).text, "yes")
    assert m.get_string_property(SOURCE_ID_PROPERTY) == "ID:orig-1"  # stamped after the transformer

    rest = jobs.redrive(endpoint, "SEND_FAILURE", DAY1, factories=factories)
    assert {i.source_message_id: i.status for i in rest.items} == {
        "ID:orig-0": "sent",
        "ID:orig-2": "sent",
        "ID:orig-7": "skipped",
    }
    assert "give --to" in rest.items[-1].detail
    truncated = jobs.redrive(endpoint, "TRANSFORM_FAILURE", DAY1, factories=factories)
    assert [i.status for i in truncated.items] == ["skipped"]
    assert depth(host) == 3  # orig-5 (text only), orig-6 (refused), orig-7 (no link)


def test_a_named_dmq_and_bad_requests(host, config, endpoint):
    with pytest.raises(
        jobs.DMQJobError,
        match=r"bridge orders has no DMQ named 'nope' \(its DMQs: "
        r"built-in-dmq, audit",
    ):
        jobs.dmq_endpoint(config, "nope", host_factory=lambda env: host.factory())
    named = jobs.dmq_endpoint(config, "audit", host_factory=lambda env: host.factory(), marker_key=KEY)
    assert named.queue == Queue("orders.audit")
    put_dead(host, 8, DMQReason.SEND_FAILURE, "orders.ship", DAY1, queue=named.queue)
    assert [i.link for i in jobs.redrive(named, "SEND_FAILURE", DAY1, dry_run=True).items] == ["to-shipping"]
    assert jobs.redrive(endpoint, "SEND_FAILURE", DAY1, dry_run=True).items == []
    assert len(drain(host, named.queue)) == 1
    with pytest.raises(jobs.DMQJobError, match="'LATE' is not a DMQ reason"):
        jobs.redrive(named, "LATE", 0)
    with pytest.raises(jobs.DMQJobError, match="write NAME, queue:NAME or topic:NAME"):
        jobs.parse_destination("bucket:x")
    assert jobs.parse_destination("topic:t") == Topic("t")


NOW = 1_800_000_000.0


@given(st.integers(0, 10_000), st.sampled_from(["s", "m", "h", "d", "w"]))
def test_relative_times_are_times_ago(n, unit):
    seconds = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[unit]
    assert jobs.parse_time(f"{n}{unit}", NOW) == int((NOW - n * seconds) * 1000)


def test_iso_times():
    assert jobs.parse_time("2026-11-20T09:30:00Z") == DAY1
    assert jobs.parse_time("2026-11-20T10:30+01:00") == DAY1
    assert jobs.parse_time("now", NOW) == NOW * 1000
    with pytest.raises(jobs.DMQJobError, match="is not a time"):
        jobs.parse_time("yesterday-ish")


def test_the_html_page_charts_days_once_hours_are_too_many():
    rows = [
        jobs.ReportRow(f"2026-11-{20 + h // 24:02d}T{h % 24:02d}:00Z", "SEND_FAILURE", "l", "a", "b", 1, 10)
        for h in range(60)
    ]
    page = dmqreport.to_html(rows, "archive x")
    assert "Dead messages by day (UTC)" in page and page.count("<rect") == 1 + 3
    assert dmqreport.to_html(rows[:48], "archive x").count("<rect") == 1 + 48


@functools.cache
def _bridge_config():
    """Parsed once: the DTD validation would dominate every example."""
    return parse_bridge_config(XML.encode())


@settings(deadline=None)  # a JSON/codec round trip per example: slow on a loaded CI machine
@given(
    st.sampled_from(list(DMQReason)),
    st.integers(0, 4_102_444_800_000),
    st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True).filter(
            lambda name: name.upper() not in SELECTOR_RESERVED  # "or" is no property name
        ),
        st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=20), st.booleans()),
        max_size=5,
    ),
    st.text(max_size=50),
)
def test_a_dead_row_keeps_every_field_and_the_original(reason, at_ms, props, text):
    orig = TextMessage(text)
    orig.message_id, orig.timestamp = "ID:x", 5
    for name, value in props.items():
        orig.set_object_property(name, value)
    letter = DeadLetter(orig, reason, None, "orders", "?", "orders.in", "orders.bill", None, "p", "q")
    row = dict(
        zip(
            jobs.COLUMNS,
            jobs.dead_row(
                dmq_message(letter, orig, at_ms),
                jobs.DMQEndpoint("built-in-dmq", None, DMQ, jobs.LinkIndex(_bridge_config())),
            ),
        )
    )
    assert codec.decode(row["message"]) == orig and row["size"] == len(row["message"])
    assert (row["reason"], row["JMS_SUN_JMSBRIDGE_DMQ_REASON"]) == (reason.value, reason.value)
    assert row["JMS_SUN_JMSBRIDGE_DMQ_TIMESTAMP"] == at_ms
    when = datetime.fromtimestamp(at_ms / 1000, UTC)
    assert (row["day"], row["hour"][:13]) == (when.strftime("%Y-%m-%d"), when.strftime("%Y-%m-%dT%H"))
    assert (row["link"], row["bridge"], row["JMS_SUN_JMSBRIDGE_TARGET_PROVIDER"]) == ("to-billing", "orders", "q")
