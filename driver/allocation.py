"""From a ResourceClaim, the devices this node must prepare and how each one is shared.

Pure: the claim dict and the node's Inventory in, a `ClaimAllocation` out. Only results of this
driver for this node's pool count; configs of other drivers are ignored. Every problem that would
make prepare fail is found here, before anything on the node is touched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from driver import DRIVER_NAME
from driver.config import (
    ConfigError,
    EffectiveSharing,
    GpuConfig,
    config_applies,
    decode_gpu_config,
    merge_configs,
    resolve_sharing,
)
from driver.errors import InvalidInputError
from driver.mig import MigProfile, layout_for
from driver.model import Gpu, Inventory, MigInstance
from driver.names import mig_profile_token
from driver.quantity import format_bytes, quantity_bytes

_GPU_NAME = re.compile(r"^gpu-(\d+)\Z")
_MIG_NAME = re.compile(r"^gpu-(\d+)-mig-([0-9a-z]+)-(\d+)\Z")
_RESULTS = "status.allocation.devices.results"
_CONFIGS = "status.allocation.devices.config"


class AllocationError(InvalidInputError):
    """The claim's allocation cannot be prepared on this node; the text says why and what to do."""


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
        return self.request.split("/", 1)[0]

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


@dataclass(frozen=True)
class ClaimAllocation:
    uid: str
    namespace: str
    name: str
    devices: tuple[AllocatedDevice, ...]


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


def parse_claim_allocation(
    claim: dict[str, Any], *, ref_uid: str, inventory: Inventory, pool: str, driver: str = DRIVER_NAME
) -> ClaimAllocation:
    """This node's share of a ResourceClaim's allocation, with merged configs; raises AllocationError/ConfigError."""
    meta = claim.get("metadata") or {}
    namespace, name, uid = str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", ""))
    if uid != ref_uid:
        raise AllocationError(
            f"ResourceClaim {namespace}/{name} has uid {uid or '<none>'} but kubelet asked for {ref_uid}: "
            "the claim was replaced (deleted and created again); kubelet retries with the new claim"
        )
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise AllocationError(f"ResourceClaim {namespace}/{name} is not allocated (status.allocation is missing)")
    devices_part = allocation.get("devices") or {}
    raw_configs = devices_part.get("config") or []
    if not isinstance(raw_configs, list):
        raise AllocationError(f"{_CONFIGS}: must be a list, got {type(raw_configs).__name__}")
    configs = _decode_configs(raw_configs, driver)

    out: list[AllocatedDevice] = []
    seen: set[tuple[str, str, str]] = set()
    for i, result in enumerate(devices_part.get("results") or []):
        path = f"{_RESULTS}[{i}]"
        if not isinstance(result, dict) or result.get("driver") != driver or result.get("pool") != pool:
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
    return ClaimAllocation(uid=uid, namespace=namespace, name=name, devices=tuple(out))


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


def _decode_configs(entries: list[Any], driver: str) -> list[tuple[tuple[str, ...], GpuConfig]]:
    """This driver's configs, class configs first then claim configs, each in list order."""
    decoded: list[tuple[int, int, tuple[str, ...], GpuConfig]] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        opaque = entry.get("opaque")
        if not isinstance(opaque, dict) or opaque.get("driver") != driver:
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
    "ClaimAllocation",
    "ConfigError",
    "DeviceTarget",
    "parse_claim_allocation",
    "resolve_device",
]
