"""From a ResourceClaim, the plan of what this node prepares for it: one `ClaimPlan`.

Pure: the claim (or the allocation record a checkpoint kept of it) and the node's Inventory in, a
plan out. The plan says which devices this node prepares, how each is shared (the request groups
and their MPS daemon, time-slice intervals), how the claim uses each physical GPU, and which MIG
placements it needs. Prepare and recovery both act on it, so each rule is said here once. Only
results of this driver for this node's pool count; configs of other drivers are ignored. Every
problem that would make prepare fail is found here, before anything on the node is touched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from driver import DRIVER_NAME
from driver.config import (
    ConfigError,
    EffectiveSharing,
    GpuConfig,
    Strategy,
    config_applies,
    decode_gpu_config,
    merge_configs,
    resolve_sharing,
)
from driver.errors import InvalidInputError
from driver.mig import MigProfile, layout_for
from driver.model import Gpu, Inventory, MigInstance
from driver.names import base_request, mig_profile_token
from driver.quantity import format_bytes, quantity_bytes

_GPU_NAME = re.compile(r"^gpu-(\d+)\Z")
_MIG_NAME = re.compile(r"^gpu-(\d+)-mig-([0-9a-z]+)-(\d+)\Z")
_RESULTS = "status.allocation.devices.results"
_CONFIGS = "status.allocation.devices.config"


class AllocationError(InvalidInputError):
    """The claim's allocation cannot be prepared on this node; the text says why and what to do."""

    reason = "allocation"


class MigKey(NamedTuple):
    """Where a dynamic MIG instance sits: the same key names the instance a plan needs and the one created."""

    gpu_uuid: str
    profile: str
    placement: int


class GpuUse(NamedTuple):
    """How a claim uses one physical GPU; an exclusive use and any other use of the same card exclude each other."""

    gpu_uuid: str
    kind: str  # "exclusive" (whole card), "share" (memory share), "mig" (a MIG instance on it)


@dataclass(frozen=True)
class DeviceTarget:
    """The hardware behind a device name."""

    gpu: Gpu
    mig_profile: MigProfile | None = None  # set for MIG devices
    placement: int | None = None  # first memory slice, MIG only
    static_instance: MigInstance | None = None  # the existing instance of a static MIG device

    @property
    def is_mig(self) -> bool:
        return self.mig_profile is not None

    @property
    def is_dynamic_mig(self) -> bool:
        return self.mig_profile is not None and self.static_instance is None

    @property
    def memory_bytes(self) -> int:
        if self.static_instance is not None:
            return self.static_instance.memory_bytes
        if self.mig_profile is not None:
            return self.mig_profile.memory_bytes
        return self.gpu.memory_bytes


@dataclass(frozen=True)
class AllocatedDevice:
    """One allocation result of this driver on this node."""

    result_index: int  # position in status.allocation.devices.results
    request: str  # "req" or "req/sub"
    pool: str
    device: str
    share_id: str
    consumed_memory: int | None  # bytes, from consumedCapacity.memory
    admin_access: bool
    target: DeviceTarget
    config: GpuConfig
    sharing: EffectiveSharing

    @property
    def base_request(self) -> str:
        return base_request(self.request)

    @property
    def memory_share(self) -> bool:
        """Only part of the device's memory was consumed: other claims may share the card."""
        return (
            bool(self.share_id) and self.consumed_memory is not None and self.consumed_memory < self.target.memory_bytes
        )

    @property
    def memory_limit_bytes(self) -> int:
        """What this device may use: the consumed share, else the whole device."""
        return (
            self.consumed_memory if self.memory_share and self.consumed_memory is not None else self.target.memory_bytes
        )

    @property
    def mig_key(self) -> MigKey | None:
        """The placement of the MIG instance prepare creates for this device (dynamic MIG only)."""
        t = self.target
        if not t.is_dynamic_mig or t.mig_profile is None or t.placement is None:
            return None
        return MigKey(t.gpu.uuid, t.mig_profile.name, t.placement)

    @property
    def gpu_use(self) -> GpuUse:
        kind = "mig" if self.target.is_mig else "share" if self.memory_share else "exclusive"
        return GpuUse(self.target.gpu.uuid, kind)


