"""Allocation parsing: which results are this node's, what each device is, which config applies."""

from __future__ import annotations

import pytest

from driver.allocation import AllocationError, plan_claim, resolve_device
from driver.config import ConfigError, Strategy
from driver.quantity import quantity_bytes
from driver.simulated import builtin_profiles
from tests.builders.claims import UID, gpu_config, inventory, make_claim, result, share

GIB = 1024**3


def parse(claim, profile: str = "dgx-h100-8"):
    return plan_claim(claim, ref_uid=claim["metadata"]["uid"], inventory=inventory(profile), pool="node-a")


def test_whole_gpu_result_is_exclusive():
    alloc = parse(make_claim([result("gpu-3")]))
    (d,) = alloc.devices
    assert (alloc.uid, alloc.namespace, alloc.name) == (UID, "team-a", "claim")
    assert d.device == "gpu-3"
    assert d.target.gpu.index == 3
    assert not d.target.is_mig
    assert d.sharing.strategy == Strategy.EXCLUSIVE
    assert not d.memory_share
    assert d.memory_limit_bytes == inventory().gpus[3].memory_bytes


def test_whole_gpu_with_share_id_consuming_everything_is_not_a_memory_share():
    total = inventory().gpus[0].memory_bytes
    d = parse(make_claim([share("gpu-0", str(total))])).devices[0]
    assert d.share_id
    assert not d.memory_share
    assert d.sharing.strategy == Strategy.EXCLUSIVE


def test_memory_share_defaults_to_mps_with_its_limit():
    d = parse(make_claim([share("gpu-1", "12Gi")])).devices[0]
    assert d.memory_share
    assert d.consumed_memory == 12 * GIB
    assert d.memory_limit_bytes == 12 * GIB
    assert d.sharing.strategy == Strategy.MPS
    assert d.share_id == "3f2c8a9e-5d41-4b7a-9e2f-6c0d1a2b3c4d"


def test_other_drivers_and_other_pools_are_ignored():
    claim = make_claim(
        [
            result("gpu-0"),
            {**result("gpu-1"), "driver": "gpu.nvidia.com"},
            {**result("gpu-2"), "pool": "node-b"},
        ]
    )
    assert [d.device for d in parse(claim).devices] == ["gpu-0"]


def test_claim_with_no_results_for_this_node_has_no_devices():
    claim = make_claim([{**result("gpu-0"), "pool": "node-b"}])
    assert parse(claim).devices == ()


def test_results_keep_allocation_order_and_index():
    claim = make_claim([result("gpu-5", "a"), result("gpu-2", "b")])
    assert [(d.result_index, d.device) for d in parse(claim).devices] == [(0, "gpu-5"), (1, "gpu-2")]


def test_subrequest_results_have_a_base_request():
    d = parse(make_claim([result("gpu-0", "accel/full")])).devices[0]
    assert (d.request, d.base_request) == ("accel/full", "accel")


def test_admin_access_is_carried():
    assert parse(make_claim([result("gpu-0", adminAccess=True)])).devices[0].admin_access


def test_replaced_claim_is_an_error():
    claim = make_claim([result("gpu-0")])
    with pytest.raises(AllocationError) as info:
        plan_claim(claim, ref_uid="other-uid", inventory=inventory(), pool="node-a")
    assert str(info.value) == (
        f"ResourceClaim team-a/claim has uid {UID} but kubelet asked for other-uid: "
        "the claim was replaced (deleted and created again); kubelet retries with the new claim"
    )


def test_unallocated_claim_is_an_error():
    claim = make_claim([])
    del claim["status"]["allocation"]
    with pytest.raises(AllocationError, match=r"team-a/claim is not allocated \(status.allocation is missing\)"):
        parse(claim)


def test_device_not_on_this_node_is_an_error():
    with pytest.raises(AllocationError) as info:
        parse(make_claim([result("gpu-0"), result("gpu-9")]))
    msg = str(info.value)
    assert msg.startswith("status.allocation.devices.results[1]: device 'gpu-9' is not on node node-a")
    assert "gpu-7" in msg and "ResourceSlice is out of date" in msg


def test_unknown_device_name_shape_is_an_error():
    with pytest.raises(AllocationError, match="'tpu-0' is not a tessera device name"):
        parse(make_claim([result("tpu-0")]))


def test_result_without_device_is_an_error():
    with pytest.raises(AllocationError, match=r"results\[0\]: request and device are required"):
        parse(make_claim([result("")]))


def test_consumed_memory_larger_than_the_device_is_an_error():
    with pytest.raises(AllocationError) as info:
        parse(make_claim([share("gpu-0", "100Gi")]))
    assert str(info.value).startswith(
        "status.allocation.devices.results[0].consumedCapacity.memory: 100Gi is more than device gpu-0 has ("
    )


