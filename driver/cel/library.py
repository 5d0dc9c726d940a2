"""Engine-independent implementations of the Kubernetes CEL library functions.

Each engine adapts its own value types to these; the semantics (Go's regexp iteration rule,
quantity arithmetic, semver parsing, the lists and sets helpers) live here once.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import re2  # type: ignore[import-untyped]

from driver.quantity import Quantity
from driver.semver import Version

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # errors are reported to the user, not to stderr


@lru_cache(maxsize=256)
def compiled_regex(pattern: str) -> Any:
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as e:
        detail = e.args[0].decode() if e.args and isinstance(e.args[0], bytes) else str(e)
        raise ValueError(f"invalid regular expression {pattern!r}: {detail}") from e


def regex_find(s: str, pattern: str) -> str:
    m = compiled_regex(pattern).search(s)
    return m.group(0) if m else ""


def regex_find_all(s: str, pattern: str, limit: int = -1) -> list[str]:
    """Go's FindAllString: an empty match directly after the previous match is dropped."""
    if limit == 0:
        return []
    rx = compiled_regex(pattern)
    out: list[str] = []
    pos = 0
    prev_end = -1
    while pos <= len(s) and (limit < 0 or len(out) < limit):
        m = rx.search(s, pos)
        if m is None:
            break
        start, end = m.span()
        accept = True
        if end == start:
            if start == prev_end:
                accept = False
            pos = start + 1 if start >= pos else pos + 1
        else:
            pos = end
        prev_end = end
        if accept:
            out.append(m.group(0))
    return out


def quantity_from_string(s: str) -> Quantity:
    return Quantity.parse(s)


def is_quantity(s: str) -> bool:
    try:
        Quantity.parse(s)
    except ValueError:
        return False
    return True


def semver_from_string(s: str, normalize: bool = False) -> Version:
    return Version.parse_normalized(s) if normalize else Version.parse(s)


def is_semver(s: str, normalize: bool = False) -> bool:
    try:
        semver_from_string(s, normalize)
    except ValueError:
        return False
    return True


def quantity_as_integer(q: Quantity) -> int:
    v = q.as_int64()
    if v is None:
        raise ValueError("cannot convert value to integer")
    return v


class ComputedQuantity(Quantity):
    """The result of add()/sub(): a Go *Quantity, which Quantity.Equal never accepts as its argument."""

    __slots__ = ()

    @classmethod
    def of(cls, q: Quantity) -> ComputedQuantity:
        out = cls.__new__(cls)
        out._int, out._dec, out.format, out._s = q._int, q._dec, q.format, ""
        return out


def quantity_add(q: Quantity, other: Quantity | int) -> Quantity:
    """CEL's q.add(x): Go converts an int with NewQuantity(x, DecimalExponent)."""
    addend = other if isinstance(other, Quantity) else Quantity.from_int(other, "DecimalExponent")
    return ComputedQuantity.of(q.add(addend))


def quantity_sub(q: Quantity, other: Quantity | int) -> Quantity:
    subtrahend = other if isinstance(other, Quantity) else Quantity.from_int(other, "DecimalExponent")
    return ComputedQuantity.of(q.sub(subtrahend))


def compare(a: Quantity | Version, b: Quantity | Version) -> int:
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return a.cmp(b)
    if isinstance(a, Version) and isinstance(b, Version):
        return a.compare(b)
    raise TypeError("no such overload")


MAX_INCLUDES_LIST = 48


