"""serve's status lines ("bridge NAME (TYPE): STATE"): a bridge whose start fails while
its first line is being made ends on STOPPED, not STARTING."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from bridgemgr.cli import BridgeLines
from bridgemgr.jmsbridge.bridge import JMSBridge
from bridgemgr.jmsbridge.config import load_bridge_config
from bridgemgr.props import ConfigError
from bridgemgr.providers.embedded import EmbeddedConnectionFactory


def test_a_start_that_fails_while_its_line_is_made_prints_last(tmp_path: Path, broker):
    """As serve runs it: the main thread prints STARTING while the start is under way; the
    start thread, once its start has ended, prints the state then. Here the start fails
    (the XML cannot be read) just after the main thread asked whether it is under way.
    Before, that answer was taken outside the lines' lock, so the start thread's STOPPED
    could be printed first and STARTING stayed the last word."""
    (tmp_path / "jbad.xml").write_text('<jmsbridge name="jbad"><link')
    bridge = JMSBridge(
        lambda: load_bridge_config("jbad.xml", base_dir=tmp_path),
        name="jbad",
        host_factory=lambda env: EmbeddedConnectionFactory(broker),
    )
    printed: list[str] = []
    lines = BridgeLines(printed.append)
    ended = threading.Event()

    def start() -> None:  # what service._Start does for serve
        with pytest.raises(ConfigError):
            bridge.start()
        ended.set()
        lines.show(bridge)

    starter = threading.Thread(target=start)

    def under_way() -> bool:
        answer = not ended.is_set()  # asked now: the start has not ended
        starter.start()
        assert ended.wait(5)  # ... and ends before the line is printed
        return answer

    lines.show(bridge, under_way=under_way)
    starter.join(5)
    assert printed == ["bridge jbad (JMS): STARTING", "bridge jbad (JMS): STOPPED"]
