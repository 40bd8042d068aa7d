"""The management port (imq.console.port) of a real service in this process: the REST API
for bridges, links, destinations, transactions and properties over HTTP; its refusals
(401 without or with wrong credentials, 403 to a user who may only read and to a request
that could come from another site); the throttle, the connection caps, the login timeout;
secrets redacted; the OpenAPI document listing every path served."""

from __future__ import annotations

import base64
import http.client
import json
import logging
import socket
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from bridgemgr.admin.clierror import reply_object
from bridgemgr.admin.portmapper import find_service
from bridgemgr.admin.protocol import Command
from bridgemgr.guard import LoginThrottle, ThrottleSettings
from bridgemgr.jms import Queue, TextMessage
from service_support import console_service_overrides
from waiting import wait_for

# a real service (its start takes a second or two): the slow tier
pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

PASSWORD = "adm1n-s3cret"
VIEWER = ("viewer", "v1ewer-pw")
MAX_CONNECTIONS = 6
MAX_UNAUTHENTICATED = 3
LOGIN_TIMEOUT = 3
THROTTLE = ThrottleSettings(base_delay=0.1, max_delay=0.8)
JSON = {"Content-Type": "application/json"}

XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb">
  <link name="l1" transacted="false">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst" message-transformer-class="failonbad.FailOnBad"
            consume-no-transfer-on-transform-error="true"/>
  </link>
  <dmq name="far-dmq" connection-factory-ref="far" destination-ref="dst" enabled="false"/>
  <connection-factory ref-name="host"/>
  <connection-factory ref-name="far">
    <property name="imqAddressList" value="mq://127.0.0.1:1"/>
  </connection-factory>
  <destination ref-name="src" name="cq.src"/>
  <destination ref-name="dst" name="cq.dst"/>
</jmsbridge>
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    from bridgemgr.props import load_properties
    from bridgemgr.service import BridgeServiceManager

    base: Path = tmp_path_factory.mktemp("console")
    overrides = console_service_overrides(
        base,
        XML,
        PASSWORD,
        f"imq.console.login.timeout={LOGIN_TIMEOUT}",
        f"imq.console.max_connections={MAX_CONNECTIONS}",
        f"imq.console.max_unauthenticated_per_address={MAX_UNAUTHENTICATED}",
    )
    reloaded: list[str] = []  # what a test adds for a SIGHUP
    manager = BridgeServiceManager(
        load_properties(overrides=overrides), read_properties=lambda: load_properties(overrides=overrides + reloaded)
    )
    manager.reloaded = reloaded
    manager.login_throttle = LoginThrottle(THROTTLE)
    manager.start()
    try:
        manager.users.add(*VIEWER, group="user")
        wait_for(
            lambda: manager.dispatch(Command("LIST")).data["bridges"][0]["state"] == "STARTED", 30, "bridge jb started"
        )
        yield manager
    finally:
        manager.stop()


