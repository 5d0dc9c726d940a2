"""What tessera publishes on its devices, as the checks need it: which attribute lives on which device
type, which capacity keys exist, and "did you mean" suggestions for names that do not.

The source of truth is `driver.attributes.DEVICE_ATTRIBUTES` (documented in docs/attributes.md); this
module only indexes it by (domain, name).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache

from driver import DRIVER_NAME

# Capacity keys tessera publishes on every device (driver.attributes.DEVICE_CAPACITIES holds the truth).
CAPACITY_NAMES: tuple[str, ...] = ("memory", "multiprocessors")
# Only memory may be requested: the MPS limit enforces it. A compute share comes from opaque config
# (sharing.mps.activeThreadPercentage), never from the scheduler's books.
REQUESTABLE_CAPACITIES: tuple[str, ...] = ("memory",)

QualifiedName = tuple[str, str]  # (domain, name)


def split_qualified(key: str, default_domain: str = DRIVER_NAME) -> QualifiedName:
    """`productName` -> (driver domain, productName); `resource.kubernetes.io/pciBusID` -> split at '/'."""
    domain, sep, name = key.partition("/")
    return (domain, name) if sep else (default_domain, key)


def qualified(domain: str, name: str) -> str:
    return f"{domain}/{name}"


@dataclass(frozen=True)
class AttributeSchema:
    """Per device type ("gpu", "mig"), the attributes every device of that type carries."""

    by_type: Mapping[str, frozenset[QualifiedName]]
    kinds: Mapping[QualifiedName, str]  # value kind: int, bool, string, version
    capacities: tuple[str, ...] = CAPACITY_NAMES
    # published on devices of every type, but only where the value is known (driver.attributes.WHEN_KNOWN_ATTRIBUTES)
    when_known: frozenset[QualifiedName] = frozenset()

    def __post_init__(self) -> None:
        if not self.by_type:
            raise ValueError("attribute schema: by_type must name at least one device type")

    @property
    def device_types(self) -> tuple[str, ...]:
        return tuple(sorted(self.by_type))

    @property
    def domains(self) -> frozenset[str]:
        return frozenset(domain for attrs in self.by_type.values() for domain, _ in attrs)

    def knows(self, domain: str, name: str) -> bool:
        return any((domain, name) in attrs for attrs in self.by_type.values())

    def carried_by(self, domain: str, name: str) -> tuple[str, ...]:
        """The device types that carry the attribute (empty when tessera never publishes it)."""
        return tuple(t for t in self.device_types if (domain, name) in self.by_type[t])

    def lacking(self, domain: str, name: str) -> tuple[str, ...]:
        """The device types that do NOT carry a published attribute: reading it there is a runtime error."""
        carried = self.carried_by(domain, name)
        return tuple(t for t in self.device_types if t not in carried) if carried else ()

    def suggest_attribute(self, domain: str, name: str) -> str | None:
        """The closest published attribute name in `domain` (case-insensitive), or None."""
        names = sorted({n for attrs in self.by_type.values() for d, n in attrs if d == domain})
        return _closest(name, names)

    def suggest_domain(self, domain: str) -> str | None:
        return _closest(domain, sorted(self.domains))

    def suggest_capacity(self, name: str) -> str | None:
        return _closest(name, list(self.capacities))


def _closest(word: str, candidates: Iterable[str]) -> str | None:
    by_lower = {c.lower(): c for c in candidates}
    if word.lower() in by_lower:
        return by_lower[word.lower()]
    matches = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[matches[0]] if matches else None


def schema_from_table(table: Mapping[str, Mapping[str, tuple[str, str]]]) -> AttributeSchema:
    """Build the index from a DEVICE_ATTRIBUTES-shaped table: type -> name -> (value kind, description)."""
    by_type: dict[str, frozenset[QualifiedName]] = {}
    kinds: dict[QualifiedName, str] = {}
    for device_type, attrs in table.items():
        names = set()
        for key, (kind, _description) in attrs.items():
            qname = split_qualified(key)
            names.add(qname)
            kinds[qname] = kind
        by_type[device_type] = frozenset(names)
    return AttributeSchema(by_type=by_type, kinds=kinds)


@cache
def published_schema() -> AttributeSchema:
    """The schema of the attributes this build of tessera publishes."""
    from driver.attributes import DEVICE_ATTRIBUTES, DEVICE_CAPACITIES, WHEN_KNOWN_ATTRIBUTES

    schema = schema_from_table({t: {**attrs, **WHEN_KNOWN_ATTRIBUTES} for t, attrs in DEVICE_ATTRIBUTES.items()})
    return AttributeSchema(by_type=schema.by_type, kinds=schema.kinds, capacities=tuple(DEVICE_CAPACITIES),
                           when_known=frozenset(split_qualified(key) for key in WHEN_KNOWN_ATTRIBUTES))
