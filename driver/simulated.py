"""The simulated discovery backend: a node described by a profile file instead of NVML.

It is the default backend, so that laptops, CI and demos run the whole driver without a GPU.
Built-in profiles ship in `driver/profiles/<name>.yaml`; `--simulate` takes one of their names or
the path of your own file.

Profile format (YAML; unknown fields are errors, so a typo never silently changes the node)::

    description: free text                     # optional
    driverVersion: "550.54.15"                 # NVML driver version, required
    cudaDriverVersion: "12.4"                  # CUDA driver API version (major.minor), required
    gpus:                                      # required, at least one entry
      - count: 8                               # optional, default 1: this many identical GPUs
        productName: NVIDIA H100 80GB HBM3     # as NVML reports it; picks the MIG table
        brand: Nvidia
        architecture: Hopper
        cudaComputeCapability: "9.0"           # a string: quote it, or YAML reads a number
        memory: 81559Mi                        # bytes, as an integer or a quantity (Ki/Mi/Gi/Ti, k/M/G/T)
        multiprocessors: 132
        pciBusId: ["0000:18:00.0", ...]        # optional: one value, or a list of `count` values
        pcieRoot: ["pci0000:15", ...]          # optional: one value, or a list of `count` values
        numaNode: [0, 0, 0, 0, 1, 1, 1, 1]     # optional: one value for all, or a list; -1 = the platform reports none
        minor: [0, 1, 2, 3, 4, 5, 6, 7]        # optional: one value, or a list of `count` values
        migCapable: true                       # optional, default false
        migEnabled: false                      # optional, default false (current MIG mode)
        migPending: false                      # optional, default = migEnabled (mode after the next reset)
        migInstances:                          # optional, only with migEnabled: existing MIG instances
          - {profile: 3g.40gb, placement: 0}   #   placement = first memory slice (driver/mig.py tables)
          - {profile: 1g.10gb, placement: 6}
    nvlink:                                    # optional; without it no GPU has NVLink
      switch: all                              # GPUs on the NVSwitch fabric: "all" or a list of indices
      links: [[0, 1], [2, 3]]                  # direct GPU-to-GPU links (bridges), by index

GPUs are indexed 0, 1, 2, ... in the order the entries (and their `count`) list them; error
messages name the entry as written, e.g. `gpus[2].memory`. Defaults for a GPU at index i:
`minor` = i, `numaNode` = 0, `pciBusId` = `0000:<i+1 in hex>:00.0` and `pcieRoot` derived from
the bus id (`pci<domain>:<bus>`). MIG instances of a `count` entry are created on each of its
GPUs. NVLink islands are the connected components of the links; every GPU on the switch reaches
every other one.

UUIDs are derived from (node name, GPU index) with uuid5, and MIG UUIDs from (node name, GPU
index, profile, placement): the same node always gets the same ids, two nodes never share one.
"""

from __future__ import annotations

import difflib
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml

from driver import mig, safeyaml
from driver.errors import DiscoveryError
from driver.model import Gpu, Inventory, MigInstance
from driver.nvlink import assign_nvlink_islands
from driver.quantity import quantity_bytes_or_none

# Fixed namespace so that simulated UUIDs are reproducible everywhere.
_UUID_NAMESPACE = uuid.UUID("5d1f3c2e-8a4b-4e6f-9c0d-7b2a1e3f4c5d")

_BUS_ID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")
_PCIE_ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}\Z")
_MAJOR_MINOR = re.compile(r"^\d+\.\d+\Z")
_DRIVER_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?\Z")
# Attribute strings are limited to 64 characters by the ResourceSlice API.
_MAX_STRING = 64

_TOP_FIELDS = ("description", "driverVersion", "cudaDriverVersion", "gpus", "nvlink")
_GPU_FIELDS = (
    "count",
    "productName",
    "brand",
    "architecture",
    "cudaComputeCapability",
    "memory",
    "multiprocessors",
    "pciBusId",
    "pcieRoot",
    "numaNode",
    "minor",
    "migCapable",
    "migEnabled",
    "migPending",
    "migInstances",
)
_MIG_FIELDS = ("profile", "placement")
_NVLINK_FIELDS = ("switch", "links")

T = TypeVar("T")


def gpu_uuid(node_name: str, index: int) -> str:
    """The simulated UUID of GPU `index` on `node_name`, formatted like NVML's ("GPU-...")."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node_name}/gpu/{index}')}"


def mig_uuid(node_name: str, index: int, profile: str, placement: int) -> str:
    """The simulated UUID of a MIG instance, formatted like NVML's ("MIG-...")."""
    return f"MIG-{uuid.uuid5(_UUID_NAMESPACE, f'{node_name}/gpu/{index}/mig/{profile}/{placement}')}"


