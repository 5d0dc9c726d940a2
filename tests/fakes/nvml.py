"""A stand-in for the `pynvml` module that answers like NVML does on three real machine shapes.

Only unit tests use it. It raises the real `pynvml.NVMLError_*` classes with the codes NVML uses,
refuses calls before `nvmlInit` / after `nvmlShutdown` (NVMLError_Uninitialized), returns ctypes-like
structs (bus ids as bytes, as ctypes char arrays are) and, with `bytes_strings=True`, returns bytes
from the string queries the way pynvml releases before 11.5 did.

Machines (see the factories at the bottom):
- `dgx_h100_node()`: 8x H100 80GB HBM3, 18 NVLinks each into four NVSwitches, MIG capable and off.
- `pcie_pair_node()`: 2x Tesla T4 on PCIe, no NVLink (NotSupported), not MIG capable (NotSupported).
- `a100_mig_node()`: 4x A100-SXM4-40GB fully connected by direct NVLinks; GPU 0 in MIG mode with four
  instances, GPU 1 with MIG mode pending.
`sysfs_for(root, node)` builds the matching real /sys/bus/pci/devices tree under a temp directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml as _real

# Error classes and constants are the real ones, so `except pynvml.NVMLError_NotSupported` matches.
NVMLError = _real.NVMLError
NVMLError_Uninitialized = _real.NVMLError_Uninitialized
NVMLError_InvalidArgument = _real.NVMLError_InvalidArgument
NVMLError_NotSupported = _real.NVMLError_NotSupported
NVMLError_NoPermission = _real.NVMLError_NoPermission
NVMLError_NotFound = _real.NVMLError_NotFound
NVMLError_LibraryNotFound = _real.NVMLError_LibraryNotFound
NVMLError_DriverNotLoaded = _real.NVMLError_DriverNotLoaded
NVMLError_FunctionNotFound = _real.NVMLError_FunctionNotFound
NVMLError_GpuIsLost = _real.NVMLError_GpuIsLost
NVMLError_Unknown = _real.NVMLError_Unknown
NVMLError_Timeout = _real.NVMLError_Timeout

MIB = 1024 * 1024


@dataclass
class FakeMig:
    """One MIG device (GPU instance + compute instance) as NVML describes it."""

    gi_id: int
    ci_id: int
    profile_id: int  # nvmlGpuInstanceInfo_t.profileId
    placement_start: int
    placement_size: int
    uuid: str
    memory_mib: int
    multiprocessors: int
    name: str  # nvmlDeviceGetName of the MIG handle, e.g. "NVIDIA A100-SXM4-40GB MIG 1g.5gb"


@dataclass
class FakeLink:
    active: bool
    remote_bus_id: str  # as NVML reports it: "00000000:18:00.0"
    remote_type: int  # NVML_NVLINK_DEVICE_TYPE_*


@dataclass
class FakeGpu:
    uuid: str
    name: str
    bus_id: str  # NVML form, 8-digit domain, upper-case hex as NVML prints it
    minor: int
    brand: int
    architecture: int | None  # None: nvmlDeviceGetArchitecture raises NotSupported
    compute_capability: tuple[int, int]
    memory_mib: int
    multiprocessors: int | None  # None: nvmlDeviceGetAttributes raises NotSupported
    mig_mode: tuple[int, int] | None = None  # (current, pending); None: NotSupported
    links: list[FakeLink] | None = None  # None: every NVLink query raises NotSupported
    max_mig_devices: int = 0
    migs: list[FakeMig] = field(default_factory=list)
    # GPU instance profile index (NVML_GPU_INSTANCE_PROFILE_*) -> (profile id, name, slice count)
    gi_profiles: dict[int, tuple[int, str, int]] = field(default_factory=dict)
    # function name -> error class: that query fails on this GPU (e.g. a lost GPU)
    failures: dict[str, type[Exception]] = field(default_factory=dict)
    # health: fallen off the bus (every query on it raises GpuIsLost), NVML's recovery action (None: the
    # driver does not report the field), the volatile uncorrectable ECC count and what waits for a
    # reset (None: NotSupported)
    lost: bool = False
    recovery_action: int | None = 0
    volatile_uncorrected: int | None = 0
    retired_pages_pending: bool | None = False
    row_remap_pending: bool | None = False


@dataclass(frozen=True)
class _Handle:
    index: int


@dataclass(frozen=True)
class _MigHandle:
    parent: int
    slot: int


@dataclass(frozen=True)
class _GpuInstance:
    parent: int
    gi_id: int


class FakeNvml:
    """Module-like object: pass it as `nvml_module=`. Counts init/shutdown calls for the tests."""

    NVMLError = NVMLError
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_Unknown = NVMLError_Unknown
    NVMLError_Timeout = NVMLError_Timeout
    nvmlEventTypeXidCriticalError = _real.nvmlEventTypeXidCriticalError
    nvmlEventTypeDoubleBitEccError = _real.nvmlEventTypeDoubleBitEccError
    nvmlEventTypeSingleBitEccError = _real.nvmlEventTypeSingleBitEccError

    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = _real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = _real.NVML_VOLATILE_ECC
    NVML_FEATURE_ENABLED = _real.NVML_FEATURE_ENABLED
    NVML_FEATURE_DISABLED = _real.NVML_FEATURE_DISABLED
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = _real.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    NVML_NVLINK_MAX_LINKS = _real.NVML_NVLINK_MAX_LINKS
    NVML_GPU_INSTANCE_PROFILE_COUNT = _real.NVML_GPU_INSTANCE_PROFILE_COUNT
    NVML_NVLINK_DEVICE_TYPE_GPU = _real.NVML_NVLINK_DEVICE_TYPE_GPU
    NVML_NVLINK_DEVICE_TYPE_SWITCH = _real.NVML_NVLINK_DEVICE_TYPE_SWITCH

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        driver_version: str = "550.54.15",
        cuda_version: int = 12040,
        bytes_strings: bool = False,
        failures: dict[str, type[Exception]] | None = None,
        max_links: int = 18,
    ) -> None:
        self.gpus = gpus
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self.bytes_strings = bytes_strings
        self.failures = dict(failures or {})  # module-level function name -> error class
        self.max_links = max_links  # links beyond this index answer InvalidArgument, as on real GPUs
        self.initialized = False
        self.init_calls = 0
        self.shutdown_calls = 0
        # events: (gpu index, event type, event data) waiting in the event set; registrations per GPU
        self.pending_events: list[tuple[int, int, int]] = []
        self.registered: dict[int, int] = {}
        self.event_sets = 0

    # -- plumbing ---------------------------------------------------------------------------------

    def _check(self, fn: str, handle: object = None) -> FakeGpu | None:
        if fn in self.failures:
            raise self.failures[fn]()
        if not self.initialized:
            raise NVMLError_Uninitialized()
        if handle is None:
            return None
        index = handle.index if isinstance(handle, _Handle) else handle.parent  # type: ignore[attr-defined]
        gpu = self.gpus[index]
        if fn in gpu.failures:
            raise gpu.failures[fn]()
        if gpu.lost:
            raise NVMLError_GpuIsLost()
        return gpu

    def _str(self, value: str) -> str | bytes:
        return value.encode() if self.bytes_strings else value

    # -- library and system -----------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if "nvmlInit" in self.failures:
            raise self.failures["nvmlInit"]()
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1
        self._check("nvmlShutdown")
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._check("nvmlSystemGetDriverVersion")
        return self._str(self.driver_version)

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._check("nvmlSystemGetCudaDriverVersion_v2")
        return self.cuda_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check("nvmlSystemGetCudaDriverVersion")
        return self.cuda_version

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._check("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError_InvalidArgument()
        gpu = self.gpus[index]
        if "nvmlDeviceGetHandleByIndex" in gpu.failures:
            raise gpu.failures["nvmlDeviceGetHandleByIndex"]()
        if gpu.lost:
            raise NVMLError_GpuIsLost()
        return _Handle(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> _Handle:
        self._check("nvmlDeviceGetHandleByUUID")
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for index, gpu in enumerate(self.gpus):
            if gpu.uuid == text:
                self._check("nvmlDeviceGetHandleByUUID", _Handle(index))
                return _Handle(index)
        raise NVMLError_NotFound()

    # -- full GPU queries -------------------------------------------------------------------------

    def _gpu(self, fn: str, handle: object) -> FakeGpu:
        if isinstance(handle, _MigHandle):
            raise AssertionError(f"{fn} called with a MIG handle where the test expects a GPU handle")
        gpu = self._check(fn, handle)
        assert gpu is not None
        return gpu

    def nvmlDeviceGetUUID(self, handle: object) -> str | bytes:
        if isinstance(handle, _MigHandle):
            self._check("nvmlDeviceGetUUID", handle)
            return self._str(self._mig(handle).uuid)
        return self._str(self._gpu("nvmlDeviceGetUUID", handle).uuid)

    def nvmlDeviceGetName(self, handle: object) -> str | bytes:
        if isinstance(handle, _MigHandle):
            self._check("nvmlDeviceGetName", handle)
            return self._str(self._mig(handle).name)
        return self._str(self._gpu("nvmlDeviceGetName", handle).name)

    def nvmlDeviceGetBrand(self, handle: object) -> int:
        return self._gpu("nvmlDeviceGetBrand", handle).brand

    def nvmlDeviceGetArchitecture(self, handle: object) -> int:
        gpu = self._gpu("nvmlDeviceGetArchitecture", handle)
        if gpu.architecture is None:
            raise NVMLError_NotSupported()
        return gpu.architecture

    def nvmlDeviceGetCudaComputeCapability(self, handle: object) -> tuple[int, int]:
        return self._gpu("nvmlDeviceGetCudaComputeCapability", handle).compute_capability

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> SimpleNamespace:
        if isinstance(handle, _MigHandle):
            self._check("nvmlDeviceGetMemoryInfo", handle)
            total = self._mig(handle).memory_mib * MIB
        else:
            total = self._gpu("nvmlDeviceGetMemoryInfo", handle).memory_mib * MIB
        return SimpleNamespace(total=total, free=total - 500 * MIB, used=500 * MIB)

    def nvmlDeviceGetAttributes(self, handle: object) -> SimpleNamespace:
        if isinstance(handle, _MigHandle):
            self._check("nvmlDeviceGetAttributes", handle)
            mig = self._mig(handle)
            return SimpleNamespace(
                multiprocessorCount=mig.multiprocessors,
                gpuInstanceSliceCount=mig.placement_size,
                memorySizeMB=mig.memory_mib,
            )
        gpu = self._gpu("nvmlDeviceGetAttributes", handle)
        if gpu.multiprocessors is None:
            raise NVMLError_NotSupported()
        return SimpleNamespace(multiprocessorCount=gpu.multiprocessors, memorySizeMB=gpu.memory_mib)

    def nvmlDeviceGetPciInfo(self, handle: object) -> SimpleNamespace:
        gpu = self._gpu("nvmlDeviceGetPciInfo", handle)
        # a ctypes char array reads back as bytes (pynvml's printable struct may turn it into str)
        return SimpleNamespace(busId=gpu.bus_id.encode(), busIdLegacy=gpu.bus_id.encode())

    def nvmlDeviceGetMinorNumber(self, handle: object) -> int:
        return self._gpu("nvmlDeviceGetMinorNumber", handle).minor

    # -- MIG --------------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: object) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetMigMode", handle)
        if gpu.mig_mode is None:
            raise NVMLError_NotSupported()
        return list(gpu.mig_mode)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: object) -> int:
        gpu = self._gpu("nvmlDeviceGetMaxMigDeviceCount", handle)
        if gpu.mig_mode is None:
            raise NVMLError_NotSupported()
        return gpu.max_mig_devices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: object, slot: int) -> _MigHandle:
        gpu = self._gpu("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if not 0 <= slot < gpu.max_mig_devices:
            raise NVMLError_InvalidArgument()
        if slot >= len(gpu.migs):
            raise NVMLError_NotFound()
        assert isinstance(handle, _Handle)
        return _MigHandle(handle.index, slot)

    def _mig(self, handle: _MigHandle) -> FakeMig:
        return self.gpus[handle.parent].migs[handle.slot]

    def nvmlDeviceGetGpuInstanceId(self, handle: object) -> int:
        if not isinstance(handle, _MigHandle):
            raise NVMLError_InvalidArgument()  # NVML answers so for a full-GPU handle
        self._check("nvmlDeviceGetGpuInstanceId", handle)
        return self._mig(handle).gi_id

    def nvmlDeviceGetComputeInstanceId(self, handle: object) -> int:
        if not isinstance(handle, _MigHandle):
            raise NVMLError_InvalidArgument()
        self._check("nvmlDeviceGetComputeInstanceId", handle)
        return self._mig(handle).ci_id

    def nvmlDeviceGetGpuInstanceById(self, handle: object, gi_id: int) -> _GpuInstance:
        gpu = self._gpu("nvmlDeviceGetGpuInstanceById", handle)
        if not any(mig.gi_id == gi_id for mig in gpu.migs):
            raise NVMLError_NotFound()
        assert isinstance(handle, _Handle)
        return _GpuInstance(handle.index, gi_id)

    def nvmlGpuInstanceGetInfo(self, instance: _GpuInstance) -> SimpleNamespace:
        gpu = self._check("nvmlGpuInstanceGetInfo", _Handle(instance.parent))
        assert gpu is not None
        mig = next(m for m in gpu.migs if m.gi_id == instance.gi_id)
        return SimpleNamespace(
            id=mig.gi_id,
            profileId=mig.profile_id,
            placement=SimpleNamespace(start=mig.placement_start, size=mig.placement_size),
        )

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: object, profile: int, version: int = 2) -> SimpleNamespace:
        gpu = self._gpu("nvmlDeviceGetGpuInstanceProfileInfo", handle)
        if gpu.mig_mode is None:
            raise NVMLError_NotSupported()
        if not 0 <= profile < self.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise NVMLError_InvalidArgument()
        if profile not in gpu.gi_profiles:
            raise NVMLError_NotSupported()
        profile_id, name, slices = gpu.gi_profiles[profile]
        # a ctypes char array in the v2 struct reads back as bytes
        return SimpleNamespace(id=profile_id, sliceCount=slices, name=name.encode() if version == 2 else b"")

    # -- NVLink -----------------------------------------------------------------------------------

    def _link(self, fn: str, handle: object, link: int) -> FakeLink:
        gpu = self._gpu(fn, handle)
        if gpu.links is None:
            raise NVMLError_NotSupported()
        if not 0 <= link < self.max_links:
            raise NVMLError_InvalidArgument()
        if link >= len(gpu.links):
            raise NVMLError_NotSupported()
        return gpu.links[link]

    # -- events ---------------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> object:
        self._check("nvmlEventSetCreate")
        self.event_sets += 1
        return object()

    def nvmlEventSetFree(self, event_set: object) -> None:
        self._check("nvmlEventSetFree")
        self.event_sets -= 1

    def nvmlDeviceGetSupportedEventTypes(self, handle: object) -> int:
        gpu = self._gpu("nvmlDeviceGetSupportedEventTypes", handle)
        del gpu
        return (_real.nvmlEventTypeXidCriticalError | _real.nvmlEventTypeDoubleBitEccError
                | _real.nvmlEventTypeSingleBitEccError)

    def nvmlDeviceRegisterEvents(self, handle: object, types: int, event_set: object) -> None:
        self._gpu("nvmlDeviceRegisterEvents", handle)
        self.registered[handle.index] = types  # type: ignore[attr-defined]

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> SimpleNamespace:
        self._check("nvmlEventSetWait_v2")
        for i, (index, kind, data) in enumerate(self.pending_events):
            if self.registered.get(index, 0) & kind:
                del self.pending_events[i]
                return SimpleNamespace(device=_Handle(index), eventType=kind, eventData=data, gpuInstanceId=0xFFFFFFFF,
                                       computeInstanceId=0xFFFFFFFF)
        raise NVMLError_Timeout()

    # -- health: what a GPU reset clears ----------------------------------------------------------

    def nvmlDeviceGetFieldValues(self, handle: object, field_ids: list[int]) -> list[SimpleNamespace]:
        gpu = self._gpu("nvmlDeviceGetFieldValues", handle)
        out = []
        for fid in field_ids:
            if fid == _real.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and gpu.recovery_action is not None:
                out.append(SimpleNamespace(fieldId=fid, nvmlReturn=_real.NVML_SUCCESS,
                                           value=SimpleNamespace(uiVal=gpu.recovery_action)))
            else:  # per field, as NVML does: the call succeeds, the field says it is unknown here
                out.append(SimpleNamespace(fieldId=fid, nvmlReturn=_real.NVML_ERROR_NOT_SUPPORTED,
                                           value=SimpleNamespace(uiVal=0)))
        return out

    def nvmlDeviceGetTotalEccErrors(self, handle: object, error_type: int, counter_type: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTotalEccErrors", handle)
        if gpu.volatile_uncorrected is None:
            raise NVMLError_NotSupported()
        assert (error_type, counter_type) == (_real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, _real.NVML_VOLATILE_ECC)
        return gpu.volatile_uncorrected

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: object) -> int:
        gpu = self._gpu("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        if gpu.retired_pages_pending is None:
            raise NVMLError_NotSupported()
        return int(_real.NVML_FEATURE_ENABLED if gpu.retired_pages_pending else _real.NVML_FEATURE_DISABLED)

    def nvmlDeviceGetRemappedRows(self, handle: object) -> tuple[int, int, int, int]:
        gpu = self._gpu("nvmlDeviceGetRemappedRows", handle)
        if gpu.row_remap_pending is None:
            raise NVMLError_NotSupported()
        return (0, 1 if gpu.row_remap_pending else 0, int(gpu.row_remap_pending), 0)

    def double_bit_ecc(self, index: int) -> None:
        """What the driver does on an uncorrectable ECC error: the event, the counters, a reset asked for."""
        gpu = self.gpus[index]
        self.pending_events.append((index, _real.nvmlEventTypeDoubleBitEccError, 0))
        gpu.volatile_uncorrected = (gpu.volatile_uncorrected or 0) + 1
        gpu.row_remap_pending = True
        if gpu.recovery_action is not None:
            gpu.recovery_action = _real.NVML_GPU_RECOVERY_ACTION_GPU_RESET

    def reset_gpu(self, index: int) -> None:
        """`nvidia-smi -r`: the card is back, the volatile counters start at 0, pending repairs are applied."""
        gpu = self.gpus[index]
        gpu.lost = False
        if gpu.volatile_uncorrected is not None:
            gpu.volatile_uncorrected = 0
        if gpu.retired_pages_pending is not None:
            gpu.retired_pages_pending = False
        if gpu.row_remap_pending is not None:
            gpu.row_remap_pending = False
        if gpu.recovery_action is not None:
            gpu.recovery_action = _real.NVML_GPU_RECOVERY_ACTION_NONE

    def nvmlDeviceGetNvLinkState(self, handle: object, link: int) -> int:
        return int(self._link("nvmlDeviceGetNvLinkState", handle, link).active)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: object, link: int) -> SimpleNamespace:
        found = self._link("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        if not found.active:
            raise NVMLError_InvalidArgument()
        return SimpleNamespace(busId=found.remote_bus_id.encode())

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: object, link: int) -> int:
        return self._link("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link).remote_type


def without(module: FakeNvml, name: str) -> Any:
    """A view of `module` that lacks one function, like a pynvml release from before it existed."""

    class Older:
        def __getattr__(self, attr: str) -> Any:
            if attr == name:
                raise AttributeError(attr)
            return getattr(module, attr)

    return Older()


# ---- machines -----------------------------------------------------------------------------------

H100_BUS_IDS = [
    "00000000:18:00.0",
    "00000000:2A:00.0",
    "00000000:3A:00.0",
    "00000000:5D:00.0",
    "00000000:9A:00.0",
    "00000000:AB:00.0",
    "00000000:BA:00.0",
    "00000000:DB:00.0",
]
H100_ROOTS = ["15", "26", "37", "59", "97", "a7", "b7", "d7"]
NVSWITCH_BUS_IDS = ["00000000:05:00.0", "00000000:06:00.0", "00000000:07:00.0", "00000000:08:00.0"]


@dataclass(frozen=True)
class SysfsDevice:
    bus_id: str  # NVML form
    root_bus: str  # two hex digits of the root complex's bus
    numa_node: int | None  # None: no numa_node file


@dataclass
class FakeNode:
    nvml: FakeNvml
    sysfs: list[SysfsDevice]


def dgx_h100_node(**kwargs: Any) -> FakeNode:
    switch_links = [NVSWITCH_BUS_IDS[i] for i in (0,) * 5 + (1,) * 4 + (2,) * 4 + (3,) * 5]
    gpus = [
        FakeGpu(
            uuid=f"GPU-a1b2c3d4-0000-1111-2222-00000000000{i}",
            name="NVIDIA H100 80GB HBM3",
            bus_id=bus,
            minor=i,
            brand=_real.NVML_BRAND_NVIDIA,
            architecture=_real.NVML_DEVICE_ARCH_HOPPER,
            compute_capability=(9, 0),
            memory_mib=81559,
            multiprocessors=132,
            mig_mode=(0, 0),
            links=[FakeLink(True, remote, _real.NVML_NVLINK_DEVICE_TYPE_SWITCH) for remote in switch_links],
            max_mig_devices=7,
        )
        for i, bus in enumerate(H100_BUS_IDS)
    ]
    sysfs = [
        SysfsDevice(bus, root, 0 if i < 4 else 1)
        for i, (bus, root) in enumerate(zip(H100_BUS_IDS, H100_ROOTS, strict=True))
    ]
    return FakeNode(FakeNvml(gpus, **kwargs), sysfs)


def pcie_pair_node(**kwargs: Any) -> FakeNode:
    buses = ["00000000:3B:00.0", "00000000:AF:00.0"]
    gpus = [
        FakeGpu(
            uuid=f"GPU-7e57a000-1111-2222-3333-44445555666{i}",
            name="Tesla T4",
            bus_id=bus,
            minor=i,
            brand=_real.NVML_BRAND_TESLA,
            architecture=_real.NVML_DEVICE_ARCH_TURING,
            compute_capability=(7, 5),
            memory_mib=15360,
            multiprocessors=40,
        )
        for i, bus in enumerate(buses)
    ]
    return FakeNode(FakeNvml(gpus, **kwargs), [SysfsDevice(buses[0], "3a", 0), SysfsDevice(buses[1], "ae", 1)])


# A100 40GB GPU instance profiles as NVML lists them: index -> (profile id, name, memory slices).
A100_GI_PROFILES = {
    _real.NVML_GPU_INSTANCE_PROFILE_1_SLICE: (19, "MIG 1g.5gb", 1),
    _real.NVML_GPU_INSTANCE_PROFILE_2_SLICE: (14, "MIG 2g.10gb", 2),
    _real.NVML_GPU_INSTANCE_PROFILE_3_SLICE: (9, "MIG 3g.20gb", 4),
    _real.NVML_GPU_INSTANCE_PROFILE_4_SLICE: (5, "MIG 4g.20gb", 4),
    _real.NVML_GPU_INSTANCE_PROFILE_7_SLICE: (0, "MIG 7g.40gb", 8),
    _real.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: (20, "MIG 1g.5gb+me", 1),
    _real.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: (15, "MIG 1g.10gb", 2),
}

A100_BUS_IDS = ["00000000:07:00.0", "00000000:0F:00.0", "00000000:47:00.0", "00000000:4E:00.0"]


def a100_mig_node(**kwargs: Any) -> FakeNode:
    name = "NVIDIA A100-SXM4-40GB"
    # GPU 0's instances, listed by NVML in creation order, not placement order.
    migs = [
        FakeMig(1, 0, 9, 4, 4, "MIG-0c1d2e3f-aaaa-5bbb-8ccc-000000000001", 19968, 42, f"{name} MIG 3g.20gb"),
        FakeMig(5, 0, 14, 0, 2, "MIG-0c1d2e3f-aaaa-5bbb-8ccc-000000000002", 9984, 28, f"{name} MIG 2g.10gb"),
        FakeMig(13, 0, 19, 3, 1, "MIG-0c1d2e3f-aaaa-5bbb-8ccc-000000000003", 4864, 14, f"{name} MIG 1g.5gb"),
        FakeMig(11, 0, 19, 2, 1, "MIG-0c1d2e3f-aaaa-5bbb-8ccc-000000000004", 4864, 14, f"{name} MIG 1g.5gb"),
    ]
    gpus = []
    for i, bus in enumerate(A100_BUS_IDS):
        # HGX A100 4-GPU: every pair of GPUs is joined by four direct links (12 links per GPU).
        links = [
            FakeLink(True, A100_BUS_IDS[j], _real.NVML_NVLINK_DEVICE_TYPE_GPU)
            for j in range(4)
            if j != i
            for _ in range(4)
        ]
        gpus.append(
            FakeGpu(
                uuid=f"GPU-a100a100-0000-1111-2222-33334444555{i}",
                name=name,
                bus_id=bus,
                minor=i,
                brand=_real.NVML_BRAND_NVIDIA,
                architecture=_real.NVML_DEVICE_ARCH_AMPERE,
                compute_capability=(8, 0),
                memory_mib=40960,
                multiprocessors=108,
                mig_mode=(1, 1) if i == 0 else (0, 1) if i == 1 else (0, 0),
                links=links,
                max_mig_devices=7,
                migs=migs if i == 0 else [],
                gi_profiles=dict(A100_GI_PROFILES),
            )
        )
    sysfs = [
        SysfsDevice(bus, root, 0 if i < 2 else 1)
        for i, (bus, root) in enumerate(zip(A100_BUS_IDS, ["00", "00", "40", "40"], strict=True))
    ]
    return FakeNode(FakeNvml(gpus, **kwargs, max_links=12), sysfs)


def sysfs_for(root: Path, node: FakeNode) -> Path:
    """Build <root>/devices/pci<domain>:<bus>/<root port>/<gpu> and the /sys/bus/pci/devices symlinks."""
    links_dir = root / "bus" / "pci" / "devices"
    links_dir.mkdir(parents=True, exist_ok=True)
    for device in node.sysfs:
        domain, bus, rest = device.bus_id.lower().split(":")
        bdf = f"{domain[-4:]}:{bus}:{rest}"
        root_port = f"{domain[-4:]}:{device.root_bus}:01.0"
        device_dir = root / "devices" / f"pci{domain[-4:]}:{device.root_bus}" / root_port / bdf
        device_dir.mkdir(parents=True)
        (device_dir / "vendor").write_text("0x10de\n")
        if device.numa_node is not None:
            (device_dir / "numa_node").write_text(f"{device.numa_node}\n")
        os.symlink(os.path.relpath(device_dir, links_dir), links_dir / bdf)
    return root
