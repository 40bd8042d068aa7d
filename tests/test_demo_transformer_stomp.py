"""The demo's JMS bridge (bridgemgr.demo.DEMO_XML: demo.in -> demo.out through the
uppercase transformer) in a real `serve`, fed by stomp.py through the STOMP bridge: a SEND
with content-length and content-type text/plain (a BytesMessage in JMS) comes out of
demo.out upper-cased with its content type; one without a content type is bytes and comes
out as it went in."""

from __future__ import annotations

import queue
import threading

import pytest
import stomp

from bridgemgr.demo import DEMO_XML
from service_support import Daemon, one_bridge_files, stomp_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
PASSWORD = "Demo-Secret-1"


class Collect(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.frames: queue.Queue = queue.Queue()
        self.subscribed = threading.Event()

    def on_message(self, frame) -> None:
        self.frames.put(frame)

    def on_receipt(self, frame) -> None:
        self.subscribed.set()


def test_stomp_py_text_plain_bytes_are_upper_cased_by_the_demo(tmp_path):
    xml = DEMO_XML.replace('<jmsbridge name="demo">', '<jmsbridge name="jb">')
    props, _ = one_bridge_files(
        tmp_path, "demostomp", xml, PASSWORD, "imq.bridge.stomp.tcp.port=0", activelist="stomp,jb"
    )
    daemon = Daemon(props)
    try:
        assert daemon.bridges == {"stomp": "STARTED", "jb": "STARTED"}, daemon.lines
        conn = stomp.Connection12([("127.0.0.1", stomp_port(daemon))])
        listener = Collect()
        conn.set_listener("collect", listener)
        conn.connect("admin", PASSWORD, wait=True)
        try:
            conn.subscribe("/queue/demo.out", id="1", ack="auto", receipt="subscribed")
            assert listener.subscribed.wait(10)
            conn.send("/queue/demo.in", "order 1: café", content_type="text/plain")  # content-length too
            conn.send("/queue/demo.in", "order 2: no type")
            first, second = listener.frames.get(timeout=30), listener.frames.get(timeout=30)
        finally:
            conn.disconnect()
    finally:
        daemon.stop()
    assert first.body == "ORDER 1: CAFÉ" and first.headers["content-type"] == "text/plain"
    assert second.body == "order 2: no type" and "content-type" not in second.headers
