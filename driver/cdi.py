"""Per-claim CDI spec files: what a container gets when kubelet passes tessera's CDI device ids.

One JSON file per claim (`gpu.tessera.dev-claim_<uid>.json`) in the CDI spec directory, written
atomically because runtimes watch the directory and would pick up a half-written spec. A spec
holds one CDI device per allocated device (its device nodes, its request's device list, the MPS
pipe of its MPS group) plus claim-wide edits (control nodes, driver mounts) that the runtime
applies once whenever any device of the spec is injected.

Which GPUs a container sees is decided by the device nodes it gets, never by an environment
variable. Kubelet passes a container the CDI ids of the claims (or the one request of a claim) it
names, and the runtime merges their edits: device nodes add up, but an environment variable set
by two specs keeps only the value applied last (the CDI library replaces it by name). So tessera
sets no CUDA_VISIBLE_DEVICES, which would hide every other claim's GPUs from CUDA, and sets
NVIDIA_VISIBLE_DEVICES to `void`, the same value in every spec, which keeps an NVIDIA runtime hook
from adding GPUs of its own (CUDA images default it to `all`). Each request's devices are listed,
for people and tools, in a variable named after the claim and the request
(`TESSERA_DEVICES_<claim uid>_<request>`), so no claim's list replaces another's.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from driver import DRIVER_NAME
from driver.atomicfile import fsync_dir, write_atomic
from driver.errors import InvalidInputError

log = structlog.get_logger(__name__)

# The CDI vendor is the driver name, so a device id (`gpu.tessera.dev/claim=...`) says which driver made it.
CDI_VENDOR = DRIVER_NAME
CDI_CLASS = "claim"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"
SPEC_PREFIX = f"{CDI_VENDOR}-{CDI_CLASS}_"
SPEC_SUFFIX = ".json"

CONTROL_DEVICE_PATHS = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
REQUEST_DEVICES_PREFIX = "TESSERA_DEVICES_"

# Claim uids name files; anything but a plain token could climb out of the CDI directory.
_CLAIM_UID = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,126}[A-Za-z0-9])?\Z")
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?\Z")

# /proc/driver/nvidia-caps/mig-minors numbers every possible MIG capability in a fixed grid: per GPU
# minor 15 GPU instances, per GPU instance one access file followed by 8 compute instances.
_MIG_CAP_FIRST = 3
_MIG_CAP_PER_GI = 9
_MIG_CAP_PER_GPU = 15 * _MIG_CAP_PER_GI


class CdiError(InvalidInputError):
    """A spec tessera refuses to write (bad claim uid, bad device name)."""

    reason = "cdi"


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = ("ro", "nosuid", "nodev", "bind")

    def to_dict(self) -> dict[str, Any]:
        return {"hostPath": self.host_path, "containerPath": self.container_path, "options": list(self.options)}


@dataclass(frozen=True)
class DeviceNode:
    """A character device for the container. Without numbers the runtime copies the host's node at `path`."""

    path: str
    major: int | None = None
    minor: int = 0

    def to_dict(self) -> dict[str, Any]:
        if self.major is None:
            return {"path": self.path}
        return {"path": self.path, "type": "c", "major": self.major, "minor": self.minor}


@dataclass(frozen=True)
class DeviceNumbers:
    """Majors written into specs for a node whose /dev has no NVIDIA nodes to copy (a simulated node).

    195 is the NVIDIA driver's fixed major; the uvm and caps majors are dynamic on real nodes, so
    a real node's specs carry paths only and the runtime reads the numbers from the host's nodes.
    """

    nvidia: int = 195
    nvidia_uvm: int = 510
    nvidia_caps: int = 511


SIMULATED_DEVICE_NUMBERS = DeviceNumbers()


