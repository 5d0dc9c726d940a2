"""GPU memory per node: what the slices offer and what allocated claims hold.

Total counts each physical memory once: whole-GPU devices (type "gpu") and static MIG instances
(type "mig" without counters, whose parent is not published). Dynamic MIG placements consume counters
and overlap each other and their parent, so they are not added again. Allocated memory is what each
result holds by kube-scheduler's booking rule (controller.cluster.booking), the same rule `tessera
status` and `tessera explain` use: adminAccess results hold nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from controller.cluster.booking import bookings
from controller.cluster.inventory import DeviceIndex


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
    by_ref = {(d.driver, d.pool, d.name): d for d in index.devices}
    allocated: dict[str, int] = {}
    for claim in claims:
        for booking in bookings(claim):
            found = by_ref.get(booking.key)
            node = found.node if found else booking.key[1]
            allocated[node] = allocated.get(node, 0) + int(booking.memory(found.memory if found else None))
    nodes = sorted(set(totals) | set(allocated))
    return {n: NodeMemory(totals.get(n, 0), allocated.get(n, 0)) for n in nodes}
