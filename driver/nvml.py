"""The NVML discovery backend: read the node's real GPUs through pynvml (package nvidia-ml-py).

Everything NVML may refuse is handled where it can happen: a query a GPU does not support
(`NVMLError_NotSupported`, or `NVMLError_FunctionNotFound` on an older driver) falls back to a
documented default, and a GPU that cannot be read at all (e.g. `NVMLError_GpuIsLost`) is left out
with an error log instead of taking the whole node's devices down with it. Older pynvml releases
return bytes where newer ones return str; both are accepted.

The PCIe root and NUMA node come from sysfs (`<sysfs>/bus/pci/devices/<bdf>`), whose root is a
parameter so tests can build a real directory tree. NVLink islands are computed from the remote
end of every active link: a link to another GPU of this node joins the two, a link into an
NVSwitch joins the GPU to the switch fabric (all switched GPUs form one island).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from driver.errors import DiscoveryError
from driver.model import Gpu, Inventory, MigInstance
from driver.nvlink import assign_nvlink_islands

log = structlog.get_logger(__name__)

# nvmlBrandType_t values (stable ABI numbers, listed so that older pynvml releases need not define them all).
BRAND_NAMES: dict[int, str] = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NvidiaVApps",
    8: "NvidiaVPC",
    9: "NvidiaVCS",
    10: "NvidiaVWS",
    11: "NvidiaCloudGaming",
    12: "QuadroRTX",
    13: "NvidiaRTX",
    14: "Nvidia",
    15: "GeForceRTX",
    16: "TitanRTX",
    17: "NvidiaDLA",
    18: "NvidiaVGameDev",
    19: "NvidiaNPU",
}

# nvmlDeviceArchitecture_t values.
ARCHITECTURE_NAMES: dict[int, str] = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}

# Used when nvmlDeviceGetArchitecture is missing (drivers before R470): compute capability -> architecture.
_ARCHITECTURE_BY_CAPABILITY: dict[tuple[int, int | None], str] = {
    (3, None): "Kepler",
    (5, None): "Maxwell",
    (6, None): "Pascal",
    (7, 0): "Volta",
    (7, 2): "Volta",
    (7, 5): "Turing",
    (8, 9): "Ada Lovelace",
    (8, None): "Ampere",
    (9, None): "Hopper",
    (10, None): "Blackwell",
    (12, None): "Blackwell",
}

_NVLINK_REMOTE_GPU = 0x00  # NVML_NVLINK_DEVICE_TYPE_GPU
_NVLINK_REMOTE_SWITCH = 0x02  # NVML_NVLINK_DEVICE_TYPE_SWITCH
_MIG_ENABLE = 1  # NVML_DEVICE_MIG_ENABLE
_DEFAULT_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS before Blackwell; used if the module lacks the constant
_DEFAULT_GI_PROFILE_COUNT = 0x12

_BDF = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])\Z")
_PCI_ROOT_DIR = re.compile(r"^pci[0-9a-f]{4,}:[0-9a-f]{2}\Z")


def load_nvml_inventory(node_name: str, *, nvml_module: Any = None, sysfs_root: Path | str = "/sys") -> Inventory:
    """Read this node's GPUs through NVML.

    `nvml_module` defaults to the real `pynvml`; tests pass a stand-in with the same functions and
    error classes. Raises DiscoveryError when NVML cannot be started at all.
    """
    nv = nvml_module if nvml_module is not None else _import_pynvml()
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        raise DiscoveryError(
            f"NVML could not be initialised ({_error_text(exc)}); run on a node with the NVIDIA driver loaded "
            "and libnvidia-ml.so.1 on the library path (in a container, mount the driver root), "
            "or use a simulated profile instead"
        ) from exc
    try:
        return _NvmlReader(nv, Path(sysfs_root)).inventory(node_name)
    except nv.NVMLError as exc:
        raise DiscoveryError(f"NVML failed while listing GPUs: {_error_text(exc)}") from exc
    finally:
        try:
            nv.nvmlShutdown()
        except nv.NVMLError as exc:
            log.warning("nvmlShutdown failed", error=_error_text(exc))


def normalize_bus_id(raw: str) -> str:
    """NVML's "00000000:18:00.0" (or a short "18:00.0") as the lower-case extended BDF "0000:18:00.0"."""
    match = _BDF.match(raw.strip())
    if not match:
        raise ValueError(f"not a PCI bus id: {raw!r}")
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


