"""Static analysis of a DRA selector: what it reads, whether each read is guarded, its type, its cost.

The webhook needs to know, before any device exists, which attributes and capacities a selector
touches and whether a device lacking one would make the selector fail (a run-time error blocks
scheduling for every pod using the class) or merely not match. It also needs the checks the
apiserver performs at admission that an engine without a type checker (cel-python) cannot do:
field names on `device`, homogeneous literals, regex literals, known functions and obvious
overload mismatches, a bool result, and the estimated cost limit.

The work is split by concern: driver.cel.typecheck walks the tree (types, reads, issues),
driver.cel.guards decides which presence tests guard which reads, driver.cel.cost estimates the
cost from the types found, driver.cel.findings holds what is reported and driver.cel.limits the
Kubernetes limits. This module runs them in order.
"""

from __future__ import annotations

from driver.cel.cost import estimate as estimate_cost
from driver.cel.environment import STORED, CelEnvironment
from driver.cel.findings import Analysis
from driver.cel.syntax import Node
from driver.cel.typecheck import TypeChecker
from driver.cel.typemodel import Scope, T, cel_type_name


def analyze(src: str, ast: Node, environment: CelEnvironment = STORED) -> Analysis:
    a = TypeChecker(src, environment)
    result = a.visit(ast, Scope(), frozenset())
    result_name = cel_type_name(result)
    if not _acceptable_result(result, environment):
        a.issue(ast.offset, f"must evaluate to bool or the unknown type, not {result_name}")
    cost_int = estimate_cost(ast, a.types, a.elems)
    return Analysis(
        reads=tuple(a.reads),
        result_type=result_name,
        estimated_cost=cost_int,
        issues=tuple(a.issues),
        list_index_calls=frozenset(a.list_index_calls),
        dynamic_equality_calls=frozenset(a.dynamic_equality_calls),
        message_equality_calls=frozenset(a.message_equality_calls),
        constant_membership_calls=frozenset(a.constant_membership_calls),
        optional_equality_calls=frozenset(a.optional_equality_calls),
    )


def _acceptable_result(result: T, environment: CelEnvironment) -> bool:
    """bool, or the attribute value type: `any`, or `dyn` while DRAListTypeAttributes is on. tessera's
    "dyn" also stands for types it does not infer, so only a dyn() result is known to be dyn."""
    name = cel_type_name(result)
    if name == "bool" or result.domain == "attribute-value":
        return True
    if name == "dyn":
        return environment.dyn_attributes or result.domain not in ("dyn-call", "type-param")
    return False
