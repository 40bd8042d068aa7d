"""Access control end to end: a real `imqbridgemgr serve` with an admin and a plain user
(pat), reached over STOMP (stomp.py and a raw socket) and over mq:// (the jms service,
bridgemgr's RemoteConnectionFactory).

- The shipped rules: pat may not produce to, consume from or browse the bridges' DMQ
  (imq.bridge.jms.dmq), the broker's (mq.sys.dmq) or a <dmq> a bridge's XML names, on
  either service, and each refusal names the destination and the operation; the admin
  may; pat may use an ordinary queue. The default file is installed 0600 in etc/.
- A custom file (imq.accesscontrol.file.filename): a queue denied to pat, the DMQ opened
  to pat for browsing by its exact name, a user refused at login on both services,
  auto-create denied to pat, the admin port refused to the admin (connection.ADMIN); each
  refusal is logged once, not per message.
- imq.accesscontrol.enabled=false opens everything (the jms service here), while
  imq.stomp.accesscontrol.enabled=true keeps the STOMP bridge's rules.
"""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest

from bridgemgr import connect
from bridgemgr.admin.portmapper import find_service
from bridgemgr.jms import Queue, TextMessage
from bridgemgr.jms.errors import JMSSecurityException
from bridgemgr.users import UserRepository
from service_support import Daemon, cli, one_bridge_files
from stomp_support import Raw, stomp_conn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

ADMIN_PW, PAT_PW = "Secret-1", "pat-pw-2"
BUILTIN_DMQ, BROKER_DMQ, USER_DMQ = "imq.bridge.jms.dmq", "mq.sys.dmq", "user.dmq"

XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb">
  <link name="l1">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst"/>
  </link>
  <dmq name="mine" connection-factory-ref="host" destination-ref="udmq"/>
  <connection-factory ref-name="host"/>
  <destination ref-name="src" name="acl.src"/>
  <destination ref-name="dst" name="acl.dst"/>
  <destination ref-name="udmq" name="user.dmq"/>
