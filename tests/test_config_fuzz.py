"""Hostile and random bridge XML: the loader refuses it with ConfigError, quickly, and never
reads a file or URL the configuration did not name (XXE, billion laughs, foreign DTDs)."""

from __future__ import annotations

import http.server
import os
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lxml import etree

from bridgemgr.jmsbridge import config as C
from bridgemgr.jmsbridge.config import ConfigError, load_bridge_config, parse_bridge_config

pytestmark = pytest.mark.timeout(60)

MARKER = "SENTINEL-4b1d-never-read"
VALID = (Path(__file__).parent / "data" / "config" / "original-product.xml").read_bytes()
FUZZ = settings(
    max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory) -> Path:
    """A file no configuration names: its marker must never show up anywhere."""
    path = tmp_path_factory.mktemp("sentinel") / "secret.txt"
    path.write_text(f"{MARKER}\n")
    return path


@pytest.fixture
def tripwire(tmp_path):
    """A FIFO whose writer notices any reader: proof that no one opened it at all."""
    path = tmp_path / "tripwire"
    os.mkfifo(path)
    opened, done = threading.Event(), threading.Event()

    def writer() -> None:
        fd = os.open(path, os.O_WRONLY)  # returns once a reader opens the FIFO
        if not done.is_set():
            opened.set()
        try:
            os.write(fd, MARKER.encode())
        except OSError:
            pass
        os.close(fd)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    yield path
    done.set()
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # let the writer go
    thread.join(5)
    os.close(fd)
    assert not opened.is_set(), "the loader opened a file the configuration did not name"


@pytest.fixture(scope="module")
def web():
    """A local web server that records every request (there must be none)."""
    requests: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            body = f'<!ENTITY x "{MARKER}">'.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", requests
    server.shutdown()
    server.server_close()


def refused(data: bytes) -> str:
    """The report for ``data``, which must be refused with ConfigError and nothing else."""
    with pytest.raises(ConfigError) as info:
        parse_bridge_config(data, "hostile.xml")
    text = str(info.value)
    assert MARKER not in text
    assert all(len(p.message) < 600 for p in info.value.problems)
    return text


BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE jmsbridge [
<!ENTITY a "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa">
<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">
<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">
<!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;">
<!ENTITY e "&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;">
<!ENTITY f "&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;">
<!ENTITY g "&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;">
<!ENTITY h "&g;&g;&g;&g;&g;&g;&g;&g;&g;&g;&g;&g;&g;&g;&g;&g;&g;&g;&g;&g;">
]>
"""


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "use",
    [
        b'<jmsbridge name="&h;"/>',
        b'<jmsbridge name="b">&h;</jmsbridge>',
        b'<jmsbridge name="b"><link name="l">&h;</link></jmsbridge>',
    ],
)
def test_billion_laughs_is_refused_at_once(use):
    text = refused(BILLION_LAUGHS + use)
    assert "not well-formed" in text or "internal subset" in text


@pytest.mark.timeout(10)
def test_quadratic_blowup_is_refused():
    big = "x" * 100_000
    data = (
        f'<!DOCTYPE jmsbridge [<!ENTITY big "{big}">]>'
        f'<jmsbridge name="b"><link name="l">{"&big;" * 2000}</link></jmsbridge>'
    ).encode()
    refused(data)


def xxe_documents(url: str) -> list[bytes]:
    return [
        f'<!DOCTYPE jmsbridge [<!ENTITY x SYSTEM "{url}">]><jmsbridge name="&x;"/>'.encode(),
        f'<!DOCTYPE jmsbridge [<!ENTITY x SYSTEM "{url}">]><jmsbridge name="b">'
        f'<link name="l"><description>&x;</description></link></jmsbridge>'.encode(),
        f'<!DOCTYPE jmsbridge [<!ENTITY % p SYSTEM "{url}"> %p;]><jmsbridge name="b"/>'.encode(),
        f'<!DOCTYPE jmsbridge SYSTEM "{url}"><jmsbridge name="b"/>'.encode(),
        f'<!DOCTYPE jmsbridge PUBLIC "-//Sun//DTD x//EN" "{url}"><jmsbridge name="b"/>'.encode(),
        f'<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd" [<!ENTITY x SYSTEM "{url}">]>'
        f'<jmsbridge name="b">&x;</jmsbridge>'.encode(),
        f'<jmsbridge name="b" xmlns:xi="http://www.w3.org/2001/XInclude">'
        f'<xi:include href="{url}" parse="text"/></jmsbridge>'.encode(),
    ]


def stylesheet(url: str) -> bytes:
    """Harmless (processing instructions are dropped), but must not be fetched either."""
    return f'<?xml-stylesheet href="{url}"?><jmsbridge name="b"/>'.encode()


@pytest.mark.timeout(20, method="thread")
def test_external_entities_never_open_a_file(tripwire, sentinel):
    for url in (str(tripwire), tripwire.as_uri(), sentinel.as_uri(), str(sentinel)):
        for data in xxe_documents(url):
            refused(data)
        assert parse_bridge_config(stylesheet(url)).name == "b"


def test_external_entities_never_reach_the_network(web):
    base, requests = web
    for data in xxe_documents(base + "/evil.dtd"):
        refused(data)
    assert parse_bridge_config(stylesheet(base + "/evil.xsl")).name == "b"
    assert requests == []


@pytest.mark.parametrize(
    "doctype,expected",
    [
        ('<!DOCTYPE jmsbridge SYSTEM "http://example.com/sun_jmsbridge_1_0.dtd">', "the DOCTYPE is"),
        ('<!DOCTYPE jmsbridge SYSTEM "other.dtd">', "the DOCTYPE is"),
        ('<!DOCTYPE link SYSTEM "sun_jmsbridge_1_0.dtd">', "the DOCTYPE is"),
        ('<!DOCTYPE jmsbridge PUBLIC "-//x//EN" "sun_jmsbridge_1_0.dtd">', "the DOCTYPE is"),
        ('<!DOCTYPE jmsbridge [<!ATTLIST jmsbridge name CDATA "x">]>', "internal subset"),
        ('<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd" [<!ELEMENT x ANY>]>', "internal subset"),
    ],
)
def test_doctypes_pointing_elsewhere_are_refused_with_the_fix(doctype, expected):
    text = refused(f'{doctype}<jmsbridge name="b"/>'.encode())
    assert expected in text and C.DOCTYPE in text


def test_an_empty_internal_subset_is_harmless():
    assert parse_bridge_config(b'<!DOCTYPE jmsbridge []><jmsbridge name="b"/>').name == "b"


@pytest.mark.parametrize(
    "body", ['<jmsbridge name="b"><link name="l">&undefined;</link></jmsbridge>', '<jmsbridge name="a&undefined;b"/>']
)
def test_undeclared_entities_are_refused_not_dropped(body):
    text = refused(f"<?xml version='1.0'?>\n{C.DOCTYPE}\n{body}".encode())
    assert text.startswith("hostile.xml:3: the entity reference &undefined; is refused")


def test_the_doctype_problem_names_its_line():
    text = refused(b'<?xml version="1.0"?>\n\n<!DOCTYPE jmsbridge SYSTEM "x.dtd">\n<jmsbridge name="b"/>')
    assert text.startswith("hostile.xml:3: the DOCTYPE is") and text.count("\n") == 0


@pytest.mark.parametrize(
    "data",
    [
        b'<?xml version="1.0" encoding="UTF-8"?><jmsbridge name="caf\xe9"/>',
        b'<?xml version="1.0" encoding="UTF-16"?><jmsbridge name="b"/>',
        b'<?xml version="1.0" encoding="no-such-encoding"?><jmsbridge name="b"/>',
        b"\xff\xfe<\x00j\x00",
        b'<jmsbridge name="\x00"/>',
        b'<jmsbridge name="b"/>\x00',
        b"\xef\xbb\xbf\xef\xbb\xbf<jmsbridge/>",
        b"",
        b"   ",
        b"<",
        b"<!DOCTYPE jmsbridge",
        b"<?xml version='1.0'?>",
        b'<jmsbridge name="b">' * 5000,
        b"<a>" * 20000 + b"</a>" * 20000,
    ],
)
def test_broken_bytes_are_refused(data):
    refused(data)


def test_declared_encodings_are_honoured():
    latin = '<?xml version="1.0" encoding="ISO-8859-1"?><jmsbridge name="caf\xe9"/>'
    assert parse_bridge_config(latin.encode("latin-1")).name == "caf\xe9"
    utf16 = '<?xml version="1.0" encoding="UTF-16"?><jmsbridge name="\u65e5\u672c"/>'
    assert parse_bridge_config(utf16.encode("utf-16")).name == "\u65e5\u672c"


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "template",
    [
        '<jmsbridge name="b"><link name="l" transacted="{}"/></jmsbridge>',
        '<jmsbridge name="b" {}="1"/>',
        '<jmsbridge name="b"><{}/></jmsbridge>',
        '<jmsbridge name="b"><dmq name="d" connection-factory-ref="c" destination-ref="q" '
        'send-attempts="{}"/></jmsbridge>',
        '<jmsbridge name="b"><link name="{}"><source connection-factory-ref="x" '
        'destination-ref="y"/><target connection-factory-ref="x" destination-ref="y"/></link>'
        "</jmsbridge>",
    ],
)
def test_huge_values_give_short_messages(template):
    refused(template.format("y" * 3_000_000).encode())


def test_a_huge_free_text_attribute_is_just_text():
    selector = "a = 1 OR " * 100_000 + "b = 2"
    data = (
        f'<jmsbridge name="b"><link name="l"><source connection-factory-ref="c" '
        f'destination-ref="q" selector="{selector}"/><target connection-factory-ref="c" '
        f'destination-ref="q"/></link><connection-factory ref-name="c"/>'
        f'<destination ref-name="q" name="Q"/></jmsbridge>'
    ).encode()
    assert parse_bridge_config(data).links[0].source.selector == selector


def test_files_beyond_the_size_limit_are_not_parsed(tmp_path):
    path = tmp_path / "big.xml"
    path.write_bytes(VALID + b"<!--" + b"x" * (C.MAX_CONFIG_BYTES) + b"-->")
    with pytest.raises(ConfigError, match="too big for a bridge configuration"):
        load_bridge_config(str(path))


# --- random input ---------------------------------------------------------------------------

TOKENS = [
    b"<",
    b">",
    b"/>",
    b"&",
    b"&x;",
    b"&#0;",
    b"&#xD800;",
    b"&amp;",
    b'"',
    b"'",
    b"=",
    b"\x00",
    b"\xff\xfe",
    b"\xc3",
    b"\xe9",
    b"<![CDATA[",
    b"]]>",
    b"<!--",
    b"-->",
    b"<?xml version='1.0' encoding='UTF-16'?>",
    b"<?xml version='1.0' encoding='latin-1'?>",
    b"<!DOCTYPE jmsbridge [",
    b"]>",
    b"%p;",
    b"<!ENTITY x 'y'>",
    b"<!ENTITY x SYSTEM 'SENTINEL'>",
    b"<!ENTITY % p SYSTEM 'SENTINEL'>",
    b"<!DOCTYPE jmsbridge SYSTEM 'SENTINEL'>",
    b"<xi:include href='SENTINEL'/>",
    b"<link>",
    b"</link>",
    b"<dmq/>",
    b'name="built-in-dmq"',
    b'destination-ref="AS_SOURCE"',
    b'transacted="true"',
    b'send-attempts="99999999999999999999"',
    b"y" * 70_000,
]


@st.composite
def mutated(draw, sentinel_uri: str) -> bytes:
    data = bytearray(VALID)
    for _ in range(draw(st.integers(1, 6))):
        start = draw(st.integers(0, len(data)))
        end = min(len(data), start + draw(st.integers(0, 40)))
        token = draw(st.one_of(st.sampled_from(TOKENS), st.binary(max_size=12)))
        token = token.replace(b"SENTINEL", sentinel_uri.encode())
        if draw(st.booleans()):
            data[start:end] = token  # replace (or delete, with an empty token)
        else:
            data[start:start] = token
    return bytes(data)


def only_config_error(data: bytes) -> None:
    try:
        config = parse_bridge_config(data, "fuzz.xml")
    except ConfigError as exc:
        assert MARKER not in str(exc)
        assert all(p.source == "fuzz.xml" for p in exc.problems)
    else:
        assert isinstance(config, C.BridgeConfig) and MARKER not in repr(config)


@pytest.mark.slow
@pytest.mark.timeout(120)
@FUZZ
@given(data=st.data())
def test_mutated_configs_are_loaded_or_refused_with_config_error(data, sentinel):
    only_config_error(data.draw(mutated(sentinel.as_uri())))


@pytest.mark.timeout(60)
@FUZZ
@given(st.binary(max_size=2000))
def test_random_bytes_are_refused_with_config_error(blob):
    only_config_error(blob)


NAMES = [*sorted(C.dtd_attributes()), "foo", "xi:include"]
ATTRS = [*sorted({a for decls in C.dtd_attributes().values() for a in decls}), "bogus"]
VALUES = st.one_of(
    st.sampled_from(
        [
            "true",
            "false",
            "queue",
            "topic",
            "-1",
            "0",
            "3",
            "2147483648",
            "1.5",
            "built-in-dmq",
            "AS_SOURCE",
            "as_source",
            "imq.bridge.jms.dmq",
            "",
            "cf",
            "q",
            "a.B",
            "java.naming.factory.initial",
            "l",
        ]
    ),
    # What XML attribute values may hold (no other control characters, no U+FFFE or U+FFFF),
    # drawn as such: a filter on arbitrary text threw away most draws (20 s for this test).
    st.text(
        alphabet=st.characters(
            min_codepoint=32,
            exclude_categories=("Cs",),
            exclude_characters="\ufffe\uffff",
            include_characters="\t\n\r",
        ),
        max_size=30,
    ),
)


def element(tags: st.SearchStrategy[str]) -> st.SearchStrategy[etree._Element]:
    def build(args: tuple[str, dict[str, str], list[etree._Element]]) -> etree._Element:
        tag, attrs, children = args
        el = etree.Element(tag.replace("xi:", ""), attrs)
        el.extend(children)
        return el

    leaf = st.tuples(tags, st.dictionaries(st.sampled_from(ATTRS), VALUES, max_size=6), st.just([])).map(build)
    return st.recursive(
        leaf,
        lambda kids: st.tuples(
            tags, st.dictionaries(st.sampled_from(ATTRS), VALUES, max_size=6), st.lists(kids, max_size=5)
        ).map(build),
        max_leaves=15,
    )


@pytest.mark.slow
@pytest.mark.timeout(120)
@settings(FUZZ, max_examples=150)
@given(
    st.sampled_from(["jmsbridge", "link", "foo"]),
    st.lists(element(st.sampled_from(NAMES)), max_size=8),
    st.dictionaries(st.sampled_from(ATTRS), VALUES, max_size=4),
    st.booleans(),
)
def test_random_well_formed_trees_are_loaded_or_refused(root_tag, children, attrs, doctype):
    root = etree.Element(root_tag, attrs)
    root.extend(children)
    data = etree.tostring(root, xml_declaration=True, encoding="UTF-8", doctype=C.DOCTYPE if doctype else None)
    only_config_error(data)
