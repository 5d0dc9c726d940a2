"""The discovery entry point and the NVLink island computation both backends share."""

from __future__ import annotations

import ctypes

import pytest

from driver import nvml as nvml_backend
from driver.discovery import DEFAULT_PROFILE, load_inventory
from driver.errors import DiscoveryError
from driver.nvlink import assign_nvlink_islands, island_id, nvlink_placements
from tests.fakes.nvml import pcie_pair_node

UUIDS = {i: f"GPU-0000000{i}-0000-0000-0000-000000000000" for i in range(6)}


def groups(placements):
    out: dict[str, set[int]] = {}
    for index, placement in placements.items():
        out.setdefault(placement.island, set()).add(index)
    return sorted(out.values(), key=min)


def test_gpus_without_links_are_islands_of_their_own():
    placements = nvlink_placements(UUIDS, [], [])
    assert groups(placements) == [{i} for i in range(6)]
    assert {p.peers for p in placements.values()} == {0}


def test_switched_gpus_form_one_island_and_see_each_other():
    placements = nvlink_placements(UUIDS, [], [0, 1, 2, 3])
    assert groups(placements) == [{0, 1, 2, 3}, {4}, {5}]
    assert [placements[i].peers for i in range(6)] == [3, 3, 3, 3, 0, 0]


def test_bridges_join_pairs():
    placements = nvlink_placements(UUIDS, [(0, 1), (2, 3), (1, 0)], [])
    assert groups(placements) == [{0, 1}, {2, 3}, {4}, {5}]
    assert [placements[i].peers for i in range(4)] == [1, 1, 1, 1]


def test_a_chain_is_one_island_but_peers_count_one_hop():
    # 0-1-2: GPU 0 cannot do peer-to-peer with 2 over NVLink, yet all three are connected.
    placements = nvlink_placements(UUIDS, [(0, 1), (1, 2)], [])
    assert groups(placements)[0] == {0, 1, 2}
    assert [placements[i].peers for i in range(3)] == [1, 2, 1]


def test_a_bridge_into_the_switched_set_joins_the_island():
    placements = nvlink_placements(UUIDS, [(3, 4)], [0, 1, 2, 3])
    assert groups(placements) == [{0, 1, 2, 3, 4}, {5}]
    assert placements[3].peers == 4  # three over the switch, one over the bridge
    assert placements[4].peers == 1


def test_links_to_unknown_gpus_are_rejected():
    with pytest.raises(ValueError, match="NVLink 0-9 names GPU 9, which is not on this node"):
        nvlink_placements(UUIDS, [(0, 9)], [])
    with pytest.raises(ValueError, match="NVSwitch link names GPU 7"):
        nvlink_placements(UUIDS, [], [7])


def test_island_ids_depend_on_members_not_order():
    a = island_id(["GPU-b", "GPU-a"])
    assert a == island_id(["GPU-a", "GPU-b"])
    assert a != island_id(["GPU-a"])
    assert a.startswith("nvl-") and len(a) == 20


def test_island_id_is_the_same_for_every_member():
    placements = nvlink_placements(UUIDS, [(0, 1)], [])
    assert placements[0].island == placements[1].island == island_id([UUIDS[0], UUIDS[1]])
    assert placements[2].island == island_id([UUIDS[2]])


def test_assign_nvlink_islands_fills_the_gpu_fields():
    gpus = load_inventory("node-a", simulate="t4-4").gpus
    joined = assign_nvlink_islands(gpus, [(0, 3)], [])
    assert joined[0].nvlink_island == joined[3].nvlink_island != joined[1].nvlink_island
    assert [g.nvlink_peers for g in joined] == [1, 0, 0, 1]
    assert [g.uuid for g in joined] == [g.uuid for g in gpus]


def test_default_backend_returns_eight_h100s():
    inventory = load_inventory("node-a")
    assert DEFAULT_PROFILE == "dgx-h100-8"
    assert len(inventory.gpus) == 8
    assert all(g.product_name == "NVIDIA H100 80GB HBM3" for g in inventory.gpus)


def test_nvml_flag_selects_the_nvml_backend(monkeypatch, tmp_path):
    node = pcie_pair_node()
    monkeypatch.setattr(nvml_backend, "_import_pynvml", lambda: node.nvml)
    inventory = load_inventory("node-b", nvml=True)
    assert inventory.source == "nvml"
    assert inventory.node_name == "node-b"
    assert [g.product_name for g in inventory.gpus] == ["Tesla T4", "Tesla T4"]
    assert node.nvml.shutdown_calls == 1


def test_nvml_backend_on_this_machine():
    """Without the NVIDIA driver NVML discovery fails clearly; with it, it finds real GPUs."""
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        loadable = True
    except OSError:
        loadable = False
    if not loadable:
        with pytest.raises(DiscoveryError, match="NVML could not be initialised"):
            load_inventory("node-a", nvml=True)
        return
    try:
        inventory = load_inventory("node-a", nvml=True)
    except DiscoveryError as exc:  # a library without a loaded kernel driver
        assert "NVML could not be initialised" in str(exc)
        return
    assert inventory.source == "nvml"
    for gpu in inventory.gpus:
        assert gpu.uuid.startswith("GPU-")
        assert gpu.memory_bytes > 0


def test_discovery_error_text_names_source_and_field():
    err = DiscoveryError("expected a string", source="/etc/tessera/node.yaml", field_path="gpus[2].memory")
    assert str(err) == "/etc/tessera/node.yaml: gpus[2].memory: expected a string"
    assert (err.source, err.field_path, err.message) == (
        "/etc/tessera/node.yaml",
        "gpus[2].memory",
        "expected a string",
    )
    assert str(DiscoveryError("plain")) == "plain"
