"""The STOMP bridge of a real `imqbridgemgr serve` with imq.bridge.stomp.messageTransformer
set to a transformer that builds a NEW message outbound (create_message()): the MESSAGE
frame still carries the delivery's destination, message-id and timestamp, so a
client-ack subscriber (STOMP 1.0, 1.1 and 1.2, over a plain socket) acknowledges it and
the message is consumed: after a reconnect it does not come again.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from service_support import Daemon, one_bridge_files
from stomp_support import Raw

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

TRANSFORMER = '''
from bridgemgr.transform import MessageTransformer


class Rewrap(MessageTransformer):
    """Inbound as it is; outbound a new TextMessage with the text prefixed and a property."""

    def transform(self, message, read_only, charset_name, source, target, properties):
        if source == "STOMP":
            return message
        out = self.create_message("TEXT")
        out.text = "new:" + message.text
        out.set_string_property("made", "by-transformer")
        return out
'''

LOGIN = {"login": "admin", "passcode": "Secret-1"}


@pytest.fixture(scope="module")
def stomp_port(tmp_path_factory):
    base: Path = tmp_path_factory.mktemp("stomptr")
    (base / "plugins").mkdir()
    (base / "plugins" / "rewrap.py").write_text(TRANSFORMER)
    # An admin login and the STOMP bridge only (the unused jb.xml stays empty).
    props, _ = one_bridge_files(
        base,
        "stomptr",
        "",
        "Secret-1",
        "imq.bridge.stomp.tcp.port=0",
        "imq.bridge.stomp.messageTransformer=rewrap.Rewrap",
        activelist="stomp",
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IMQ_BRIDGE_TRANSFORMER_PATH", str(base / "plugins"))  # serve inherits it
        daemon = Daemon(props)
    try:
        assert daemon.bridges == {"stomp": "STARTED"}, daemon.lines
        from bridgemgr.admin.portmapper import find_service

        host, port = daemon.address.split(":")
        yield find_service(host, int(port), ("stomp",)).port
    finally:
        daemon.stop()


def ack_frame(version: str, message, subscription: str) -> dict[str, str]:
    """The ACK headers for ``message`` as each version wants them."""
    if version == "1.2":
        return {"id": message.headers["ack"]}
    if version == "1.1":
        return {"message-id": message.headers["message-id"], "subscription": subscription}
    return {"message-id": message.headers["message-id"]}  # 1.0: the message-id alone


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_a_client_ack_subscriber_acks_a_message_the_transformer_made(stomp_port, version):
    queue = f"/queue/made{version.replace('.', '')}"
    client = Raw(stomp_port)
    client.connect(version, **LOGIN)
    client.frame("SEND", {"destination": queue, "receipt": "sent"}, b"hello")
    client.wait(lambda f: f.command == "RECEIPT")
    sub = {"destination": queue, "ack": "client"}
    if version != "1.0":
        sub["id"] = "s1"
    client.frame("SUBSCRIBE", sub)
    message = client.wait(lambda f: f.command == "MESSAGE")
    headers = message.headers
    assert message.body == b"new:hello" and headers["made"] == "by-transformer"
    assert headers["destination"] == queue
    assert headers["message-id"]
    assert abs(int(headers["timestamp"]) - time.time() * 1000) < 60_000
    subscription = headers["subscription"]
    client.frame("ACK", {**ack_frame(version, message, subscription), "receipt": "acked"})
    reply = client.wait(lambda f: f.command in ("RECEIPT", "ERROR"))
    assert reply.command == "RECEIPT", reply
    client.frame("DISCONNECT", {"receipt": "bye"})
    client.wait(lambda f: f.headers.get("receipt-id") == "bye")
    client.close()

    # Consumed: after a reconnect the next message comes first, and nothing else.
    again = Raw(stomp_port)
    again.connect(version, **LOGIN)
    again.frame("SEND", {"destination": queue}, b"second")
    again.frame("SUBSCRIBE", {"destination": queue, "ack": "auto", "id": "s2"})
    first = again.wait(lambda f: f.command == "MESSAGE")
    assert first.body == b"new:second"
    with pytest.raises(AssertionError, match="not seen"):
        again.wait(lambda f: f.command == "MESSAGE" and f is not first, timeout=1)
    again.close()
