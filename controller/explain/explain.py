"""`tessera explain`: for a pod or a claim, why its claims are (not) allocated, step by step.

For each claim that is not allocated yet, every request (each alternative of a firstAvailable request)
goes through the funnel (funnel.py). A request with no device left is the answer, at its first empty
step. Otherwise the scheduler's search (search.py) runs on every node the pod may use: the claim
alone, then all the pod's claims together, as the scheduler allocates them. When a claim fails only
as a whole, attribution.py says which part (count, a constraint, the requests together). All searches
share one deadline and run once per node shape (searches.py).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.checks.claimspec import Constraint
from controller.cluster.inventory import DeviceIndex
from controller.cluster.matching import Evaluator
from controller.cluster.objects import object_ref
from controller.cluster.taints import taint_rules, with_rule_taints
from controller.explain.attribution import NodeInputs, combined_verdict, constraint_verdict, count_verdict
from controller.explain.extended import claim_spec_for, extended_asks, extended_claim_name
from controller.explain.funnel import Funnel, funnel
from controller.explain.nodes import NodeScope, allocation_node, pod_scope
from controller.explain.nodeside import PrepareFailure, prepare_failure, prepare_verdict
from controller.explain.reasons import Verdict, funnel_verdict, problem_verdict
from controller.explain.requests import ClaimPlan, RequestSpec, claim_plan
from controller.explain.search import Alternative, ClaimInput, Pick, SearchResult
from controller.explain.searches import BUDGET_S, STEPS_PER_SEARCH, Searches, SearchStats
from controller.explain.state import AllocatedState, reserved_pods

Obj = dict[str, Any]


@dataclass
class ClusterView:
    """What explain and status read from the apiserver, once."""

    slices: list[Obj]
    classes: dict[str, Obj]
    claims: list[Obj]
    pods: list[Obj] = field(default_factory=list)
    nodes: list[Obj] | None = None  # None: could not be read (RBAC); node selection is then not applied
    templates: list[Obj] = field(default_factory=list)
    events: list[Obj] = field(default_factory=list)  # kubelet's FailedPrepareDynamicResources events of the pod
    taint_rules: list[Obj] = field(default_factory=list)  # DeviceTaintRules, when the cluster serves them

    def __post_init__(self) -> None:
        self.rules = taint_rules(self.taint_rules)
        slices = with_rule_taints(self.slices, self.rules)  # as the scheduler sees the devices
        self.index = DeviceIndex.from_slices(slices)
        self.state = AllocatedState(self.index, slices, self.claims)
        self.evaluator = Evaluator(budget_as_outcome=True)
        self.incomplete_nodes = {d.node for d in self.index.devices if d.pool in self.index.incomplete_pools}
        self._funnels: dict[Hashable, Funnel] = {}

    def funnel(self, spec: RequestSpec, nodes: set[str] | None) -> Funnel:
        """funnel(spec) over `nodes`; requests that differ only in name and count (8 requests for one GPU each)
        share one walk of the devices."""
        if spec.conditions:  # a runtime error in a request's own selector names that request
            return funnel(spec, self.index, nodes, self.state, self.evaluator)
        key = (spec.class_name, spec.needs, json.dumps(spec.tolerations, sort_keys=True, default=str),
               spec.admin_access, frozenset(nodes) if nodes is not None else None)
        found = self._funnels.get(key)
        if found is None:
            found = self._funnels[key] = funnel(spec, self.index, nodes, self.state, self.evaluator)
        return dataclasses.replace(found, request=spec)

    def find(self, kind: str, namespace: str, name: str) -> Obj | None:
        items = {"pod": self.pods, "claim": self.claims, "template": self.templates}[kind]
        return next((o for o in items if (o.get("metadata") or {}).get("namespace") == namespace
                     and (o.get("metadata") or {}).get("name") == name), None)


@dataclass(frozen=True)
class RequestReport:
    spec: RequestSpec
    funnel: Funnel | None  # None: not tessera's, or it cannot be matched at all
    verdict: Verdict


@dataclass(frozen=True)
class ClaimReport:
    ref: str
    origin: str = ""  # how the pod names it; e.g. "template gpu (claim not created yet)"
    allocated: bool = False
    allocation: tuple[Mapping[str, Any], ...] = ()  # status.allocation.devices.results of tessera
    reserved_for: tuple[str, ...] = ()
    requests: tuple[RequestReport, ...] = ()
    constraints: tuple[Constraint, ...] = ()
    verdict: Verdict = field(default_factory=lambda: Verdict(True))
    picks: tuple[Pick, ...] = ()  # what the scheduler would take, on verdict.nodes[0]
    tried: tuple[str, ...] = ()  # nodes the search ran on (every request had devices left)
    found: tuple[str, ...] = ()  # nodes where the whole claim can be allocated


@dataclass(frozen=True)
class Explanation:
    kind: str  # pod or resourceclaim
    ref: str
    phase: str = ""
    scheduler_message: str = ""
    scope: NodeScope = field(default_factory=lambda: NodeScope(None))
    claims: tuple[ClaimReport, ...] = ()
    verdict: Verdict = field(default_factory=lambda: Verdict(True))
    problem: str = ""  # the subject does not exist, or uses no claim
    search: SearchStats = field(default_factory=SearchStats)
    prepare: PrepareFailure | None = None  # kubelet cannot prepare the allocated claims (nodeside.py)

    @property
    def note(self) -> str:
        """What the search deadline left out ("" when it searched everything)."""
        return self.search.note()


class NotFound(LookupError):
    pass


@dataclass(frozen=True)
class Budget:
    """How long explain may search: `seconds` in all, measured on `clock`."""

    seconds: float = BUDGET_S
    clock: Callable[[], float] = time.monotonic


Entry = tuple[str, Obj | None, Obj | None, str]  # claim ref, the claim (None: not created yet), spec to plan, origin


def explain_pod(view: ClusterView, namespace: str, name: str, budget: Budget | None = None) -> Explanation:
    pod = view.find("pod", namespace, name)
    if pod is None:
        raise NotFound(f'pod "{name}" not found in namespace "{namespace}"')
    status = pod.get("status") or {}
    message = next((c.get("message", "") for c in status.get("conditions") or ()
                    if c.get("type") == "PodScheduled" and c.get("status") == "False"), "")
    base = Explanation("pod", f"{namespace}/{name}", str(status.get("phase", "")), str(message))
    entries = [*_claim_entries(view, pod, namespace), *_extended_entries(view, pod, namespace)]
    if not entries:
        return _replace(base, problem=f"pod {namespace}/{name} uses no ResourceClaim and no extended resource a "
                        "DeviceClass answers: tessera has no part in where it runs")
    explained = _explain(view, base, entries, pod_scope(pod, view.nodes), budget or Budget())
    if explained.verdict.ok and all(c.allocated for c in explained.claims):
        failure = prepare_failure(pod, view.events)
        if failure is not None:
            return _replace(explained, prepare=failure, verdict=prepare_verdict(failure, f"{namespace}/{name}"))
    return explained


def _claim_entries(view: ClusterView, pod: Obj, namespace: str) -> list[Entry]:
    """The claims of spec.resourceClaims: named, or made from a template (its spec while not created yet)."""
    generated = {s.get("name"): s.get("resourceClaimName")
                 for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()}
    entries: list[Entry] = []
    for pc in (pod.get("spec") or {}).get("resourceClaims") or ():
        if pc.get("resourceClaimName"):
            claim_name = str(pc["resourceClaimName"])
            claim = view.find("claim", namespace, claim_name)
            entries.append((f"{namespace}/{claim_name}", claim, claim.get("spec") if claim else None,
                            f"pod claim {pc.get('name')}"))
        elif pc.get("resourceClaimTemplateName"):
            template_name = str(pc["resourceClaimTemplateName"])
            generated_name = generated.get(pc.get("name"))
            claim = view.find("claim", namespace, str(generated_name)) if generated_name else None
            if claim is not None:
                entries.append((f"{namespace}/{generated_name}", claim, claim.get("spec"),
                                f"pod claim {pc.get('name')}, from template {template_name}"))
                continue
            template = view.find("template", namespace, template_name)
            spec = ((template or {}).get("spec") or {}).get("spec")
            entries.append((f"{namespace}/{template_name}", None, spec,
                            f"pod claim {pc.get('name')}: template {template_name}, claim not created yet"))
    return entries


def _extended_entries(view: ClusterView, pod: Obj, namespace: str) -> list[Entry]:
    """The claim the scheduler made for the pod's extended resources, or the one it would make (extended.py)."""
    asks = extended_asks(pod, view.classes)
    what = "; ".join(a.describe() for a in asks) or "extended resources"
    created = extended_claim_name(pod)
    if created:
        claim = view.find("claim", namespace, created)
        return [(f"{namespace}/{created}", claim, claim.get("spec") if claim else None,
                 f"extended resources {what}, claim made by the scheduler")]
    if not asks:
        return []
    name = str((pod.get("metadata") or {}).get("name", ""))
    return [(f"{namespace}/{name}-extended-resources", None, claim_spec_for(asks),
             f"extended resources {what}: the scheduler makes this claim once it can allocate it")]


