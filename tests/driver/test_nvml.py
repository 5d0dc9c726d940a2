"""The NVML backend against a fake pynvml that answers like real NVML on three machine shapes."""

from __future__ import annotations

import pynvml
import pytest

from driver.errors import DiscoveryError
from driver.nvml import (
    architecture_for_capability,
    cuda_version_text,
    load_nvml_inventory,
    normalize_bus_id,
    numa_node_of,
    pcie_root_of,
)
from tests.fakes import nvml as fakepynvml
from tests.fakes.nvml import a100_mig_node, dgx_h100_node, pcie_pair_node, sysfs_for, without

MIB = 1024 * 1024


def islands(inventory):
    groups: dict[str, set[int]] = {}
    for gpu in inventory.gpus:
        groups.setdefault(gpu.nvlink_island, set()).add(gpu.index)
    return sorted(groups.values(), key=min)


def discover(node, tmp_path, nvml=None):
    sysfs = sysfs_for(tmp_path / "sys", node)
    return load_nvml_inventory("node-a", nvml_module=nvml or node.nvml, sysfs_root=sysfs)


# ---- an 8x H100 NVSwitch node -----------------------------------------------------------------


def test_dgx_h100_gpus_are_read_field_by_field(tmp_path):
    node = dgx_h100_node()
    inventory = discover(node, tmp_path)
    assert inventory.source == "nvml"
    assert inventory.node_name == "node-a"
    assert (inventory.driver_version, inventory.cuda_driver_version) == ("550.54.15", "12.4")
    assert [gpu.index for gpu in inventory.gpus] == list(range(8))
    gpu = inventory.gpus[4]
    assert gpu.uuid == "GPU-a1b2c3d4-0000-1111-2222-000000000004"
    assert gpu.minor == 4
    assert (gpu.product_name, gpu.brand, gpu.architecture) == ("NVIDIA H100 80GB HBM3", "Nvidia", "Hopper")
    assert gpu.cuda_compute_capability == "9.0"
    assert gpu.memory_bytes == 81559 * MIB
    assert gpu.multiprocessors == 132
    assert gpu.pci_bus_id == "0000:9a:00.0"  # NVML's "00000000:9A:00.0", normalized
    assert gpu.pcie_root == "pci0000:97"
    assert gpu.numa_node == 1
    assert (gpu.mig_capable, gpu.mig_enabled, gpu.mig_pending) == (True, False, False)
    assert gpu.mig_instances == ()


def test_dgx_h100_nvswitch_makes_one_island_with_seven_peers(tmp_path):
    inventory = discover(dgx_h100_node(), tmp_path)
    assert islands(inventory) == [set(range(8))]
    assert {gpu.nvlink_peers for gpu in inventory.gpus} == {7}


def test_nvswitch_is_recognised_without_the_remote_device_type_query(tmp_path):
    # Older pynvml lacks nvmlDeviceGetNvLinkRemoteDeviceType: a far end that is no local GPU is a switch.
    node = dgx_h100_node()
    inventory = discover(node, tmp_path, without(node.nvml, "nvmlDeviceGetNvLinkRemoteDeviceType"))
    assert islands(inventory) == [set(range(8))]
    assert {gpu.nvlink_peers for gpu in inventory.gpus} == {7}


def test_nvswitch_is_recognised_when_the_remote_type_query_fails(tmp_path):
    node = dgx_h100_node(failures={"nvmlDeviceGetNvLinkRemoteDeviceType": pynvml.NVMLError_NotSupported})
    inventory = discover(node, tmp_path)
    assert islands(inventory) == [set(range(8))]


def test_nvml_is_shut_down_after_reading(tmp_path):
    node = dgx_h100_node()
    discover(node, tmp_path)
    assert (node.nvml.init_calls, node.nvml.shutdown_calls) == (1, 1)
    assert not node.nvml.initialized


def test_inactive_links_do_not_join_islands(tmp_path):
    node = dgx_h100_node()
    assert node.nvml.gpus[7].links is not None
    for link in node.nvml.gpus[7].links:
        link.active = False  # e.g. the fabric manager has not trained GPU 7's links
    inventory = discover(node, tmp_path)
    assert islands(inventory) == [set(range(7)), {7}]
    assert [gpu.nvlink_peers for gpu in inventory.gpus] == [6] * 7 + [0]