def auth(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


ADMIN = auth("admin", PASSWORD)
READER = auth(*VIEWER)


def call(service, method: str, path: str, headers: dict[str, str] | None = None, body: object = None):
    """(status, JSON answer, response headers) of one request on a new connection."""
    conn = http.client.HTTPConnection("127.0.0.1", service.console.port, timeout=30)
    try:
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        conn.request(method, "/api/v1" + path, body=data, headers=headers or {})
        response = conn.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else None, dict(response.getheaders())
    finally:
        conn.close()


def get(service, path: str, headers: dict[str, str] = ADMIN):
    status, answer, _ = call(service, "GET", path, headers)
    return status, answer


def post(service, path: str, body: object = None, headers: dict[str, str] = ADMIN, method: str = "POST"):
    status, answer, _ = call(service, method, path, {**JSON, **headers}, body)
    return status, answer


def link_state(service) -> str:
    return get(service, "/bridges/jb/links/l1")[1]["data"]["links"][0]["state"]


def refused_three_ways(service, method: str, path: str, body: object = None) -> None:
    """A changing request refused: 401 without credentials, 403 to a user who may only
    read, 403 without the JSON content type (what a cross-site form would send)."""
    status, answer = post(service, path, body, headers={}, method=method)
    assert status == 401 and answer["error"]["code"] == 401, answer
    status, answer = post(service, path, body, headers=READER, method=method)
    assert status == 403 and "may only read" in answer["message"], answer
    status, answer, _ = call(service, method, path, {**ADMIN, "Content-Type": "application/x-www-form-urlencoded"}, b"")
    assert status == 403 and "Content-Type: application/json" in answer["message"], answer


# --- bridges and links -------------------------------------------------------------------------


def test_bridges_and_links_show_what_the_admin_command_shows(service):
    status, answer = get(service, "/bridges")
    assert status == 200 and answer["data"]["bridges"] == [{"name": "jb", "type": "JMS", "state": "STARTED"}]
    assert get(service, "/bridges?type=STOMP")[1]["data"]["bridges"] == []
    status, answer = get(service, "/bridges?links=true", READER)  # the overview's one request
    assert status == 200 and [b["name"] for b in answer["data"]["bridges"]] == ["jb"], answer
    assert [x["name"] for x in answer["data"]["bridges"][0]["links"]] == ["l1"]
    assert answer["data"]["bridges"][0]["links"][0]["counters"]["latency_ms"]["bounds"]
    assert get(service, "/bridges?links=maybe")[0] == 400
    status, answer = get(service, "/bridges/jb", READER)  # reading needs no right to act
    assert status == 200 and answer["data"]["bridge"]["name"] == "jb"
    status, answer = get(service, "/bridges/jb/links/l1")
    (link,) = answer["data"]["links"]
    same = service.dispatch(Command("LIST", bridge="jb", link="l1")).data["links"][0]
    assert link.keys() == same.keys() and link["name"] == "l1" and link["state"] == "STARTED"


def test_a_failure_is_the_clis_json_object_with_the_same_code(service):
    for path, cmd in (
        ("/bridges/nosuch", Command("LIST", bridge="nosuch")),
        ("/bridges/jb/links/nosuch", Command("LIST", bridge="jb", link="nosuch")),
    ):
        status, answer = get(service, path)
        assert status == 404 and answer == reply_object(service.dispatch(cmd))
    status, answer = get(service, "/bridges?type=MQTT")  # the admin protocol's own check
    assert status == 400 and answer["error"] == {"message": "bridge type 'MQTT' is not JMS or STOMP", "code": 400}


def test_link_and_bridge_actions_change_state_and_are_refused_to_others(service, caplog):
    refused_three_ways(service, "POST", "/bridges/jb/links/l1/stop")
    assert link_state(service) == "STARTED"  # no refused request did anything
    with caplog.at_level(logging.INFO, logger="bridgemgr.console.api"):
        assert post(service, "/bridges/jb/links/l1/pause")[1]["data"] == {"state": "PAUSED"}
        assert post(service, "/bridges/jb/links/l1/resume")[1]["data"] == {"state": "STARTED"}
        assert post(service, "/bridges/jb/links/l1/stop")[1]["data"] == {"state": "STOPPED"}
        assert link_state(service) == "STOPPED"
        assert post(service, "/bridges/jb/links/l1/start")[1]["data"] == {"state": "STARTED"}
    assert "user 'admin' from 127.0.0.1: POST /api/v1/bridges/jb/links/l1/stop -> 200" in caplog.text
    refused_three_ways(service, "POST", "/bridges/jb/pause")
    assert post(service, "/bridges/jb/pause")[1]["data"] == {"state": "PAUSED"}
    assert post(service, "/bridges/jb/resume")[1]["data"] == {"state": "STARTED"}
    assert post(service, "/bridges/jb/stop")[1]["data"] == {"state": "STOPPED"}
    assert post(service, "/bridges/jb/start")[1]["data"]["state"] in ("STARTING", "STARTED")
    wait_for(lambda: get(service, "/bridges/jb")[1]["data"]["bridge"]["state"] == "STARTED", 30)


@pytest.mark.timeout(60)
def test_a_links_last_hour_is_kept_by_the_service(service):
    """The bridge samples its links every 5 s whether or not a page is open: messages
    sent after a sample show in the interval that the next one ends."""

    def intervals(reader=READER):
        status, answer = get(service, "/bridges/jb/links/l1/history", reader)
        assert status == 200 and answer["data"]["step"] == 5, answer
        return answer["data"]["intervals"]

    last = wait_for(intervals, 30, "a first interval")[-1]["end"]
    send(service, "cq.src", *(f"history {i}" for i in range(7)))
    later = wait_for(lambda: [i for i in intervals() if i["end"] > last] or None, 30, "the next interval")
    wait_for(lambda: sum(i["transferred"] for i in intervals() if i["end"] > last) >= 7, 30, "the transfers")
    busy = [i for i in intervals() if i["end"] > last and i["transferred"]]
    assert all(i["rate"] > 0 and i["latency_ms"] is not None for i in busy), later
    assert get(service, "/bridges/jb/links/nosuch/history")[0] == 404


def test_a_moving_links_get_is_answered_on_the_loop_without_the_brokers_lock(service, monkeypatch):
    """While a link moves, its GET is answered from what its thread published (counters
    and the backlog it read), on the port's loop: a thread holding the host broker's lock
    does not hold the answer up (before, a worker thread read the backlog under that lock
    and the request waited for it)."""
    from bridgemgr.jmsbridge import link as link_module

    monkeypatch.setattr(link_module, "PUBLISHED_FRESH", 60.0)  # what it published stays fresh
    before = get(service, "/bridges/jb/links/l1")[1]["data"]["links"][0]["counters"]["transferred"]
    send(service, "cq.src", "published 1", "published 2")
    wait_for(
        lambda: get(service, "/bridges/jb/links/l1")[1]["data"]["links"][0]["counters"]["transferred"] >= before + 2,
        30,
        "the link moved the messages",
    )
    conn = http.client.HTTPConnection("127.0.0.1", service.console.port, timeout=5)
    try:
        with service.host_broker.broker.lock:
            start = time.monotonic()
            conn.request("GET", "/api/v1/bridges/jb/links/l1", headers=ADMIN)
            response = conn.getresponse()
            answer = json.loads(response.read())
            took = time.monotonic() - start
    finally:
        conn.close()
    assert response.status == 200 and took < 5, (response.status, took)
    (link,) = answer["data"]["links"]
    same = service.dispatch(Command("LIST", bridge="jb", link="l1")).data["links"][0]
    assert link.keys() == same.keys() and link["state"] == "STARTED" and isinstance(link["backlog"], int)
    assert link["counters"]["transferred"] >= before + 2


def test_the_cluster_of_a_service_in_no_cluster_is_404(service):
    status, answer = get(service, "/cluster", READER)
    assert status == 404 and answer == reply_object(service.dispatch(Command("CLUSTER")))
    assert "imq.cluster.ha" in answer["message"]


# --- destinations ------------------------------------------------------------------------------


def send(service, queue: str, *texts: str) -> None:
    conn = service.host_broker.connection_factory().create_connection("admin")
    try:
        producer = conn.create_session().create_producer(Queue(queue))
        for text in texts:
            producer.send(TextMessage(text))
    finally:
        conn.close()


def test_destinations_create_query_update_list_browse_purge(service):
    created = {"type": "q", "name": "api.q1", "attributes": {"maxNumMsgs": "50"}}
    refused_three_ways(service, "POST", "/destinations", created)
    status, answer = post(service, "/destinations", created)
    assert status == 200, answer
    status, answer = post(service, "/destinations", created)  # exists: the command's own refusal
    assert status == 400 and answer["error"]["code"] == 400
    status, answer = get(service, "/destinations/q/api.q1", READER)
    assert status == 200 and answer["data"]["attributes"]["maxNumMsgs"] == 50, answer

    change = {"attributes": {"maxNumMsgs": "70"}}
    refused_three_ways(service, "PATCH", "/destinations/q/api.q1", change)
    assert post(service, "/destinations/q/api.q1", change, method="PATCH")[0] == 200
    assert get(service, "/destinations/q/api.q1")[1]["data"]["attributes"]["maxNumMsgs"] == 70
    status, answer = post(service, "/destinations/q/api.q1", {"attributes": {"maxNumMsgs": "lots"}}, method="PATCH")
    assert status == 400 and "maxNumMsgs='lots'" in answer["message"]

    names = [d["name"] for d in get(service, "/destinations?type=q")[1]["data"]["destinations"]]
    assert "api.q1" in names

    send(service, "api.q1", "one", "two", "three")
    status, answer = get(service, "/destinations/q/api.q1/messages?count=2")
    assert status == 200 and [m["body"] for m in answer["data"]["messages"]] == ["one", "two"], answer
    status, page = get(service, f"/destinations/q/api.q1/messages?count=2&after={answer['data']['next']}")
    assert [m["body"] for m in page["data"]["messages"]] == ["three"] and page["data"]["next"] is None, page
    status, page = get(service, "/destinations/q/api.q1/messages?after=ID:gone-1")
    assert status == 404 and "no longer waiting" in page["error"]["message"], page
    assert get(service, "/destinations/q/api.q1/messages", READER)[0] == 403  # bodies: for those who act
    assert get(service, "/destinations/q/api.q1/messages?count=lots")[0] == 400

    refused_three_ways(service, "POST", "/destinations/q/api.q1/purge")
    assert len(get(service, "/destinations/q/api.q1/messages")[1]["data"]["messages"]) == 3
    status, answer = post(service, "/destinations/q/api.q1/purge")
    assert status == 200 and answer["data"]["purged"] == 3
    assert get(service, "/destinations/q/api.q1/messages")[1]["data"]["messages"] == []


def test_destinations_pause_resume_and_destroy_as_the_admin_commands(service):
    assert post(service, "/destinations", {"type": "q", "name": "api.q2"})[0] == 200
    send(service, "api.q2", "kept")
    refused_three_ways(service, "POST", "/destinations/q/api.q2/pause?what=CONSUMERS")
    status, answer = post(service, "/destinations/q/api.q2/pause?what=CONSUMERS")
    assert status == 200, answer
    assert get(service, "/destinations/q/api.q2", READER)[1]["data"]["state"] == "CONSUMERS_PAUSED"
    assert post(service, "/destinations/q/api.q2/pause?what=SOME")[0] == 400
    refused_three_ways(service, "POST", "/destinations/q/api.q2/resume")
    assert post(service, "/destinations/q/api.q2/resume")[0] == 200
    assert get(service, "/destinations/q/api.q2")[1]["data"]["state"] == "RUNNING"

    refused_three_ways(service, "DELETE", "/destinations/q/api.q2")
    status, answer = post(service, "/destinations/q/api.q2", method="DELETE")
    assert status == 200, answer
    assert get(service, "/destinations/q/api.q2")[0] == 404
    assert post(service, "/destinations/q/api.q2", method="DELETE")[0] == 404


def test_connections_for_admins_and_services_for_all(service):
    status, answer = get(service, "/connections")
    assert status == 200 and answer["data"]["connections"], answer
    assert get(service, "/connections", READER)[0] == 403
    status, answer = get(service, "/services", READER)
    assert status == 200 and {s["state"] for s in answer["data"]["services"]} == {"RUNNING"}, answer
    assert "console" in {s["name"] for s in answer["data"]["services"]}


def test_the_dmq_shows_dead_messages_with_their_reason_and_bridge_properties(service):
    send(service, "cq.src", "bad one")

    def entries():
        status, answer = get(service, "/dmq/jb?count=10")
        assert status == 200, answer
        return [(d["name"], e) for d in answer["data"]["dmqs"] for e in d["entries"] or []]

    ((dmq, entry),) = wait_for(entries, 20, "the dead message")
    far = get(service, "/dmq/jb")[1]["data"]["dmqs"][1]
    assert far == {"name": "far-dmq", "destination": None, "entries": None}  # on another broker: named only
    assert entry["reason"] == "TRANSFORM_FAILURE" and dmq == "built-in-dmq", entry
    assert entry["bridgeProperties"]["JMS_SUN_JMSBRIDGE_SOURCE_DESTINATION"] == "cq.src"
    assert "bad message" in entry["bridgeProperties"]["JMS_SUN_JMSBRIDGE_DMQ_EXCEPTION"]
    assert entry["original"]["body"] == "bad one" and entry["message"]["body_type"] == "OBJECT"
    assert get(service, "/dmq/jb?count=10")[1] == reply_object(
        service.dispatch(Command("LIST_DMQ", bridge="jb", count=10))
    )
    assert get(service, "/dmq/jb", READER)[0] == 403  # message bodies: for those who act
    assert get(service, "/dmq/nosuch")[0] == 404 and get(service, "/dmq/jb?count=0")[0] == 400


def dead_letters(service, *texts: str) -> list[tuple[str, str]]:
    """Send ``texts`` (each with "bad", so the link dead-letters them) and wait for their
    DMQ entries: [(the entry's JMSMessageID, the original's JMSMessageID)], in send order."""
    conn = service.host_broker.connection_factory().create_connection("admin")
    try:
        producer = conn.create_session().create_producer(Queue("cq.src"))
        sources = []
        for text in texts:
            message = TextMessage(text)
            producer.send(message)
            sources.append(message.message_id)
    finally:
        conn.close()

    def entries():
        found = {
            e["bridgeProperties"]["JMS_SUN_JMSBRIDGE_SOURCE_MESSAGEID"]: e["message"]["message_id"]
            for d in get(service, "/dmq/jb?count=1000")[1]["data"]["dmqs"]
            for e in d["entries"] or []
        }
        return [(found[s], s) for s in sources] if all(s in found for s in sources) else None

    return wait_for(entries, 20, "the dead messages")


def redriven(service, source_id: str) -> list[dict]:
    """The messages on the link's target cq.dst that are copies of ``source_id``."""
    status, answer = get(service, "/destinations/q/cq.dst/messages?count=1000")
    if status == 404:  # nothing reached the target yet
        return []
    messages = answer["data"]["messages"]
    return [m for m in messages if m["properties"].get("JMS_SUN_JMSBRIDGE_SOURCE_MESSAGEID") == source_id]


def dmq_ids(service) -> set[str]:
    answer = get(service, "/dmq/jb?count=1000")[1]
    return {e["message"]["message_id"] for d in answer["data"]["dmqs"] for e in d["entries"] or []}


def test_dmq_entries_chosen_by_id_are_redriven_to_their_links_target(service):
    (first, first_source), (second, _) = dead_letters(service, "bad redrive-1", "bad redrive-2")
    chosen = {"message_ids": [first]}
    refused_three_ways(service, "POST", "/dmq/jb/redrive", chosen)
    assert {first, second} <= dmq_ids(service)
    status, answer = post(service, "/dmq/jb/redrive", chosen)
    assert status == 200, answer
    assert answer["data"]["moved"] == 1 and answer["data"]["entries"] == [
        {"message_id": first, "status": "redriven", "link": "l1", "destination": "queue:cq.dst", "detail": None}
    ]
    ((copy,),) = (redriven(service, first_source),)  # once, with the original's body and properties
    assert copy["body"] == "bad redrive-1" and not any("DMQ" in name for name in copy["properties"])
    assert first not in dmq_ids(service) and second in dmq_ids(service)
    status, answer = post(service, "/dmq/jb/redrive", chosen)  # again: it is gone, nothing is sent twice
    assert status == 200 and answer["data"]["entries"][0]["status"] == "gone"
    assert len(redriven(service, first_source)) == 1
    assert post(service, "/dmq/jb/redrive", {})[0] == 400  # neither ids nor all
    assert post(service, "/dmq/jb/redrive", {"all": True, "message_ids": [second]})[0] == 400
    assert post(service, "/dmq/jb/redrive", {"all": True, "dmq": "far-dmq"})[0] == 400  # on another broker
    assert post(service, "/dmq/nosuch/redrive", {"all": True})[0] == 404
    assert post(service, "/dmq/jb/redrive", {"message_ids": [second]})[1]["data"]["moved"] == 1  # (tidy)


def test_an_entry_its_target_refuses_stays_in_the_dmq_and_is_sent_nowhere(service):
    """The first entry's send is refused (too big for the target now): its transaction rolls
    back, and the commit of the next entry's does not take the first one from the DMQ."""
    (big, big_source), (small, small_source) = dead_letters(service, "bad " + "x" * 2000, "bad small")
    post(service, "/destinations", {"type": "q", "name": "cq.dst"})  # (400 when it exists already)
    limit = {"attributes": {"maxBytesPerMsg": "1k"}}
    assert post(service, "/destinations/q/cq.dst", limit, method="PATCH")[0] == 200
    try:
        status, answer = post(service, "/dmq/jb/redrive", {"message_ids": [big, small]})
    finally:
        post(service, "/destinations/q/cq.dst", {"attributes": {"maxBytesPerMsg": "-1"}}, method="PATCH")
    assert status == 500 and "1 of 2 entries redriven, 1 failed" in answer["message"], answer
    outcomes = {e["message_id"]: e for e in answer["data"]["entries"]}
    assert outcomes[big]["status"] == "failed" and "rolled back" in outcomes[big]["detail"], outcomes
    assert outcomes[small]["status"] == "redriven" and len(redriven(service, small_source)) == 1
    assert big in dmq_ids(service) and redriven(service, big_source) == []
    status, answer = post(service, "/dmq/jb/redrive", {"message_ids": [big]})  # the limit lifted: it goes
    assert status == 200 and answer["data"]["moved"] == 1 and len(redriven(service, big_source)) == 1


def test_a_forged_dmq_entry_is_not_redriven(service):
    from bridgemgr.jmsbridge.config import BUILTIN_DMQ_DESTINATION

    forged = TextMessage("forged")
    forged.set_string_property("JMS_SUN_JMSBRIDGE_SOURCE_DESTINATION", "cq.src")
    forged.set_string_property("JMS_SUN_JMSBRIDGE_TARGET_DESTINATION", "cq.dst")
    conn = service.host_broker.connection_factory().create_connection("admin")
    try:
        conn.create_session().create_producer(Queue(BUILTIN_DMQ_DESTINATION)).send(forged)
    finally:
        conn.close()
    status, answer = post(service, "/dmq/jb/redrive", {"message_ids": [forged.message_id]})
    assert status == 200 and answer["data"]["entries"][0]["status"] == "unverified", answer
    assert forged.message_id in dmq_ids(service)
    assert post(service, "/dmq/jb/archive", {"message_ids": [forged.message_id]})[0] == 200  # (tidy)


def test_the_redrive_dmq_command_does_what_the_api_does(service, tmp_path):
    from bridgemgr.cli import main

    ((entry, source),) = dead_letters(service, "bad redrive-cli")
    passfile = tmp_path / "pw"
    passfile.write_text(f"imq.imqbridgemgr.password={PASSWORD}\n")
    passfile.chmod(0o600)
    login = ["-b", f"127.0.0.1:{service.portmapper.port}", "-u", "admin", "-passfile", str(passfile)]
    result = CliRunner().invoke(main, ["redrive", "dmq", "-bn", "jb", "-msgid", entry, "-f", "--json", *login])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    assert answer["data"]["entries"][0]["status"] == "redriven" and len(redriven(service, source)) == 1
    again = CliRunner().invoke(main, ["redrive", "dmq", "-bn", "jb", "-msgid", entry, "-f", "--json", *login])
    status, api = post(service, "/dmq/jb/redrive", {"message_ids": [entry]})
    assert status == 200 and json.loads(again.output) == api  # the same code, the same answer
    usage = CliRunner().invoke(main, ["redrive", "dmq", "-bn", "jb", "-f", *login])
    assert usage.exit_code == 2 and "-msgid ID (one or more) or -all" in usage.output


def test_archived_dmq_entries_leave_the_dmq_for_a_private_file_once(service):
    import os
    import stat

    (first, first_source), (second, _) = dead_letters(service, "bad archive-1", "bad archive-2")
    path = service.instance_dir / "dmqarchive" / "jb" / "built-in-dmq.jsonl"
    if path.exists():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"dmq_message_id": second}) + "\n")  # a crash after the write, before the removal
    refused_three_ways(service, "POST", "/dmq/jb/archive", {"message_ids": [first]})
    status, answer = post(service, "/dmq/jb/archive", {"message_ids": [first, second]})
    assert status == 200 and answer["data"]["moved"] == 2 and answer["data"]["archive"] == str(path), answer
    assert {first, second}.isdisjoint(dmq_ids(service))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["dmq_message_id"] for r in rows] == [second, first]  # the second not written twice
    assert rows[1]["JMS_SUN_JMSBRIDGE_SOURCE_MESSAGEID"] == first_source and rows[1]["reason"] == "TRANSFORM_FAILURE"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and redriven(service, first_source) == []


