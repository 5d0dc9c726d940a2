"""What an allocated ResourceClaim holds, by kube-scheduler's rule: the one rule `tessera explain`,
`tessera status` and the controller's memory metrics all book allocations with.

kube-scheduler 1.36 reads every allocated claim (dynamicresources/allocateddevices.go,
foreachAllocatedDevice):
- a result with `adminAccess` is not considered allocated: it holds neither the device nor any of its
  capacity (admin access is for monitoring a device others use);
- a result with a `shareID` is one share of a device that allows multiple allocations and holds its
  `consumedCapacity`;
- any other result holds the whole device.
Memory held follows from it: a share's `consumedCapacity.memory`, else all of the device's memory.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from controller.cluster.capacityfit import quantity
from driver import DRIVER_NAME

Obj = dict[str, Any]
DeviceKey = tuple[str, str, str]  # driver, pool, device


@dataclass(frozen=True)
class Booking:
    """One allocation result that holds (part of) a device."""

    key: DeviceKey
    request: str
    share_id: str = ""
    consumed: Mapping[str, Fraction] = field(default_factory=dict)

    def memory(self, device_memory: int | None) -> Fraction:
        """The memory this result holds on a device with `device_memory` bytes."""
        if self.share_id and "memory" in self.consumed:
            return self.consumed["memory"]
        return Fraction(device_memory or 0)


def bookings(claim: Mapping[str, Any], driver: str = DRIVER_NAME) -> Iterator[Booking]:
    """The results of `driver` in the claim's status.allocation that hold something (adminAccess ones do not)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    for result in (allocation.get("devices") or {}).get("results") or ():
        if not isinstance(result, Mapping) or result.get("adminAccess") or result.get("driver") != driver:
            continue
        consumed = {str(k): quantity(v) or Fraction(0) for k, v in (result.get("consumedCapacity") or {}).items()}
        yield Booking((driver, str(result.get("pool")), str(result.get("device"))), str(result.get("request", "")),
                      str(result.get("shareID") or ""), consumed)
