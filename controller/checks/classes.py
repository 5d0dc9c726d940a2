"""Checks on a DeviceClass that targets tessera."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.checks.configs import decode_configs
from controller.checks.findings import Finding, error, has_errors, warning
from controller.checks.inputs import CheckContext
from controller.checks.ownership import class_targets_tessera
from controller.checks.selectors import (
    compile_selectors,
    guard_findings,
    no_match_finding,
    runtime_findings,
    schema_findings,
    skipped_finding,
)
from controller.cluster.matching import Condition, EvaluationSkipped, MatchResult, Requirement, match
from driver.cel.environment import STORED, CelEnvironment

Obj = dict[str, Any]


@dataclass(frozen=True)
class ClassReport:
    name: str
    targets_tessera: bool
    findings: tuple[Finding, ...] = ()
    match: MatchResult | None = None  # None when there is no inventory to match against


def class_conditions(obj: Obj, environment: CelEnvironment = STORED) -> tuple[list[Finding], list[Condition]]:
    """The class's selectors compiled in `environment` (stored: a class in the cluster), labelled with its name."""
    name = str((obj.get("metadata") or {}).get("name", ""))
    spec = obj.get("spec") or {}
    if not isinstance(spec, dict):
        return [error("spec", f"must be an object, got {type(spec).__name__}")], []
    return compile_selectors(spec.get("selectors"), "spec.selectors", f'DeviceClass "{name}"', environment)


def _created(obj: Obj) -> str:
    # RFC 3339 in UTC with second precision sorts as a string. A class without one is being created
    # now (an offline check of a file): it is the newest.
    stamp = (obj.get("metadata") or {}).get("creationTimestamp")
    return stamp if isinstance(stamp, str) and stamp else "9999-12-31T23:59:59Z"


def scheduler_pick(classes: list[Obj]) -> Obj:
    """The class kube-scheduler 1.36 maps a shared extended resource name to (its extended resource
    cache): the one created last; among classes created in the same second, the name that sorts first."""
    newest = max(_created(c) for c in classes)
    return min((c for c in classes if _created(c) == newest), key=lambda c: str(c["metadata"]["name"]))


def extended_resource_findings(obj: Obj, ctx: CheckContext) -> list[Finding]:
    """A warning when other classes already answer this class's spec.extendedResourceName: the
    scheduler uses only one of them, silently, so pods may get devices from a class nobody meant."""
    resource = (obj.get("spec") or {}).get("extendedResourceName")
    if not isinstance(resource, str) or not resource:
        return []
    name = str((obj.get("metadata") or {}).get("name", ""))
    ours = class_targets_tessera(obj)
    others = [
        c for other, c in sorted(ctx.classes.items())
        if other != name and isinstance(c, dict) and (c.get("spec") or {}).get("extendedResourceName") == resource
        and (ours or class_targets_tessera(c))
    ]
    if not others:
        return []
    winner = str(scheduler_pick([obj, *others])["metadata"]["name"])
    listed = ", ".join(f'"{(c.get("metadata") or {}).get("name")}"' for c in others)
    plural = "es" if len(others) > 1 else ""
    return [warning(
        "spec.extendedResourceName",
        f'DeviceClass{plural} {listed} already answer{"" if plural else "s"} the extended resource "{resource}"; '
        f'the scheduler satisfies it from one class only, the one created last (same second: the name that '
        f'sorts first), so pods asking for "{resource}" get devices from "{winner}". Give each class its own '
        f"name, or delete the class you are replacing (see docs/operations.md, extended resources)",
    )]


def check_device_class(obj: Obj, ctx: CheckContext) -> ClassReport:
    """Every rule for a DeviceClass. Classes that do not target tessera only hear about an extended
    resource name they share with one of tessera's classes."""
    name = str((obj.get("metadata") or {}).get("name", ""))
    if not class_targets_tessera(obj):
        return ClassReport(name, False, tuple(extended_resource_findings(obj, ctx)))
    spec = obj.get("spec") or {}
    findings, conditions = class_conditions(obj, ctx.cel_environment)
    if not isinstance(spec, dict):
        return ClassReport(name, True, tuple(findings))
    used_by = f'DeviceClass "{name}"'
    for condition in conditions:
        findings.extend(schema_findings(condition, ctx))
    findings.extend(guard_findings(conditions, 0, ctx, used_by))
    config_errors, _ = decode_configs(spec.get("config"), "spec.config", in_class=True)
    findings.extend(config_errors)
    findings.extend(extended_resource_findings(obj, ctx))

    result = None
    if ctx.inventory is not None and not has_errors(findings):
        try:
            result = match(Requirement(tuple(conditions)), ctx.inventory, ctx.evaluator)
        except EvaluationSkipped as skip:
            findings.append(skipped_finding(skip))
        else:
            findings.extend(runtime_findings(result, {f.path for f in findings}, used_by))
            if result.total == 0 and ctx.inventory.devices and not result.failures:
                findings.append(no_match_finding("spec.selectors", used_by, result, ctx.inventory.incomplete_pools))
    # a skipped selector is reported once, however many checks needed it
    return ClassReport(name, True, tuple(dict.fromkeys(findings)), result)
