"""CEL source from a syntax tree (driver.cel.syntax), with only the parentheses precedence needs."""

from __future__ import annotations

from driver.cel.syntax import (
    ADDOPS,
    MULOPS,
    RELOPS,
    Call,
    Ident,
    Index,
    ListLit,
    Literal,
    MapLit,
    Node,
    Select,
    StructLit,
)

_BINARY_TEXT = {v: k for k, v in {**RELOPS, **ADDOPS, **MULOPS, "||": "_||_", "&&": "_&&_"}.items()}


def quote_string(s: str) -> str:
    out = ['"']
    for c in s:
        if c == '"':
            out.append('\\"')
        elif c == "\\":
            out.append("\\\\")
        elif c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c == "\t":
            out.append("\\t")
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def _literal_text(n: Literal) -> str:
    if n.kind == "string":
        assert isinstance(n.value, str)
        return quote_string(n.value)
    if n.kind == "bytes":
        assert isinstance(n.value, bytes)
        return 'b"' + "".join(f"\\x{b:02x}" for b in n.value) + '"'
    if n.kind == "bool":
        return "true" if n.value else "false"
    if n.kind == "null":
        return "null"
    if n.kind == "uint":
        return f"{n.value}u"
    if n.kind == "double":
        assert isinstance(n.value, float)
        text = repr(n.value)
        if text in ("inf", "-inf", "nan"):
            return f'double("{text.replace("inf", "Infinity").replace("nan", "NaN")}")'
        return text if any(c in text for c in ".e") else text + ".0"
    return str(n.value)


_PRECEDENCE = {"_?_:_": 0, "_||_": 1, "_&&_": 2, "_<_": 3, "_<=_": 3, "_>_": 3, "_>=_": 3, "_==_": 3, "_!=_": 3,
               "@in": 3, "_+_": 4, "_-_": 4, "_*_": 5, "_/_": 5, "_%_": 5, "!_": 6, "-_": 6}
_PRIMARY = 7


def _precedence(n: Node) -> int:
    if isinstance(n, Call) and n.target is None and n.function in _PRECEDENCE:
        return _PRECEDENCE[n.function]
    if isinstance(n, Literal) and isinstance(n.value, int | float) and not isinstance(n.value, bool) and n.value < 0:
        return _PRECEDENCE["-_"]
    return _PRIMARY


def _operand(n: Node, minimum: int) -> str:
    text = unparse(n)
    return f"({text})" if _precedence(n) < minimum else text


def unparse(n: Node) -> str:
    """CEL source for n, parenthesized only where precedence requires it.

    Keeping parentheses minimal matters: cel-cpp rejects expressions nested deeper than 32.
    """
    if isinstance(n, Literal):
        return _literal_text(n)
    if isinstance(n, Ident):
        return n.name
    if isinstance(n, Select):
        if n.test_only:
            return f"has({_operand(n.operand, _PRIMARY)}.{n.field})"
        return f"{_operand(n.operand, _PRIMARY)}{'.?' if n.optional else '.'}{n.field}"
    if isinstance(n, Index):
        return f"{_operand(n.operand, _PRIMARY)}{'[?' if n.optional else '['}{unparse(n.index)}]"
    if isinstance(n, ListLit):
        parts = [("?" if (n.optional and n.optional[i]) else "") + unparse(e) for i, e in enumerate(n.elements)]
        return "[" + ", ".join(parts) + "]"
    if isinstance(n, MapLit):
        parts = [f"{'?' if e.optional else ''}{unparse(e.key)}: {unparse(e.value)}" for e in n.entries]
        return "{" + ", ".join(parts) + "}"
    if isinstance(n, StructLit):
        parts = [f"{'?' if o else ''}{k}: {unparse(v)}" for k, v, o in n.fields]
        return n.type_name + "{" + ", ".join(parts) + "}"
    assert isinstance(n, Call)
    if n.target is None:
        return _unparse_global_call(n)
    return f"{_operand(n.target, _PRIMARY)}.{n.function}({', '.join(unparse(a) for a in n.args)})"


def _unparse_global_call(n: Call) -> str:
    """An operator in its infix/prefix form, or a global function call."""
    prec = _PRECEDENCE.get(n.function)
    if n.function in _BINARY_TEXT and len(n.args) == 2 and prec is not None:
        # left-associative: the right operand binds tighter
        left = _operand(n.args[0], prec)
        right = _operand(n.args[1], prec + 1)
        return f"{left} {_BINARY_TEXT[n.function]} {right}"
    if n.function in ("!_", "-_"):
        op = "!" if n.function == "!_" else "-"
        operand = n.args[0]
        inner = _operand(operand, _PRECEDENCE["!_"])
        if op == "-" and isinstance(operand, Literal) and operand.kind in ("int", "double"):
            inner = f"({inner})"  # keep -(x) a negation instead of a folded literal
        # "- -1" must not turn into "--1"
        return f"{op}{' ' if inner.startswith(op) else ''}{inner}"
    if n.function == "_?_:_":
        cond, then, other = n.args
        return f"{_operand(cond, 1)} ? {_operand(then, 1)} : {_operand(other, 0)}"
    if n.function == "_[_]" and len(n.args) == 2:
        return f"{_operand(n.args[0], _PRIMARY)}[{unparse(n.args[1])}]"
    return f"{n.function}({', '.join(unparse(a) for a in n.args)})"
