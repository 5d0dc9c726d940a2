"""Size ranges for the cost estimator (driver.cel.cost), as cel-go's checker keeps them.

A size is a (min, max) range; all arithmetic saturates at 2^64-1 as Go's uint64 arithmetic in
cel-go's cost estimator does. The DRA environment declares the maximum sizes of what `device` holds
(k8s.io/dynamic-resource-allocation/cel, compile.go), and those bound what a selector can read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from driver.cel.limits import MAX_DOMAIN_SIZE, MAX_DRIVER_SIZE, MAX_ID_SIZE, MAX_MAP_ENTRIES, MAX_STRING_SIZE

U64 = (1 << 64) - 1
Size = tuple[int, int]
UNKNOWN: Size = (0, U64)


def add(a: int, b: int) -> int:
    return min(a + b, U64)


def mul(a: int, b: int) -> int:
    return min(a * b, U64)


def factor(x: int, f: float) -> int:
    """cel-go's multiplyByCostFactor: ceil(x * f) in float64, saturating."""
    xf = float(x)
    if xf > 0 and f > 0 and xf > float(U64) / f:
        return U64
    c = math.ceil(xf * f)
    return U64 if c >= 2.0**64 else int(c)


def union(a: Size, b: Size) -> Size:
    return (min(a[0], b[0]), max(a[1], b[1]))


def size_add(a: Size, b: Size) -> Size:
    return (add(a[0], b[0]), add(a[1], b[1]))


def size_mul(a: Size, b: Size) -> Size:
    return (mul(a[0], b[0]), mul(a[1], b[1]))


@dataclass(frozen=True)
class Entry:
    """Sizes of a container's keys and values (cel-go's entrySizeEstimate)."""

    kind: str  # "list" or "map"
    key: Size
    val: Size

    def union(self, other: Entry | None) -> Entry | None:
        if other is None:
            return None
        return Entry(self.kind, union(self.key, other.key), union(self.val, other.val))


# The DRA environment's declared sizes (k8s.io/dynamic-resource-allocation/cel): what a path below
# `device` may hold. A type is (max elements, key type, value type, fields).
@dataclass(frozen=True)
class _Decl:
    max: int
    key: _Decl | None = None
    elem: _Decl | None = None
    fields: dict[str, _Decl] = field(default_factory=dict)


_ID = _Decl(MAX_ID_SIZE)
_DOMAIN = _Decl(MAX_DOMAIN_SIZE)
_ATTRIBUTE = _Decl(MAX_STRING_SIZE)
_QUANTITY = _Decl(0)
_ATTRIBUTES = _Decl(MAX_MAP_ENTRIES, _DOMAIN, _Decl(MAX_MAP_ENTRIES, _ID, _ATTRIBUTE))
_CAPACITY = _Decl(MAX_MAP_ENTRIES, _DOMAIN, _Decl(MAX_MAP_ENTRIES, _ID, _QUANTITY))
_DEVICE = _Decl(0, fields={"driver": _Decl(MAX_DRIVER_SIZE), "attributes": _ATTRIBUTES, "capacity": _CAPACITY,
                           "allowMultipleAllocations": _Decl(1)})


def declared_size(path: tuple[str, ...]) -> Size | None:
    if not path or path[0] != "device":
        return None
    node = _DEVICE
    for name in path[1:]:
        if name in ("@items", "@values"):
            if node.elem is None:
                return None
            node = node.elem
        elif name == "@keys":
            if node.key is None:
                return None
            node = node.key
        elif name in node.fields:
            node = node.fields[name]
        elif node.elem is _ATTRIBUTE:
            node = _ATTRIBUTE  # any attribute name in a domain's map
        else:
            return None
    return (0, node.max)


def replaced_size(s: Size, old: Size, new: Size) -> Size:
    """Kubernetes' bound on the size of s.replace(old, new)."""
    count_max = retained_max = count_min = retained_min = 0
    if old[0] == 0:
        count_max, retained_max = (add(s[1], 1) if s[1] < U64 else s[1]), s[1]
    elif new[1] <= old[0]:
        count_max, retained_max = 0, s[1]
    else:
        count_max = math.ceil(s[1] / old[0])
    if old[1] == 0:
        count_min, retained_min = (add(s[0], 1) if s[0] < U64 else s[0]), s[0]
    elif old[1] <= new[0]:
        count_min, retained_min = 0, s[0]
    else:
        count_min = math.ceil(s[0] / old[1])
    return size_add(size_mul((count_min, count_max), new), (retained_min, retained_max))