def test_check_is_a_dry_run_with_the_check_commands_problems(service, tmp_path):
    from bridgemgr.cli import main

    good = XML.replace('name="jb"', 'name="checked"')
    refused_three_ways(service, "POST", "/check", {"xml": good})
    status, answer = post(service, "/check", {"xml": good, "name": "checked.xml"})
    assert status == 200, answer
    assert answer["data"]["summary"][0].startswith("bridge checked (jms, XML file): checked.xml: 1 link, 2 DMQs")
    assert "transformer failonbad.FailOnBad" in answer["data"]["summary"][1]  # found in the service's plugins
    assert [b["name"] for b in get(service, "/bridges")[1]["data"]["bridges"]] == ["jb"]  # nothing started

    bad = good.replace('destination-ref="dst" message', 'destination-ref="nodst" message')
    path = tmp_path / "bad.xml"
    path.write_text(bad)
    status, answer = post(service, "/check", {"xml": bad, "name": str(path)})
    result = CliRunner().invoke(main, ["check", "--json", str(path)])
    cli = json.loads(result.output)
    assert status == 400 and result.exit_code == 1
    assert answer["error"] == cli["error"] and answer["data"]["problems"] == cli["problems"], (answer, cli)
    assert "destination-ref 'nodst' matches no <destination" in answer["message"]
    status, answer = post(service, "/check", {"xml": "<jmsbridge"})
    assert status == 400 and "bridge.xml:1" in answer["message"], answer
    assert post(service, "/check", {})[0] == 400


