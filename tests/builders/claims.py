"""ResourceClaims as the scheduler allocates them, and the simulated inventory they point into."""

from __future__ import annotations

import functools
from typing import Any

from driver.config import API_VERSION
from driver.discovery import load_inventory

UID = "7c1d0c4e-2f7e-4a55-9c8e-1f2a3b4c5d6e"


@functools.cache
def inventory(profile: str = "dgx-h100-8"):
    return load_inventory("node-a", simulate=profile)


def result(device: str, request: str = "gpu", **extra: Any) -> dict[str, Any]:
    return {"request": request, "driver": "gpu.tessera.dev", "pool": "node-a", "device": device, **extra}


def share(device: str, memory: str, request: str = "gpu", share_id: str = "3f2c8a9e-5d41-4b7a-9e2f-6c0d1a2b3c4d"):
    return result(device, request, shareID=share_id, consumedCapacity={"memory": memory, "multiprocessors": "132"})


def gpu_config(source: str = "FromClaim", requests: tuple[str, ...] = (), driver: str = "gpu.tessera.dev", **sharing):
    entry: dict[str, Any] = {
        "source": source,
        "opaque": {
            "driver": driver,
            "parameters": {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": sharing},
        },
    }
    if requests:
        entry["requests"] = list(requests)
    return entry


def make_claim(
    results: list[dict[str, Any]], configs: list[dict[str, Any]] | None = None, uid: str = UID, name: str = "claim"
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "team-a", "name": name, "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": results, "config": configs or []}}},
    }
