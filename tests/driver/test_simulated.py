"""The simulated backend: built-in profiles describe real machines, user profiles get precise errors."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from driver import mig
from driver.discovery import load_inventory
from driver.errors import DiscoveryError
from driver.simulated import builtin_profiles, gpu_uuid, load_profile, mig_uuid, simulated_inventory

MIB = 1024 * 1024
GPU_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MIG_UUID = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
BUS_ID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
PCIE_ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")


def islands(inventory):
    groups: dict[str, set[int]] = {}
    for gpu in inventory.gpus:
        groups.setdefault(gpu.nvlink_island, set()).add(gpu.index)
    return sorted(groups.values(), key=min)


# A complete single-GPU profile that the error tests below break one field at a time.
VALID = """\
driverVersion: "550.54.15"
cudaDriverVersion: "12.4"
gpus:
  - count: 4
    productName: NVIDIA H100 80GB HBM3
    brand: Nvidia
    architecture: Hopper
    cudaComputeCapability: "9.0"
    memory: 81559Mi
    multiprocessors: 132
    migCapable: true
"""


def write(tmp_path: Path, text: str, name: str = "node.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def load_error(tmp_path: Path, text: str) -> DiscoveryError:
    path = write(tmp_path, text)
    with pytest.raises(DiscoveryError) as info:
        load_inventory("node-a", simulate=path)
    assert path in str(info.value), "the error must name the file"
    return info.value


# ---- built-in profiles ------------------------------------------------------------------------


def test_builtin_profiles_are_shipped():
    assert set(builtin_profiles()) >= {"dgx-h100-8", "a100-pcie-4", "t4-4", "mixed", "h100-16-mig", "a100-pcie-8-mig"}


def test_default_backend_is_the_dgx_h100_profile():
    inventory = load_inventory("node-a")
    assert inventory.source == "simulated:dgx-h100-8"
    assert inventory.node_name == "node-a"
    assert len(inventory.gpus) == 8
    assert {gpu.product_name for gpu in inventory.gpus} == {"NVIDIA H100 80GB HBM3"}


def test_dgx_h100_8_describes_an_hgx_h100_node():
    inventory = load_inventory("node-a", simulate="dgx-h100-8")
    assert inventory.extra["description"].startswith("NVIDIA DGX H100")
    assert inventory.driver_version == "550.54.15"
    assert inventory.cuda_driver_version == "12.4"
    assert [gpu.index for gpu in inventory.gpus] == list(range(8))
    assert [gpu.minor for gpu in inventory.gpus] == list(range(8))
    for gpu in inventory.gpus:
        assert gpu.brand == "Nvidia"
        assert gpu.architecture == "Hopper"
        assert gpu.cuda_compute_capability == "9.0"
        assert gpu.memory_bytes == 81559 * MIB
        assert gpu.multiprocessors == 132
        assert gpu.mig_capable and not gpu.mig_enabled and not gpu.mig_pending
        assert gpu.mig_instances == ()
        assert BUS_ID.match(gpu.pci_bus_id) and PCIE_ROOT.match(gpu.pcie_root)
        assert mig.layout_for(gpu.product_name) is mig.H100_80GB
    assert inventory.gpus[0].pci_bus_id == "0000:18:00.0"
    assert len({gpu.pci_bus_id for gpu in inventory.gpus}) == 8
    assert len({gpu.pcie_root for gpu in inventory.gpus}) == 8
    assert [gpu.numa_node for gpu in inventory.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_dgx_h100_8_is_one_nvlink_island_with_seven_peers_each():
    inventory = load_inventory("node-a", simulate="dgx-h100-8")
    assert islands(inventory) == [set(range(8))]
    assert {gpu.nvlink_peers for gpu in inventory.gpus} == {7}


def test_a100_pcie_4_has_two_bridged_pairs():
    inventory = load_inventory("node-a", simulate="a100-pcie-4")
    assert len(inventory.gpus) == 4
    gpu = inventory.gpus[0]
    assert (gpu.product_name, gpu.architecture, gpu.cuda_compute_capability) == (
        "NVIDIA A100-PCIE-40GB",
        "Ampere",
        "8.0",
    )
    assert gpu.multiprocessors == 108
    assert gpu.memory_bytes == 40960 * MIB
    assert all(g.mig_capable and not g.mig_enabled for g in inventory.gpus)
    assert islands(inventory) == [{0, 1}, {2, 3}]
    assert [g.nvlink_peers for g in inventory.gpus] == [1, 1, 1, 1]
    # each pair sits behind one PCIe switch, so the pair shares a root
    assert inventory.gpus[0].pcie_root == inventory.gpus[1].pcie_root != inventory.gpus[2].pcie_root


def test_t4_4_has_no_nvlink_and_no_mig():
    inventory = load_inventory("node-a", simulate="t4-4")
    assert len(inventory.gpus) == 4
    for gpu in inventory.gpus:
        assert (gpu.product_name, gpu.brand, gpu.architecture) == ("Tesla T4", "Tesla", "Turing")
        assert gpu.cuda_compute_capability == "7.5"
        assert gpu.multiprocessors == 40
        assert gpu.memory_bytes == 15360 * MIB
        assert not gpu.mig_capable and not gpu.mig_enabled
        assert gpu.nvlink_peers == 0
    assert islands(inventory) == [{0}, {1}, {2}, {3}]


def test_mixed_has_h100s_and_l4s_on_two_numa_nodes():
    inventory = load_inventory("node-a", simulate="mixed")
    names = [gpu.product_name for gpu in inventory.gpus]
    assert names == ["NVIDIA H100 80GB HBM3"] * 2 + ["NVIDIA L4"] * 2
    assert [gpu.numa_node for gpu in inventory.gpus] == [0, 0, 1, 1]
    l4 = inventory.gpus[2]
    assert (l4.architecture, l4.cuda_compute_capability, l4.multiprocessors) == ("Ada Lovelace", "8.9", 58)
    assert not l4.mig_capable
    assert islands(inventory) == [{0, 1}, {2}, {3}]


def test_mixed_lists_static_mig_instances_with_table_sizes():
    gpu = load_inventory("node-a", simulate="mixed").gpus[1]
    assert gpu.mig_enabled and gpu.mig_pending
    got = [(inst.profile, inst.placement_start, inst.placement_size) for inst in gpu.mig_instances]
    assert got == [("3g.40gb", 0, 4), ("2g.20gb", 4, 2), ("1g.10gb", 6, 1)]
    for inst in gpu.mig_instances:
        table = mig.H100_80GB.profile(inst.profile)
        assert inst.memory_bytes == table.memory_bytes
        assert inst.multiprocessors == table.multiprocessors
        assert MIG_UUID.match(inst.uuid)
    assert len({inst.gpu_instance_id for inst in gpu.mig_instances}) == 3


def test_h100_16_mig_is_a_sixteen_gpu_dynamic_mig_node():
    inventory = load_inventory("node-a", simulate="h100-16-mig")
    assert len(inventory.gpus) == 16
    assert all(gpu.mig_enabled and gpu.mig_instances == () for gpu in inventory.gpus)
    assert islands(inventory) == [set(range(16))]
    assert {gpu.nvlink_peers for gpu in inventory.gpus} == {15}
    # defaults for a `count` entry: distinct bus ids, a root derived from each, minor = index
    assert len({gpu.pci_bus_id for gpu in inventory.gpus}) == 16
    assert inventory.gpus[15].pci_bus_id == "0000:10:00.0"
    assert inventory.gpus[15].pcie_root == "pci0000:10"
    assert [gpu.minor for gpu in inventory.gpus] == list(range(16))
    assert [gpu.numa_node for gpu in inventory.gpus] == [0] * 8 + [1] * 8


@pytest.mark.parametrize("profile", builtin_profiles())
def test_every_builtin_profile_yields_well_formed_gpus(profile):
    inventory = load_inventory("node-a", simulate=profile)
    assert inventory.source == f"simulated:{profile}"
    for gpu in inventory.gpus:
        assert GPU_UUID.match(gpu.uuid)
        assert BUS_ID.match(gpu.pci_bus_id)
        assert PCIE_ROOT.match(gpu.pcie_root)
        assert gpu.nvlink_island.startswith("nvl-") and len(gpu.nvlink_island) <= 64
        assert gpu.device_name == f"gpu-{gpu.index}"


def test_a100_pcie_8_mig_is_a100_pcie_4_plus_four_cards_cut_like_nvidias_quickstart():
    # GPUs 0-3 are a100-pcie-4's, so a node moving to this profile keeps their names, UUIDs and islands
    eight = load_inventory("node-a", simulate="a100-pcie-8-mig")
    four = load_inventory("node-a", simulate="a100-pcie-4")
    assert eight.gpus[:4] == four.gpus
    # GPUs 4-7: NVIDIA's "half-balanced" layout, the cards its gpu-test4 asks for
    for gpu in eight.gpus[4:]:
        assert gpu.mig_enabled
        assert sorted((i.profile, i.placement_start) for i in gpu.mig_instances) == [
            ("1g.5gb", 2), ("1g.5gb", 3), ("2g.10gb", 0), ("3g.20gb", 4)]
    assert [g.nvlink_island == eight.gpus[g.index ^ 1].nvlink_island for g in eight.gpus] == [True] * 8
    assert len({g.nvlink_island for g in eight.gpus}) == 4


# ---- stable identities ------------------------------------------------------------------------


def test_uuids_are_stable_for_the_same_node():
    first = load_inventory("node-a", simulate="mixed")
    second = load_inventory("node-a", simulate="mixed")
    assert [g.uuid for g in first.gpus] == [g.uuid for g in second.gpus]
    assert [i.uuid for i in first.gpus[1].mig_instances] == [i.uuid for i in second.gpus[1].mig_instances]
    assert [g.nvlink_island for g in first.gpus] == [g.nvlink_island for g in second.gpus]


def test_uuids_differ_between_nodes_and_gpus():
    a = load_inventory("node-a")
    b = load_inventory("node-b")
    uuids_a = {g.uuid for g in a.gpus}
    assert len(uuids_a) == 8
    assert uuids_a.isdisjoint(g.uuid for g in b.gpus)
    assert a.gpus[0].nvlink_island != b.gpus[0].nvlink_island


def test_uuid_helpers_match_the_inventory():
    inventory = load_inventory("node-x", simulate="mixed")
    assert inventory.gpus[3].uuid == gpu_uuid("node-x", 3)
    inst = inventory.gpus[1].mig_instances[0]
    assert inst.uuid == mig_uuid("node-x", 1, "3g.40gb", 0)
    assert mig_uuid("node-x", 1, "3g.40gb", 0) != mig_uuid("node-y", 1, "3g.40gb", 0)


# ---- user profiles ----------------------------------------------------------------------------


def test_user_profile_file_is_loaded_by_path(tmp_path):
    path = write(tmp_path, VALID, "lab-box.yaml")
    inventory = load_inventory("node-a", simulate=path)
    assert inventory.source == "simulated:lab-box"
    assert "description" not in inventory.extra
    assert len(inventory.gpus) == 4
    assert islands(inventory) == [{0}, {1}, {2}, {3}]


def test_memory_accepts_bytes_and_quantities(tmp_path):
    for memory, expected in (("85520809984", 85520809984), ("80Gi", 80 << 30), ("16G", 16 * 10**9)):
        path = write(tmp_path, VALID.replace("81559Mi", memory))
        assert load_profile(path).gpus[0].memory_bytes == expected


def test_per_gpu_lists_and_scalars_expand_with_count(tmp_path):
    path = write(
        tmp_path,
        VALID
        + """\
    pciBusId: ["0000:1B:00.0", "0000:1c:00.0", "0000:b1:00.0", "0000:b2:00.0"]
    pcieRoot: pci0000:17
    numaNode: [0, 0, 1, -1]
    minor: [3, 2, 1, 0]
