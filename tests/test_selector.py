"""Tests for bridgemgr.jms.selector: the JMS 1.1 message selector language.

Unit tests pin each rule; two hypothesis tests check the compiled evaluator against
a plain tree-walking reference evaluator (written here, over trees generated here) and
check that arbitrary text either compiles or raises InvalidSelectorError.
"""

from __future__ import annotations

import pickle
import string
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridgemgr.jms.errors import InvalidSelectorError
from bridgemgr.jms.message import DeliveryMode, TextMessage
from bridgemgr.jms.selector import MAX_DEPTH, Selector, compile_selector, message_lookup

T, F, U = True, False, None
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1


def ev(text: str, **values: Any) -> bool | None:
    """Three-valued result of ``text`` with identifiers looked up in ``values``."""
    selector = compile_selector(text)
    assert selector is not None
    return selector.evaluate(values.get)


def msg(**props: Any) -> TextMessage:
    m = TextMessage("body")
    for name, value in props.items():
        m.set_object_property(name, value)
    return m


def matches(text: str, message: TextMessage) -> bool:
    selector = compile_selector(text)
    assert selector is not None
    return selector.matches(message)


def error(text: str) -> InvalidSelectorError:
    with pytest.raises(InvalidSelectorError) as info:
        compile_selector(text)
    return info.value


# ---------------------------------------------------------------------------
# API


@pytest.mark.parametrize("text", [None, "", "   ", "\t\n\f\r "])
def test_no_selector_is_none(text: str | None) -> None:
    assert compile_selector(text) is None


def test_compiled_selectors_are_cached_and_keep_their_text() -> None:
    s = compile_selector(" a = 1 ")
    assert isinstance(s, Selector)
    assert s.text == " a = 1 "
    assert compile_selector(" a = 1 ") is s
    assert repr(s) == "Selector(' a = 1 ')"


def test_selector_pickles_by_text() -> None:
    s = compile_selector("color = 'red'")
    clone = pickle.loads(pickle.dumps(s))
    assert clone.text == s.text
    assert clone.matches(msg(color="red"))


def test_matches_only_on_true() -> None:
    assert matches("a = 1", msg(a=1)) is True
    assert matches("a = 1", msg(a=2)) is False
    assert matches("a = 1", msg()) is False  # UNKNOWN does not match
    assert matches("NOT (a = 1)", msg()) is False  # nor does NOT UNKNOWN


def test_evaluate_agrees_with_matches_through_message_lookup() -> None:
    m = msg(color="red", weight=12)
    m.priority = 8
    for text in [
        "color = 'red' AND weight > 10",
        "JMSPriority < 5",
        "missing = 1",
        "NOT missing = 1",
        "JMSDeliveryMode = 'PERSISTENT'",
    ]:
        s = compile_selector(text)
        assert s.matches(m) is (s.evaluate(message_lookup(m)) is True)


def test_evaluate_passes_header_names_to_the_lookup() -> None:
    seen: list[str] = []

    def lookup(name: str) -> Any:
        seen.append(name)
        return {"JMSPriority": 9, "JMSType": "t"}.get(name)

    assert compile_selector("JMSPriority = 9 AND JMSType = 't'").evaluate(lookup) is True
    assert seen == ["JMSPriority", "JMSType"]


# ---------------------------------------------------------------------------
# three-valued logic

VALUES = [T, F, U]


@pytest.mark.parametrize("a", VALUES)
@pytest.mark.parametrize("b", VALUES)
def test_and_or_truth_tables(a: bool | None, b: bool | None) -> None:
    and_table = {(T, T): T, (T, F): F, (T, U): U, (F, T): F, (F, F): F, (F, U): F, (U, T): U, (U, F): F, (U, U): U}
    or_table = {(T, T): T, (T, F): T, (T, U): T, (F, T): T, (F, F): F, (F, U): U, (U, T): T, (U, F): U, (U, U): U}
    assert ev("a AND b", a=a, b=b) is and_table[a, b]
    assert ev("a OR b", a=a, b=b) is or_table[a, b]
    # the same with comparisons as operands (UNKNOWN from a NULL)
    assert ev("(x = 1) AND (y = 1)", x=_one(a), y=_one(b)) is and_table[a, b]
    assert ev("x = 1 OR y = 1", x=_one(a), y=_one(b)) is or_table[a, b]


def _one(truth: bool | None) -> int | None:
    return None if truth is None else 1 if truth else 0


@pytest.mark.parametrize("a,expected", [(T, F), (F, T), (U, U)])
def test_not_truth_table(a: bool | None, expected: bool | None) -> None:
    assert ev("NOT a", a=a) is expected
    assert ev("NOT NOT a", a=a) is a


def test_long_chains_of_and_or() -> None:
    names = {f"p{i}": i for i in range(300)}
    text = " AND ".join(f"p{i} = {i}" for i in range(300))
    assert ev(text, **names) is True
    assert ev(text + " AND p0 = 1", **names) is False
    assert ev(" OR ".join(f"p{i} = -1" for i in range(300)) + " OR p299 = 299", **names) is True
    assert ev("a AND b AND c", a=T, b=U, c=T) is U
    assert ev("a AND b AND c", a=T, b=U, c=F) is F
    assert ev("a OR b OR c", a=F, b=U, c=T) is T
    assert ev("a OR b OR c", a=F, b=U, c=F) is U


def test_precedence_not_and_or() -> None:
    assert ev("a OR b AND c", a=T, b=F, c=F) is T  # a OR (b AND c)
    assert ev("(a OR b) AND c", a=T, b=F, c=F) is F
    assert ev("NOT a AND b", a=F, b=F) is F  # (NOT a) AND b
    assert ev("NOT a OR b", a=T, b=T) is T
    assert ev("NOT a = 1", a=2) is T  # NOT (a = 1)


def test_identifier_as_condition_uses_boolean_values_only() -> None:
    assert matches("flag", msg(flag=True))
    assert not matches("flag", msg(flag=False))
    assert ev("flag", flag=1) is U
    assert ev("flag", flag="true") is U
    assert ev("NOT flag", flag=0) is U
    assert ev("flag", flag=None) is U
    assert ev("(flag)", flag=True) is T


