"""The jms service's client connection without sockets: bytes in, frames out, blocking
calls run by hand, against a real embedded broker in a temporary directory."""

from __future__ import annotations

import pytest

from bridgemgr.accesscontrol import AccessControl, AccessControls
from bridgemgr.jms import AckMode, Queue, TextMessage, codec, xa
from bridgemgr.jms.errors import (
    IllegalStateException,
    JMSSecurityException,
    TransactionRolledBackException,
    TransportException,
)
from bridgemgr.jms.xa import Xid
from bridgemgr.providers.embedded import Broker, wire
from bridgemgr.providers.embedded.clientconn import ClientConnection, State
from bridgemgr.providers.embedded.wire import Op, Role, Wire

Q = Queue("orders")


class Driver:
    """What the service's asyncio shell does, by hand: feed bytes, run the blocking calls
    and the posted work at once, and read what the connection wrote as a client would."""

    def __init__(self, broker: Broker, **options) -> None:
        options.setdefault("authenticate", lambda user, password: True)
        self.posted: list = []
        self.run_calls = True
        self.held: list = []
        self.conn = ClientConnection(broker, post=self.posted.append, peer="test", **options)
        self.reader = Wire(Role.CLIENT)
        self.now = 0.0

    def feed(self, *frames: bytes) -> list:
        self.conn.receive_data(b"".join(frames), self.now)
        return self.settle()

    def settle(self) -> list:
        """Run what is pending until nothing is; the frames the client got meanwhile."""
        while True:
            calls = list(self.conn.take_calls())
            if not self.run_calls:
                self.held += calls
                calls = []
            for call in calls:
                self.complete(call)
            posted, self.posted[:] = list(self.posted), []
            for fn in posted:
                fn()
            if not calls and not posted:
                break
        self.reader.receive_data(self.conn.data_to_send(self.now))
        got = []
        while (event := self.reader.next_event()) is not None:
            got.append(event)
        return got

    def complete(self, call) -> None:
        try:
            result, exc = call.fn(), None
        except Exception as error:
            result, exc = None, error
        self.conn.complete(call, result, exc)

    def hello(self, user="alice", password="pw", heartbeat_ms=10_000) -> list:
        got = self.feed(wire.PREAMBLE, wire.request(1, Op.HELLO, user, password, heartbeat_ms, "test"))
        if self.conn.state is State.OPEN:
            self.reader.open()
        return got


def message(text: str, dest=Q) -> bytes:
    m = TextMessage(text)
    m.destination = dest
    return codec.encode(m)


@pytest.fixture
def driver(broker):
    d = Driver(broker)
    d.hello()
    yield d
    d.conn.connection_lost()


def replies(events) -> dict:
    return {e.call: e.value for e in events if isinstance(e, wire.Reply)}


def texts(events) -> list[str]:
    return [codec.decode(e.blob).text for e in events if isinstance(e, wire.Delivery)]


# --- the handshake --------------------------------------------------------------------------


def test_hello_opens_the_connection_and_answers_with_the_brokers_identity(broker):
    d = Driver(broker, heartbeat=30.0)
    (answer,) = d.hello(heartbeat_ms=2000)
    assert d.conn.state is State.OPEN and d.conn.user == "alice"
    assert answer.call == 1 and answer.value["rm_id"] == broker.rm_id
    assert answer.value["heartbeat_ms"] == 2000 and d.conn.interval == 2.0  # the smaller one
    d.conn.connection_lost()


@pytest.mark.parametrize("authenticate", [lambda u, p: False, lambda u, p: 1 / 0])
def test_a_refused_login_reads_nothing_more_and_fails_when_the_driver_says(broker, authenticate):
    d = Driver(broker, authenticate=authenticate)
    got = d.feed(
        wire.PREAMBLE,
        wire.request(1, Op.HELLO, "mallory", "guess", 0, "test"),
        wire.request(2, Op.SESSION, 1, False, 1, False),
    )
    assert got == [] and d.conn.state is State.REFUSED
    assert isinstance(d.conn.refusal, JMSSecurityException) and "'mallory'" in str(d.conn.refusal)
    assert d.conn.embedded is None and not d.conn.sessions
    d.conn.fail(d.conn.refusal)  # the shell does this after its delay
    (error,) = d.settle()
    assert error.fatal and "authentication failed for user 'mallory'" in str(error.error)
    assert d.conn.closed