def explain_claim(view: ClusterView, namespace: str, name: str, budget: Budget | None = None) -> Explanation:
    claim = view.find("claim", namespace, name)
    if claim is None:
        raise NotFound(f'resourceclaim "{name}" not found in namespace "{namespace}"')
    users = [object_ref(p) for p in view.pods if _uses(p, name)]
    origin = f"used by {', '.join(f'pod {u}' for u in users)}" if users else "used by no pod"
    base = Explanation("resourceclaim", f"{namespace}/{name}")
    return _explain(view, base, [(f"{namespace}/{name}", claim, claim.get("spec"), origin)], NodeScope(None),
                    budget or Budget())


def _uses(pod: Obj, claim_name: str) -> bool:
    spec = pod.get("spec") or {}
    if any(pc.get("resourceClaimName") == claim_name for pc in spec.get("resourceClaims") or ()):
        return True
    return any(s.get("resourceClaimName") == claim_name
               for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ())


def _replace(e: Explanation, **changes: Any) -> Explanation:
    from dataclasses import replace

    return replace(e, **changes)


def _explain(view: ClusterView, base: Explanation, entries: Sequence[Entry], scope: NodeScope,
             budget: Budget) -> Explanation:
    searches = Searches(view.state, view.incomplete_nodes, budget_s=budget.seconds, clock=budget.clock)
    reports: list[ClaimReport] = []
    plans: list[tuple[int, ClaimPlan]] = []
    for ref, claim, spec, origin in entries:
        allocation = ((claim or {}).get("status") or {}).get("allocation")
        if allocation:
            results = tuple(r for r in (allocation.get("devices") or {}).get("results") or ())
            reports.append(ClaimReport(ref, origin, True, results, reserved_pods(claim or {}),
                                       verdict=Verdict(True, reason=_allocated_text(results))))
            on = allocation_node(claim or {}, view.nodes)
            if on.names is not None:
                scope = NodeScope(on.names if scope.names is None else scope.names & on.names,
                                  "; ".join(x for x in (scope.why, on.why) if x))
            continue
        if not isinstance(spec, Mapping):
            reports.append(ClaimReport(ref, origin, verdict=Verdict(
                False, "claim", f"claim {ref} does not exist (yet)", "check the pod's resourceClaims and that the "
                "resourceclaim controller runs (kube-controller-manager)")))
            continue
        plans.append((len(reports), claim_plan(ref, spec, view.classes)))
        reports.append(ClaimReport(ref, origin))
    nodes = [n for n in view.index.nodes if scope.allows(n)]
    alone: dict[int, dict[str, NodeInputs]] = {}
    for position, plan in plans:
        report, inputs = _claim(view, searches, plan, nodes, scope, report=reports[position])
        reports[position] = report
        alone[position] = inputs
    verdict = _pod_verdict(searches, reports, alone, base.kind)
    return _replace(base, scope=scope, claims=tuple(reports), verdict=verdict, search=searches.stats)