@dataclass(frozen=True)
class MigSpec:
    profile: str
    placement: int


@dataclass(frozen=True)
class GpuSpec:
    """One GPU of a profile, before it is placed on a node (no UUIDs, no islands yet)."""

    index: int
    minor: int
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: str
    memory_bytes: int
    multiprocessors: int
    pci_bus_id: str
    pcie_root: str
    numa_node: int
    mig_capable: bool
    mig_enabled: bool
    mig_pending: bool
    mig_instances: tuple[MigSpec, ...]


@dataclass(frozen=True)
class Profile:
    """A parsed, validated profile file."""

    name: str
    description: str
    driver_version: str
    cuda_driver_version: str
    gpus: tuple[GpuSpec, ...]
    nvlink_links: tuple[tuple[int, int], ...]
    nvlink_switch: tuple[int, ...]


def builtin_profiles() -> list[str]:
    """Names of the profiles shipped with tessera."""
    folder = resources.files("driver") / "profiles"
    return sorted(entry.name.removesuffix(".yaml") for entry in folder.iterdir() if entry.name.endswith(".yaml"))


def load_profile(ref: str) -> Profile:
    """Read a profile by built-in name or by path; raises DiscoveryError naming the file and field."""
    if _looks_like_path(ref):
        path = Path(ref)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise DiscoveryError(f"cannot read the profile file: {exc.strerror or exc}", source=str(path)) from exc
        return parse_profile(text, source=str(path), name=path.stem)
    if ref not in builtin_profiles():
        raise DiscoveryError(
            f"unknown simulated profile {ref!r}; built-in profiles are {', '.join(builtin_profiles())}, "
            "or give the path of a profile YAML file"
        )
    text = (resources.files("driver") / "profiles" / f"{ref}.yaml").read_text(encoding="utf-8")
    return parse_profile(text, source=f"built-in profile {ref}", name=ref)


def simulated_inventory(node_name: str, profile: str | Profile) -> Inventory:
    """The inventory a node named `node_name` would report if it were the machine `profile` describes."""
    spec = profile if isinstance(profile, Profile) else load_profile(profile)
    gpus = [_place_gpu(node_name, gpu) for gpu in spec.gpus]
    return Inventory(
        node_name=node_name,
        driver_version=spec.driver_version,
        cuda_driver_version=spec.cuda_driver_version,
        gpus=assign_nvlink_islands(gpus, spec.nvlink_links, spec.nvlink_switch),
        source=f"simulated:{spec.name}",
        extra={"description": spec.description} if spec.description else {},
    )


def _place_gpu(node_name: str, spec: GpuSpec) -> Gpu:
    layout = mig.layout_for(spec.product_name)
    instances: list[MigInstance] = []
    for gi_id, inst in enumerate(spec.mig_instances, start=1):
        assert layout is not None  # parse_profile rejects instances on GPUs without a MIG table
        profile = layout.profile(inst.profile)
        instances.append(
            MigInstance(
                profile=profile.name,
                placement_start=inst.placement,
                placement_size=profile.memory_slices,
                uuid=mig_uuid(node_name, spec.index, profile.name, inst.placement),
                memory_bytes=profile.memory_bytes,
                multiprocessors=profile.multiprocessors,
                gpu_instance_id=gi_id,
                compute_instance_id=0,
            )
        )
    return Gpu(
        index=spec.index,
        minor=spec.minor,
        uuid=gpu_uuid(node_name, spec.index),
        product_name=spec.product_name,
        brand=spec.brand,
        architecture=spec.architecture,
        cuda_compute_capability=spec.cuda_compute_capability,
        memory_bytes=spec.memory_bytes,
        multiprocessors=spec.multiprocessors,
        pci_bus_id=spec.pci_bus_id,
        pcie_root=spec.pcie_root,
        numa_node=spec.numa_node,
        mig_capable=spec.mig_capable,
        mig_enabled=spec.mig_enabled,
        mig_pending=spec.mig_pending,
        nvlink_island="",  # filled in by assign_nvlink_islands
        nvlink_peers=0,
        mig_instances=tuple(instances),
    )


def _looks_like_path(ref: str) -> bool:
    # A bare built-in name wins over a same-named file in the working directory.
    if "/" in ref or ref.endswith((".yaml", ".yml")):
        return True
    return ref not in builtin_profiles() and Path(ref).is_file()