def test_malformed_consumed_memory_is_an_error():
    with pytest.raises(AllocationError, match=r"consumedCapacity.memory: '12GB' is not a Kubernetes quantity"):
        parse(make_claim([share("gpu-0", "12GB")]))


@pytest.mark.parametrize("consumed", [7, "10Gi", ["10Gi"], True])
def test_consumed_capacity_that_is_not_an_object_is_an_error(consumed: object):
    # found by the gRPC fuzzer: an int here was a TypeError (an internal error) instead of a claim error
    with pytest.raises(AllocationError, match=r"results\[0\]\.consumedCapacity: must be an object, got "):
        parse(make_claim([result("gpu-0", consumedCapacity=consumed)]))


@pytest.mark.parametrize(("configs", "message"), [
    (True, r"status\.allocation\.devices\.config: must be a list, got bool"),
    ([{**gpu_config(), "requests": True}],
     r"status\.allocation\.devices\.config\[0\]\.requests: must be a list, got bool"),
])
def test_configs_of_the_wrong_shape_are_an_error(configs: object, message: str):
    # found by the gRPC fuzzer: these were TypeErrors (internal errors) instead of claim errors
    claim = make_claim([result("gpu-0")])
    claim["status"]["allocation"]["devices"]["config"] = configs
    with pytest.raises(AllocationError, match=message):
        parse(claim)


def test_zero_consumed_memory_is_an_error():
    with pytest.raises(AllocationError, match="must be larger than zero"):
        parse(make_claim([share("gpu-0", "0")]))


def test_duplicate_results_are_counted_once():
    claim = make_claim([result("gpu-0"), result("gpu-0")])
    assert len(parse(claim).devices) == 1


def test_two_shares_of_one_device_are_separate():
    claim = make_claim([share("gpu-0", "4Gi", "a", "11111111-0000-0000-0000-000000000000"), share("gpu-0", "4Gi", "b")])
    assert len(parse(claim).devices) == 2


# --- configs ----------------------------------------------------------------------------------


def test_claim_config_beats_class_config_even_when_listed_first():
    claim = make_claim(
        [result("gpu-0")],
        [
            gpu_config("FromClaim", strategy="TimeSlicing", timeSlicing={"interval": "Long"}),
            gpu_config("FromClass", strategy="TimeSlicing", timeSlicing={"interval": "Short"}),
        ],
    )
    assert parse(claim).devices[0].sharing.time_slice_interval == "Long"


def test_later_claim_config_beats_earlier_claim_config():
    claim = make_claim(
        [share("gpu-0", "8Gi")],
        [gpu_config(mps={"activeThreadPercentage": 10}), gpu_config(mps={"activeThreadPercentage": 70})],
    )
    assert parse(claim).devices[0].sharing.active_thread_percentage == 70


def test_config_for_another_request_does_not_apply():
    claim = make_claim(
        [result("gpu-0", "a"), result("gpu-1", "b")],
        [gpu_config(requests=("b",), strategy="TimeSlicing")],
    )
    a, b = parse(claim).devices
    assert a.sharing.strategy == Strategy.EXCLUSIVE
    assert b.sharing.strategy == Strategy.TIME_SLICING


def test_config_for_main_request_applies_to_subrequest_result():
    claim = make_claim([result("gpu-0", "accel/full")], [gpu_config(requests=("accel",), strategy="TimeSlicing")])
    assert parse(claim).devices[0].sharing.strategy == Strategy.TIME_SLICING


def test_other_drivers_configs_are_ignored_even_if_invalid_for_us():
    claim = make_claim(
        [result("gpu-0")], [{"source": "FromClass", "opaque": {"driver": "gpu.nvidia.com", "parameters": {"x": 1}}}]
    )
    assert parse(claim).devices[0].sharing.strategy == Strategy.EXCLUSIVE


def test_invalid_config_error_points_into_the_allocation():
    claim = make_claim([result("gpu-0")], [gpu_config(), gpu_config(mps={"activeThreadPercentage": 150})])
    with pytest.raises(ConfigError) as info:
        parse(claim)
    assert str(info.value) == (
        "status.allocation.devices.config[1].opaque.parameters.sharing.mps.activeThreadPercentage: "
        "must be an integer from 1 to 100, got 150"
    )


def test_time_slicing_on_a_share_is_rejected_with_the_result_path():
    claim = make_claim([share("gpu-2", "8Gi", "small")], [gpu_config(strategy="TimeSlicing")])
    with pytest.raises(ConfigError) as info:
        parse(claim)
    assert str(info.value).startswith(
        "status.allocation.devices.results[0] (request small, device gpu-2): a memory share is enforced by an MPS"
    )


# --- MIG devices ------------------------------------------------------------------------------


def test_static_mig_device_resolves_to_the_existing_instance():
    inv = inventory("mixed")
    instance = inv.gpu_by_index(1).mig_instances[0]
    target = resolve_device(inv, f"gpu-1-mig-{instance.profile.replace('.', '')}-{instance.placement_start}")
    assert target.static_instance == instance
    assert target.is_mig and not target.is_dynamic_mig
    assert target.memory_bytes == instance.memory_bytes


