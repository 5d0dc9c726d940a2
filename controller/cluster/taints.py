"""Device taints against a request's tolerations, by the scheduler's rules (resourceclaim.ToleratesTaint
and the allocator's taintPreventsAllocation): used by the toleration checks and `tessera explain`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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