# ---------------------------------------------------------------------------------------------
# Parsing. Every check raises DiscoveryError(source=<file>, field_path=<e.g. gpus[2].memory>).


class _Reader:
    """Typed access to one YAML mapping, with the field path and file for error messages."""

    def __init__(self, raw: object, path: str, source: str, known: Sequence[str]) -> None:
        self.path = path
        self.source = source
        if not isinstance(raw, Mapping):
            raise self.error("", f"expected a mapping of fields, got {_describe(raw)}")
        self.raw: Mapping[Any, Any] = raw
        for key in raw:
            if key not in known:
                hint = difflib.get_close_matches(str(key), known, n=1)
                did_you_mean = f"did you mean {hint[0]!r}? " if hint else ""
                raise self.error(str(key), f"unknown field; {did_you_mean}known fields are {', '.join(known)}")

    def field(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str, message: str) -> DiscoveryError:
        return DiscoveryError(message, source=self.source, field_path=self.field(key) if key else self.path)

    def has(self, key: str) -> bool:
        return key in self.raw

    def get(self, key: str, check: Callable[[object], T | None], expected: str, default: T | None = None) -> T:
        if key not in self.raw:
            if default is None:
                raise self.error(key, f"required field is missing; expected {expected}")
            return default
        value = check(self.raw[key])
        if value is None:
            raise self.error(key, f"expected {expected}, got {_describe(self.raw[key])}")
        return value


def _describe(value: object) -> str:
    if value is None:
        return "nothing (null)"
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a mapping"}
    return f"{kind.get(type(value), type(value).__name__)} {value!r}"


def _as_str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _as_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _as_bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _int_at_least(minimum: int) -> Callable[[object], int | None]:
    def check(value: object) -> int | None:
        number = _as_int(value)
        return number if number is not None and number >= minimum else None

    return check


def _as_bytes(value: object) -> int | None:
    # Kubernetes' own quantity grammar, so a profile takes any amount a ResourceSlice could publish.
    return quantity_bytes_or_none(value.strip() if isinstance(value, str) else value, whole=True)


def parse_profile(text: str, *, source: str, name: str) -> Profile:
    """Parse and validate profile YAML; `source` names the file in error messages."""
    try:
        raw = safeyaml.load(text)
    except safeyaml.YamlLimitError as exc:
        raise DiscoveryError(f"refused: {exc}", source=source) from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise DiscoveryError(f"not valid YAML{where}: {problem}", source=source) from exc
    top = _Reader(raw, "", source, _TOP_FIELDS)
    description = top.get("description", _as_str, "a string", default="")
    driver_version = top.get("driverVersion", _as_str, 'a string such as "550.54.15"')
    if not _DRIVER_VERSION.match(driver_version):
        raise top.error("driverVersion", f'expected a version such as "550.54.15", got {driver_version!r}')
    cuda_version = top.get("cudaDriverVersion", _as_str, 'a string such as "12.4" (quote it)')
    if not _MAJOR_MINOR.match(cuda_version):
        raise top.error("cudaDriverVersion", f'expected major.minor such as "12.4", got {cuda_version!r}')

    raw_gpus = top.get("gpus", lambda v: v if isinstance(v, list) and v else None, "a non-empty list of GPU entries")
    gpus: list[GpuSpec] = []
    for entry_index, raw_gpu in enumerate(raw_gpus):
        gpus.extend(_parse_gpu_entry(_Reader(raw_gpu, f"gpus[{entry_index}]", source, _GPU_FIELDS), len(gpus)))
    _check_unique(gpus, source)

    links: tuple[tuple[int, int], ...] = ()
    switch: tuple[int, ...] = ()
    if top.has("nvlink"):
        links, switch = _parse_nvlink(_Reader(top.raw["nvlink"], "nvlink", source, _NVLINK_FIELDS), len(gpus))
    return Profile(
        name=name,
        description=description,
        driver_version=driver_version,
        cuda_driver_version=cuda_version,
        gpus=tuple(gpus),
        nvlink_links=links,
        nvlink_switch=switch,
    )


