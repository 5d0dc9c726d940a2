"""Dynamic MIG: the simulated manager's placement rules and the NVML manager's call sequence."""

from __future__ import annotations

import ctypes
import dataclasses
import functools
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from driver.discovery import load_inventory
from driver.mig import H100_80GB
from kubeletplugin.migmanager import CreatedMig, MigError, NvmlMigManager, SimulatedMigManager


@functools.cache
def h100_mig():
    return load_inventory("node-a", simulate="h100-16-mig")


def gpu(index: int = 0):
    return h100_mig().gpu_by_index(index)


P = {p.name: p for p in H100_80GB.profiles}


# --- simulated --------------------------------------------------------------------------------


def test_simulated_create_records_an_instance(tmp_path):
    mig = SimulatedMigManager(tmp_path).create(gpu(1), P["2g.20gb"], 2)
    assert (mig.gpu_uuid, mig.gpu_index, mig.profile, mig.placement, mig.size) == (gpu(1).uuid, 1, "2g.20gb", 2, 2)
    assert mig.uuid.startswith("MIG-")
    assert SimulatedMigManager(tmp_path).created() == [mig]
    assert SimulatedMigManager(tmp_path).exists(mig)


def test_simulated_instances_get_distinct_gpu_instance_ids(tmp_path):
    manager = SimulatedMigManager(tmp_path)
    a = manager.create(gpu(), P["1g.10gb"], 0)
    b = manager.create(gpu(), P["1g.10gb"], 1)
    assert a.gpu_instance_id != b.gpu_instance_id
    assert a.uuid != b.uuid


def test_simulated_overlapping_placement_is_refused(tmp_path):
    manager = SimulatedMigManager(tmp_path)
    manager.create(gpu(), P["3g.40gb"], 0)
    with pytest.raises(MigError, match=r"2g.20gb at memory slice 2 overlaps GPU instance 1 \(slices 0..3\)"):
        manager.create(gpu(), P["2g.20gb"], 2)


def test_simulated_same_placement_on_another_gpu_is_fine(tmp_path):
    manager = SimulatedMigManager(tmp_path)
    manager.create(gpu(0), P["7g.80gb"], 0)
    manager.create(gpu(1), P["7g.80gb"], 0)
    assert len(manager.created()) == 2


def test_simulated_compute_slices_run_out(tmp_path):
    manager = SimulatedMigManager(tmp_path)
    manager.create(gpu(), P["4g.40gb"], 0)
    manager.create(gpu(), P["2g.20gb"], 4)
    manager.create(gpu(), P["1g.10gb"], 6)  # 7 of 7 compute slices, memory slice 7 still free
    last_slice = dataclasses.replace(P["1g.10gb"], placements=(7,))
    with pytest.raises(MigError, match=r"not enough compute slices left for 1g.10gb \(7 of 7 in use\)"):
        manager.create(gpu(), last_slice, 7)


def test_simulated_invalid_placement_is_refused(tmp_path):
    with pytest.raises(MigError, match="cannot be placed at memory slice 1"):
        SimulatedMigManager(tmp_path).create(gpu(), P["3g.40gb"], 1)


def test_simulated_gpu_without_mig_is_refused(tmp_path):
    t4 = load_inventory("node-a", simulate="t4-4").gpus[0]
    with pytest.raises(MigError, match="is not MIG capable"):
        SimulatedMigManager(tmp_path).create(t4, P["1g.10gb"], 0)


def test_simulated_destroy_is_idempotent_and_frees_the_placement(tmp_path):
    manager = SimulatedMigManager(tmp_path)
    mig = manager.create(gpu(), P["7g.80gb"], 0)
    manager.destroy(mig)
    manager.destroy(mig)
    assert not manager.exists(mig)
    manager.create(gpu(), P["7g.80gb"], 0)


def test_unreadable_journal_starts_empty(tmp_path):
    (tmp_path / "mig-instances.json").write_text("{broken")
    assert SimulatedMigManager(tmp_path).created() == []


def test_created_mig_round_trip():
    mig = CreatedMig("GPU-1", 1, 1, "1g.10gb", 3, 1, 2, 0, "MIG-x")
    assert CreatedMig.from_dict(mig.to_dict()) == mig


# --- NVML ---------------------------------------------------------------------------------------

