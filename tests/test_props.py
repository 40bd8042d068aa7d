"""Broker properties: the schema's types and defaults, files and -D overrides, problems
with file and line, unknown-key warnings, secrets, and the grouped views."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridgemgr import props as P
from bridgemgr.props import ConfigError, load_properties, parse_properties, parse_size

pytestmark = pytest.mark.timeout(30)


def write(tmp_path: Path, text: str, name: str = "broker.properties") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def messages(exc: ConfigError) -> list[str]:
    return [str(p) for p in exc.problems]


# --- defaults: every property of the chapter and of the brief ------------------------------

DEFAULTS = {
    "imq.bridge.enabled": False,
    "imq.bridge.activelist": (),
    "imq.bridge.admin.user": None,
    "imq.bridge.admin.password": None,
    "imq.bridge.tm.props": {},
    "imq.bridge.stomp.hostname": None,
    "imq.bridge.stomp.tcp.enabled": True,
    "imq.bridge.stomp.tcp.port": 7672,
    "imq.bridge.stomp.tls.enabled": False,
    "imq.bridge.stomp.tls.port": 7673,
    "imq.bridge.stomp.tls.requireClientAuth": False,
    "imq.bridge.stomp.tls.certfile": None,
    "imq.bridge.stomp.tls.keyfile": None,
    "imq.bridge.stomp.tls.cafile": None,
    "imq.bridge.stomp.consumerFlowLimit": 1000,
    "imq.bridge.stomp.messageTransformer": None,
    "imq.bridge.stomp.logfile.limit": 0,
    "imq.bridge.stomp.logfile.count": 1,
    "imq.bridge.b1.type": None,
    "imq.bridge.b1.xmlurl": None,
    "imq.bridge.b1.autostart": True,
    "imq.bridge.b1.logfile.limit": 0,
    "imq.bridge.b1.logfile.count": 1,
    "imq.bridge.b1.tm.props": {},
    "imq.bridge.b1.backoutThreshold": 5,
    "imq.bridge.b1.runner": "local",
    "imq.bridge.b1.transaction.batchSize": 1,
    "imq.bridge.b1.link.windowBytes": 16 * 1024 * 1024,
    "imq.bridge.spark.master": None,
    "imq.bridge.java.classpath": None,
    "imq.instancename": "imqbroker",
    "imq.hostname": None,
    "imq.portmapper.port": 7676,
    "imq.varhome": None,
    "imq.persist.store": "file",
    "imq.persist.file.sync.enabled": False,
    "imq.autocreate.queue": True,
    "imq.autocreate.topic": True,
    "imq.autocreate.destination.maxNumMsgs": -1,
    "imq.autocreate.destination.maxTotalMsgBytes": -1,
    "imq.autocreate.destination.maxBytesPerMsg": -1,
    "imq.autocreate.destination.limitBehavior": "FLOW_CONTROL",
    "imq.autocreate.destination.useDMQ": True,
    "imq.system.max_count": -1,
    "imq.system.max_size": None,
    "imq.message.max_size": 70 * 1024 * 1024,
    "imq.system.max_memory": None,
    "imq.green.threshold": 0,
    "imq.yellow.threshold": 80,
    "imq.orange.threshold": 90,
    "imq.red.threshold": 98,
    "imq.green.count": 5000,
    "imq.yellow.count": 500,
    "imq.orange.count": 50,
    "imq.red.count": 0,
}


@pytest.mark.parametrize("key,default", sorted(DEFAULTS.items()))
def test_every_property_has_its_default(key, default):
    assert load_properties(environ={}).get(key) == default


def test_the_backout_threshold_default_is_the_same_for_every_runner():
    from bridgemgr.spark import options
    from bridgemgr.spark.jobs import ServiceJob

    assert P.BACKOUT_THRESHOLD == options.BACKOUT_THRESHOLD == options.LinkOptions.backout_threshold
    assert P.LINK_WINDOW == options.LINK_WINDOW == options.LinkOptions.window
    assert P.LINK_WINDOW_BYTES == options.LINK_WINDOW_BYTES == options.LinkOptions.window_bytes
    assert ServiceJob.backout_threshold == P.BACKOUT_THRESHOLD


def test_unknown_schema_key_is_a_key_error():
    with pytest.raises(KeyError):
        load_properties(environ={}).get("imq.bridge.nonsense")


# --- types -----------------------------------------------------------------------------------

TYPED = [
    ("imq.bridge.enabled", "TRUE", True),
    ("imq.bridge.enabled", " false ", False),
    ("imq.bridge.activelist", " a, b ,,c ", ("a", "b", "c")),
    ("imq.bridge.stomp.tcp.port", "0", 0),
    ("imq.bridge.stomp.tcp.port", "+65535", 65535),
    ("imq.bridge.tm.props", "txlogSize=10m, txlogSync=true", {"txlogSize": "10m", "txlogSync": "true"}),
    ("imq.bridge.b1.type", "JMS", "jms"),
    ("imq.bridge.stomp.type", "Stomp", "stomp"),
    ("imq.bridge.b1.runner", "SPARK", "spark"),
    ("imq.persist.store", "JDBC", "jdbc"),
    ("imq.autocreate.destination.limitBehavior", "remove_oldest", "REMOVE_OLDEST"),
    ("imq.autocreate.destination.limitBehavior", "remove_low_priority", "REMOVE_LOW_PRIORITY"),
    ("imq.system.max_size", "64m", 64 * 1024 * 1024),
    ("imq.autocreate.destination.maxTotalMsgBytes", "10m", 10 * 1024 * 1024),
    ("imq.autocreate.destination.maxBytesPerMsg", "10k", 10 * 1024),
    ("imq.autocreate.destination.maxBytesPerMsg", "512b", 512),
    ("imq.autocreate.destination.maxBytesPerMsg", "1G", 1024**3),
    ("imq.autocreate.destination.maxBytesPerMsg", "4096", 4096),
    ("imq.autocreate.destination.maxBytesPerMsg", "-1", -1),
    ("imq.autocreate.destination.maxNumMsgs", "0", 0),
    ("imq.bridge.b1.link.windowBytes", "32m", 32 * 1024 * 1024),
    ("imq.bridge.b1.link.windowBytes", "1", 1),
    ("imq.bridge.b1.link.windowBytes", "-1", -1),
    (
        "imq.bridge.stomp.messageTransformer",
        "transformers.uppercase.UppercaseTransformer",
        "transformers.uppercase.UppercaseTransformer",
    ),
]


@pytest.mark.parametrize("key,raw,value", TYPED)
def test_values_are_parsed_by_type(key, raw, value):
    props, problems = parse_properties(overrides=[f"{key}={raw}"], environ={})
    assert props.get(key) == value
    assert not any(p.message.startswith(f"{key} is ") and p.severity == "error" for p in problems)


WRONG = [
    ("imq.bridge.enabled", "yes", "write true or false"),
    ("imq.bridge.stomp.tcp.port", "70000", "from 0 to 65535"),
    ("imq.bridge.stomp.tcp.port", "7e3", "from 0 to 65535"),
    ("imq.bridge.stomp.tcp.port", "١٢", "from 0 to 65535"),  # non-ASCII digits
    ("imq.bridge.stomp.tcp.port", "1_000", "from 0 to 65535"),
    ("imq.bridge.stomp.consumerFlowLimit", "0", "from 1 to"),
    ("imq.bridge.b1.logfile.count", "0", "from 1 to"),
    ("imq.bridge.b1.type", "amqp", "jms, stomp"),
    ("imq.bridge.b1.runner", "yarn", "local, spark"),
    ("imq.persist.store", "mysql", "file, jdbc"),
    ("imq.autocreate.destination.limitBehavior", "DROP_ALL", "REJECT_NEWEST"),
    ("imq.autocreate.destination.maxTotalMsgBytes", "10x", "byte size"),
    ("imq.autocreate.destination.maxTotalMsgBytes", "-2", "byte size"),
    ("imq.autocreate.destination.maxNumMsgs", "-2", "from -1 to"),
    ("imq.bridge.tm.props", "txlogSize", "key=value"),
    ("imq.bridge.b1.link.windowBytes", "0", "a byte size of at least 1"),
    ("imq.bridge.b1.link.windowBytes", "16 MiB", "a byte size of at least 1"),
    ("imq.bridge.b1.link.windowBytes", "-2", "or -1 for no byte bound"),
    ("imq.bridge.stomp.messageTransformer", "Upper", "dotted class name"),
    ("imq.bridge.stomp.messageTransformer", "a.class.B", "dotted class name"),
]


@pytest.mark.parametrize("key,raw,expected", WRONG)
def test_wrong_types_name_the_key_and_the_value(tmp_path, key, raw, expected):
    path = write(tmp_path, f"# comment\n\n{key}={raw}\n")
    with pytest.raises(ConfigError) as info:
        load_properties([path], environ={})
    (problem,) = info.value.errors
    assert (problem.source, problem.line) == (str(path), 3)
    assert (key in problem.message and repr(raw.strip() if raw.strip() else raw) in problem.message) or repr(
        raw
    ) in problem.message
    assert expected in problem.message


@given(st.integers(min_value=0, max_value=2**40), st.sampled_from(["", "b", "k", "m", "g", "K", "M", "G"]))
def test_byte_sizes(number, unit):
    factor = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[unit.lower()]
    assert parse_size(f"{number}{unit}") == number * factor


@given(st.text(max_size=20))
def test_size_parser_only_raises_value_error(text):
    try:
        assert parse_size(text) >= -1
    except ValueError:
        pass


# --- files, lines, overrides ------------------------------------------------------------------


def test_every_error_of_every_file_is_reported_together(tmp_path):
    a = write(tmp_path, "imq.bridge.enabled=maybe\nimq.portmapper.port=x\n", "a.properties")
    b = write(tmp_path, "\n\nimq.persist.store=disk\n", "b.properties")
    with pytest.raises(ConfigError) as info:
        load_properties([a, b], overrides=["novalue"], environ={})
    where = sorted((p.source, p.line) for p in info.value.errors)
    assert where == sorted([(str(a), 1), (str(a), 2), (str(b), 3), (P.COMMAND_LINE, None)])
    assert "-Dnovalue is not key=value" in str(info.value)


def test_line_numbers_count_continuations_and_all_line_endings(tmp_path):
    path = tmp_path / "x.properties"
    path.write_bytes(b"a=1\\\n   2\r\n! bang comment\rimq.bridge.enabled=nope\n")
    with pytest.raises(ConfigError) as info:
        load_properties([path], environ={})
    assert info.value.errors[0].line == 4


def test_later_files_and_overrides_win(tmp_path):
    a = write(tmp_path, "imq.instancename=a\nimq.portmapper.port=1\n", "a.properties")
    b = write(tmp_path, "imq.instancename=b\n", "b.properties")
    props = load_properties([a, b], overrides=["imq.portmapper.port=3"], environ={})
    assert props.get("imq.instancename") == "b"
    assert props.get("imq.portmapper.port") == 3
    assert props.origin("imq.portmapper.port") == P.Origin(P.COMMAND_LINE, None)
    assert props.origin("imq.instancename") == P.Origin(str(b), 1)


def test_missing_file_is_a_problem_not_an_exception(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_properties([tmp_path / "nope.properties"], environ={})
    assert "cannot read the properties file" in str(info.value)


def test_unicode_escapes_and_latin1_fallback(tmp_path):
    path = tmp_path / "l.properties"
    path.write_bytes("imq.instancename=br\xfccke\nimq.hostname=h\\u00e9\n".encode("latin-1"))
    props = load_properties([path], environ={})
    assert props.get("imq.instancename") == "br\xfccke"
    assert props.get("imq.hostname") == "h\xe9"


def test_bad_unicode_escape(tmp_path):
    path = write(tmp_path, "a=1\nimq.hostname=\\uZZZZ\n")
    with pytest.raises(ConfigError) as info:
        load_properties([path], environ={})
    assert info.value.errors[0].line == 2 and "\\u" in str(info.value)


def test_config_error_pickles():
    error = ConfigError([P.Problem("f", 3, "bad")])
    again = pickle.loads(pickle.dumps(error))
    assert again.problems == error.problems and str(again) == "f:3: bad"


# --- unknown keys, cross checks -----------------------------------------------------------------


@pytest.mark.parametrize(
    "key,closest",
    [
        ("imq.bridge.b1.xmlur", "imq.bridge.b1.xmlurl"),
        ("imq.bridge.b1.autoStart", "imq.bridge.b1.autostart"),
        ("imq.bridge.stomp.tcp.prot", "imq.bridge.stomp.tcp.port"),
        ("imq.bridge.stomp.tls.requireclientauth", "imq.bridge.stomp.tls.requireClientAuth"),
        ("imq.bridge.activelst", "imq.bridge.activelist"),
        ("imq.bridge.admin.pasword", "imq.bridge.admin.password"),
    ],
)
def test_unknown_bridge_keys_warn_with_the_closest_known_key(tmp_path, caplog, key, closest):
    path = write(tmp_path, f"imq.bridge.b1.type=jms\nimq.bridge.b1.xmlurl=b.xml\n{key}=v\n")
    with caplog.at_level(logging.WARNING, logger="bridgemgr.props"):
        props = load_properties([path], environ={})
    (warning,) = props.warnings
    assert (warning.line, warning.severity) == (3, "warning")
    assert f"unknown property {key}; did you mean {closest}?" in warning.message
    assert warning.message in caplog.text


def test_unknown_keys_far_from_anything_are_ignored_with_a_warning():
    props = load_properties(
        overrides=["imq.bridge.zzzzzzzzzzzz=1", "imq.jmx.rmiregistry.port=x", "other.key=1"], environ={}
    )
    assert [w.message for w in props.warnings] == [
        "unknown property imq.bridge.zzzzzzzzzzzz; it is ignored",
        "unknown property imq.jmx.rmiregistry.port; it is ignored",
    ]  # every imq.* key; other.key is not ours
    assert props.raw["imq.jmx.rmiregistry.port"] == "x"


@pytest.mark.parametrize(
    "key,closest",
    [
        ("imq.persist.file.sync.enabeld", "imq.persist.file.sync.enabled"),
        ("imq.autocreate.queu", "imq.autocreate.queue"),
        ("imq.instancenmae", "imq.instancename"),
        ("imq.persist.jdbc.postgresql.pasword", "imq.persist.jdbc.postgresql.password"),
    ],
)
def test_unknown_imq_keys_outside_imq_bridge_warn_with_the_closest_known_key(key, closest):
    props = load_properties(overrides=[f"{key}=secret-value-7"], environ={})
    assert [w.message for w in props.warnings] == [f"unknown property {key}; did you mean {closest}?"]
    assert props.redacted()[key] == P.REDACTED  # a misspelt password key keeps its value hidden


def test_every_schema_key_is_suggested_for_a_typo_of_it():
    """The known keys are the schema's rows, no second list: a row added to FIXED_PROPS
    (as each new feature does) is known and suggested with nothing else to change."""
    for prop in P.FIXED_PROPS:
        typo = prop.key[:-2] + prop.key[-1] + prop.key[-2]  # the last two letters swapped
        if typo == prop.key or P.schema_row(typo) is not None:
            continue
        (warning,) = load_properties(overrides=[f"{typo}=1"], environ={}).warnings
        assert warning.message == f"unknown property {typo}; did you mean {prop.key}?"


def test_the_passfile_keys_of_the_clis_are_known():
    props = load_properties(overrides=["imq.imqbridgemgr.password=x", "imq.imqusermgr.password=y"], environ={})
    assert props.warnings == ()


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["imq.bridge.activelist=b1"], "imq.bridge.b1.type is not set; set it to jms or stomp"),
        (["imq.bridge.b1.type=jms"], "JMS bridge b1 has no imq.bridge.b1.xmlurl"),
        (["imq.bridge.stomp.type=jms"], "the name stomp belongs to the STOMP bridge"),
        (["imq.bridge.s2.type=stomp"], "the STOMP bridge must be named stomp"),
        (["imq.bridge.activelist=a.b"], "is not a usable bridge name"),
        (["imq.bridge.activelist=admin"], "is not a usable bridge name"),
        (["imq.bridge.b1.tm.props=txlogSize=big"], "sets txlogSize to 'big'"),
        (["imq.persist.store=jdbc"], "imq.persist.jdbc.postgresql.property.url is not set"),
    ],
)
def test_cross_checks(overrides, expected):
    with pytest.raises(ConfigError) as info:
        load_properties(overrides=overrides, environ={})
    assert expected in str(info.value)


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["imq.bridge.activelist=stomp,stomp"], "listed twice"),
        (["imq.bridge.enabled=true"], "imq.bridge.admin.user is not set"),
        (["imq.bridge.activelist=stomp"], "imq.bridge.enabled is not true"),
        (["imq.bridge.b2.autostart=false"], "imq.bridge.b2.type is not"),
        (["imq.bridge.tm.props=txlogSize=1m,fancy=1"], "unknown key 'fancy'"),
    ],
)
def test_cross_check_warnings(overrides, expected):
    props = load_properties(overrides=overrides, environ={})
    assert any(expected in w.message for w in props.warnings), props.warnings


def test_a_spark_conf_key_ending_like_tm_props_is_just_text():
    props = load_properties(overrides=["imq.bridge.spark.conf.x.tm.props=a"], environ={})
    assert props.spark_conf == {"x.tm.props": "a"}


def test_stomp_needs_no_type():
    props = load_properties(
        overrides=["imq.bridge.enabled=true", "imq.bridge.admin.user=a", "imq.bridge.activelist=stomp"], environ={}
    )
    assert props.bridge_type("stomp") == "stomp" and props.warnings == ()
    assert props.bridge_names == ("stomp",)


# --- secrets ------------------------------------------------------------------------------------

SECRET = "pw-never-shown-7f3a"


def test_the_admin_password_is_never_shown(tmp_path, caplog):
    path = write(
        tmp_path,
        f"imq.bridge.admin.user=admin\nimq.bridge.admin.password={SECRET}\nimq.bridge.admin.pasword={SECRET}\n",
    )
    with caplog.at_level(logging.DEBUG):
        props = load_properties([path], environ={})
    assert props.admin_password == SECRET
    shown = [repr(props), str(props), str(props.redacted()), caplog.text, *(str(w) for w in props.warnings)]
    assert all(SECRET not in text for text in shown)
    assert props.redacted()["imq.bridge.admin.password"] == P.REDACTED


def test_a_secret_with_a_wrong_type_is_not_quoted(monkeypatch):
    row = P.Prop("imq.bridge.admin.password", P.BOOL, None, "for the test", secret=True)
    monkeypatch.setitem(P._FIXED, row.key, row)
    with pytest.raises(ConfigError) as info:
        load_properties(overrides=[f"imq.bridge.admin.password={SECRET}"], environ={})
    assert SECRET not in str(info.value) and "not shown" in str(info.value)


# --- grouped views -------------------------------------------------------------------------------


def test_bridge_view_merges_tm_props_and_resolves_xml_base(tmp_path):
    path = write(
        tmp_path,
        "imq.bridge.activelist=b1,b3\n"
        "imq.bridge.b1.type=JMS\nimq.bridge.b1.xmlurl=conf/b1.xml\n"
        "imq.bridge.b1.autostart=false\n"
        "imq.bridge.tm.props=txlogSize=1m,txlogSync=false\n"
        "imq.bridge.b1.tm.props=txlogSync=true\n"
        "imq.bridge.b1.backoutThreshold=7\nimq.bridge.b1.runner=spark\n"
        "imq.bridge.b1.transaction.batchSize=50\n"
        "imq.bridge.b2.type=jms\nimq.bridge.b2.xmlurl=http://h/b2.xml\n"
        "imq.bridge.b3.type=jms\nimq.bridge.b3.xmlurl=/abs/b3.xml\n"
        "imq.bridge.spark.master=local[2]\n"
        "imq.bridge.spark.conf.spark.ui.enabled=false\n",
    )
    props = load_properties([path], environ={})
    b1 = props.bridge("b1")
    assert (b1.type, b1.xmlurl, b1.xml_base, b1.autostart, b1.active) == ("jms", "conf/b1.xml", tmp_path, False, True)
    assert dict(b1.tm_props) == {"txlogSize": "1m", "txlogSync": "true"}
    assert (b1.backout_threshold, b1.runner, b1.transaction_batch_size) == (7, "spark", 50)
    assert props.bridge("b2").active is False
    assert props.bridge_names == ("b1", "b3", "b2")
    assert props.spark_conf == {"spark.ui.enabled": "false"}
    assert props.get("imq.bridge.spark.master") == "local[2]"


def test_stomp_and_autocreate_views():
    props = load_properties(
        overrides=[
            "imq.hostname=h1",
            "imq.bridge.stomp.tcp.port=17672",
            "imq.bridge.stomp.tls.enabled=true",
            "imq.autocreate.destination.maxTotalMsgBytes=2m",
            "imq.autocreate.destination.limitBehavior=REMOVE_OLDEST",
            "imq.autocreate.topic=false",
        ],
        environ={},
    )
    stomp = props.stomp
    assert (stomp.hostname, stomp.tcp_port, stomp.tls_enabled, stomp.tls_port) == ("h1", 17672, True, 7673)
    limits = props.autocreate
    assert (
        limits.autocreate_queue,
        limits.autocreate_topic,
        limits.max_total_msg_bytes,
        limits.max_bytes_per_msg,
        limits.limit_behavior,
        limits.use_dmq,
    ) == (True, False, 2 * 1024 * 1024, -1, "REMOVE_OLDEST", True)
    override = load_properties(overrides=["imq.hostname=h1", "imq.bridge.stomp.hostname=h2"], environ={})
    assert override.stomp.hostname == "h2"


@pytest.mark.parametrize(
    "overrides,environ,expected",
    [
        ([], {}, Path("var")),
        ([], {"IMQ_VARHOME": "/srv/imq"}, Path("/srv/imq")),
        (["imq.varhome=/opt/v"], {"IMQ_VARHOME": "/srv/imq"}, Path("/opt/v")),
    ],
)
def test_var_home_precedence(overrides, environ, expected, monkeypatch):
    monkeypatch.setattr("bridgemgr.props.DEFAULT_VARHOME", "var")  # (conftest moves it for the others)
    props = load_properties(overrides=[*overrides, "imq.instancename=b7"], environ=environ)
    assert props.var_home == expected
    assert props.bridge_dir("orders") == expected / "instances" / "b7" / "bridges" / "orders"


def test_parse_properties_never_raises_and_keeps_good_values():
    props, problems = parse_properties(overrides=["imq.portmapper.port=x", "imq.instancename=ok"], environ={})
    assert [p.severity for p in problems] == ["error"]
    assert props.get("imq.portmapper.port") == 7676 and props.get("imq.instancename") == "ok"


KEYS = [
    *sorted(DEFAULTS),
    "imq.bridge.spark.conf.a",
    "imq.bridge.x y.type",
    "imq.bridge..type",
    "imq.bridge.b1.type.extra",
    "imq.bridge.",
    "imq.bridge.admin.type",
]


NAME_LISTS = st.lists(
    st.sampled_from(["b1", "stomp", "admin", "a.b", "", " ", "x y", "tm", "spark", "B-2_c"]), max_size=4
).map(",".join)


@pytest.mark.slow
@given(
    st.lists(st.tuples(st.one_of(st.sampled_from(KEYS), st.text(max_size=30)), st.text(max_size=30)), max_size=12),
    NAME_LISTS,
)
def test_any_properties_give_config_error_or_properties(pairs, active):
    overrides = [f"imq.bridge.activelist={active}"] + [f"{k}={v}" for k, v in pairs]
    props, _problems = parse_properties(overrides=overrides, environ={})
    try:
        loaded = load_properties(overrides=overrides, environ={})
    except ConfigError as exc:
        assert exc.errors
    else:
        assert loaded.warnings == props.warnings
    for name in props.bridge_names:
        assert props.bridge(name).type == props.bridge_type(name)
    assert props.stomp and props.autocreate and repr(props)


def test_memory_thresholds_must_rise_from_green_to_red():
    _, problems = parse_properties(overrides=["imq.yellow.threshold=95"], environ={})
    assert [p.message for p in problems if p.severity == "error"] == [
        "the memory thresholds must rise from green to red: imq.green/yellow/orange/red.threshold are 0/95/90/98"
    ]
    _, problems = parse_properties(overrides=["imq.red.threshold=101"], environ={})
    assert any("imq.red.threshold" in str(p) for p in problems)
