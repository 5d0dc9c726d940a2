"""Split a CEL expression at its top-level `&&` so a "nearest miss" can say which part failed.

This is a lexical split, not a parse: it tracks string literals (all CEL quote forms, raw strings),
comments and bracket depth, and refuses to split when a top-level `||` or conditional `?:` would
change the meaning (`a && b || c` is `(a && b) || c`). Each part is compiled again by the caller, so a
split that produced something odd only costs precision, never correctness.
"""

from __future__ import annotations

_OPEN = "([{"
_CLOSE = ")]}"


def split_conjuncts(expression: str) -> list[str]:
    """`a && (b || c) && d` -> ["a", "(b || c)", "d"]; anything not a plain top-level conjunction -> [expression]."""
    parts: list[str] = []
    start = 0
    depth = 0
    i = 0
    n = len(expression)
    while i < n:
        ch = expression[i]
        if ch in "\"'":
            i = skip_string(expression, i)
            continue
        if ch in "rRbB" and i + 1 < n and expression[i + 1] in "\"'" and not _ident_char_before(expression, i):
            i = skip_string(expression, i + 1, raw=ch in "rR")
            continue
        if expression.startswith("//", i):
            end = expression.find("\n", i)
            i = n if end < 0 else end + 1
            continue
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        elif depth == 0:
            if expression.startswith("||", i):
                return [expression.strip()]
            if ch == "?" and not _optional_marker(expression, i):
                return [expression.strip()]
            if expression.startswith("&&", i):
                parts.append(expression[start:i])
                i += 2
                start = i
                continue
        i += 1
    parts.append(expression[start:])
    stripped = [p.strip() for p in parts]
    if depth != 0 or any(not p for p in stripped):
        return [expression.strip()]
    return stripped


def skip_string(text: str, i: int, *, raw: bool = False) -> int:
    """Index just past the string literal whose opening quote is at `i` (or len(text) if unterminated)."""
    quote = text[i]
    triple = text.startswith(quote * 3, i)
    delim = quote * 3 if triple else quote
    j = i + len(delim)
    while j < len(text):
        if not raw and text[j] == "\\":
            j += 2
            continue
        if text.startswith(delim, j):
            return j + len(delim)
        if not triple and text[j] == "\n":
            return j
        j += 1
    return len(text)


def _ident_char_before(text: str, i: int) -> bool:
    return i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")


def _optional_marker(text: str, i: int) -> bool:
    """`?` in `x.?f` or `m[?k]` is optional syntax, not the conditional operator."""
    j = i - 1
    while j >= 0 and text[j] in " \t\r\n":
        j -= 1
    return j >= 0 and text[j] in ".["
