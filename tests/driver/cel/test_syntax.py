"""The CEL parser and printer behind tessera's static checks and engine rewrites."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from driver.cel.printer import unparse
from driver.cel.syntax import Call, CelSyntaxError, Ident, Index, ListLit, Literal, Node, Select, parse


def shape(n: object) -> object:
    """A node's structure without source offsets."""
    if isinstance(n, tuple):
        return tuple(shape(x) for x in n)
    if dataclasses.is_dataclass(n) and not isinstance(n, type):
        return (type(n).__name__, *(shape(getattr(n, f.name)) for f in dataclasses.fields(n) if f.name != "offset"))
    return n


def test_operators_become_cel_calls_with_precedence() -> None:
    ast = parse("a || b && !c == 1 + 2 * 3")
    assert isinstance(ast, Call) and ast.function == "_||_"
    right = ast.args[1]
    assert isinstance(right, Call) and right.function == "_&&_"


def test_has_macro_becomes_a_presence_test() -> None:
    ast = parse('has(device.attributes["d"].x)')
    assert isinstance(ast, Select) and ast.test_only and ast.field == "x"


def test_optional_syntax() -> None:
    sel = parse("a.?b")
    assert isinstance(sel, Select) and sel.optional
    idx = parse('a[?"k"]')
    assert isinstance(idx, Index) and idx.optional
    lst = parse("[?a, b]")
    assert isinstance(lst, ListLit) and lst.optional == (True, False)


@pytest.mark.parametrize(
    ("source", "kind", "value"),
    [
        ('"a\\nb"', "string", "a\nb"),
        ("'single'", "string", "single"),
        ('"""tri"ple"""', "string", 'tri"ple'),
        ('r"\\d"', "string", "\\d"),
        ('"\\u00e9\\x41\\101"', "string", "éAA"),
        ('b"\\xff"', "bytes", b"\xff"),
        ("42", "int", 42),
        ("0x1F", "int", 31),
        ("7u", "uint", 7),
        ("1.5e3", "double", 1500.0),
        (".5", "double", 0.5),
        ("-9223372036854775808", "int", -(1 << 63)),
        ("true", "bool", True),
        ("null", "null", None),
    ],
)
def test_literals(source: str, kind: str, value: object) -> None:
    ast = parse(source)
    assert isinstance(ast, Literal)
    assert (ast.kind, ast.value) == (kind, value)


@pytest.mark.parametrize(
    ("source", "offset", "message"),
    [
        ("1 +", 3, "unexpected end"),
        ("(1", 2, "expected '\\)'"),
        ("a.", 2, "field name"),
        ('"abc', 0, "unterminated"),
        ("has(a)", 0, "has()"),
        ("1 2", 2, "after the end"),
        ("if", 0, "reserved"),
        ("9223372036854775808", 0, "out of range"),
        ("a ? b", 5, "expected ':'"),
        ("#", 0, "unexpected character"),
        ('"\\q"', 1, "invalid escape"),
        ("(" * 300 + "1" + ")" * 300, 0, "nested (deeper|too deeply)"),
    ],
)
def test_syntax_errors_carry_the_offset(source: str, offset: int, message: str) -> None:
    with pytest.raises(CelSyntaxError, match=message) as info:
        parse(source)
    if "nested" not in message:  # the depth error is reported where the limit was hit
        assert info.value.offset == offset


@pytest.mark.parametrize(
    "source",
    [
        "a - (b - c)",
        "(a - b) - c",
        "-(-1)",
        "!(a && b)",
        "(a ? b : c) ? d : e",
        "a ? b : c ? d : e",
        "(-1).foo()",
        "[1, 2][0]",
        "(a || b) && c",
        'cel.bind(x, {"k": [1u, 2.5, b"z"]}, x.k.size() > 0)',
    ],
)
def test_unparse_preserves_structure(source: str) -> None:
    printed = unparse(parse(source))
    assert shape(parse(printed)) == shape(parse(source))


def test_unparse_drops_redundant_parentheses() -> None:
    assert unparse(parse("((((a)) && ((b))))")) == "a && b"


def test_identifiers_and_calls() -> None:
    ast = parse("x.startsWith('y')")
    assert isinstance(ast, Call) and ast.function == "startsWith" and isinstance(ast.target, Ident)


_leaf = st.one_of(
    st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1).map(str),
    st.sampled_from(["a", "b", "device.driver", '"s"', "true", "null", "1.5", "2u"]),
)


def _compound(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    binary = st.tuples(children, st.sampled_from(["+", "-", "*", "/", "%", "==", "!=", "<", "<=", "&&", "||", "in"]),
                       children).map(lambda t: f"({t[0]} {t[1]} {t[2]})")
    unary = st.tuples(st.sampled_from(["!", "-"]), children).map(lambda t: f"{t[0]}({t[1]})")
    ternary = st.tuples(children, children, children).map(lambda t: f"({t[0]} ? {t[1]} : {t[2]})")
    call = st.tuples(children, st.sampled_from(["size", "startsWith", "f"])).map(lambda t: f"({t[0]}).{t[1]}()")
    index = st.tuples(children, children).map(lambda t: f"({t[0]})[{t[1]}]")
    lst = st.lists(children, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]")
    return st.one_of(binary, unary, ternary, call, index, lst)


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")  # repr of the recursive strategy
@settings(max_examples=200, deadline=None)
@given(st.recursive(_leaf, _compound, max_leaves=12))
def test_unparse_round_trips_random_expressions(source: str) -> None:
    ast: Node = parse(source)
    assert shape(parse(unparse(ast))) == shape(ast)