def test_hello_naming_a_taken_over_home_is_sent_where_its_store_is(broker):
    asked: list[str] = []

    def locate(home: str):
        asked.append(home)
        if home == "B2":
            return "B3", "mq://h3:7676"
        if home == "B4":
            raise TransportException("broker B4 of HA cluster c is not taken over yet; try again")
        return None

    d = Driver(broker, brokerid="B1", locate=locate)
    (answer,) = d.hello()
    assert answer.value["broker"] == "B1" and "moved" not in answer.value and asked == []  # no home: no look-up
    d.conn.connection_lost()
    d = Driver(broker, brokerid="B1", locate=locate)
    (answer,) = d.feed(wire.PREAMBLE, wire.request(1, Op.HELLO, "alice", "pw", 0, "test", "B2"))
    assert answer.value["moved"] == {"home": "B2", "broker": "B3", "urls": "mq://h3:7676"}
    assert d.conn.closed and d.conn.embedded is None
    d = Driver(broker, brokerid="B1", locate=locate)
    (error,) = d.feed(wire.PREAMBLE, wire.request(1, Op.HELLO, "alice", "pw", 0, "test", "B4"))
    assert error.fatal and "not taken over yet; try again" in str(error.error) and d.conn.closed
    d = Driver(broker, brokerid="B1", locate=locate, authenticate=lambda u, p: False)
    assert d.feed(wire.PREAMBLE, wire.request(1, Op.HELLO, "mallory", "guess", 0, "test", "B2")) == []
    assert d.conn.state is State.REFUSED and asked == ["B2", "B4"]  # told nothing before the password
    d = Driver(broker, brokerid="B1", locate=locate)
    (answer,) = d.feed(wire.PREAMBLE, wire.request(1, Op.HELLO, "alice", "pw", 0, "test", "B9"))
    assert d.conn.state is State.OPEN and answer.value["broker"] == "B1"  # a home served here
    d.conn.connection_lost()


def test_a_request_before_hello_is_a_fatal_error_naming_it_not_an_exception(broker):
    d = Driver(broker)
    (error,) = d.feed(wire.PREAMBLE, wire.request(1, Op.SESSION, 1, False, 1, False))
    assert error.fatal and "frame 1" in str(error.error) and "SESSION" in str(error.error)
    assert d.conn.closed


def test_no_hello_in_time_fails_the_connection(broker):
    d = Driver(broker)
    d.feed(wire.PREAMBLE)
    d.conn.handshake_expired(2.0)
    (error,) = d.settle()
    assert isinstance(error.error, wire.ProtocolError) and "no HELLO within 2 s" in str(error.error)


# --- requests ---------------------------------------------------------------------------------


def test_send_deliver_and_acknowledge_round_trip(driver, broker):
    got = driver.feed(
        wire.request(2, Op.SESSION, 1, False, int(AckMode.CLIENT_ACKNOWLEDGE), False),
        wire.request(3, Op.START),
        wire.send_request(4, 1, message("one")),
        wire.send_request(5, 1, message("two")),
        wire.request(6, Op.CONSUMER, 1, 7, Q, None, False, None, 10),
    )
    assert replies(got) == {2: None, 3: None, 4: None, 5: None, 6: None}
    assert texts(got) == ["one", "two"]
    tags = [e.tag for e in got if isinstance(e, wire.Delivery)]
    assert broker.destinations()["queue:orders"]["unacked"] == 2
    got = driver.feed(wire.consumed_request(1, 7, tags), wire.request(8, Op.ACKNOWLEDGE, 1))
    assert replies(got) == {8: None}
    assert broker.destinations()["queue:orders"] == {"pending": 0, "unacked": 0, "bytes": 0}


def test_a_transacted_send_is_delivered_after_commit_only(driver):
    got = driver.feed(
        wire.request(2, Op.SESSION, 1, True, 0, False),
        wire.request(3, Op.SESSION, 2, False, 1, False),
        wire.request(4, Op.START),
        wire.request(5, Op.CONSUMER, 2, 1, Q, None, False, None, 10),
        wire.send_request(0, 1, message("in tx")),
    )
    assert texts(got) == []
    got = driver.feed(wire.request(6, Op.COMMIT, 1))
    assert replies(got) == {6: None} and texts(got) == ["in tx"]


def test_a_refused_send_without_a_reply_fails_its_transactions_commit(broker, tmp_path):
    rules = tmp_path / "acl.properties"
    rules.write_text(
        "version=JMQFileAccessControlModel/100\nconnection.NORMAL.allow.user=*\n"
        "queue.*.consume.allow.user=*\nqueue.create.allow.user=*\n"
    )
    d = Driver(broker, access=AccessControls(jms=AccessControl("jms", rules)))
    d.hello()
    got = d.feed(wire.request(2, Op.SESSION, 1, True, 0, False), wire.send_request(0, 1, message("not allowed")))
    assert replies(got) == {2: None}  # the failure waits for the commit
    (error,) = d.feed(wire.request(3, Op.COMMIT, 1))
    assert error.call == 3 and isinstance(error.error, TransactionRolledBackException)
    assert "may not produce queue://orders" in str(error.error)
    d.conn.connection_lost()


def test_a_request_the_broker_refuses_gets_an_error_reply_naming_it(driver):
    got = driver.feed(
        wire.request(2, Op.CONSUMER, 9, 1, Q, None, False, None, 10),
        wire.request(3, Op.SESSION, 1, False, 99, False),
        wire.request(4, Op.SESSION, 1, False, 1, False),
    )
    first, second, ok = got
    assert first.call == 2 and isinstance(first.error, IllegalStateException)
    assert "session 9 does not exist" in str(first.error) and not first.fatal
    assert second.call == 3 and "unknown acknowledge mode 99" in str(second.error)
    assert ok == wire.Reply(4, None) and driver.conn.state is State.OPEN