def test_boolean_literals_and_comparisons() -> None:
    assert ev("TRUE") is T
    assert ev("false") is F
    assert ev("flag = TRUE", flag=True) is T
    assert ev("flag <> false", flag=True) is T
    assert ev("flag = TRUE", flag=1) is F  # non-like types compare false (JMS 1.1 3.8.1.1)
    assert ev("(a > 1) = (b > 1)", a=2, b=3) is T
    assert ev("(a > 1) <> TRUE", a=2) is F
    assert ev("flag < TRUE", flag=False) is F  # booleans are not ordered
    assert ev("flag >= flag", flag=True) is F
    assert ev("flag < TRUE") is U  # but NULL stays UNKNOWN


# ---------------------------------------------------------------------------
# comparison and arithmetic


@pytest.mark.parametrize(
    "text,expected",
    [
        ("a = 5", T),
        ("a <> 5", F),
        ("a < 6", T),
        ("a > 6", F),
        ("a <= 5", T),
        ("a >= 5.0", T),
        ("a = 5.0", T),
        ("5 = a", T),
        ("6 > a", T),
        ("6 < a", F),
        ("4.5 <= a", T),
        ("a > 4.99", T),
        ("a = b", F),
        ("a < b", T),
        ("b - a = 2.5", T),
    ],
)
def test_numeric_comparison_with_promotion(text: str, expected: bool) -> None:
    assert ev(text, a=5, b=7.5) is expected


def test_long_is_promoted_to_double_as_in_java() -> None:
    # (double) 9007199254740993L == 9007199254740992.0 in Java
    assert ev("a = 9007199254740992.0", a=2**53 + 1) is T
    assert ev("a = b", a=2**53 + 1, b=float(2**53)) is T
    assert ev("a = 9007199254740993", a=2**53 + 1) is T
    assert ev("a = 9007199254740992", a=2**53 + 1) is F


def test_nan_and_infinity_compare_as_ieee() -> None:
    nan, inf = float("nan"), float("inf")
    assert ev("a = a", a=nan) is F
    assert ev("a <> a", a=nan) is T
    assert ev("a < 1", a=nan) is F
    assert ev("a > 1E300", a=inf) is T
    assert ev("a BETWEEN 0 AND 1", a=nan) is F


@pytest.mark.parametrize("text", ["s = 'abc'", "'abc' = s", "s <> 'abd'"])
def test_string_equality(text: str) -> None:
    assert ev(text, s="abc") is T


@pytest.mark.parametrize("text", ["s < 'b'", "s > 'a'", "s <= 'abc'", "'a' < s", "s >= t"])
def test_strings_are_not_ordered(text: str) -> None:
    assert ev(text, s="abc", t="abc") is F


@pytest.mark.parametrize(
    "text,values",
    [
        ("s = 5", {"s": "5"}),
        ("s <> 5", {"s": "5"}),
        ("n = '5'", {"n": 5}),
        ("n = TRUE", {"n": 1}),
        ("b = 1", {"b": True}),
        ("s = b", {"s": "true", "b": True}),
        ("'1' = 1", {}),
        ("TRUE = 1", {}),
        ("TRUE <> 'TRUE'", {}),
    ],
)
def test_different_kinds_compare_as_false(text: str, values: dict) -> None:
    """JMS 1.1 3.8.1.1: "If the comparison of non-like type values is attempted, the
    value of the operation is false" (as OpenMQ evaluates it)."""
    assert ev(text, **values) is F
    assert ev(f"NOT ({text})", **values) is T


@pytest.mark.parametrize(
    "text", ["a = 1", "a <> 1", "a < 1", "1 = a", "a = 'x'", "a <> 'x'", "a = TRUE", "a = b", "a + 1 = 2"]
)
def test_null_compares_as_unknown(text: str) -> None:
    assert ev(text) is U


@pytest.mark.parametrize(
    "text,expected",
    [
        ("2 + 3 * 4 = 14", T),
        ("(2 + 3) * 4 = 20", T),
        ("10 - 4 - 3 = 3", T),
        ("24 / 4 / 2 = 3", T),
        ("-a = -5", T),
        ("- -a = 5", T),
        ("+a = 5", T),
        ("-a * 2 = -10", T),
        ("a / 2 = 2", T),
        ("-a / 2 = -2", T),
        ("a / -2 = -2", T),
        ("-7 / 2 = -3", T),
        ("a / 2.0 = 2.5", T),
        ("a * 1.5 = 7.5", T),
        ("a - 0.5 = 4.5", T),
        ("1 + 2 * 3 - 4 / 2 = 5", T),
        ("7 / 2 * 2 = 6", T),
        ("3 - -2 = 5", T),
    ],
)
def test_arithmetic(text: str, expected: bool) -> None:
    assert ev(text, a=5) is expected


def test_integer_arithmetic_wraps_like_java_long() -> None:
    assert ev("a + 1 = -9223372036854775808", a=LONG_MAX) is T
    assert ev("a - 1 = 9223372036854775807", a=LONG_MIN) is T
    assert ev("a * 2 = -2", a=LONG_MAX) is T
    assert ev("a / -1 = a", a=LONG_MIN) is T
    assert ev("-a = a", a=LONG_MIN) is T
    assert ev("a * a * a * a > 0 OR a * a * a * a <= 0", a=LONG_MAX) is T


def test_huge_values_from_a_lookup_do_not_crash() -> None:
    assert ev("a > 1.5", a=10**400) is T
    assert ev("a + 0.5 > 1", a=10**400) is T
    assert ev("a = a + 0", a=10**400) is F  # wrapped to a long on the right
    assert ev("a < 1E308", a=-(10**400)) is T


@pytest.mark.parametrize(
    "text",
    ["a / 0 = 1", "a / 0.0 > 0", "a / b > 0", "1.5 / b < 0", "a / (b * 1) <> 1", "NOT a / -0.0 = 1", "0 / 0 = 0"],
)
def test_division_by_zero_is_null(text: str) -> None:
    assert ev(text, a=5, b=0) is U