def test_unreadable_remote_end_of_a_link_is_skipped(tmp_path):
    node = dgx_h100_node(failures={"nvmlDeviceGetNvLinkRemotePciInfo": pynvml.NVMLError_Unknown})
    inventory = discover(node, tmp_path)
    assert islands(inventory) == [{i} for i in range(8)]


# ---- a 2-card PCIe node without NVLink --------------------------------------------------------


def test_pcie_pair_without_nvlink_or_mig(tmp_path):
    inventory = discover(pcie_pair_node(), tmp_path)
    assert len(inventory.gpus) == 2
    for gpu in inventory.gpus:
        assert (gpu.product_name, gpu.brand, gpu.architecture) == ("Tesla T4", "Tesla", "Turing")
        assert gpu.cuda_compute_capability == "7.5"
        assert (gpu.mig_capable, gpu.mig_enabled, gpu.mig_pending) == (False, False, False)
        assert gpu.nvlink_peers == 0
    assert islands(inventory) == [{0}, {1}]
    assert [(g.pci_bus_id, g.pcie_root, g.numa_node) for g in inventory.gpus] == [
        ("0000:3b:00.0", "pci0000:3a", 0),
        ("0000:af:00.0", "pci0000:ae", 1),
    ]


def test_bytes_from_older_pynvml_are_decoded(tmp_path):
    inventory = discover(pcie_pair_node(bytes_strings=True), tmp_path)
    assert inventory.driver_version == "550.54.15"
    assert inventory.gpus[0].product_name == "Tesla T4"
    assert inventory.gpus[0].uuid == "GPU-7e57a000-1111-2222-3333-444455556660"


def test_real_pci_info_struct_is_read(tmp_path, monkeypatch):
    # The real nvmlPciInfo_t: a NUL-padded char array that pynvml hands back as bytes or str by release.
    node = pcie_pair_node()
    info = pynvml.nvmlPciInfo_t()
    info.busId = b"00000000:3B:00.0"
    original = node.nvml.nvmlDeviceGetPciInfo
    monkeypatch.setattr(node.nvml, "nvmlDeviceGetPciInfo", lambda h: info if h.index == 0 else original(h))
    inventory = discover(node, tmp_path)
    assert inventory.gpus[0].pci_bus_id == "0000:3b:00.0"


# ---- an A100 node with MIG --------------------------------------------------------------------