</jmsbridge>
"""

CUSTOM = """version=JMQFileAccessControlModel/100
connection.NORMAL.allow.user=*
connection.NORMAL.deny.user=blocked
connection.ADMIN.deny.user=admin
queue.*.produce.allow.user=*
queue.*.consume.allow.user=*
queue.*.browse.allow.user=*
topic.*.produce.allow.user=*
topic.*.consume.allow.user=*
queue.imq.bridge.*.produce.deny.user=*
queue.imq.bridge.*.produce.allow.group=admin
queue.imq.bridge.*.consume.deny.user=*
queue.imq.bridge.*.consume.allow.group=admin
queue.imq.bridge.*.browse.deny.user=*
queue.imq.bridge.*.browse.allow.group=admin
queue.imq.bridge.jms.dmq.browse.allow.user=pat
queue.secret.consume.deny.user=pat
queue.create.allow.user=*
queue.create.deny.user=pat
topic.create.allow.user=*
"""


class Service:
    """A running serve with the STOMP bridge, JMS bridge jb and users admin and pat."""

    def __init__(self, base: Path, *extra: str) -> None:
        props, self.passfile = one_bridge_files(
            base, base.name, XML, ADMIN_PW, "imq.bridge.stomp.tcp.port=0", *extra, activelist="jb,stomp"
        )
        self.etc = base / "var" / "instances" / base.name / "etc"
        users = UserRepository(self.etc / "passwd")
        users.add("admin", ADMIN_PW, "admin")
        users.add("pat", PAT_PW, "user")
        users.add("blocked", "blocked-pw", "user")
        self.daemon = Daemon(props)
        host, port = self.daemon.address.split(":")
        self.stomp_port = find_service(host, int(port), ("stomp",)).port

    def jms(self, user: str, password: str):
        return connect(f"mq://{self.daemon.address}", username=user, password=password)

    def stop(self) -> str:
        """Stop the serve; everything it printed (its log)."""
        proc = self.daemon.proc
        if proc.poll() is None:
            proc.terminate()
        out, _ = proc.communicate(timeout=60)
        return "\n".join(self.daemon.lines) + "\n" + (out or "")


def jms_refusals(service: Service, user: str, password: str, queue: str) -> dict[str, str]:
    """What the jms service refuses ``user`` on ``queue``: operation -> the error text."""
    refused = {}
    with service.jms(user, password) as conn:
        conn.start()
        session = conn.create_session()
        for op, act in (
            ("produce", lambda: session.create_producer(Queue(queue)).send(TextMessage("x"))),
            ("consume", lambda: session.create_consumer(Queue(queue)).receive(0.2)),
            ("browse", lambda: list(session.create_browser(Queue(queue)))),
        ):
            try:
                act()
            except JMSSecurityException as exc:
                refused[op] = str(exc)
    return refused


def stomp_error(port: int, user: str, password: str, command: str, queue: str):
    """The ERROR frame a STOMP SEND or SUBSCRIBE on /queue/``queue`` gets (None: a RECEIPT)."""
    client = Raw(port)
    try:
        client.connect("1.2", login=user, passcode=password)
        headers = {"destination": f"/queue/{queue}", "receipt": "r"}
        if command == "SUBSCRIBE":
            headers["id"] = "s1"
        client.frame(command, headers, b"hello" if command == "SEND" else b"")
        frame = client.wait(lambda f: f.command in ("RECEIPT", "ERROR"))
        if frame.command == "ERROR":
            assert client.until_closed(), "an ERROR closes the connection"
            return frame
        return None
    finally:
        client.close()


@pytest.fixture(scope="module")
def default_service(tmp_path_factory):
    service = Service(tmp_path_factory.mktemp("acldefault"))
    assert service.daemon.bridges == {"jb": "STARTED", "stomp": "STARTED"}, service.daemon.lines
    yield service
    service.stop()


@pytest.mark.parametrize("queue", [BUILTIN_DMQ, BROKER_DMQ, USER_DMQ])
def test_a_plain_user_cannot_touch_a_dmq_over_mq(default_service, queue):
    refused = jms_refusals(default_service, "pat", PAT_PW, queue)
    assert set(refused) == {"produce", "consume", "browse"}, refused
    for op, text in refused.items():
        assert f"may not {op} queue://{queue}" in text and "'pat'" in text
    assert jms_refusals(default_service, "admin", ADMIN_PW, queue) == {}


@pytest.mark.parametrize("queue", [BUILTIN_DMQ, BROKER_DMQ, USER_DMQ])
def test_a_plain_user_cannot_touch_a_dmq_over_stomp(default_service, queue):
    port = default_service.stomp_port
    sent = stomp_error(port, "pat", PAT_PW, "SEND", queue)
    assert sent is not None and f"may not produce queue://{queue}" in sent.body.decode(), sent
    subscribed = stomp_error(port, "pat", PAT_PW, "SUBSCRIBE", queue)
    assert subscribed is not None and f"may not consume queue://{queue}" in subscribed.body.decode()
    assert stomp_error(port, "admin", ADMIN_PW, "SEND", queue) is None
    assert stomp_error(port, "admin", ADMIN_PW, "SUBSCRIBE", queue) is None


def test_a_plain_user_uses_an_ordinary_queue_on_both_services(default_service):
    assert jms_refusals(default_service, "pat", PAT_PW, "pat.work") == {}
    conn, listener = stomp_conn("1.2", default_service.stomp_port)
    conn.connect("pat", PAT_PW, wait=True)
    conn.subscribe("/queue/pat.stomp", id="s1")
    conn.send("/queue/pat.stomp", "hi", receipt="r1")
    assert listener.wait_messages(1)[0].body == "hi"
    assert not listener.errors
    conn.disconnect()


def test_the_default_file_is_installed_for_the_owner_only(default_service):
    installed = default_service.etc / "accesscontrol.properties"
    assert stat.S_IMODE(installed.stat().st_mode) == 0o600
    assert installed.read_text().startswith("version=JMQFileAccessControlModel/100")


def test_a_custom_file_changes_the_outcome_and_refusals_are_logged_once(tmp_path):
    base = tmp_path / "aclcustom"
    base.mkdir()
    (base / "custom.properties").write_text(CUSTOM)
    service = Service(base, f"imq.accesscontrol.file.filename={base / 'custom.properties'}")
    try:
        with service.jms("admin", ADMIN_PW) as conn:  # queues that exist: pat need not create them
            conn.create_session().create_producer(Queue("made.by.admin")).send(TextMessage("x"))
            for queue in (BUILTIN_DMQ, "secret"):
                list(conn.create_session().create_browser(Queue(queue)))
        # the DMQ: browsing opened to pat by its exact name; the rest stays admin-only
        assert set(jms_refusals(service, "pat", PAT_PW, BUILTIN_DMQ)) == {"produce", "consume"}
        # a queue denied to pat (consume only), repeatedly: logged once
        for _ in range(3):
            assert set(jms_refusals(service, "pat", PAT_PW, "secret")) == {"consume"}
        sub = stomp_error(service.stomp_port, "pat", PAT_PW, "SUBSCRIBE", "secret")
        assert sub is not None and "may not consume queue://secret" in sub.body.decode()
        # auto-create denied to pat; an existing queue is fine
        created = jms_refusals(service, "pat", PAT_PW, "brand.new")
        assert "may not create queue://brand.new" in created["produce"], created
        sent = stomp_error(service.stomp_port, "pat", PAT_PW, "SEND", "brand.new2")
        assert sent is not None and "may not create queue://brand.new2" in sent.body.decode()
        assert "produce" not in jms_refusals(service, "pat", PAT_PW, "made.by.admin")
        # connection.NORMAL denied to one user: no login on either service
        with pytest.raises(JMSSecurityException, match="may not connect to the jms service"):
            service.jms("blocked", "blocked-pw")
        client = Raw(service.stomp_port)
        client.frame("CONNECT", {"accept-version": "1.2", "login": "blocked", "passcode": "blocked-pw"})
        error = client.wait(lambda f: f.command == "ERROR")
        assert "may not connect to the stomp service" in error.body.decode()
        client.close()
        # connection.ADMIN denied to the admin user: the admin port refuses the login
        listed = cli(service.daemon, service.passfile, "list", "bridge")
        assert listed.returncode != 0 and "may not connect to the admin service" in listed.stdout + listed.stderr
        time.sleep(0.5)
    finally:
        log = service.stop()
    refusals = [
        line
        for line in log.splitlines()
        if "bridgemgr.accesscontrol" in line and "access denied: user 'pat' may not consume queue://secret" in line
    ]
    assert len(refusals) == 2, refusals  # once for the jms service, once for STOMP


def test_access_control_off_opens_everything_but_a_service_may_keep_it(tmp_path):
    base = tmp_path / "acloff"
    base.mkdir()
    service = Service(base, "imq.accesscontrol.enabled=false", "imq.stomp.accesscontrol.enabled=true")
    try:
        assert jms_refusals(service, "pat", PAT_PW, BUILTIN_DMQ) == {}
        assert jms_refusals(service, "pat", PAT_PW, BROKER_DMQ) == {}
        sent = stomp_error(service.stomp_port, "pat", PAT_PW, "SEND", BUILTIN_DMQ)
        assert sent is not None and f"may not produce queue://{BUILTIN_DMQ}" in sent.body.decode()
    finally:
        service.stop()
