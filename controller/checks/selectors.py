"""Checks on CEL device selectors that do not depend on which object holds them: they compile, they
name only attributes tessera publishes, and they never read a type-specific attribute unguarded.

Why the guard rule matters (KEP-4381; the DynamicResources Filter in kubernetes
pkg/scheduler/framework/plugins/dynamicresources): a missing key is a runtime error, not `false`, and one
runtime error in a selector makes the scheduler abort the whole pod, on every node, for every pod that
uses the class. A read the static analysis flags as unguarded is only reported when it really fails
on a device of a type that lacks the attribute (live devices first, then tessera's sample devices),
so a selector that restricts `type` before the read (the idiom docs/attributes.md teaches) passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from controller.checks.findings import DOCS_ATTRIBUTES, Finding, error, warning
from controller.checks.inputs import CheckContext
from controller.cluster.devicegroups import shapes
from controller.cluster.inventory import InventoryDevice
from controller.cluster.matching import Condition, EvaluationSkipped, MatchResult
from driver import DRIVER_NAME
from driver.cel.environment import STORED, CelEnvironment

_ORVALUE_DEFAULT = {"string": '""', "int": "0", "bool": "false", "version": 'semver("0.0.0")'}


def compile_selectors(selectors: Any, path: str, owner: str,
                      environment: CelEnvironment = STORED) -> tuple[list[Finding], list[Condition]]:
    """Compile `selectors` (the `selectors` list of a class or request at `path`) in `environment`
    (stored by default: selectors already in the cluster; the admission checks pass new ones).

    Returns the findings and a Condition per selector that compiled, in order.
    """
    from driver.cel import CelCompileError, compile_selector

    findings: list[Finding] = []
    conditions: list[Condition] = []
    if selectors is None:
        return findings, conditions
    if not isinstance(selectors, list):
        return [error(path, "must be a list of {cel: {expression: ...}} entries")], conditions
    for i, selector in enumerate(selectors):
        here = f"{path}[{i}].cel.expression"
        cel = selector.get("cel") if isinstance(selector, dict) else None
        expression = cel.get("expression") if isinstance(cel, dict) else None
        if not isinstance(expression, str) or not expression.strip():
            findings.append(error(here, "must be a non-empty CEL expression (selectors: [{cel: {expression: ...}}])"))
            continue
        try:
            compiled = compile_selector(expression, environment=environment)
        except CelCompileError as exc:
            # str(exc) is "compilation failed at column N: message" plus the expression with a caret
            findings.append(error(here, str(exc)))
            continue
        conditions.append(Condition(f"{owner} selector {i}", here, expression, compiled))
    return findings, conditions


def schema_findings(condition: Condition, ctx: CheckContext) -> list[Finding]:
    """Attributes and capacities the selector reads that tessera never publishes, with the nearest name."""
    schema = ctx.schema
    findings: list[Finding] = []
    seen: set[tuple[str, str, str]] = set()
    for read in condition.selector.reads:
        key = (read.kind, read.domain, read.name)
        if read.name == "*" or read.domain == "*" or key in seen:
            continue
        seen.add(key)
        where = f'device.{"attributes" if read.kind == "attribute" else "capacity"}["{read.domain}"]'
        if read.domain not in schema.domains and read.domain != DRIVER_NAME:
            hint = schema.suggest_domain(read.domain)
            if hint is not None:
                findings.append(
                    error(
                        condition.path,
                        f'{where}.{read.name} (column {read.column}): tessera publishes no domain "{read.domain}"; '
                        f'did you mean "{hint}"? An unknown domain reads as an empty map, so this read fails '
                        "at runtime on every device",
                    )
                )
            continue
        if read.kind == "capacity":
            if read.domain == DRIVER_NAME and read.name not in schema.capacities:
                hint = schema.suggest_capacity(read.name)
                findings.append(error(condition.path, _unknown(where, read.name, read.column, hint, "capacity")))
            continue
        if schema.knows(read.domain, read.name):
            continue
        elsewhere = [d for d in sorted(schema.domains) if d != read.domain and schema.knows(d, read.name)]
        if elsewhere:
            findings.append(
                error(
                    condition.path,
                    f'{where}.{read.name} (column {read.column}): tessera publishes "{read.name}" in domain '
                    f'"{elsewhere[0]}", not "{read.domain}"; write device.attributes["{elsewhere[0]}"].{read.name}',
                )
            )
            continue
        hint = schema.suggest_attribute(read.domain, read.name)
        findings.append(error(condition.path, _unknown(where, read.name, read.column, hint, "attribute")))
    return findings


def _unknown(where: str, name: str, column: int, hint: str | None, what: str) -> str:
    suggestion = f'did you mean "{hint}"? ' if hint else ""
    return (
        f"{where}.{name} (column {column}): tessera never publishes the {what} \"{name}\", so this read "
        f"fails at runtime; {suggestion}see {DOCS_ATTRIBUTES} for the published names"
    )


def guard_findings(conditions: Sequence[Condition], first: int, ctx: CheckContext, used_by: str) -> list[Finding]:
    """Unguarded reads of type-specific attributes in conditions[first:] that fail on a device lacking them.

    conditions[:first] (the class's selectors when checking a request) are evaluated first, exactly as the
    scheduler does, so a class that already restricts the type protects the request's selectors.
    """
    schema = ctx.schema
    findings: list[Finding] = []
    for i in range(first, len(conditions)):
        condition = conditions[i]
        findings.extend(_when_known_warnings(condition, ctx, used_by))
        risky = [
            r
            for r in condition.selector.reads
            if r.kind == "attribute" and not r.guarded and r.name != "*" and schema.lacking(r.domain, r.name)
        ]
        if not risky:
            continue
        lacking = {t for r in risky for t in schema.lacking(r.domain, r.name)}
        try:
            for device in _samples(ctx, conditions[: i + 1], lacking):
                if not _reaches(conditions[:i], device, ctx):
                    continue
                outcome = ctx.evaluator.outcome(condition, device)
                missing = [r for r in risky if device.attribute(r.domain, r.name) is None]
                if isinstance(outcome, str) and missing:
                    findings.append(error(condition.path,
                                          _unguarded_message(missing[0], device, outcome, ctx, used_by)))
                    break
        except EvaluationSkipped as skip:
            findings.append(skipped_finding(skip))
    return findings


def _when_known_warnings(condition: Condition, ctx: CheckContext, used_by: str) -> list[Finding]:
    """Unguarded reads of attributes tessera publishes only where their value is known (the standard
    numaNode): fine on the devices that have one, a runtime error on a GPU whose platform reports none.
    Where a live device lacks it, the evaluation against the cluster reports that error instead."""
    out = []
    live = ctx.inventory.devices if ctx.inventory is not None else ()
    for read in condition.selector.reads:
        if read.kind != "attribute" or read.guarded or (read.domain, read.name) not in ctx.schema.when_known:
            continue
        if any(device.attribute(read.domain, read.name) is None for device in live):
            continue
        attrs = f'device.attributes["{read.domain}"]'
        out.append(warning(
            condition.path,
            f'reads "{read.domain}/{read.name}" (column {read.column}) without a guard, but tessera publishes it only '
            f"on GPUs whose platform reports a value: on any other the selector fails at runtime, which aborts "
            f'scheduling of every pod using {used_by}. Guard it ("{read.name}" in {attrs} && ...) or read '
            f"{attrs}.?{read.name}.orValue(-1); {DRIVER_NAME}'s own {read.name} is -1 there"))
    return out


def skipped_finding(skip: EvaluationSkipped) -> Finding:
    """The warning for a selector cel-cpp's iteration budget kept tessera from evaluating."""
    return warning(
        skip.condition.path,
        f"tessera did not evaluate {skip.condition.owner} against devices, so its checks for unguarded reads, runtime "
        f"errors and matching devices were skipped: {skip.message}. The scheduler evaluates it in full; "
        "iterate over fewer or smaller lists to have tessera check it",
    )


def _samples(ctx: CheckContext, conditions: Sequence[Condition], device_types: set[str]) -> list[InventoryDevice]:
    """One device per shape the conditions can tell apart (live devices first, then the samples), of the
    given types."""
    expressions = [(c.expression, c.selector) for c in conditions]
    out: list[InventoryDevice] = []
    for index in (ctx.inventory, ctx.samples):
        if index is not None:
            groups = shapes(index, expressions, extra_reads=[("attribute", DRIVER_NAME, "type")])
            out.extend(s.device for s in groups if s.device.device_type in device_types)
    return out


def _reaches(earlier: Sequence[Condition], device: InventoryDevice, ctx: CheckContext) -> bool:
    return all(ctx.evaluator.outcome(c, device) is True for c in earlier)


def _unguarded_message(read: Any, device: InventoryDevice, outcome: str, ctx: CheckContext, used_by: str) -> str:
    carried = ", ".join(ctx.schema.carried_by(read.domain, read.name))
    kind = ctx.schema.kinds.get((read.domain, read.name), "string")
    attrs = f'device.attributes["{read.domain}"]'
    optional = f"{attrs}.?{read.name}.orValue({_ORVALUE_DEFAULT[kind]})"
    return (
        f'reads "{read.name}" (column {read.column}) without a guard, but only devices of type {carried} carry it: '
        f'on a {device.device_type} device such as {device.ref} the selector fails with "{outcome}", a runtime '
        f"error that aborts scheduling of every pod using {used_by}. Guard the read: "
        f'"{read.name}" in {attrs} && {attrs}.{read.name} ..., or {optional}, '
        f'or test the type first: {attrs}.type == "{carried.split(", ")[0]}" && ...'
    )


def runtime_findings(result: MatchResult, skip_paths: set[str], used_by: str) -> list[Finding]:
    """Selectors that failed at runtime on a live device: the scheduler would abort on them too."""
    findings = []
    for failure in result.failures:
        if failure.condition.path in skip_paths:
            continue
        findings.append(
            error(
                failure.condition.path,
                f'fails at runtime on {failure.device.describe()}: "{failure.message}"; the scheduler aborts '
                f"every pod using {used_by} on such an error. Guard the read or fix the comparison",
            )
        )
    return findings


def no_match_finding(path: str, subject: str, result: MatchResult, incomplete_pools: Sequence[str]) -> Finding:
    """The warning for a class or request that no device in the cluster satisfies."""
    detail = f"; {result.nearest_miss.describe()}" if result.nearest_miss else ""
    updating = f" (pools being republished: {', '.join(incomplete_pools)})" if incomplete_pools else ""
    return warning(
        path,
        f"{subject} matches none of the {result.checked} tessera devices in the cluster{updating}{detail}",
    )