def test_a100_mig_instances_are_read_with_placements(tmp_path):
    inventory = discover(a100_mig_node(), tmp_path)
    gpu = inventory.gpus[0]
    assert (gpu.mig_capable, gpu.mig_enabled, gpu.mig_pending) == (True, True, True)
    got = [
        (i.profile, i.placement_start, i.placement_size, i.memory_bytes // MIB, i.multiprocessors)
        for i in gpu.mig_instances
    ]
    # listed in placement order whatever order NVML enumerates them in
    assert got == [
        ("2g.10gb", 0, 2, 9984, 28),
        ("1g.5gb", 2, 1, 4864, 14),
        ("1g.5gb", 3, 1, 4864, 14),
        ("3g.20gb", 4, 4, 19968, 42),
    ]
    assert [(i.gpu_instance_id, i.compute_instance_id) for i in gpu.mig_instances] == [(5, 0), (11, 0), (13, 0), (1, 0)]
    assert gpu.mig_instances[0].uuid == "MIG-0c1d2e3f-aaaa-5bbb-8ccc-000000000002"


def test_a100_pending_mig_mode_is_reported(tmp_path):
    gpus = discover(a100_mig_node(), tmp_path).gpus
    assert (gpus[1].mig_enabled, gpus[1].mig_pending) == (False, True)
    assert gpus[1].mig_instances == ()
    assert (gpus[2].mig_enabled, gpus[2].mig_pending) == (False, False)


def test_a100_direct_nvlinks_make_one_island(tmp_path):
    inventory = discover(a100_mig_node(), tmp_path)
    assert islands(inventory) == [{0, 1, 2, 3}]
    assert {gpu.nvlink_peers for gpu in inventory.gpus} == {3}


def test_mig_profile_name_falls_back_to_the_device_name(tmp_path):
    node = a100_mig_node(failures={"nvmlDeviceGetGpuInstanceProfileInfo": pynvml.NVMLError_NotSupported})
    gpu = discover(node, tmp_path).gpus[0]
    assert [i.profile for i in gpu.mig_instances] == ["2g.10gb", "1g.5gb", "1g.5gb", "3g.20gb"]


def test_mig_device_that_cannot_be_described_is_left_out(tmp_path):
    node = a100_mig_node()
    node.nvml.gpus[0].failures["nvmlGpuInstanceGetInfo"] = pynvml.NVMLError_NoPermission
    gpu = discover(node, tmp_path).gpus[0]
    assert gpu.mig_enabled
    assert gpu.mig_instances == ()


# ---- unsupported queries and failures ---------------------------------------------------------


def test_missing_architecture_query_falls_back_to_compute_capability(tmp_path):
    node = pcie_pair_node()
    node.nvml.gpus[0].architecture = None
    node.nvml.gpus[1].architecture = 0xFFFFFFFF  # NVML_DEVICE_ARCH_UNKNOWN
    gpus = discover(node, tmp_path).gpus
    assert [g.architecture for g in gpus] == ["Turing", "Turing"]


def test_unsupported_brand_is_unknown(tmp_path):
    node = pcie_pair_node(failures={"nvmlDeviceGetBrand": pynvml.NVMLError_NotSupported})
    assert discover(node, tmp_path).gpus[0].brand == "Unknown"


def test_unsupported_sm_count_is_published_as_zero(tmp_path):
    node = pcie_pair_node()
    node.nvml.gpus[1].multiprocessors = None
    gpus = discover(node, tmp_path).gpus
    assert [g.multiprocessors for g in gpus] == [40, 0]


def test_cuda_version_falls_back_to_the_v1_query(tmp_path):
    node = pcie_pair_node(
        cuda_version=12020, failures={"nvmlSystemGetCudaDriverVersion_v2": pynvml.NVMLError_FunctionNotFound}
    )
    assert discover(node, tmp_path).cuda_driver_version == "12.2"


def test_functions_missing_from_an_older_pynvml_count_as_unsupported(tmp_path):
    node = a100_mig_node(cuda_version=11080)
    older = node.nvml
    for name in ("nvmlSystemGetCudaDriverVersion_v2", "nvmlDeviceGetArchitecture", "nvmlDeviceGetMigMode"):
        older = without(older, name)
    inventory = discover(node, tmp_path, older)
    assert inventory.cuda_driver_version == "11.8"
    assert {g.architecture for g in inventory.gpus} == {"Ampere"}
    assert {(g.mig_capable, g.mig_enabled) for g in inventory.gpus} == {(False, False)}


def test_failing_nvlink_state_query_costs_only_that_link(tmp_path):
    node = dgx_h100_node()
    node.nvml.gpus[0].failures["nvmlDeviceGetNvLinkState"] = pynvml.NVMLError_Unknown
    inventory = discover(node, tmp_path)
    assert len(inventory.gpus) == 8
    assert islands(inventory) == [{0}, set(range(1, 8))]


def test_unopenable_mig_slots_are_skipped_but_the_gpu_is_kept(tmp_path):
    node = a100_mig_node()
    node.nvml.gpus[0].failures["nvmlDeviceGetMigDeviceHandleByIndex"] = pynvml.NVMLError_NoPermission
    gpu = discover(node, tmp_path).gpus[0]
    assert gpu.mig_enabled
    assert gpu.mig_instances == ()


def test_missing_nvml_library_is_a_discovery_error(tmp_path):
    node = dgx_h100_node(failures={"nvmlInit": pynvml.NVMLError_LibraryNotFound})
    with pytest.raises(DiscoveryError) as info:
        discover(node, tmp_path)
    message = str(info.value)
    assert "NVML could not be initialised (NVMLError_LibraryNotFound: NVML Shared Library Not Found)" in message
    assert "libnvidia-ml.so.1" in message
    assert node.nvml.shutdown_calls == 0


def test_driver_not_loaded_is_a_discovery_error(tmp_path):
    node = dgx_h100_node(failures={"nvmlInit": pynvml.NVMLError_DriverNotLoaded})
    with pytest.raises(DiscoveryError, match="NVMLError_DriverNotLoaded: Driver Not Loaded"):
        discover(node, tmp_path)


def test_failure_to_list_gpus_still_shuts_nvml_down(tmp_path):
    node = dgx_h100_node(failures={"nvmlDeviceGetCount": pynvml.NVMLError_Unknown})
    with pytest.raises(DiscoveryError, match="NVML failed while listing GPUs: NVMLError_Unknown"):
        discover(node, tmp_path)
    assert node.nvml.shutdown_calls == 1
    assert not node.nvml.initialized


def test_lost_gpu_is_left_out_and_the_rest_published(tmp_path):
    node = dgx_h100_node()
    node.nvml.gpus[3].failures["nvmlDeviceGetUUID"] = pynvml.NVMLError_GpuIsLost
    inventory = discover(node, tmp_path)
    assert [gpu.index for gpu in inventory.gpus] == [0, 1, 2, 4, 5, 6, 7]
    assert inventory.extra["skippedGpus"] == "3: NVMLError_GpuIsLost: GPU is lost"
    # the lost GPU's switch links are gone with it; the others still share the fabric
    assert islands(inventory) == [{0, 1, 2, 4, 5, 6, 7}]
    assert node.nvml.shutdown_calls == 1


def test_gpu_whose_handle_cannot_be_opened_is_left_out(tmp_path):
    node = pcie_pair_node()
    node.nvml.gpus[0].failures["nvmlDeviceGetHandleByIndex"] = pynvml.NVMLError_NoPermission
    inventory = discover(node, tmp_path)
    assert [gpu.index for gpu in inventory.gpus] == [1]
    assert "0: NVMLError_NoPermission" in inventory.extra["skippedGpus"]


def test_malformed_bus_id_leaves_the_gpu_out(tmp_path):
    node = pcie_pair_node()
    node.nvml.gpus[1].bus_id = "garbage"
    node.sysfs.pop()
    inventory = discover(node, tmp_path)
    assert [gpu.index for gpu in inventory.gpus] == [0]
    assert "not a PCI bus id: 'garbage'" in inventory.extra["skippedGpus"]


def test_failing_shutdown_does_not_hide_the_inventory(tmp_path):
    node = pcie_pair_node(failures={"nvmlShutdown": pynvml.NVMLError_Uninitialized})
    assert len(discover(node, tmp_path).gpus) == 2


def test_missing_sysfs_entries_give_unknown_root_and_numa(tmp_path):
    node = pcie_pair_node()
    node.sysfs[1] = fakepynvml.SysfsDevice(node.sysfs[1].bus_id, "ae", None)  # no numa_node file
    node.sysfs.pop(0)  # GPU 0 not in sysfs at all
    gpus = discover(node, tmp_path).gpus
    assert (gpus[0].pcie_root, gpus[0].numa_node) == ("", -1)
    assert (gpus[1].pcie_root, gpus[1].numa_node) == ("pci0000:ae", -1)


# ---- helpers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("00000000:18:00.0", "0000:18:00.0"),
        ("00000000:9A:00.0", "0000:9a:00.0"),
        ("0001:AB:1F.3", "0001:ab:1f.3"),
        ("3b:00.0", "0000:3b:00.0"),
        ("  00000000:07:00.0\x00", "0000:07:00.0"),
    ],
)
def test_bus_ids_are_normalized_to_lower_case_extended_bdf(raw, expected):
    assert normalize_bus_id(raw.rstrip("\x00")) == expected


