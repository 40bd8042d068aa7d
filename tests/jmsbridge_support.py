"""Helpers shared by the JMS bridge runtime tests and their crash child: bridge XML,
bridges on embedded brokers, sending and draining queues, waiting for conditions."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from bridgemgr.jms import Message, Queue, TextMessage
from bridgemgr.jms.destination import Destination
from bridgemgr.jmsbridge.bridge import JMSBridge
from bridgemgr.jmsbridge.config import parse_bridge_config
from bridgemgr.jmsbridge.link import LinkTuning
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory
from waiting import wait_for

FAST = LinkTuning(poll_interval=0.02, retry_deadline=0.5, backoff_initial=0.01, backoff_max=0.05, start_timeout=10)
BUILTIN_DMQ = "imq.bridge.jms.dmq"


def bridge_xml(links: str, dmqs: str = "", cfs: str = "", dests: str = "", name: str = "b", **attrs: str) -> bytes:
    """A <jmsbridge> in DTD order; unless given: a quick built-in DMQ (2 attempts, no
    wait), the host factory `host` and the queues src, dst and other."""
    extra = " ".join(f'{k.replace("_", "-")}="{v}"' for k, v in attrs.items())
    if 'name="built-in-dmq"' not in dmqs:
        dmqs = (
            '<dmq name="built-in-dmq" connection-factory-ref="host" destination-ref="src" '
            'send-attempts="2" send-attempt-interval-in-seconds="0"/>'
        ) + dmqs
    if 'ref-name="host"' not in cfs:
        cfs += '<connection-factory ref-name="host"/>'
    dests += "".join(
        f'<destination ref-name="{d}" name="{d}"/>' for d in ("src", "dst", "other") if f'ref-name="{d}"' not in dests
    )
    return f'<jmsbridge name="{name}" {extra}>{links}{dmqs}{cfs}{dests}</jmsbridge>'.encode()


def link_xml(
    name: str = "l",
    src: str = "src",
    dst: str = "dst",
    transacted: str = "false",
    source_attrs: str = "",
    target_attrs: str = "",
    target_body: str = "",
    link_attrs: str = "",
) -> str:
    return (
        f'<link name="{name}" transacted="{transacted}" {link_attrs}>'
        f'<source connection-factory-ref="host" destination-ref="{src}" {source_attrs}/>'
        f'<target connection-factory-ref="host" destination-ref="{dst}" {target_attrs}>'
        f"{target_body}</target></link>"
    )


def host(broker: Broker) -> Callable[[Any], EmbeddedConnectionFactory]:
    return lambda env: EmbeddedConnectionFactory(broker)


def make_bridge(broker: Broker, xml: bytes, tuning: LinkTuning = FAST, **kw: Any) -> JMSBridge:
    return JMSBridge(parse_bridge_config(xml, "test.xml"), host_factory=host(broker), tuning=tuning, **kw)


def send(broker: Broker, dest: Destination | str, messages: Iterable[Message | str], **send_kw: Any) -> list[Message]:
    dest = Queue(dest) if isinstance(dest, str) else dest
    conn = EmbeddedConnectionFactory(broker).create_connection()
    try:
        producer = conn.create_session().create_producer(dest)
        sent = []
        for m in messages:
            msg = TextMessage(m) if isinstance(m, str) else m
            producer.send(msg, **send_kw)
            sent.append(msg)
        return sent
    finally:
        conn.close()


def drain(
    broker: Broker, dest: Destination | str, timeout: float = 0.15, expect: int | None = None, total: float = 10.0
) -> list[Message]:
    """Every message of ``dest`` (waiting up to ``total`` s for ``expect`` of them)."""
    dest = Queue(dest) if isinstance(dest, str) else dest
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    out: list[Message] = []
    deadline = time.monotonic() + total
    try:
        consumer = conn.create_session().create_consumer(dest)
        while True:
            m = consumer.receive(timeout)
            if m is not None:
                out.append(m)
                continue
            if expect is None or len(out) >= expect or time.monotonic() > deadline:
                return out
    finally:
        conn.close()


# The suite's one wait (tests/waiting.py), by the name the bridge tests import.
wait_until = wait_for


def texts(messages: Iterable[Message]) -> list[str]:
    return [m.text for m in messages]  # type: ignore[attr-defined]
