"""Hand-made GPUs and inventories, for tests that need a node no simulated profile describes."""

from __future__ import annotations

import dataclasses
from typing import Any

from driver.model import Gpu, Inventory

MIB = 2**20


def make_gpu(index: int, **changes: Any) -> Gpu:
    gpu = Gpu(
        index=index,
        minor=index,
        uuid=f"GPU-{index:08x}-1111-4222-8333-444444444444",
        product_name="NVIDIA H100 80GB HBM3",
        brand="Nvidia",
        architecture="Hopper",
        cuda_compute_capability="9.0",
        memory_bytes=81559 * MIB,
        multiprocessors=132,
        pci_bus_id=f"0000:{index + 1:02x}:00.0",
        pcie_root=f"pci0000:{index:02x}",
        numa_node=index // 8,
        mig_capable=True,
        mig_enabled=False,
        mig_pending=False,
        nvlink_island="nvl-a",
        nvlink_peers=7,
    )
    return dataclasses.replace(gpu, **changes)


def make_inventory(*gpus: Gpu, node: str = "node-a", **changes: Any) -> Inventory:
    inv = Inventory(node_name=node, driver_version="550.54.15", cuda_driver_version="12.4", gpus=tuple(gpus),
                    source="test")
    return dataclasses.replace(inv, **changes)
