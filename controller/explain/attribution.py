"""Every request has devices left, yet the claim cannot be allocated on any node: which part of the
claim is in the way. The search is run again without parts of the claim (one constraint, then all) to
find the one whose removal lets it through, the way a person would try it by hand."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from controller.checks.claimspec import Constraint
from controller.cluster.inventory import InventoryDevice
from controller.explain.funnel import Funnel
from controller.explain.reasons import Verdict
from controller.explain.search import ClaimInput, SearchResult, attribute_value, typed_value

Search = Callable[[Sequence[ClaimInput], str], SearchResult]


@dataclass(frozen=True)
class NodeInputs:
    """A claim's search input on one node, with the request funnels it came from."""

    node: str
    claim: ClaimInput
    funnels: Mapping[str, Funnel]  # by request ref


def _survivors(inputs: NodeInputs, ref: str) -> list[InventoryDevice]:
    f = inputs.funnels.get(ref)
    return list(f.candidates_on(inputs.node)) if f else []


def _needed(inputs: NodeInputs, ref: str) -> int:
    f = inputs.funnels.get(ref)
    return f.request.count if f and f.request.mode != "All" else 0


def count_verdict(ref: str, per_node: Sequence[NodeInputs]) -> Verdict | None:
    """A request that needs more devices on one node than any node has left for it."""
    groups = per_node[0].claim.groups if per_node else ()
    for alternatives in groups:
        refs = [a.spec.ref for a in alternatives]
        if any(len(_survivors(n, r)) >= _needed(n, r) for n in per_node for r in refs):
            continue
        have, node, request = max(((len(_survivors(n, r)), n.node, r) for n in per_node for r in refs),
                                  key=lambda t: t[0])
        need = _needed(per_node[0], request)
        return Verdict(False, "count", f'request "{request}" of claim {ref} needs {need} devices on one node, but '
                       f"the most any node has left for it is {have} (on {node})",
                       f"ask for at most {have}, or free devices on {node}", nodes=(node,))
    return None


def constraint_verdict(ref: str, per_node: Sequence[NodeInputs], search: Search) -> Verdict | None:
    """The constraint (or constraints) whose removal makes the claim allocatable somewhere."""
    constraints = per_node[0].claim.constraints if per_node else ()
    if not constraints:
        return None
    for i, c in enumerate(constraints):
        rest = constraints[:i] + constraints[i + 1:]
        if any(search([replace(n.claim, constraints=rest)], n.node).found for n in per_node):
            return _explain_constraint(ref, c, per_node)
    if any(search([replace(n.claim, constraints=())], n.node).found for n in per_node):
        described = "; ".join(c.describe() for c in constraints)
        return Verdict(False, "constraints", f"claim {ref}'s constraints ({described}) cannot all be met on one node "
                       "with the devices left", "drop one of the constraints or ask for fewer devices")
    return None


def _explain_constraint(ref: str, c: Constraint, per_node: Sequence[NodeInputs]) -> Verdict:
    best: tuple[int, str, str, list[str]] = (-1, "", "", [])
    needed = 0
    for n in per_node:
        refs = [a.spec.ref for alts in n.claim.groups for a in alts[:1] if c.applies(a.spec.ref)]
        needed = sum(_needed(n, r) for r in refs)
        devices = list(dict.fromkeys(d for r in refs for d in _survivors(n, r)))
        values: Counter[str] = Counter()
        members: dict[str, list[str]] = {}
        for d in devices:
            raw = attribute_value(d, c.attribute)
            typed = typed_value(raw) if raw is not None else None
            if typed is None:
                continue
            text = str(typed[1])
            values[text] += 1
            members.setdefault(text, []).append(d.name)
        if c.kind == "matchAttribute":
            top = values.most_common(1)
            size, value = (top[0][1], top[0][0]) if top else (0, "")
            if size > best[0]:
                best = (size, n.node, value, members.get(value, []))
        elif len(values) > best[0]:
            best = (len(values), n.node, ", ".join(sorted(values)), [])
    size, node, value, names = best
    if c.kind == "matchAttribute":
        group = f" ({value}: {', '.join(names)})" if names else ""
        return Verdict(False, "constraints", f"no node has {needed} devices left with the same {c.attribute}, as "
                       f"claim {ref}'s matchAttribute asks: the largest group is {max(size, 0)} on {node}{group}",
                       f"ask for at most {_devices(max(size, 0))}, or drop the matchAttribute {c.attribute} constraint",
                       devices=tuple(f"{node}/{d}" for d in names), nodes=(node,))
    return Verdict(False, "constraints", f"no node has {needed} devices left with different {c.attribute}, as claim "
                   f"{ref}'s distinctAttribute asks: {node} has {max(size, 0)} distinct value"
                   f"{'s' if size != 1 else ''} ({value})",
                   f"ask for at most {_devices(max(size, 1))}, or drop the distinctAttribute {c.attribute} constraint",
                   nodes=(node,))


def _devices(n: int) -> str:
    return f"{n} device" if n == 1 else f"{n} devices"


def combined_verdict(ref: str, nodes: Sequence[str]) -> Verdict:
    tried = ", ".join(nodes[:5]) + (" ..." if len(nodes) > 5 else "")
    return Verdict(False, "combined", f"each request of claim {ref} has devices left, but not all of them together on "
                   f"one node (tried {tried}): they compete for the same devices, memory or MIG slices",
                   "ask for fewer or smaller devices, or split the claim", nodes=tuple(nodes))