def test_transactions_answer_as_the_admin_command(service):
    status, answer = get(service, "/bridges/jb/transactions")
    assert (status, answer) == (answer["status"], reply_object(service.dispatch(Command("LIST_TXN", bridge="jb"))))
    refused_three_ways(service, "POST", "/bridges/jb/transactions/jb%7Cnone.1/commit")
    for action, op in (("commit", "COMMIT_TXN"), ("rollback", "ROLLBACK_TXN")):
        status, answer = post(service, f"/bridges/jb/transactions/jb%7Cnone.1/{action}")
        assert answer == reply_object(service.dispatch(Command(op, bridge="jb", txn="jb|none.1")))
        assert status == answer["status"] != 200


# --- properties, OpenAPI, headers ----------------------------------------------------------------


def test_properties_are_shown_with_secrets_redacted(service):
    status, answer, _ = call(service, "GET", "/properties", READER)
    assert status == 200
    props = answer["data"]["properties"]
    assert props["imq.console.port"] == "0" and props["imq.bridge.admin.password"] != PASSWORD
    assert PASSWORD not in json.dumps(answer)


def test_properties_are_those_in_force_after_a_reload(service):
    assert "imq.bridge.jb.level" not in get(service, "/properties")[1]["data"]["properties"]
    service.reloaded.append("imq.bridge.jb.level=WARNING")
    try:
        service.reload()
        assert get(service, "/properties")[1]["data"]["properties"]["imq.bridge.jb.level"] == "WARNING"
    finally:
        service.reloaded.clear()
        service.reload()