""",
    )
    gpus = load_inventory("node-a", simulate=path).gpus
    assert [g.pci_bus_id for g in gpus] == ["0000:1b:00.0", "0000:1c:00.0", "0000:b1:00.0", "0000:b2:00.0"]
    assert {g.pcie_root for g in gpus} == {"pci0000:17"}
    assert [g.numa_node for g in gpus] == [0, 0, 1, -1]
    assert [g.minor for g in gpus] == [3, 2, 1, 0]


def test_mig_instances_of_a_count_entry_exist_on_each_gpu(tmp_path):
    path = write(
        tmp_path,
        VALID
        + """\
    migEnabled: true
    migInstances: [{profile: 7g.80gb, placement: 0}]
""",
    )
    gpus = load_inventory("node-a", simulate=path).gpus
    assert [len(g.mig_instances) for g in gpus] == [1, 1, 1, 1]
    assert len({g.mig_instances[0].uuid for g in gpus}) == 4


def test_pending_mig_mode_defaults_to_the_current_mode_and_can_differ(tmp_path):
    path = write(tmp_path, VALID + "    migPending: true\n")
    gpu = load_inventory("node-a", simulate=path).gpus[0]
    assert (gpu.mig_enabled, gpu.mig_pending) == (False, True)


def test_links_and_switch_combine_into_islands(tmp_path):
    path = write(
        tmp_path,
        VALID.replace("count: 4", "count: 6")
        + """\