def test_a_malformed_request_is_a_fatal_error_naming_it_not_an_exception(driver):
    (error,) = driver.feed(wire.request(2, Op.SESSION, "one", False, 1, False))
    assert error.fatal and "SESSION argument 1: str is the wrong type" in str(error.error)
    assert driver.conn.closed
    assert driver.feed(wire.request(3, Op.SESSION, 1, False, 1, False)) == []  # nothing more read


def test_xa_prepare_and_commit_are_blocking_calls(driver, broker):
    x = Xid(1, b"g", b"b")
    driver.run_calls = False
    got = driver.feed(
        wire.request(2, Op.SESSION, 1, False, 0, True),
        wire.request(3, Op.XA_START, 1, x, xa.TMNOFLAGS),
        wire.send_request(4, 1, message("xa")),
        wire.request(5, Op.XA_END, 1, x, xa.TMSUCCESS),
        wire.request(6, Op.XA_PREPARE, x),
    )
    assert replies(got) == {2: None, 3: None, 4: None, 5: None}  # PREPARE waits for its call
    (call,) = driver.held
    driver.complete(call)
    assert replies(driver.settle()) == {6: xa.XA_OK}
    driver.run_calls = True
    assert list(replies(driver.feed(wire.request(7, Op.XA_COMMIT, x, False)))) == [7]
    assert broker.queue_depth("orders") == 1


def test_durable_sends_of_one_read_wait_for_the_store_in_one_call(tmp_path):
    broker = Broker(tmp_path / "store", sync=True)
    d = Driver(broker)
    d.hello()
    d.feed(wire.request(2, Op.SESSION, 1, False, 1, False))
    d.run_calls = False
    got = d.feed(wire.send_request(3, 1, message("a")), wire.send_request(4, 1, message("b")))
    assert got == [] and len(d.held) == 1
    d.complete(d.held.pop())
    assert replies(d.settle()) == {3: None, 4: None}
    d.conn.connection_lost()
    broker.close()


def test_sends_read_while_the_store_is_waited_for_wait_in_the_next_call(tmp_path):
    """One pool job per store batch, not one per read: the sends of later reads are
    waited for by one call once the first is done, and answered only then."""
    broker = Broker(tmp_path / "store")
    d = Driver(broker)
    d.hello()
    d.feed(wire.request(2, Op.SESSION, 1, False, 1, False))
    d.run_calls = False
    d.feed(wire.send_request(3, 1, message("a")))
    assert d.feed(wire.send_request(4, 1, message("b"))) == []
    assert d.feed(wire.send_request(5, 1, message("c"))) == []
    assert len(d.held) == 1  # the first read's; the others wait for it to be done
    d.run_calls = True
    d.complete(d.held.pop())
    assert list(replies(d.settle())) == [3, 4, 5]  # 4 and 5 by one more call, in order
    d.conn.connection_lost()
    broker.close()


# --- flow control, closing, heart-beats ---------------------------------------------------------


def test_a_full_socket_stops_deliveries_until_it_drains(driver):
    driver.feed(
        wire.request(2, Op.SESSION, 1, False, 1, False),
        wire.request(3, Op.START),
        wire.request(4, Op.CONSUMER, 1, 1, Q, None, False, None, 10),
    )
    driver.conn.set_writable(False)
    assert texts(driver.feed(wire.send_request(5, 1, message("waits")))) == []
    driver.conn.set_writable(True)
    assert texts(driver.settle()) == ["waits"]


def test_close_gives_in_flight_messages_back_as_never_delivered(driver, broker):
    driver.feed(
        wire.request(2, Op.SESSION, 1, False, 2, False),
        wire.request(3, Op.START),
        wire.send_request(4, 1, message("held")),
        wire.request(5, Op.CONSUMER, 1, 1, Q, None, False, None, 10),
    )
    got = driver.feed(wire.request(6, Op.CLOSE))
    assert replies(got) == {6: None} and driver.conn.closed
    (again,) = broker.browse(Q, None)
    assert again.text == "held" and not again.redelivered


def test_a_lost_connection_gives_them_back_as_redelivered(driver, broker):
    driver.feed(
        wire.request(2, Op.SESSION, 1, False, 2, False),
        wire.request(3, Op.START),
        wire.send_request(4, 1, message("held")),
        wire.request(5, Op.CONSUMER, 1, 1, Q, None, False, None, 10),
    )
    driver.conn.connection_lost()
    (again,) = broker.browse(Q, None)
    assert again.redelivered


def test_heart_beats_when_quiet_and_fails_a_silent_client(driver):
    interval = driver.conn.interval
    driver.now = interval
    driver.conn.tick(driver.now)
    assert driver.settle() == [wire.HEARTBEAT_EVENT]
    driver.now = 3.5 * interval
    driver.conn.tick(driver.now)
    (error,) = driver.settle()
    assert error.fatal and isinstance(error.error, TransportException) and "no heart-beat" in str(error.error)
    assert driver.conn.closed