@pytest.mark.parametrize("raw", ["", "0000:18:00", "0000:18:00.8", "zz:00.0", "000000000:18:00.0"])
def test_bad_bus_ids_are_rejected(raw):
    with pytest.raises(ValueError, match="not a PCI bus id"):
        normalize_bus_id(raw)


def test_cuda_version_integer_is_major_dot_minor():
    assert [cuda_version_text(v) for v in (12040, 12020, 11080, 13000)] == ["12.4", "12.2", "11.8", "13.0"]


def test_architecture_from_capability():
    got = [architecture_for_capability(*cc) for cc in ((9, 0), (8, 9), (8, 6), (7, 5), (7, 0), (10, 0), (1, 0))]
    assert got == ["Hopper", "Ada Lovelace", "Ampere", "Turing", "Volta", "Blackwell", "Unknown"]


def test_sysfs_helpers_follow_the_device_symlink(tmp_path):
    node = dgx_h100_node()
    sysfs = sysfs_for(tmp_path, node)
    assert pcie_root_of(sysfs, "0000:db:00.0") == "pci0000:d7"
    assert numa_node_of(sysfs, "0000:db:00.0") == 1
    assert pcie_root_of(sysfs, "0000:01:00.0") == ""
    assert numa_node_of(sysfs, "0000:01:00.0") == -1
