"""Dynamic MIG: create a GPU instance + compute instance at prepare, destroy it at unprepare.

Only devices published with `--mig-strategy dynamic` need this; static MIG devices already exist.
Both implementations keep a journal of the instances tessera created (`<state>/mig-instances.json`)
so instances left behind by a crash can be found and destroyed on restart, and admin-created
instances are never touched. The simulated implementation treats that journal as the hardware.
"""

from __future__ import annotations

import ctypes
import json
import uuid as uuidlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from driver.allocation import MigKey
from driver.atomicfile import write_atomic
from driver.errors import DeviceError
from driver.mig import MigProfile, layout_for
from driver.model import Gpu
from kubeletplugin.nodelocks import SharedFileLock

log = structlog.get_logger(__name__)

MIB = 1024 * 1024


class MigError(DeviceError):
    """A MIG instance could not be created or destroyed."""

    reason = "mig"


@dataclass(frozen=True)
class CreatedMig:
    gpu_uuid: str
    gpu_index: int
    gpu_minor: int
    profile: str
    placement: int  # first memory slice
    size: int  # memory slices
    gpu_instance_id: int
    compute_instance_id: int
    uuid: str  # "MIG-..."

    @property
    def key(self) -> MigKey:
        return MigKey(self.gpu_uuid, self.profile, self.placement)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CreatedMig:
        return cls(
            gpu_uuid=str(data["gpu_uuid"]),
            gpu_index=int(data["gpu_index"]),
            gpu_minor=int(data["gpu_minor"]),
            profile=str(data["profile"]),
            placement=int(data["placement"]),
            size=int(data["size"]),
            gpu_instance_id=int(data["gpu_instance_id"]),
            compute_instance_id=int(data["compute_instance_id"]),
            uuid=str(data["uuid"]),
        )


class MigManager(Protocol):
    def create(self, gpu: Gpu, profile: MigProfile, placement: int) -> CreatedMig: ...

    def destroy(self, mig: CreatedMig) -> None: ...

    def exists(self, mig: CreatedMig) -> bool: ...

    def created(self) -> list[CreatedMig]: ...


