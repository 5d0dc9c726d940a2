"""One request against the devices, step by step: how many devices are left after each check.

The per-device checks are the scheduler's (allocator_incubating.go: isSelectable, CmpRequestOverCapacity,
allocateDevice), in the order a person reads them:

  driver      tessera's devices on the nodes the pod may use (pools being republished are skipped)
  class       the DeviceClass's selectors        } controller.cluster.matching.first_failure, the webhook's
  selectors   the request's own selectors         } selector walk and Evaluator
  capacity    the request's capacity fits the device, with what other claims' shares leave free
  allocation  not held by another claim (a whole device, or a card that has nothing left)
  taints      every NoSchedule/NoExecute taint of the device is tolerated
  counters    the shared counters the device consumes (MIG memory slices) are still free

A device's fate at these steps does not depend on the order of the steps, so the devices left at the
end are exactly those the allocator could pick for the request on its own. What the requests of a
claim can get together (count, constraints, counters between them) is search.py's part.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import Any

from controller.cluster.capacityfit import CapacityMiss, capacity_miss
from controller.cluster.inventory import DeviceIndex, InventoryDevice
from controller.cluster.matching import Evaluator, MatchResult, Requirement, RuntimeFailure, first_failure, match
from controller.cluster.taints import fmt_taint, untolerated_taint
from controller.explain.requests import RequestSpec
from controller.explain.state import AllocatedState, CounterShort, Holder
from driver import DRIVER_NAME
from driver.quantity import format_bytes

STEPS = ("driver", "class", "selectors", "capacity", "allocation", "taints", "counters")


@dataclass(frozen=True)
class Drop:
    """A device ruled out at a step, and why."""

    device: InventoryDevice
    why: str
    holders: tuple[Holder, ...] = ()
    miss: CapacityMiss | None = None
    taint: Mapping[str, Any] | None = None
    counters: tuple[CounterShort, ...] = ()


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    devices: tuple[InventoryDevice, ...]  # left after this step
    dropped: tuple[Drop, ...] = ()
    note: str = ""

    @property
    def count(self) -> int:
        return len(self.devices)

    @property
    def per_node(self) -> dict[str, int]:
        return dict(sorted(Counter(d.node for d in self.devices).items()))


@dataclass(frozen=True)
class Funnel:
    request: RequestSpec
    steps: tuple[Step, ...]
    runtime_errors: tuple[RuntimeFailure, ...] = ()
    class_match: MatchResult | None = None  # the webhook's match() of the class alone (nearest miss)
    request_match: MatchResult | None = None  # and of class + request selectors
    skipped_pools: tuple[str, ...] = field(default=())

    @property
    def candidates(self) -> tuple[InventoryDevice, ...]:
        return self.steps[-1].devices if self.steps else ()

    @property
    def selectable(self) -> tuple[InventoryDevice, ...]:
        """Devices the class and request selectors accept: what the allocator walks for this request."""
        return self.step("selectors").devices

    def step(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)

    def candidates_on(self, node: str) -> tuple[InventoryDevice, ...]:
        """The candidates on one node (grouped once: explain asks this for each of a thousand nodes)."""
        return self._candidates_by_node.get(node, ())

    def selectable_on(self, node: str) -> tuple[InventoryDevice, ...]:
        return self._selectable_by_node.get(node, ())

    @cached_property
    def _candidates_by_node(self) -> dict[str, tuple[InventoryDevice, ...]]:
        return _group_by_node(self.candidates)

    @cached_property
    def _selectable_by_node(self) -> dict[str, tuple[InventoryDevice, ...]]:
        return _group_by_node(self.selectable)

    @property
    def empty_step(self) -> Step | None:
        """The first step that leaves no device."""
        return next((s for s in self.steps if s.count == 0), None)


def _group_by_node(devices: tuple[InventoryDevice, ...]) -> dict[str, tuple[InventoryDevice, ...]]:
    grouped: dict[str, list[InventoryDevice]] = {}
    for d in devices:
        grouped.setdefault(d.node, []).append(d)
    return {node: tuple(ds) for node, ds in grouped.items()}


def funnel(request: RequestSpec, index: DeviceIndex, nodes: set[str] | None, state: AllocatedState,
           evaluator: Evaluator) -> Funnel:
    """Walk the request's checks over the devices of `nodes` (None: every node)."""
    skipped = tuple(index.incomplete_pools)
    devices = tuple(d for d in index.devices if d.driver == DRIVER_NAME and d.pool not in skipped
                    and (nodes is None or d.node in nodes))
    where = "" if nodes is None else " on the nodes the pod may use"
    steps = [Step("driver", f"devices of {DRIVER_NAME}{where}", devices)]
    scope = DeviceIndex(devices)
    n_class = len(request.class_conditions)
    passed_class: list[InventoryDevice] = []
    passed_request: list[InventoryDevice] = []
    class_drops: list[Drop] = []
    request_drops: list[Drop] = []
    errors: dict[int, RuntimeFailure] = {}
    conditions = request.all_conditions
    for device in devices:
        stop = first_failure(conditions, device, evaluator)
        if stop is None:
            passed_class.append(device)
            passed_request.append(device)
            continue
        i, out = stop
        why = f"selector `{conditions[i].expression}` is {out if out is False else 'a runtime error: ' + str(out)}"
        if isinstance(out, str) and i not in errors:
            errors[i] = RuntimeFailure(conditions[i], device, out)
        if i < n_class:
            class_drops.append(Drop(device, why))
        else:
            passed_class.append(device)
            request_drops.append(Drop(device, why))
    steps.append(Step("class", f'match DeviceClass "{request.class_name}"', tuple(passed_class), tuple(class_drops)))
    title = "match the request's selectors" if request.conditions else "match the request's selectors (none)"
    steps.append(Step("selectors", title, tuple(passed_request), tuple(request_drops)))
    class_match = match(Requirement(request.class_conditions), scope, evaluator) if not passed_class else None
    request_match = match(Requirement(conditions), scope, evaluator) if passed_class and not passed_request \
        else None

    steps.append(_capacity(request, passed_request, state))
    steps.append(_allocation(request, steps[-1].devices, state))
    steps.append(_taints(request, steps[-1].devices))
    steps.append(_counters(steps[-1].devices, state))
    ordered = tuple(errors[i] for i in sorted(errors))
    return Funnel(request, tuple(steps), ordered, class_match, request_match, skipped)