def _allocated_text(results: Sequence[Mapping[str, Any]]) -> str:
    devices = ", ".join(f"{r.get('pool')}/{r.get('device')}" for r in results) or "no device"
    return f"allocated: {devices}"


def _request_reports(view: ClusterView, plan: ClaimPlan, nodes: list[str],
                     scope: NodeScope) -> tuple[list[RequestReport], dict[str, Funnel], Verdict | None]:
    """Every request (alternative) of the claim through its funnel; the verdict of the first that fails."""
    requests: list[RequestReport] = []
    funnels: dict[str, Funnel] = {}
    failed: Verdict | None = None
    for group in plan.groups:
        group_verdicts = []
        for spec in group.alternatives:
            if not spec.ours:
                verdict = Verdict(True, reason=f'DeviceClass "{spec.class_name}" is not tessera\'s; not checked')
                requests.append(RequestReport(spec, None, verdict))
            elif spec.problem:
                verdict = problem_verdict(spec, view.classes)
                requests.append(RequestReport(spec, None, verdict))
            else:
                f = view.funnel(spec, set(nodes) if scope.names is not None else None)
                funnels[spec.ref] = f
                verdict = funnel_verdict(f, view.classes, view.evaluator, view.index, scope.why, rules=view.rules)
                requests.append(RequestReport(spec, f, verdict))
            group_verdicts.append(verdict)
        # a missing class or a selector that does not compile stops the scheduler whichever alternative it is in
        broken = next((v for s, v in zip(group.alternatives, group_verdicts, strict=True) if s.problem), None)
        if failed is None and broken is not None:
            failed = broken
        if group_verdicts and not any(v.ok for v in group_verdicts) and failed is None:
            failed = group_verdicts[0]
    return requests, funnels, failed


