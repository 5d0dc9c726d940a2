"""`tessera status`: per node and GPU, what allocated claims hold (whole cards, memory shares, MIG
instances with their placement) and what is free, from the apiserver's objects alone.

GPUs are the published full-GPU devices; a MIG device belongs to the GPU whose uuid is its
`parentUUID` (a GPU in static MIG mode is not published itself: it is drawn from its instances).
Where a MIG instance sits on its card comes from its `placement` attribute and the profile's size in
memory slices (driver.mig). MIG placements still possible are the unallocated MIG devices whose shared
counters are free, the same check the scheduler makes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import Any

from controller.cluster.inventory import InventoryDevice
from controller.explain.explain import ClusterView
from controller.explain.state import AllocatedState, Holder
from driver.mig import layout_for
from driver.quantity import format_bytes

_size = partial(format_bytes, approximate=True)  # memory in tables and card maps: 40Gi, 79.6Gi

Obj = dict[str, Any]
_MIG_PARENT = re.compile(r"^(gpu-\d+)-mig-")


@dataclass(frozen=True)
class Segment:
    """One allocation on a GPU."""

    kind: str  # whole, share or mig
    device: str  # the device name allocated (gpu-1, gpu-0-mig-1g10gb-6)
    claim: str
    pods: tuple[str, ...]
    request: str
    memory: int  # bytes
    profile: str = ""
    placement: int | None = None
    slices: tuple[int, int] | None = None  # (first memory slice, how many), MIG only

    @property
    def label(self) -> str:
        return self.pods[0] if self.pods else self.claim


@dataclass
class GpuStatus:
    node: str
    name: str
    product: str
    uuid: str
    memory: int  # bytes the bar stands for
    memory_slices: int = 0  # 8 on MIG-capable cards
    mig: str = "none"  # none, static (instances only) or dynamic (placements created on demand)
    segments: list[Segment] = field(default_factory=list)
    mig_possible: dict[str, list[int]] = field(default_factory=dict)
    published: bool = True  # False: a static-MIG card known only through its instances

    @property
    def allocated(self) -> int:
        return sum(s.memory for s in self.segments)

    @property
    def free(self) -> int:
        return max(self.memory - self.allocated, 0)


@dataclass(frozen=True)
class NodeStatus:
    name: str
    gpus: tuple[GpuStatus, ...]


@dataclass(frozen=True)
class StatusReport:
    nodes: tuple[NodeStatus, ...]
    unknown: tuple[str, ...] = ()  # allocations of devices no slice publishes any more
    pod_phases: Mapping[str, str] | None = None  # namespace/name -> phase; None when pods could not be read

    def pod_text(self, pod: str) -> str:
        """`ns/p`, marked when the pod is not running or no longer exists."""
        if self.pod_phases is None:
            return pod
        phase = self.pod_phases.get(pod)
        if phase is None:
            return f"{pod} (gone)"
        return pod if phase == "Running" else f"{pod} ({phase})"


def _memory(device: InventoryDevice) -> int:
    return int(device.memory or 0)


def _mig_geometry(device: InventoryDevice) -> tuple[str, int | None, tuple[int, int] | None, int]:
    """The MIG device's profile, placement, (first memory slice, how many) and its card's memory slices."""
    profile = str((device.attribute(device.driver, "profile") or {}).get("string", ""))
    placement = (device.attribute(device.driver, "placement") or {}).get("int")
    return _geometry(device.product_name, profile, placement if isinstance(placement, int) else None)


@lru_cache(maxsize=4096)
def _geometry(product: str, profile: str, placement: int | None) -> tuple[str, int | None, tuple[int, int] | None,
                                                                          int]:
    # a fleet has a few dozen (product, profile, placement) triples among 86,400 MIG devices
    layout = layout_for(product)
    if layout is None or placement is None:
        return profile, placement, None, 0
    try:
        size = layout.profile(profile).memory_slices
    except KeyError:
        return profile, placement, None, layout.memory_slices
    return profile, placement, (placement, size), layout.memory_slices


def _segment(device: InventoryDevice, holder: Holder) -> Segment:
    total = _memory(device)
    if device.device_type == "mig":
        profile, placement, slices, _ = _mig_geometry(device)
        return Segment("mig", device.name, holder.claim, holder.pods, holder.request, total, profile, placement,
                       slices)
    amount = int(holder.booking.memory(device.memory))
    kind = "share" if holder.share_id and amount < total else "whole"
    return Segment(kind, device.name, holder.claim, holder.pods, holder.request, amount)


def cluster_status(view: ClusterView, pods: Iterable[Obj] | None = None) -> StatusReport:
    """The GPUs of `view` with their allocations; `pods` (all namespaces, when readable) adds their phases."""
    state: AllocatedState = view.state
    gpus: dict[tuple[str, str], GpuStatus] = {}  # (node, uuid or name) -> GPU
    by_name: dict[tuple[str, str], GpuStatus] = {}
    for device in view.index.devices:
        if device.device_type != "gpu":
            continue
        uuid = str((device.attribute(device.driver, "uuid") or {}).get("string", device.name))
        gpu = GpuStatus(device.node, device.name, device.product_name, uuid, _memory(device))
        gpus[(device.node, uuid)] = by_name[(device.node, device.name)] = gpu
        gpu.segments.extend(_segment(device, h) for h in state.holders_of(device))
    for device in view.index.devices:
        if device.device_type != "mig":
            continue
        gpu = _parent(device, gpus, by_name)
        profile, placement, _, memory_slices = _mig_geometry(device)
        gpu.memory_slices = max(gpu.memory_slices, memory_slices)
        gpu.mig = "dynamic" if device.consumes_counters else "static"
        if not gpu.published:
            gpu.memory += _memory(device)  # a static card: its instances are what it offers
        holders = state.holders_of(device)
        gpu.segments.extend(_segment(device, h) for h in holders)
        if not holders and not state.is_allocated(device) and state.fits_counters(device):
            gpu.mig_possible.setdefault(profile, []).append(placement if placement is not None else -1)
    for gpu in gpus.values():
        gpu.segments.sort(key=lambda s: (s.slices[0] if s.slices else -1, s.claim))
        for placements in gpu.mig_possible.values():
            placements.sort()
    nodes: dict[str, list[GpuStatus]] = {}
    for gpu in sorted(gpus.values(), key=lambda g: (g.node, _index(g.name))):
        nodes.setdefault(gpu.node, []).append(gpu)
    known = set(state.by_key)
    unknown = tuple(f"{key[1]}/{key[2]} ({', '.join(h.claim for h in holders)})"
                    for key, holders in sorted(state.holders.items()) if key not in known)
    phases = None if pods is None else {
        f"{(p.get('metadata') or {}).get('namespace')}/{(p.get('metadata') or {}).get('name')}":
            str((p.get("status") or {}).get("phase", "")) for p in pods}
    return StatusReport(tuple(NodeStatus(n, tuple(g)) for n, g in sorted(nodes.items())), unknown, phases)


def _parent(device: InventoryDevice, gpus: dict[tuple[str, str], GpuStatus],
            by_name: dict[tuple[str, str], GpuStatus]) -> GpuStatus:
    """The GPU a MIG device is part of: by parentUUID, else by the gpu-<index> its name starts with."""
    parent = str((device.attribute(device.driver, "parentUUID") or {}).get("string", ""))
    found = gpus.get((device.node, parent))
    if found is not None:
        return found
    match = _MIG_PARENT.match(device.name)
    name = match.group(1) if match else device.name
    found = by_name.get((device.node, name))
    if found is None:
        found = GpuStatus(device.node, name, device.product_name, parent, 0, published=False)
        gpus[(device.node, parent)] = by_name[(device.node, name)] = found
    return found


def _index(name: str) -> tuple[int, str]:
    digits = name.split("-", 1)[1] if "-" in name else ""
    return (int(digits), name) if digits.isdigit() else (1 << 30, name)


def status_json(report: StatusReport) -> dict[str, object]:
    return {"nodes": [{"name": n.name, "gpus": [_gpu_json(g, report) for g in n.gpus]} for n in report.nodes],
            "unknownAllocations": list(report.unknown)}


def _gpu_json(g: GpuStatus, report: StatusReport) -> dict[str, object]:
    return {
        "name": g.name, "uuid": g.uuid, "product": g.product, "mig": g.mig, "published": g.published,
        "memoryBytes": g.memory, "allocatedBytes": g.allocated, "freeBytes": g.free, "memorySlices": g.memory_slices,
        "allocations": [{"kind": s.kind, "device": s.device, "claim": s.claim, "pods": list(s.pods),
                         **({"podPhases": {p: (report.pod_phases or {}).get(p) for p in s.pods}}
                            if report.pod_phases is not None else {}),
                         "request": s.request, "memoryBytes": s.memory, "memory": _size(s.memory),
                         **({"profile": s.profile, "placement": s.placement,
                             "memorySlices": list(s.slices) if s.slices else None} if s.kind == "mig" else {})}
                        for s in g.segments],
        "migPossible": g.mig_possible,
    }



def _allocation_text(s: Segment, report: StatusReport) -> str:
    pods = ", ".join(report.pod_text(p) for p in s.pods) or "no pod"
    if s.kind == "mig":
        where = f" at slice {s.placement}" if s.placement is not None else ""
        return f"MIG {s.profile}{where} ({s.device})  claim {s.claim}  pod {pods}"
    what = "whole" if s.kind == "whole" else f"share {_size(s.memory)}"
    return f"{what}  claim {s.claim}  pod {pods}"


def _ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 4, 6] -> "0-2,4,6"."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ",".join(map(str, r)) for r in runs)


def _possible_text(g: GpuStatus) -> str:
    parts = []
    for profile, placements in sorted(g.mig_possible.items(), key=lambda kv: (len(kv[0]), kv[0])):
        at = _ranges([p for p in placements if p >= 0])
        parts.append(f"{profile} at {at}" if at else profile)
    return "; ".join(parts)


def status_table(report: StatusReport) -> str:
    header = ("NODE", "GPU", "PRODUCT", "MEMORY", "FREE", "ALLOCATED")
    rows: list[tuple[str, ...]] = []
    for node in report.nodes:
        first_of_node = True
        for g in node.gpus:
            allocations = [_allocation_text(s, report) for s in g.segments] or ["-"]
            name = g.name if g.published else f"{g.name} (MIG)"
            rows.append((node.name if first_of_node else "", name, g.product, _size(g.memory), _size(g.free),
                         allocations[0]))
            rows.extend(("", "", "", "", "", a) for a in allocations[1:])
            if g.mig != "none":
                possible = _possible_text(g) or "none"
                rows.append(("", "", "", "", "", f"MIG placements free: {possible}"))
            first_of_node = False
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = ["  ".join([*(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)), r[-1]]).rstrip()
             for r in [header, *rows]]
    gpus = [g for n in report.nodes for g in n.gpus]
    segments = [s for g in gpus for s in g.segments]
    summary = (f"{len(report.nodes)} node(s), {len(gpus)} GPU(s): {sum(s.kind == 'whole' for s in segments)} whole, "
               f"{sum(s.kind == 'share' for s in segments)} share(s), {sum(s.kind == 'mig' for s in segments)} MIG "
               f"instance(s) allocated; {_size(sum(g.free for g in gpus))} of "
               f"{_size(sum(g.memory for g in gpus))} GPU memory free")
    lines += ["", summary]
    if report.unknown:
        lines.append("allocated devices no ResourceSlice publishes any more: " + "; ".join(report.unknown))
    return "\n".join(lines) + "\n"
