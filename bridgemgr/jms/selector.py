"""JMS 1.1 message selectors: parsed once by a lark LALR grammar, evaluated by closures.

``_GRAMMAR`` is the JMS 1.1 selector syntax (the SQL-92 subset). The lexer is lark's basic
one; keywords are lexed as identifiers and retyped by ``_keyword`` so they stay
case-insensitive and ``notable`` is never ``NOT able``. ``_Builder`` runs inside the parser
and builds a small AST of dataclasses (there is no parse tree). ``_Compiler`` checks what
the grammar leaves open (operand kinds, an identifier on the left of LIKE / IN / IS NULL,
literal ranges, ESCAPE) and turns every node into a closure ``f(ctx) -> value``, so a
message is matched by calling nested closures with no dispatch left. Truth values are
three-valued: True, False and None for UNKNOWN; a value that is NULL is None too. A
Selector holds two closure trees over one AST: for ``matches`` identifiers read the message
directly (header fields through attribute getters, anything else through
``get_object_property``); for ``evaluate`` they call the caller's lookup function.

Rule: what a selector may cost is bounded (``MAX_DEPTH``, ``MAX_TOKENS``,
``MAX_PATTERN_CHARS``, and the caller's ``check_size`` before anything is parsed), so no
selector can take a broker's CPU or stack. The semantic choices where JMS 1.1 leaves room
(values of different kinds compare as FALSE, arithmetic on a non-number is NULL, ...) are
in the design notes.

Design notes: docs/architecture.md#internals-jmsselectorpy.
"""

from __future__ import annotations

import functools
import math
import operator
import re
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedToken

from .errors import InvalidSelectorError

__all__ = [
    "MAX_DEPTH",
    "MAX_PATTERN_CHARS",
    "MAX_SIZE",
    "MAX_TOKENS",
    "Selector",
    "check_size",
    "compile_selector",
    "message_lookup",
]

MAX_SIZE = 64 * 1024  # bytes; the default of imq.selector.max_size
MAX_DEPTH = 100
MAX_TOKENS = 4096
MAX_PATTERN_CHARS = 4096

_LONG_MIN = -(1 << 63)
_LONG_MAX = (1 << 63) - 1
_F32 = struct.Struct(">f")

# ---------------------------------------------------------------------------
# grammar

_KEYWORDS = frozenset({"OR", "AND", "NOT", "BETWEEN", "IN", "LIKE", "ESCAPE", "IS", "NULL", "TRUE", "FALSE"})

_GRAMMAR = r"""
?start: or_expr
?or_expr: and_expr | or_expr OR and_expr -> or_
?and_expr: not_expr | and_expr AND not_expr -> and_
?not_expr: predicate | NOT not_expr -> not_
?predicate: sum
    | sum COMP_OP sum -> comparison
    | sum [NOT] BETWEEN sum AND sum -> between
    | sum [NOT] IN LPAR STRING (COMMA STRING)* RPAR -> in_list
    | sum [NOT] LIKE STRING [ESCAPE STRING] -> like
    | sum IS [NOT] NULL -> is_null
?sum: product | sum ADD_OP product -> arith
?product: unary | product MUL_OP unary -> arith
?unary: primary | ADD_OP unary -> unary
?primary: NUMBER -> number
    | STRING -> string
    | TRUE -> boolean
    | FALSE -> boolean
    | IDENT -> ident
    | LPAR or_expr RPAR -> paren

%declare OR AND NOT BETWEEN IN LIKE ESCAPE IS NULL TRUE FALSE
IDENT: /(?:[^\W\d]|\$)[\w$]*/
NUMBER: /(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?|[0-9]+(?:[eE][+-]?[0-9]+[fFdD]?|[fFdDlL])?/
STRING: /'[^']*+(?:''[^']*+)*+'/
COMP_OP: /<>|<=|>=|=|<|>/
ADD_OP: /[+-]/
MUL_OP: /[*\/]/
LPAR: "("
RPAR: ")"
COMMA: ","
%ignore /[ \t\f\r\n]+/
"""

