"""A ResourceClaimSpec as the allocator sees it: requests (a firstAvailable request is its list of
subrequests), each with its class's selectors, its own selectors, capacity, count and tolerations,
compiled with the webhook's code. The claim is read with the webhook's walker
(controller.checks.claimspec) and its selectors compiled by controller.checks.selectors and classes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from controller.checks.claimspec import Constraint, RequestBody, constraints, requests
from controller.checks.classes import class_conditions
from controller.checks.ownership import class_targets_tessera, is_our_class_name
from controller.checks.selectors import compile_selectors
from controller.cluster.capacityfit import CapacityNeed
from controller.cluster.matching import Condition
from driver.names import base_request, subrequest
from driver.quantity import Quantity

Obj = dict[str, Any]


@dataclass(frozen=True)
class RequestSpec:
    """One request, or one subrequest of a firstAvailable request."""

    ref: str  # "gpu", or "gpu/full" for a subrequest
    class_name: str
    mode: str  # ExactCount or All
    count: int  # 0 for All
    class_conditions: tuple[Condition, ...] = ()
    conditions: tuple[Condition, ...] = ()  # the request's own selectors
    needs: tuple[CapacityNeed, ...] = ()
    tolerations: tuple[Mapping[str, Any], ...] = ()
    admin_access: bool = False
    ours: bool = True  # the class is one of tessera's
    problem: str = ""  # why it cannot be matched at all (class missing, selector does not compile)

    @property
    def base(self) -> str:
        return base_request(self.ref)

    @property
    def sub(self) -> str:
        return subrequest(self.ref)

    @property
    def all_conditions(self) -> tuple[Condition, ...]:
        return self.class_conditions + self.conditions

    def describe(self) -> str:
        """`2 x gpu.tessera.dev, memory 10Gi` — what the request asks for."""
        amount = "all" if self.mode == "All" else str(self.count)
        capacity = "".join(f", {n.key} {n.text}" for n in self.needs)
        selectors = f", {len(self.conditions)} selector{'s' if len(self.conditions) != 1 else ''}" \
            if self.conditions else ""
        return f"{amount} x {self.class_name}{capacity}{selectors}"


@dataclass(frozen=True)
class RequestGroup:
    """A request of the claim: one alternative for `exactly`, several for `firstAvailable`."""

    name: str
    alternatives: tuple[RequestSpec, ...]


@dataclass(frozen=True)
class ClaimPlan:
    """Everything the allocator needs from one claim."""

    ref: str  # namespace/name (or the template's, for a claim not created yet)
    groups: tuple[RequestGroup, ...] = ()
    constraints: tuple[Constraint, ...] = ()
    problems: tuple[str, ...] = field(default=())


def _needs(body: Mapping[str, Any]) -> tuple[tuple[CapacityNeed, ...], str]:
    """All capacity.requests, kept literally: a key the devices lack must rule them out, as it does in the
    scheduler (the webhook rejects such keys; a claim admitted without it still has them)."""

    capacity = body.get("capacity")
    requests = capacity.get("requests") if isinstance(capacity, Mapping) else None
    needs = []
    for key, amount in (requests or {}).items():
        try:
            needs.append(CapacityNeed(str(key), Quantity.parse(str(amount)).value(), str(amount)))
        except ValueError:
            return (), f"capacity.requests[{key}] = {amount!r} is not a quantity"
    return tuple(needs), ""


def request_spec(request: RequestBody, classes: Mapping[str, Obj]) -> RequestSpec:
    class_name, ref, body = request.class_name, request.ref, request.body
    cls = classes.get(class_name)
    ours = is_our_class_name(class_name) or (cls is not None and class_targets_tessera(dict(cls)))
    base = RequestSpec(ref, class_name, request.mode, request.count, tolerations=request.tolerations,
                       admin_access=request.admin_access, ours=ours)
    if cls is None:
        # whoever's class it was meant to be, the scheduler stops at a class that does not exist
        return replace(base, ours=True, problem=f'DeviceClass "{class_name}" does not exist')
    class_errors, class_conds = class_conditions(dict(cls))
    errors, conds = compile_selectors(body.get("selectors"), "selectors", f'request "{ref}"')
    needs, need_error = _needs(body)
    problem = ""
    if class_errors:
        problem = f'DeviceClass "{class_name}" has a selector that does not compile: {class_errors[0].message}'
    elif errors:
        problem = f"a selector of request \"{ref}\" does not compile: {errors[0].message}"
    elif need_error:
        problem = need_error
    return replace(base, class_conditions=tuple(class_conds), conditions=tuple(conds), needs=needs, problem=problem)


def claim_plan(ref: str, spec: Mapping[str, Any], classes: Mapping[str, Obj]) -> ClaimPlan:
    """The claim spec (`spec` of a ResourceClaim, `spec.spec` of a template) as the allocator reads it."""
    groups = tuple(RequestGroup(r.name, tuple(request_spec(b, classes) for b in r.alternatives))
                   for r in requests(spec))
    found, problems = constraints(spec)
    return ClaimPlan(ref, groups, tuple(found), tuple(problems))
