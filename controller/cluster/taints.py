"""Device taints against a request's tolerations, by the scheduler's rules (resourceclaim.ToleratesTaint
and the allocator's taintPreventsAllocation): used by the toleration checks and `tessera explain`. Also the
taints DeviceTaintRules add (resource.k8s.io v1alpha3/v1beta2 in 1.36, off by default; v1 from 1.37), which
the scheduler applies to the devices before it allocates."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller.cluster.inventory import InventoryDevice


def untolerated_taint(device: InventoryDevice, tolerations: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """taintPreventsAllocation: the first NoSchedule/NoExecute taint no toleration tolerates (None effects and
    unknown effects do not prevent allocation)."""
    tolerations = list(tolerations)
    for taint in device.spec.get("taints") or ():
        if not isinstance(taint, Mapping) or taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """resourceclaim.ToleratesTaint."""
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    if toleration.get("key") and toleration.get("key") != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Equal":
        return str(toleration.get("value") or "") == str(taint.get("value") or "")
    return operator == "Exists"


def fmt_taint(taint: Mapping[str, Any]) -> str:
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint.get('key')}{value}:{taint.get('effect')}"


@dataclass(frozen=True)
class TaintRule:
    """A DeviceTaintRule: one taint on every device its selector picks (driver, pool and device name, each
    optional; an empty selector picks every device, a missing one none)."""

    name: str
    taint: Mapping[str, Any]
    selector: Mapping[str, Any] | None

    def selects(self, driver: str, pool: str, device: str) -> bool:
        if self.selector is None:
            return False
        wanted = {"driver": driver, "pool": pool, "device": device}
        return all(not self.selector.get(k) or self.selector.get(k) == v for k, v in wanted.items())


def taint_rules(objects: Iterable[Mapping[str, Any]]) -> list[TaintRule]:
    """DeviceTaintRule objects (any served version: the fields tessera reads are the same) as rules."""
    rules = []
    for obj in objects:
        spec = obj.get("spec")
        spec = spec if isinstance(spec, Mapping) else {}
        taint, selector = spec.get("taint"), spec.get("deviceSelector")
        if isinstance(taint, Mapping) and taint.get("key"):
            rules.append(TaintRule(str((obj.get("metadata") or {}).get("name", "")), dict(taint),
                                   selector if isinstance(selector, Mapping) else None))
    return rules


def with_rule_taints(slices: Iterable[dict[str, Any]], rules: list[TaintRule]) -> list[dict[str, Any]]:
    """The slices with each device carrying the taints DeviceTaintRules give it, as the scheduler sees them
    (it applies the rules before allocating). Slices and devices no rule touches are the same objects."""
    if not rules:
        return list(slices)
    out: list[dict[str, Any]] = []
    for s in slices:
        spec = s.get("spec") or {}
        pool = str((spec.get("pool") or {}).get("name", ""))
        devices = [_tainted(d, str(spec.get("driver", "")), pool, rules) for d in spec.get("devices") or ()]
        changed = any(a is not b for a, b in zip(devices, spec.get("devices") or (), strict=True))
        out.append({**s, "spec": {**spec, "devices": devices}} if changed else s)
    return out


def _tainted(device: Any, driver: str, pool: str, rules: list[TaintRule]) -> Any:
    if not isinstance(device, Mapping):
        return device
    added = [dict(r.taint) for r in rules if r.selects(driver, pool, str(device.get("name", "")))]
    return {**device, "taints": [*(device.get("taints") or ()), *added]} if added else device


def rule_of(rules: Iterable[TaintRule], device: InventoryDevice, taint: Mapping[str, Any]) -> TaintRule | None:
    """The DeviceTaintRule that put `taint` on `device` (None: the taint is in the ResourceSlice itself)."""
    return next((r for r in rules
                 if r.selects(device.driver, device.pool, device.name) and dict(r.taint) == dict(taint)), None)
