"""`capacity.requests` of a request: the key spelled exactly as published, an amount tessera can
enforce, and an amount some GPU in the cluster can hold.

The scheduler compares capacity keys literally (KEP-5075, consumable_capacity.go): `gpu.tessera.dev/memory` never
equals the published `memory`, so such a request would match no device and the pod would sit Pending
with no hint why. The MPS memory limit is set in whole MiB, so other amounts are refused rather than
rounded behind the user's back.
"""

from __future__ import annotations

from typing import Any

from controller.checks.findings import Finding, error
from controller.checks.inputs import CheckContext
from controller.cluster.capacityfit import CapacityNeed
from controller.cluster.schema import REQUESTABLE_CAPACITIES, split_qualified
from driver import DRIVER_NAME
from driver.quantity import Quantity, format_bytes

MiB = 1 << 20


def capacity_findings(capacity: Any, path: str, ctx: CheckContext) -> tuple[list[Finding], list[CapacityNeed]]:
    """Check `capacity` (the request's `capacity` field at `path`); returns findings and the valid needs."""
    findings: list[Finding] = []
    needs: list[CapacityNeed] = []
    if capacity is None:
        return findings, needs
    requests = capacity.get("requests") if isinstance(capacity, dict) else None
    if not isinstance(requests, dict):
        return [error(f"{path}.capacity", "must be {requests: {memory: <quantity>}}")], needs
    for key, amount in requests.items():
        here = f"{path}.capacity.requests[{key}]"
        problem = _key_problem(str(key), amount, ctx)
        checked = problem if problem is not None else _amount_problem(amount, ctx)
        if isinstance(checked, str):
            findings.append(error(here, checked))
        else:
            needs.append(CapacityNeed(str(key), checked, str(amount)))
    return findings, needs


def _key_problem(key: str, amount: Any, ctx: CheckContext) -> str | None:
    """Why `key` cannot be requested (None when it is a requestable capacity tessera publishes)."""
    published = ctx.schema.capacities
    domain, name = split_qualified(key)
    if "/" in key:
        if domain == DRIVER_NAME and name in published:
            return (
                f'"{key}" never matches: tessera publishes this capacity under the bare key "{name}" and '
                "the scheduler compares capacity keys literally, so every device would be skipped and the "
                f"pod would stay Pending; write `{name}: {amount}`"
            )
        return f'tessera publishes no capacity "{key}"; the requestable key is "memory"'
    if key in REQUESTABLE_CAPACITIES:
        return None
    if key in published:
        return (
            f'"{key}" cannot be requested: tessera enforces only memory shares (through the MPS memory '
            "limit); ask for a compute share with sharing.mps.activeThreadPercentage in the claim's "
            "GpuConfig instead"
        )
    hint = ctx.schema.suggest_capacity(key)
    suggestion = f'did you mean "{hint}"? ' if hint else ""
    return f'tessera publishes no capacity "{key}"; {suggestion}the requestable key is "memory"'


def _amount_problem(amount: Any, ctx: CheckContext) -> str | int:
    """The amount in bytes, or why tessera cannot enforce it or no GPU in the cluster can hold it."""

    try:
        quantity = Quantity.parse(str(amount))
    except ValueError as exc:
        return f"{amount!r} is not a Kubernetes quantity ({exc}); write it like 4Gi"
    value = quantity.value()
    if quantity.milli_value() <= 0:
        return f"must be larger than zero, got {amount}"
    if value * 1000 != quantity.milli_value() or value % MiB:
        low, high = (value // MiB) * MiB, (value // MiB + 1) * MiB
        options = f"{format_bytes(low)} or {format_bytes(high)}" if low else format_bytes(high)
        return f"{amount} is not a whole number of MiB; tessera sets the GPU memory limit in MiB, use {options}"
    largest = ctx.inventory.largest_memory() if ctx.inventory is not None else None
    if largest is not None and value > largest[0]:
        return (
            f"{amount} is more than the largest GPU in the cluster has ({format_bytes(largest[0])} on "
            f"{largest[1].describe()}), so no device can ever satisfy it"
        )
    return value
