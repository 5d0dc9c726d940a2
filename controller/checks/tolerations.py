"""Warnings for device tolerations that let a claim onto GPUs tessera marked unhealthy (docs/health.md).

Tolerating one health taint on purpose is how a diagnostics job reaches a sick GPU. What the user rarely
means is a toleration broader than that: one without a key (every taint, `gpu-lost` included), or one
for `gpu.tessera.dev/gpu-lost` itself (the GPU has fallen off the bus; nothing can run there). With an
inventory, the warning also names the tainted devices the toleration admits today.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from controller.checks.findings import Finding, warning
from controller.checks.inputs import CheckContext
from controller.cluster.taints import fmt_taint, untolerated_taint
from driver import DRIVER_NAME

HEALTH_PREFIX = f"{DRIVER_NAME}/"
GPU_LOST = f"{HEALTH_PREFIX}gpu-lost"
_SHOWN = 3


def _admitted(tolerations: Sequence[Mapping[str, Any]], ctx: CheckContext) -> list[str]:
    """Devices in the inventory with a tessera health taint that these tolerations let through."""
    if ctx.inventory is None:
        return []
    out = []
    for device in ctx.inventory.devices:
        health = [t for t in device.spec.get("taints") or [] if isinstance(t, Mapping)
                  and str(t.get("key", "")).startswith(HEALTH_PREFIX)
                  and t.get("effect") in ("NoSchedule", "NoExecute")]
        if health and untolerated_taint(device, tolerations) is None:
            out.append(f"{device.ref} ({', '.join(fmt_taint(t) for t in health)})")
    return out


def toleration_findings(body: Mapping[str, Any], path: str, ctx: CheckContext) -> list[Finding]:
    """Warnings for the `tolerations` of one tessera request at `path`."""
    raw = body.get("tolerations")
    if not isinstance(raw, list):
        return []
    tolerations = [t for t in raw if isinstance(t, Mapping)]
    findings: list[Finding] = []
    admitted: list[str] | None = None  # the same for every toleration of the request: one inventory walk
    for i, tol in enumerate(raw):
        if not isinstance(tol, Mapping):
            continue
        key = tol.get("key") or ""
        effect = tol.get("effect") or "every effect"
        why = ""
        if not key and (tol.get("operator") or "Equal") == "Exists":
            why = (f"tolerates every device taint ({effect}), including {GPU_LOST}: this claim can be allocated a "
                   "GPU that has fallen off the bus or has uncorrectable ECC errors")
        elif key == GPU_LOST:
            why = f"tolerates {GPU_LOST}: this claim can be allocated a GPU that has fallen off the bus"
        if not why:
            continue
        if admitted is None:
            admitted = _admitted(tolerations, ctx)
        if admitted:
            more = f" and {len(admitted) - _SHOWN} more" if len(admitted) > _SHOWN else ""
            why += f"; tainted devices it admits today: {', '.join(admitted[:_SHOWN])}{more}"
        findings.append(warning(f"{path}.tolerations[{i}]",
                                f"{why}; name the taint keys a diagnostics job needs instead (docs/health.md)"))
    return findings