@pytest.mark.parametrize(
    "text,values",
    [
        ("s + 1 = 2", {"s": "1"}),
        ("b * 1 = 1", {"b": True}),
        ("-s = 1", {"s": "1"}),
        ("+s = 1", {"s": "1"}),
        ("n + m = 1", {"n": 1}),
        ("-b = -1", {"b": True}),
        ("s / 1 = 1", {"s": "1"}),
        ("(s - 1) * 2 > 0", {"s": "1"}),
    ],
)
def test_arithmetic_on_a_non_number_is_null(text: str, values: dict) -> None:
    assert ev(text, **values) is U


# ---------------------------------------------------------------------------
# BETWEEN, IN, LIKE, IS NULL


@pytest.mark.parametrize("value,inside", [(4, F), (5, T), (7, T), (10, T), (11, F), (9.99, T), (10.01, F), (4.999, F)])
def test_between_is_inclusive(value: float, inside: bool) -> None:
    assert ev("x BETWEEN 5 AND 10", x=value) is inside
    assert ev("x NOT BETWEEN 5 AND 10", x=value) is (not inside)
    assert ev("x between 5.0 and 2 * 5", x=value) is inside


def test_between_with_nulls_and_strings() -> None:
    assert ev("x BETWEEN 1 AND 10") is U
    assert ev("x NOT BETWEEN 1 AND 10") is U
    assert ev("x BETWEEN lo AND 10", x=5) is U
    assert ev("x BETWEEN lo AND 3", x=5) is F  # x <= 3 is FALSE whatever lo is
    assert ev("x NOT BETWEEN lo AND 3", x=5) is T
    assert ev("x BETWEEN 1 AND 10", x="5") is F  # x >= 1 AND x <= 10 with non-like types
    assert ev("x BETWEEN 1 AND 10", x=True) is F


def test_between_binds_its_own_and() -> None:
    assert ev("x BETWEEN 1 AND 5 AND y", x=3, y=True) is T
    assert ev("x BETWEEN 1 AND 5 AND y", x=3, y=False) is F
    assert ev("x BETWEEN 1 + 1 AND 5 - 1 OR y", x=5, y=False) is F


@pytest.mark.parametrize(
    "text",
    [
        "a BETWEEN 'x' AND 'y'",
        "a BETWEEN 1 AND 'y'",
        "'5' BETWEEN 1 AND 9",
        "a BETWEEN TRUE AND 1",
        "a BETWEEN (b = 1) AND 3",
    ],
)
def test_between_takes_arithmetic_only(text: str) -> None:
    assert "must be a numeric expression" in str(error(text))


def test_in() -> None:
    assert ev("c IN ('red', 'green')", c="red") is T
    assert ev("c IN ('red', 'green')", c="blue") is F
    assert ev("c NOT IN ('red', 'green')", c="blue") is T
    assert ev("c NOT IN ('red', 'green')", c="red") is F
    assert ev("c IN ('only')", c="only") is T
    assert ev("c IN ('it''s')", c="it's") is T
    assert ev("c in ('RED')", c="red") is F  # values are case-sensitive


def test_in_with_null_and_non_strings_is_unknown() -> None:
    for text in ["c IN ('a', 'b')", "c NOT IN ('a', 'b')"]:
        assert ev(text) is U
        assert ev(text, c=1) is U
        assert ev(text, c=True) is U


@pytest.mark.parametrize("text", ["c IN (1, 2)", "c IN ('a', 2)", "c IN ()", "c IN 'a'", "c IN (TRUE)", "c IN ('a',)"])
def test_in_takes_string_literals_only(text: str) -> None:
    error(text)


@pytest.mark.parametrize(
    "pattern,value,expected",
    [
        ("12%3", "123", T),
        ("12%3", "12993", T),
        ("12%3", "1234", F),
        ("l_se", "lose", T),
        ("l_se", "loose", F),
        ("%", "", T),
        ("_", "", F),
        ("", "", T),
        ("a%", "abc", T),
        ("%c", "abc", T),
        ("%b%", "abc", T),
        ("%x%", "abc", F),
        ("a_c", "a\nc", T),
        ("a%c", "a\n\nc", T),
        ("%", "multi\nline", T),
        ("a.c", "abc", F),
        ("a.c", "a.c", T),
        ("a*", "aaa", F),
        ("a*", "a*", T),
        ("(a)", "(a)", T),
        ("(a)", "a", F),
        ("[ab]", "a", F),
        ("[ab]", "[ab]", T),
        ("a+b?", "a+b?", T),
        ("a+b?", "aab", F),
        ("^a$", "^a$", T),
        ("x|y", "x", F),
        ("x|y", "x|y", T),
        ("\\d", "\\d", T),
        ("\\d", "1", F),
        ("{1}", "{1}", T),
        ("%a%a%a%b", "aaab", T),
        ("%a%a%a%b", "aab", F),
        ("_%_", "ab", T),
        ("_%_", "a", F),
        ("it''s%", "it's here", T),
        ("ABC", "abc", F),
    ],
)
def test_like(pattern: str, value: str, expected: bool) -> None:
    assert ev(f"s LIKE '{pattern}'", s=value) is expected
    assert ev(f"s NOT LIKE '{pattern}'", s=value) is (not expected)


@pytest.mark.parametrize(
    "pattern,escape,value,expected",
    [
        ("\\_%", "\\", "_foo", T),
        ("\\_%", "\\", "bar", F),
        ("100!%", "!", "100%", T),
        ("100!%", "!", "1000", F),
        ("a!!b", "!", "a!b", T),
        ("a!!b", "!", "a!!b", F),
        ("!a", "!", "a", T),
        ("x%%", "%", "x%", T),
        ("x%%", "%", "xy", F),
        ("x__", "_", "x_", T),
        ("%''_", "'", "it_", T),
        ("%''_", "'", "its", F),
        ("a.b", ".", "ab", T),
    ],
)
def test_like_escape(pattern: str, escape: str, value: str, expected: bool) -> None:
    esc = escape.replace("'", "''")
    assert ev(f"s LIKE '{pattern}' ESCAPE '{esc}'", s=value) is expected
    assert ev(f"s NOT LIKE '{pattern}' escape '{esc}'", s=value) is (not expected)


