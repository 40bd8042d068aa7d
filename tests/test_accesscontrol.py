"""The access control file: its parser (round trip, clear errors on any text), the
original's precedence rules (the documented examples, and a property test against a
model of them), and AccessControl (re-read on change, DMQs protected, refusals logged
once, per-service settings)."""

from __future__ import annotations

import logging
import os
import re
import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgemgr.accesscontrol import (
    VERSION,
    AccessControl,
    AccessControlError,
    AccessRules,
    RuleKey,
    open_access_controls,
)
from bridgemgr.jms.destination import Queue, TemporaryQueue, Topic
from bridgemgr.jms.errors import JMSSecurityException
from bridgemgr.jms.hostbroker import Principal
from bridgemgr.props import load_properties

HEAD = f"version={VERSION}\n"
USER, ADMIN = frozenset({"user"}), frozenset({"admin"})


def rules(text: str) -> AccessRules:
    return AccessRules.parse(HEAD + text, "acl")


# --- precedence: the original's documented examples -------------------------------------------


@pytest.mark.parametrize(
    "text, user, groups, name, allowed",
    [
        # a specific destination's rule overrides the * rule
        ("queue.*.produce.allow.user=*\nqueue.tq1.produce.deny.user=Bob", "Bob", USER, "tq1", False),
        ("queue.*.produce.allow.user=*\nqueue.tq1.produce.deny.user=Bob", "Al", USER, "tq1", True),
        # a named principal overrides *
        ("queue.tq1.produce.allow.user=*\nqueue.tq1.produce.deny.user=Bob", "Bob", USER, "tq1", False),
        # user=* overrides group=*
        ("queue.tq1.produce.allow.user=*\nqueue.tq1.produce.deny.group=*", "Bob", USER, "tq1", True),
        # a user's own rule overrides their group's
        (
            "queue.tq1.produce.allow.group=User\nqueue.tq1.produce.deny.user=Bob",
            "Bob",
            frozenset({"User"}),
            "tq1",
            False,
        ),
        ("queue.tq1.produce.allow.group=User\nqueue.tq1.produce.deny.user=Bob", "Al", frozenset({"User"}), "tq1", True),
        # nothing allowed is denied
        ("", "Bob", USER, "tq1", False),
        # allow and deny of the same principal cancel out
        ("queue.q1.produce.allow.user=Bob\nqueue.q1.produce.deny.user=Bob", "Bob", USER, "q1", False),
        ("queue.q5.produce.allow.group=User\nqueue.q5.produce.deny.group=User", "Al", frozenset({"User"}), "q5", False),
        # the last line of a key wins
        ("queue.tq1.produce.allow.user=Al\nqueue.tq1.produce.allow.user=Bob", "Al", USER, "tq1", False),
        # group=* counts only for a user in a group
        ("queue.tq1.produce.allow.group=*", "Al", frozenset(), "tq1", False),
        # a name with * inside sits between * and the exact name, the more literal one later
        (
            "queue.*.produce.allow.user=*\nqueue.a.*.produce.deny.user=*\nqueue.a.b.produce.allow.user=Al",
            "Al",
            USER,
            "a.b",
            True,
        ),
        (
            "queue.*.produce.allow.user=*\nqueue.a.*.produce.deny.user=*\nqueue.a.b.produce.allow.user=Al",
            "Bo",
            USER,
            "a.b",
            False,
        ),
        (
            "queue.*.produce.deny.user=*\nqueue.a*.produce.allow.user=*\nqueue.ab*.produce.deny.user=*",
            "Al",
            USER,
            "abc",
            False,
        ),
    ],
)
def test_the_originals_precedence(text, user, groups, name, allowed):
    assert rules(text).decide(user, groups, "queue", name, "produce") is allowed


def test_the_shipped_file_keeps_system_and_bridge_destinations_for_admins():
    from bridgemgr.accesscontrol import SHIPPED_FILE

    shipped = AccessRules.parse(SHIPPED_FILE.read_text(), "shipped")
    for name in ("imq.bridge.jms.dmq", "mq.sys.dmq", "imq.bridge.x"):
        for op in ("produce", "consume", "browse"):
            assert not shipped.decide("pat", USER, "queue", name, op)
            assert shipped.decide("root", ADMIN, "queue", name, op)
    assert shipped.decide("pat", USER, "queue", "orders", "consume")
    assert shipped.decide("pat", USER, "topic", "news", "produce")
    assert shipped.decide("pat", USER, "queue", None, "create")
    assert shipped.decide("pat", USER, "connection", "NORMAL", None)
    assert not shipped.decide("pat", USER, "connection", "ADMIN", None)
    assert shipped.decide("root", ADMIN, "connection", "ADMIN", None)