@dataclass(frozen=True)
class MpsGroup:
    """Devices served by one MPS control daemon, and the daemon's settings.

    `daemon_id` names the daemon's directories and records: the claim's uid for its first group
    (where a claim's only daemon always was, so an older build finds it), `<uid>-mps<n>` after that.
    """

    daemon_id: str
    devices: tuple[AllocatedDevice, ...]
    active_thread_percentage: int | None = None
    pinned_memory_limit: int | None = None  # bytes per device and client; None = what the device may use

    @property
    def requests(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(d.base_request for d in self.devices))


@dataclass(frozen=True)
class ClaimPlan:
    """What this node prepares for one claim; prepare and recovery both act on it."""

    uid: str
    namespace: str
    name: str
    devices: tuple[AllocatedDevice, ...]
    # this node's part of status.allocation, as the checkpoint keeps it (see allocation_record)
    allocation: dict[str, Any] = field(default_factory=dict, compare=False)
    mps_groups: tuple[MpsGroup, ...] = ()  # one MPS daemon each
    gpu_uses: tuple[GpuUse, ...] = ()  # admin-access devices hold no use: they are watched, not owned
    time_slices: tuple[tuple[str, str], ...] = ()  # (GPU UUID, interval) of time-sliced whole GPUs
    migs: tuple[tuple[str, MigKey], ...] = ()  # (device name, placement) of each dynamic MIG instance

    @property
    def where(self) -> str:
        return f"ResourceClaim {self.namespace}/{self.name}"


def resolve_device(inventory: Inventory, name: str) -> DeviceTarget:
    """The GPU (and MIG geometry) a published device name stands for; AllocationError if unknown here."""
    m = _GPU_NAME.match(name)
    if m:
        return DeviceTarget(_gpu(inventory, int(m.group(1)), name))
    m = _MIG_NAME.match(name)
    if not m:
        raise AllocationError(
            f"device {name!r} is not a tessera device name (gpu-<index> or gpu-<index>-mig-<profile>-<placement>)"
        )
    gpu = _gpu(inventory, int(m.group(1)), name)
    token, placement = m.group(2), int(m.group(3))
    for instance in gpu.mig_instances:
        if mig_profile_token(instance.profile) == token and instance.placement_start == placement:
            layout = layout_for(gpu.product_name)
            profile = _profile_by_token(layout.profiles, token) if layout else None
            if profile is None:
                profile = MigProfile(
                    instance.profile, 0, instance.placement_size, instance.memory_bytes, instance.multiprocessors, ()
                )
            return DeviceTarget(gpu, profile, placement, instance)
    layout = layout_for(gpu.product_name)
    if layout is None or not gpu.mig_capable:
        raise AllocationError(
            f"device {name!r}: {gpu.device_name} ({gpu.product_name}) has no MIG instance {token} at placement "
            f"{placement} and does not support creating one; the ResourceSlice is out of date"
        )
    profile = _profile_by_token(layout.profiles, token)
    if profile is None or placement not in profile.placements:
        raise AllocationError(
            f"device {name!r}: {gpu.product_name} offers no MIG profile {token} at placement {placement}"
        )
    return DeviceTarget(gpu, profile, placement, None)

def _profile_by_token(profiles: tuple[MigProfile, ...], token: str) -> MigProfile | None:
    return next((p for p in profiles if mig_profile_token(p.name) == token), None)

def _gpu(inventory: Inventory, index: int, name: str) -> Gpu:
    try:
        return inventory.gpu_by_index(index)
    except KeyError:
        have = ", ".join(g.device_name for g in inventory.gpus) or "none"
        raise AllocationError(
            f"device {name!r} is not on node {inventory.node_name} (this node has: {have}); "
            "the ResourceSlice is out of date, delete the claim's pod so it is scheduled again"
        ) from None

