"""ResourceSlice building: shapes of whole-GPU and MIG devices, MIG strategies, limits and ordering."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from driver import DRIVER_NAME
from driver.discovery import load_inventory
from driver.mig import H100_80GB
from driver.model import MigInstance
from driver.names import NODE_LABEL
from driver.poolvalidation import validate_pool
from driver.quantity import parse_quantity
from driver.simulated import builtin_profiles
from driver.slices import SliceBuildError, build_slices
from tests.builders.inventory import make_gpu, make_inventory

MIB = 2**20


def mig_instance(profile: str, start: int) -> MigInstance:
    p = H100_80GB.profile(profile)
    return MigInstance(profile=profile, placement_start=start, placement_size=p.memory_slices,
                       uuid=f"MIG-{profile}-{start}", memory_bytes=p.memory_bytes, multiprocessors=p.multiprocessors,
                       gpu_instance_id=start + 1, compute_instance_id=0)


def devices(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for s in slices for d in s["spec"].get("devices") or []]


def device(slices: list[dict[str, Any]], name: str) -> dict[str, Any]:
    matches = [d for d in devices(slices) if d["name"] == name]
    assert len(matches) == 1, f"{name}: {len(matches)} devices"
    return matches[0]


def counter_sets(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {cs["name"]: cs["counters"] for s in slices for cs in s["spec"].get("sharedCounters") or []}


# -- whole GPUs ----------------------------------------------------------------------------------------


def test_whole_gpu_is_shareable_and_memory_has_no_request_policy() -> None:
    slices = build_slices(make_inventory(make_gpu(0)))
    gpu = device(slices, "gpu-0")
    assert gpu["allowMultipleAllocations"] is True
    assert gpu["capacity"]["memory"] == {"value": "81559Mi"}
    assert "requestPolicy" not in gpu["capacity"]["memory"]


def test_whole_gpu_multiprocessors_default_to_zero_so_memory_shares_can_coexist() -> None:
    gpu = device(build_slices(make_inventory(make_gpu(0))), "gpu-0")
    assert gpu["capacity"]["multiprocessors"] == {"value": "132", "requestPolicy": {"default": "0"}}


def test_slice_belongs_to_the_node_pool_and_carries_driver_and_node_labels() -> None:
    slices = build_slices(make_inventory(make_gpu(0), make_gpu(1), node="worker-7"))
    assert len(slices) == 1
    obj = slices[0]
    assert obj["apiVersion"] == "resource.k8s.io/v1"
    assert obj["kind"] == "ResourceSlice"
    assert "name" not in obj["metadata"]
    assert obj["metadata"]["labels"][NODE_LABEL] == "worker-7"
    assert obj["spec"]["driver"] == DRIVER_NAME
    assert obj["spec"]["nodeName"] == "worker-7"
    assert obj["spec"]["pool"] == {"name": "worker-7", "generation": 0, "resourceSliceCount": 1}
    assert [d["name"] for d in devices(slices)] == ["gpu-0", "gpu-1"]


def test_node_without_gpus_still_publishes_one_empty_slice() -> None:
    slices = build_slices(make_inventory())
    assert len(slices) == 1
    assert "devices" not in slices[0]["spec"]
    assert "sharedCounters" not in slices[0]["spec"]


def test_more_than_128_whole_gpus_split_into_slices_of_at_most_128() -> None:
    gpus = [make_gpu(i, mig_capable=False) for i in range(200)]
    slices = build_slices(make_inventory(*gpus))
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 72]
    assert all(s["spec"]["pool"]["resourceSliceCount"] == 2 for s in slices)
    assert validate_pool(slices) == []


def test_unknown_mig_strategy_is_rejected_with_the_choices() -> None:
    with pytest.raises(SliceBuildError, match="none, static, dynamic"):
        build_slices(make_inventory(make_gpu(0)), mig_strategy="mixed")


def test_inventory_that_cannot_form_a_valid_pool_is_rejected_with_field_paths() -> None:
    with pytest.raises(SliceBuildError) as info:
        build_slices(make_inventory(make_gpu(0), node="Node_A"))
    assert any(e.path == "[0].spec.nodeName" for e in info.value.errors)


# -- static MIG ------------------------------------------------------------------------------------------


def test_static_mig_publishes_instances_and_not_their_parent() -> None:
    parent = make_gpu(0, mig_enabled=True, mig_pending=True,
                      mig_instances=(mig_instance("1g.10gb", 6), mig_instance("3g.40gb", 0)))
    slices = build_slices(make_inventory(parent, make_gpu(1)), mig_strategy="static")
    names = [d["name"] for d in devices(slices)]
    assert sorted(names) == ["gpu-0-mig-1g10gb-6", "gpu-0-mig-3g40gb-0", "gpu-1"]
    mig = device(slices, "gpu-0-mig-3g40gb-0")
    assert "allowMultipleAllocations" not in mig
    assert mig["capacity"] == {"memory": {"value": "40192Mi"}, "multiprocessors": {"value": "60"}}
    assert mig["attributes"]["profile"] == {"string": "3g.40gb"}
    assert mig["attributes"]["placement"] == {"int": 0}
    assert mig["attributes"]["parentUUID"] == {"string": parent.uuid}


def test_mig_strategy_none_leaves_out_gpus_in_mig_mode() -> None:
    parent = make_gpu(0, mig_enabled=True, mig_instances=(mig_instance("1g.10gb", 0),))
    slices = build_slices(make_inventory(parent, make_gpu(1)), mig_strategy="none")
    assert [d["name"] for d in devices(slices)] == ["gpu-1"]


def test_mig_capable_gpu_with_mig_off_is_a_whole_gpu_under_static() -> None:
    slices = build_slices(make_inventory(make_gpu(0)), mig_strategy="static")
    assert [d["name"] for d in devices(slices)] == ["gpu-0"]
    assert counter_sets(slices) == {}


# -- dynamic MIG ---------------------------------------------------------------------------------------------


def test_dynamic_mig_publishes_a_counter_set_per_gpu_in_its_own_slice() -> None:
    slices = build_slices(make_inventory(make_gpu(0), make_gpu(1)), mig_strategy="dynamic")
    for obj in slices:
        assert not ("devices" in obj["spec"] and "sharedCounters" in obj["spec"])
    sets = counter_sets(slices)
    assert set(sets) == {"gpu-0-counters", "gpu-1-counters"}
    expected = {"memory", "compute-slices", *(f"memory-slice-{i}" for i in range(8))}
    assert set(sets["gpu-0-counters"]) == expected
    assert sets["gpu-0-counters"]["compute-slices"] == {"value": "7"}
    assert all(sets["gpu-0-counters"][f"memory-slice-{i}"] == {"value": "1"} for i in range(8))


def test_dynamic_mig_publishes_one_device_per_profile_placement() -> None:
    slices = build_slices(make_inventory(make_gpu(0)), mig_strategy="dynamic")
    migs = [d for d in devices(slices) if d["attributes"]["type"] == {"string": "mig"}]
    expected = {f"gpu-0-mig-{p.device_token}-{start}" for p in H100_80GB.profiles for start in p.placements}
    assert {d["name"] for d in migs} == expected
    assert len(migs) == sum(len(p.placements) for p in H100_80GB.profiles)


def test_dynamic_whole_gpu_consumes_every_counter_of_its_set() -> None:
    slices = build_slices(make_inventory(make_gpu(0)), mig_strategy="dynamic")
    whole = device(slices, "gpu-0")
    assert whole["allowMultipleAllocations"] is True
    (consumption,) = whole["consumesCounters"]
    assert consumption["counterSet"] == "gpu-0-counters"
    assert set(consumption["counters"]) == set(counter_sets(slices)["gpu-0-counters"])


def _slices_used(d: dict[str, Any]) -> set[str]:
    return {k for k in d["consumesCounters"][0]["counters"] if k.startswith("memory-slice-")}


def test_overlapping_placements_share_a_memory_slice_counter() -> None:
    slices = build_slices(make_inventory(make_gpu(0)), mig_strategy="dynamic")
    big = device(slices, "gpu-0-mig-3g40gb-0")
    small = device(slices, "gpu-0-mig-1g10gb-2")
    other = device(slices, "gpu-0-mig-1g10gb-4")
    assert _slices_used(big) == {f"memory-slice-{i}" for i in range(4)}
    assert _slices_used(big) & _slices_used(small)
    assert not _slices_used(big) & _slices_used(other)
    assert big["consumesCounters"][0]["counters"]["compute-slices"] == {"value": "3"}


def test_no_device_consumes_more_than_its_gpu_offers() -> None:
    slices = build_slices(make_inventory(make_gpu(0)), mig_strategy="dynamic")
    totals = counter_sets(slices)["gpu-0-counters"]
    for d in devices(slices):
        for name, amount in d["consumesCounters"][0]["counters"].items():
            assert parse_quantity(amount["value"]) <= parse_quantity(totals[name]["value"]), (d["name"], name)


def test_dynamic_without_a_mig_table_falls_back_to_static_for_that_gpu() -> None:
    unknown = make_gpu(0, product_name="NVIDIA B200", mig_enabled=True,
                       mig_instances=(mig_instance("1g.10gb", 0),))
    slices = build_slices(make_inventory(unknown), mig_strategy="dynamic")
    assert [d["name"] for d in devices(slices)] == ["gpu-0-mig-1g10gb-0"]
    assert counter_sets(slices) == {}


def test_sixteen_gpu_dynamic_node_splits_within_every_limit() -> None:
    gpus = [make_gpu(i, mig_enabled=True) for i in range(16)]
    slices = build_slices(make_inventory(*gpus), mig_strategy="dynamic")
    per_gpu = 1 + sum(len(p.placements) for p in H100_80GB.profiles)
    assert len(devices(slices)) == 16 * per_gpu
    device_slices = [s for s in slices if "devices" in s["spec"]]
    counter_slices = [s for s in slices if "sharedCounters" in s["spec"]]
    assert len(device_slices) > 1
    assert all(len(s["spec"]["devices"]) <= 64 for s in device_slices)
    assert [len(s["spec"]["sharedCounters"]) for s in counter_slices] == [8, 8]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
    names = Counter(d["name"] for d in devices(slices))
    assert max(names.values()) == 1
    assert validate_pool(slices) == []


def test_one_gpus_partitions_stay_in_one_slice() -> None:
    gpus = [make_gpu(i) for i in range(16)]
    slices = build_slices(make_inventory(*gpus), mig_strategy="dynamic")
    slice_of: dict[int, set[int]] = {}
    for n, obj in enumerate(slices):
        for d in obj["spec"].get("devices") or []:
            if d["attributes"]["type"] == {"string": "mig"}:
                slice_of.setdefault(int(d["name"].split("-")[1]), set()).add(n)
    assert all(len(where) == 1 for where in slice_of.values())


# -- ordering (the scheduler takes the first device that fits) -------------------------------------------------


def test_dynamic_partitions_are_offered_from_the_highest_placement_down() -> None:
    slices = build_slices(make_inventory(make_gpu(0)), mig_strategy="dynamic")
    order = [d["name"] for d in devices(slices) if "-mig-1g10gb-" in d["name"]]
    assert order == [f"gpu-0-mig-1g10gb-{p}" for p in (6, 5, 4, 3, 2, 1, 0)]


def test_dynamic_offers_whole_gpus_from_the_last_card_and_partitions_from_the_first() -> None:
    slices = build_slices(make_inventory(make_gpu(0), make_gpu(1), make_gpu(2)), mig_strategy="dynamic")
    names = [d["name"] for d in devices(slices)]
    wholes = [n for n in names if "-mig-" not in n]
    assert wholes == ["gpu-2", "gpu-1", "gpu-0"]
    first_partition_gpus = [n.split("-mig-")[0] for n in names if "-mig-" in n]
    assert first_partition_gpus[0] == "gpu-0"


def test_without_partitions_whole_gpus_are_in_index_order() -> None:
    slices = build_slices(make_inventory(*(make_gpu(i) for i in (3, 0, 2, 1))))
    assert [d["name"] for d in devices(slices)] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


# -- every built-in profile and strategy ------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["none", "static", "dynamic"])
@pytest.mark.parametrize("profile", builtin_profiles())
def test_every_builtin_profile_builds_a_valid_pool(profile: str, strategy: str) -> None:
    slices = build_slices(load_inventory("node-a", simulate=profile), mig_strategy=strategy)
    assert validate_pool(slices) == []


# -- quantities ------------------------------------------------------------------------------------------------


# -- names ---------------------------------------------------------------------------------------------------


def test_device_names_follow_the_published_grammar() -> None:
    from driver.names import counter_set_name, gpu_device_name, mig_device_name

    assert gpu_device_name(12) == "gpu-12"
    assert mig_device_name(0, "1g.10gb", 0) == "gpu-0-mig-1g10gb-0"
    assert mig_device_name(3, "1g.10gb+me", 6) == "gpu-3-mig-1g10gbme-6"
    assert counter_set_name(7) == "gpu-7-counters"
    with pytest.raises(ValueError, match="placement"):
        mig_device_name(0, "1g.10gb", -1)
    with pytest.raises(ValueError, match="no letters or digits"):
        mig_device_name(0, "..", 0)


def test_slice_names_sort_in_publishing_order() -> None:
    from driver.names import slice_name

    names = [slice_name("node-a", i) for i in (0, 2, 10, 100)]
    assert names[0] == "node-a-gpu.tessera.dev-000"
    assert sorted(names) == names


def test_long_node_names_still_give_valid_distinct_slice_names_and_labels() -> None:
    from driver.grammars import is_dns_subdomain
    from driver.names import node_label_value, slice_name

    long_a = "a" * 200 + ".example.com-" + "b" * 39 + "1"
    long_b = long_a[:-1] + "2"
    assert len(long_a) == 253
    for node in (long_a, long_b):
        assert is_dns_subdomain(slice_name(node, 5))
        assert len(node_label_value(node)) <= 63
    assert slice_name(long_a, 5) != slice_name(long_b, 5)
    assert node_label_value(long_a) != node_label_value(long_b)
    slices = build_slices(make_inventory(make_gpu(0), node=long_a))
    assert validate_pool(slices) == []


# -- taints (driver.health) ------------------------------------------------------------------------------------

TAINT = {"key": f"{DRIVER_NAME}/gpu-lost", "value": "fallen-off-bus", "effect": "NoExecute",
         "timeAdded": "2026-11-25T13:00:00Z"}


def test_a_gpus_taints_land_on_it_and_on_its_static_mig_devices_only() -> None:
    parent = make_gpu(0, mig_enabled=True, mig_instances=(mig_instance("1g.10gb", 6), mig_instance("3g.40gb", 0)))
    slices = build_slices(make_inventory(parent, make_gpu(1), make_gpu(2)), taints={0: [TAINT], 2: [TAINT]})
    tainted = sorted(d["name"] for d in devices(slices) if d.get("taints"))
    assert tainted == ["gpu-0-mig-1g10gb-6", "gpu-0-mig-3g40gb-0", "gpu-2"]
    assert device(slices, "gpu-2")["taints"] == [TAINT]
    assert validate_pool(slices) == []


def test_dynamic_mig_taints_the_whole_gpu_and_every_partition_of_it() -> None:
    slices = build_slices(make_inventory(make_gpu(0), make_gpu(1)), mig_strategy="dynamic", taints={1: [TAINT]})
    tainted = {d["name"] for d in devices(slices) if d.get("taints")}
    gpu1 = {d["name"] for d in devices(slices) if d["name"] == "gpu-1" or d["name"].startswith("gpu-1-")}
    assert tainted == gpu1 and "gpu-1" in tainted and len(gpu1) > 10


def test_one_tainted_gpu_splits_a_full_slice_to_the_64_device_limit() -> None:
    gpus = [make_gpu(i, mig_capable=False) for i in range(100)]
    assert [len(s["spec"]["devices"]) for s in build_slices(make_inventory(*gpus))] == [100]
    slices = build_slices(make_inventory(*gpus), taints={0: [TAINT]})
    assert [len(s["spec"]["devices"]) for s in slices] == [64, 36]
    assert validate_pool(slices) == []
