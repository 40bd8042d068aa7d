"""What the jms service gives back when a client dies (kill -9 of a client process), and
clients of a service that is killed and restarted under them."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from bridgemgr.jms import Queue, TextMessage, xa
from bridgemgr.jms.errors import InvalidDestinationException, TransportException
from bridgemgr.jms.xa import Xid
from ports import free_port
from remote.support import Harness, expect_line, spawn
from waiting import wait_for

pytestmark = [pytest.mark.crash, pytest.mark.slow]

SRC, DST = Queue("src"), Queue("dst")


@pytest.fixture
def harness(broker):
    h = Harness(broker, heartbeat=2.0)
    yield h
    h.close()


def put(conn, dest, *texts):
    producer = conn.create_session().create_producer(dest)
    for text in texts:
        producer.send(TextMessage(text))


def drain(consumer, timeout=0.3):
    out = []
    while (m := consumer.receive(timeout)) is not None:
        out.append(m)
    return out


def kill(proc):
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def depth(broker, name):
    return broker.destinations().get(f"queue:{name}", {"pending": 0, "unacked": 0})


@pytest.fixture
def observer(harness):
    conn = harness.factory(prefetch=0).create_xa_connection()
    conn.start()
    yield conn
    conn.close()


def test_kill9_with_unacknowledged_messages_returns_them_redelivered(harness, broker, observer):
    put(observer, SRC, "a", "b", "c", "d", "e")
    child = spawn("client_child.py", harness.url, "client_ack")
    try:
        assert expect_line(child, "got ") == "a,b,c"
        wait_for(lambda: depth(broker, "src")["unacked"] == 5)  # three delivered, two prefetched
    finally:
        kill(child)
    wait_for(lambda: depth(broker, "src")["pending"] == 5)
    got = drain(observer.create_session().create_consumer(SRC))
    assert [m.text for m in got] == ["a", "b", "c", "d", "e"]
    assert [m.redelivered for m in got] == [True] * 5  # the service cannot know what it saw


def test_kill9_after_auto_acknowledge_keeps_the_consumed_message_consumed(harness, broker, observer):
    put(observer, SRC, "a", "b", "c")
    child = spawn("client_child.py", harness.url, "auto")
    try:
        assert expect_line(child, "got ") == "a"
        expect_line(child, "acked")
    finally:
        kill(child)
    wait_for(lambda: depth(broker, "src")["pending"] == 2)
    assert [m.text for m in drain(observer.create_session().create_consumer(SRC))] == ["b", "c"]


def test_kill9_mid_transaction_rolls_it_back(harness, broker, observer):
    put(observer, SRC, "a", "b")
    child = spawn("client_child.py", harness.url, "tx")
    try:
        expect_line(child, "in-tx")
        wait_for(lambda: depth(broker, "src")["unacked"] == 2)
    finally:
        kill(child)
    wait_for(lambda: depth(broker, "src")["pending"] == 2)
    session = observer.create_session()
    got = drain(session.create_consumer(SRC))
    assert [m.text for m in got] == ["a", "b"] and all(m.redelivered for m in got)
    assert drain(session.create_consumer(DST)) == []


def test_kill9_mid_xa_keeps_the_prepared_branch_in_doubt_and_rolls_back_the_active_one(harness, broker, observer):
    put(observer, SRC, "a", "b")
    child = spawn("client_child.py", harness.url, "xa")
    try:
        expect_line(child, "prepared")
        expect_line(child, "active")
        wait_for(lambda: depth(broker, "src")["unacked"] == 2)
    finally:
        kill(child)
    prepared = Xid(7, b"crash-prepared", b"b")
    resource = observer.create_xa_session().xa_resource
    wait_for(lambda: depth(broker, "src")["pending"] == 1)  # the active branch's message
    assert resource.recover(xa.TMSTARTRSCAN | xa.TMENDRSCAN) == [prepared]
    session = observer.create_session()
    assert [m.text for m in drain(session.create_consumer(SRC))] == ["b"]  # "a" is locked
    assert drain(session.create_consumer(DST)) == []
    resource.commit(prepared, False)  # another client ends it
    assert [m.text for m in drain(session.create_consumer(DST))] == ["A"]
    assert resource.recover(xa.TMSTARTRSCAN) == []


def test_kill9_deletes_the_clients_temporary_queue(harness, observer):
    child = spawn("client_child.py", harness.url, "temp")
    try:
        name = expect_line(child, "temp ")
    finally:
        kill(child)
    from bridgemgr.jms import TemporaryQueue

    producer = observer.create_session().create_producer(TemporaryQueue(name))
    deadline = time.monotonic() + 5
    with pytest.raises(InvalidDestinationException, match="no longer exists"):
        while time.monotonic() < deadline:
            producer.send(TextMessage("late"))
            time.sleep(0.02)


def test_service_killed_and_restarted_under_connected_clients(tmp_path):
    """Clients fail with a clear error, reconnect to the restarted service (found again
    through the port mapper), and find every committed message and no uncommitted one."""
    store, pm_port = tmp_path / "store", free_port()
    service = spawn("service_child.py", store, pm_port, "sync")
    import bridgemgr

    url = f"mq://127.0.0.1:{pm_port}"
    try:
        expect_line(service, "ready ")
        conn = bridgemgr.connect(url, heartbeat=1.0)
        errors: list[Exception] = []
        lost = threading.Event()
        conn.set_exception_listener(lambda e: (errors.append(e), lost.set()))
        conn.start()
        tx = conn.create_session(transacted=True)
        producer = tx.create_producer(SRC)
        for i in range(20):
            producer.send(TextMessage(f"committed {i}"))
        tx.commit()
        producer.send(TextMessage("open"))
        conn.flush()
        consumer = conn.create_session().create_consumer(DST)
        waiting: list[Exception] = []

        def receive():
            try:
                consumer.receive(30)
            except TransportException as exc:
                waiting.append(exc)

        receiver = threading.Thread(target=receive)
        receiver.start()
        time.sleep(0.2)
        kill(service)
        assert lost.wait(10)
        receiver.join(10)
        assert "was lost" in str(errors[0]) and "127.0.0.1" in str(errors[0])
        assert waiting and "was lost" in str(waiting[0])
        with pytest.raises(TransportException, match="was lost"):
            tx.commit()
        conn.close()

        service = spawn("service_child.py", store, pm_port, "sync")
        expect_line(service, "ready ")
        again = bridgemgr.connect(url)
        again.start()
        got = drain(again.create_session().create_consumer(SRC))
        assert sorted(m.text for m in got) == sorted(f"committed {i}" for i in range(20))
        again.close()
    finally:
        if service.poll() is None:
            service.terminate()
            service.wait(10)


def test_clean_service_stop_closes_clients_with_a_clear_error(tmp_path):
    store, pm_port = tmp_path / "store", free_port()
    service = spawn("service_child.py", store, pm_port)
    import bridgemgr

    try:
        expect_line(service, "ready ")
        conn = bridgemgr.connect(f"mq://127.0.0.1:{pm_port}")
        lost = threading.Event()
        errors: list[Exception] = []
        conn.set_exception_listener(lambda e: (errors.append(e), lost.set()))
        service.terminate()
        assert lost.wait(10)
        assert "the jms service is stopping" in str(errors[0])
        assert service.wait(10) == 0
    finally:
        if service.poll() is None:
            service.kill()


def test_confirmed_persistent_sends_survive_kill9_of_the_service(tmp_path):
    """With an fsyncing store a persistent send returns once it is on disk: several
    producers (their answers come from one wait per read, see the service's notes) send
    until the service is killed; after the restart every confirmed message is there."""
    store, pm_port = tmp_path / "store", free_port()
    service = spawn("service_child.py", store, pm_port, "sync")
    import bridgemgr

    url = f"mq://127.0.0.1:{pm_port}"
    confirmed: list[str] = []
    try:
        expect_line(service, "ready ")
        conn = bridgemgr.connect(url, heartbeat=1.0)

        def produce(p: int) -> None:
            producer = conn.create_session().create_producer(SRC)
            for i in range(100_000):
                try:
                    producer.send(TextMessage(f"{p}:{i}"))
                except TransportException:
                    return
                confirmed.append(f"{p}:{i}")

        producers = [threading.Thread(target=produce, args=(p,)) for p in range(4)]
        for t in producers:
            t.start()
        wait_for(lambda: len(confirmed) >= 200, timeout=30)
        kill(service)
        for t in producers:
            t.join(10)
        conn.close()
        service = spawn("service_child.py", store, pm_port, "sync")
        expect_line(service, "ready ")
        again = bridgemgr.connect(url)
        again.start()
        got = {m.text for m in drain(again.create_session().create_consumer(SRC))}
        again.close()
        lost = [text for text in confirmed if text not in got]
        assert not lost, f"{len(lost)} confirmed sends lost, e.g. {lost[:5]}"
    finally:
        if service.poll() is None:
            service.terminate()
            service.wait(10)
