"""The attribute schema tessera publishes on its devices, and the conversion of inventory facts into it.

Every device of a given `type` carries the complete set of attributes listed for that type in
`DEVICE_ATTRIBUTES`, so a CEL selector that tests `type` first can never hit a missing key (a missing
key is a scheduling-wide runtime error, not `false`). The one exception is in `WHEN_KNOWN_ATTRIBUTES`:
the standard `resource.kubernetes.io/numaNode`, which Kubernetes has drivers omit where the platform
reports no NUMA node (KEP-6072); tessera's own `numaNode` is always there (-1 then). Values are converted into what the
resource.k8s.io/v1 API accepts: strings of at most 64 bytes and strict semver versions.
docs/attributes.md is the user-facing reference for this module.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import structlog

from driver.errors import InvalidInputError
from driver.model import Gpu, Inventory

log = structlog.get_logger(__name__)

ValueKind = Literal["int", "bool", "string", "version"]
DeviceType = Literal["gpu", "mig"]

# The domain of the attributes Kubernetes itself standardises (k8s.io/dynamic-resource-allocation/deviceattribute).
STANDARD_DOMAIN = "resource.kubernetes.io"
PCI_BUS_ID = f"{STANDARD_DOMAIN}/pciBusID"
PCIE_ROOT = f"{STANDARD_DOMAIN}/pcieRoot"
NUMA_NODE = f"{STANDARD_DOMAIN}/numaNode"

MAX_STRING_BYTES = 64

_COMMON: dict[str, tuple[ValueKind, str]] = {
    "type": ("string", 'device type: "gpu" for a whole GPU, "mig" for a MIG partition'),
    "productName": ("string", "GPU product name as NVML reports it (the parent's, for a MIG device)"),
    "brand": ("string", "GPU brand as NVML reports it, e.g. Nvidia, Tesla"),
    "architecture": ("string", "GPU architecture, e.g. Hopper, Ampere, Turing"),
    "cudaComputeCapability": ("version", "CUDA compute capability as semver, e.g. 9.0.0"),
    "driverVersion": ("version", "NVIDIA kernel driver version as semver, leading zeros removed"),
    "cudaDriverVersion": ("version", "highest CUDA version the driver supports, as semver, e.g. 12.4.0"),
    "nvlinkIsland": ("string", "id of the set of GPUs joined by NVLink; a GPU without NVLink is its own island"),
    "numaNode": ("int", "NUMA node of the GPU's PCI device, -1 when the platform reports none"),
    PCI_BUS_ID: ("string", "PCI bus id (extended BDF) of the physical GPU, e.g. 0000:18:00.0"),
    PCIE_ROOT: ("string", "PCIe root complex of the physical GPU, e.g. pci0000:17"),
}

_GPU_ONLY: dict[str, tuple[ValueKind, str]] = {
    "uuid": ("string", "GPU UUID, GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"),
    "migCapable": ("bool", "whether the GPU supports MIG"),
    "migEnabled": ("bool", "whether MIG mode is currently enabled on the GPU"),
    "nvlinkPeers": ("int", "number of other GPUs reachable over active NVLink"),
}

_MIG_ONLY: dict[str, tuple[ValueKind, str]] = {
    "profile": ("string", "MIG profile name, e.g. 1g.10gb"),
    "placement": ("int", "first memory slice the partition occupies"),
    "parentUUID": ("string", "UUID of the physical GPU the partition belongs to"),
}

# Published attribute schema per device type: name (as it appears in the slice) -> (value kind, description).
DEVICE_ATTRIBUTES: dict[str, dict[str, tuple[ValueKind, str]]] = {
    "gpu": {**_COMMON, **_GPU_ONLY},
    "mig": {**_COMMON, **_MIG_ONLY},
}

# Published on every device of both types where the value is known, and omitted where it is not.
WHEN_KNOWN_ATTRIBUTES: dict[str, tuple[ValueKind, str]] = {
    NUMA_NODE: ("int", "NUMA node of the GPU's PCI device (the Kubernetes-standard name, KEP-6072); absent when "
                       "the platform reports none"),
}

# Published capacities (the same on both device types): name -> description.
DEVICE_CAPACITIES: dict[str, str] = {
    "memory": "device memory in bytes",
    "multiprocessors": "streaming multiprocessors (SMs) of the GPU or partition",
}


def type_specific_attributes() -> dict[str, tuple[str, ...]]:
    """Attributes that only some device types carry: name -> the types that carry it.

    Selectors must guard these (`"uuid" in device.attributes["gpu.tessera.dev"] && ...`) unless they
    have already restricted `type`.
    """
    every = set.intersection(*(set(attrs) for attrs in DEVICE_ATTRIBUTES.values()))
    result: dict[str, tuple[str, ...]] = {}
    for dtype, attrs in DEVICE_ATTRIBUTES.items():
        for name in attrs:
            if name not in every:
                result[name] = (*result.get(name, ()), dtype)
    return result


class AttributeValueError(InvalidInputError):
    """An inventory fact that cannot be published as a valid attribute value."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field_path = field_path
        self.message = message


