"""Turn a node's `Inventory` into the resource.k8s.io/v1 ResourceSlices of its pool.

One pool per node (pool name = node name). Whole GPUs are shareable devices (`allowMultipleAllocations`)
whose `memory` capacity has no request policy, so a request that names no memory takes the whole card.
MIG is published per `mig_strategy`:

- "none": no MIG devices; a GPU in MIG mode cannot run work as a whole card, so it is left out.
- "static": the MIG instances that exist on MIG-enabled GPUs become `type: mig` devices; their parent is
  not published as a whole GPU.
- "dynamic": every MIG-capable GPU with a table in driver/mig.py gets a counter set and one device per
  valid (profile, placement) plus the whole GPU, which consumes every counter; the instance is created at
  prepare time. GPUs without a table fall back to "static".

The result is validated with driver.poolvalidation before it is returned: a slice tessera emits must never be
rejected by an apiserver or leave the pool unusable for the scheduler.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from driver import DRIVER_NAME
from driver.attributes import gpu_attributes, mig_attributes
from driver.errors import InvalidInputError
from driver.mig import MigLayout, layout_for
from driver.model import Gpu, Inventory
from driver.names import (
    counter_set_name,
    gpu_device_name,
    memory_slice_counter,
    mig_device_name,
    slice_labels,
)
from driver.poolvalidation import validate_pool
from driver.quantity import canonical_quantity
from driver.validation import (
    MAX_COUNTER_SETS,
    MAX_DEVICES,
    MAX_DEVICES_WITH_TAINTS_OR_COUNTERS,
    RESOURCE_API_VERSION,
    FieldError,
)

log = structlog.get_logger(__name__)

MIG_STRATEGIES = ("none", "static", "dynamic")

Obj = dict[str, Any]



class SliceBuildError(InvalidInputError):
    """The inventory cannot be published as valid ResourceSlices; `errors` says where and why."""

    def __init__(self, message: str, errors: Sequence[FieldError] = ()) -> None:
        detail = "".join(f"\n  {e}" for e in errors)
        super().__init__(message + detail)
        self.errors = tuple(errors)


@dataclass
class _Group:
    """Devices that belong together (one GPU's partitions) and stay in one slice when they fit."""

    devices: list[Obj] = field(default_factory=list)


def _capacity(memory_bytes: int, multiprocessors: int, *, shareable: bool) -> Obj:
    sms: Obj = {"value": canonical_quantity(multiprocessors)}
    if shareable:
        # A share names only memory; without a default of 0 the scheduler would book all SMs to it and
        # no second share could ever join the card (docs/attributes.md, "Capacity").
        sms["requestPolicy"] = {"default": "0"}
    return {"memory": {"value": canonical_quantity(memory_bytes, binary=True)}, "multiprocessors": sms}


def _whole_gpu(inventory: Inventory, gpu: Gpu, consumes: list[Obj] | None = None) -> Obj:
    device: Obj = {
        "name": gpu_device_name(gpu.index),
        "allowMultipleAllocations": True,
        "attributes": gpu_attributes(inventory, gpu),
        "capacity": _capacity(gpu.memory_bytes, gpu.multiprocessors, shareable=True),
    }
    if consumes:
        device["consumesCounters"] = consumes
    return device


def _mig_device(inventory: Inventory, gpu: Gpu, *, profile: str, placement: int, memory_bytes: int,
                multiprocessors: int, consumes: list[Obj] | None = None) -> Obj:
    device: Obj = {
        "name": mig_device_name(gpu.index, profile, placement),
        "attributes": mig_attributes(inventory, gpu, profile, placement),
        "capacity": _capacity(memory_bytes, multiprocessors, shareable=False),
    }
    if consumes:
        device["consumesCounters"] = consumes
    return device


def _counters(values: dict[str, int], *, memory_key: str = "memory") -> Obj:
    return {
        name: {"value": canonical_quantity(amount, binary=name == memory_key)} for name, amount in values.items()
    }


def _partitions(inventory: Inventory, gpu: Gpu, layout: MigLayout) -> tuple[Obj, Obj, _Group]:
    """The counter set, the whole-GPU device and the partition devices of one GPU under dynamic MIG."""
    set_name = counter_set_name(gpu.index)
    largest = max(p.memory_bytes for p in layout.profiles)
    totals = {"memory": max(gpu.memory_bytes, largest), "compute-slices": layout.compute_slices}
    totals.update({memory_slice_counter(i): 1 for i in range(layout.memory_slices)})
    counter_set = {"name": set_name, "counters": _counters(totals)}

    everything = {"memory": gpu.memory_bytes, "compute-slices": layout.compute_slices}
    everything.update({memory_slice_counter(i): 1 for i in range(layout.memory_slices)})
    whole = _whole_gpu(inventory, gpu, [{"counterSet": set_name, "counters": _counters(everything)}])

    group = _Group()
    for profile in layout.profiles:
        # Highest placement first: first-fit then fills a card from the top and keeps the low placements,
        # the only ones the big profiles (4g, 7g) can use, free for as long as possible.
        for placement in sorted(profile.placements, reverse=True):
            if placement + profile.memory_slices > layout.memory_slices:
                raise SliceBuildError(
                    f"driver/mig.py: profile {profile.name} at placement {placement} needs memory slices up to "
                    f"{placement + profile.memory_slices - 1}, but the GPU has {layout.memory_slices}"
                )
            used = {"memory": profile.memory_bytes, "compute-slices": profile.compute_slices}
            used.update({memory_slice_counter(i): 1 for i in range(placement, placement + profile.memory_slices)})
            group.devices.append(_mig_device(
                inventory, gpu, profile=profile.name, placement=placement, memory_bytes=profile.memory_bytes,
                multiprocessors=profile.multiprocessors,
                consumes=[{"counterSet": set_name, "counters": _counters(used)}],
            ))
    return counter_set, whole, group


def _static_instances(inventory: Inventory, gpu: Gpu) -> _Group:
    group = _Group()
    for inst in sorted(gpu.mig_instances, key=lambda i: (i.placement_size, -i.placement_start)):
        group.devices.append(_mig_device(
            inventory, gpu, profile=inst.profile, placement=inst.placement_start, memory_bytes=inst.memory_bytes,
            multiprocessors=inst.multiprocessors,
        ))
    return group


def _limit(devices: Sequence[Obj]) -> int:
    if any(d.get("consumesCounters") or d.get("taints") for d in devices):
        return MAX_DEVICES_WITH_TAINTS_OR_COUNTERS
    return MAX_DEVICES


def _pack(groups: Sequence[_Group]) -> list[list[Obj]]:
    """Fill slices in order, keeping each group in one slice whenever it fits in a fresh one."""
    packed: list[list[Obj]] = []
    current: list[Obj] = []
    for group in groups:
        if current and len(current) + len(group.devices) > _limit(current + group.devices):
            packed.append(current)
            current = []
        for device in group.devices:
            if current and len(current) + 1 > _limit([*current, device]):
                packed.append(current)
                current = []
            current.append(device)
    if current:
        packed.append(current)
    return packed


def _slice(node: str, spec_body: Obj) -> Obj:
    return {
        "apiVersion": RESOURCE_API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"labels": slice_labels(node)},
        "spec": {
            "driver": DRIVER_NAME,
            "pool": {"name": node, "generation": 0, "resourceSliceCount": 0},
            "nodeName": node,
            **spec_body,
        },
    }


