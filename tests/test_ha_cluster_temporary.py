"""Temporary destinations of an HA cluster (docs/ha.md): a temporary queue made on one
instance is the reply-to of a request served on another, whose reply reaches it; gone
with its connection, cluster-wide (providers/embedded/clusterdst.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bridgemgr.jms import InvalidDestinationException, Queue, Topic
from clusterdst_support import cluster_members
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture
def members(postgresql, tmp_path: Path) -> Iterator[Any]:
    yield from cluster_members(postgresql, tmp_path)


def test_a_reply_from_another_instance_reaches_the_requesters_temporary_queue(members):
    start, stack = members
    b1, b2 = start("B1"), start("B2")
    server = b2.connection(stack).create_session()
    requests, answer = server.create_consumer(Queue("requests")), server.create_producer(None)
    requester = b1.connection(stack)
    client = requester.create_session()
    reply_to = client.create_temporary_queue()
    replies = client.create_consumer(reply_to)
    ask = client.create_producer(Queue("requests"))
    for i in range(10):
        request = client.create_text_message(f"q{i}")
        request.reply_to = reply_to
        ask.send(request)
        got = wait_for(lambda: requests.receive(0.05), 20, f"request {i} on B2")
        assert got.text == f"q{i}" and got.reply_to == reply_to
        reply = server.create_text_message(f"a{i}")
        reply.correlation_id = got.message_id
        answer.send(reply, destination=got.reply_to)
        back = wait_for(lambda: replies.receive(0.05), 20, f"reply {i} on B1")
        assert (back.text, back.correlation_id) == (f"a{i}", request.message_id)
    assert replies.receive(0.2) is None
    wait_for(lambda: reply_to.name in b2.queues._temps, 20, "B2 to see B1's temporary queue")
    requester.close()  # its temporary queue goes, cluster-wide
    wait_for(lambda: reply_to.name not in b2.queues._temps, 20, "B2 to see it gone")
    with pytest.raises(InvalidDestinationException, match="no longer exists"):
        answer.send(server.create_text_message("late"), destination=reply_to)


def test_a_temporary_topic_gets_a_publish_from_another_instance(members):
    start, stack = members
    b1, b2 = start("B1"), start("B2")
    session = b1.connection(stack).create_session()
    events = session.create_temporary_topic()
    one, two = session.create_consumer(events), session.create_consumer(events)
    publisher = b2.connection(stack).create_session()
    publisher.create_producer(events).send(publisher.create_text_message("e"))
    assert wait_for(lambda: one.receive(0.05), 20, "on the first").text == "e"
    assert wait_for(lambda: two.receive(0.05), 20, "on the second").text == "e"
    assert isinstance(events, Topic)


def test_serve_instances_request_and_reply_over_mq_with_a_temporary_queue(tmp_path, postgresql):
    from bridgemgr import connect
    from bridgemgr.jms import TextMessage
    from ha_support import PASSWORD, Cluster

    cluster = Cluster(tmp_path, postgresql, {}, "imq.bridge.enabled=false")
    try:
        b1, b2 = cluster.start("B1", ""), cluster.start("B2", "")
        with (
            connect(f"mq://{b1.address}", "admin", PASSWORD) as requester,
            connect(f"mq://{b2.address}", "admin", PASSWORD) as server,
        ):
            requester.start()
            server.start()
            client, service = requester.create_session(), server.create_session()
            reply_to = client.create_temporary_queue()
            assert reply_to.name.startswith("temp.B1.")
            replies, requests = client.create_consumer(reply_to), service.create_consumer(Queue("rpc"))
            answer = service.create_producer(None)
            request = TextMessage("ping")
            request.reply_to = reply_to
            client.create_producer(Queue("rpc")).send(request)
            got = wait_for(lambda: requests.receive(0.1), 30, "the request on B2")
            answer.send(TextMessage("pong"), destination=got.reply_to)
            assert wait_for(lambda: replies.receive(0.1), 30, "the reply on B1").text == "pong"
            assert replies.receive(0.3) is None
    finally:
        cluster.stop()
