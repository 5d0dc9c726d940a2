"""The opaque device config tessera accepts (`gpu.tessera.dev/v1alpha1`, kind `GpuConfig`).

Users put it in a DeviceClass (`spec.config[].opaque.parameters`) or a ResourceClaim
(`spec.devices.config[].opaque.parameters`); the scheduler copies both into the allocation. The
node agent decodes it strictly here, the admission webhook decodes it with the same function so a
claim that would fail at prepare time is rejected at admission instead.

Fields left out stay `None` so configs can be merged field by field (class first, claim last);
`resolve_sharing` then fills defaults that depend on the device the config lands on.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from driver import DRIVER_NAME
from driver.errors import InvalidInputError
from driver.names import base_request
from driver.quantity import parse_quantity, quantity_bytes

API_VERSION = f"{DRIVER_NAME}/v1alpha1"
KIND = "GpuConfig"

TIME_SLICE_INTERVALS = ("Default", "Short", "Medium", "Long")
MIB = 1024 * 1024


class Strategy(StrEnum):
    EXCLUSIVE = "Exclusive"
    MPS = "MPS"
    TIME_SLICING = "TimeSlicing"


class ConfigError(InvalidInputError):
    """A config value tessera cannot use; `field_path` points at it in the object the user wrote."""

    reason = "config"

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field_path = field_path
        self.message = message


@dataclass(frozen=True)
class MpsSettings:
    active_thread_percentage: int | None = None
    pinned_device_memory_limit: str | None = None  # a Kubernetes quantity, as written


@dataclass(frozen=True)
class TimeSlicingSettings:
    interval: str | None = None


@dataclass(frozen=True)
class SharingConfig:
    strategy: Strategy | None = None
    mps: MpsSettings | None = None
    time_slicing: TimeSlicingSettings | None = None
    total_memory: str | None = None  # a Kubernetes quantity, as written
    same_nvlink_island: bool | None = None


@dataclass(frozen=True)
class GpuConfig:
    sharing: SharingConfig = field(default_factory=SharingConfig)

    def merged_with(self, later: GpuConfig) -> GpuConfig:
        """This config overlaid by `later`: every field `later` sets wins.

        When `later` switches to a different strategy, the settings of the earlier strategy are
        dropped: a class that says "MPS, 50% of the SMs" and a claim that says "TimeSlicing" mean
        time-slicing, not a contradiction the user has to untangle.
        """
        a, b = self.sharing, later.sharing
        mps, time_slicing = a.mps, a.time_slicing
        if b.strategy is not None and b.strategy != a.strategy:
            if b.strategy != Strategy.MPS:
                mps = None
            if b.strategy != Strategy.TIME_SLICING:
                time_slicing = None
        if b.mps is not None:
            mps = MpsSettings(
                b.mps.active_thread_percentage
                if b.mps.active_thread_percentage is not None
                else (mps.active_thread_percentage if mps else None),
                b.mps.pinned_device_memory_limit
                if b.mps.pinned_device_memory_limit is not None
                else (mps.pinned_device_memory_limit if mps else None),
            )
        if b.time_slicing is not None:
            time_slicing = TimeSlicingSettings(
                b.time_slicing.interval
                if b.time_slicing.interval is not None
                else (time_slicing.interval if time_slicing else None)
            )
        return GpuConfig(
            SharingConfig(
                strategy=b.strategy if b.strategy is not None else a.strategy,
                mps=mps,
                time_slicing=time_slicing,
                total_memory=b.total_memory if b.total_memory is not None else a.total_memory,
                same_nvlink_island=b.same_nvlink_island if b.same_nvlink_island is not None else a.same_nvlink_island,
            )
        )


@dataclass(frozen=True)
class EffectiveSharing:
    """How one allocated device is shared, after merging and defaults."""

    strategy: Strategy
    active_thread_percentage: int | None = None  # MPS only; None = every SM
    time_slice_interval: str = "Default"  # TimeSlicing only
    pinned_memory_limit: int | None = None  # MPS only, bytes per device and client; None = what the device has


# --- strict decoding --------------------------------------------------------------------------


def _show(value: object) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _check_fields(obj: dict[str, Any], allowed: tuple[str, ...], path: str) -> None:
    for key in obj:
        if key in allowed:
            continue
        # NVIDIA's driver spells these mpsConfig / timeSlicingConfig; point users coming from it home
        hint = difflib.get_close_matches(str(key), allowed, n=1) or [
            a for a in allowed if str(key).lower().startswith(a.lower())
        ]
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        raise ConfigError(f"{path}.{key}", f"unknown field (allowed here: {', '.join(sorted(allowed))}){suggestion}")


def _object(value: object, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(path, f"must be an object, got {_show(value)}")
    return value


def decode_gpu_config(raw: object, path: str) -> GpuConfig:
    """Decode `opaque.parameters` strictly; `path` is where `raw` sits, used as the prefix of every error."""
    obj = _object(raw, path)
    _check_fields(obj, ("apiVersion", "kind", "sharing"), path)
    if "apiVersion" not in obj:
        raise ConfigError(f"{path}.apiVersion", f"is required; set it to {API_VERSION}")
    if obj["apiVersion"] != API_VERSION:
        raise ConfigError(f"{path}.apiVersion", f"must be {API_VERSION}, got {_show(obj['apiVersion'])}")
    if "kind" not in obj:
        raise ConfigError(f"{path}.kind", f"is required; set it to {KIND}")
    if obj["kind"] != KIND:
        raise ConfigError(f"{path}.kind", f"must be {KIND}, got {_show(obj['kind'])}")
    if "sharing" not in obj or obj["sharing"] is None:
        return GpuConfig()
    return GpuConfig(_decode_sharing(obj["sharing"], f"{path}.sharing"))


def _decode_sharing(raw: object, path: str) -> SharingConfig:
    obj = _object(raw, path)
    _check_fields(obj, ("strategy", "mps", "timeSlicing", "totalMemory", "sameNVLinkIsland"), path)
    strategy: Strategy | None = None
    if obj.get("strategy") is not None:
        value = obj["strategy"]
        if value not in tuple(Strategy):
            choices = ", ".join(s.value for s in Strategy)
            raise ConfigError(f"{path}.strategy", f"must be one of {choices}, got {_show(value)}")
        strategy = Strategy(value)

    mps: MpsSettings | None = None
    if obj.get("mps") is not None:
        if strategy is not None and strategy != Strategy.MPS:
            raise ConfigError(f"{path}.mps", f"only applies to strategy MPS, but strategy is {strategy.value}")
        mps = _decode_mps(obj["mps"], f"{path}.mps")

    time_slicing: TimeSlicingSettings | None = None
    if obj.get("timeSlicing") is not None:
        if strategy is not None and strategy != Strategy.TIME_SLICING:
            raise ConfigError(
                f"{path}.timeSlicing", f"only applies to strategy TimeSlicing, but strategy is {strategy.value}"
            )
        time_slicing = _decode_time_slicing(obj["timeSlicing"], f"{path}.timeSlicing")
    if mps is not None and time_slicing is not None:
        raise ConfigError(path, "mps and timeSlicing exclude each other; keep the one matching sharing.strategy")

    total_memory: str | None = None
    if obj.get("totalMemory") is not None:
        value = obj["totalMemory"]
        try:
            amount = parse_quantity(value)
        except ValueError:
            raise ConfigError(
                f"{path}.totalMemory", f"must be a Kubernetes quantity such as 16Gi, got {_show(value)}"
            ) from None
        if amount.sign() <= 0:
            raise ConfigError(f"{path}.totalMemory", f"must be larger than zero, got {_show(value)}")
        total_memory = str(value)

    same_island: bool | None = None
    if obj.get("sameNVLinkIsland") is not None:
        value = obj["sameNVLinkIsland"]
        if not isinstance(value, bool):
            raise ConfigError(f"{path}.sameNVLinkIsland", f"must be true or false, got {_show(value)}")
        same_island = value
    return SharingConfig(strategy, mps, time_slicing, total_memory, same_island)


def _decode_mps(raw: object, path: str) -> MpsSettings:
    obj = _object(raw, path)
    _check_fields(obj, ("activeThreadPercentage", "pinnedDeviceMemoryLimit"), path)
    value = obj.get("activeThreadPercentage")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100):
        raise ConfigError(f"{path}.activeThreadPercentage", f"must be an integer from 1 to 100, got {_show(value)}")
    limit = obj.get("pinnedDeviceMemoryLimit")
    if limit is not None:
        try:
            amount = parse_quantity(limit)
        except ValueError:
            raise ConfigError(
                f"{path}.pinnedDeviceMemoryLimit", f"must be a Kubernetes quantity such as 10Gi, got {_show(limit)}"
            ) from None
        if amount.sign() <= 0 or quantity_bytes(str(limit)) < MIB:
            raise ConfigError(
                f"{path}.pinnedDeviceMemoryLimit", f"must be at least 1Mi (MPS's smallest limit), got {_show(limit)}"
            )
        limit = str(limit)
    return MpsSettings(value, limit)


def _decode_time_slicing(raw: object, path: str) -> TimeSlicingSettings:
    obj = _object(raw, path)
    _check_fields(obj, ("interval",), path)
    value = obj.get("interval")
    if value is None:
        return TimeSlicingSettings()
    if value not in TIME_SLICE_INTERVALS:
        raise ConfigError(f"{path}.interval", f"must be one of {', '.join(TIME_SLICE_INTERVALS)}, got {_show(value)}")
    return TimeSlicingSettings(str(value))


# --- applying configs to devices --------------------------------------------------------------


def config_applies(config_requests: tuple[str, ...], request: str) -> bool:
    """Whether a config entry with `requests` covers an allocation result for `request` ("req" or "req/sub")."""
    if not config_requests:
        return True
    return request in config_requests or base_request(request) in config_requests


def merge_configs(configs: list[GpuConfig]) -> GpuConfig:
    """Overlay configs in order (class configs first, then claim configs): later wins per field."""
    merged = GpuConfig()
    for config in configs:
        merged = merged.merged_with(config)
    return merged


def resolve_sharing(config: GpuConfig, *, memory_share: bool, mig: bool, where: str) -> EffectiveSharing:
    """The sharing a device gets; ConfigError(where, ...) when the merged config cannot apply to it.

    `memory_share`: the allocation consumed only part of the card's memory, which only an MPS
    daemon can enforce. `mig`: the device is a MIG instance, which the hardware already isolates.
    """
    sharing = config.sharing
    strategy = sharing.strategy or (Strategy.MPS if memory_share else Strategy.EXCLUSIVE)
    if memory_share and strategy != Strategy.MPS:
        raise ConfigError(
            where,
            f"a memory share is enforced by an MPS daemon, so sharing.strategy must be MPS (or left out), "
            f"got {strategy.value}; request the whole device to use {strategy.value}",
        )
    if mig and strategy == Strategy.TIME_SLICING:
        raise ConfigError(where, "MIG devices cannot be time-sliced; use Exclusive or MPS for MIG devices")
    if sharing.mps is not None and strategy != Strategy.MPS:
        raise ConfigError(where, f"sharing.mps is set but the strategy is {strategy.value}; set strategy MPS")
    if sharing.time_slicing is not None and strategy != Strategy.TIME_SLICING:
        raise ConfigError(
            where, f"sharing.timeSlicing is set but the strategy is {strategy.value}; set strategy TimeSlicing"
        )
    effective = EffectiveSharing(strategy)
    if strategy == Strategy.MPS and sharing.mps is not None:
        limit = sharing.mps.pinned_device_memory_limit
        effective = replace(
            effective,
            active_thread_percentage=sharing.mps.active_thread_percentage,
            pinned_memory_limit=quantity_bytes(limit) if limit is not None else None,
        )
    if strategy == Strategy.TIME_SLICING and sharing.time_slicing is not None:
        effective = replace(effective, time_slice_interval=sharing.time_slicing.interval or "Default")
    return effective
