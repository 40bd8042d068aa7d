"""The AMQP provider's connection reading deliveries off a socket: a scripted AMQP 0-9-1
broker (a raw socket on 127.0.0.1, frames made by pika's encoders) opens the connection,
answers each command, and then delivers what a test gives it."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Iterator

import pika
import pytest
from pika import frame as pika_frame
from pika import spec
from pika.spec import Basic

from bridgemgr.jms.destination import Queue
from bridgemgr.jms.errors import TransportException
from bridgemgr.jms.spi import AckMode
from bridgemgr.providers.amqp import AmqpConnectionFactory

ANSWERS = {
    spec.Channel.Open: lambda m: spec.Channel.OpenOk(),
    spec.Basic.Qos: lambda m: spec.Basic.QosOk(),
    spec.Confirm.Select: lambda m: spec.Confirm.SelectOk(),
    spec.Basic.Consume: lambda m: spec.Basic.ConsumeOk(m.consumer_tag),
    spec.Channel.Close: lambda m: spec.Channel.CloseOk(),
    spec.Connection.Open: lambda m: spec.Connection.OpenOk(),
}


def frames(sock: socket.socket) -> Iterator[pika_frame.Frame]:
    buf = b""
    while True:
        consumed, value = pika_frame.decode_frame(buf)
        if value is None:
            data = sock.recv(65536)
            if not data:
                return
            buf += data
            continue
        buf = buf[consumed:]
        yield value


def scripted_broker(deliveries: list[Callable[[str], bytes]]) -> tuple[int, threading.Thread]:
    """A broker on a free port that sends ``deliveries`` (raw frames for a consumer tag)
    after basic.consume-ok."""
    server = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        conn, _ = server.accept()
        server.close()
        with conn:
            assert conn.recv(8) == b"AMQP\x00\x00\x09\x01"
            conn.sendall(
                pika_frame.Method(
                    0,
                    spec.Connection.Start(
                        server_properties={
                            "product": "scripted",
                            "capabilities": {"publisher_confirms": True, "basic.nack": True},
                        },
                        mechanisms="PLAIN",
                        locales="en_US",
                    ),
                ).marshal()
            )
            for value in frames(conn):
                if not isinstance(value, pika_frame.Method):
                    continue
                method = value.method
                if isinstance(method, spec.Connection.StartOk):
                    conn.sendall(pika_frame.Method(0, spec.Connection.Tune(2047, 131072, 0)).marshal())
                elif isinstance(method, spec.Connection.Close):
                    conn.sendall(pika_frame.Method(0, spec.Connection.CloseOk()).marshal())
                    return
                elif type(method) in ANSWERS:
                    conn.sendall(pika_frame.Method(value.channel_number, ANSWERS[type(method)](method)).marshal())
                    if isinstance(method, spec.Basic.Consume):
                        conn.sendall(b"".join(d(method.consumer_tag) for d in deliveries))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return server.getsockname()[1], thread


def delivery(tag: int, props: pika.BasicProperties, body: bytes, header: bytes | None = None) -> Callable[[str], bytes]:
    header = header if header is not None else pika_frame.Header(1, len(body), props).marshal()
    step = 131072 - 8
    bodies = [pika_frame.Body(1, body[at : at + step]).marshal() for at in range(0, len(body), step)]
    return lambda ctag: b"".join(
        (pika_frame.Method(1, Basic.Deliver(ctag, tag, False, "", "q")).marshal(), header, *bodies)
    )


def consume(port: int, count: int, timeout: float = 5.0):
    factory = AmqpConnectionFactory(f"amqp://guest:guest@127.0.0.1:{port}/%2F?declare-queues=false&timeout=5")
    connection = factory.create_connection()
    try:
        session = connection.create_session(False, AckMode.CLIENT_ACKNOWLEDGE)
        consumer = session.create_consumer(Queue("q"))
        connection.start()
        return [consumer.receive(timeout) for _ in range(count)]
    finally:
        connection.close()


def test_deliveries_reach_the_consumer_whole_and_in_order():
    props = pika.BasicProperties(
        message_id="ID:1",
        content_type="application/octet-stream",
        delivery_mode=2,
        headers={"color": "red", "x-jms-timestamp": 1_700_000_000_123},
    )
    port, broker = scripted_broker(
        [delivery(1, props, b"one"), delivery(2, props, b""), delivery(3, props, b"x" * 200_000)]
    )
    got = consume(port, 3)
    assert [m.get_body() for m in got] == [b"one", b"", b"x" * 200_000]
    assert got[0].get_string_property("color") == "red" and got[0].timestamp == 1_700_000_000_123
    broker.join(5)


def test_a_malformed_content_header_loses_the_connection_naming_the_frame():
    good = pika_frame.Header(1, 3, pika.BasicProperties(message_id="ID:12345")).marshal()
    payload = good[7:-1][:-3]  # the message id's length still says 8: pika would read "ID:12"
    bad = struct.pack(">BHI", 2, 1, len(payload)) + payload + b"\xce"
    port, broker = scripted_broker([delivery(1, pika.BasicProperties(), b"abc", header=bad)])
    with pytest.raises(TransportException, match=r"malformed content header frame on channel 1"):
        consume(port, 1)
    broker.join(5)
