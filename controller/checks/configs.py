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