nvlink:
  switch: [0, 1, 2]
  links: [[3, 4]]
""",
    )
    inventory = load_inventory("node-a", simulate=path)
    assert islands(inventory) == [{0, 1, 2}, {3, 4}, {5}]
    assert [g.nvlink_peers for g in inventory.gpus] == [2, 2, 2, 1, 1, 0]


# ---- malformed profiles -----------------------------------------------------------------------


def test_unknown_builtin_profile_lists_the_known_ones():
    with pytest.raises(DiscoveryError, match=r"unknown simulated profile 'dgx-h200'.*dgx-h100-8.*t4-4"):
        load_inventory("node-a", simulate="dgx-h200")


def test_missing_profile_file_is_reported(tmp_path):
    missing = str(tmp_path / "nope.yaml")
    with pytest.raises(DiscoveryError, match=r"nope\.yaml: cannot read the profile file"):
        load_inventory("node-a", simulate=missing)


def test_invalid_yaml_names_the_line(tmp_path):
    err = load_error(tmp_path, "gpus: [\n  - {a: 1\n")
    assert "not valid YAML at line" in str(err)


def test_top_level_must_be_a_mapping(tmp_path):
    err = load_error(tmp_path, "- 1\n- 2\n")
    assert "expected a mapping of fields, got a list" in str(err)


def test_missing_field_names_the_path(tmp_path):
    err = load_error(tmp_path, VALID.replace("    multiprocessors: 132\n", ""))
    assert err.field_path == "gpus[0].multiprocessors"
    assert "gpus[0].multiprocessors: required field is missing; expected a positive integer" in str(err)


def test_missing_driver_version_names_the_path(tmp_path):
    err = load_error(tmp_path, VALID.replace('driverVersion: "550.54.15"\n', ""))
    assert "driverVersion: required field is missing" in str(err)


def test_wrong_type_names_the_path_and_what_is_expected(tmp_path):
    err = load_error(tmp_path, VALID.replace('"9.0"', "9.0"))
    assert 'gpus[0].cudaComputeCapability: expected a string such as "9.0"' in str(err)
    assert "got a number 9.0" in str(err)


def test_bad_memory_names_the_entry(tmp_path):
    text = VALID + VALID.split("gpus:\n", 1)[1].replace("81559Mi", "eighty gigs").replace("count: 4", "count: 1")
    text += VALID.split("gpus:\n", 1)[1]
    err = load_error(tmp_path, text)
    assert err.field_path == "gpus[1].memory"
    assert "expected bytes as an integer or a quantity such as 81559Mi or 80Gi, got a string 'eighty gigs'" in str(err)


def test_unknown_field_suggests_the_right_spelling(tmp_path):
    err = load_error(tmp_path, VALID.replace("multiprocessors:", "multiprocesors:"))
    assert "gpus[0].multiprocesors: unknown field; did you mean 'multiprocessors'?" in str(err)


def test_unknown_top_level_field_is_rejected(tmp_path):
    err = load_error(tmp_path, VALID + "nvlinks: {switch: all}\n")
    assert "nvlinks: unknown field; did you mean 'nvlink'?" in str(err)


def test_link_to_a_missing_gpu_is_rejected(tmp_path):
    err = load_error(tmp_path, VALID + "nvlink:\n  links: [[0, 1], [2, 9]]\n")
    assert "nvlink.links[1][1]: GPU index 9 does not exist; this profile has GPUs 0-3" in str(err)


def test_switch_with_a_missing_gpu_is_rejected(tmp_path):
    err = load_error(tmp_path, VALID + "nvlink:\n  switch: [0, 4]\n")
    assert "nvlink.switch[1]: GPU index 4 does not exist" in str(err)


def test_self_link_is_rejected(tmp_path):
    err = load_error(tmp_path, VALID + "nvlink:\n  links: [[2, 2]]\n")
    assert "nvlink.links[0]: a link joins two different GPUs" in str(err)


def test_unknown_mig_profile_lists_what_the_gpu_offers(tmp_path):
    err = load_error(tmp_path, VALID + "    migEnabled: true\n    migInstances: [{profile: 1g.5gb, placement: 0}]\n")
    assert "gpus[0].migInstances[0].profile: unknown MIG profile '1g.5gb' for NVIDIA H100 80GB HBM3" in str(err)
    assert "1g.10gb" in str(err)


def test_invalid_mig_placement_lists_the_valid_ones(tmp_path):
    err = load_error(tmp_path, VALID + "    migEnabled: true\n    migInstances: [{profile: 3g.40gb, placement: 2}]\n")
    assert "gpus[0].migInstances[0].placement: 3g.40gb cannot start at memory slice 2; valid placements: 0, 4" in str(
        err
    )


def test_overlapping_mig_placements_are_rejected(tmp_path):
    err = load_error(
        tmp_path,
        VALID
        + """\
    migEnabled: true
    migInstances:
      - {profile: 3g.40gb, placement: 0}
      - {profile: 2g.20gb, placement: 2}