def test_the_openapi_document_lists_every_path_served(service):
    from starlette.routing import Route

    status, doc = get(service, "/openapi.json", READER)
    assert status == 200 and doc["openapi"].startswith("3.") and doc["info"]["title"]
    app = service.console.config.app.app  # the Starlette app inside the security headers
    api = [r for r in app.routes if isinstance(r, Route) and r.path.startswith("/api/")]  # not the console's pages
    served = {(r.path, m.lower()) for r in api for m in r.methods if m != "HEAD"}
    listed = {(path, method) for path, ops in doc["paths"].items() for method in ops}
    assert served == listed
    for path, ops in doc["paths"].items():
        for op in ops.values():
            declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert declared == set(Route(path, lambda r: None).param_convertors), path
            assert "200" in op["responses"]
    assert len({op["operationId"] for ops in doc["paths"].values() for op in ops.values()}) == len(listed)


def test_every_endpoint_that_acts_is_refused_to_readers_strangers_and_forged_requests(service):
    """Every path of the OpenAPI document whose answer may be 403: 401 without credentials,
    403 to a user who may only read; a changing one also 403 without the JSON content type
    and, by session cookie, without the CSRF token; and the link still runs."""
    _, doc = get(service, "/openapi.json")
    values = {"bridge": "jb", "link": "l1", "txn": "jb%7Cnone.1", "type": "q", "name": "api.none"}
    _, admin_login, admin_headers = log_in(service, "admin", PASSWORD)
    checked = 0
    for template, operations in doc["paths"].items():
        path = template.removeprefix("/api/v1")
        for name, value in values.items():
            path = path.replace("{" + name + "}", value)
        for method, operation in operations.items():
            if "403" not in operation["responses"]:
                continue
            method = method.upper()
            assert call(service, method, path, JSON if method != "GET" else {}, b"{}")[0] == 401, (method, path)
            status, answer, _ = call(service, method, path, {**READER, **JSON}, b"{}")
            assert status == 403 and "may only read" in answer["message"], (method, path, answer)
            if method != "GET":
                form = {**ADMIN, "Content-Type": "text/plain"}
                assert call(service, method, path, form, b"{}")[0] == 403, (method, path)
                cookie = {"Cookie": cookie_of(admin_headers), **JSON}
                status, answer, _ = call(service, method, path, cookie, b"{}")
                assert status == 403 and "X-CSRF-Token" in answer["message"], (method, path, answer)
            checked += 1
    # 8 bridge and link actions, 2 txn, 8 dst/dmq (create, update, purge, browse, destroy, pause,
    # resume, dmq), dmq redrive and archive, check, the connections
    assert checked == 22 and admin_login["data"]["mayAct"] is True
    assert link_state(service) == "STARTED"
    assert get(service, "/bridges")[1]["data"]["bridges"][0]["state"] == "STARTED"