def _capacity(request: RequestSpec, devices: list[InventoryDevice], state: AllocatedState) -> Step:
    """The request's capacity fits: statically, and (for a share) in what the card's other claims leave.

    A request that names no capacity takes the whole device; a card others use is taken for it (allocation
    step), not too small."""
    kept: list[InventoryDevice] = []
    drops: list[Drop] = []
    for device in devices:
        miss = capacity_miss(device, request.needs)
        if miss is None and request.needs and device.allow_multiple:
            miss = capacity_miss(device, request.needs, state.in_use(device))
        if miss is None:
            kept.append(device)
        else:
            holders = tuple(state.holders_of(device)) if miss.kind == "in-use" else ()
            drops.append(Drop(device, miss.reason, holders, miss))
    what = ", ".join(f"{n.key} {n.text}" for n in request.needs)
    title = f"have room for {what}" if what else "have room for a whole device"
    return Step("capacity", title, tuple(kept), tuple(drops), _largest_free(devices, state))


def _largest_free(devices: Iterable[InventoryDevice], state: AllocatedState) -> str:
    best: tuple[Fraction, InventoryDevice] | None = None
    for device in devices:
        total = device.memory
        if total is None or device.device_type != "gpu":
            continue
        free = Fraction(total) - state.used_memory(device)
        if best is None or free > best[0]:
            best = (free, device)
    if best is None:
        return ""
    free = max(best[0], Fraction(0))
    return f"largest free memory: {format_bytes(free, approximate=True)} on {best[1].ref}"


def _allocation(request: RequestSpec, devices: tuple[InventoryDevice, ...], state: AllocatedState) -> Step:
    kept: list[InventoryDevice] = []
    drops: list[Drop] = []
    for device in devices:
        holders = tuple(state.holders_of(device))
        if not request.admin_access and state.is_dedicated(device):
            drops.append(Drop(device, "allocated", holders))
            continue
        if device.allow_multiple and not request.needs:
            miss = capacity_miss(device, request.needs, state.in_use(device))
            if miss is not None:
                drops.append(Drop(device, miss.reason, holders, miss))
                continue
        kept.append(device)
    return Step("allocation", "not held by other claims", tuple(kept), tuple(drops))


def _taints(request: RequestSpec, devices: tuple[InventoryDevice, ...]) -> Step:
    kept: list[InventoryDevice] = []
    drops: list[Drop] = []
    for device in devices:
        taint = untolerated_taint(device, request.tolerations)
        if taint is None:
            kept.append(device)
        else:
            drops.append(Drop(device, f"taint {fmt_taint(taint)} is not tolerated", taint=taint))
    return Step("taints", "taints tolerated", tuple(kept), tuple(drops))


def _counters(devices: tuple[InventoryDevice, ...], state: AllocatedState) -> Step:
    kept: list[InventoryDevice] = []
    drops: list[Drop] = []
    for device in devices:
        # a shared card whose counters an earlier share already reserved is not checked again
        skip = device.allow_multiple and bool(state.in_use(device))
        shorts = [] if skip else state.counter_shortfalls(device)
        if not shorts:
            kept.append(device)
        else:
            names = ", ".join(s.counter for s in shorts[:3])
            drops.append(Drop(device, f"shared counters {names} are used up", counters=tuple(shorts)))
    return Step("counters", "shared counters (MIG) free", tuple(kept), tuple(drops))
