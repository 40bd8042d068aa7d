"""A real `serve` whose JMS bridge sends to a real RabbitMQ (imq.amqp, pika): the service
log keeps pika's INFO lines out (they were most of it), and has them at -loglevel DEBUG."""

from __future__ import annotations

from pathlib import Path

import pytest

from service_support import Daemon, one_bridge_files, send
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

PASSWORD = "Amqp-Logs-1"


def xml(url: str) -> str:
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<jmsbridge name="jb">
  <link name="l1" transacted="false">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="rabbit" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host"/>
  <connection-factory ref-name="rabbit" lookup-name="ConnectionFactory">
    <property name="java.naming.factory.initial" value="imq.amqp"/>
    <property name="java.naming.provider.url" value="{url}"/>
  </connection-factory>
  <destination ref-name="src" name="amqplogs.src"/>
  <destination ref-name="dst" name="amqplogs.dst"/>
</jmsbridge>
"""


def pika_lines(base: Path, *args: str, rabbitmq) -> tuple[list[str], int]:
    """Run serve under ``base``, move 20 messages to RabbitMQ, stop: the service log's
    lines from pika's loggers, and its number of lines."""
    base.mkdir()
    props, _ = one_bridge_files(base, "amqplogs", xml(rabbitmq.amqp_env()["java.naming.provider.url"]), PASSWORD)
    daemon = Daemon(props, *args)
    bridge_log = base / "var" / "instances" / "amqplogs" / "bridges" / "jb" / "log.txt"
    try:
        send(daemon, PASSWORD, "amqplogs.src", *[f"m{i}" for i in range(20)])
        wait_for(lambda: bridge_log.read_text().count("transferred message") >= 20, 60, "20 messages to RabbitMQ")
    finally:
        daemon.proc.terminate()
        daemon.proc.communicate(timeout=60)
    lines = (base / "var" / "instances" / "amqplogs" / "log" / "log.txt").read_text().splitlines()
    return [line for line in lines if " pika." in line], len(lines)


def test_pika_lines_below_warning_reach_the_service_log_only_at_debug(tmp_path, rabbitmq):
    """Before, pika's INFO lines (connection and channel objects' reprs) were written at
    the default level: 121 of 221 lines of a reported service log."""
    quiet, total = pika_lines(tmp_path / "info", rabbitmq=rabbitmq)
    assert quiet == [], f"{len(quiet)} of {total} lines: {quiet[:5]}"
    debug, _ = pika_lines(tmp_path / "debug", "-loglevel", "DEBUG", rabbitmq=rabbitmq)
    assert any(" INFO pika." in line for line in debug), debug[:5]