def test_dynamic_mig_device_resolves_to_profile_and_placement():
    target = resolve_device(inventory("h100-16-mig"), "gpu-2-mig-1g10gb-3")
    assert target.is_dynamic_mig
    assert target.mig_profile is not None and target.mig_profile.name == "1g.10gb"
    assert target.placement == 3
    assert target.gpu.index == 2


def test_mig_placement_the_profile_does_not_offer_is_an_error():
    with pytest.raises(AllocationError, match="offers no MIG profile 3g40gb at placement 2"):
        resolve_device(inventory("h100-16-mig"), "gpu-0-mig-3g40gb-2")


def test_mig_device_on_a_gpu_without_mig_is_an_error():
    with pytest.raises(AllocationError, match="does not support creating one"):
        resolve_device(inventory("t4-4"), "gpu-0-mig-1g10gb-0")


def test_memory_share_of_a_mig_device_is_rejected():
    with pytest.raises(AllocationError, match="a memory share of MIG device gpu-0-mig-1g10gb-0 is not supported"):
        parse(make_claim([share("gpu-0-mig-1g10gb-0", "4Gi")]), "h100-16-mig")


def test_time_slicing_config_on_a_mig_device_is_rejected():
    claim = make_claim([result("gpu-0-mig-1g10gb-0")], [gpu_config(strategy="TimeSlicing")])
    with pytest.raises(ConfigError, match="MIG devices cannot be time-sliced"):
        parse(claim, "h100-16-mig")


# --- every published device can be prepared ---------------------------------------------------


@pytest.mark.parametrize("profile", builtin_profiles())
def test_every_published_device_resolves_with_its_published_memory(profile):
    from driver.slices import build_slices

    inv = inventory(profile)
    devices = [
        d
        for strategy in ("none", "static", "dynamic")
        for s in build_slices(inv, mig_strategy=strategy)
        for d in s["spec"].get("devices", [])
    ]
    assert devices
    for device in devices:
        target = resolve_device(inv, device["name"])
        assert target.memory_bytes == quantity_bytes(device["capacity"]["memory"]["value"]), device["name"]
        assert target.is_mig == ("-mig-" in device["name"])


# -- the plan prepare and recovery share ------------------------------------------------------------


def test_the_plan_of_the_recorded_allocation_is_the_plan_of_the_claim():
    from driver.allocation import allocation_record, plan_allocation

    claim = make_claim(
        [result("gpu-0-mig-1g10gb-2", "mig"), {**result("gpu-1"), "driver": "gpu.nvidia.com"}, share("gpu-3", "8Gi")],
        [gpu_config(strategy="MPS", mps={"activeThreadPercentage": 40})],
    )
    from_claim = parse(claim, "h100-16-mig")
    record = allocation_record(claim, "node-a")
    assert record["devices"]["results"][1] is None, "another driver's result is nulled, its index kept"
    restored = plan_allocation(record, uid=UID, namespace="team-a", name="claim", inventory=inventory("h100-16-mig"),
                               pool="node-a")  # fmt: skip
    assert restored == from_claim and restored.allocation == from_claim.allocation == record


def test_the_plan_says_how_each_gpu_is_used_and_where_its_mig_instances_go():
    from driver.allocation import GpuUse, MigKey

    inv = inventory("h100-16-mig")
    plan = parse(make_claim([result("gpu-0-mig-1g10gb-2", "a"), result("gpu-3", "b"),
                             result("gpu-4", "c", adminAccess=True)]), "h100-16-mig")  # fmt: skip
    g0, g3 = inv.gpu_by_index(0).uuid, inv.gpu_by_index(3).uuid
    assert plan.gpu_uses == (GpuUse(g0, "mig"), GpuUse(g3, "exclusive")), "admin access holds no use"
    assert plan.migs == (("gpu-0-mig-1g10gb-2", MigKey(g0, "1g.10gb", 2)),)


def test_the_plan_lists_each_time_sliced_gpu_once_with_its_interval():
    claim = make_claim([result("gpu-2", "a"), result("gpu-5", "b")],
                       [gpu_config(strategy="TimeSlicing", timeSlicing={"interval": "Long"})])  # fmt: skip
    plan = parse(claim)
    assert plan.time_slices == ((inventory().gpus[2].uuid, "Long"), (inventory().gpus[5].uuid, "Long"))
    assert plan.mps_groups == ()


def test_a_checkpoint_record_that_is_empty_is_not_allocated():
    from driver.allocation import plan_allocation

    with pytest.raises(AllocationError, match=r"^ResourceClaim ns/c is not allocated"):
        plan_allocation({}, uid=UID, namespace="ns", name="c", inventory=inventory(), pool="node-a")