def test_like_with_null_or_non_string_is_unknown() -> None:
    for text in ["s LIKE 'a%'", "s NOT LIKE 'a%'"]:
        assert ev(text) is U
        assert ev(text, s=1) is U
        assert ev(text, s=False) is U


@pytest.mark.parametrize(
    "text,message",
    [
        ("s LIKE 5", "expected a string literal"),
        ("s LIKE t", "expected a string literal"),
        ("s LIKE 'a' ESCAPE ''", "must be one character"),
        ("s LIKE 'a' ESCAPE 'ab'", "must be one character"),
        ("s LIKE 'a' ESCAPE 1", "expected a string literal"),
        ("s LIKE 'ab!' ESCAPE '!'", "ends with its escape character"),
        ("'abc' LIKE 'a%'", "must be an identifier"),
        ("(s) + 1 LIKE 'a%'", "must be an identifier"),
    ],
)
def test_like_errors(text: str, message: str) -> None:
    assert message in str(error(text))


def test_like_does_not_backtrack_catastrophically() -> None:
    selector = compile_selector("s LIKE '%a%a%a%a%a%a%a%a%a%a%b' OR s LIKE '%_%_%_%_%_%_%_%c'")
    value = "a" * 20000
    started = time.perf_counter()
    assert selector.evaluate({"s": value}.get) is F
    assert time.perf_counter() - started < 2


def test_is_null() -> None:
    m = msg(present=1, text="")
    assert matches("missing IS NULL", m)
    assert not matches("missing IS NOT NULL", m)
    assert matches("present IS NOT NULL", m)
    assert matches("text is not null", m)
    assert not matches("present IS NULL", m)
    assert ev("x IS NULL", x=float("nan")) is F
    assert ev("NOT x IS NULL", x=False) is T


@pytest.mark.parametrize("text", ["1 IS NULL", "'a' IS NULL", "(a + 1) IS NULL", "(a = 1) IS NOT NULL"])
def test_is_null_takes_an_identifier(text: str) -> None:
    assert "must be an identifier" in str(error(text))


# ---------------------------------------------------------------------------
# headers and properties


def test_header_fields() -> None:
    m = TextMessage("x")
    m.priority = 7
    m.delivery_mode = 1
    m.message_id = "ID:42"
    m.timestamp = 1_700_000_000_000
    m.correlation_id = "corr-1"
    m.type = "order"
    assert matches("JMSPriority = 7 AND JMSPriority > 6", m)
    assert matches("JMSDeliveryMode = 'NON_PERSISTENT'", m)
    assert matches("JMSMessageID = 'ID:42'", m)
    assert matches("JMSTimestamp > 1600000000000 AND JMSTimestamp < 1800000000000", m)
    assert matches("JMSCorrelationID LIKE 'corr-%'", m)
    assert matches("JMSType IN ('order', 'invoice')", m)
    m.delivery_mode = 2
    assert matches("JMSDeliveryMode = 'PERSISTENT'", m)
    m.delivery_mode = DeliveryMode.NON_PERSISTENT
    assert matches("JMSDeliveryMode <> 'PERSISTENT'", m)


def test_unset_header_fields_are_null() -> None:
    m = TextMessage("x")
    assert matches("JMSMessageID IS NULL AND JMSCorrelationID IS NULL AND JMSType IS NULL", m)
    assert not matches("JMSType = 'x'", m)
    assert not matches("NOT JMSType = 'x'", m)
    assert matches("JMSDeliveryMode = 'PERSISTENT' AND JMSPriority = 4", m)  # defaults


@pytest.mark.parametrize("name", ["JMSDestination", "JMSReplyTo", "JMSExpiration", "JMSRedelivered", "JMSDeliveryTime"])
def test_other_jms_names_are_properties_and_null(name: str) -> None:
    m = TextMessage("x")
    m.expiration = 5
    m.redelivered = True
    assert matches(f"{name} IS NULL", m)
    assert not matches(f"{name} = 5 OR {name} OR {name} IS NOT NULL", m)


def test_jmsx_delivery_count() -> None:
    m = msg()
    m.delivery_count = 3
    assert matches("JMSXDeliveryCount = 3", m)
    assert matches("JMSXDeliveryCount > 1 AND JMSXDeliveryCount BETWEEN 2 AND 3", m)
    m.delivery_count = 1
    assert not matches("JMSXDeliveryCount > 1", m)


def test_typed_properties() -> None:
    m = TextMessage("x")
    m.set_byte_property("b", -3)
    m.set_short_property("s", 300)
    m.set_long_property("l", LONG_MAX)
    m.set_float_property("f", 1.5)
    m.set_double_property("d", 2.25)
    m.set_boolean_property("flag", True)
    m.set_string_property("str", "v")
    assert matches("b = -3 AND s = 300 AND l = 9223372036854775807 AND f = 1.5 AND d = 2.25", m)
    assert matches("flag AND str = 'v' AND b + s = 297 AND f * d = 3.375", m)


def test_message_lookup() -> None:
    m = msg(a=1)
    m.type = "t"
    m.delivery_mode = 1
    lookup = message_lookup(m)
    assert lookup("a") == 1
    assert lookup("JMSType") == "t"
    assert lookup("JMSDeliveryMode") == "NON_PERSISTENT"
    assert lookup("JMSPriority") == 4
    assert lookup("nothing") is None
    assert lookup("JMSExpiration") is None


# ---------------------------------------------------------------------------
# lexical rules


def test_keywords_are_case_insensitive() -> None:
    assert ev("a between 1 and 3 AnD b Is NoT nUlL oR c lIkE 'x' EsCaPe '!' Or c iN ('y')", a=2, b=1) is T
    assert ev("not a = 1", a=2) is T
    assert ev("True AND tRUE and not FALSE") is T
    assert ev("a not between 1 and 2 and b not in ('x') and c not like 'y'", a=3, b="z", c="z") is T


def test_identifiers_are_case_sensitive_and_java_like() -> None:
    assert ev("Color = 'red'", color="red") is U
    assert ev("color = 'red'", color="red") is T
    values = {"$x": 1, "_y": 2, "a1": 3, "é": 4, "x$_9": 5}
    assert ev("$x = 1 AND _y = 2 AND a1 = 3 AND é = 4 AND x$_9 = 5", **values) is T