@dataclass(frozen=True)
class ContainerEdits:
    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()

    def __add__(self, other: ContainerEdits) -> ContainerEdits:
        paths = {n.path for n in self.device_nodes}
        return ContainerEdits(
            self.env + other.env,
            self.device_nodes + tuple(n for n in other.device_nodes if n.path not in paths),
            self.mounts + other.mounts,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [n.to_dict() for n in self.device_nodes]
        if self.mounts:
            out["mounts"] = [m.to_dict() for m in self.mounts]
        return out


@dataclass(frozen=True)
class SpecDevice:
    """One CDI device of a claim spec."""

    name: str  # CDI device name, unique in the spec
    edits: ContainerEdits = field(default_factory=ContainerEdits)


def request_devices_env(claim_uid: str, request: str, visible_ids: Sequence[str]) -> str:
    """`TESSERA_DEVICES_<claim uid>_<request>=<id>,<id>`: one request's GPU or MIG UUIDs in allocation order."""
    key = re.sub(r"[^A-Za-z0-9]", "_", f"{check_claim_uid(claim_uid)}_{request}").upper()
    return f"{REQUEST_DEVICES_PREFIX}{key}={','.join(visible_ids)}"


def check_claim_uid(uid: str) -> str:
    if not _CLAIM_UID.match(uid):
        raise CdiError(f"claim uid {uid!r} is not a plain token of letters, digits and '-'; refusing to use it")
    return uid


def device_name(claim_uid: str, device: str, suffix: str = "") -> str:
    """The CDI device name of an allocated device: `<claim uid>-<device>[-<suffix>]`, never reused across claims."""
    name = f"{check_claim_uid(claim_uid)}-{device}" + (f"-{suffix}" if suffix else "")
    if not _DEVICE_NAME.match(name):
        raise CdiError(f"CDI device name {name!r} does not match the CDI device name grammar")
    return name


def qualified_id(name: str) -> str:
    return f"{CDI_KIND}={name}"


def spec_path(cdi_dir: Path, claim_uid: str) -> Path:
    return cdi_dir / f"{SPEC_PREFIX}{check_claim_uid(claim_uid)}{SPEC_SUFFIX}"


def control_device_nodes(numbers: DeviceNumbers | None = None) -> tuple[DeviceNode, ...]:
    """/dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools: every CUDA process opens them."""
    if numbers is None:
        return tuple(DeviceNode(p) for p in CONTROL_DEVICE_PATHS)
    return (
        DeviceNode("/dev/nvidiactl", numbers.nvidia, 255),
        DeviceNode("/dev/nvidia-uvm", numbers.nvidia_uvm, 0),
        DeviceNode("/dev/nvidia-uvm-tools", numbers.nvidia_uvm, 1),
    )


def gpu_device_nodes(minor: int, numbers: DeviceNumbers | None = None) -> tuple[DeviceNode, ...]:
    return (DeviceNode(f"/dev/nvidia{minor}", numbers.nvidia if numbers else None, minor),)


def mig_capability_minors(
    gpu_minor: int, gpu_instance: int, compute_instance: int, proc_root: Path | None
) -> tuple[int, int]:
    """Minor numbers of `/dev/nvidia-caps/nvidia-cap<N>` for a MIG instance's GI and CI access files.

    Read from `<proc_root>/driver/nvidia-caps/mig-minors` when that table exists (a real node);
    otherwise (simulation) computed from the fixed grid the driver uses for that table.
    """
    gi_key = f"gpu{gpu_minor}/gi{gpu_instance}/access"
    ci_key = f"gpu{gpu_minor}/gi{gpu_instance}/ci{compute_instance}/access"
    if proc_root is not None:
        table = proc_root / "driver" / "nvidia-caps" / "mig-minors"
        if table.is_file():
            minors: dict[str, int] = {}
            for line in table.read_text().splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[1].isdigit():
                    minors[parts[0]] = int(parts[1])
            if gi_key not in minors or ci_key not in minors:
                raise CdiError(f"{table} has no entry for {gi_key} or {ci_key}")
            return minors[gi_key], minors[ci_key]
    gi_minor = _MIG_CAP_FIRST + gpu_minor * _MIG_CAP_PER_GPU + gpu_instance * _MIG_CAP_PER_GI
    return gi_minor, gi_minor + 1 + compute_instance


def mig_device_nodes(
    gpu_minor: int,
    gpu_instance: int,
    compute_instance: int,
    proc_root: Path | None = None,
    numbers: DeviceNumbers | None = None,
) -> tuple[DeviceNode, ...]:
    """The parent GPU's node plus the GI and CI capability nodes that grant access to one MIG instance."""
    gi_minor, ci_minor = mig_capability_minors(gpu_minor, gpu_instance, compute_instance, proc_root)
    caps = numbers.nvidia_caps if numbers else None
    return (
        *gpu_device_nodes(gpu_minor, numbers),
        DeviceNode(f"/dev/nvidia-caps/nvidia-cap{gi_minor}", caps, gi_minor),
        DeviceNode(f"/dev/nvidia-caps/nvidia-cap{ci_minor}", caps, ci_minor),
    )


def build_claim_spec(
    claim_uid: str,
    devices: Sequence[SpecDevice],
    common: ContainerEdits | None = None,
    numbers: DeviceNumbers | None = None,
) -> dict[str, Any]:
    """The CDI spec of one claim; each device's edits carry its own nodes and env, see the module docstring.

    `numbers` only for nodes without real NVIDIA device nodes (simulation), see DeviceNumbers.
    """
    check_claim_uid(claim_uid)
    common = common or ContainerEdits()
    if not devices:
        raise CdiError(f"claim {claim_uid}: a CDI spec needs at least one device")
    names = [d.name for d in devices]
    if len(set(names)) != len(names):
        raise CdiError(f"claim {claim_uid}: duplicate CDI device names {names}")
    claim_edits = (
        ContainerEdits(env=(f"{NVIDIA_VISIBLE_DEVICES}=void",), device_nodes=control_device_nodes(numbers)) + common
    )
    spec_devices = []
    for d in devices:
        if not _DEVICE_NAME.match(d.name):
            raise CdiError(f"CDI device name {d.name!r} does not match the CDI device name grammar")
        edits = d.edits.to_dict()
        if not edits:
            raise CdiError(f"CDI device {d.name!r} has no container edits; runtimes reject such a device")
        spec_devices.append({"name": d.name, "containerEdits": edits})
    spec: dict[str, Any] = {"cdiVersion": "", "kind": CDI_KIND, "devices": spec_devices}
    spec["containerEdits"] = claim_edits.to_dict()
    spec["cdiVersion"] = minimum_cdi_version(spec)
    return spec


def minimum_cdi_version(spec: dict[str, Any]) -> str:
    """The oldest cdiVersion that allows every field the spec uses (older runtimes reject newer versions)."""
    edits: list[dict[str, Any]] = [spec.get("containerEdits") or {}]
    edits += [d.get("containerEdits") or {} for d in spec.get("devices", [])]
    if any("additionalGids" in e or "intelRdt" in e for e in edits):
        return "0.7.0"
    kind = str(spec.get("kind", ""))
    if (
        "annotations" in spec
        or any("annotations" in d for d in spec.get("devices", []))
        or "." in kind.rsplit("/", maxsplit=1)[-1]
    ):
        return "0.6.0"
    if any(str(d.get("name", ""))[:1].isdigit() for d in spec.get("devices", [])) or any(
        "hostPath" in n for e in edits for n in e.get("deviceNodes", [])
    ):
        return "0.5.0"
    if any("type" in m for e in edits for m in e.get("mounts", [])):
        return "0.4.0"
    return "0.3.0"


def write_spec(cdi_dir: Path, claim_uid: str, spec: dict[str, Any]) -> Path:
    """Write (or replace) a claim's spec atomically, 0644 in a 0755 directory, and return its path."""
    path = spec_path(cdi_dir, claim_uid)
    cdi_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    if path.parent.resolve() != cdi_dir.resolve():
        raise CdiError(f"spec path {path} is outside the CDI directory {cdi_dir}")
    write_atomic(path, (json.dumps(spec, indent=2, sort_keys=True) + "\n").encode(), 0o644)
    log.debug("cdi spec written", claim_uid=claim_uid, path=str(path))
    return path


def read_spec(cdi_dir: Path, claim_uid: str) -> dict[str, Any] | None:
    """A claim's spec as written, or None when there is none (or it cannot be parsed)."""
    path = spec_path(cdi_dir, claim_uid)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        log.warning("unreadable cdi spec", path=str(path))
        return None
    return data if isinstance(data, dict) else None


def remove_spec(cdi_dir: Path, claim_uid: str) -> bool:
    """Delete a claim's spec; True if a file was removed. A missing file is not an error."""
    path = spec_path(cdi_dir, claim_uid)
    if not os.path.lexists(path):
        # checked first: on a read-only mount unlink() of a missing file fails with EROFS, which would
        # fail the rollback of a prepare that never got to write its spec
        return False
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    fsync_dir(cdi_dir)
    log.debug("cdi spec removed", claim_uid=claim_uid, path=str(path))
    return True


def claim_spec_uids(cdi_dir: Path) -> list[str]:
    """Claim uids of every tessera claim spec in the directory (other drivers' files are left alone)."""
    if not cdi_dir.is_dir():
        return []
    uids = []
    for entry in sorted(cdi_dir.iterdir()):
        name = entry.name
        if name.startswith(SPEC_PREFIX) and name.endswith(SPEC_SUFFIX):
            uid = name[len(SPEC_PREFIX) : -len(SPEC_SUFFIX)]
            if _CLAIM_UID.match(uid):
                uids.append(uid)
    return uids