def _per_gpu(
    entry: _Reader,
    key: str,
    *,
    count: int,
    check: Callable[[object], T | None],
    expected: str,
    default: Callable[[int], T],
) -> list[T]:
    """A field that takes one value for every GPU of the entry or a list with one value per GPU."""
    if not entry.has(key):
        return [default(i) for i in range(count)]
    raw = entry.raw[key]
    if isinstance(raw, list):
        if len(raw) != count:
            raise entry.error(key, f"expected {count} values (one per GPU, count is {count}), got {len(raw)}")
        values: list[T] = []
        for i, item in enumerate(raw):
            value = check(item)
            if value is None:
                raise entry.error(f"{key}[{i}]", f"expected {expected}, got {_describe(item)}")
            values.append(value)
        return values
    value = check(raw)
    if value is None:
        raise entry.error(key, f"expected {expected} or a list of {count} of them, got {_describe(raw)}")
    return [value] * count


def _parse_gpu_entry(entry: _Reader, first_index: int) -> list[GpuSpec]:
    count = entry.get("count", _int_at_least(1), "a positive integer", 1)

    def text(key: str, example: str) -> str:
        value = entry.get(key, _as_str, f"a string such as {example}")
        if len(value) > _MAX_STRING:
            limit = f"at most {_MAX_STRING} characters (a ResourceSlice attribute limit)"
            raise entry.error(key, f"{limit}, got {len(value)}")
        return value

    product_name = text("productName", '"NVIDIA H100 80GB HBM3"')
    brand = text("brand", '"Nvidia"')
    architecture = text("architecture", '"Hopper"')
    capability = entry.get(
        "cudaComputeCapability", _as_str, 'a string such as "9.0" (quote it so YAML keeps it a string)'
    )
    if not _MAJOR_MINOR.match(capability):
        raise entry.error("cudaComputeCapability", f'expected major.minor such as "9.0", got {capability!r}')
    memory = entry.get("memory", _as_bytes, "bytes as an integer or a quantity such as 81559Mi or 80Gi")
    if memory <= 0:
        raise entry.error("memory", f"expected a positive amount of memory, got {memory}")
    sms = entry.get("multiprocessors", _int_at_least(1), "a positive integer")

    indices = [first_index + i for i in range(count)]
    bus_ids = _per_gpu(
        entry,
        "pciBusId",
        count=count,
        check=_as_bus_id,
        expected='an extended BDF such as "0000:18:00.0"',
        default=lambda i: _default_bus_id(indices[i]),
    )
    roots = _per_gpu(
        entry,
        "pcieRoot",
        count=count,
        check=_as_pcie_root,
        expected='a PCIe root such as "pci0000:17"',
        default=lambda i: _root_of(bus_ids[i]),
    )
    numa_nodes = _per_gpu(
        entry,
        "numaNode",
        count=count,
        check=_int_at_least(-1),
        expected="a NUMA node number (-1 for none)",
        default=lambda i: 0,
    )
    minors = _per_gpu(
        entry,
        "minor",
        count=count,
        check=_int_at_least(0),
        expected="a device minor number >= 0",
        default=lambda i: indices[i],
    )

    mig_capable = entry.get("migCapable", _as_bool, "true or false", False)
    mig_enabled = entry.get("migEnabled", _as_bool, "true or false", False)
    mig_pending = entry.get("migPending", _as_bool, "true or false", mig_enabled)
    if (mig_enabled or mig_pending) and not mig_capable:
        raise entry.error(
            "migEnabled" if mig_enabled else "migPending",
            "MIG mode needs a MIG-capable GPU; set migCapable: true or turn MIG off",
        )
    instances = _parse_mig_instances(entry, product_name, mig_enabled)

    return [
        GpuSpec(
            index=indices[i],
            minor=minors[i],
            product_name=product_name,
            brand=brand,
            architecture=architecture,
            cuda_compute_capability=capability,
            memory_bytes=memory,
            multiprocessors=sms,
            pci_bus_id=bus_ids[i],
            pcie_root=roots[i],
            numa_node=numa_nodes[i],
            mig_capable=mig_capable,
            mig_enabled=mig_enabled,
            mig_pending=mig_pending,
            mig_instances=instances,
        )
        for i in range(count)
    ]


def _as_bus_id(value: object) -> str | None:
    if isinstance(value, str) and _BUS_ID.match(value.lower()):
        return value.lower()
    return None


def _as_pcie_root(value: object) -> str | None:
    if isinstance(value, str) and _PCIE_ROOT.match(value.lower()):
        return value.lower()
    return None


def _default_bus_id(index: int) -> str:
    domain, bus = divmod(index, 255)
    return f"{domain:04x}:{bus + 1:02x}:00.0"


def _root_of(bus_id: str) -> str:
    domain, bus, _ = bus_id.split(":")
    return f"pci{domain}:{bus}"