@pytest.mark.parametrize(
    "name",
    [
        "notable",
        "android",
        "India",
        "ISO",
        "NULLS",
        "between_",
        "likes",
        "escaped",
        "orange",
        "TRUEish",
        "falsey",
        "in2",
        "IS_",
    ],
)
def test_identifiers_starting_with_keywords(name: str) -> None:
    assert ev(f"{name} = 1", **{name: 1}) is T
    assert ev(f"NOT {name}", **{name: False}) is T


@pytest.mark.parametrize("keyword", ["NULL", "null", "NOT", "and", "OR", "between", "LIKE", "in", "IS", "escape"])
def test_keywords_are_not_identifiers(keyword: str) -> None:
    error(f"{keyword} = 1")
    error(f"a = 1 AND {keyword} IS NULL")


@pytest.mark.parametrize(
    "literal,value",
    [
        ("57", 57),
        ("-957", -957),
        ("+62", 62),
        ("7E3", 7000.0),
        ("-57.9E2", -5790.0),
        ("7.", 7.0),
        (".5", 0.5),
        ("1.5e-3", 0.0015),
        ("2E+2", 200.0),
        ("10L", 10),
        ("10l", 10),
        ("2.5D", 2.5),
        ("3d", 3.0),
        ("1.5F", 1.5),
        ("007", 7),
        ("9223372036854775807", LONG_MAX),
        ("-9223372036854775808", LONG_MIN),
        ("- 9223372036854775808", LONG_MIN),
        ("0.1f", 0.10000000149011612),
    ],
)
def test_numeric_literals(literal: str, value: float) -> None:
    assert ev(f"a = {literal}", a=value) is T
    assert ev(f"{literal} = a", a=value) is T


@pytest.mark.parametrize(
    "literal", ["9223372036854775808", "+9223372036854775808", "1" * 30, "1" * 5000, "1e400", "3.5e38f", "0x10"]
)
def test_numeric_literals_out_of_range_or_unsupported(literal: str) -> None:
    error(f"a = {literal}")


def test_string_literals() -> None:
    assert ev("s = 'it''s'", s="it's") is T
    assert ev("s = ''''", s="'") is T
    assert ev("s = ''", s="") is T
    assert ev("s = 'a\nb'", s="a\nb") is T
    assert ev("s = 'AND'", s="AND") is T
    assert "unexpected character" in str(error('s = "x"'))  # no double-quoted strings


def test_whitespace() -> None:
    assert ev("\ta\n=\r\n1\fAND\tb=2 ", a=1, b=2) is T
    assert ev("a=1AND b=2", a=1, b=2) is T  # a number ends where its digits end
    error("a=1ANDb=2")  # 'ANDb' is one identifier


# ---------------------------------------------------------------------------
# errors


@pytest.mark.parametrize(
    "text,pos,fragment",
    [
        ("a = ", 4, "found the end of the selector"),
        ("a = 'abc", 4, "unterminated string literal"),
        ("a = 1 # 2", 6, "unexpected character '#'"),
        ("a == 1", 3, "found '='"),
        ("a != 1", 2, "unexpected character '!'"),
        ("a LIKE 5", 7, "expected a string literal, found '5'"),
        ("a IN (1, 2)", 6, "expected a string literal, found '1'"),
        ("a BETWEEN 'x' AND 'y'", 10, "a bound of BETWEEN must be a numeric expression"),
        ("a BETWEEN 1 OR 2", 12, "found 'OR'"),
        ("5 + 3", 0, "the selector must be a condition, not a number"),
        ("'abc'", 0, "the selector must be a condition, not a string"),
        ("a = 1 AND 5", 10, "an operand of AND must be a condition"),
        ("NOT 'x'", 4, "the operand of NOT must be a condition"),
        ("a + 'x' = 1", 4, "an operand of '+' must be a numeric expression, not a string"),
        ("-TRUE = 1", 1, "the operand of unary '-' must be a numeric expression, not a boolean"),
        ("(a = 1) * 2 = 2", 1, "must be a numeric expression, not a boolean"),
        ("a = b = c", 6, "found '='"),
        ("(a = 1", 6, "expected one of"),
        ("a = 1)", 5, "found ')'"),
        ("a = NULL", 4, "found 'NULL'"),
        ("a IS 5", 5, "NOT, NULL"),
        ("a = 1 OR", 8, "found the end of the selector"),
        ("a LIKE 'x' ESCAPE", 17, "expected a string literal"),
        ("1abc = 1", 1, "found 'abc'"),
    ],
)
def test_error_positions(text: str, pos: int, fragment: str) -> None:
    e = error(text)
    assert e.position == pos, str(e)
    assert e.selector == text
    assert fragment in str(e), str(e)
    assert f"(offset {pos})" in str(e)
    assert e.error_code == "INVALID_SELECTOR"


def test_error_reports_line_and_column() -> None:
    e = error("a = 1\nAND b = 'x\n")
    assert e.position == 14
    assert "line 2, column 9" in str(e)
    e = error("a = 1 AND\n\n   5")
    assert "line 3, column 4" in str(e)


def test_nesting_is_limited() -> None:
    ok = "(" * 50 + "a = 1" + ")" * 50
    assert ev(ok, a=1) is T
    assert ev("NOT " * 100 + "a", a=True) is T
    assert "nested more than" in str(error("NOT " * (MAX_DEPTH + 5) + "a"))
    assert "nested more than" in str(error("-" * (MAX_DEPTH + 5) + "a = 1"))
    assert "nested more than" in str(error("a" + " + a" * (MAX_DEPTH + 5) + " = 1"))


def test_errors_are_not_cached_as_selectors() -> None:
    for _ in range(2):
        error("a = ")


# ---------------------------------------------------------------------------
# property-based: compiled evaluator against a reference evaluator
#
# Trees are tuples:
#   ("lit", v) ("id", name) ("paren", e) ("neg", e) ("pos", e) ("arith", op, l, r)
#   ("cmp", op, l, r) ("between", negated, e, lo, hi) ("in", negated, name, values)
#   ("like", negated, name, pieces, escape) ("isnull", negated, name)
#   ("and", l, r) ("or", l, r) ("not", e)
# LIKE pieces are ("%",), ("_",) or ("c", char, escaped).

