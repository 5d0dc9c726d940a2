"""What tessera knows about a node's GPUs, independent of how it was discovered.

Discovery backends (simulated profiles, NVML) produce an `Inventory`; everything downstream
(ResourceSlices, CDI specs, MIG management) reads only these types.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class MigInstance:
    """An existing MIG instance (GPU instance + compute instance) on a MIG-enabled GPU."""

    profile: str  # NVML profile name without the "MIG " prefix, e.g. "1g.10gb"
    placement_start: int  # first memory slice
    placement_size: int  # number of memory slices
    uuid: str  # "MIG-..." as NVML reports it
    memory_bytes: int
    multiprocessors: int
    gpu_instance_id: int
    compute_instance_id: int


@dataclass(frozen=True)
class Gpu:
    """One physical GPU as discovered on the node."""

    index: int  # NVML index; device name is gpu-<index>
    minor: int  # /dev/nvidia<minor>
    uuid: str  # "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
    product_name: str  # "NVIDIA H100 80GB HBM3"
    brand: str  # "Nvidia", "Tesla", ...
    architecture: str  # "Hopper", "Ampere", "Turing", "Ada Lovelace"
    cuda_compute_capability: str  # "9.0" as NVML reports it (major.minor)
    memory_bytes: int
    multiprocessors: int
    pci_bus_id: str  # extended BDF, lower case: "0000:18:00.0"
    pcie_root: str  # "pci0000:17"
    numa_node: int  # -1 when the platform does not report one
    mig_capable: bool
    mig_enabled: bool  # current MIG mode
    mig_pending: bool  # pending MIG mode (takes effect after a GPU reset)
    nvlink_island: str  # id of the connected component of NVLink; a GPU without NVLink is its own island
    nvlink_peers: int  # number of other GPUs reachable over active NVLink
    mig_instances: tuple[MigInstance, ...] = ()

    @property
    def device_name(self) -> str:
        return f"gpu-{self.index}"


@dataclass(frozen=True)
class Inventory:
    """Every GPU on one node plus the node-wide driver facts."""

    node_name: str
    driver_version: str  # NVML driver version, e.g. "550.54.15"
    cuda_driver_version: str  # "12.4" as NVML reports it (major.minor)
    gpus: tuple[Gpu, ...]
    source: str = "simulated"  # "simulated:<profile>" or "nvml"
    extra: dict[str, str] = field(default_factory=dict, compare=False)

    def gpu_by_index(self, index: int) -> Gpu:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise KeyError(f"no GPU with index {index} on node {self.node_name}")

    def gpu_by_uuid(self, uuid: str) -> Gpu:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise KeyError(f"no GPU with uuid {uuid} on node {self.node_name}")
