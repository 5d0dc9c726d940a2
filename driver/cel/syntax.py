"""A CEL parser producing a small AST that tessera can reason about.

Neither engine exposes its syntax tree, and the static checks Kubernetes performs (field names
on `device`, homogeneous literals, regex literals, which attributes an expression reads) need
one. The grammar is the CEL spec's, including the optional syntax (`x.?f`, `m[?k]`, `[?e]`,
`{?k: v}`) that cel-go enables in Kubernetes. Operators become calls named as in CEL
(`_&&_`, `_==_`, `@in`, `!_`, `-_`, `_?_:_`, `_[_]`), which keeps the analysis uniform.

driver.cel.printer turns a tree back into CEL source, so an engine can be fed a rewritten expression.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from driver.errors import TesseraError

RESERVED = frozenset({
    "as", "break", "const", "continue", "else", "for", "function", "if", "import", "let", "loop", "package",
    "namespace", "return", "var", "void", "while",
})

# A syntax error carries the 0-based character offset; CelCompileError turns it into a column.


class CelSyntaxError(TesseraError):
    def __init__(self, offset: int, message: str) -> None:
        super().__init__(message)
        self.offset = offset
        self.message = message


@dataclass(frozen=True)
class Node:
    offset: int


@dataclass(frozen=True)
class Literal(Node):
    kind: str  # int | uint | double | string | bytes | bool | null
    value: object


@dataclass(frozen=True)
class Ident(Node):
    name: str


@dataclass(frozen=True)
class Select(Node):
    operand: Node
    field: str
    optional: bool = False  # x.?f
    test_only: bool = False  # inside has()


@dataclass(frozen=True)
class Index(Node):
    operand: Node
    index: Node
    optional: bool = False  # m[?k]


@dataclass(frozen=True)
class Call(Node):
    function: str
    args: tuple[Node, ...]
    target: Node | None = None


@dataclass(frozen=True)
class ListLit(Node):
    elements: tuple[Node, ...]
    optional: tuple[bool, ...] = ()


@dataclass(frozen=True)
class MapEntry:
    key: Node
    value: Node
    optional: bool = False


@dataclass(frozen=True)
class MapLit(Node):
    entries: tuple[MapEntry, ...]


@dataclass(frozen=True)
class StructLit(Node):
    type_name: str
    fields: tuple[tuple[str, Node, bool], ...] = field(default_factory=tuple)


# ------------------------------------------------------------------------------------------------
# lexer

_TOKEN_RE = re.compile(
    r"""
    (?P<ws>[ \t\n\r\f]+|//[^\n]*)
  | (?P<str>[rR]?[bB]?[rR]?(?:'''|\"\"\"|'|\"))
  | (?P<num>0[xX][0-9a-fA-F]+[uU]?
        |(?:[0-9]+\.[0-9]+(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+)
        |[0-9]+[uU]?)
  | (?P<ident>[_a-zA-Z][_a-zA-Z0-9]*)
  | (?P<op>\|\||&&|==|!=|<=|>=|\.\?|\[\?|[-+*/%!<>?:.,()\[\]{}])
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class Token:
    kind: str  # num | str | ident | op | eof
    text: str
    offset: int
    value: object = None
    lit_kind: str = ""


_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", "'": "'",
            '"': '"', "`": "`", "?": "?"}


def _read_string(src: str, start: int, prefix_end: int) -> tuple[int, object, str]:
    prefix = src[start:prefix_end].lower()
    raw = "r" in prefix
    is_bytes = "b" in prefix
    quote = src[prefix_end:prefix_end + 3] if src[prefix_end:prefix_end + 3] in ("'''", '"""') else src[prefix_end]
    i = prefix_end + len(quote)
    out: list[str] = []
    byte_out = bytearray()

    def emit(text: str) -> None:
        out.append(text)
        byte_out.extend(text.encode())

    while True:
        if i >= len(src):
            raise CelSyntaxError(start, "unterminated string literal")
        if src.startswith(quote, i):
            i += len(quote)
            break
        c = src[i]
        if c == "\n" and len(quote) == 1:
            raise CelSyntaxError(start, "newline in single-quoted string literal")
        if c == "\\" and not raw:
            i, text, one_byte = _read_escape(src, i, is_bytes)
            if one_byte:
                out.append(text)
                byte_out.append(ord(text))
            else:
                emit(text)
        else:
            emit(c)
            i += 1
    if is_bytes:
        return i, bytes(byte_out), "bytes"
    return i, "".join(out), "string"


def _read_escape(src: str, i: int, is_bytes: bool) -> tuple[int, str, bool]:
    """The escape sequence at src[i] (a backslash): (index after it, its text, whether the text stands for
    one raw byte rather than a character: \\x and octal escapes in a bytes literal)."""
    if i + 1 >= len(src):
        raise CelSyntaxError(i, "unterminated escape sequence")
    e = src[i + 1]
    if e in _ESCAPES:
        return i + 2, _ESCAPES[e], False
    if e in "xX":
        hexd = src[i + 2:i + 4]
        if not re.fullmatch(r"[0-9a-fA-F]{2}", hexd):
            raise CelSyntaxError(i, "invalid \\x escape")
        return i + 4, chr(int(hexd, 16)), is_bytes
    if e in "uU":
        n = 4 if e == "u" else 8
        hexd = src[i + 2:i + 2 + n]
        if is_bytes or not re.fullmatch(rf"[0-9a-fA-F]{{{n}}}", hexd):
            raise CelSyntaxError(i, f"invalid \\{e} escape")
        cp = int(hexd, 16)
        if cp > 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
            raise CelSyntaxError(i, f"invalid unicode code point in \\{e} escape")
        return i + 2 + n, chr(cp), False
    if e in "01234567":
        octd = src[i + 1:i + 4]
        if not re.fullmatch(r"[0-3][0-7]{2}", octd):
            raise CelSyntaxError(i, "invalid octal escape")
        return i + 4, chr(int(octd, 8)), is_bytes
    raise CelSyntaxError(i, f"invalid escape sequence \\{e}")


def tokenize(src: str) -> list[Token]:
    tokens: list[Token] = []
    i = 0
    while i < len(src):
        m = _TOKEN_RE.match(src, i)
        if not m:
            raise CelSyntaxError(i, f"unexpected character {src[i]!r}")
        kind = m.lastgroup or ""
        if kind == "ws":
            i = m.end()
            continue
        if kind == "str":
            end, value, lit_kind = _read_string(src, i, m.end() - (3 if m.group()[-3:] in ("'''", '"""') else 1))
            tokens.append(Token("lit", src[i:end], i, value, lit_kind))
            i = end
            continue
        text = m.group()
        if kind == "ident":
            # a prefix like b"..." is matched by the str group first; plain idents land here
            if text in ("true", "false"):
                tokens.append(Token("lit", text, i, text == "true", "bool"))
            elif text == "null":
                tokens.append(Token("lit", text, i, None, "null"))
            else:
                tokens.append(Token("ident", text, i))
        elif kind == "num":
            tokens.append(_number_token(text, i))
        else:
            tokens.append(Token("op", text, i))
        i = m.end()
    tokens.append(Token("eof", "", len(src)))
    return tokens


def _number_token(text: str, offset: int) -> Token:
    lower = text.lower()
    if lower.startswith("0x"):
        unsigned = lower.endswith("u")
        value = int(lower[2:].rstrip("u"), 16)
        return _int_token(text, offset, value, unsigned)
    if any(c in lower for c in ".e"):
        return Token("lit", text, offset, float(text), "double")
    unsigned = lower.endswith("u")
    return _int_token(text, offset, int(lower.rstrip("u")), unsigned)


def _int_token(text: str, offset: int, value: int, unsigned: bool) -> Token:
    if unsigned:
        if value > (1 << 64) - 1:
            raise CelSyntaxError(offset, f"uint literal {text} out of range")
        return Token("lit", text, offset, value, "uint")
    # int64 range is checked after negation is known (-9223372036854775808 is valid)
    return Token("lit", text, offset, value, "int")


# ------------------------------------------------------------------------------------------------
# parser

RELOPS = {"<": "_<_", "<=": "_<=_", ">": "_>_", ">=": "_>=_", "==": "_==_", "!=": "_!=_", "in": "@in"}
ADDOPS = {"+": "_+_", "-": "_-_"}
MULOPS = {"*": "_*_", "/": "_/_", "%": "_%_"}
MAX_RECURSION = 250


class _Parser:
    def __init__(self, src: str) -> None:
        self.src = src
        self.tokens = tokenize(src)
        self.pos = 0
        self.depth = 0

    def peek(self, k: int = 0) -> Token:
        return self.tokens[min(self.pos + k, len(self.tokens) - 1)]

    def next(self) -> Token:
        t = self.tokens[self.pos]
        self.pos += 1
        return t

    def at(self, text: str) -> bool:
        t = self.peek()
        return t.kind in ("op", "ident") and t.text == text

    def expect(self, text: str) -> Token:
        t = self.peek()
        if not self.at(text):
            found = "end of expression" if t.kind == "eof" else repr(t.text)
            raise CelSyntaxError(t.offset, f"expected {text!r}, found {found}")
        return self.next()

    def enter(self, offset: int) -> None:
        self.depth += 1
        if self.depth > MAX_RECURSION:
            raise CelSyntaxError(offset, f"expression nested deeper than {MAX_RECURSION} levels")

    def parse(self) -> Node:
        node = self.expr()
        t = self.peek()
        if t.kind != "eof":
            raise CelSyntaxError(t.offset, f"unexpected {t.text!r} after the end of the expression")
        return node

    def expr(self) -> Node:
        self.enter(self.peek().offset)
        try:
            cond = self.binary_level(0)
            if self.at("?"):
                q = self.next()
                then = self.binary_level(0)
                self.expect(":")
                other = self.expr()
                return Call(q.offset, "_?_:_", (cond, then, other))
            return cond
        finally:
            self.depth -= 1

    _LEVELS: tuple[dict[str, str], ...] = ({"||": "_||_"}, {"&&": "_&&_"}, RELOPS, ADDOPS, MULOPS)

    def binary_level(self, level: int) -> Node:
        if level == len(self._LEVELS):
            return self.unary()
        ops = self._LEVELS[level]
        left = self.binary_level(level + 1)
        while self.peek().kind in ("op", "ident") and self.peek().text in ops:
            t = self.next()
            right = self.binary_level(level + 1)
            left = Call(t.offset, ops[t.text], (left, right))
        return left

    def unary(self) -> Node:
        t = self.peek()
        if t.kind == "op" and t.text in ("!", "-"):
            self.next()
            if t.text == "-" and self.peek().kind == "lit" and self.peek().lit_kind in ("int", "double"):
                lit = self.peek()
                # fold -<number> so that -9223372036854775808 is representable, as the CEL grammar does
                if self.peek(1).kind != "op" or self.peek(1).text not in (".", "[", ".?", "[?"):
                    self.next()
                    value = -lit.value if isinstance(lit.value, int | float) else lit.value
                    node: Node = Literal(t.offset, lit.lit_kind, value)
                    self._check_int(node)
                    return self.member_suffix(node)
            self.enter(t.offset)
            try:
                operand = self.unary()
            finally:
                self.depth -= 1
            return Call(t.offset, "!_" if t.text == "!" else "-_", (operand,))
        return self.member()

    @staticmethod
    def _check_int(node: Node) -> None:
        if isinstance(node, Literal) and node.kind == "int":
            v = node.value
            assert isinstance(v, int)
            if not -(1 << 63) <= v <= (1 << 63) - 1:
                raise CelSyntaxError(node.offset, f"int literal {v} out of range")

    def member(self) -> Node:
        return self.member_suffix(self.primary())

    def member_suffix(self, node: Node) -> Node:
        while True:
            t = self.peek()
            if t.kind != "op":
                return node
            if t.text in (".", ".?"):
                self.next()
                name_tok = self.next()
                if name_tok.kind != "ident":
                    raise CelSyntaxError(name_tok.offset, f"expected a field name after {t.text!r}")
                if t.text == "." and self.at("("):
                    self.next()
                    args = self.expr_list(")")
                    node = Call(name_tok.offset, name_tok.text, args, target=node)
                else:
                    node = Select(name_tok.offset, node, name_tok.text, optional=t.text == ".?")
            elif t.text in ("[", "[?"):
                self.next()
                index = self.expr()
                self.expect("]")
                node = Index(t.offset, node, index, optional=t.text == "[?")
            elif t.text == "{" and _is_type_name(node):
                node = self.struct_literal(node)
            else:
                return node

    def primary(self) -> Node:
        t = self.next()
        if t.kind == "lit":
            node: Node = Literal(t.offset, t.lit_kind, t.value)
            self._check_int(node)
            return node
        if t.kind == "ident":
            if t.text in RESERVED:
                raise CelSyntaxError(t.offset, f"reserved identifier {t.text!r}")
            if self.at("("):
                self.next()
                args = self.expr_list(")")
                return Call(t.offset, t.text, args)
            return Ident(t.offset, t.text)
        if t.kind == "op":
            if t.text == ".":
                name = self.next()
                if name.kind != "ident":
                    raise CelSyntaxError(name.offset, "expected an identifier after a leading '.'")
                if self.at("("):
                    self.next()
                    return Call(name.offset, name.text, self.expr_list(")"))
                return Ident(t.offset, "." + name.text)
            if t.text == "(":
                inner = self.expr()
                self.expect(")")
                return inner
            if t.text in ("[", "[?"):
                # the lexer reads "[?" as the optional-index token; here it opens a list whose
                # first element is optional
                elements, optional = self.list_elements(first_optional=t.text == "[?")
                return ListLit(t.offset, elements, optional)
            if t.text == "{":
                return MapLit(t.offset, self.map_entries())
        found = "end of expression" if t.kind == "eof" else repr(t.text)
        raise CelSyntaxError(t.offset, f"unexpected {found}")

    def expr_list(self, close: str) -> tuple[Node, ...]:
        items: list[Node] = []
        if self.at(close):
            self.next()
            return ()
        while True:
            items.append(self.expr())
            if self.at(","):
                self.next()
                continue
            self.expect(close)
            return tuple(items)

    def list_elements(self, *, first_optional: bool = False) -> tuple[tuple[Node, ...], tuple[bool, ...]]:
        items: list[Node] = []
        optional: list[bool] = []
        while first_optional or not self.at("]"):
            is_opt = first_optional
            first_optional = False
            if not is_opt and self.at("?"):
                self.next()
                is_opt = True
            items.append(self.expr())
            optional.append(is_opt)
            if not self.at(","):
                break
            self.next()
        self.expect("]")
        return tuple(items), tuple(optional)

    def map_entries(self) -> tuple[MapEntry, ...]:
        entries: list[MapEntry] = []
        while not self.at("}"):
            is_opt = False
            if self.at("?"):
                self.next()
                is_opt = True
            key = self.expr()
            self.expect(":")
            value = self.expr()
            entries.append(MapEntry(key, value, is_opt))
            if not self.at(","):
                break
            self.next()
        self.expect("}")
        return tuple(entries)

    def struct_literal(self, type_node: Node) -> Node:
        self.expect("{")
        fields: list[tuple[str, Node, bool]] = []
        while not self.at("}"):
            is_opt = False
            if self.at("?"):
                self.next()
                is_opt = True
            name = self.next()
            if name.kind != "ident":
                raise CelSyntaxError(name.offset, "expected a field name in a message literal")
            self.expect(":")
            fields.append((name.text, self.expr(), is_opt))
            if not self.at(","):
                break
            self.next()
        self.expect("}")
        return StructLit(type_node.offset, _type_name(type_node), tuple(fields))


def _is_type_name(node: Node) -> bool:
    if isinstance(node, Ident):
        return True
    return isinstance(node, Select) and not node.optional and _is_type_name(node.operand)


def _type_name(node: Node) -> str:
    if isinstance(node, Ident):
        return node.name
    assert isinstance(node, Select)
    return f"{_type_name(node.operand)}.{node.field}"


def parse(src: str) -> Node:
    """Parse CEL source; raises CelSyntaxError with the offending offset.

    Nesting is limited by MAX_RECURSION and, before that, by Python's own recursion limit
    (about 90 levels of parentheses with the default limit of 1000).
    """
    try:
        tree = _Parser(src).parse()
    except RecursionError:
        raise CelSyntaxError(0, "expression nested too deeply for the parser") from None
    try:
        return _expand_has(tree)
    except RecursionError:
        raise CelSyntaxError(0, f"expression nested too deeply: its syntax tree is {tree_depth(tree)} levels "
                                "deep") from None


def tree_depth(ast: Node) -> int:
    """The depth of a syntax tree, walked without recursion."""
    deepest = 0
    stack = [(ast, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children(node))
    return deepest


def _expand_has(node: Node) -> Node:
    """Turn has(x.f) into a test-only Select, as the CEL macro does; reject other has() forms."""
    def visit(n: Node) -> Node:
        if isinstance(n, Call) and n.target is None and n.function == "has":
            if len(n.args) != 1 or not isinstance(n.args[0], Select) or n.args[0].optional:
                raise CelSyntaxError(n.offset, "invalid argument to has() macro: it takes one field selection")
            sel = n.args[0]
            return Select(sel.offset, visit(sel.operand), sel.field, test_only=True)
        return map_children(n, visit)
    return visit(node)


def map_children(n: Node, f: Callable[[Node], Node]) -> Node:
    """Rebuild n with f applied to each direct child."""
    if isinstance(n, Select):
        return Select(n.offset, f(n.operand), n.field, n.optional, n.test_only)
    if isinstance(n, Index):
        return Index(n.offset, f(n.operand), f(n.index), n.optional)
    if isinstance(n, Call):
        target = f(n.target) if n.target is not None else None
        return Call(n.offset, n.function, tuple(f(a) for a in n.args), target)
    if isinstance(n, ListLit):
        return ListLit(n.offset, tuple(f(e) for e in n.elements), n.optional)
    if isinstance(n, MapLit):
        return MapLit(n.offset, tuple(MapEntry(f(e.key), f(e.value), e.optional) for e in n.entries))
    if isinstance(n, StructLit):
        return StructLit(n.offset, n.type_name, tuple((k, f(v), o) for k, v, o in n.fields))
    return n


def children(n: Node) -> tuple[Node, ...]:
    if isinstance(n, Select):
        return (n.operand,)
    if isinstance(n, Index):
        return (n.operand, n.index)
    if isinstance(n, Call):
        return ((n.target,) if n.target is not None else ()) + n.args
    if isinstance(n, ListLit):
        return n.elements
    if isinstance(n, MapLit):
        return tuple(x for e in n.entries for x in (e.key, e.value))
    if isinstance(n, StructLit):
        return tuple(v for _, v, _ in n.fields)
    return ()


def line_and_column(src: str, offset: int) -> tuple[int, int]:
    """1-based line and column (in characters) of a 0-based offset."""
    line = src.count("\n", 0, offset) + 1
    start = src.rfind("\n", 0, offset) + 1
    return line, offset - start + 1