def allocation_record(claim: dict[str, Any], pool: str) -> dict[str, Any]:
    """The part of status.allocation that prepares this node's devices, as the checkpoint keeps it.

    Other drivers' and other pools' results and other drivers' configs become null, so the result
    indices (which name repeated devices) stay as they are.
    """
    devices = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}

    def ours(result: Any) -> bool:
        return isinstance(result, dict) and result.get("driver") == DRIVER_NAME and result.get("pool") == pool

    def our_config(entry: Any) -> bool:
        opaque = entry.get("opaque") if isinstance(entry, dict) else None
        return isinstance(opaque, dict) and opaque.get("driver") == DRIVER_NAME

    results = devices.get("results") or []
    configs = devices.get("config") or []
    return {
        "devices": {
            "results": [r if ours(r) else None for r in results] if isinstance(results, list) else results,
            "config": [c if our_config(c) else None for c in configs] if isinstance(configs, list) else configs,
        }
    }


def plan_claim(claim: dict[str, Any], *, ref_uid: str, inventory: Inventory, pool: str) -> ClaimPlan:
    """The plan for a ResourceClaim kubelet asked to prepare; raises AllocationError/ConfigError."""
    meta = claim.get("metadata") or {}
    namespace, name, uid = str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", ""))
    if uid != ref_uid:
        raise AllocationError(
            f"ResourceClaim {namespace}/{name} has uid {uid or '<none>'} but kubelet asked for {ref_uid}: "
            "the claim was replaced (deleted and created again); kubelet retries with the new claim"
        )
    if not (claim.get("status") or {}).get("allocation"):
        raise AllocationError(f"ResourceClaim {namespace}/{name} is not allocated (status.allocation is missing)")
    return plan_allocation(allocation_record(claim, pool), uid=uid, namespace=namespace, name=name,
                           inventory=inventory, pool=pool)  # fmt: skip


def plan_allocation(
    allocation: dict[str, Any], *, uid: str, namespace: str, name: str, inventory: Inventory, pool: str
) -> ClaimPlan:
    """The plan for a claim's status.allocation (or the record of it a checkpoint kept)."""
    if not allocation:
        raise AllocationError(f"ResourceClaim {namespace}/{name} is not allocated (status.allocation is missing)")
    devices_part = allocation.get("devices") or {}
    if not isinstance(devices_part, dict):
        raise AllocationError(f"status.allocation.devices: must be an object, got {type(devices_part).__name__}")
    raw_configs = devices_part.get("config") or []
    if not isinstance(raw_configs, list):
        raise AllocationError(f"{_CONFIGS}: must be a list, got {type(raw_configs).__name__}")
    raw_results = devices_part.get("results") or []
    if not isinstance(raw_results, list):
        raise AllocationError(f"{_RESULTS}: must be a list, got {type(raw_results).__name__}")
    configs = _decode_configs(raw_configs)
    devices = _allocated_devices(raw_results, configs, inventory, pool)
    return ClaimPlan(
        uid=uid,
        namespace=namespace,
        name=name,
        devices=devices,
        allocation=allocation,
        mps_groups=_mps_groups(devices, uid),
        gpu_uses=tuple(dict.fromkeys(d.gpu_use for d in devices if not d.admin_access)),
        time_slices=tuple(
            dict.fromkeys(
                (d.target.gpu.uuid, d.sharing.time_slice_interval)
                for d in devices
                if d.sharing.strategy == Strategy.TIME_SLICING
            )
        ),
        migs=tuple(dict.fromkeys((d.device, key) for d in devices if (key := d.mig_key) is not None)),
    )


def _allocated_devices(
    results: list[Any], configs: list[tuple[tuple[str, ...], GpuConfig]], inventory: Inventory, pool: str
) -> tuple[AllocatedDevice, ...]:
    out: list[AllocatedDevice] = []
    seen: set[tuple[str, str, str]] = set()
    for i, result in enumerate(results):
        path = f"{_RESULTS}[{i}]"
        if not isinstance(result, dict) or result.get("driver") != DRIVER_NAME or result.get("pool") != pool:
            continue
        request, device = str(result.get("request", "")), str(result.get("device", ""))
        if not request or not device:
            raise AllocationError(f"{path}: request and device are required, got {result!r}")
        share_id = str(result.get("shareID") or "")
        key = (request, device, share_id)
        if key in seen:
            continue
        seen.add(key)
        try:
            target = resolve_device(inventory, device)
        except AllocationError as exc:
            raise AllocationError(f"{path}: {exc}") from None
        consumed = _consumed_memory(result, target, device, path)
        merged = merge_configs([cfg for reqs, cfg in configs if config_applies(reqs, request)])
        share = bool(share_id) and consumed is not None and consumed < target.memory_bytes
        if share and target.is_mig:
            raise AllocationError(
                f"{path}: a memory share of MIG device {device} is not supported; request the whole MIG device"
            )
        sharing = resolve_sharing(
            merged, memory_share=share, mig=target.is_mig, where=f"{path} (request {request}, device {device})"
        )
        out.append(
            AllocatedDevice(
                result_index=i,
                request=request,
                pool=pool,
                device=device,
                share_id=share_id,
                consumed_memory=consumed,
                admin_access=bool(result.get("adminAccess")),
                target=target,
                config=merged,
                sharing=sharing,
            )
        )
    return tuple(out)


