"""Opaque `GpuConfig` in class and claim configs, decoded strictly with the node agent's own decoder
(driver.config), so a config that would fail at prepare time is rejected at admission."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.checks.findings import Finding, error
from driver import DRIVER_NAME


@dataclass(frozen=True)
class DecodedConfig:
    """One tessera config entry that decoded cleanly."""

    index: int
    path: str  # field path of `opaque.parameters`
    requests: tuple[str, ...]  # empty = applies to every request
    config: Any  # driver.config.GpuConfig


def decode_configs(configs: Any, path: str, *, in_class: bool) -> tuple[list[Finding], list[DecodedConfig]]:
    """Decode every `config[]` entry for driver gpu.tessera.dev at `path`; other drivers' entries are skipped."""
    from driver.config import ConfigError, decode_gpu_config

    findings: list[Finding] = []
    decoded: list[DecodedConfig] = []
    if configs is None:
        return findings, decoded
    if not isinstance(configs, list):
        return [error(path, "must be a list of {opaque: {driver, parameters}} entries")], decoded
    for i, entry in enumerate(configs):
        opaque = entry.get("opaque") if isinstance(entry, dict) else None
        if not isinstance(opaque, dict) or opaque.get("driver") != DRIVER_NAME:
            continue
        params_path = f"{path}[{i}].opaque.parameters"
        try:
            config = decode_gpu_config(opaque.get("parameters"), params_path)
        except ConfigError as exc:
            findings.append(error(exc.field_path, exc.message))
            continue
        if in_class:
            for field, value in (
                ("totalMemory", config.sharing.total_memory),
                ("sameNVLinkIsland", config.sharing.same_nvlink_island),
            ):
                if value is not None:
                    findings.append(
                        error(
                            f"{params_path}.sharing.{field}",
                            f"belongs in a ResourceClaim's config, next to the request it spreads over several "
                            f"cards; a DeviceClass config cannot set it (remove sharing.{field} here)",
                        )
                    )
        requests = entry.get("requests") or []
        if not isinstance(requests, list):
            findings.append(error(f"{path}[{i}].requests", f"must be a list of request names, got "
                                                          f"{type(requests).__name__}"))
            continue
        decoded.append(DecodedConfig(i, params_path, tuple(str(r) for r in requests), config))
    return findings, decoded


def sharing_findings(configs: list[DecodedConfig], request: str, body: Any, path: str,
                     device_class: Any = None) -> list[Finding]:
    """What the node agent would refuse about how request `request` (or "req/sub") is shared.

    The class's configs and then the claim's that apply to it are merged as the node agent merges
    them, and resolved for a memory share when the request names `capacity.requests.memory` (or a
    config spreads `totalMemory`, which becomes one): a share is enforced by MPS, so a strategy that
    is not MPS, or settings of a strategy that does not apply, are errors here rather than at
    prepare. Each request is resolved apart, so MPS, time-slicing and exclusive requests mix in one
    claim. Whether a device is a MIG instance is only known once allocated; prepare checks that part.
    """
    from driver.config import ConfigError, config_applies, decode_gpu_config, merge_configs, resolve_sharing

    applying = [c for c in configs if config_applies(c.requests, request)]
    class_configs = []
    for entry in _list(_obj(_obj(device_class).get("spec")).get("config")):
        opaque = entry.get("opaque") if isinstance(entry, dict) else None
        if isinstance(opaque, dict) and opaque.get("driver") == DRIVER_NAME:
            try:
                class_configs.append(decode_gpu_config(opaque.get("parameters"), "class config"))
            except ConfigError:
                continue  # the class's own admission reports it
    # a malformed request is reported by the request checks; here it only counts as no share
    capacity = _obj(_obj(_obj(body).get("capacity")).get("requests"))
    share = "memory" in capacity or any(c.config.sharing.total_memory for c in applying)
    merged = merge_configs([*class_configs, *(c.config for c in applying)])
    try:
        resolve_sharing(merged, memory_share=share, mig=False, where=path)
    except ConfigError as exc:
        setting = next((c for c in reversed(applying) if c.config.sharing.strategy is not None), None)
        where = f"{setting.path}.sharing.strategy" if setting is not None else path
        return [error(where, f'request "{request}": {exc.message}')]
    return []


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
