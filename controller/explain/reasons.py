"""The sentence for a step that leaves no device, and the fix: naming the device, the claim, the amount."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from controller.checks.ownership import class_targets_tessera
from controller.checks.selectors import compile_selectors
from controller.cluster.inventory import DeviceIndex, InventoryDevice
from controller.cluster.matching import Evaluator, Requirement, match
from controller.cluster.taints import TaintRule, fmt_taint, rule_of
from controller.explain.funnel import Drop, Funnel
from controller.explain.requests import RequestSpec
from controller.explain.state import Holder
from driver import DRIVER_NAME
from driver.quantity import format_bytes

Obj = dict[str, Any]
MAX_NAMED = 3


@dataclass(frozen=True)
class Verdict:
    """Whether a request, claim or pod can be allocated now, and if not: the step, why, and the fix."""

    ok: bool
    step: str = ""
    reason: str = ""
    fix: str = ""
    devices: tuple[str, ...] = ()  # node/device refs the reason names
    claims: tuple[str, ...] = ()
    pods: tuple[str, ...] = ()
    nodes: tuple[str, ...] = field(default=())  # where it can be allocated (ok) or was tried


def is_share(holder: Holder, device: InventoryDevice) -> bool:
    """Part of the card's memory, not all of it (a whole-GPU claim on a shareable card also has a shareID)."""
    return device.memory is not None and holder.booking.memory(device.memory) < device.memory


def _holders_text(holders: Sequence[Holder]) -> str:
    return " and ".join(h.describe() for h in holders) or "no claim"


def _named(drops: Sequence[Drop], describe: Any) -> str:
    shown = [describe(d) for d in drops[:MAX_NAMED]]
    more = f" (and {len(drops) - MAX_NAMED} more)" if len(drops) > MAX_NAMED else ""
    return "; ".join(shown) + more


def _refs(drops: Sequence[Drop]) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    devices = tuple(d.device.ref for d in drops)
    holders = [h for d in drops for h in d.holders]
    holders += [h for d in drops for c in d.counters for _, h in c.held_by]
    claims = tuple(dict.fromkeys(h.claim for h in holders))
    pods = tuple(dict.fromkeys(p for h in holders for p in h.pods))
    return devices, claims, pods


def _freeing(holders: Sequence[Holder]) -> str:
    """`delete pod ns/p` (or the claim when no pod reserves it)."""
    for h in holders:
        if h.pods:
            return f"delete pod {h.pods[0]}"
    return f"delete claim {holders[0].claim}" if holders else "free it"


def funnel_verdict(f: Funnel, classes: Mapping[str, Obj], evaluator: Evaluator, all_devices: DeviceIndex,
                   scope_why: str, *, rules: Sequence[TaintRule] = ()) -> Verdict:
    """Why the request gets no device, from the first empty step of its funnel."""
    if f.runtime_errors:
        e = f.runtime_errors[0]
        return Verdict(False, "runtime-error",
                       f"selector `{e.condition.expression}` ({e.condition.owner}) fails at runtime on "
                       f'{e.device.describe()}: "{e.message}"; the scheduler gives up on the whole pod at such '
                       "an error",
                       "guard the read (test the attribute with `in` or use `.?name.orValue(...)`, see "
                       "docs/attributes.md) or fix the comparison", devices=(e.device.ref,))
    step = f.empty_step
    if step is None:
        return Verdict(True)
    previous = f.steps[f.steps.index(step) - 1] if step.name != "driver" else None
    handler = _HANDLERS[step.name]
    return handler(f, step.dropped, previous.count if previous else 0,
                   _Context(classes, evaluator, all_devices, scope_why, tuple(rules)))


@dataclass(frozen=True)
class _Context:
    classes: Mapping[str, Obj]
    evaluator: Evaluator
    all_devices: DeviceIndex
    scope_why: str
    rules: tuple[TaintRule, ...] = ()


def _driver(f: Funnel, drops: Sequence[Drop], before: int, ctx: _Context) -> Verdict:
    nodes = ctx.all_devices.nodes
    if not ctx.all_devices.devices:
        return Verdict(False, "driver", "no tessera device is published in the cluster (no ResourceSlice of "
                       "gpu.tessera.dev)", "check that the tessera kubelet plugin runs on the GPU nodes: kubectl get "
                       "resourceslices --field-selector spec.driver=gpu.tessera.dev")
    if f.skipped_pools and set(f.skipped_pools) >= set(d.pool for d in ctx.all_devices.devices):
        return Verdict(False, "driver", f"every tessera pool is being republished ({', '.join(f.skipped_pools)}); "
                       "the scheduler uses a pool only when all its slices are there", "wait a few seconds and retry")
    return Verdict(False, "driver", f"the pod may only run where {ctx.scope_why} allows, and no such node has "
                   f"tessera devices (tessera's nodes: {', '.join(nodes)})",
                   f"change the pod's node selection to one of {', '.join(nodes)}", nodes=nodes)