def _parse_mig_instances(entry: _Reader, product_name: str, mig_enabled: bool) -> tuple[MigSpec, ...]:
    if not entry.has("migInstances"):
        return ()
    raw = entry.raw["migInstances"]
    if not isinstance(raw, list):
        raise entry.error("migInstances", f"expected a list of {{profile, placement}} entries, got {_describe(raw)}")
    if raw and not mig_enabled:
        raise entry.error("migInstances", "MIG instances exist only in MIG mode; set migEnabled: true")
    layout = mig.layout_for(product_name)
    if raw and layout is None:
        raise entry.error("migInstances", f"tessera has no MIG table for {product_name!r}; remove the instances")
    assert layout is not None or not raw
    specs: list[MigSpec] = []
    used: list[tuple[int, int, str]] = []  # (first slice, last slice, path) of earlier instances
    compute = 0
    for i, raw_inst in enumerate(raw):
        inst = _Reader(raw_inst, entry.field(f"migInstances[{i}]"), entry.source, _MIG_FIELDS)
        name = inst.get("profile", _as_str, 'a MIG profile name such as "1g.10gb"')
        assert layout is not None
        try:
            profile = layout.profile(name)
        except KeyError:
            offered = ", ".join(p.name for p in layout.profiles)
            message = f"unknown MIG profile {name!r} for {product_name}; it offers {offered}"
            raise inst.error("profile", message) from None
        placement = inst.get("placement", _int_at_least(0), "the first memory slice, an integer >= 0")
        if placement not in profile.placements:
            valid = ", ".join(str(p) for p in profile.placements)
            raise inst.error("placement", f"{name} cannot start at memory slice {placement}; valid placements: {valid}")
        last = placement + profile.memory_slices - 1
        for first_used, last_used, other in used:
            if placement <= last_used and first_used <= last:
                raise inst.error(
                    "",
                    f"{name} at {placement} uses memory slices {placement}-{last}, "
                    f"which overlap {other} (slices {first_used}-{last_used})",
                )
        used.append((placement, last, inst.path))
        compute += profile.compute_slices
        if compute > layout.compute_slices:
            raise inst.error(
                "", f"the instances need {compute} compute slices; {product_name} has {layout.compute_slices}"
            )
        specs.append(MigSpec(profile.name, placement))
    return tuple(specs)


def _check_unique(gpus: Sequence[GpuSpec], source: str) -> None:
    for attr, key in (("pci_bus_id", "pciBusId"), ("minor", "minor")):
        seen: dict[object, int] = {}
        for gpu in gpus:
            value = getattr(gpu, attr)
            if value in seen:
                raise DiscoveryError(
                    f"GPU {gpu.index} has the same {key} {value!r} as GPU {seen[value]}; each GPU needs its own",
                    source=source,
                    field_path="gpus",
                )
            seen[value] = gpu.index


def _parse_nvlink(nvlink: _Reader, gpu_count: int) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...]]:
    valid = f"this profile has GPUs 0-{gpu_count - 1}"

    def gpu_index(value: object, path: str) -> int:
        index = _as_int(value)
        if index is None:
            raise nvlink.error(path, f"expected a GPU index, got {_describe(value)}")
        if not 0 <= index < gpu_count:
            raise nvlink.error(path, f"GPU index {index} does not exist; {valid}")
        return index

    switch: tuple[int, ...] = ()
    if nvlink.has("switch"):
        raw_switch = nvlink.raw["switch"]
        if raw_switch == "all":
            switch = tuple(range(gpu_count))
        elif isinstance(raw_switch, list):
            switch = tuple(gpu_index(v, f"switch[{i}]") for i, v in enumerate(raw_switch))
        else:
            raise nvlink.error("switch", f'expected "all" or a list of GPU indices, got {_describe(raw_switch)}')
    links: list[tuple[int, int]] = []
    if nvlink.has("links"):
        raw_links = nvlink.raw["links"]
        if not isinstance(raw_links, list):
            raise nvlink.error("links", f"expected a list of [a, b] GPU index pairs, got {_describe(raw_links)}")
        for i, pair in enumerate(raw_links):
            if not isinstance(pair, list) or len(pair) != 2:
                raise nvlink.error(f"links[{i}]", f"expected a pair [a, b] of GPU indices, got {_describe(pair)}")
            a, b = gpu_index(pair[0], f"links[{i}][0]"), gpu_index(pair[1], f"links[{i}][1]")
            if a == b:
                raise nvlink.error(f"links[{i}]", f"a link joins two different GPUs, got [{a}, {b}]")
            links.append((a, b))
    return tuple(links), switch