# --- the parser ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, where, says",
    [
        ("queue.q.produce.allow.user=*\n", "acl:1", "version="),
        ("version=JMQFileAccessControlModel/200\n", "acl:1", "version is"),
        (HEAD + "\n# c\nqueue.q.send.allow.user=*\n", "acl:4", "'send' is not one of produce, consume, browse"),
        (HEAD + "topic.t.browse.allow.user=*\n", "acl:2", "topic operation 'browse'"),
        (HEAD + "queue.q.produce.permit.user=*\n", "acl:2", "must be allow or deny"),
        (HEAD + "queue.q.produce.allow.users=*\n", "acl:2", "must be user or group"),
        (HEAD + "connection.FAST.allow.user=*\n", "acl:2", "service type"),
        (HEAD + "queue.q.produce.allow.user= , \n", "acl:2", "lists no users"),
        (HEAD + "queues.q.produce.allow.user=a\n", "acl:2", "a rule starts with"),
        (HEAD + "queue.q..produce.allow.user=a\n", "acl:2", "not a destination name"),
    ],
)
def test_a_bad_line_is_named_by_file_and_line(text, where, says):
    with pytest.raises(AccessControlError, match=re.escape(where) + ".*" + re.escape(says)):
        AccessRules.parse(text, "acl")


def test_properties_syntax_continuations_separators_and_comments():
    parsed = AccessRules.parse(
        "! a comment\n  version : " + VERSION + "\n"
        "queue.q.produce.allow.user = a,\\\n    b ,c\n"
        "topic.create.deny.group\tadmin\n",
        "acl",
    )
    assert parsed.rules == {
        RuleKey("queue", "q", "produce", "allow", "user"): frozenset({"a", "b", "c"}),
        RuleKey("topic", None, "create", "deny", "group"): frozenset({"admin"}),
    }


NAME = st.text(st.sampled_from("abcXY_-*"), min_size=1, max_size=6)
PRINCIPALS = st.frozensets(
    st.text(st.sampled_from("abcdefg*"), min_size=1, max_size=4).filter(lambda n: n == "*" or "*" not in n),
    min_size=1,
    max_size=3,
)


@st.composite
def rule_keys(draw) -> RuleKey:
    resource = draw(st.sampled_from(["connection", "queue", "topic", "durable"]))
    access, ptype = draw(st.sampled_from(["allow", "deny"])), draw(st.sampled_from(["user", "group"]))
    if resource == "connection":
        return RuleKey(resource, draw(st.sampled_from(["NORMAL", "ADMIN", "*"])), None, access, ptype)
    if resource == "durable":  # <clientid>.<name>, or *
        name = draw(st.just("*") | st.lists(NAME, min_size=2, max_size=3).map(".".join))
        return RuleKey(resource, name, draw(st.sampled_from(["consume", "unsubscribe"])), access, ptype)
    if draw(st.booleans()):
        return RuleKey(resource, None, "create", access, ptype)
    ops = ["produce", "consume", "browse"] if resource == "queue" else ["produce", "consume"]
    name = ".".join(draw(st.lists(NAME, min_size=1, max_size=3)))
    return RuleKey(resource, name, draw(st.sampled_from(ops)), access, ptype)


@pytest.mark.slow
@given(st.dictionaries(rule_keys(), PRINCIPALS, max_size=12))
def test_rules_survive_a_round_trip_through_their_text(table):
    original = AccessRules(table)
    assert AccessRules.parse(original.text(), "acl") == original


@settings(max_examples=300)
@given(
    st.text(
        st.sampled_from(
            "queuetopicconnection.*=:,\\\n #!allowdenyusergroupproduceNORMALversionJMQFileAccessControlModel/100\t\x00é"
        ),
        max_size=200,
    )
)
@pytest.mark.slow
def test_any_text_parses_or_fails_naming_its_line(text):
    try:
        AccessRules.parse(text, "f.properties")
    except AccessControlError as exc:
        assert re.match(r"f\.properties:\d+: ", str(exc)), exc


# --- the precedence, as a property ---------------------------------------------------------------


def model(table: dict[RuleKey, frozenset[str]], user: str, groups: frozenset[str], name: str) -> bool:
    """The original's decision for "queue <name> produce", written out plainly: levels from
    the general (*) through names with * inside (fewest literal characters first) to the
    exact name; in a level, the user's own rule, then their groups', then user=*, then
    group=* (for users in a group); allow + deny of one principal decide nothing."""

    def verdict(names_allow, names_deny, who):
        a, d = who in names_allow, who in names_deny
        return None if a == d else a

    def level(variant):
        def get(access, ptype):
            return table.get(RuleKey("queue", variant, "produce", access, ptype), frozenset())

        ua, ud, ga, gd = get("allow", "user"), get("deny", "user"), get("allow", "group"), get("deny", "group")
        each = [verdict(ga, gd, g) for g in groups]
        mine = None if (True in each) == (False in each) else (True in each)
        order = [verdict(ua, ud, user), mine, verdict(ua, ud, "*")]
        if groups:
            order.append(verdict(ga, gd, "*"))
        return next((v for v in order if v is not None), None)

    patterns = sorted(
        {
            k.variant
            for k in table
            if k.variant
            and k.variant != "*"
            and "*" in k.variant
            and k.resource == "queue"
            and k.operation == "produce"
            and re.fullmatch(".*".join(map(re.escape, k.variant.split("*"))), name)
        },
        key=lambda v: (len(v.replace("*", "")), v),
    )
    decided = None
    for variant in ["*", *patterns, name]:
        v = level(variant)
        decided = v if v is not None else decided
    return decided is True