# Property names by the values they mostly get (any name can hold any kind, though).
NUM_PROPS, STR_PROPS, ANY_PROPS = ["a", "b"], ["c", "Ab"], ["$d", "_e"]
PROPS = NUM_PROPS + STR_PROPS + ANY_PROPS
NUM_NAMES = [*NUM_PROPS, "JMSPriority", *ANY_PROPS]
STR_NAMES = STR_PROPS * 2 + ["JMSType", "JMSDeliveryMode", "JMSCorrelationID"] + ANY_PROPS[:1]
TEXT_CHARS = "ab%_'\n"


class StaticError(Exception):
    """The reference's verdict that a tree must not compile."""


NUM, STR, BOOL, ANY = "num", "str", "bool", "any"


def ref_kind(node: tuple) -> str:
    tag = node[0]
    if tag == "lit":
        v = node[1]
        return BOOL if isinstance(v, bool) else STR if isinstance(v, str) else NUM
    if tag == "id":
        return ANY
    if tag == "paren":
        return ref_kind(node[1])
    if tag in ("neg", "pos", "arith"):
        return NUM
    return BOOL


def ref_check(node: tuple) -> None:
    """Raise StaticError where the selector grammar's kind rules are broken."""
    tag = node[0]
    if tag == "paren":
        ref_check(node[1])
    elif tag in ("neg", "pos", "arith", "between"):
        operands = (
            [node[1]]
            if tag in ("neg", "pos")
            else ([node[2], node[3]] if tag == "arith" else [node[2], node[3], node[4]])
        )
        for o in operands:
            if ref_kind(o) in (STR, BOOL):
                raise StaticError(tag)
            ref_check(o)
    elif tag in ("and", "or", "not"):
        for o in node[1:]:
            if ref_kind(o) in (NUM, STR):
                raise StaticError(tag)
            ref_check(o)
    elif tag == "cmp":
        ref_check(node[2])
        ref_check(node[3])


def is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def wrap_long(v: int) -> int:
    v %= 2**64
    return v - 2**64 if v >= 2**63 else v


def ref_value(node: tuple, env: dict[str, Any]) -> Any:
    tag = node[0]
    if tag == "lit":
        return node[1]
    if tag == "id":
        return env.get(node[1])
    if tag == "paren":
        return ref_value(node[1], env)
    if tag in ("neg", "pos"):
        v = ref_value(node[1], env)
        if not is_num(v):
            return None
        if tag == "pos":
            return v
        return -v if isinstance(v, float) else wrap_long(-v)
    if tag == "arith":
        op, x, y = node[1], ref_value(node[2], env), ref_value(node[3], env)
        if not (is_num(x) and is_num(y)):
            return None
        if op == "/" and y == 0:
            return None
        if isinstance(x, float) or isinstance(y, float):
            x, y = float(x), float(y)
            return {"+": x + y, "-": x - y, "*": x * y}[op] if op != "/" else x / y
        if op == "/":
            q = abs(x) // abs(y)
            return wrap_long(q if (x >= 0) == (y >= 0) else -q)
        return wrap_long({"+": x + y, "-": x - y, "*": x * y}[op])
    return ref_truth(node, env)


