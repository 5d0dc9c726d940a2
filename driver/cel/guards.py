"""Which presence tests guard which reads.

A selector that reads a missing attribute fails with a run-time error (which blocks scheduling for
every pod using the class) unless a presence test protects the read. CEL's `&&` and `||` are
commutative with respect to errors: in `a && b` an error on one side is absorbed when the other side
is false, so a presence test anywhere in a conjunction guards reads in the other conjuncts, and a
negated presence test guards the other disjuncts of `||`. A fact is a (kind, domain, name) key known
to be present.
"""

from __future__ import annotations

from collections.abc import Iterator

from driver.cel.syntax import Call, Ident, Index, Literal, Node, Select
from driver.cel.typemodel import Scope

Fact = tuple[str, str, str]  # (kind, domain, name) known present


def flatten(n: Node, op: str) -> Iterator[Node]:
    if isinstance(n, Call) and n.function == op and n.target is None:
        for a in n.args:
            yield from flatten(a, op)
    else:
        yield n


def domain_map(n: Node, scope: Scope) -> tuple[str, str] | None:
    """(kind, domain) when n denotes device.attributes[D] / device.capacity[D] with a literal D."""
    operand: Node
    if isinstance(n, Ident):
        t = scope.vars.get(n.name)
        if t is not None and t.name in ("attrmap", "capmap") and t.domain:
            return ("attribute" if t.name == "attrmap" else "capacity"), t.domain
        return None
    if isinstance(n, Select) and not n.optional and not n.test_only:
        operand, key = n.operand, n.field
    elif isinstance(n, Index) and not n.optional and isinstance(n.index, Literal) and isinstance(n.index.value, str):
        operand, key = n.operand, n.index.value
    else:
        return None
    root = _device_map(operand, scope)
    return (root, key) if root else None


def _device_map(n: Node, scope: Scope) -> str | None:
    if isinstance(n, Ident):
        t = scope.vars.get(n.name)
        if t is not None and t.name in ("attrs", "caps"):
            return "attribute" if t.name == "attrs" else "capacity"
        return None
    if isinstance(n, Select) and n.field in ("attributes", "capacity") and isinstance(n.operand, Ident) and (
            n.operand.name == "device" and "device" not in scope.vars):
        return "attribute" if n.field == "attributes" else "capacity"
    return None


def _presence_test(n: Node, scope: Scope) -> Fact | None:
    if isinstance(n, Select) and n.test_only:
        dm = domain_map(n.operand, scope)
        if dm:
            return dm[0], dm[1], n.field
    if isinstance(n, Call) and n.function == "@in" and isinstance(n.args[0], Literal) and isinstance(
            n.args[0].value, str):
        dm = domain_map(n.args[1], scope)
        if dm:
            return dm[0], dm[1], n.args[0].value
    return None


def presence_facts(n: Node, scope: Scope) -> tuple[frozenset[Fact], frozenset[Fact]]:
    """(facts true when n is true, facts true when n is false)."""
    fact = _presence_test(n, scope)
    if fact:
        return frozenset({fact}), frozenset()
    if isinstance(n, Call) and n.function == "!_" and n.target is None:
        pos, neg = presence_facts(n.args[0], scope)
        return neg, pos
    if isinstance(n, Call) and n.function == "_&&_" and n.target is None:
        when_true: frozenset[Fact] = frozenset().union(*(presence_facts(a, scope)[0] for a in flatten(n, "_&&_")))
        return when_true, frozenset()
    if isinstance(n, Call) and n.function == "_||_" and n.target is None:
        when_false: frozenset[Fact] = frozenset().union(*(presence_facts(a, scope)[1] for a in flatten(n, "_||_")))
        return frozenset(), when_false
    return frozenset(), frozenset()