@st.composite
def queue_rules(draw):
    names = ["*", "q", "q*", "*q", "q.*", "*"]
    table = {}
    for _ in range(draw(st.integers(0, 8))):
        key = RuleKey(
            "queue",
            draw(st.sampled_from(names)),
            "produce",
            draw(st.sampled_from(["allow", "deny"])),
            draw(st.sampled_from(["user", "group"])),
        )
        table[key] = draw(st.frozensets(st.sampled_from(["*", "al", "bo", "g1", "g2"]), min_size=1))
    return table


@pytest.mark.slow
@given(
    queue_rules(),
    st.sampled_from(["al", "bo", "cy"]),
    st.frozensets(st.sampled_from(["g1", "g2", "g3"])),
    st.sampled_from(["q", "q.x", "xq", "r"]),
)
def test_a_rule_always_decides_as_the_precedence_says(table, user, groups, name):
    assert AccessRules(table).decide(user, groups, "queue", name, "produce") is model(table, user, groups, name)


# --- AccessControl ----------------------------------------------------------------------------------


def control(tmp_path, text: str) -> AccessControl:
    path = tmp_path / "acl.properties"
    path.write_text(HEAD + text)
    return AccessControl("jms", path)


def test_an_edited_file_applies_from_the_next_login(tmp_path):
    ac = control(tmp_path, "connection.NORMAL.allow.user=*\nqueue.*.consume.allow.user=*\n")
    pat = Principal("pat", USER, service="jms")
    ac.check(pat, "consume", Queue("q"))
    st_before = ac.path.stat()
    ac.path.write_text(HEAD + "connection.NORMAL.allow.user=*\nqueue.*.consume.deny.user=pat\n")
    os.utime(ac.path, ns=(st_before.st_atime_ns, st_before.st_mtime_ns + 1_000_000))
    ac.check(pat, "consume", Queue("q"))  # the cached decision, until a login looks at the file
    ac.check_connection(pat)
    with pytest.raises(JMSSecurityException, match="may not consume queue://q"):
        ac.check(pat, "consume", Queue("q"))


def test_a_broken_edit_keeps_the_rules_in_force(tmp_path, caplog):
    ac = control(tmp_path, "connection.NORMAL.allow.user=*\n")
    ac.path.write_text("not an acl file\n")
    ac.check_connection(Principal("pat", USER))
    assert "the rules read before stay in force" in caplog.text


def test_temporaries_autocreate_and_protected_dmqs(tmp_path):
    ac = control(tmp_path, "queue.*.produce.allow.user=*\ntopic.*.produce.allow.user=*\nqueue.create.deny.user=*\n")
    pat, root = Principal("pat", USER), Principal("root", ADMIN)
    ac.check(pat, "consume", TemporaryQueue("tmp1"))  # a client's own
    ac.check(pat, "produce", Queue("exists"))
    with pytest.raises(JMSSecurityException, match="may not create queue://new"):
        ac.check(pat, "produce", Queue("new"), lambda dest: True)
    ac.protect([Topic("dead.letters")])
    with pytest.raises(JMSSecurityException, match=r"may not produce topic://dead\.letters"):
        ac.check(pat, "produce", Topic("dead.letters"))
    ac.check(root, "produce", Topic("dead.letters"))


def test_a_refusal_is_logged_once_per_user_operation_and_destination(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    ac = control(tmp_path, "")
    for _ in range(5):
        for dest in (Queue("a"), Queue("b")):
            with pytest.raises(JMSSecurityException):
                ac.check(Principal("pat", USER, "1.2.3.4:5"), "produce", dest)
    lines = [r.getMessage() for r in caplog.records if "access denied" in r.getMessage()]
    assert len(lines) == 2 and "user 'pat' may not produce queue://a" in lines[0]


def test_settings_per_service_and_the_default_file(tmp_path):
    var = tmp_path / "var"
    custom = tmp_path / "stomp.properties"
    custom.write_text(HEAD + "connection.NORMAL.allow.user=*\n")
    props = load_properties(
        overrides=[
            f"imq.varhome={var}",
            "imq.jms.accesscontrol.enabled=false",
            f"imq.stomp.accesscontrol.file.filename={custom}",
        ]
    )
    controls = open_access_controls(props)
    assert set(controls) == {None, "stomp", "admin"}
    installed = var / "instances" / "imqbroker" / "etc" / "accesscontrol.properties"
    assert stat.S_IMODE(installed.stat().st_mode) == 0o600
    assert controls["stomp"].path == custom and controls["admin"].path == installed
    assert controls["admin"].service_type == "ADMIN"
    missing = load_properties(overrides=[f"imq.varhome={var}", "imq.accesscontrol.file.filename=nope.properties"])
    with pytest.raises(AccessControlError, match=r"nope\.properties"):
        open_access_controls(missing)
