"""SEND headers that are no JMS property names (x-request-id, anchor-seq: what common STOMP
clients and load tools send) through a real `imqbridgemgr serve`, with stomp.py.

They used to get an ERROR and a closed connection unless a transformer was configured.
With imq.bridge.stomp.invalidHeaderNames=encode (the default) the message carries them
under encoded, valid property names: a JMS consumer (mq://, a link) sees those, a STOMP
subscriber gets the headers back as sent, also after a link moved the message. drop
leaves them out; error is the chapter's rule (ERROR, connection closed).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import stomp

from bridgemgr.admin.portmapper import find_service
from service_support import Daemon, one_bridge_files, take
from stomp_support import stomp_conn, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

PASSWORD = "Hdr-Secret-1"
XML = """<?xml version="1.0" encoding="UTF-8"?>
<jmsbridge name="jb">
  <link name="l1" transacted="false">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host"/>
  <destination ref-name="src" name="hdr.src"/>
  <destination ref-name="dst" name="hdr.dst"/>
</jmsbridge>
"""
HEADERS = {"x-request-id": "req-42", "anchor-seq": "17", "color": "blue"}


def serve(base: Path, *extra: str) -> tuple[Daemon, int]:
    props, _ = one_bridge_files(
        base, "hdrnames", XML, PASSWORD, "imq.bridge.stomp.tcp.port=0", *extra, activelist="jb,stomp"
    )
    daemon = Daemon(props)
    assert daemon.bridges == {"jb": "STARTED", "stomp": "STARTED"}, daemon.lines
    host, port = daemon.address.split(":")
    return daemon, find_service(host, int(port), ("stomp",)).port


def connect(port: int) -> tuple[stomp.Connection12, object]:
    conn, listener = stomp_conn("1.2", port)
    conn.connect("admin", PASSWORD, wait=True)
    return conn, listener


def test_encode_by_default_jms_sees_valid_names_stomp_gets_the_headers_back(tmp_path):
    daemon, port = serve(tmp_path)
    try:
        producer, sent = connect(port)
        consumer, received = connect(port)
        consumer.subscribe("/queue/hdr.dst", id="1", ack="auto")
        producer.send("/queue/hdr.src", "through the link", headers=HEADERS, receipt="r1")
        producer.send("/queue/hdr.direct", "direct", headers=HEADERS, receipt="r2")
        assert wait_until(lambda: sent.receipts == ["r1", "r2"]), (sent.receipts, sent.errors)
        got = received.wait_messages(1)[0].headers  # moved by link l1 (JMS on both sides)
        assert {k: got[k] for k in HEADERS} == HEADERS
        assert not any(k.startswith("stomp$") for k in got)
        assert producer.is_connected() and not sent.errors
        producer.disconnect()
        consumer.disconnect()

        [msg] = take(daemon, PASSWORD, "hdr.direct", expect=1, quiet=0.3)  # mq://, a JMS consumer
        assert msg.get_string_property("stomp$x$2Drequest$2Did") == "req-42"
        assert msg.get_string_property("stomp$anchor$2Dseq") == "17"
        assert msg.get_string_property("color") == "blue"
    finally:
        daemon.stop()


@pytest.mark.parametrize("mode", ["drop", "error"])
def test_drop_and_error(tmp_path, mode):
    daemon, port = serve(tmp_path, f"imq.bridge.stomp.invalidHeaderNames={mode}")
    try:
        producer, sent = connect(port)
        producer.send("/queue/hdr.direct", "x", headers=HEADERS, receipt="r1")
        if mode == "drop":
            assert wait_until(lambda: sent.receipts == ["r1"]), sent.errors
            assert producer.is_connected()
            producer.disconnect()
            [msg] = take(daemon, PASSWORD, "hdr.direct", expect=1, quiet=0.3)
            assert msg.property_names == ["color"]
        else:
            error = sent.wait_error()
            assert error.headers["message"] == "invalid header name", error.headers
            assert "cannot become a JMS property" in error.body
            assert wait_until(lambda: not producer.is_connected())
            assert take(daemon, PASSWORD, "hdr.direct", quiet=0.3) == []
    finally:
        daemon.stop()


def test_the_property_is_checked(tmp_path):
    props, _ = one_bridge_files(
        tmp_path,
        "hdrbad",
        XML,
        PASSWORD,
        "imq.bridge.stomp.tcp.port=0",
        "imq.bridge.stomp.invalidHeaderNames=mangle",
        activelist="jb,stomp",
    )
    with pytest.raises(AssertionError) as failed:
        Daemon(props).stop()
    assert "invalidHeaderNames" in str(failed.value) and "encode" in str(failed.value)