# H100 GPU-instance profiles as NVML numbers them: id -> (compute slices, memory MiB); 7 is 1g.10gb+me.
H100_GI_PROFILES = {
    0: (1, 9856),
    1: (2, 19968),
    2: (3, 40192),
    3: (4, 40192),
    4: (7, 80896),
    7: (1, 9856),
    9: (1, 19968),
}


class FakeMigNvml:
    """Just enough of pynvml to create, find and destroy MIG instances on one H100."""

    NVMLError = pynvml.NVMLError
    NVML_ERROR_NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
    NVML_GPU_INSTANCE_PROFILE_COUNT = pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    c_nvmlGpuInstancePlacement_t = pynvml.c_nvmlGpuInstancePlacement_t

    def __init__(self, gpu_uuid: str) -> None:
        self.gpu_uuid = gpu_uuid
        self.instances: dict[int, dict[str, Any]] = {}  # gi id -> {start, size, profile_id, cis: {ci id: uuid}}
        self.fail_ci = False
        self.calls: list[str] = []
        for n in (1, 2, 3, 4, 6, 7, 8):
            setattr(self, f"NVML_COMPUTE_INSTANCE_PROFILE_{n}_SLICE", 100 + n)

    def nvmlInit(self) -> None:
        self.calls.append("init")

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        if uuid != self.gpu_uuid:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return "gpu"

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: str, pid: int) -> SimpleNamespace:
        if pid not in H100_GI_PROFILES:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        slices, mib = H100_GI_PROFILES[pid]
        return SimpleNamespace(id=pid, sliceCount=slices, memorySizeMB=mib)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: str, pid: int, placement: Any) -> int:
        where = placement._obj
        for inst in self.instances.values():
            if where.start < inst["start"] + inst["size"] and inst["start"] < where.start + where.size:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi = next(i for i in range(1, 15) if i not in self.instances)
        self.instances[gi] = {"start": where.start, "size": where.size, "profile_id": pid, "cis": {}}
        self.calls.append(f"create-gi {pid} {where.start}/{where.size}")
        return gi

    def nvmlGpuInstanceGetInfo(self, gi: int) -> SimpleNamespace:
        return SimpleNamespace(id=gi)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi: int, profile: int, eng: int) -> SimpleNamespace:
        assert eng == self.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        return SimpleNamespace(id=profile)

    def nvmlGpuInstanceCreateComputeInstance(self, gi: int, profile_id: int) -> tuple[int, int]:
        if self.fail_ci:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        self.instances[gi]["cis"][0] = f"MIG-{gi}-0"
        self.calls.append(f"create-ci {profile_id}")
        return (gi, 0)

    def nvmlComputeInstanceGetInfo(self, ci: tuple[int, int]) -> SimpleNamespace:
        return SimpleNamespace(id=ci[1])

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: str) -> int:
        return 7

    def _slots(self) -> list[tuple[int, int, str]]:
        return [(gi, ci, uuid) for gi, inst in sorted(self.instances.items()) for ci, uuid in inst["cis"].items()]

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: str, index: int) -> tuple[int, int, str]:
        slots = self._slots()
        if index >= len(slots):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return slots[index]

    def nvmlDeviceGetGpuInstanceId(self, mig: tuple[int, int, str]) -> int:
        return mig[0]

    def nvmlDeviceGetComputeInstanceId(self, mig: tuple[int, int, str]) -> int:
        return mig[1]

    def nvmlDeviceGetUUID(self, mig: tuple[int, int, str]) -> bytes:
        return mig[2].encode()

    def nvmlDeviceGetGpuInstanceById(self, handle: str, gi: int) -> int:
        if gi not in self.instances:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return gi

    def nvmlGpuInstanceGetComputeInstanceById(self, gi: int, ci: int) -> tuple[int, int]:
        if ci not in self.instances[gi]["cis"]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return (gi, ci)

    def nvmlComputeInstanceDestroy(self, ci: tuple[int, int]) -> None:
        del self.instances[ci[0]]["cis"][ci[1]]
        self.calls.append(f"destroy-ci {ci[0]}/{ci[1]}")

    def nvmlGpuInstanceDestroy(self, gi: int) -> None:
        del self.instances[gi]
        self.calls.append(f"destroy-gi {gi}")


@pytest.fixture
def nvml():
    return FakeMigNvml(gpu().uuid)