def test_every_answer_has_the_security_headers_and_unknown_paths_are_json(service):
    status, answer, headers = call(service, "GET", "/nosuch", ADMIN)
    assert status == 404 and answer["error"]["code"] == 404
    for _, headers in (call(service, "GET", "/bridges", ADMIN)[1:], call(service, "GET", "/bridges")[1:]):
        assert "default-src 'none'" in headers["content-security-policy"]
        assert headers["x-content-type-options"] == "nosniff" and headers["cache-control"] == "no-store"
    status, answer, _ = call(service, "DELETE", "/bridges", {**ADMIN, **JSON})
    assert status == 405 and answer["error"]["code"] == 405


def test_the_port_mapper_lists_the_console(service):
    entry = find_service("127.0.0.1", service.portmapper.port, ("console",))
    assert (entry.port, entry.protocol) == (service.console.port, "http")


def test_a_request_from_another_origin_is_refused_even_with_credentials(service):
    headers = {**ADMIN, **JSON, "Origin": "http://evil.example"}
    status, answer, _ = call(service, "POST", "/bridges/jb/links/l1/stop", headers, b"")
    assert status == 403 and "evil.example" in answer["message"] and link_state(service) == "STARTED"
    own = f"http://127.0.0.1:{service.console.port}"
    status, _, _ = call(service, "POST", "/bridges/jb/links/l1/pause", {**ADMIN, **JSON, "Origin": own}, b"")
    assert status == 200
    assert post(service, "/bridges/jb/links/l1/resume")[0] == 200