def ref_compare(op: str, x: Any, y: Any) -> bool | None:
    if x is None or y is None:
        return None
    if is_num(x) and is_num(y):
        if isinstance(x, float) or isinstance(y, float):
            x, y = float(x), float(y)
    elif not (
        (isinstance(x, str) and isinstance(y, str)) or (isinstance(x, bool) and isinstance(y, bool))
    ) or op not in ("=", "<>"):
        return False  # JMS 1.1 3.8.1.1: comparing non-like types is false
    return {"=": x == y, "<>": x != y, "<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y}[op]


def k_and(x: bool | None, y: bool | None) -> bool | None:
    if x is False or y is False:
        return False
    return None if x is None or y is None else True


def k_not(x: bool | None) -> bool | None:
    return None if x is None else not x


def like_match(pieces: list[tuple], s: str) -> bool:
    states = {0}
    for piece in pieces:
        if piece[0] == "%":
            states = set(range(min(states), len(s) + 1)) if states else set()
        elif piece[0] == "_":
            states = {i + 1 for i in states if i < len(s)}
        else:
            states = {i + 1 for i in states if i < len(s) and s[i] == piece[1]}
    return len(s) in states


def ref_truth(node: tuple, env: dict[str, Any]) -> bool | None:
    tag = node[0]
    if tag in ("lit", "id"):
        v = ref_value(node, env)
        return v if isinstance(v, bool) else None
    if tag == "paren":
        return ref_truth(node[1], env)
    if tag == "cmp":
        return ref_compare(node[1], ref_value(node[2], env), ref_value(node[3], env))
    if tag == "between":
        x = ref_value(node[2], env)
        r = k_and(ref_compare("<=", ref_value(node[3], env), x), ref_compare("<=", x, ref_value(node[4], env)))
        return k_not(r) if node[1] else r
    if tag in ("in", "like", "isnull"):
        v = env.get(node[2])
        if tag == "isnull":
            r = v is None
        elif not isinstance(v, str):
            return None
        else:
            r = v in node[3] if tag == "in" else like_match(node[3], v)
        return (not r) if node[1] else r
    if tag == "and":
        return k_and(ref_truth(node[1], env), ref_truth(node[2], env))
    if tag == "or":
        return k_not(k_and(k_not(ref_truth(node[1], env)), k_not(ref_truth(node[2], env))))
    if tag == "not":
        return k_not(ref_truth(node[1], env))
    return None  # a number or a string where a condition is needed (never compiles)


# --- rendering: minimal parentheses from the grammar's precedence levels

LEVEL = {
    "or": 1,
    "and": 2,
    "not": 3,
    "cmp": 4,
    "between": 4,
    "in": 4,
    "like": 4,
    "isnull": 4,
    "neg": 7,
    "pos": 7,
    "lit": 8,
    "id": 8,
    "paren": 8,
}


def level(node: tuple) -> int:
    if node[0] == "arith":
        return 5 if node[1] in "+-" else 6
    if node[0] == "lit" and is_num(node[1]) and (node[1] < 0 or str(node[1]).startswith("-")):
        return 7  # rendered with a sign
    return LEVEL[node[0]]


def quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def render(node: tuple, need: int = 0) -> str:
    text = render_bare(node)
    return f"({text})" if level(node) < need else text


def render_bare(node: tuple) -> str:
    tag = node[0]
    if tag == "lit":
        v = node[1]
        if isinstance(v, bool):
            return "TRUE" if v else "false"
        if isinstance(v, str):
            return quote(v)
        return repr(v)
    if tag == "id":
        return node[1]
    if tag == "paren":
        return f"({render(node[1])})"
    if tag in ("neg", "pos"):
        return ("-" if tag == "neg" else "+") + " " + render(node[1], 7)
    if tag == "arith":
        lv = level(node)
        return f"{render(node[2], lv)} {node[1]} {render(node[3], lv + 1)}"
    if tag == "cmp":
        return f"{render(node[2], 5)} {node[1]} {render(node[3], 5)}"
    if tag == "between":
        neg = "NOT " if node[1] else ""
        return f"{render(node[2], 5)} {neg}BETWEEN {render(node[3], 5)} AND {render(node[4], 5)}"
    if tag == "in":
        neg = "NOT " if node[1] else ""
        return f"{node[2]} {neg}IN ({', '.join(quote(s) for s in node[3])})"
    if tag == "like":
        escape = node[4]
        out = []
        for piece in node[3]:
            if piece[0] in "%_":
                out.append(piece[0])
            else:
                c, escaped = piece[1], piece[2]
                out.append(escape + c if escaped or c in ("%", "_", escape) else c)
        neg = "NOT " if node[1] else ""
        esc = f" ESCAPE {quote(escape)}" if escape is not None else ""
        return f"{node[2]} {neg}LIKE {quote(''.join(out))}{esc}"
    if tag == "isnull":
        return f"{node[2]} IS {'NOT ' if node[1] else ''}NULL"
    if tag == "not":
        return "NOT " + render(node[1], 3)
    if tag == "and":
        return f"{render(node[1], 2)} AND {render(node[2], 3)}"
    if tag == "or":
        return f"{render(node[1], 1)} OR {render(node[2], 2)}"
    raise AssertionError(tag)


# --- generation


def weighted(*choices: tuple[int, st.SearchStrategy]) -> st.SearchStrategy:
    """``one_of`` with weights (``one_of`` would merge repeated strategies)."""
    table = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.integers(0, len(table) - 1).flatmap(table.__getitem__)


ints = weighted(
    (3, st.integers(-12, 12)),
    (1, st.integers(LONG_MIN, LONG_MAX)),
    (2, st.sampled_from([0, 1, LONG_MIN, LONG_MAX, LONG_MIN + 1, 2**53 + 1])),
)
floats = st.one_of(
    st.sampled_from([0.0, -0.0, 0.5, 1.5, -2.25, 3.0, 1e300]),
    st.floats(-20, 20).map(lambda f: round(f, 1)),
    st.floats(allow_nan=False, allow_infinity=False),
)
numbers = weighted((2, ints), (1, floats))
texts = st.text(TEXT_CHARS, max_size=4)
specials = st.sampled_from([float("nan"), float("inf"), -float("inf")])
values = st.one_of(st.none(), st.booleans(), numbers, texts, specials)
PROP_VALUES = {
    **{n: weighted((4, numbers), (1, values)) for n in NUM_PROPS},
    **{n: weighted((4, texts), (1, values)) for n in STR_PROPS},
    **{n: weighted((1, st.booleans()), (1, values)) for n in ANY_PROPS},
}


@st.composite
def like_node(draw: st.DrawFn) -> tuple:
    escape = draw(st.sampled_from([None, "!", "\\", "%", "_", "'", "a"]))
    chars = TEXT_CHARS if escape is not None else TEXT_CHARS.replace("%", "").replace("_", "")
    piece = st.one_of(
        st.just(("%",)),
        st.just(("_",)),
        st.tuples(st.just("c"), st.sampled_from(chars), st.booleans() if escape is not None else st.just(False)),
    )
    pieces = draw(st.lists(piece, max_size=4))
    if escape in ("%", "_"):  # that character is then never a wildcard
        pieces = [p if p[0] != escape else ("c", escape, True) for p in pieces]
    return ("like", draw(st.booleans()), draw(st.sampled_from(STR_NAMES)), pieces, escape)


@st.composite
def numeric(draw: st.DrawFn, depth: int) -> tuple:
    """An arithmetic expression; about one in 25 is statically ill-typed."""
    choice = draw(st.integers(0, 99))
    if depth <= 0 or choice < 40:
        if choice % 2:
            return ("id", draw(st.sampled_from(NUM_NAMES)))
        return ("lit", draw(numbers))
    if choice < 75:
        return ("arith", draw(st.sampled_from("+-*/")), draw(numeric(depth - 1)), draw(numeric(depth - 1)))
    if choice < 88:
        return (draw(st.sampled_from(["neg", "pos"])), draw(numeric(depth - 1)))
    if choice < 96:
        return ("paren", draw(numeric(depth - 1)))
    # a string, a boolean or a condition where a number must be
    return draw(
        st.one_of(st.tuples(st.just("lit"), st.one_of(texts, st.booleans())), st.tuples(st.just("paren"), condition(0)))
    )


@st.composite
def operand(draw: st.DrawFn, depth: int) -> tuple:
    """Anything a comparison takes: numbers, strings, booleans, conditions."""
    choice = draw(st.integers(0, 9))
    if choice < 5:
        return draw(numeric(depth))
    if choice < 7:
        return ("id", draw(st.sampled_from(STR_NAMES)))
    if choice < 9:
        return ("lit", draw(st.one_of(texts, st.booleans())))
    return ("paren", draw(condition(depth - 1)))


@st.composite
def condition(draw: st.DrawFn, depth: int) -> tuple:
    """A condition; about one in 50 is a number or a string (statically ill-typed)."""
    choice = draw(st.integers(0, 99))
    if depth <= 0 or choice < 30:
        return draw(
            st.one_of(
                st.tuples(st.just("id"), st.sampled_from(ANY_PROPS)),
                st.tuples(st.just("lit"), st.booleans()),
                st.tuples(st.just("isnull"), st.booleans(), st.sampled_from(PROPS + STR_NAMES)),
                st.tuples(
                    st.just("in"), st.booleans(), st.sampled_from(STR_NAMES), st.lists(texts, min_size=1, max_size=3)
                ),
                like_node(),
            )
        )
    if choice < 55:
        return (
            "cmp",
            draw(st.sampled_from(["=", "<>", "<", "<=", ">", ">="])),
            draw(operand(depth - 1)),
            draw(operand(depth - 1)),
        )
    if choice < 63:
        return (
            "between",
            draw(st.booleans()),
            draw(numeric(depth - 1)),
            draw(numeric(depth - 1)),
            draw(numeric(depth - 1)),
        )
    if choice < 75:
        return ("and", draw(condition(depth - 1)), draw(condition(depth - 1)))
    if choice < 87:
        return ("or", draw(condition(depth - 1)), draw(condition(depth - 1)))
    if choice < 93:
        return ("not", draw(condition(depth - 1)))
    if choice < 98:
        return ("paren", draw(condition(depth - 1)))
    return ("lit", draw(st.one_of(ints, texts)))


headers = st.fixed_dictionaries(
    {
        "JMSPriority": st.integers(0, 9),
        "JMSType": weighted((3, texts), (1, st.none())),
        "JMSDeliveryMode": st.sampled_from([1, 2]),
        "JMSCorrelationID": weighted((3, texts), (1, st.none())),
    }
)


def build(props: dict[str, Any], hdrs: dict[str, Any]) -> tuple[TextMessage, dict[str, Any]]:
    m = TextMessage("x")
    for name, value in props.items():
        if value is not None:
            m.set_object_property(name, value)
    m.priority = hdrs["JMSPriority"]
    m.type = hdrs["JMSType"]
    m.delivery_mode = hdrs["JMSDeliveryMode"]
    m.correlation_id = hdrs["JMSCorrelationID"]
    env = dict(props)
    env.update(hdrs)
    env["JMSDeliveryMode"] = "PERSISTENT" if hdrs["JMSDeliveryMode"] == 2 else "NON_PERSISTENT"
    return m, env


TAGS = frozenset(LEVEL) | {"arith"}


def subtrees(node: tuple) -> list[tuple]:
    found = [node]
    for child in node[1:]:
        if isinstance(child, tuple) and child[:1] and child[0] in TAGS:
            found.extend(subtrees(child))
    return found


def check_subtree(node: tuple, env: dict[str, Any], message: TextMessage) -> None:
    """Compare a statically valid tree with the reference: a condition directly, a
    number through a comparison with the reference's value."""
    text = render(node)
    kind = ref_kind(node)
    if kind in (BOOL, ANY):
        expected = ref_truth(node, env)
        selector = compile_selector(text)
        assert selector.evaluate(env.get) is expected, text
        assert selector.matches(message) is (expected is True), text
    elif kind == NUM:
        value = ref_value(node, env)
        if value is None:
            checks = {f"({text}) = 0": U}
        elif value != value:
            checks = {f"({text}) = 0": F, f"({text}) <> 0": T}
        elif value in (float("inf"), -float("inf")):
            checks = {f"({text}) > 1.7976931348623157e308": value > 0, f"({text}) < -1.7976931348623157e308": value < 0}
        else:
            checks = {f"({text}) = {value!r}": T}
        for check, expected in checks.items():
            assert ev_env(check, env) is expected, check


def ev_env(text: str, env: dict[str, Any]) -> bool | None:
    return compile_selector(text).evaluate(env.get)


@pytest.mark.slow
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=condition(4), props=st.fixed_dictionaries(PROP_VALUES), hdrs=headers)
def test_compiled_evaluator_matches_reference(tree: tuple, props: dict, hdrs: dict) -> None:
    message, env = build(props, hdrs)
    try:
        ref_check(tree)
        if ref_kind(tree) in (NUM, STR):
            raise StaticError("the selector is not a condition")
    except StaticError:
        with pytest.raises(InvalidSelectorError):
            compile_selector(render(tree))
    for node in subtrees(tree):  # every sub-expression, so AND / OR cannot mask a difference
        try:
            ref_check(node)
        except StaticError:
            continue
        check_subtree(node, env, message)


