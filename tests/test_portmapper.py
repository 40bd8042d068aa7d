"""The port mapper: its text format (the original's), the server on the NetLoop, and the
client lookup."""

from __future__ import annotations

import socket
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridgemgr import __version__
from bridgemgr.admin.portmapper import (
    PortMapper,
    PortMapperError,
    ServiceEntry,
    find_service,
    format_table,
    lookup_services,
    lookup_table,
    parse_table,
)
from bridgemgr.netloop import NetLoop
from ports import free_port


@pytest.fixture
def mapper():
    with NetLoop() as netloop:
        pm = PortMapper(netloop, "127.0.0.1", 0, "imqbroker").start()
        yield pm
        pm.stop()


def read_all(port, send=b""):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        if send:
            sock.sendall(send)
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
        return data


def test_the_table_is_the_original_format(mapper):
    mapper.register(ServiceEntry("jms", "tcp", "NORMAL", 40001))
    mapper.register(ServiceEntry("bridgeadmin", "tcp", "ADMIN", 40002))
    assert read_all(mapper.port, b"101\n").decode() == (
        f"101 imqbroker {__version__}\n"
        f"portmapper tcp PORTMAPPER {mapper.port}\n"
        "jms tcp NORMAL 40001\n"
        "bridgeadmin tcp ADMIN 40002\n"
        ".\n"
    )


def test_a_client_that_sends_nothing_gets_the_table_and_the_end_of_the_stream(mapper):
    assert read_all(mapper.port).endswith(b"\n.\n")


def test_register_replaces_and_unregister_removes_while_running(mapper):
    mapper.register(ServiceEntry("stomp", "tcp", "NORMAL", 7672))
    mapper.register(ServiceEntry("stomp", "tls", "NORMAL", 7673))
    assert find_service("127.0.0.1", mapper.port, ("stomp",)).protocol == "tls"
    mapper.unregister("stomp")
    mapper.unregister("never-there")
    assert [e.name for e in lookup_services("127.0.0.1", mapper.port)] == ["portmapper"]


def test_lookup_names_the_instance_and_finds_the_first_wanted_service(mapper):
    mapper.register(ServiceEntry("jms", "tcp", "NORMAL", 1))
    mapper.register(ServiceEntry("ssljms", "tls", "NORMAL", 2))
    instance, entries = lookup_table("127.0.0.1", mapper.port)
    assert instance == "imqbroker" and len(entries) == 3
    assert find_service("127.0.0.1", mapper.port, ("ssljms", "jms")).port == 2
    with pytest.raises(
        PortMapperError,
        match=r"broker imqbroker at 127.0.0.1:\d+ offers no stomp service "
        r"\(its services: portmapper, jms, ssljms\)",
    ):
        find_service("127.0.0.1", mapper.port, ("stomp",))


def test_a_chatty_client_is_cut_off_and_others_still_get_answers(mapper):
    with socket.create_connection(("127.0.0.1", mapper.port), timeout=5) as sock:
        try:
            sock.sendall(b"x" * 100_000)
        except OSError:
            pass  # closed under us: what we want
    assert read_all(mapper.port, b"101\n").endswith(b"\n.\n")


@pytest.mark.slow
def test_a_silent_client_that_never_closes_is_closed_by_the_server(mapper, monkeypatch):
    import bridgemgr.admin.portmapper as pm_module

    monkeypatch.setattr(pm_module, "_LINGER", 0.1)
    with socket.create_connection(("127.0.0.1", mapper.port), timeout=5) as sock:
        time.sleep(0.3)
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    assert data.endswith(b"\n.\n")


def test_nobody_listening_is_a_clear_error():
    with pytest.raises(
        PortMapperError,
        match=r"cannot reach the port mapper at 127.0.0.1:\d+ .*"
        r"is the service \(imqbridgemgr serve\) running there\?",
    ):
        lookup_services("127.0.0.1", free_port(), timeout=2)


def test_something_else_listening_is_a_clear_error():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    import threading

    def answer():
        conn, _ = server.accept()
        conn.recv(100)
        conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
        conn.close()

    threading.Thread(target=answer).start()
    with pytest.raises(
        PortMapperError,
        match=r"127.0.0.1:\d+: line 1 of the port mapper's answer is not a "
        "version line",
    ):
        lookup_services("127.0.0.1", port)
    server.close()


@pytest.mark.parametrize(
    "text, match",
    [
        (b"101 b 1\nportmapper tcp PORTMAPPER 7676\n", "ended without its '.' line"),
        (b"102 b 1\n.\n", "port mapper version 102 is not supported"),
        (b"101 b 1\njms tcp NORMAL\n.\n", "line 2 .* is not 'name protocol type port'"),
        (b"101 b 1\njms tcp NORMAL port\n.\n", "line 2"),
        (b"101 b 1\njms tcp NORMAL 70000\n.\n", "line 2"),
        (b"\xff\xfe\n", "not ASCII"),
    ],
)
def test_bad_tables_name_the_line(text, match):
    with pytest.raises(PortMapperError, match=match):
        parse_table(text)


def test_the_original_brokers_extra_fields_are_ignored():
    text = b"101 imqbroker 4.5\njms tcp NORMAL 33511 [imq.jms.tcp.port=0]\n.\n"
    assert parse_table(text) == ("imqbroker", [ServiceEntry("jms", "tcp", "NORMAL", 33511)])


@pytest.mark.parametrize(
    "fields",
    [
        ("a b", "tcp", "N", 1),
        ("a", "", "N", 1),
        ("a", "tcp", "N\n", 1),
        ("a", "tcp", "N", -1),
        ("a", "tcp", "N", 65536),
    ],
)
def test_entries_that_would_break_the_format_are_refused(fields):
    with pytest.raises(ValueError):
        ServiceEntry(*fields)


FIELD = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)


@pytest.mark.slow
@given(
    FIELD.filter(lambda t: t != "."),
    st.lists(st.builds(ServiceEntry, FIELD.filter(lambda t: t != "."), FIELD, FIELD, st.integers(0, 65535))),
)
def test_format_and_parse_round_trip(instance, entries):
    assert parse_table(format_table(instance, entries)) == (instance, entries)