def test_a_body_over_the_limit_is_refused(service):
    status, answer = post(service, "/destinations", {"type": "q", "name": "big", "pad": "x" * 70_000})
    assert status == 413 and answer["error"]["code"] == 413
    assert get(service, "/destinations/q/big")[0] == 404


# --- the guards ----------------------------------------------------------------------------------


def test_wrong_credentials_get_401_and_the_password_is_never_logged(service, caplog):
    with caplog.at_level(logging.INFO):
        for headers in (
            auth("admin", "wrong-guess-77"),
            auth("nobody", "wrong-guess-77"),
            {"Authorization": "Bearer x"},
        ):
            status, answer, response_headers = call(service, "GET", "/bridges", headers)
            assert status == 401 and answer["error"]["code"] == 401
            assert response_headers["www-authenticate"].startswith("Basic")
    assert "wrong-guess-77" not in caplog.text and "management login failed for user 'nobody'" in caplog.text


def test_failed_logins_slow_the_next_request_of_that_address_whatever_the_user(service):
    """Four failures leave 0.8 s on the address, which a request of another user (whose
    password check is cached: it takes milliseconds) must wait out too; on a per-user
    throttle alone it would not wait."""
    assert call(service, "GET", "/bridges", READER)[0] == 200
    for _ in range(4):
        assert call(service, "GET", "/bridges", auth("mallory", "guess"))[0] == 401
    start = time.monotonic()
    assert call(service, "GET", "/bridges", READER)[0] == 200  # another user, the same address
    assert time.monotonic() - start >= THROTTLE.max_delay / 2


def idle_socket(service) -> socket.socket:
    return socket.create_connection(("127.0.0.1", service.console.port), timeout=10)


def refusal(sock: socket.socket) -> str:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data.decode()