def _mps_groups(devices: tuple[AllocatedDevice, ...], uid: str) -> tuple[MpsGroup, ...]:
    """The claim's MPS daemons: one per set of MPS settings its devices use, in allocation order.

    Devices with the same settings share a daemon whatever request they come from (a claim with two
    memory-share requests keeps one daemon, as a container using both needs); devices of another
    strategy have none, so one claim can mix MPS, time-slicing and exclusive use across requests.
    """
    groups: dict[tuple[int | None, int | None], list[AllocatedDevice]] = {}
    for d in devices:
        if d.sharing.strategy == Strategy.MPS:
            groups.setdefault((d.sharing.active_thread_percentage, d.sharing.pinned_memory_limit), []).append(d)
    return tuple(
        MpsGroup(uid if n == 0 else f"{uid}-mps{n}", tuple(members), percentage, limit)
        for n, ((percentage, limit), members) in enumerate(groups.items())
    )


def _consumed_memory(result: dict[str, Any], target: DeviceTarget, device: str, path: str) -> int | None:
    consumed = result.get("consumedCapacity") or {}
    if not isinstance(consumed, dict):
        raise AllocationError(f"{path}.consumedCapacity: must be an object, got {type(consumed).__name__}")
    if "memory" not in consumed:
        return None
    try:
        amount = quantity_bytes(consumed["memory"])
    except ValueError:
        raise AllocationError(
            f"{path}.consumedCapacity.memory: {consumed['memory']!r} is not a Kubernetes quantity"
        ) from None
    if amount <= 0:
        raise AllocationError(f"{path}.consumedCapacity.memory: must be larger than zero, got {consumed['memory']!r}")
    if amount > target.memory_bytes:
        raise AllocationError(
            f"{path}.consumedCapacity.memory: {consumed['memory']} is more than device {device} has "
            f"({format_bytes(target.memory_bytes, approximate=True)}); the ResourceSlice is out of date"
        )
    return amount

def _decode_configs(entries: list[Any]) -> list[tuple[tuple[str, ...], GpuConfig]]:
    """This driver's configs, class configs first then claim configs, each in list order."""
    decoded: list[tuple[int, int, tuple[str, ...], GpuConfig]] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        opaque = entry.get("opaque")
        if not isinstance(opaque, dict) or opaque.get("driver") != DRIVER_NAME:
            continue
        path = f"{_CONFIGS}[{i}].opaque.parameters"
        config = decode_gpu_config(opaque.get("parameters"), path)
        raw_requests = entry.get("requests") or []
        if not isinstance(raw_requests, list):
            raise AllocationError(f"{_CONFIGS}[{i}].requests: must be a list, got {type(raw_requests).__name__}")
        requests = tuple(str(r) for r in raw_requests)
        rank = 0 if entry.get("source") == "FromClass" else 1
        decoded.append((rank, i, requests, config))
    decoded.sort(key=lambda d: (d[0], d[1]))
    return [(requests, config) for _, _, requests, config in decoded]

__all__ = [
    "AllocatedDevice",
    "AllocationError",
    "ClaimPlan",
    "ConfigError",
    "DeviceTarget",
    "GpuUse",
    "MigKey",
    "MpsGroup",
    "allocation_record",
    "plan_allocation",
    "plan_claim",
    "resolve_device",
]