# How an error message names what the parser expected.
_TERMINAL_NAMES = {
    "IDENT": "an identifier",
    "NUMBER": "a number",
    "STRING": "a string literal",
    "COMP_OP": "a comparison operator",
    "ADD_OP": "'+' or '-'",
    "MUL_OP": "'*' or '/'",
    "LPAR": "'('",
    "RPAR": "')'",
    "COMMA": "','",
    "$END": "the end of the selector",
    **{k: k for k in _KEYWORDS},
}


# Tokens the parse running on this thread may still lex (the lexer is shared).
_budget = threading.local()


def _count(token: Token) -> Token:
    _budget.left -= 1
    if _budget.left < 0:
        raise _SyntaxError(f"the selector has more than {MAX_TOKENS} tokens", _at(token))
    return token


def _keyword(token: Token) -> Token:
    upper = token.upper()
    if upper in _KEYWORDS:
        token.type = upper
    return _count(token)


# ---------------------------------------------------------------------------
# the AST (positions are character offsets into the selector text)


@dataclass(frozen=True, slots=True)
class _Lit:
    value: bool | int | float | str
    pos: int


@dataclass(frozen=True, slots=True)
class _Ident:
    name: str
    pos: int


@dataclass(frozen=True, slots=True)
class _Unary:  # '+' or '-' on something that is not a numeric literal
    op: str
    operand: Any
    pos: int


@dataclass(frozen=True, slots=True)
class _Arith:
    op: str
    left: Any
    right: Any
    pos: int


@dataclass(frozen=True, slots=True)
class _Compare:
    op: str
    left: Any
    right: Any
    pos: int


@dataclass(frozen=True, slots=True)
class _Between:
    negated: bool
    operand: Any
    low: Any
    high: Any
    pos: int


@dataclass(frozen=True, slots=True)
class _In:
    negated: bool
    operand: Any
    values: tuple[str, ...]
    pos: int


@dataclass(frozen=True, slots=True)
class _Like:
    negated: bool
    operand: Any
    pattern: str
    escape: str | None
    pos: int
    pattern_pos: int
    escape_pos: int


@dataclass(frozen=True, slots=True)
class _IsNull:
    negated: bool
    operand: Any
    pos: int


@dataclass(frozen=True, slots=True)
class _Logic:  # n-ary AND / OR; chains are flattened while parsing
    op: str
    operands: list[Any]
    pos: int


@dataclass(frozen=True, slots=True)
class _Not:
    operand: Any
    pos: int


_NUMBER, _STRING, _BOOLEAN, _ANY = "a number", "a string", "a boolean", "any"


def _kind(node: Any) -> str:
    """The kind of value a node can have, as far as the text tells (_ANY for identifiers)."""
    if isinstance(node, _Lit):
        t = type(node.value)
        return _BOOLEAN if t is bool else _STRING if t is str else _NUMBER
    if isinstance(node, _Ident):
        return _ANY
    if isinstance(node, (_Unary, _Arith)):
        return _NUMBER
    return _BOOLEAN


def _string_value(token: Token) -> str:
    return token[1:-1].replace("''", "'")


class _SyntaxError(Exception):
    """Raised by the builder inside the parser; turned into InvalidSelectorError by _parse."""

    def __init__(self, message: str, pos: int) -> None:
        super().__init__(message)
        self.pos = pos


def _at(tok: Token) -> int:
    """Where ``tok`` starts (the basic lexer always says)."""
    pos = tok.start_pos
    assert pos is not None
    return pos


