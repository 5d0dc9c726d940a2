"""What the static analysis of a selector reports: the attributes and capacities it reads, the
compile-time issues it finds, and the Analysis record that carries both with the selector's type and cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal as TypingLiteral

ReadKind = TypingLiteral["attribute", "capacity"]


@dataclass(frozen=True)
class AttributeRead:
    """One attribute or capacity lookup in a selector.

    domain/name are resolved (`device.attributes["gpu.tessera.dev"].productName` ->
    ("gpu.tessera.dev", "productName")); a non-literal key is reported as "*". `guarded` is True
    when a missing key cannot surface as a run-time error (a presence test, `.?`/`[?]`, or a read
    protected by a presence test in the same conjunction/branch). `column` is 1-based.
    `value_type` is the type the expression expects the value to have where that is evident
    (e.g. "string" for `.startsWith(...)`, "semver" for `.isGreaterThan(semver(...))`), else None.
    """

    kind: ReadKind
    domain: str
    name: str
    guarded: bool
    column: int
    value_type: str | None = None


@dataclass(frozen=True)
class Issue:
    offset: int
    message: str


@dataclass
class Analysis:
    reads: tuple[AttributeRead, ...]
    result_type: str  # a CEL type name, "dyn" when unknown
    estimated_cost: int
    issues: tuple[Issue, ...]
    # offsets of indexOf()/lastIndexOf() calls whose receiver is statically a list (not a string)
    list_index_calls: frozenset[int] = frozenset()
    # offsets of ==/!= whose left operand's type is only known at run time, and of those whose left
    # operand is a Quantity or Semver (see engine_celexpr)
    dynamic_equality_calls: frozenset[int] = frozenset()
    message_equality_calls: frozenset[int] = frozenset()
    # offsets of `x in [literals...]` where x may be a Semver: cel-go looks such lists up in a hash
    # set, and a Semver cannot be hashed (a run-time error in Kubernetes)
    constant_membership_calls: frozenset[int] = frozenset()
    # offsets of ==/!= between two optionals: cel-go compares the values they hold with Go's Equal
    optional_equality_calls: frozenset[int] = frozenset()