def test_nvml_create_makes_gpu_and_compute_instance(tmp_path, nvml):
    mig = NvmlMigManager(tmp_path, nvml).create(gpu(), P["3g.40gb"], 4)
    assert nvml.calls == ["init", "create-gi 2 4/4", "create-ci 103"]
    assert (mig.gpu_instance_id, mig.compute_instance_id, mig.uuid) == (1, 0, "MIG-1-0")
    assert NvmlMigManager(tmp_path, nvml).created() == [mig]
    assert NvmlMigManager(tmp_path, nvml).exists(mig)


def test_nvml_profile_is_matched_by_slices_and_memory_not_media_variant(tmp_path, nvml):
    manager = NvmlMigManager(tmp_path, nvml)
    manager.create(gpu(), P["1g.10gb"], 0)
    manager.create(gpu(), P["1g.20gb"], 2)
    assert [c for c in nvml.calls if c.startswith("create-gi")] == ["create-gi 0 0/1", "create-gi 9 2/2"]


def test_nvml_overlap_is_a_mig_error(tmp_path, nvml):
    manager = NvmlMigManager(tmp_path, nvml)
    manager.create(gpu(), P["7g.80gb"], 0)
    with pytest.raises(MigError, match=r"creating MIG 1g\.10gb at memory slice 3 failed"):
        manager.create(gpu(), P["1g.10gb"], 3)
    assert len(manager.created()) == 1


def test_nvml_failed_compute_instance_destroys_its_gpu_instance(tmp_path, nvml):
    nvml.fail_ci = True
    with pytest.raises(MigError):
        NvmlMigManager(tmp_path, nvml).create(gpu(), P["2g.20gb"], 0)
    assert nvml.instances == {}
    assert "destroy-gi 1" in nvml.calls


def test_nvml_destroy_removes_both_instances_and_is_idempotent(tmp_path, nvml):
    manager = NvmlMigManager(tmp_path, nvml)
    mig = manager.create(gpu(), P["2g.20gb"], 2)
    manager.destroy(mig)
    assert nvml.instances == {}
    assert nvml.calls[-2:] == ["destroy-ci 1/0", "destroy-gi 1"]
    manager.destroy(mig)
    assert manager.created() == []
    assert not manager.exists(mig)


def test_nvml_destroy_leaves_an_instance_that_reused_the_id_alone(tmp_path, nvml):
    manager = NvmlMigManager(tmp_path, nvml)
    mig = manager.create(gpu(), P["2g.20gb"], 2)
    nvml.instances[1]["cis"][0] = "MIG-someone-else"  # GPU reset, then an admin created an instance with id 1
    manager.destroy(mig)
    assert nvml.instances[1]["cis"] == {0: "MIG-someone-else"}
    assert manager.created() == []


def test_nvml_destroy_failure_is_a_mig_error_and_keeps_the_record(tmp_path, nvml, monkeypatch):
    manager = NvmlMigManager(tmp_path, nvml)
    mig = manager.create(gpu(), P["2g.20gb"], 2)

    def busy(gi):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)

    monkeypatch.setattr(nvml, "nvmlGpuInstanceDestroy", busy)
    with pytest.raises(MigError, match=r"destroying MIG instance MIG-1-0 \(GPU instance 1\)"):
        manager.destroy(mig)
    assert manager.created() == [mig]


def test_nvml_unknown_profile_is_an_error(tmp_path, nvml):
    odd = SimpleNamespace(name="5g.50gb", compute_slices=5, memory_slices=5, memory_bytes=50 * 1024**3)
    with pytest.raises(MigError, match=r"no MIG profile matching 5g\.50gb"):
        NvmlMigManager(tmp_path, nvml).create(gpu(), odd, 0)  # type: ignore[arg-type]


def test_nvml_placement_struct_is_passed_by_reference(tmp_path, nvml):
    seen = []
    original = nvml.nvmlDeviceCreateGpuInstanceWithPlacement

    def spy(handle, pid, placement):
        seen.append(type(placement).__name__)
        assert isinstance(placement._obj, ctypes.Structure)
        return original(handle, pid, placement)

    nvml.nvmlDeviceCreateGpuInstanceWithPlacement = spy
    NvmlMigManager(tmp_path, nvml).create(gpu(), P["1g.10gb"], 5)
    assert seen == ["CArgObject"]