@v_args(inline=True)
class _Builder(Transformer[Token, Any]):
    """Parser callbacks: tokens and sub-results in, AST nodes out."""

    def number(self, tok: Token) -> _Lit:
        text = tok.value
        if text[-1] in "lL" or not any(c in text for c in ".eEfFdD"):
            digits = text.rstrip("lL").lstrip("0")
            if len(digits) > 19:  # beyond any long, and too long for int()
                raise _SyntaxError(f"integer literal {text} is out of the long range", _at(tok))
            return _Lit(int(digits or "0"), _at(tok))
        value = float(text.rstrip("fFdD"))
        if text[-1] in "fF":
            try:
                value = _F32.unpack(_F32.pack(value))[0]
            except OverflowError:
                value = math.inf
        if math.isinf(value):
            raise _SyntaxError(f"floating-point literal {text} is too large", _at(tok))
        return _Lit(value, _at(tok))

    def string(self, tok: Token) -> _Lit:
        return _Lit(_string_value(tok), _at(tok))

    def boolean(self, tok: Token) -> _Lit:
        return _Lit(tok.type == "TRUE", _at(tok))

    def ident(self, tok: Token) -> _Ident:
        return _Ident(tok.value, _at(tok))

    def paren(self, _lpar: Token, node: Any, _rpar: Token) -> Any:
        return node

    def unary(self, op: Token, operand: Any) -> Any:
        if isinstance(operand, _Lit) and type(operand.value) in (int, float):
            value = operand.value
            if op == "-":  # 2**63 is only valid here, straight from the token; else wrap
                assert isinstance(value, (int, float))  # (no bool: its type is not int)
                value = -value if isinstance(value, float) or value == 1 << 63 else _long(-value)
            return _Lit(value, _at(op))
        return _Unary(op.value, operand, _at(op))

    def arith(self, left: Any, op: Token, right: Any) -> _Arith:
        return _Arith(op.value, left, right, left.pos)

    def comparison(self, left: Any, op: Token, right: Any) -> _Compare:
        return _Compare(op.value, left, right, left.pos)

    def between(self, operand: Any, neg: Token | None, _b: Token, low: Any, _a: Token, high: Any) -> _Between:
        return _Between(neg is not None, operand, low, high, operand.pos)

    def in_list(self, operand: Any, neg: Token | None, *rest: Token) -> _In:
        values = tuple(_string_value(t) for t in rest if t.type == "STRING")
        return _In(neg is not None, operand, values, operand.pos)

    def like(
        self, operand: Any, neg: Token | None, _like: Token, pattern: Token, _esc: Token | None, escape: Token | None
    ) -> _Like:
        return _Like(
            neg is not None,
            operand,
            _string_value(pattern),
            None if escape is None else _string_value(escape),
            operand.pos,
            _at(pattern),
            -1 if escape is None else _at(escape),
        )

    def is_null(self, operand: Any, _is: Token, neg: Token | None, _null: Token) -> _IsNull:
        return _IsNull(neg is not None, operand, operand.pos)

    def _logic(self, op: str, left: Any, right: Any) -> _Logic:
        node = left if isinstance(left, _Logic) and left.op == op else _Logic(op, [left], left.pos)
        if isinstance(right, _Logic) and right.op == op:
            node.operands.extend(right.operands)
        else:
            node.operands.append(right)
        return node

    def and_(self, left: Any, _op: Token, right: Any) -> _Logic:
        return self._logic("AND", left, right)

    def or_(self, left: Any, _op: Token, right: Any) -> _Logic:
        return self._logic("OR", left, right)

    def not_(self, op: Token, operand: Any) -> _Not:
        return _Not(operand, _at(op))


@functools.cache
def _parser() -> Lark:
    counted = ("NUMBER", "STRING", "COMP_OP", "ADD_OP", "MUL_OP", "LPAR", "RPAR", "COMMA")
    return Lark(
        _GRAMMAR,
        parser="lalr",
        lexer="basic",
        transformer=_Builder(),
        lexer_callbacks={"IDENT": _keyword, **dict.fromkeys(counted, _count)},
    )