def _taint(devices: Sequence[Obj], taints: Sequence[Obj]) -> None:
    # Every device carved from a GPU shares its fate; shares are the GPU device itself.
    if taints:
        for device in devices:
            device["taints"] = [dict(t) for t in taints]


def build_slices(
    inventory: Inventory, *, mig_strategy: str = "static", taints: Mapping[int, Sequence[Obj]] | None = None
) -> list[Obj]:
    """The ResourceSlices of `inventory.node_name`'s pool, without `metadata.name` (the publisher names them).

    `taints` maps a GPU index to the taints its devices carry (driver.health): the GPU and every MIG
    device or partition on it get them. A tainted device lowers its slice's device limit to 64, so
    slices are packed with the taints already in place.

    Slices with devices come first, in the order the scheduler should try devices (it takes the first
    fit, walking slices by name and devices in list order); counter-set slices come last. Pool
    generation is 0 and `resourceSliceCount` the number of slices returned.
    Raises SliceBuildError when the inventory cannot be published validly.
    """
    if mig_strategy not in MIG_STRATEGIES:
        raise SliceBuildError(f"mig_strategy: {mig_strategy!r} is not one of {', '.join(MIG_STRATEGIES)}")
    node = inventory.node_name

    partition_groups: list[_Group] = []
    static_groups: list[_Group] = []
    whole: list[Obj] = []
    counter_sets: list[Obj] = []
    taints = taints or {}
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        gpu_taints = taints.get(gpu.index, ())
        layout = layout_for(gpu.product_name) if gpu.mig_capable else None
        if mig_strategy == "dynamic" and layout is not None:
            counter_set, whole_device, group = _partitions(inventory, gpu, layout)
            _taint([whole_device, *group.devices], gpu_taints)
            counter_sets.append(counter_set)
            whole.append(whole_device)
            partition_groups.append(group)
            continue
        if mig_strategy == "dynamic" and gpu.mig_capable:
            log.warning("no MIG table for this GPU; publishing its existing MIG instances only",
                        gpu=gpu.index, product=gpu.product_name)
        if gpu.mig_enabled:
            if mig_strategy == "none":
                log.warning("GPU is in MIG mode and mig-strategy is none: it is not published",
                            gpu=gpu.index, hint="use --mig-strategy static or disable MIG mode")
                continue
            group = _static_instances(inventory, gpu)
            _taint(group.devices, gpu_taints)
            static_groups.append(group)
            continue
        whole.append(_whole_gpu(inventory, gpu))
        _taint(whole[-1:], gpu_taints)

    if partition_groups:
        # Partitions pack from the first GPU upwards; whole-card requests start from the last GPU, so the
        # two kinds of request meet as late as possible instead of each breaking into a fresh card.
        whole.reverse()
    groups = [_Group([device]) for device in whole] + static_groups + partition_groups
    device_slices = _pack([g for g in groups if g.devices])

    slices = [_slice(node, {"devices": devices}) for devices in device_slices]
    if not slices and not counter_sets:
        # A pool needs a slice even with nothing in it ("no devices" differs from "no pool"). The apiserver
        # drops an empty list, so the slice carries no `devices` key at all, as it will be stored.
        slices.append(_slice(node, {}))
    for start in range(0, len(counter_sets), MAX_COUNTER_SETS):
        slices.append(_slice(node, {"sharedCounters": counter_sets[start:start + MAX_COUNTER_SETS]}))
    for obj in slices:
        obj["spec"]["pool"]["resourceSliceCount"] = len(slices)

    errors = validate_pool(slices)
    if errors:
        raise SliceBuildError(f"the slices built for node {node!r} would be rejected", errors)
    return slices