def go_equal(a: Any, b: Any) -> bool:
    """cel-go's a.Equal(b) on plain values: a Quantity/Semver receiver fails on any other type,
    numbers compare across int/uint/double, bool never equals a number."""
    if isinstance(a, Quantity):
        if not isinstance(b, Quantity) or isinstance(b, ComputedQuantity):
            raise TypeError("no such overload")
        return a.cmp(b) == 0
    if isinstance(a, Version):
        if not isinstance(b, Version):
            raise TypeError("no such overload")
        return a.compare(b) == 0
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return bool(a == b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(go_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


def includes(target: Any, value: Any) -> bool:
    """DRA's <dyn>.includes(<dyn>): equality for a scalar, membership for a list (at most 48)."""
    if isinstance(target, list):
        if len(target) > MAX_INCLUDES_LIST:
            raise ValueError(f"includes() on a list of {len(target)} values; at most {MAX_INCLUDES_LIST} allowed")
        return any(_same_type_equal(item, value) for item in target)
    return _same_type_equal(target, value)


def in_constant_list(item: Any, items: Sequence[Any]) -> bool:
    """cel-go's `x in [literal, ...]`: a hash-set lookup, which panics (a run-time error) on a Semver."""
    if isinstance(item, Version):
        raise ValueError("internal error: runtime error: hash of unhashable type cel.Semver")
    return any(_same_type_equal(item, element) for element in items)


def _same_type_equal(a: Any, b: Any) -> bool:
    # includes() never fails on a type mismatch (Kubernetes answers false)
    try:
        return go_equal(a, b)
    except TypeError:
        return False


# ---- Kubernetes lists library (v0) and cel-go lists/sets extensions ------------------------------

def _check_comparable(items: Sequence[Any]) -> None:
    kinds = {type(i) if not isinstance(i, bool) else bool for i in items}
    numeric = {int, float}
    if len(kinds) > 1 and not kinds <= numeric:
        raise TypeError("no such overload")


def list_is_sorted(items: Sequence[Any]) -> bool:
    _check_comparable(items)
    return all(items[i] <= items[i + 1] for i in range(len(items) - 1))


def list_min(items: Sequence[Any]) -> Any:
    if not items:
        raise ValueError("min called on empty list")
    _check_comparable(items)
    return min(items)


def list_max(items: Sequence[Any]) -> Any:
    if not items:
        raise ValueError("max called on empty list")
    _check_comparable(items)
    return max(items)


def list_index_of(items: Sequence[Any], value: Any) -> int:
    for i, item in enumerate(items):
        if item == value and type(item) is type(value):
            return i
    return -1


def list_last_index_of(items: Sequence[Any], value: Any) -> int:
    for i in range(len(items) - 1, -1, -1):
        if items[i] == value and type(items[i]) is type(value):
            return i
    return -1


def sets_contains(a: Sequence[Any], b: Sequence[Any]) -> bool:
    return all(any(x == y for x in a) for y in b)


def sets_equivalent(a: Sequence[Any], b: Sequence[Any]) -> bool:
    return sets_contains(a, b) and sets_contains(b, a)


def sets_intersects(a: Sequence[Any], b: Sequence[Any]) -> bool:
    return any(x == y for x in a for y in b)


def lists_distinct(items: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for i in items:
        if not any(i == o and type(i) is type(o) for o in out):
            out.append(i)
    return out


def lists_flatten(items: Sequence[Any], depth: int = 1) -> list[Any]:
    if depth < 0:
        raise ValueError("level must be non-negative")
    out: list[Any] = []
    for i in items:
        if isinstance(i, list) and depth > 0:
            out.extend(lists_flatten(i, depth - 1))
        else:
            out.append(i)
    return out


def lists_slice(items: Sequence[Any], start: int, end: int) -> list[Any]:
    if start < 0 or end < 0:
        raise ValueError(f"cannot slice({start}, {end}), negative indexes not supported")
    if start > end:
        raise ValueError(f"cannot slice({start}, {end}), start index must be less than or equal to end index")
    if end > len(items):
        raise ValueError(f"cannot slice({start}, {end}), list is length {len(items)}")
    return list(items[start:end])


def lists_sort(items: Sequence[Any]) -> list[Any]:
    _check_comparable(items)
    return sorted(items)


def lists_range(n: int) -> list[int]:
    return list(range(n))


# ---- strings extension (v2), for the engine that lacks it ----------------------------------------

def string_char_at(s: str, i: int) -> str:
    if i < 0 or i > len(s):
        raise IndexError(f"index out of range: {i}")
    return s[i:i + 1]


def string_index_of(s: str, sub: str, start: int = 0) -> int:
    if start < 0 or start > len(s):
        raise IndexError(f"index out of range: {start}")
    return s.find(sub, start)


def string_last_index_of(s: str, sub: str, end: int | None = None) -> int:
    if end is None:
        return s.rfind(sub)
    if end < 0 or end >= len(s) + (1 if not s else 0):
        raise IndexError(f"index out of range: {end}")
    return s.rfind(sub, 0, end + len(sub))


def string_lower_ascii(s: str) -> str:
    return "".join(c.lower() if "A" <= c <= "Z" else c for c in s)


def string_upper_ascii(s: str) -> str:
    return "".join(c.upper() if "a" <= c <= "z" else c for c in s)


def string_replace(s: str, old: str, new: str, n: int = -1) -> str:
    return s.replace(old, new, n if n >= 0 else -1)


def string_split(s: str, sep: str, n: int = -1) -> list[str]:
    if n == 0:
        return []
    if sep == "":
        chars = list(s)
        if n > 0 and len(chars) > n:
            return [*chars[:n - 1], "".join(chars[n - 1:])]
        return chars
    return s.split(sep, n - 1) if n > 0 else s.split(sep)


def string_substring(s: str, start: int, end: int | None = None) -> str:
    stop = len(s) if end is None else end
    if start < 0 or start > len(s) or stop < start or stop > len(s):
        raise IndexError(f"substring({start}, {stop}) out of range for a string of length {len(s)}")
    return s[start:stop]


_WHITESPACE = " \t\n\v\f\r\u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
              "\u2028\u2029\u202f\u205f\u3000"


def string_trim(s: str) -> str:
    return s.strip(_WHITESPACE)


def string_join(items: Sequence[str], sep: str = "") -> str:
    if not all(isinstance(i, str) for i in items):
        raise TypeError("no such overload")
    return sep.join(items)


def strings_quote(s: str) -> str:
    from driver.cel.printer import quote_string

    return quote_string(s)
