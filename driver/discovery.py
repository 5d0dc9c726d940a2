"""Where an `Inventory` comes from: one entry point over the simulated and the NVML backends.

`load_inventory` is what the node agent and the CLI call. The backends live in `driver.simulated`
(profile files, the default) and `driver.nvml` (a real node); both finish their GPUs with
`driver.nvlink.assign_nvlink_islands`, so an island means the same thing whichever backend found it.
Imports go one way: this module imports the backends, they import neither it nor each other.
"""

from __future__ import annotations

import structlog

from driver.errors import DiscoveryError
from driver.model import Inventory
from driver.nvml import load_nvml_inventory
from driver.simulated import simulated_inventory

__all__ = ["DEFAULT_PROFILE", "load_inventory"]

log = structlog.get_logger(__name__)

DEFAULT_PROFILE = "dgx-h100-8"


def load_inventory(node_name: str, *, simulate: str | None = None, nvml: bool = False) -> Inventory:
    """Discover this node's GPUs.

    `simulate` is a built-in profile name (see `driver.simulated.builtin_profiles()`) or the path of a
    profile YAML; `nvml=True` reads the real GPUs through NVML. With neither, the simulated
    "dgx-h100-8" profile is used so that a laptop or CI run needs no GPU.
    """
    if not node_name:
        raise DiscoveryError("the node name is empty; pass the Kubernetes node name (e.g. --node-name)")
    if nvml and simulate is not None:
        raise DiscoveryError(f"choose one backend: NVML or the simulated profile {simulate!r}, not both")
    inventory = load_nvml_inventory(node_name) if nvml else simulated_inventory(node_name, simulate or DEFAULT_PROFILE)
    log.info(
        "inventory discovered",
        node=node_name,
        source=inventory.source,
        gpus=len(inventory.gpus),
        driver_version=inventory.driver_version,
    )
    return inventory
