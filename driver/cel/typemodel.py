"""The static types the selector checker infers, and the names macros and cel.bind put in scope.

Types are plain names; "dyn" is unknown. The device variable and its parts have internal shapes:
device, attrs (domain -> attribute map), attrmap (name -> value), caps, capmap (name -> quantity);
CEL sees all of them as maps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from driver.cel.limits import MAX_LIST_ATTRIBUTE_VALUES, MAX_STRING_SIZE

UNBOUNDED = 1 << 40

DEVICE_FIELDS = ("driver", "attributes", "capacity", "allowMultipleAllocations")


@dataclass(frozen=True)
class T:
    name: str
    size: int = UNBOUNDED  # max size for strings/lists/maps (for cost), unbounded if unknown
    domain: str | None = None  # for attrmap/capmap: the resolved domain ("*" if dynamic)
    elem: str = "dyn"  # element type of lists, value type of maps
    value: T | None = None  # for optional: the type of the value it may hold (None: unknown)


DYN = T("dyn", MAX_STRING_SIZE)
BOOL, INT, QUANTITY = T("bool", 1), T("int", 1), T("quantity", 1)
# An attribute value: statically `any` while DRAListTypeAttributes is off, `dyn` (a scalar or a list of
# at most 48 values, sized by the larger bound) while it is on.
ATTRIBUTE_VALUE = T("dyn", MAX_STRING_SIZE, domain="attribute-value")
DYN_ATTRIBUTE_VALUE = T("dyn", max(MAX_STRING_SIZE, MAX_LIST_ATTRIBUTE_VALUES), domain="attribute-dyn")
# The result of dyn(): statically dyn for certain (other "dyn" types here may just be unknown to tessera)
DYN_CALL = T("dyn", MAX_STRING_SIZE, domain="dyn-call")
# The value type of optional.none(): a type parameter the checker binds from what it meets (==, orValue),
# dyn if nothing binds it
TYPE_PARAM = T("dyn", MAX_STRING_SIZE, domain="type-param")


def compatible(actual: str, expected: str) -> bool:
    return expected == "*" or actual in ("dyn", expected)


def cel_type_name(t: T) -> str:
    """The CEL type name of t: the device shapes are all maps to CEL."""
    return {"device": "map", "attrs": "map", "attrmap": "map", "caps": "map", "capmap": "map"}.get(t.name, t.name)


# A type declared dyn (a dyn() result, an attribute value while DRAListTypeAttributes is on), as opposed
# to tessera's "dyn" for a type it does not infer: cel-go's homogeneous literals do not mix it with others.
DECLARED_DYN = "dyn!"


def is_concrete(t: T) -> bool:
    """Whether t is a type cel-go knows exactly (not dyn, any or an unbound type parameter)."""
    return literal_element_type(t) not in ("dyn", "any", DECLARED_DYN)


def literal_element_type(t: T) -> str:
    """The type a list/map literal element has for the homogeneity check: attribute values are `any`,
    which (unlike an unknown type) does not mix with concrete types, and neither does a declared dyn."""
    if t.domain == "attribute-value":
        return "any"
    if t.domain in ("attribute-dyn", "dyn-call"):
        return DECLARED_DYN
    return cel_type_name(t)


@dataclass
class Scope:
    """Names bound by macros and cel.bind, with what they stand for."""

    vars: dict[str, T] = field(default_factory=dict)

    def child(self, **bindings: T) -> Scope:
        return Scope({**self.vars, **bindings})