def _class(f: Funnel, drops: Sequence[Drop], before: int, ctx: _Context) -> Verdict:
    spec = f.request
    miss = f.class_match.nearest_miss if f.class_match else None
    detail = f"; {miss.describe()}" if miss else ""
    others = _matching_classes(spec, drops, ctx)
    fix = (f"use a class that matches devices here: {others}, or change the selector of DeviceClass "
           f'"{spec.class_name}"') if others else f'change the selector of DeviceClass "{spec.class_name}"'
    return Verdict(False, "class", f'DeviceClass "{spec.class_name}" matches none of the {before} tessera devices'
                   f"{_where(ctx)}{detail}", fix, devices=(miss.device.ref,) if miss else ())


def _where(ctx: _Context) -> str:
    return f" the pod may use ({ctx.scope_why})" if ctx.scope_why else ""


def _matching_classes(spec: RequestSpec, drops: Sequence[Drop], ctx: _Context) -> str:
    scope = DeviceIndex(tuple(d.device for d in drops))
    found = []
    for name, obj in sorted(ctx.classes.items()):
        if name == spec.class_name or not class_targets_tessera(dict(obj)):
            continue
        errors, conds = compile_selectors((obj.get("spec") or {}).get("selectors"), "spec.selectors",
                                          f'DeviceClass "{name}"')
        if errors:
            continue
        result = match(Requirement(tuple(conds)), scope, ctx.evaluator)
        if result.total:
            found.append(f"{name} ({result.total})")
    return ", ".join(found[:MAX_NAMED])


def _selectors(f: Funnel, drops: Sequence[Drop], before: int, ctx: _Context) -> Verdict:
    spec = f.request
    miss = f.request_match.nearest_miss if f.request_match else None
    detail = f"; {miss.describe()}" if miss else ""
    fix = f'relax the selectors of request "{spec.ref}"'
    if miss is not None:
        values = _read_values(spec, miss.device)
        if values:
            fix += f": {miss.device.ref} has {values}"
    return Verdict(False, "selectors", f'the selectors of request "{spec.ref}" rule out all {before} devices of '
                   f'DeviceClass "{spec.class_name}"{detail}', fix, devices=(miss.device.ref,) if miss else ())


def _read_values(spec: RequestSpec, device: InventoryDevice) -> str:
    """What the device has for the attributes the request's selectors read."""
    out = []
    for condition in spec.conditions:
        for read in condition.selector.reads:
            if read.kind != "attribute" or read.name == "*":
                continue
            value = device.attribute(read.domain, read.name)
            if value is not None:
                shown = next((repr(v) if isinstance(v, str) else str(v) for v in value.values()), "")
                text = f"{read.name}={shown}"
                if text not in out:
                    out.append(text)
    return ", ".join(out[:4])


def _capacity(f: Funnel, drops: Sequence[Drop], before: int, ctx: _Context) -> Verdict:
    spec = f.request
    ask = ", ".join(f"{n.text} of {n.key}" for n in spec.needs) or "a whole device"
    devices = tuple(d.device.ref for d in drops)
    missing = [d for d in drops if d.miss is not None and d.miss.kind == "missing"]
    if missing and len(missing) == len(drops):
        key = missing[0].miss.key if missing[0].miss else ""
        bare = key.rsplit("/", 1)[-1]
        return Verdict(False, "capacity", f"none of the {before} devices has a capacity named {key!r}; the scheduler "
                       "compares capacity keys literally", f"write capacity.requests.{bare} (tessera publishes "
                       f'"{bare}" without a domain)', devices=devices[:MAX_NAMED])
    live = [d for d in drops if d.miss is not None and d.miss.kind == "in-use"]
    if live:
        best = max(live, key=lambda d: d.miss.free if d.miss and d.miss.free is not None else Fraction(-1))
        free = best.miss.free if best.miss and best.miss.free is not None else Fraction(0)
        return Verdict(False, "capacity", f"no card has {ask} free: the largest free amount is {format_bytes(free)}, "
                       f"on {best.device.ref} (the rest is held by {_holders_text(best.holders)})",
                       f"ask for {format_bytes(free)} or less, or {_freeing(best.holders)} to free memory on "
                       f"{best.device.ref}", (best.device.ref,), tuple(dict.fromkeys(h.claim for h in best.holders)),
                       tuple(dict.fromkeys(p for h in best.holders for p in h.pods)))
    largest = max(drops, key=lambda d: d.device.memory or 0)
    reason = f"no device can hold {ask}: {largest.device.ref}, the largest, {_clause(largest.why)}"
    fix = f"ask for at most {format_bytes(Fraction(largest.device.memory))}" if largest.device.memory else \
        "ask for less"
    return Verdict(False, "capacity", reason, fix, (largest.device.ref,))


def _clause(why: str) -> str:
    """`it has 40Gi ...` -> `has 40Gi ...`, to follow a device name."""
    return why[3:] if why.startswith("it ") else why


