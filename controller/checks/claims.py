"""Checks on a ResourceClaimSpec (of a ResourceClaim, or inside a ResourceClaimTemplate).

Only requests whose DeviceClass targets tessera are checked; opaque configs for tessera's driver are
decoded whatever the request. Each request is matched against the live inventory with its class's
selectors first, exactly as the scheduler filters (class, then request, then capacity).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from controller.checks.capacity import capacity_findings
from controller.checks.claimspec import Request, RequestBody, request_names, requests
from controller.checks.classes import class_conditions
from controller.checks.configs import DecodedConfig, decode_configs, sharing_findings
from controller.checks.findings import Finding, error, warning
from controller.checks.inputs import CheckContext
from controller.checks.multicard import pending_findings
from controller.checks.ownership import class_targets_tessera
from controller.checks.selectors import (
    compile_selectors,
    guard_findings,
    no_match_finding,
    runtime_findings,
    schema_findings,
    skipped_finding,
)
from controller.checks.tolerations import toleration_findings
from controller.cluster.matching import Condition, EvaluationSkipped, MatchResult, Requirement, match

Obj = dict[str, Any]


@dataclass(frozen=True)
class RequestReport:
    name: str  # "gpus", or "accel/full" for a firstAvailable subrequest
    path: str
    device_class: str
    count: int  # 0 for allocationMode All
    match: MatchResult | None = None


@dataclass(frozen=True)
class ClaimReport:
    findings: tuple[Finding, ...] = ()
    requests: tuple[RequestReport, ...] = ()


def _near_tessera_class(ctx: CheckContext, class_name: str) -> str | None:
    """For a class that does not exist, the closest existing tessera class name (a typo, most likely)."""
    if not ctx.classes_complete or class_name in ctx.classes:
        return None
    ours = [n for n, c in ctx.classes.items() if class_targets_tessera(dict(c)) and n != class_name]
    matches = difflib.get_close_matches(class_name, ours, n=1, cutoff=0.8)
    return matches[0] if matches else None


def explain_hint(target: str = "") -> str:
    """Where a claim is admitted but no device can serve it today: the command that says which step is in the
    way (`target` names the claim, e.g. `resourceclaim/x -n ns`; a pod using it otherwise)."""
    return f"`tessera explain {target or 'pod/<a pod using it>'}` shows which step rules each device out"


def check_claim_spec(spec: Obj, path: str, ctx: CheckContext, *, explain: str = "") -> ClaimReport:
    """All rules for one ResourceClaimSpec at `path` ("spec" for a claim, "spec.spec" for a template).

    `explain` is the `tessera explain` target for the object, named in warnings about requests no device can
    serve today."""
    if not isinstance(spec, dict):
        return ClaimReport((error(path, "must be an object"),))
    devices = spec.get("devices") or {}
    if not isinstance(devices, dict):
        return ClaimReport((error(f"{path}.devices", f"must be an object, got {type(devices).__name__}"),))
    findings: list[Finding] = []
    config_errors, configs = decode_configs(devices.get("config"), f"{path}.devices.config", in_class=False)
    findings.extend(config_errors)
    findings.extend(_unknown_request_refs(configs, request_names(spec), path))
    findings.extend(pending_findings(spec, path, ctx.targets_tessera))

    reports: list[RequestReport] = []
    listed = devices.get("requests") or []
    if not isinstance(listed, list):
        findings.append(error(f"{path}.devices.requests", f"must be a list, got {type(listed).__name__}"))
    for request in requests(spec, path):
        for body in request.bodies:
            if ctx.targets_tessera(body.class_name):
                findings.extend(sharing_findings(configs, body.ref, body.body, body.path,
                                                 ctx.classes.get(body.class_name)))
            report = _check_request(body, ctx, findings, explain=explain)
            if report:
                reports.append(report)
        # after the bodies: when firstAvailable is not a list, `exactly` is the only body
        findings.extend(_alternatives_shape(request))
    # a skipped selector is reported once, however many checks needed it
    return ClaimReport(tuple(dict.fromkeys(findings)), tuple(reports))


def _unknown_request_refs(configs: list[DecodedConfig], known: list[str], path: str) -> list[Finding]:
    """Config entries whose `requests` name a request the claim does not have."""
    return [
        error(
            f"{path}.devices.config[{c.index}].requests[{j}]",
            f'"{ref}" names no request of this claim; the requests are: {", ".join(known) or "none"}',
        )
        for c in configs
        for j, ref in enumerate(c.requests)
        if ref not in known
    ]


def _alternatives_shape(request: Request) -> list[Finding]:
    got = request.malformed_alternatives
    return [error(f"{request.path}.firstAvailable", f"must be a list of subrequests, got {got}")] if got else []


def _check_request(request: RequestBody, ctx: CheckContext, findings: list[Finding], *,
                   explain: str = "") -> RequestReport | None:
    body, path, name = request.body, request.path, request.ref
    class_name = request.class_name
    if not ctx.targets_tessera(class_name):
        near = _near_tessera_class(ctx, class_name)
        if near is not None:
            findings.append(
                warning(
                    f"{path}.deviceClassName",
                    f'DeviceClass "{class_name}" does not exist; did you mean "{near}"? Pods using this claim stay '
                    "Pending until the class exists",
                )
            )
        return None
    cls = ctx.classes.get(class_name)
    class_conds: list[Condition] = []
    if cls is not None:
        _, class_conds = class_conditions(dict(cls), ctx.cel_environment.stored_expressions())
    elif ctx.classes_complete:
        near = _near_tessera_class(ctx, class_name)
        suggestion = f'did you mean "{near}"? ' if near else ""
        findings.append(
            warning(
                f"{path}.deviceClassName",
                f'DeviceClass "{class_name}" does not exist; {suggestion}pods using this claim stay Pending until '
                "it is created",
            )
        )
    elif ctx.inventory is not None:
        findings.append(
            warning(
                f"{path}.deviceClassName",
                f'DeviceClass "{class_name}" is not among the checked objects; give its file too (or --kubeconfig) '
                "to count the devices this request matches",
            )
        )
    findings.extend(toleration_findings(body, path, ctx))
    used_by = "this claim"
    before = len(findings)
    compile_errors, request_conds = compile_selectors(body.get("selectors"), f"{path}.selectors", f'request "{name}"',
                                                      ctx.cel_environment)
    findings.extend(compile_errors)
    for condition in request_conds:
        findings.extend(schema_findings(condition, ctx))
    conditions = [*class_conds, *request_conds]
    findings.extend(guard_findings(conditions, len(class_conds), ctx, used_by))
    capacity_errors, needs = capacity_findings(body.get("capacity"), path, ctx)
    findings.extend(capacity_errors)
    count = request.count

    result = None
    own_errors = [f for f in findings[before:] if f.severity == "error"]
    if ctx.inventory is not None and not own_errors and (cls is not None or ctx.classes_complete):
        try:
            result = match(Requirement(tuple(conditions), tuple(needs)), ctx.inventory, ctx.evaluator)
        except EvaluationSkipped as skip:
            findings.append(skipped_finding(skip))
            return RequestReport(name, path, class_name, count, None)
        mine = MatchResult(
            result.per_node,
            result.checked,
            tuple(f for f in result.failures if f.condition.path.startswith(path)),
            result.nearest_miss,
        )
        findings.extend(runtime_findings(mine, set(), used_by))
        best = result.best_node()
        if best is None and ctx.inventory.devices and not mine.failures:
            found = no_match_finding(path, f'request "{name}"', result, ctx.inventory.incomplete_pools)
            findings.append(warning(found.path, f"{found.message}; {explain_hint(explain)}"))
        elif best is not None and count > best[1]:
            findings.append(
                warning(
                    f"{path}.count",
                    f'request "{name}" asks for {count} devices on one node, but no node has more than {best[1]} '
                    f"matching devices ({best[0]}); pods using this claim would stay Pending; "
                    f"{explain_hint(explain)}",
                )
            )
    return RequestReport(name, path, class_name, count, result)
