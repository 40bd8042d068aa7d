"""A runner=spark link's rate (msg/s over the last minute, from its batches' commit
times), last transfer time and source backlog (the host broker queue's depth), as
its info() gives them to /metrics and `list link -v`."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from bridgemgr.jmsbridge.bridge import JMSBridge
from bridgemgr.jmsbridge.states import State
from bridgemgr.props import load_properties
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory
from bridgemgr.providers.embedded.host import EmbeddedHostBroker
from bridgemgr.spark import runner as _registers_runner_spark  # noqa: F401

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS / "remote")]
from support import Harness  # noqa: E402

from jmsbridge_support import FAST, bridge_xml, drain, link_xml, send, wait_until  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_a_spark_links_rate_last_transfer_and_backlog(tmp_path, spark):
    broker = Broker(tmp_path / "store")
    harness = Harness(broker, authenticator=lambda user, password: True)
    xml = tmp_path / "b.xml"
    xml.write_bytes(bridge_xml(link_xml("l")))
    props_file = tmp_path / "broker.properties"
    props_file.write_text(
        f"imq.varhome={tmp_path / 'var'}\nimq.bridge.b.type=jms\n"
        f"imq.bridge.b.xmlurl={xml}\nimq.bridge.b.runner=spark\n"
        "imq.bridge.spark.master=local[2]\n"
    )
    bridge = JMSBridge.from_properties(
        load_properties([props_file], environ={}),
        "b",
        host_factory=lambda env: EmbeddedConnectionFactory(broker),
        host=EmbeddedHostBroker(broker),
        tuning=FAST,
        broker_url=harness.url,
    )
    send(broker, "src", [f"m{i}" for i in range(30)])
    try:
        bridge.start()
        link = bridge.link("l")
        assert link.runner == "spark"
        assert len(drain(broker, "dst", expect=30, total=120)) == 30
        info = wait_until(lambda: (i := link.info())["counters"]["transferred"] == 30 and i, 60, "counters")
        counters = info["counters"]
        assert counters["rate"] == pytest.approx(30 / 60)  # the last minute's batches
        assert abs(counters["last_transfer_at"] - time.time()) < 60
        assert info["backlog"] == 0
        assert bridge.pause_link("l") is State.PAUSED
        send(broker, "src", ["a", "b", "c"])
        assert link.info()["backlog"] == 3
    finally:
        bridge.stop()
        harness.close()
        broker.close()