def cuda_version_text(version: int) -> str:
    """NVML's CUDA driver version integer (12040) as "12.4"."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def architecture_for_capability(major: int, minor: int) -> str:
    """The architecture name a compute capability belongs to, or "Unknown"."""
    return _ARCHITECTURE_BY_CAPABILITY.get((major, minor), _ARCHITECTURE_BY_CAPABILITY.get((major, None), "Unknown"))


def pcie_root_of(sysfs_root: Path, bus_id: str) -> str:
    """The PCIe root complex ("pci0000:17") above a device, from its resolved sysfs path; "" if unknown."""
    device_dir = sysfs_root / "bus" / "pci" / "devices" / bus_id
    if not device_dir.exists():
        return ""
    for part in device_dir.resolve().parts:
        if _PCI_ROOT_DIR.match(part):
            return part
    return ""


def numa_node_of(sysfs_root: Path, bus_id: str) -> int:
    """The NUMA node sysfs reports for a device; -1 when there is none (as the kernel itself says)."""
    try:
        return int((sysfs_root / "bus" / "pci" / "devices" / bus_id / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return -1


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise DiscoveryError(
            "NVML discovery needs the nvidia-ml-py package (import name pynvml); install it with the driver"
        ) from exc
    return pynvml


def _text(value: object) -> str:
    """pynvml returns bytes in older releases and str in newer ones; NUL padding is dropped either way."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    return str(value).rstrip("\x00").strip()


