"""A database outage never counts toward a backout threshold, on any kind of transacted
link, end to end: host H (a `serve` whose store is a PostgreSQL database of this test's
server, the bridges' XA log in it too) runs bridge jb, whose transacted link moves xa.src
to xa.dst of H itself in batches of 10, through a gate transformer (it holds the link at
will and notes every delivery it lets through). Three kinds of link:

- local: both ends one mq:// factory of a provider that makes local transactions
  (tests/local_embedded.py): one local transaction per unit (LocalTransaction);
- one-phase: both ends the host broker's own factory: one XA branch, committed in one
  phase;
- xa: an mq:// factory of H and the host broker's own factory: two branches, two phases,
  the commit decision logged in the database; the source's branch, over mq://, is the
  first to fail (XAER_RMFAIL).

The gate holds m0 (delivered once) while the database is stopped (fast: H's connections
are cut), then lets the link go on: its units fail to complete ('store unavailable', an
RM failing, the XA log unreachable) and are rolled back, again and again, until the gate
holds a message delivered backoutThreshold + 1 times, which a counted rollback would not
allow (it would have gone to the DMQ, BACKOUT_THRESHOLD_REACHED). The database is started
again and, once H's store writes again, the gate opens (with backoutThreshold 2, H is
first killed, kill -9, with that message in its unit and started again: the excuses are
read again, and one crash is one backout, under the threshold): every message reaches
xa.dst once, in order, and the DMQ holds none. (Before, every kind sent messages to the DMQ: a
local or one-phase commit that the store rolled back, and a prepare that failed over
mq:// with XAER_RMFAIL, counted as backouts.)
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from pgserver import free_port
from service_support import Daemon, one_bridge_files, send, take
from test_xa_faults_e2e import PASSWORD
from test_xa_pg_outage_e2e import held

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

N = 20

# Holds the link while "hold" exists in $GATE, or while the message's delivery count
# reaches the number "hold-from" says (writing what it holds into "held"), and appends
# "<text> <delivery count>" of every message it lets through to "seen".
GATE = """
import os
import time
from pathlib import Path

from bridgemgr.transform import MessageTransformer


def hold_from(gate):
    try:
        return int((gate / "hold-from").read_text())
    except (OSError, ValueError):
        return 1 << 30


class Gate(MessageTransformer):
    def transform(self, message, *args):
        gate = Path(os.environ["GATE"])
        while (gate / "hold").exists() or message.delivery_count >= hold_from(gate):
            (gate / "held.new").write_text(f"{message.text} {message.delivery_count}")
            os.replace(gate / "held.new", gate / "held")
            time.sleep(0.02)
        with open(gate / "seen", "a") as seen:
            seen.write(f"{message.text} {message.delivery_count}\\n")
        return message
"""

FACTORIES = {
    "host": '<connection-factory ref-name="host"/>',
    "self": """<connection-factory ref-name="self" lookup-name="XAConnectionFactory"
                      username="admin" password="{password}">
    <property name="java.naming.factory.initial" value="{context}"/>
    <property name="java.naming.provider.url" value="mq://127.0.0.1:{port}"/>
  </connection-factory>""",
}
# link kind -> (source factory, target factory, the self factory's context factory)
KINDS = {
    "local": ("self", "self", "tests.local_embedded:LocalEmbedded"),
    "one-phase": ("host", "host", ""),
    "xa": ("self", "host", "imq.embedded"),
}
LOGGED = {"local": "local transaction (one resource manager)", "one-phase": "XA", "xa": "XA"}


def link_xml(kind: str, port: int) -> str:
    source, target, context = KINDS[kind]
    factories = "\n  ".join(
        FACTORIES[ref].format(password=PASSWORD, context=context, port=port) for ref in dict.fromkeys((source, target))
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<jmsbridge name="jb">
  <link name="l1" transacted="true">
    <source connection-factory-ref="{source}" destination-ref="src"/>
    <target connection-factory-ref="{target}" destination-ref="dst"
            message-transformer-class="gate.Gate"/>
  </link>
  {factories}
  <destination ref-name="src" name="xa.src"/>
  <destination ref-name="dst" name="xa.dst"/>
</jmsbridge>
"""


def written_again(log: Path, seconds: float = 30) -> None:
    """Wait until the service log ``log`` says the store writes to its database again."""
    deadline = time.monotonic() + seconds
    while "the database is back after" not in log.read_text():
        assert time.monotonic() < deadline, "the store did not write again"
        time.sleep(0.05)


@pytest.mark.parametrize("threshold", [1, 2])  # 2: the kill; each rollback more waits a longer backoff
@pytest.mark.parametrize("kind", list(KINDS))
def test_an_outage_sends_nothing_to_the_dmq(tmp_path, database, monkeypatch, kind, threshold):
    base, plugins, gate = tmp_path / "host", tmp_path / "plugins", tmp_path / "gate"
    for folder in (base, plugins, gate):
        folder.mkdir()
    (plugins / "gate.py").write_text(GATE)
    monkeypatch.setenv("IMQ_BRIDGE_TRANSFORMER_PATH", str(plugins))
    monkeypatch.setenv("GATE", str(gate))
    (gate / "hold").touch()
    port = free_port()
    props, _ = one_bridge_files(
        base,
        "host",
        link_xml(kind, port),
        PASSWORD,
        f"imq.portmapper.port={port}",
        "imq.bridge.jb.transaction.batchSize=10",
        f"imq.bridge.jb.backoutThreshold={threshold}",
        "imq.persist.store=jdbc",
        f"imq.persist.jdbc.postgresql.property.url={database.url()}",
        "imq.persist.file.sync.enabled=true",
    )
    host = Daemon(props)
    try:
        assert any(f"(transacted, {LOGGED[kind]})" in line for line in host.lines), host.lines
        send(host, PASSWORD, "xa.src", *(f"m{i}" for i in range(N)))
        assert held(gate) == ("m0", 1)
        (gate / "hold-from").write_text(str(threshold + 1))  # more than the threshold allows
        database.stop_fast()
        (gate / "hold").unlink()  # the unit fills and fails to complete, again and again
        deadline = time.monotonic() + 40
        while held(gate)[1] <= threshold:
            assert time.monotonic() < deadline, (gate / "seen").read_text().splitlines()
            time.sleep(0.05)
        database.start()
        written_again(base / "var" / "instances" / "host" / "log" / "log.txt")
        if threshold > 1:
            os.kill(host.proc.pid, signal.SIGKILL)
            host.proc.wait(timeout=30)
        (gate / "hold-from").unlink()
        if threshold > 1:
            host = Daemon(props)
        got = [m.text for m in take(host, PASSWORD, "xa.dst", expect=N, wait=60, quiet=0.5)]
        dead = take(host, PASSWORD, "imq.bridge.jms.dmq", quiet=0.2)
        assert [(m.text, m.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_REASON")) for m in dead] == []
        assert got == [f"m{i}" for i in range(N)], got
        assert take(host, PASSWORD, "xa.src", quiet=0.2) == []
    finally:
        host.stop()