def _error(text: str, pos: int, problem: str) -> InvalidSelectorError:
    line = text.count("\n", 0, pos) + 1
    column = pos - (text.rfind("\n", 0, pos) + 1) + 1
    shown = f" {text!r}" if len(text) <= 100 else ""
    return InvalidSelectorError(
        f"invalid selector{shown}: {problem} at line {line}, column {column} (offset {pos})",
        position=pos,
        selector=text,
    )


def _parse(text: str) -> Any:
    _budget.left = MAX_TOKENS
    try:
        return _parser().parse(text)
    except _SyntaxError as e:
        raise _error(text, e.pos, str(e)) from None
    except UnexpectedCharacters as e:
        at = cast(int, e.pos_in_stream)  # lark declares it None on the base class; the lexer sets it
        char = text[at]
        problem = "unterminated string literal" if char == "'" else f"unexpected character {char!r}"
        raise _error(text, at, problem) from None
    except UnexpectedToken as e:
        at_end = e.token.type == "$END"
        pos = len(text) if at_end else e.token.start_pos
        found = "the end of the selector" if at_end else repr(e.token.value)
        expected = sorted(_TERMINAL_NAMES.get(t, t) for t in e.expected)
        wanted = expected[0] if len(expected) == 1 else "one of " + ", ".join(expected)
        raise _error(text, pos, f"expected {wanted}, found {found}") from None


# ---------------------------------------------------------------------------
# run-time helpers (None is UNKNOWN or NULL)

Fn = Callable[[Any], Any]


def _is_number(v: Any) -> bool:
    t = type(v)
    return t is int or t is float or (isinstance(v, (int, float)) and t is not bool)


def _to_float(v: int | float) -> float:
    try:
        return float(v)
    except OverflowError:  # an int beyond any double, only from a caller's lookup
        return math.inf if v > 0 else -math.inf


def _long(v: int) -> int:
    """Wrap to a Java long."""
    if _LONG_MIN <= v <= _LONG_MAX:
        return v
    return ((v - _LONG_MIN) & 0xFFFF_FFFF_FFFF_FFFF) + _LONG_MIN


def _compare(op: Callable[[Any, Any], bool], ordered: bool, a: Any, b: Any) -> bool | None:
    """``a op b`` with JMS typing; ``ordered`` for <, <=, >, >=."""
    if a is None or b is None:
        return None
    if _is_number(a) and _is_number(b):
        if isinstance(a, float) or isinstance(b, float):
            return op(_to_float(a), _to_float(b))
        return op(a, b)
    if ordered:
        return False
    if (isinstance(a, str) and isinstance(b, str)) or (type(a) is bool and type(b) is bool):
        return op(a, b)
    return False


def _java_div(a: int, b: int) -> int:
    """Integer division truncating toward zero, as Java's."""
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


# op -> (on two integers, wrapped to a long afterwards; on floating-point numbers)
_ARITH_OPS: dict[str, tuple[Callable[[int, int], int], Callable[[float, float], float]]] = {
    "+": (operator.add, operator.add),
    "-": (operator.sub, operator.sub),
    "*": (operator.mul, operator.mul),
    "/": (_java_div, operator.truediv),
}