def _error_text(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # an unknown NVML code makes str() call back into the library
        return type(exc).__name__


@dataclass
class _Links:
    """The remote ends of one GPU's active NVLinks, as read (bus id, remote device type or None)."""

    remote: list[tuple[str, int | None]] = field(default_factory=list)


class _GpuUnreadable(Exception):
    pass


class _NvmlReader:
    """Reads one inventory between nvmlInit and nvmlShutdown."""

    def __init__(self, nv: Any, sysfs_root: Path) -> None:
        self.nv = nv
        self.sysfs_root = sysfs_root
        # Queries a GPU or driver may simply not offer: they get a default instead of failing the GPU.
        self.unsupported: tuple[type[BaseException], ...] = (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound)

    def _query(self, name: str, *args: Any) -> Any:
        """Call an NVML function that an older pynvml may not define; a missing one counts as FunctionNotFound."""
        function = getattr(self.nv, name, None)
        if function is None:
            raise self.nv.NVMLError_FunctionNotFound()
        return function(*args)

    def inventory(self, node_name: str) -> Inventory:
        nv = self.nv
        driver_version = _text(nv.nvmlSystemGetDriverVersion())
        cuda_version = self._cuda_driver_version()
        gpus: list[Gpu] = []
        links: dict[int, _Links] = {}
        skipped: list[str] = []
        for index in range(int(nv.nvmlDeviceGetCount())):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                gpu, gpu_links = self._gpu(index, handle)
            except (nv.NVMLError, _GpuUnreadable) as exc:
                log.error("leaving out a GPU that NVML cannot read", index=index, error=_error_text(exc))
                skipped.append(f"{index}: {_error_text(exc)}")
                continue
            gpus.append(gpu)
            links[index] = gpu_links
        direct, switched = self._nvlink_graph(gpus, links)
        extra = {"skippedGpus": "; ".join(skipped)} if skipped else {}
        return Inventory(
            node_name=node_name,
            driver_version=driver_version,
            cuda_driver_version=cuda_version,
            gpus=assign_nvlink_islands(gpus, direct, switched),
            source="nvml",
            extra=extra,
        )

    def _cuda_driver_version(self) -> str:
        nv = self.nv
        try:
            version = self._query("nvmlSystemGetCudaDriverVersion_v2")
        except self.unsupported:
            version = nv.nvmlSystemGetCudaDriverVersion()
        return cuda_version_text(int(version))

    def _gpu(self, index: int, handle: Any) -> tuple[Gpu, _Links]:
        nv = self.nv
        try:
            bus_id = normalize_bus_id(_text(nv.nvmlDeviceGetPciInfo(handle).busId))
        except ValueError as exc:
            raise _GpuUnreadable(str(exc)) from exc
        major, minor = (int(v) for v in nv.nvmlDeviceGetCudaComputeCapability(handle))
        mig_capable, mig_enabled, mig_pending = self._mig_mode(handle)
        gpu = Gpu(
            index=index,
            minor=int(nv.nvmlDeviceGetMinorNumber(handle)),
            uuid=_text(nv.nvmlDeviceGetUUID(handle)),
            product_name=_text(nv.nvmlDeviceGetName(handle)),
            brand=self._brand(handle),
            architecture=self._architecture(handle, major, minor),
            cuda_compute_capability=f"{major}.{minor}",
            memory_bytes=int(nv.nvmlDeviceGetMemoryInfo(handle).total),
            multiprocessors=self._multiprocessors(handle, index),
            pci_bus_id=bus_id,
            pcie_root=self._pcie_root(bus_id, index),
            numa_node=numa_node_of(self.sysfs_root, bus_id),
            mig_capable=mig_capable,
            mig_enabled=mig_enabled,
            mig_pending=mig_pending,
            nvlink_island="",  # filled in once every GPU's links are known
            nvlink_peers=0,
            mig_instances=self._mig_instances(handle, index) if mig_enabled else (),
        )
        return gpu, self._links(handle, index)

    def _brand(self, handle: Any) -> str:
        try:
            code = int(self.nv.nvmlDeviceGetBrand(handle))
        except self.unsupported:
            return "Unknown"
        return BRAND_NAMES.get(code, "Unknown")

    def _architecture(self, handle: Any, major: int, minor: int) -> str:
        try:
            code = int(self._query("nvmlDeviceGetArchitecture", handle))
        except self.unsupported:
            return architecture_for_capability(major, minor)
        return ARCHITECTURE_NAMES.get(code) or architecture_for_capability(major, minor)

    def _multiprocessors(self, handle: Any, index: int) -> int:
        try:
            return int(self._query("nvmlDeviceGetAttributes", handle).multiprocessorCount)
        except self.unsupported as exc:
            # Only GPUs older than Volta lack this; publishing 0 keeps the GPU usable as a whole card.
            log.warning("NVML does not report the SM count; publishing 0", index=index, error=_error_text(exc))
            return 0

    def _pcie_root(self, bus_id: str, index: int) -> str:
        root = pcie_root_of(self.sysfs_root, bus_id)
        if not root:
            log.warning(
                "no PCIe root found in sysfs; is /sys mounted?",
                index=index,
                path=str(self.sysfs_root / "bus" / "pci" / "devices" / bus_id),
            )
        return root

    def _mig_mode(self, handle: Any) -> tuple[bool, bool, bool]:
        """(capable, current mode enabled, pending mode enabled); NotSupported means not MIG capable."""
        try:
            current, pending = self._query("nvmlDeviceGetMigMode", handle)
        except self.unsupported:
            return False, False, False
        return True, int(current) == _MIG_ENABLE, int(pending) == _MIG_ENABLE

    def _mig_instances(self, handle: Any, index: int) -> tuple[MigInstance, ...]:
        nv = self.nv
        try:
            slots = int(self._query("nvmlDeviceGetMaxMigDeviceCount", handle))
        except self.unsupported:
            return ()
        profile_names = self._gpu_instance_profile_names(handle)
        instances: list[MigInstance] = []
        for slot in range(slots):
            try:
                mig_handle = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nv.NVMLError_NotFound:
                continue  # an empty slot: fewer instances exist than the GPU could hold
            except nv.NVMLError as exc:
                log.warning("cannot open a MIG device slot", index=index, slot=slot, error=_error_text(exc))
                continue
            try:
                instances.append(self._mig_instance(handle, mig_handle, profile_names))
            except nv.NVMLError as exc:
                log.warning(
                    "leaving out a MIG device NVML cannot describe", index=index, slot=slot, error=_error_text(exc)
                )
        return tuple(sorted(instances, key=lambda inst: (inst.placement_start, inst.gpu_instance_id)))

    def _gpu_instance_profile_names(self, handle: Any) -> dict[int, str]:
        """GPU instance profile id -> name without the "MIG " prefix ("1g.10gb"), as this GPU offers them."""
        nv = self.nv
        names: dict[int, str] = {}
        for profile in range(int(getattr(nv, "NVML_GPU_INSTANCE_PROFILE_COUNT", _DEFAULT_GI_PROFILE_COUNT))):
            try:
                info = nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile)
            except nv.NVMLError:
                continue  # this GPU does not offer the profile (NotSupported / InvalidArgument)
            name = _text(getattr(info, "name", b"")).removeprefix("MIG ").strip()
            if name:
                names[int(info.id)] = name
        return names

    def _mig_instance(self, parent: Any, mig_handle: Any, profile_names: dict[int, str]) -> MigInstance:
        nv = self.nv
        gi_id = int(nv.nvmlDeviceGetGpuInstanceId(mig_handle))
        ci_id = int(nv.nvmlDeviceGetComputeInstanceId(mig_handle))
        info = nv.nvmlGpuInstanceGetInfo(nv.nvmlDeviceGetGpuInstanceById(parent, gi_id))
        profile = profile_names.get(int(info.profileId), "")
        if not profile:
            # The MIG device's own name ends in its profile: "NVIDIA A100-SXM4-40GB MIG 1g.5gb".
            profile = _text(nv.nvmlDeviceGetName(mig_handle)).rpartition("MIG ")[2]
        return MigInstance(
            profile=profile,
            placement_start=int(info.placement.start),
            placement_size=int(info.placement.size),
            uuid=_text(nv.nvmlDeviceGetUUID(mig_handle)),
            memory_bytes=int(nv.nvmlDeviceGetMemoryInfo(mig_handle).total),
            multiprocessors=int(nv.nvmlDeviceGetAttributes(mig_handle).multiprocessorCount),
            gpu_instance_id=gi_id,
            compute_instance_id=ci_id,
        )

    def _links(self, handle: Any, index: int) -> _Links:
        nv = self.nv
        found = _Links()
        remote_type_query = getattr(nv, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", _DEFAULT_MAX_LINKS))):
            try:
                active = int(nv.nvmlDeviceGetNvLinkState(handle, link))
            except (*self.unsupported, nv.NVMLError_InvalidArgument):
                continue  # no such link on this GPU
            except nv.NVMLError as exc:
                log.warning("cannot read an NVLink's state", index=index, link=link, error=_error_text(exc))
                continue
            if not active:
                continue
            try:
                remote_bus = normalize_bus_id(_text(nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
            except (nv.NVMLError, ValueError) as exc:
                log.warning(
                    "cannot read the remote end of an active NVLink", index=index, link=link, error=_error_text(exc)
                )
                continue
            remote_type: int | None = None
            if remote_type_query is not None:
                try:
                    remote_type = int(remote_type_query(handle, link))
                except nv.NVMLError:
                    remote_type = None
            found.remote.append((remote_bus, remote_type))
        return found

    def _nvlink_graph(self, gpus: list[Gpu], links: dict[int, _Links]) -> tuple[list[tuple[int, int]], list[int]]:
        """Direct GPU-GPU links and the GPUs attached to an NVSwitch, from every GPU's remote link ends."""
        by_bus = {gpu.pci_bus_id: gpu.index for gpu in gpus}
        direct: list[tuple[int, int]] = []
        switched: list[int] = []
        for index, gpu_links in links.items():
            for remote_bus, remote_type in gpu_links.remote:
                if remote_type == _NVLINK_REMOTE_SWITCH:
                    switched.append(index)
                elif remote_bus in by_bus:
                    if by_bus[remote_bus] != index:
                        direct.append((index, by_bus[remote_bus]))
                elif remote_type is None:
                    # Without a device type, a far end that is none of this node's GPUs is an NVSwitch.
                    switched.append(index)
                elif remote_type == _NVLINK_REMOTE_GPU:
                    log.info("NVLink to a GPU that is not listed on this node", index=index, remote=remote_bus)
        return direct, switched