""",
    )
    assert err.field_path == "gpus[0].migInstances[1]"
    assert "2g.20gb at 2 uses memory slices 2-3, which overlap gpus[0].migInstances[0] (slices 0-3)" in str(err)


def test_mig_instances_beyond_the_compute_slices_are_rejected(tmp_path, monkeypatch):
    # The shipped tables never let memory fit where compute does not; a geometry with fewer compute
    # than memory slices (as some GPUs have) shows the compute check on its own.
    narrow = mig.MigLayout(
        memory_slices=8,
        compute_slices=3,
        profiles=(mig.MigProfile("2g.20gb", 2, 2, 20 << 30, 32, (0, 2, 4, 6)),),
    )
    monkeypatch.setattr(mig, "layout_for", lambda name: narrow)
    err = load_error(
        tmp_path,
        VALID
        + """\
    migEnabled: true
    migInstances:
      - {profile: 2g.20gb, placement: 0}
      - {profile: 2g.20gb, placement: 2}
""",
    )
    assert "gpus[0].migInstances[1]: the instances need 4 compute slices; NVIDIA H100 80GB HBM3 has 3" in str(err)


def test_mig_instances_need_mig_mode(tmp_path):
    err = load_error(tmp_path, VALID + "    migInstances: [{profile: 1g.10gb, placement: 0}]\n")
    assert "gpus[0].migInstances: MIG instances exist only in MIG mode; set migEnabled: true" in str(err)


def test_mig_mode_needs_a_mig_capable_gpu(tmp_path):
    err = load_error(tmp_path, VALID.replace("migCapable: true", "migCapable: false") + "    migEnabled: true\n")
    assert "gpus[0].migEnabled: MIG mode needs a MIG-capable GPU" in str(err)


def test_mig_instances_need_a_known_mig_table(tmp_path):
    text = VALID.replace("NVIDIA H100 80GB HBM3", "NVIDIA H200") + (
        "    migEnabled: true\n    migInstances: [{profile: 1g.18gb, placement: 0}]\n"
    )
    err = load_error(tmp_path, text)
    assert "gpus[0].migInstances: tessera has no MIG table for 'NVIDIA H200'" in str(err)


def test_per_gpu_list_must_match_count(tmp_path):
    err = load_error(tmp_path, VALID + "    numaNode: [0, 1]\n")
    assert "gpus[0].numaNode: expected 4 values (one per GPU, count is 4), got 2" in str(err)


def test_per_gpu_list_item_is_checked(tmp_path):
    err = load_error(tmp_path, VALID + '    pciBusId: ["0000:18:00.0", "18:00", "0000:3a:00.0", "0000:5d:00.0"]\n')
    assert "gpus[0].pciBusId[1]: expected an extended BDF such as \"0000:18:00.0\", got a string '18:00'" in str(err)


def test_duplicate_bus_ids_are_rejected(tmp_path):
    err = load_error(tmp_path, VALID + '    pciBusId: "0000:18:00.0"\n')
    assert "gpus: GPU 1 has the same pciBusId '0000:18:00.0' as GPU 0; each GPU needs its own" in str(err)


def test_count_must_be_positive(tmp_path):
    err = load_error(tmp_path, VALID.replace("count: 4", "count: 0"))
    assert "gpus[0].count: expected a positive integer, got an integer 0" in str(err)


def test_gpus_must_not_be_empty(tmp_path):
    err = load_error(tmp_path, 'driverVersion: "550.54.15"\ncudaDriverVersion: "12.4"\ngpus: []\n')
    assert "gpus: expected a non-empty list of GPU entries, got a list []" in str(err)


def test_cuda_driver_version_must_be_major_minor(tmp_path):
    err = load_error(tmp_path, VALID.replace('"12.4"', '"twelve"'))
    assert "cudaDriverVersion: expected major.minor such as \"12.4\", got 'twelve'" in str(err)


def test_product_name_longer_than_an_attribute_is_rejected(tmp_path):
    err = load_error(tmp_path, VALID.replace("NVIDIA H100 80GB HBM3", "X" * 65))
    assert "gpus[0].productName: at most 64 characters (a ResourceSlice attribute limit), got 65" in str(err)


# ---- the entry point --------------------------------------------------------------------------


def test_empty_node_name_is_rejected():
    with pytest.raises(DiscoveryError, match="node name is empty"):
        load_inventory("")


def test_choosing_both_backends_is_rejected():
    with pytest.raises(DiscoveryError, match="choose one backend"):
        load_inventory("node-a", simulate="t4-4", nvml=True)


def test_simulated_inventory_accepts_a_parsed_profile():
    profile = load_profile("t4-4")
    assert simulated_inventory("node-q", profile) == simulated_inventory("node-q", "t4-4")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("nvlink:\n  switch: yes\n", 'nvlink.switch: expected "all" or a list of GPU indices, got a boolean True'),
        ("nvlink:\n  links: [0, 1]\n", "nvlink.links[0]: expected a pair [a, b] of GPU indices, got an integer 0"),
        ("nvlink:\n  links: {a: b}\n", "nvlink.links: expected a list of [a, b] GPU index pairs, got a mapping"),
        ("nvlink:\n  links: [[0, one]]\n", "nvlink.links[0][1]: expected a GPU index, got a string 'one'"),
        ("nvlink:\n  bridges: [[0, 1]]\n", "nvlink.bridges: unknown field; known fields are switch, links"),
        ("nvlink: all\n", "nvlink: expected a mapping of fields, got a string 'all'"),
        ("  - just-a-string\n", "gpus[1]: expected a mapping of fields, got a string 'just-a-string'"),
    ],
)
def test_structural_mistakes_name_the_field(tmp_path, extra, message):
    err = load_error(tmp_path, VALID + extra)
    assert message in str(err)


@pytest.mark.parametrize(
    ("mig_lines", "message"),
    [
        ("    migInstances: {profile: 1g.10gb}\n", "gpus[0].migInstances: expected a list of {profile, placement}"),
        (
            "    migInstances: [{profile: 1g.10gb, placement: 0, size: 1}]\n",
            "gpus[0].migInstances[0].size: unknown field; known fields are profile, placement",
        ),
        ("    migInstances: [{profile: 1g.10gb}]\n", "gpus[0].migInstances[0].placement: required field is missing"),
        ("    migInstances: [{profile: 1g.10gb, placement: -1}]\n", "gpus[0].migInstances[0].placement: expected"),
    ],
)
def test_mig_instance_mistakes_name_the_field(tmp_path, mig_lines, message):
    err = load_error(tmp_path, VALID + "    migEnabled: true\n" + mig_lines)
    assert message in str(err)


def test_bare_file_name_in_the_working_directory_is_a_profile_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "labnode").write_text(VALID)
    (tmp_path / "t4-4").write_text("not: a profile\n")
    assert load_inventory("node-a", simulate="labnode").source == "simulated:labnode"
    assert load_inventory("node-a", simulate="t4-4").source == "simulated:t4-4"  # the built-in wins