def test_connections_without_credentials_are_capped_per_address_and_closed_after_the_timeout(service):
    start = time.monotonic()
    idle = [idle_socket(service) for _ in range(MAX_UNAUTHENTICATED)]
    try:
        with idle_socket(service) as extra:
            text = refusal(extra)
        assert text.startswith("HTTP/1.1 503") and "max_unauthenticated_per_address=3" in text, text
        assert refusal(idle[0]) == ""  # closed, without a word, after the login timeout
        assert LOGIN_TIMEOUT - 0.05 <= time.monotonic() - start <= LOGIN_TIMEOUT + 5
    finally:
        for sock in idle:
            sock.close()
    wait_for(lambda: get(service, "/bridges")[0] == 200, 10)


def test_connections_over_the_cap_get_503(service):
    kept = []
    for _ in range(MAX_CONNECTIONS - 1):  # logged in, kept alive
        conn = http.client.HTTPConnection("127.0.0.1", service.console.port, timeout=10)
        conn.request("GET", "/api/v1/bridges", headers=ADMIN)
        assert conn.getresponse().read()
        kept.append(conn)
    try:
        with idle_socket(service), idle_socket(service) as last:  # the cap's last place, then one more
            last.sendall(b"GET /api/v1/bridges HTTP/1.1\r\nHost: x\r\n\r\n")
            text = refusal(last)
        assert text.startswith("HTTP/1.1 503") and "imq.console.max_connections=6" in text, text
    finally:
        for conn in kept:
            conn.close()
    wait_for(lambda: get(service, "/bridges")[0] == 200, 10)


# --- browser sessions ----------------------------------------------------------------------------


def log_in(service, user: str, password: str) -> tuple[int, dict, dict[str, str]]:
    return call(service, "POST", "/session", JSON, {"user": user, "password": password})


def cookie_of(headers: dict[str, str]) -> str:
    return headers["set-cookie"].split(";", 1)[0]


def test_a_session_cookie_is_httponly_samesite_strict_and_expires(service):
    status, answer, _ = log_in(service, "admin", "wrong-session-pw")
    assert status == 401 and "wrong-session-pw" not in json.dumps(answer)
    status, answer, headers = log_in(service, "admin", PASSWORD)
    assert status == 200 and answer["data"]["user"] == "admin" and answer["data"]["mayAct"] is True
    attributes = [a.strip().lower() for a in headers["set-cookie"].split(";")]
    assert "httponly" in attributes and "samesite=strict" in attributes and "path=/" in attributes
    assert "max-age=1800" in attributes and "secure" not in attributes  # (plain HTTP: see test_console_tls)
    assert PASSWORD not in json.dumps(answer) and PASSWORD not in headers["set-cookie"]
    cookie = {"Cookie": cookie_of(headers)}
    status, who, _ = call(service, "GET", "/session", cookie)
    assert status == 200 and who["data"]["csrfToken"] == answer["data"]["csrfToken"]
    assert call(service, "GET", "/bridges", cookie)[0] == 200


def test_a_change_by_session_needs_its_csrf_token(service):
    _, answer, headers = log_in(service, "admin", PASSWORD)
    cookie, token = {"Cookie": cookie_of(headers)}, answer["data"]["csrfToken"]
    for extra in ({}, {"X-CSRF-Token": "forged"}):
        status, refused, _ = call(service, "POST", "/bridges/jb/links/l1/pause", {**cookie, **JSON, **extra}, b"")
        assert status == 403 and "X-CSRF-Token" in refused["message"]
    assert link_state(service) == "STARTED"
    headers = {**cookie, **JSON, "X-CSRF-Token": token}
    assert call(service, "POST", "/bridges/jb/links/l1/pause", headers, b"")[1]["data"] == {"state": "PAUSED"}
    assert call(service, "POST", "/bridges/jb/links/l1/resume", headers, b"")[1]["data"] == {"state": "STARTED"}
    _, answer, viewer = log_in(service, *VIEWER)
    assert answer["data"]["mayAct"] is False
    headers = {"Cookie": cookie_of(viewer), **JSON, "X-CSRF-Token": answer["data"]["csrfToken"]}
    status, refused, _ = call(service, "POST", "/bridges/jb/links/l1/pause", headers)
    assert status == 403 and "may only read" in refused["message"]


def test_logging_out_ends_the_session(service):
    _, answer, headers = log_in(service, *VIEWER)
    cookie = {"Cookie": cookie_of(headers)}
    assert call(service, "DELETE", "/session", cookie)[0] == 403  # logging out changes something
    status, _, out = call(
        service, "DELETE", "/session", {**cookie, **JSON, "X-CSRF-Token": answer["data"]["csrfToken"]}
    )
    assert status == 200 and "max-age=0" in out["set-cookie"].lower()
    status, answer, _ = call(service, "GET", "/bridges", cookie)
    assert status == 401 and "log in again" in answer["message"]