def _claim(view: ClusterView, searches: Searches, plan: ClaimPlan, nodes: list[str], scope: NodeScope, *,
           report: ClaimReport) -> tuple[ClaimReport, dict[str, NodeInputs]]:
    requests, funnels, failed = _request_reports(view, plan, nodes, scope)
    done = _with(report, requests=tuple(requests), constraints=plan.constraints)
    if plan.problems:
        return _with(done, verdict=Verdict(False, "constraints", plan.problems[0], "fix the claim's constraints")), {}
    if failed is not None:
        return _with(done, verdict=failed), {}
    inputs = {n: NodeInputs(n, _claim_input(plan, funnels, n), funnels) for n in nodes}
    found: list[str] = []
    picks: tuple[Pick, ...] = ()
    limited = cut = False
    for node in nodes:
        result = searches.run([inputs[node].claim], node)
        limited |= result.limited
        cut |= result.cut_short
        if result.found:
            found.append(node)
            picks = picks or (result.picks[0] if result.picks else ())
    done = _with(done, tried=tuple(nodes), found=tuple(found))
    if found:
        where = ", ".join(found)
        return _with(done, verdict=Verdict(True, reason=f"could be allocated now on {where}", nodes=tuple(found)),
                     picks=picks), {n: inputs[n] for n in found}
    per_node = list(inputs.values())
    why = count_verdict(plan.ref, per_node) or constraint_verdict(plan.ref, per_node, searches.attribute)
    if why is None and (limited or cut):
        why = _search_limit(plan.ref, searches.stats, cut)
    return _with(done, verdict=why or combined_verdict(plan.ref, nodes)), {}


def _search_limit(ref: str, stats: SearchStats, cut: bool) -> Verdict:
    """No node was found, and at least one search gave up before it knew."""
    if cut:
        return Verdict(False, "search-limit", f"no node searched can take claim {ref}, but the search budget of "
                       f"{stats.budget_s:g} s ran out before every node was searched",
                       "run tessera explain again with a larger --search-budget, or ask for fewer devices or "
                       "constraints")
    return Verdict(False, "search-limit", f"the search gave up after {STEPS_PER_SEARCH} steps on a node without "
                   f"finding devices for all requests of claim {ref}", "ask for fewer devices or fewer constraints")


def _claim_input(plan: ClaimPlan, funnels: Mapping[str, Funnel], node: str) -> ClaimInput:
    groups: list[tuple[Alternative, ...]] = []
    for group in plan.groups:
        if any(not s.ours for s in group.alternatives):
            groups.append(())  # another driver's request: not tessera's to place
            continue
        groups.append(tuple(Alternative(s, funnels[s.ref].selectable_on(node))
                            for s in group.alternatives))
    return ClaimInput(plan.ref, tuple(groups), plan.constraints)


def _with(report: ClaimReport, **changes: Any) -> ClaimReport:
    from dataclasses import replace

    return replace(report, **changes)


def _pod_verdict(searches: Searches, reports: Sequence[ClaimReport],
                 alone: Mapping[int, Mapping[str, NodeInputs]], kind: str) -> Verdict:
    for report in reports:
        if not report.verdict.ok:
            return report.verdict
    pending = [i for i, r in enumerate(reports) if not r.allocated]
    if not pending:
        return Verdict(True, reason="tessera's part is done: every claim is allocated")
    nodes = set.intersection(*(set(alone[i]) for i in pending))
    if len(pending) > 1:
        ok_nodes = sorted(n for n in nodes if searches.run([alone[i][n].claim for i in pending], n).found)
        if not ok_nodes:
            claims = ", ".join(reports[i].ref for i in pending)
            return Verdict(False, "pod", f"each of the pod's claims ({claims}) can be allocated on its own, but not "
                           "all of them together on one node", "ask for less in one of the claims, or free devices "
                           "on a node", claims=tuple(reports[i].ref for i in pending))
        nodes = set(ok_nodes)
    where = ", ".join(sorted(nodes))
    what = "the claim could" if kind == "resourceclaim" else "every claim of the pod is allocated or could"
    return Verdict(True, reason=f"tessera's part is fine: {what} be allocated now (on {where})",
                   nodes=tuple(sorted(nodes)))


def search_claim(view: ClusterView, claim: Obj, node: str) -> SearchResult:
    """What the scheduler would allocate for one claim on one node, from the same code `explain` runs."""
    plan = claim_plan(object_ref(claim), claim.get("spec") or {}, view.classes)
    funnels = {s.ref: view.funnel(s, {node}) for g in plan.groups for s in g.alternatives if s.ours and not s.problem}
    if any(not s.ours or s.problem for g in plan.groups for s in g.alternatives):
        return SearchResult(False, error="a request names a class that is missing or not tessera's")
    return Searches(view.state, view.incomplete_nodes).run([_claim_input(plan, funnels, node)], node)