def _allocation(f: Funnel, drops: Sequence[Drop], before: int, ctx: _Context) -> Verdict:
    devices, claims, pods = _refs(drops)
    held = _named(drops, lambda d: f"{d.device.ref} by {_holders_text(d.holders)}")
    reason = (f"all {before} devices that fit are held by other claims: {held}" if before != 1 else
              f"the one device that fits is held by another claim: {held}")
    fix = f"{_freeing(drops[0].holders)} to free {drops[0].device.ref}"
    if not f.request.needs:
        shared = [d for d in drops if d.holders and all(is_share(h, d.device) for h in d.holders)]
        if shared:
            fix += (f"; a whole GPU needs a card nobody shares: {shared[0].device.ref} is shared, so a memory share "
                    "(capacity.requests.memory) may still fit there")
    return Verdict(False, "allocation", reason, fix, devices, claims, pods)


def _taints(f: Funnel, drops: Sequence[Drop], before: int, ctx: _Context) -> Verdict:
    taint = drops[0].taint or {}
    def has(d: Drop) -> str:
        rule = rule_of(ctx.rules, d.device, d.taint or {})
        source = f" (from DeviceTaintRule {rule.name})" if rule else ""
        return f"{d.device.ref} has {fmt_taint(d.taint or {})}{source}"

    named = _named(drops, has)
    toleration = {"key": taint.get("key"), "operator": "Equal" if taint.get("value") else "Exists"}
    if taint.get("value"):
        toleration["value"] = f'"{taint["value"]}"'
    toleration["effect"] = taint.get("effect")
    shown = ", ".join(f"{k}: {v}" for k, v in toleration.items())
    fix = f'add the toleration {{{shown}}} to request "{f.request.ref}", or ask the admin to remove the taint'
    rule = rule_of(ctx.rules, drops[0].device, taint)
    if rule is not None:
        fix = (f'add the toleration {{{shown}}} to request "{f.request.ref}", or ask the admin to delete or narrow '
               f"DeviceTaintRule {rule.name} (kubectl get devicetaintrules)")
    elif str(taint.get("key", "")).startswith(f"{DRIVER_NAME}/"):
        # tessera's own health taints: the GPU is sick, tolerating it is for diagnostics only
        fix = (f"tessera marked the GPU unhealthy ({fmt_taint(taint)}; docs/health.md): wait until it is reset or "
               f'repaired, or, for a diagnostics job only, add the toleration {{{shown}}} to request "{f.request.ref}"')
    return Verdict(False, "taints", f"every remaining device carries a taint request \"{f.request.ref}\" does not "
                   f"tolerate: {named}", fix, tuple(d.device.ref for d in drops))


def _counters(f: Funnel, drops: Sequence[Drop], before: int, ctx: _Context) -> Verdict:
    devices, claims, pods = _refs(drops)
    first = drops[0]
    short = first.counters[0] if first.counters else None
    holders: list[Holder] = []
    holder_text = ""
    if short is not None and short.held_by:
        holder_device, holder = short.held_by[0]
        holders = [h for _, h in short.held_by]
        holder_text = f", held by {holder_device.ref} of {holder.describe()}"
    counter = "its counters"
    if short is not None:
        names = [c.counter for c in first.counters]
        listed = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        counter = (f"{listed} of {short.counter_set} ({short.counter}: {format_bytes(short.needed)} needed, "
                   f"{format_bytes(max(short.available, Fraction(0)))} left)")
    reason = (f"the {before} remaining devices need shared counters (MIG memory and compute slices) that are in use: "
              f"{first.device.ref} needs {counter}{holder_text}")
    fix = f"{_freeing(holders)} to free the slices" if holders else "free the MIG slices"
    fix += ", or ask for a profile that fits in what is left"
    return Verdict(False, "counters", reason, fix, devices, claims, pods)


_HANDLERS = {"driver": _driver, "class": _class, "selectors": _selectors, "capacity": _capacity,
             "allocation": _allocation, "taints": _taints, "counters": _counters}


def problem_verdict(spec: RequestSpec, classes: Mapping[str, Obj]) -> Verdict:
    """A request that cannot be matched at all: its class is missing or a selector does not compile."""
    if spec.problem.startswith("DeviceClass") and spec.class_name not in classes:
        ours = [n for n, c in classes.items() if class_targets_tessera(dict(c))]
        near = difflib.get_close_matches(spec.class_name, ours, n=1, cutoff=0.6)
        fix = f'did you mean "{near[0]}"? ' if near else ""
        return Verdict(False, "class", f'request "{spec.ref}" names DeviceClass "{spec.class_name}", which does not '
                       "exist", f"{fix}tessera's classes: {', '.join(sorted(ours)) or 'none installed'}")
    return Verdict(False, "class" if spec.problem.startswith("DeviceClass") else "selectors", spec.problem,
                   "fix the expression; `tessera check` shows the error with its position")
