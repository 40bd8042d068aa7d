"""Loading MessageTransformers (transformer folders, the Python path, clear errors) and the
shipped ones: uppercase, header/property mapping, content routing, text <-> bytes."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgemgr.jms import BytesMessage, MapMessage, Queue, TextMessage, Topic
from bridgemgr.jms.errors import IllegalStateException, JMSException, MessageFormatException
from bridgemgr.jms.message import PropertyType
from bridgemgr.transform import (
    TRANSFORMER_PATH_ENV,
    MessageTransformer,
    load_transformer,
    transformer_path,
)


def received(msg):
    msg.message_id, msg.destination = "ID:1", Queue("src")
    msg.set_read_only()
    return msg


def run(transformer: MessageTransformer, msg, properties=None, charset=None):
    transformer.reset(in_bridge_link=True)
    out = transformer.transform(msg, True, charset, "A", "B", properties or {})
    return out, transformer.outcome()


# --- loading -----------------------------------------------------------------------------------


def test_shipped_transformers_load_by_their_name_and_their_old_names():
    """The shipped transformers are bridgemgr.transformers.*; configurations written when
    they were the top-level folder transformers/ (a name Hugging Face's package takes)
    keep loading them, without importing any top-level `transformers`."""
    for name in (
        "bridgemgr.transformers.uppercase.UppercaseTransformer",
        "transformers.uppercase.UppercaseTransformer",
        "uppercase.UppercaseTransformer",
    ):
        assert type(load_transformer(name)).__module__ == "bridgemgr.transformers.uppercase"
    assert type(load_transformer("routing.ContentRouter")).__name__ == "ContentRouter"
    assert "transformers" not in sys.modules


@pytest.mark.slow
def test_an_old_name_that_is_not_shipped_names_the_new_package():
    with pytest.raises(
        JMSException,
        match=r"the shipped transformers are bridgemgr\.transformers\."
        r"<module>\.<Class>, modules charset, headers, routing, uppercase",
    ):
        load_transformer("transformers.nosuch.Thing", [])


def test_the_plugin_folders_in_their_order(tmp_path, monkeypatch):
    monkeypatch.setenv(TRANSFORMER_PATH_ENV, str(tmp_path / "env"))
    monkeypatch.setenv("IMQ_HOME", str(tmp_path / "home"))
    assert transformer_path(f"{tmp_path / 'a'},{tmp_path / 'b'}", tmp_path / "inst") == [
        tmp_path / "a",
        tmp_path / "b",
        tmp_path / "env",
        tmp_path / "inst" / "lib" / "ext",
        tmp_path / "home" / "lib" / "ext",
    ]


def test_configured_folder_comes_first(tmp_path, monkeypatch):
    (tmp_path / "mine_tx_mod.py").write_text(
        "from bridgemgr.transform import MessageTransformer\n"
        "class T(MessageTransformer):\n"
        "    def transform(self, *a): return a[0]\n"
    )
    monkeypatch.setenv(TRANSFORMER_PATH_ENV, str(tmp_path))
    assert transformer_path()[0] == tmp_path
    assert type(load_transformer("mine_tx_mod.T")).__module__ == "mine_tx_mod"
    sys.modules.pop("mine_tx_mod", None)


def test_package_in_a_folder(tmp_path):
    pkg = tmp_path / "acme_tx_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mapping.py").write_text(
        "from bridgemgr.transform import MessageTransformer\n"
        "class M(MessageTransformer):\n"
        "    def transform(self, *a): return a[0]\n"
    )
    try:
        assert load_transformer("acme_tx_pkg.mapping.M", [tmp_path])
    finally:
        for name in ("acme_tx_pkg", "acme_tx_pkg.mapping"):
            sys.modules.pop(name, None)


@pytest.mark.parametrize(
    "path, match",
    [
        ("nothing", "not a dotted class name"),
        ("no_such_module_x.Cls", "No module named 'no_such_module_x'.*looked in"),
        ("transformers.uppercase.Nope", "has no attribute 'Nope'"),
        ("bridgemgr.jms.Queue", "not a subclass of bridgemgr.transform.MessageTransformer"),
    ],
)
def test_clear_errors(path, match):
    with pytest.raises(JMSException, match=match):
        load_transformer(path)


def test_a_module_that_fails_to_import(tmp_path):
    (tmp_path / "broken_tx_mod.py").write_text("raise RuntimeError('oops at import')\n")
    with pytest.raises(JMSException, match="importing broken_tx_mod failed: RuntimeError: oops"):
        load_transformer("broken_tx_mod.X", [tmp_path])
    assert "broken_tx_mod" not in sys.modules


def test_branch_to_only_on_a_link():
    t = load_transformer("routing.ContentRouter")
    t.reset(in_bridge_link=False)  # a DMQ or the STOMP bridge
    with pytest.raises(IllegalStateException):
        t.branch_to("x")
    with pytest.raises(IllegalStateException):
        t.no_transfer()


# --- uppercase -------------------------------------------------------------------------------------


def test_uppercase_keeps_the_read_only_original():
    msg = received(TextMessage("abc"))
    out, _ = run(load_transformer("transformers.uppercase.UppercaseTransformer"), msg)
    assert out.text == "ABC" and msg.text == "abc"


def stomp_bytes(body: bytes, content_type: str | None, prop: str = "JMS_STOMP_CONTENT_TYPE") -> BytesMessage:
    """What the STOMP bridge makes of a SEND with content-length (stomp.py's default)."""
    msg = BytesMessage(body)
    msg.set_int_property("n", 7)
    if content_type is not None:
        msg.set_string_property(prop, content_type)
    return received(msg)


@pytest.mark.parametrize(
    "content_type, prop, body, upper",
    [
        ("text/plain", "JMS_STOMP_CONTENT_TYPE", b"order 1", b"ORDER 1"),
        (
            "Text/Plain; charset=ISO-8859-1",
            "JMS_STOMP_CONTENT_TYPE",
            "café".encode("latin-1"),
            "CAFÉ".encode("latin-1"),
        ),
        ('text/plain;charset="utf-8"', "JMS_AMQP_CONTENT_TYPE", "straße".encode(), b"STRASSE"),
    ],
)
def test_uppercase_reads_a_text_plain_bytes_message_as_text(content_type, prop, body, upper):
    msg = stomp_bytes(body, content_type, prop)
    out, _ = run(load_transformer("transformers.uppercase.UppercaseTransformer"), msg)
    assert isinstance(out, BytesMessage) and out.get_body() == upper
    assert out.get_string_property(prop) == content_type and out.get_int_property("n") == 7
    assert msg.get_body() == body  # the read-only original is kept


@pytest.mark.parametrize("content_type", [None, "application/octet-stream", "text/html", "text/plainish"])
def test_uppercase_leaves_other_bytes_messages_alone(content_type):
    msg = stomp_bytes(b"\x00abc", content_type)
    out, _ = run(load_transformer("transformers.uppercase.UppercaseTransformer"), msg)
    assert out is msg and out.get_body() == b"\x00abc"


@pytest.mark.parametrize(
    "content_type, body, error",
    [
        ("text/plain", b"\xff\xfe", "a text/plain body that is not utf-8"),
        ("text/plain; charset=ISO-8859-1", "ÿ".encode("latin-1"), "cannot be encoded as ISO-8859-1"),
        ("text/plain; charset=klingon", b"abc", "unknown charset 'klingon'"),
    ],
)
def test_uppercase_fails_on_a_text_plain_body_it_cannot_read(content_type, body, error):
    with pytest.raises(MessageFormatException, match=error):
        run(load_transformer("transformers.uppercase.UppercaseTransformer"), stomp_bytes(body, content_type))


@pytest.mark.slow
@given(st.text())
@settings(max_examples=100)
def test_uppercase_of_utf8_text_plain_bytes_is_the_texts_upper_case(text):
    out, _ = run(
        load_transformer("transformers.uppercase.UppercaseTransformer"), stomp_bytes(text.encode(), "text/plain")
    )
    assert out.get_body() == text.upper().encode()


# --- header mapping ------------------------------------------------------------------------------------


def test_header_mapping():
    msg = TextMessage("x")
    msg.set_int_property("orderId", 42)
    msg.set_string_property("secretish", "s")
    msg.set_string_property("corr", "C-1")
    msg.set_string_property("prio", "7")
    msg.type = "old"
    msg = received(msg)
    rules = {
        "set.region": "EU",
        "rename.orderId": "externalId",
        "drop": "secretish, missing",
        "to-header.JMSCorrelationID": "corr",
        "to-header.JMSPriority": "prio",
        "from-header.JMSMessageID": "sourceId",
        "from-header.JMSType": "sourceType",
        "JMS_SUN_JMSBRIDGE_NAME": "b",
    }
    out, _ = run(load_transformer("transformers.headers.HeaderMapping"), msg, rules)
    assert out.get_string_property("region") == "EU"
    assert out.get_property_type("externalId") is PropertyType.INT
    assert out.get_int_property("externalId") == 42 and not out.property_exists("orderId")
    assert not out.property_exists("secretish")
    assert out.correlation_id == "C-1" and out.priority == 7
    assert out.get_string_property("sourceId") == "ID:1"
    assert out.get_string_property("sourceType") == "old"
    assert not out.property_exists("JMS_SUN_JMSBRIDGE_NAME")
    assert msg.property_exists("orderId")  # the original is untouched


def test_header_mapping_unknown_header_is_a_failure():
    with pytest.raises(JMSException, match="JMSExpiration"):
        run(
            load_transformer("transformers.headers.HeaderMapping"),
            received(TextMessage("x")),
            {"to-header.JMSExpiration": "x"},
        )


# --- routing --------------------------------------------------------------------------------------------

ROUTES = {
    "route.2.selector": "amount > 1000",
    "route.2.to": "queue:big",
    "route.1.selector": "region = 'EU'",
    "route.1.to": "orders-eu",
    "route.10.selector": "region = 'US'",
    "route.10.to": "topic:us",
}


def order(region: str, amount: int):
    m = MapMessage()
    m.set_string_property("region", region)
    m.set_int_property("amount", amount)
    return received(m)


@pytest.mark.parametrize(
    "region, amount, default, branch, drop",
    [
        ("EU", 5000, None, "orders-eu", False),  # route 1 first, though 2 matches too
        ("US", 5000, None, Queue("big"), False),
        ("US", 5, None, Topic("us"), False),  # 10 after 2
        ("JP", 5, None, None, False),  # the link's target
        ("JP", 5, "drop", None, True),
        ("JP", 5, "queue:rest", Queue("rest"), False),
    ],
)
def test_content_router(region, amount, default, branch, drop):
    props = dict(ROUTES, **({"default": default} if default else {}))
    _out, outcome = run(load_transformer("routing.ContentRouter"), order(region, amount), props)
    assert outcome.branch_to == branch and outcome.no_transfer is drop


@pytest.mark.parametrize(
    "props, match",
    [
        ({"route.1.selector": "a = 1"}, "needs both"),
        ({"route.x.to": "q"}, "route.N"),
        ({"route.1.selector": "a = = 1", "route.1.to": "q"}, "invalid selector"),
    ],
)
def test_content_router_bad_routes(props, match):
    with pytest.raises(JMSException, match=match):
        run(load_transformer("routing.ContentRouter"), order("EU", 1), props)


# --- text <-> bytes --------------------------------------------------------------------------------------

CHARSETS = ["UTF-8", "UTF-16", "ISO-8859-1", "cp1252", "Shift_JIS"]


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=80), charset=st.sampled_from(CHARSETS))
def test_text_bytes_round_trip(text, charset):
    to_bytes = load_transformer("charset.TextToBytes")
    to_text = load_transformer("charset.BytesToText")
    msg = TextMessage(text)
    msg.set_int_property("n", 1)
    try:
        encoded = text.encode(charset)
    except UnicodeEncodeError:
        with pytest.raises(MessageFormatException, match="cannot be encoded"):
            run(to_bytes, received(msg), {"charset": charset})
        return
    as_bytes, _ = run(to_bytes, received(msg), {"charset": charset})
    assert isinstance(as_bytes, BytesMessage) and as_bytes.get_body() == encoded
    assert as_bytes.get_int_property("n") == 1 and as_bytes.message_id == "ID:1"
    assert as_bytes.get_string_property("JMS_IMQ_CHARSET") == charset
    as_bytes.set_read_only()
    back, _ = run(to_text, as_bytes, {"charset": charset})
    # What the charset itself gives back (Shift_JIS maps U+00A5 to 0x5C, read as '\\').
    assert isinstance(back, TextMessage) and back.text == encoded.decode(charset)


def test_charset_from_the_caller_and_bad_input():
    to_text = load_transformer("charset.BytesToText")
    out, _ = run(to_text, received(BytesMessage("é".encode("latin-1"))), charset="ISO-8859-1")
    assert out.text == "é"
    with pytest.raises(MessageFormatException, match="not UTF-8 text"):
        run(to_text, received(BytesMessage(b"\xff\xfe\xfa")))
    with pytest.raises(MessageFormatException, match="unknown charset"):
        run(to_text, received(BytesMessage(b"x")), {"charset": "klingon"})
    other = received(MapMessage({"a": 1}))
    assert run(to_text, other)[0] is other  # other types pass through
