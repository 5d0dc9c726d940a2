"""GPU memory per node: what the slices offer and what allocated claims hold.

Total counts each physical memory once: whole-GPU devices (type "gpu") and static MIG instances
(type "mig" without counters, whose parent is not published). Dynamic MIG placements consume counters
and overlap each other and their parent, so they are not added again. Allocated memory is a result's
`consumedCapacity.memory` for a share, else the whole device's memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from controller.cluster.inventory import DeviceIndex
from driver import DRIVER_NAME
from driver.quantity import quantity_bytes_or_none


@dataclass(frozen=True)
class NodeMemory:
    total: int = 0
    allocated: int = 0

    @property
    def free(self) -> int:
        return max(self.total - self.allocated, 0)


def memory_usage(index: DeviceIndex, claims: Iterable[dict[str, Any]]) -> dict[str, NodeMemory]:
    totals: dict[str, int] = {}
    for device in index.devices:
        counted = device.device_type == "gpu" or (device.device_type == "mig" and not device.consumes_counters)
        totals.setdefault(device.node, 0)
        if counted and device.memory is not None:
            totals[device.node] += device.memory
    by_ref = {(d.pool, d.name): d for d in index.devices}
    allocated: dict[str, int] = {}
    for claim in claims:
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        for result in results:
            if not isinstance(result, dict) or result.get("driver") != DRIVER_NAME:
                continue
            found = by_ref.get((str(result.get("pool")), str(result.get("device"))))
            node = found.node if found else str(result.get("pool"))
            consumed = (result.get("consumedCapacity") or {}).get("memory")
            amount = (
                quantity_bytes_or_none(str(consumed)) if consumed is not None else (found.memory if found else None)
            )
            allocated[node] = allocated.get(node, 0) + (amount or 0)
    nodes = sorted(set(totals) | set(allocated))
    return {n: NodeMemory(totals.get(n, 0), allocated.get(n, 0)) for n in nodes}