_VERSIONISH = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?((?:\.\d+)*)\Z")


def to_semver(raw: str, field_path: str) -> str:
    """Turn an NVML-style version into strict semver 2.0.0.

    "12.4" -> "12.4.0", "9.0" -> "9.0.0", "535.104.05" -> "535.104.5" (semver forbids leading zeros, and
    NVIDIA pads the last driver component), "550.54.15" unchanged. A fourth and later component becomes
    build metadata ("31.0.15.3640" -> "31.0.15+3640"), which semver ignores when comparing.
    """
    m = _VERSIONISH.match(raw.strip())
    if m is None:
        raise AttributeValueError(
            field_path,
            f"{raw!r} is not a dotted numeric version; expected something like 550.54.15 or 12.4",
        )
    parts = [str(int(p)) if p is not None else "0" for p in m.group(1, 2, 3)]
    version = ".".join(parts)
    extra = m.group(4)
    if extra:
        version += "+" + extra.lstrip(".")
    return version


def clip_string(value: str, field_path: str) -> str:
    """A string value cut to the API's 64-byte limit (on a UTF-8 boundary), logging when it had to cut."""
    encoded = value.encode()
    if len(encoded) <= MAX_STRING_BYTES:
        return value
    clipped = encoded[:MAX_STRING_BYTES].decode(errors="ignore")
    log.warning("attribute value shortened to the API limit", field=field_path, original=value, published=clipped)
    return clipped


def _value(kind: ValueKind, value: Any) -> dict[str, Any]:
    return {kind: value}


def _common_values(inventory: Inventory, gpu: Gpu, device_type: DeviceType) -> dict[str, dict[str, Any]]:
    path = f"gpus[{gpu.index}]"
    return {
        "type": _value("string", device_type),
        "productName": _value("string", clip_string(gpu.product_name, f"{path}.product_name")),
        "brand": _value("string", clip_string(gpu.brand, f"{path}.brand")),
        "architecture": _value("string", clip_string(gpu.architecture, f"{path}.architecture")),
        "cudaComputeCapability": _value(
            "version", to_semver(gpu.cuda_compute_capability, f"{path}.cuda_compute_capability")
        ),
        "driverVersion": _value("version", to_semver(inventory.driver_version, "inventory.driver_version")),
        "cudaDriverVersion": _value(
            "version", to_semver(inventory.cuda_driver_version, "inventory.cuda_driver_version")
        ),
        "nvlinkIsland": _value("string", clip_string(gpu.nvlink_island, f"{path}.nvlink_island")),
        "numaNode": _value("int", gpu.numa_node),
        PCI_BUS_ID: _value("string", clip_string(gpu.pci_bus_id.lower(), f"{path}.pci_bus_id")),
        PCIE_ROOT: _value("string", clip_string(gpu.pcie_root, f"{path}.pcie_root")),
    }


def gpu_attributes(inventory: Inventory, gpu: Gpu) -> dict[str, dict[str, Any]]:
    """The attributes of the whole-GPU device `gpu-<index>`."""
    path = f"gpus[{gpu.index}]"
    attrs = _common_values(inventory, gpu, "gpu")
    attrs.update(
        {
            "uuid": _value("string", clip_string(gpu.uuid, f"{path}.uuid")),
            "migCapable": _value("bool", gpu.mig_capable),
            "migEnabled": _value("bool", gpu.mig_enabled),
            "nvlinkPeers": _value("int", gpu.nvlink_peers),
        }
    )
    return _with_known(gpu, _in_schema_order("gpu", attrs))


def mig_attributes(inventory: Inventory, gpu: Gpu, profile: str, placement: int) -> dict[str, dict[str, Any]]:
    """The attributes of a MIG device (an existing instance or a placement that can be created)."""
    path = f"gpus[{gpu.index}]"
    attrs = _common_values(inventory, gpu, "mig")
    attrs.update(
        {
            "profile": _value("string", clip_string(profile, f"{path}.mig.profile")),
            "placement": _value("int", placement),
            "parentUUID": _value("string", clip_string(gpu.uuid, f"{path}.uuid")),
        }
    )
    return _with_known(gpu, _in_schema_order("mig", attrs))


def _with_known(gpu: Gpu, attrs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`attrs` plus the WHEN_KNOWN_ATTRIBUTES this GPU has a value for."""
    if gpu.numa_node >= 0:
        attrs[NUMA_NODE] = _value("int", gpu.numa_node)
    return attrs


def _in_schema_order(device_type: DeviceType, attrs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    schema = DEVICE_ATTRIBUTES[device_type]
    if set(attrs) != set(schema):
        # A programming error: the schema and the builder drifted apart.
        raise AssertionError(f"{device_type} attributes {sorted(attrs)} differ from the schema {sorted(schema)}")
    for name, (kind, _) in schema.items():
        if kind not in attrs[name]:
            raise AssertionError(f"{device_type} attribute {name} is not a {kind}: {attrs[name]}")
    return {name: attrs[name] for name in schema}
