"""End to end, two `imqbridgemgr serve` processes as in test_bridge_refusal_e2e.py: the
second one an external provider whose destinations refuse messages over 20 KiB, reached
over mq://; the first one's bridge moves messages there through a link with a confirm
window (imq.bridge.jb.link.window=8): up to 8 sends outstanding, acknowledged once
confirmed.

- Refusals in the middle of windows (PERSISTENT and NON_PERSISTENT): each refused
  message goes to the DMQ once (SEND_FAILURE, the target's exception), every other one
  reaches the target exactly once and in the order it was sent, the source ends empty.
"""

from __future__ import annotations

import re

import pytest

from bridgemgr.jms import DeliveryMode
from service_support import Daemon, take
from test_bridge_refusal_e2e import (
    BIG,
    BUILTIN_DMQ,
    PASSWORD,
    XML,
    link_counters,
    one_bridge_files,
    send,
    start_bridge,
    target,
    wait_handled,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

__all__ = ["target"]  # the fixture


def test_a_window_keeps_order_and_sends_the_rest_across_refusals(tmp_path, target):
    base = tmp_path / "bridge"
    base.mkdir()
    props, passfile = one_bridge_files(
        base,
        "bridging",
        XML.format(dmqs="", password=PASSWORD, target=target.address),
        PASSWORD,
        "imq.bridge.jb.link.window=8",
    )
    bridge = Daemon(props)
    items: list[str | tuple[str, DeliveryMode]] = [f"m{i}" for i in range(40)]
    items[5] = (BIG, DeliveryMode.PERSISTENT)  # in the first window
    items[12] = (BIG, DeliveryMode.NON_PERSISTENT)  # in the middle of the second
    items[13] = (BIG, DeliveryMode.PERSISTENT)  # right after it
    items[30] = ("m30", DeliveryMode.NON_PERSISTENT)
    try:
        ids = send(bridge, PASSWORD, "e2e.src", *items)
        start_bridge(bridge, passfile)
        wait_handled(bridge, passfile, 40)
        delivered = take(target, PASSWORD, "e2e.dst", expect=37)
        dead = take(bridge, PASSWORD, BUILTIN_DMQ, expect=3)
        assert [m.text for m in delivered] == [f"m{i}" for i in range(40) if i not in (5, 12, 13)]
        assert [m.get_string_property("JMS_SUN_JMSBRIDGE_SOURCE_MESSAGEID") for m in dead] == [ids[5], ids[12], ids[13]]
        for letter in dead:
            assert letter.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_REASON") == "SEND_FAILURE"
            exception = letter.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_EXCEPTION")
            assert re.search(r"ResourceAllocationException: .*maxBytesPerMsg=20480", exception)
        assert take(bridge, PASSWORD, "e2e.src", expect=0) == []
        assert link_counters(bridge, passfile) == (37, 3)
    finally:
        bridge.stop()
    log = (base / "var/instances/bridging/bridges/jb/log.txt").read_text()
    assert "(CLIENT_ACKNOWLEDGE, window 8)" in log
    assert "reconnect" not in log  # the refusals cost no connection
