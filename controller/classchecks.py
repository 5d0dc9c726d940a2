"""Checks on a DeviceClass that targets tessera."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.configchecks import decode_configs
from controller.context import CheckContext, class_targets_tessera
from controller.findings import Finding, error, has_errors
from controller.matching import Condition, EvaluationSkipped, MatchResult, Requirement, match
from controller.selectors import (
    compile_selectors,
    guard_findings,
    no_match_finding,
    runtime_findings,
    schema_findings,
    skipped_finding,
)

Obj = dict[str, Any]


@dataclass(frozen=True)
class ClassReport:
    name: str
    targets_tessera: bool
    findings: tuple[Finding, ...] = ()
    match: MatchResult | None = None  # None when there is no inventory to match against


def class_conditions(obj: Obj) -> tuple[list[Finding], list[Condition]]:
    """The class's selectors compiled, labelled with the class name."""
    name = str((obj.get("metadata") or {}).get("name", ""))
    spec = obj.get("spec") or {}
    if not isinstance(spec, dict):
        return [error("spec", f"must be an object, got {type(spec).__name__}")], []
    return compile_selectors(spec.get("selectors"), "spec.selectors", f'DeviceClass "{name}"')


def check_device_class(obj: Obj, ctx: CheckContext) -> ClassReport:
    """Every rule for a DeviceClass; classes that do not target tessera get no findings."""
    name = str((obj.get("metadata") or {}).get("name", ""))
    if not class_targets_tessera(obj):
        return ClassReport(name, False)
    spec = obj.get("spec") or {}
    findings, conditions = class_conditions(obj)
    if not isinstance(spec, dict):
        return ClassReport(name, True, tuple(findings))
    used_by = f'DeviceClass "{name}"'
    for condition in conditions:
        findings.extend(schema_findings(condition, ctx))
    findings.extend(guard_findings(conditions, 0, ctx, used_by))
    config_errors, _ = decode_configs(spec.get("config"), "spec.config", in_class=True)
    findings.extend(config_errors)

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
