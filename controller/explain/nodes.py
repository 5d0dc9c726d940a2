"""Which nodes a pod may run on, as far as its own spec says: spec.nodeName, spec.nodeSelector and the
required node affinity (the scheduler's NodeName, NodeSelector and NodeAffinity filters). Node taints
and resources are not tessera's business: a pod held back by them is Pending for another reason."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True)
class NodeScope:
    """The nodes a pod may use (None: any node) and how the pod says so."""

    names: frozenset[str] | None
    why: str = ""

    def allows(self, node: str) -> bool:
        return self.names is None or node in self.names


def _labels(node: Mapping[str, Any]) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def _requirement(req: Mapping[str, Any], value_of: Mapping[str, str]) -> bool:
    key, op = str(req.get("key", "")), str(req.get("operator", ""))
    values = [str(v) for v in req.get("values") or ()]
    present = key in value_of
    if op == "In":
        return present and value_of[key] in values
    if op == "NotIn":
        return not present or value_of[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, want = int(value_of[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def _term(term: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    exprs = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not exprs and not fields:
        return False  # an empty term matches no node
    name = {"metadata.name": str((node.get("metadata") or {}).get("name", ""))}
    return all(_requirement(e, _labels(node)) for e in exprs) and all(_requirement(f, name) for f in fields)


def node_selector_matches(selector: Mapping[str, Any] | None, node: Mapping[str, Any]) -> bool:
    """A core NodeSelector (terms ORed); None matches every node."""
    if not selector:
        return True
    return any(_term(t, node) for t in selector.get("nodeSelectorTerms") or () if isinstance(t, Mapping))


def pod_scope(pod: Mapping[str, Any], nodes: Iterable[Obj] | None) -> NodeScope:
    """The nodes `pod` may run on. With `nodes` None (they could not be read) only spec.nodeName counts."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return NodeScope(frozenset({str(spec["nodeName"])}), f"it is bound to node {spec['nodeName']}")
    selector = spec.get("nodeSelector") or {}
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not selector and not required:
        return NodeScope(None)
    parts = []
    if selector:
        parts.append("nodeSelector " + ", ".join(f"{k}={v}" for k, v in sorted(selector.items())))
    if required:
        parts.append("required node affinity")
    why = " and ".join(parts)
    if nodes is None:
        return NodeScope(None, f"{why} (not applied: the nodes could not be read)")
    names = frozenset(
        str((n.get("metadata") or {}).get("name"))
        for n in nodes
        if all(_labels(n).get(k) == str(v) for k, v in selector.items()) and node_selector_matches(required, n)
    )
    return NodeScope(names, why)


def allocation_node(claim: Mapping[str, Any], nodes: Iterable[Obj] | None) -> NodeScope:
    """The nodes an allocated claim can be used on (status.allocation.nodeSelector)."""
    selector = ((claim.get("status") or {}).get("allocation") or {}).get("nodeSelector")
    if not selector:
        return NodeScope(None)
    name = str((claim.get("metadata") or {}).get("name", ""))
    why = f"claim {name} is allocated there"
    if nodes is None:
        # tessera's slices name their node, so the selector is `metadata.name In [node]`
        names = {str(v) for t in selector.get("nodeSelectorTerms") or () for f in t.get("matchFields") or ()
                 if f.get("key") == "metadata.name" and f.get("operator") == "In" for v in f.get("values") or ()}
        return NodeScope(frozenset(names), why) if names else NodeScope(None)
    return NodeScope(frozenset(str((n.get("metadata") or {}).get("name")) for n in nodes
                               if node_selector_matches(selector, n)), why)