# ---------------------------------------------------------------------------
# property-based: arbitrary text compiles or raises InvalidSelectorError

TOKENS = [
    "a",
    "b",
    "JMSType",
    "NOT",
    "AND",
    "or",
    "BETWEEN",
    "IN",
    "LIKE",
    "ESCAPE",
    "IS",
    "NULL",
    "TRUE",
    "false",
    "(",
    ")",
    ",",
    "=",
    "<>",
    "<",
    ">=",
    "+",
    "-",
    "*",
    "/",
    "1",
    "2.5",
    ".5e3",
    "7L",
    "'x'",
    "'%_'",
    "''",
    "'",
    "9999999999999999999999",
    "é",
    "$",
    "#",
    "!",
    "\n",
]


@pytest.mark.slow
@settings(max_examples=500, deadline=None)
@given(
    text=st.one_of(
        st.text(max_size=40),
        st.lists(st.sampled_from(TOKENS), max_size=14).map(" ".join),
        st.lists(st.sampled_from(TOKENS + list(string.printable)), max_size=20).map("".join),
    ),
    value=values,
)
def test_arbitrary_text_compiles_or_raises_invalid_selector(text: str, value: Any) -> None:
    try:
        selector = compile_selector(text)
    except InvalidSelectorError as e:
        assert e.position is not None and 0 <= e.position <= len(text)
        assert e.selector == text
        return
    if selector is None:
        assert not text.strip()
        return
    assert selector.evaluate(lambda name: value) in (True, False, None)
    assert selector.evaluate(lambda name: None) in (True, False, None)
    assert selector.matches(msg()) in (True, False)