def _and3(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _like_regex(pattern: str, escape: str | None) -> re.Pattern[str] | None:
    """The pattern as a regex for fullmatch, or None if it ends in the escape character.

    Every ``%`` but the last starts an atomic group that takes the leftmost match of the
    next segment; the segments are fixed-width, so leftmost is always right and the
    engine never backtracks across a ``%``.
    """
    segments: list[list[str]] = [[]]
    chars = iter(pattern)
    for c in chars:
        if c == escape:
            escaped = next(chars, None)
            if escaped is None:
                return None
            segments[-1].append(re.escape(escaped))
        elif c == "%":
            segments.append([])
        elif c == "_":
            segments[-1].append(".")
        else:
            segments[-1].append(re.escape(c))
    parts = ["".join(s) for s in segments]
    if len(parts) > 1:
        middle = "".join(f"(?>.*?{p})" for p in parts[1:-1] if p)
        parts = [parts[0] + middle + ".*" + parts[-1]]
    return re.compile(parts[0], re.DOTALL)


_COMPARE_OPS: dict[str, tuple[Callable[[Any, Any], bool], bool]] = {
    "=": (operator.eq, False),
    "<>": (operator.ne, False),
    "<": (operator.lt, True),
    "<=": (operator.le, True),
    ">": (operator.gt, True),
    ">=": (operator.ge, True),
}
_MIRROR = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _const(value: Any) -> Fn:
    return lambda ctx: value


# ---------------------------------------------------------------------------
# compiling the AST into closures


class _Compiler:
    """Checks an AST and builds its closures; ``leaf(name)`` reads an identifier."""

    def __init__(self, text: str, leaf: Callable[[str], Fn]) -> None:
        self.text = text
        self.leaf = leaf
        self.pattern_chars = 0  # in the LIKE patterns compiled so far

    def fail(self, node: Any, problem: str) -> InvalidSelectorError:
        return _error(self.text, node.pos, problem)

    def condition(self, node: Any, depth: int, what: str) -> Fn:
        """A closure giving True, False or None."""
        kind = _kind(node)
        if kind in (_NUMBER, _STRING):
            raise self.fail(node, f"{what} must be a condition, not {kind}")
        if isinstance(node, _Ident):
            get = self.leaf(node.name)

            def truth(ctx: Any) -> bool | None:
                v = get(ctx)
                return v if type(v) is bool else None

            return truth
        return self.value(node, depth)

    def numeric(self, node: Any, depth: int, what: str) -> Fn:
        kind = _kind(node)
        if kind in (_STRING, _BOOLEAN):
            raise self.fail(node, f"{what} must be a numeric expression, not {kind}")
        return self.value(node, depth)

    def identifier(self, node: Any, what: str) -> Fn:
        if not isinstance(node, _Ident):
            raise self.fail(node, f"the left side of {what} must be an identifier")
        return self.leaf(node.name)

    def value(self, node: Any, depth: int) -> Fn:
        if depth > MAX_DEPTH:
            raise self.fail(node, f"expression nested more than {MAX_DEPTH} levels deep")
        depth += 1
        match node:
            case _Lit(value=value):
                if type(value) is int and not _LONG_MIN <= value <= _LONG_MAX:
                    raise self.fail(node, f"integer literal {value} is out of the long range")
                return _const(value)
            case _Ident(name=name):
                return self.leaf(name)
            case _Unary(op=op, operand=operand):
                f = self.numeric(operand, depth, f"the operand of unary {op!r}")
                if op == "+":
                    return lambda ctx: v if _is_number(v := f(ctx)) else None
                return lambda ctx: (-v if isinstance(v, float) else _long(-v)) if _is_number(v := f(ctx)) else None
            case _Arith(op=op, left=left, right=right):
                what = f"an operand of {op!r}"
                fl, fr = self.numeric(left, depth, what), self.numeric(right, depth, what)
                int_op, float_op = _ARITH_OPS[op]
                divide = op == "/"

                def arith(ctx: Any) -> int | float | None:
                    a, b = fl(ctx), fr(ctx)
                    if not (_is_number(a) and _is_number(b)) or (divide and b == 0):
                        return None
                    if isinstance(a, float) or isinstance(b, float):
                        return float_op(_to_float(a), _to_float(b))
                    return _long(int_op(a, b))

                return arith
            case _Compare():
                return self.comparison(node, depth)
            case _Between(negated=negated, operand=x, low=low, high=high):
                fx = self.numeric(x, depth, "the operand of BETWEEN")
                flo = self.numeric(low, depth, "a bound of BETWEEN")
                fhi = self.numeric(high, depth, "a bound of BETWEEN")
                le = operator.le

                def between(ctx: Any) -> bool | None:
                    v = fx(ctx)
                    r = _and3(_compare(le, True, flo(ctx), v), _compare(le, True, v, fhi(ctx)))
                    return r if not negated or r is None else not r

                return between
            case _In(negated=negated, operand=x, values=values):
                get = self.identifier(x, "IN")
                members = frozenset(values)
                return lambda ctx: ((v in members) != negated) if isinstance(v := get(ctx), str) else None
            case _Like(negated=negated, operand=x, pattern=pattern, escape=escape):
                get = self.identifier(x, "LIKE")
                if escape is not None and len(escape) != 1:
                    raise _error(
                        self.text, node.escape_pos, f"the ESCAPE character must be one character, not {escape!r}"
                    )
                self.pattern_chars += len(pattern)
                if self.pattern_chars > MAX_PATTERN_CHARS:
                    raise _error(
                        self.text,
                        node.pattern_pos,
                        f"the LIKE patterns have more than {MAX_PATTERN_CHARS} characters in all",
                    )
                regex = _like_regex(pattern, escape)
                if regex is None:
                    raise _error(
                        self.text, node.pattern_pos, f"LIKE pattern {pattern!r} ends with its escape character"
                    )
                match_ = regex.fullmatch
                return lambda ctx: ((match_(v) is None) == negated) if isinstance(v := get(ctx), str) else None
            case _IsNull(negated=negated, operand=x):
                get = self.identifier(x, "IS NULL")
                return lambda ctx: (get(ctx) is None) != negated
            case _Not(operand=operand):
                f = self.condition(operand, depth, "the operand of NOT")
                return lambda ctx: None if (r := f(ctx)) is None else not r
            case _Logic(op=op, operands=operands):
                fs = tuple(self.condition(o, depth, f"an operand of {op}") for o in operands)
                return _and_all(fs) if op == "AND" else _or_any(fs)
        raise AssertionError(f"unknown selector node {node!r}")

    def comparison(self, node: _Compare, depth: int) -> Fn:
        op, left, right = node.op, node.left, node.right
        if isinstance(left, _Lit) and not isinstance(right, _Lit):
            op, left, right = _MIRROR[op], right, left
        fn, ordered = _COMPARE_OPS[op]
        get = self.value(left, depth)
        if not isinstance(right, _Lit):
            fr = self.value(right, depth)
            return lambda ctx: _compare(fn, ordered, get(ctx), fr(ctx))
        lit = self.value(right, depth)(None)  # also range-checks the literal
        # The right side is a literal: specialise on its kind.
        if type(lit) is str or type(lit) is bool:
            if ordered:
                return lambda ctx: None if get(ctx) is None else False
            if type(lit) is str:
                return lambda ctx: fn(v, lit) if isinstance(v := get(ctx), str) else (None if v is None else False)
            return lambda ctx: fn(v, lit) if type(v := get(ctx)) is bool else (None if v is None else False)
        flit = _to_float(lit)
        int_lit = type(lit) is int

        def compare_number(ctx: Any) -> bool | None:
            v = get(ctx)
            t = type(v)
            if t is float:
                return fn(v, flit)
            if t is int:
                return fn(v, lit) if int_lit else fn(_to_float(v), lit)
            return _compare(fn, ordered, v, lit)

        return compare_number


def _and_all(fs: tuple[Fn, ...]) -> Fn:
    if len(fs) == 2:
        f1, f2 = fs

        def and2(ctx: Any) -> bool | None:
            a = f1(ctx)
            if a is False:
                return False
            b = f2(ctx)
            if b is False:
                return False
            return None if a is None or b is None else True

        return and2

    def and_n(ctx: Any) -> bool | None:
        result: bool | None = True
        for f in fs:
            r = f(ctx)
            if r is False:
                return False
            if r is None:
                result = None
        return result

    return and_n


def _or_any(fs: tuple[Fn, ...]) -> Fn:
    if len(fs) == 2:
        f1, f2 = fs

        def or2(ctx: Any) -> bool | None:
            a = f1(ctx)
            if a is True:
                return True
            b = f2(ctx)
            if b is True:
                return True
            return None if a is None or b is None else False

        return or2

    def or_n(ctx: Any) -> bool | None:
        result: bool | None = False
        for f in fs:
            r = f(ctx)
            if r is True:
                return True
            if r is None:
                result = None
        return result

    return or_n


# ---------------------------------------------------------------------------
# identifiers

_DELIVERY_MODES = {2: "PERSISTENT", 1: "NON_PERSISTENT"}


def _delivery_mode(message: Any) -> str | None:
    return _DELIVERY_MODES.get(message.delivery_mode)


# Header identifiers and how each is read off a message (jms.message.Message).
_HEADER_GETTERS: dict[str, Callable[[Any], Any]] = {
    "JMSDeliveryMode": _delivery_mode,
    "JMSPriority": operator.attrgetter("priority"),
    "JMSMessageID": operator.attrgetter("message_id"),
    "JMSTimestamp": operator.attrgetter("timestamp"),
    "JMSCorrelationID": operator.attrgetter("correlation_id"),
    "JMSType": operator.attrgetter("type"),
}


def _message_leaf(name: str) -> Fn:
    header = _HEADER_GETTERS.get(name)
    if header is not None:
        return header
    return lambda message: message.get_object_property(name)


def _lookup_leaf(name: str) -> Fn:
    return lambda lookup: lookup(name)


def message_lookup(message: Any) -> Callable[[str], Any]:
    """Resolve selector identifiers on ``message``: header fields, else properties."""

    def lookup(name: str) -> Any:
        header = _HEADER_GETTERS.get(name)
        return header(message) if header is not None else message.get_object_property(name)

    return lookup


# ---------------------------------------------------------------------------
# the API


class Selector:
    """A compiled message selector. Build with :func:`compile_selector` (cached)."""

    __slots__ = ("_evaluate", "_match", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        tree = _parse(text)
        try:
            self._match = _Compiler(text, _message_leaf).condition(tree, 0, "the selector")
            # a condition's value: True, False or None (UNKNOWN)
            self._evaluate: Callable[[Callable[[str], Any]], bool | None] = _Compiler(text, _lookup_leaf).condition(
                tree, 0, "the selector"
            )
        except RecursionError:  # MAX_DEPTH fits any stack but one already nearly full
            raise _error(text, 0, "the selector is nested too deeply for this thread's stack") from None

    def matches(self, message: Any) -> bool:
        """True when the selector is TRUE for ``message`` (FALSE and UNKNOWN do not match)."""
        return self._match(message) is True

    def evaluate(self, lookup: Callable[[str], Any]) -> bool | None:
        """The three-valued result (None is UNKNOWN); ``lookup(identifier)`` gives
        each identifier's value or None, header names included."""
        return self._evaluate(lookup)

    def __reduce__(self) -> tuple[Any, ...]:  # closures do not pickle; the text does
        return (compile_selector, (self.text,))

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


def check_size(text: str | None, max_bytes: int, limit_name: str) -> None:
    """InvalidSelectorError when ``text`` has more than ``max_bytes`` bytes in UTF-8
    (-1: no limit); ``limit_name`` names the setting in the message."""
    if text is None or max_bytes < 0 or len(text) * 4 <= max_bytes:
        return
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise InvalidSelectorError(f"invalid selector: it has {size} bytes, more than {limit_name}={max_bytes}")


@functools.lru_cache(maxsize=1024)
def compile_selector(text: str | None) -> Selector | None:
    """The Selector for ``text``; None when there is no selector (None or blank text),
    which matches every message. Raises InvalidSelectorError."""
    if text is None or not text.strip():
        return None
    return Selector(text)