class _Journal:
    """The instances tessera created, in a JSON file that survives restarts."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # both instances of a rolling update create and destroy instances through this journal
        self.lock = SharedFileLock(path)

    def load(self) -> list[CreatedMig]:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        except ValueError:
            log.error("mig journal unreadable; starting with an empty one", path=str(self.path))
            return []
        return [CreatedMig.from_dict(r) for r in raw] if isinstance(raw, list) else []

    def save(self, migs: list[CreatedMig]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps([m.to_dict() for m in migs], indent=1).encode(), 0o600)


def _overlaps(start: int, size: int, other_start: int, other_size: int) -> bool:
    return start < other_start + other_size and other_start < start + size


class SimulatedMigManager:
    """Instances exist only in the journal; overlapping placements are refused like NVML refuses them."""

    def __init__(self, state_dir: Path) -> None:
        self.journal = _Journal(state_dir / "mig-instances.json")

    def create(self, gpu: Gpu, profile: MigProfile, placement: int) -> CreatedMig:
        if not gpu.mig_capable:
            raise MigError(f"{gpu.device_name} ({gpu.product_name}) is not MIG capable")
        if placement not in profile.placements:
            raise MigError(f"{profile.name} cannot be placed at memory slice {placement} on {gpu.device_name}")
        with self.journal.lock:
            migs = self.journal.load()
            mine = [m for m in migs if m.gpu_uuid == gpu.uuid]
            taken = [(m.placement, m.size, m.gpu_instance_id) for m in mine]
            taken += [(i.placement_start, i.placement_size, i.gpu_instance_id) for i in gpu.mig_instances]
            for start, size, gi in taken:
                if _overlaps(placement, profile.memory_slices, start, size):
                    raise MigError(
                        f"{gpu.device_name}: {profile.name} at memory slice {placement} overlaps GPU instance {gi} "
                        f"(slices {start}..{start + size - 1})"
                    )
            layout = layout_for(gpu.product_name)
            if layout is not None:
                used = sum(layout.profile(m.profile).compute_slices for m in mine)
                used += sum(layout.profile(i.profile).compute_slices for i in gpu.mig_instances)
                if used + profile.compute_slices > layout.compute_slices:
                    raise MigError(
                        f"{gpu.device_name}: not enough compute slices left for {profile.name} "
                        f"({used} of {layout.compute_slices} in use)"
                    )
            used_ids = {gi for _, _, gi in taken}
            gi_id = next(i for i in range(1, 64) if i not in used_ids)
            mig = CreatedMig(
                gpu_uuid=gpu.uuid,
                gpu_index=gpu.index,
                gpu_minor=gpu.minor,
                profile=profile.name,
                placement=placement,
                size=profile.memory_slices,
                gpu_instance_id=gi_id,
                compute_instance_id=0,
                uuid="MIG-"
                + str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"{gpu.uuid}/gi{gi_id}/{profile.name}/{placement}")),
            )
            self.journal.save([*migs, mig])
        log.info("mig instance created", gpu=gpu.device_name, profile=profile.name, placement=placement, gi=gi_id)
        return mig

    def destroy(self, mig: CreatedMig) -> None:
        with self.journal.lock:
            migs = self.journal.load()
            rest = [m for m in migs if m != mig]
            if len(rest) != len(migs):
                self.journal.save(rest)
                log.info("mig instance destroyed", gpu_uuid=mig.gpu_uuid, gi=mig.gpu_instance_id)

    def exists(self, mig: CreatedMig) -> bool:
        with self.journal.lock:
            return mig in self.journal.load()

    def created(self) -> list[CreatedMig]:
        with self.journal.lock:
            return self.journal.load()


class NvmlMigManager:
    """Creates instances through NVML (pynvml); the GPU must already be in MIG mode."""

    def __init__(self, state_dir: Path, nvml: Any = None) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self.nvml = nvml
        self.nvml.nvmlInit()
        self.journal = _Journal(state_dir / "mig-instances.json")

    def _gi_profile_id(self, handle: Any, profile: MigProfile) -> int:
        """The NVML GPU-instance profile with the profile's slice count and memory (first id wins: no +me variants)."""
        want_mib = profile.memory_bytes // MIB
        for pid in range(self.nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = self.nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, pid)
            except self.nvml.NVMLError:
                continue
            if (
                int(info.sliceCount) == profile.compute_slices
                and abs(int(info.memorySizeMB) - want_mib) <= want_mib // 20
            ):
                return int(info.id)
        raise MigError(f"this GPU offers no MIG profile matching {profile.name}")

    def create(self, gpu: Gpu, profile: MigProfile, placement: int) -> CreatedMig:
        nv = self.nvml
        with self.journal.lock:
            try:
                handle = nv.nvmlDeviceGetHandleByUUID(gpu.uuid)
                profile_id = self._gi_profile_id(handle, profile)
                where = nv.c_nvmlGpuInstancePlacement_t()
                where.start, where.size = placement, profile.memory_slices
                gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile_id, ctypes.byref(where))
                gi_id = int(nv.nvmlGpuInstanceGetInfo(gi).id)
                try:
                    ci_profile = getattr(nv, f"NVML_COMPUTE_INSTANCE_PROFILE_{profile.compute_slices}_SLICE")
                    ci_info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                        gi, ci_profile, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                    )
                    ci = nv.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
                    ci_id = int(nv.nvmlComputeInstanceGetInfo(ci).id)
                except Exception:
                    nv.nvmlGpuInstanceDestroy(gi)
                    raise
                mig_uuid = self._mig_uuid(handle, gi_id, ci_id)
            except nv.NVMLError as exc:
                raise MigError(
                    f"{gpu.device_name}: creating MIG {profile.name} at memory slice {placement} failed: {exc}"
                ) from exc
            mig = CreatedMig(
                gpu.uuid, gpu.index, gpu.minor, profile.name, placement, profile.memory_slices, gi_id, ci_id, mig_uuid
            )
            self.journal.save([*self.journal.load(), mig])
        log.info("mig instance created", gpu=gpu.device_name, profile=profile.name, placement=placement, gi=gi_id)
        return mig

    def _mig_uuid(self, handle: Any, gi_id: int, ci_id: int) -> str:
        nv = self.nvml
        for i in range(int(nv.nvmlDeviceGetMaxMigDeviceCount(handle))):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
            except nv.NVMLError:
                continue
            if (
                int(nv.nvmlDeviceGetGpuInstanceId(mig)) == gi_id
                and int(nv.nvmlDeviceGetComputeInstanceId(mig)) == ci_id
            ):
                value = nv.nvmlDeviceGetUUID(mig)
                return value.decode() if isinstance(value, bytes) else str(value)
        raise MigError(f"created GPU instance {gi_id} / compute instance {ci_id} but NVML lists no such MIG device")

    def destroy(self, mig: CreatedMig) -> None:
        """Destroy the instance if it is still the one tessera created; an id reused by another is left alone."""
        nv = self.nvml
        with self.journal.lock:
            if self.exists(mig):
                try:
                    handle = nv.nvmlDeviceGetHandleByUUID(mig.gpu_uuid)
                    gi = nv.nvmlDeviceGetGpuInstanceById(handle, mig.gpu_instance_id)
                    ci = nv.nvmlGpuInstanceGetComputeInstanceById(gi, mig.compute_instance_id)
                    nv.nvmlComputeInstanceDestroy(ci)
                    nv.nvmlGpuInstanceDestroy(gi)
                except nv.NVMLError as exc:
                    raise MigError(
                        f"destroying MIG instance {mig.uuid} (GPU instance {mig.gpu_instance_id}): {exc}"
                    ) from exc
                log.info("mig instance destroyed", gpu_uuid=mig.gpu_uuid, gi=mig.gpu_instance_id)
            else:
                log.info("mig instance already gone", gpu_uuid=mig.gpu_uuid, gi=mig.gpu_instance_id, uuid=mig.uuid)
            self.journal.save([m for m in self.journal.load() if m != mig])

    def exists(self, mig: CreatedMig) -> bool:
        nv = self.nvml
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(mig.gpu_uuid)
            return self._mig_uuid(handle, mig.gpu_instance_id, mig.compute_instance_id) == mig.uuid
        except (nv.NVMLError, MigError):
            return False

    def created(self) -> list[CreatedMig]:
        with self.journal.lock:
            return self.journal.load()
