"""A ResourceClaimSpec walked in one place: where it sits in a claim or template, its requests with their
bodies (an `exactly`, or each `firstAvailable` subrequest), the names a constraint or config may use,
and its constraints. The admission checks, the multi-card rewrite and `tessera explain` all read claims
through this module, so they agree on what a request asks for.

Shapes the apiserver would refuse are read leniently here (a non-list is empty, a non-integer count is
1); the checks report them where they check that field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from driver.names import base_request, subrequest

Obj = dict[str, Any]
CLAIM_KINDS = ("ResourceClaim", "ResourceClaimTemplate")


def claim_spec(obj: Mapping[str, Any], kind: str) -> tuple[Any, str]:
    """The ResourceClaimSpec of a ResourceClaim (`spec`) or a ResourceClaimTemplate (`spec.spec`), with its
    field path; the spec is whatever is there (None or another shape when the object is malformed)."""
    spec = obj.get("spec")
    if kind == "ResourceClaimTemplate":
        return (spec.get("spec") if isinstance(spec, Mapping) else None), "spec.spec"
    return spec, "spec"


def as_list(value: Any) -> list[Any]:
    """A list field as a list; any other shape is reported where it is checked and read as empty here."""
    return value if isinstance(value, list) else []


@dataclass(frozen=True)
class RequestBody:
    """What one request asks for: its `exactly`, or one subrequest of its `firstAvailable`."""

    ref: str  # "gpu", or "gpu/full" for a subrequest
    body: Obj  # the request's own dict, not a copy: the multi-card rewrite edits it in place
    path: str  # field path, e.g. spec.devices.requests[0].firstAvailable[1]

    @property
    def base(self) -> str:
        return base_request(self.ref)

    @property
    def sub(self) -> str:
        return subrequest(self.ref)

    @property
    def class_name(self) -> str:
        return str(self.body.get("deviceClassName", ""))

    @property
    def mode(self) -> str:
        return str(self.body.get("allocationMode") or "ExactCount")

    @property
    def count(self) -> int:
        """Devices asked for: `count` (default 1) for ExactCount, 0 for allocationMode All."""
        if self.mode == "All":
            return 0
        count = self.body.get("count", 1)
        return count if isinstance(count, int) else 1

    @property
    def admin_access(self) -> bool:
        return bool(self.body.get("adminAccess"))

    @property
    def tolerations(self) -> tuple[Mapping[str, Any], ...]:
        return tuple(t for t in as_list(self.body.get("tolerations")) if isinstance(t, Mapping))


@dataclass(frozen=True)
class Request:
    """One entry of `devices.requests`."""

    name: str
    path: str
    obj: Obj
    bodies: tuple[RequestBody, ...]  # `exactly` first, then every firstAvailable subrequest

    @property
    def malformed_alternatives(self) -> str:
        """The type of `firstAvailable` when it is there but not a list ("" otherwise)."""
        value = self.obj.get("firstAvailable")
        return "" if value is None or isinstance(value, list) else type(value).__name__

    @property
    def alternatives(self) -> tuple[RequestBody, ...]:
        """What the allocator tries: `exactly` when there is one, else the subrequests in order."""
        exact = [b for b in self.bodies if "/" not in b.ref]
        return tuple(exact) if exact else self.bodies


def _bodies(request: Obj, name: str, path: str) -> tuple[RequestBody, ...]:
    bodies: list[RequestBody] = []
    if isinstance(request.get("exactly"), dict):
        bodies.append(RequestBody(name, request["exactly"], f"{path}.exactly"))
    bodies.extend(
        RequestBody(f"{name}/{sub.get('name', '')}", sub, f"{path}.firstAvailable[{j}]")
        for j, sub in enumerate(as_list(request.get("firstAvailable")))
        if isinstance(sub, dict)
    )
    return tuple(bodies)


def _devices(spec: Any) -> Mapping[str, Any]:
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    return devices if isinstance(devices, Mapping) else {}


def requests(spec: Any, path: str = "spec") -> list[Request]:
    """The requests of the claim spec at `path`; entries that are not objects are skipped."""
    out = []
    for i, request in enumerate(as_list(_devices(spec).get("requests"))):
        if not isinstance(request, dict):
            continue
        name = str(request.get("name", ""))
        rpath = f"{path}.devices.requests[{i}]"
        out.append(Request(name, rpath, request, _bodies(request, name, rpath)))
    return out


def request_names(spec: Any) -> list[str]:
    """Every name a constraint or config may use: `req`, and `req/sub` for firstAvailable entries."""
    names: list[str] = []
    for request in requests(spec):
        names.append(request.name)
        names.extend(b.ref for b in request.bodies if "/" in b.ref)
    return names


def request_path(spec: Any, path: str, ref: str) -> str:
    """The field path of request (or subrequest) `ref`; the requests list when there is no such request."""
    for request in requests(spec, path):
        for body in request.bodies:
            if body.ref == ref:
                return request.path if "/" not in ref else body.path
    return f"{path}.devices.requests"


@dataclass(frozen=True)
class Constraint:
    """One of `devices.constraints`: the requests it covers and the attribute they must share or not."""

    requests: tuple[str, ...]  # empty: every request of the claim
    attribute: str  # fully qualified
    kind: str  # matchAttribute or distinctAttribute

    def applies(self, ref: str) -> bool:
        """Whether it covers request `ref`; naming `req` covers each of its subrequests `req/sub`."""
        if not self.requests:
            return True
        return ref in self.requests or base_request(ref) in self.requests

    def describe(self) -> str:
        scope = f" over {', '.join(self.requests)}" if self.requests else ""
        return f"{self.kind} {self.attribute}{scope}"


def constraints(spec: Any) -> tuple[list[Constraint], list[str]]:
    """The claim's constraints, and what is wrong with those that are neither kind."""
    found: list[Constraint] = []
    problems: list[str] = []
    for i, c in enumerate(as_list(_devices(spec).get("constraints"))):
        if not isinstance(c, Mapping):
            continue
        covered = tuple(str(r) for r in as_list(c.get("requests")))
        if c.get("matchAttribute"):
            found.append(Constraint(covered, str(c["matchAttribute"]), "matchAttribute"))
        elif c.get("distinctAttribute"):
            found.append(Constraint(covered, str(c["distinctAttribute"]), "distinctAttribute"))
        else:
            problems.append(f"constraint {i} has neither matchAttribute nor distinctAttribute")
    return found, problems
