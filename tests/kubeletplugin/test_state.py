"""DeviceState: prepare / unprepare of every device kind, idempotency, conflicts, crashes and recovery.

Real files throughout (CDI dir, state dir, checkpoint); MPS and MIG are the file-backed fakes a
simulated node runs with.
"""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest

from driver.allocation import AllocationError
from driver.cdi import claim_spec_uids, read_spec, spec_path, write_spec
from driver.driverroot import discover_driver_root
from kubeletplugin.checkpoint import ClaimState
from kubeletplugin.devicesteps import DeviceSteps
from kubeletplugin.faults import MPS_START, PREPARE_STEPS, UNPREPARE_STEPS, fail_at
from kubeletplugin.kubeletclaims import PreparedDevice, PrepareResult
from kubeletplugin.migmanager import SimulatedMigManager
from kubeletplugin.mps import MpsError, SimulatedMpsControl, mps_paths
from kubeletplugin.state import DeviceState
from kubeletplugin.timeslicing import SimulatedTimeSlicer, TimeSliceError
from tests.builders.claims import UID, gpu_config, inventory, make_claim, result, share
from tests.builders.state import (
    UID2,
    Crash,
    crash_at,
    device_env,
    env_of,
    make_state,
    prepare,
    ref,
    simulated_mps,
    spec_of,
    unprepare,
    visible_of,
)

GIB = 1024**3


# --- the four kinds ---------------------------------------------------------------------------


def test_whole_gpu_prepare_answers_cdi_ids_and_writes_the_spec(tmp_path):
    state = make_state(tmp_path)
    got = prepare(state, [result("gpu-3", "gpu")])
    assert got == PrepareResult(
        (PreparedDevice(("gpu",), "node-a", "gpu-3", (f"gpu.tessera.dev/claim={UID}-gpu-3",), ""),)
    )
    spec = spec_of(state)
    gpu = inventory().gpu_by_index(3)
    # a simulated node has no /dev/nvidia*: the spec carries the device numbers itself
    assert spec["devices"] == [
        {
            "name": f"{UID}-gpu-3",
            "containerEdits": {
                "env": [f"TESSERA_DEVICES_{UID.upper().replace('-', '_')}_GPU={gpu.uuid}"],
                "deviceNodes": [{"path": f"/dev/nvidia{gpu.minor}", "type": "c", "major": 195, "minor": gpu.minor}],
            },
        }
    ]
    assert visible_of(spec) == gpu.uuid
    assert env_of(spec)["NVIDIA_VISIBLE_DEVICES"] == "void" and "CUDA_VISIBLE_DEVICES" not in env_of(spec)
    assert "CUDA_MPS_PIPE_DIRECTORY" not in env_of(spec)
    assert simulated_mps(state).daemons() == {}
    entry = state.prepared_claims()[UID]
    assert entry.state == ClaimState.PREPARE_COMPLETED
    assert entry.devices == got.devices


def test_real_node_spec_leaves_device_numbers_to_the_runtime(tmp_path):
    state = make_state(tmp_path)
    steps = DeviceSteps(dataclasses.replace(inventory(), source="nvml"), state.cdi_dir, state.state_dir, state.mps,
                        state.mig)  # fmt: skip
    state = DeviceState(steps, "node-a")
    prepare(state, [result("gpu-3")])
    spec = spec_of(state)
    minor = inventory().gpu_by_index(3).minor
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": f"/dev/nvidia{minor}"}]
    assert spec["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidiactl"},
        {"path": "/dev/nvidia-uvm"},
        {"path": "/dev/nvidia-uvm-tools"},
    ]


def test_subrequest_result_answers_the_base_request_name(tmp_path):
    got = prepare(make_state(tmp_path), [result("gpu-0", "accel/full")])
    assert got.devices[0].request_names == ("accel",)


def test_memory_share_starts_an_mps_daemon_with_the_share_as_limit(tmp_path):
    state = make_state(tmp_path)
    got = prepare(state, [share("gpu-1", "12Gi")], [gpu_config(mps={"activeThreadPercentage": 25})])
    assert not got.error
    assert got.devices[0].share_id == "3f2c8a9e-5d41-4b7a-9e2f-6c0d1a2b3c4d"
    daemon = simulated_mps(state).daemons()[UID]
    gpu = inventory().gpu_by_index(1)
    assert daemon.gpu_uuids == (gpu.uuid,)
    assert daemon.limits_mib == (12 * 1024,)
    assert daemon.active_thread_percentage == 25
    spec = spec_of(state)
    assert device_env(spec, 0)["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert not any("LIMIT" in key or "PERCENTAGE" in key for key in [*env_of(spec), *device_env(spec, 0)])
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["devices"][0]["containerEdits"]["mounts"]}
    assert mounts["/tmp/nvidia-mps"] == str(mps_paths(state.state_dir, UID).pipe_dir)
    assert mounts["/dev/shm"] == str(mps_paths(state.state_dir, UID).shm_dir)
    assert state.prepared_claims()[UID].mps == daemon


def test_fractional_share_limit_is_rounded_down_to_whole_mib(tmp_path):
    state = make_state(tmp_path)
    prepare(state, [share("gpu-1", str(4 * GIB + 1024 * 1024 - 1))])
    assert simulated_mps(state).daemons()[UID].limits_mib == (4096,)


def test_four_card_share_runs_one_daemon_in_result_order(tmp_path):
    state = make_state(tmp_path)
    order = [5, 2, 7, 0]
    results = [share(f"gpu-{i}", "4Gi", "gpu", f"00000000-0000-4000-8000-00000000000{n}") for n, i in enumerate(order)]
    got = prepare(state, results)
    assert [d.device_name for d in got.devices] == [f"gpu-{i}" for i in order]
    uuids = [inventory().gpu_by_index(i).uuid for i in order]
    (daemon,) = simulated_mps(state).daemons().values()
    assert daemon.gpu_uuids == tuple(uuids)
    assert daemon.limits_mib == (4096, 4096, 4096, 4096)
    assert visible_of(spec_of(state)) == ",".join(uuids)


def test_two_shares_of_one_card_in_one_claim_add_up(tmp_path):
    state = make_state(tmp_path)
    got = prepare(
        state,
        [share("gpu-0", "4Gi", "a", "00000000-0000-4000-8000-00000000000a"), share("gpu-0", "2Gi", "b")],
    )
    assert len({d.cdi_device_ids for d in got.devices}) == 2
    assert simulated_mps(state).daemons()[UID].limits_mib == (6144,)


def test_static_mig_device_gets_its_capability_nodes(tmp_path):
    state = make_state(tmp_path, "mixed")
    instance = inventory("mixed").gpu_by_index(1).mig_instances[0]
    name = f"gpu-1-mig-{instance.profile.replace('.', '')}-{instance.placement_start}"
    got = prepare(state, [result(name, "mig")])
    assert not got.error
    spec = spec_of(state)
    minor = inventory("mixed").gpu_by_index(1).minor
    nodes = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert nodes[0] == f"/dev/nvidia{minor}"
    assert all(n.startswith("/dev/nvidia-caps/nvidia-cap") for n in nodes[1:]) and len(nodes) == 3
    assert visible_of(spec) == instance.uuid
    assert SimulatedMigManager(state.state_dir).created() == []


def test_dynamic_mig_instance_is_created_at_prepare_and_destroyed_at_unprepare(tmp_path):
    state = make_state(tmp_path, "h100-16-mig")
    got = prepare(state, [result("gpu-2-mig-3g40gb-4", "mig")])
    assert not got.error
    (created,) = state.mig.created()
    assert (created.gpu_index, created.profile, created.placement) == (2, "3g.40gb", 4)
    spec = spec_of(state)
    assert visible_of(spec) == created.uuid
    nodes = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert f"/dev/nvidia-caps/nvidia-cap{3 + created.gpu_minor * 135 + created.gpu_instance_id * 9}" in nodes
    assert state.prepared_claims()[UID].migs == (created,)
    assert unprepare(state, ref()) == ""
    assert state.mig.created() == []


def test_overlapping_dynamic_mig_of_another_claim_fails_and_holds_nothing(tmp_path):
    state = make_state(tmp_path, "h100-16-mig")
    assert not prepare(state, [result("gpu-0-mig-3g40gb-0")]).error
    got = prepare(state, [result("gpu-0-mig-2g20gb-2")], uid=UID2, name="other")
    assert "overlaps GPU instance" in got.error
    assert UID2 not in state.prepared_claims()
    assert read_spec(state.cdi_dir, UID2) is None


def test_time_slicing_sets_the_interval_and_unprepare_resets_it(tmp_path):
    slicer = SimulatedTimeSlicer(tmp_path / "state")
    state = make_state(tmp_path, timeslicer=slicer)
    got = prepare(state, [result("gpu-0")], [gpu_config(strategy="TimeSlicing", timeSlicing={"interval": "Long"})])
    assert not got.error
    assert simulated_mps(state).daemons() == {}
    gpu = inventory().gpus[0]
    assert slicer.intervals() == {gpu.uuid: "Long"}
    assert state.prepared_claims()[UID].time_slices == ((gpu.uuid, "Long"),)
    assert unprepare(state, ref()) == ""
    assert slicer.intervals() == {}


def test_time_slicing_without_a_slicer_still_prepares(tmp_path):
    state = make_state(tmp_path)
    got = prepare(state, [result("gpu-0")], [gpu_config(strategy="TimeSlicing", timeSlicing={"interval": "Long"})])
    assert not got.error
    assert state.prepared_claims()[UID].time_slices == ()


def test_time_slice_failure_fails_the_prepare_and_rolls_back(tmp_path):
    class Refusing:
        def set_interval(self, gpu_uuid: str, interval: str) -> None:
            raise TimeSliceError("nvidia-smi exited with 4: Insufficient Permissions")

    state = make_state(tmp_path, timeslicer=Refusing())
    got = prepare(state, [result("gpu-0")], [gpu_config(strategy="TimeSlicing")])
    assert got.error == "nvidia-smi exited with 4: Insufficient Permissions"
    assert state.prepared_claims() == {}
    assert read_spec(state.cdi_dir, UID) is None


def test_unprepare_succeeds_when_the_interval_cannot_be_reset(tmp_path, monkeypatch):
    slicer = SimulatedTimeSlicer(tmp_path / "state")
    state = make_state(tmp_path, timeslicer=slicer)
    prepare(state, [result("gpu-0")], [gpu_config(strategy="TimeSlicing", timeSlicing={"interval": "Long"})])

    def refuse(gpu_uuid: str, interval: str) -> None:
        raise TimeSliceError("nvidia-smi exited with 4")

    monkeypatch.setattr(slicer, "set_interval", refuse)
    assert unprepare(state, ref()) == ""
    assert state.prepared_claims() == {}


def test_recover_reapplies_time_slice_intervals(tmp_path):
    slicer = SimulatedTimeSlicer(tmp_path / "state")
    prepare(
        make_state(tmp_path, timeslicer=slicer),
        [result("gpu-2")],
        [gpu_config(strategy="TimeSlicing", timeSlicing={"interval": "Short"})],
    )
    slicer.path.unlink()  # the GPU was reset
    make_state(tmp_path, timeslicer=slicer).recover()
    assert slicer.intervals() == {inventory().gpus[2].uuid: "Short"}


def test_whole_gpu_with_mps_config_runs_a_daemon_limited_to_the_card(tmp_path):
    state = make_state(tmp_path)
    assert not prepare(state, [result("gpu-0")], [gpu_config(strategy="MPS")]).error
    assert simulated_mps(state).daemons()[UID].limits_mib == (inventory().gpus[0].memory_bytes // (1024 * 1024),)


def test_driver_root_mounts_go_into_the_spec(tmp_path):
    root = tmp_path / "driver"
    (root / "usr/lib64").mkdir(parents=True)
    (root / "usr/lib64/libcuda.so.550.54.15").write_bytes(b"x")
    state = make_state(tmp_path, driver_root=discover_driver_root(root, host_root="/"))
    prepare(state, [result("gpu-0")])
    mounts = spec_of(state)["containerEdits"]["mounts"]
    assert mounts == [
        {
            "hostPath": "/usr/lib64/libcuda.so.550.54.15",
            "containerPath": "/usr/local/nvidia/lib64/libcuda.so.550.54.15",
            "options": ["ro", "nosuid", "nodev", "bind"],
        }
    ]


# --- idempotency and unprepare ----------------------------------------------------------------


def test_repeated_prepare_returns_the_same_answer_without_side_effects(tmp_path):
    state = make_state(tmp_path)
    first = prepare(state, [share("gpu-1", "8Gi")])
    spec_file = spec_path(state.cdi_dir, UID)
    before = (
        spec_file.stat().st_mtime_ns, state.store.path.stat().st_mtime_ns, simulated_mps(state).registry.read_bytes()
    )
    again = make_state(tmp_path)  # a restarted plugin asked again by kubelet
    assert prepare(again, [share("gpu-1", "8Gi")]) == first
    after = (
        spec_file.stat().st_mtime_ns, state.store.path.stat().st_mtime_ns, simulated_mps(state).registry.read_bytes()
    )
    assert after == before


def test_unprepare_removes_spec_daemon_and_entry(tmp_path):
    state = make_state(tmp_path)
    prepare(state, [share("gpu-1", "8Gi")])
    assert unprepare(state, ref()) == ""
    assert read_spec(state.cdi_dir, UID) is None
    assert simulated_mps(state).daemons() == {}
    assert not mps_paths(state.state_dir, UID).root.exists()
    assert state.prepared_claims() == {}


def test_unprepare_twice_and_of_unknown_claims_succeeds(tmp_path):
    state = make_state(tmp_path)
    prepare(state, [result("gpu-0")])
    assert unprepare(state, ref()) == ""
    assert unprepare(state, ref()) == ""
    assert unprepare(state, ref(UID2)) == ""


def test_unprepare_of_unknown_claim_removes_its_stray_spec(tmp_path):
    state = make_state(tmp_path)
    prepare(state, [result("gpu-0")])
    state.store.drop(UID)
    assert unprepare(state, ref()) == ""
    assert read_spec(state.cdi_dir, UID) is None


def test_unprepare_with_unsafe_uid_is_an_error(tmp_path):
    assert "is not a plain token" in unprepare(make_state(tmp_path), ref("../../etc"))


def test_unprepare_failure_is_reported_and_can_be_retried(tmp_path, monkeypatch):
    state = make_state(tmp_path)
    prepare(state, [share("gpu-1", "8Gi")])

    def failing_stop(uid: str) -> None:
        raise MpsError("quit timed out")

    with monkeypatch.context() as patch:
        patch.setattr(state.mps, "stop", failing_stop)
        assert unprepare(state, ref()) == "quit timed out"
    assert state.prepared_claims()[UID].state == ClaimState.UNPREPARE_STARTED
    assert unprepare(state, ref()) == ""
    assert state.prepared_claims() == {}


# --- errors -----------------------------------------------------------------------------------


def test_replaced_claim_is_an_error_in_the_result(tmp_path):
    state = make_state(tmp_path)
    with pytest.raises(AllocationError, match="the claim was replaced"):
        state.prepare(ref(UID2), make_claim([result("gpu-0")], uid=UID))
    assert state.prepared_claims() == {}


def test_claim_without_devices_on_this_node_prepares_nothing(tmp_path):
    state = make_state(tmp_path)
    got = prepare(state, [{**result("gpu-0"), "pool": "node-b"}])
    assert got == PrepareResult()
    assert claim_spec_uids(state.cdi_dir) == []


def test_invalid_config_is_an_error_in_the_result(tmp_path):
    got = prepare(make_state(tmp_path), [result("gpu-0")], [gpu_config(mps={"activeThreadPercentage": 0})])
    assert got.error.startswith("status.allocation.devices.config[0].opaque.parameters.sharing.mps")


def _mounts(spec, index):
    return [m["containerPath"] for m in spec["devices"][index]["containerEdits"].get("mounts", [])]


def test_a_claim_mixes_an_mps_request_and_an_exclusive_one(tmp_path):
    state = make_state(tmp_path)
    got = prepare(state, [share("gpu-0", "4Gi", "small"), result("gpu-1", "big")])
    assert not got.error
    spec = spec_of(state)
    assert _mounts(spec, 0) == ["/tmp/nvidia-mps", "/dev/shm"] and _mounts(spec, 1) == []
    assert device_env(spec, 0)["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in device_env(spec, 1)
    assert "mounts" not in spec["containerEdits"], "nothing of MPS is claim-wide"
    (daemon,) = state.prepared_claims()[UID].mps_daemons
    assert daemon.gpu_uuids == (inventory().gpus[0].uuid,) and daemon.limits_mib == (4 * 1024,)


def test_requests_with_different_mps_settings_get_a_daemon_each(tmp_path):
    state = make_state(tmp_path)
    got = prepare(
        state,
        [share("gpu-0", "4Gi", "a", "00000000-0000-4000-8000-00000000000a"), share("gpu-1", "4Gi", "b")],
        [gpu_config(requests=("a",), mps={"activeThreadPercentage": 20})],
    )
    assert not got.error
    daemons = state.prepared_claims()[UID].mps_daemons
    assert [(d.claim_uid, d.active_thread_percentage) for d in daemons] == [(UID, 20), (f"{UID}-mps1", None)]
    spec = spec_of(state)
    pipes = [m["hostPath"] for i in (0, 1) for m in spec["devices"][i]["containerEdits"]["mounts"]
             if m["containerPath"] == "/tmp/nvidia-mps"]  # fmt: skip
    assert pipes == [d.pipe_dir for d in daemons]
    assert json.loads((state.state_dir / "checkpoint.json").read_bytes())["version"] == 3, \
        "two daemons for one claim: a build that knows only one must not read it"
    assert unprepare(state, ref()) == ""
    assert simulated_mps(state).daemons() == {}


def test_requests_with_the_same_mps_settings_share_one_daemon(tmp_path):
    state = make_state(tmp_path)
    got = prepare(state, [share("gpu-0", "4Gi", "a", "00000000-0000-4000-8000-00000000000a"),
                          share("gpu-1", "8Gi", "b")])  # fmt: skip
    assert not got.error
    (daemon,) = state.prepared_claims()[UID].mps_daemons
    assert daemon.claim_uid == UID and daemon.limits_mib == (4 * 1024, 8 * 1024)
    assert json.loads((state.state_dir / "checkpoint.json").read_bytes())["version"] == 1


def test_a_container_naming_one_request_gets_only_that_requests_devices(tmp_path):
    state = make_state(tmp_path)
    got = prepare(state, [result("gpu-2", "ts-gpu"), result("gpu-5", "mps-gpu")],
                  [gpu_config(requests=("mps-gpu",), strategy="MPS")])  # fmt: skip
    assert not got.error
    ts, mps = got.devices
    assert (ts.request_names, mps.request_names) == (("ts-gpu",), ("mps-gpu",))
    spec = spec_of(state)
    by_name = {d["name"]: i for i, d in enumerate(spec["devices"])}
    ts_env = device_env(spec, by_name[ts.cdi_device_ids[0].split("=", 1)[1]])
    mps_env = device_env(spec, by_name[mps.cdi_device_ids[0].split("=", 1)[1]])
    key = f"TESSERA_DEVICES_{UID.upper().replace('-', '_')}"
    assert ts_env == {f"{key}_TS_GPU": inventory().gpus[2].uuid}
    assert mps_env[f"{key}_MPS_GPU"] == inventory().gpus[5].uuid and "CUDA_MPS_PIPE_DIRECTORY" in mps_env


def test_nvidias_gpu_test5_claim_prepares_time_slicing_and_mps_side_by_side(tmp_path):
    slicer = SimulatedTimeSlicer(tmp_path / "state")
    state = make_state(tmp_path, timeslicer=slicer)
    configs = [gpu_config(requests=("ts-gpu",), strategy="TimeSlicing", timeSlicing={"interval": "Long"}),
               gpu_config(requests=("mps-gpu",), strategy="MPS",
                          mps={"activeThreadPercentage": 50, "pinnedDeviceMemoryLimit": "10Gi"})]  # fmt: skip
    got = prepare(state, [result("gpu-0", "ts-gpu"), result("gpu-1", "mps-gpu")], configs)
    assert not got.error
    assert slicer.intervals() == {inventory().gpus[0].uuid: "Long"}
    (daemon,) = state.prepared_claims()[UID].mps_daemons
    assert daemon.gpu_uuids == (inventory().gpus[1].uuid,)
    assert (daemon.limits_mib, daemon.active_thread_percentage) == ((10 * 1024,), 50)


def test_failed_mps_start_rolls_the_claim_back(tmp_path):
    state_dir = tmp_path / "state"
    failing = fail_at(MPS_START, MpsError("nvidia-cuda-mps-control -d exited with 1: (injected failure)"))
    state = make_state(tmp_path, mps=SimulatedMpsControl(state_dir, fault_hook=failing))
    got = prepare(state, [share("gpu-1", "8Gi")])
    assert "injected failure" in got.error
    assert read_spec(state.cdi_dir, UID) is None
    assert state.prepared_claims() == {}
    # the card is free again for an exclusive claim
    assert not prepare(state, [result("gpu-1")], uid=UID2, name="other").error


def test_unexpected_exception_becomes_an_internal_error(tmp_path, monkeypatch):
    state = make_state(tmp_path)

    def broken(*args, **kwargs):
        raise ZeroDivisionError("oops")

    monkeypatch.setattr(state.mig, "create", broken)
    state.inventory = inventory("h100-16-mig")
    got = prepare(state, [result("gpu-0-mig-1g10gb-0")])
    assert got.error == "internal error preparing ResourceClaim team-a/claim: oops"
    assert state.prepared_claims() == {}


# --- exclusive vs share -----------------------------------------------------------------------


def test_exclusive_claim_on_a_card_holding_a_share_is_refused(tmp_path):
    state = make_state(tmp_path)
    assert not prepare(state, [share("gpu-4", "8Gi")], name="shared").error
    got = prepare(state, [result("gpu-4")], uid=UID2, name="whole")
    assert got.error == (
        "gpu-4 is already prepared for claim team-a/shared (share use); this claim needs it for exclusive use, "
        "which cannot coexist; it can be prepared once that claim is released"
    )
    assert UID2 not in state.prepared_claims()


def test_share_on_a_card_held_exclusively_is_refused(tmp_path):
    state = make_state(tmp_path)
    assert not prepare(state, [result("gpu-4")], name="whole").error
    got = prepare(state, [share("gpu-4", "8Gi")], uid=UID2, name="shared")
    assert "already prepared for claim team-a/whole (exclusive use)" in got.error


def test_two_shares_of_one_card_from_different_claims_coexist(tmp_path):
    state = make_state(tmp_path)
    assert not prepare(state, [share("gpu-4", "8Gi")]).error
    assert not prepare(state, [share("gpu-4", "8Gi")], uid=UID2, name="other").error
    assert len(simulated_mps(state).daemons()) == 2


def test_exclusive_claim_is_accepted_once_the_share_is_released(tmp_path):
    state = make_state(tmp_path)
    prepare(state, [share("gpu-4", "8Gi")])
    state.unprepare(ref())
    assert not prepare(state, [result("gpu-4")], uid=UID2, name="whole").error


def test_admin_access_does_not_conflict(tmp_path):
    state = make_state(tmp_path)
    prepare(state, [share("gpu-4", "8Gi")])
    assert not prepare(state, [result("gpu-4", adminAccess=True)], uid=UID2, name="admin").error


# --- crashes and recovery ---------------------------------------------------------------------


@pytest.mark.parametrize("step", PREPARE_STEPS)
def test_crash_during_prepare_is_rolled_back_by_recover(tmp_path, step):
    crashing = make_state(tmp_path, "h100-16-mig", crash_at(step))
    results = [result("gpu-1-mig-1g10gb-2", "mig")]
    with pytest.raises(Crash):
        prepare(crashing, results)
    restarted = make_state(tmp_path, "h100-16-mig")
    report = restarted.recover()
    assert report.rolled_back == [UID]
    assert restarted.prepared_claims() == {}
    assert claim_spec_uids(restarted.cdi_dir) == []
    assert restarted.mig.created() == []
    assert simulated_mps(restarted).daemons() == {}
    assert not prepare(restarted, results).error


@pytest.mark.parametrize("step", PREPARE_STEPS)
def test_crash_during_share_prepare_leaves_no_daemon_after_recover(tmp_path, step):
    with pytest.raises(Crash):
        prepare(make_state(tmp_path, hook=crash_at(step)), [share("gpu-1", "8Gi")])
    restarted = make_state(tmp_path)
    restarted.recover()
    assert simulated_mps(restarted).daemons() == {}
    assert not mps_paths(restarted.state_dir, UID).root.exists()
    assert claim_spec_uids(restarted.cdi_dir) == []


@pytest.mark.parametrize("step", PREPARE_STEPS)
def test_retried_prepare_after_crash_rolls_forward_without_leaks(tmp_path, step):
    with pytest.raises(Crash):
        prepare(make_state(tmp_path, "h100-16-mig", crash_at(step)), [result("gpu-1-mig-1g10gb-2", "mig")])
    retry = make_state(tmp_path, "h100-16-mig")
    got = prepare(retry, [result("gpu-1-mig-1g10gb-2", "mig")])
    assert not got.error
    assert len(retry.mig.created()) == 1
    assert retry.prepared_claims()[UID].state == ClaimState.PREPARE_COMPLETED
    assert visible_of(spec_of(retry)) == retry.mig.created()[0].uuid


@pytest.mark.parametrize("step", PREPARE_STEPS)
def test_retried_share_prepare_after_crash_has_one_daemon(tmp_path, step):
    with pytest.raises(Crash):
        prepare(make_state(tmp_path, hook=crash_at(step)), [share("gpu-1", "8Gi")])
    retry = make_state(tmp_path)
    assert not prepare(retry, [share("gpu-1", "8Gi")]).error
    assert list(simulated_mps(retry).daemons()) == [UID]
    assert retry.prepared_claims()[UID].mps == simulated_mps(retry).daemons()[UID]


@pytest.mark.parametrize("step", UNPREPARE_STEPS)
def test_crash_during_unprepare_is_finished_by_recover(tmp_path, step):
    state = make_state(tmp_path, "h100-16-mig")
    prepare(state, [result("gpu-1-mig-1g10gb-2", "mig")])
    state.steps.fault_hook = crash_at(step)
    with pytest.raises(Crash):
        state.unprepare(ref())
    restarted = make_state(tmp_path, "h100-16-mig")
    restarted.recover()
    assert restarted.prepared_claims() == {}
    assert restarted.mig.created() == []
    assert claim_spec_uids(restarted.cdi_dir) == []


@pytest.mark.parametrize("step", UNPREPARE_STEPS)
def test_retried_unprepare_after_crash_succeeds(tmp_path, step):
    state = make_state(tmp_path)
    prepare(state, [share("gpu-1", "8Gi")])
    state.steps.fault_hook = crash_at(step)
    with pytest.raises(Crash):
        state.unprepare(ref())
    retry = make_state(tmp_path)
    assert unprepare(retry, ref()) == ""
    assert retry.prepared_claims() == {}
    assert simulated_mps(retry).daemons() == {}


def test_recover_rewrites_specs_that_vanished_with_tmpfs(tmp_path):
    state = make_state(tmp_path)
    prepare(state, [result("gpu-0")])
    original = read_spec(state.cdi_dir, UID)
    spec_path(state.cdi_dir, UID).unlink()
    report = make_state(tmp_path).recover()
    assert report.specs_rewritten == [UID]
    assert read_spec(state.cdi_dir, UID) == original


def test_recover_leaves_intact_claims_alone(tmp_path):
    state = make_state(tmp_path)
    prepare(state, [share("gpu-0", "4Gi")])
    report = make_state(tmp_path).recover()
    assert report.specs_rewritten == [] and report.mps_restarted == [] and report.rolled_back == []


def test_recover_restarts_a_vanished_mps_daemon_with_the_same_limits(tmp_path):
    state = make_state(tmp_path)
    prepare(state, [share("gpu-0", "4Gi"), share("gpu-3", "6Gi", "b", "00000000-0000-4000-8000-00000000000b")])
    before = simulated_mps(state).daemons()[UID]
    simulated_mps(state).registry.unlink()  # the daemons died with the node
    restarted = make_state(tmp_path)
    report = restarted.recover()
    assert report.mps_restarted == [UID]
    assert simulated_mps(restarted).daemons()[UID] == before


def test_recover_recreates_a_vanished_dynamic_mig_instance_and_updates_the_spec(tmp_path):
    state = make_state(tmp_path, "h100-16-mig")
    prepare(state, [result("gpu-1-mig-1g10gb-2", "mig")])
    (old,) = state.mig.created()
    state.mig.destroy(old)  # a GPU reset wiped it
    (state.state_dir / "mig-instances.json").write_text(
        json.dumps([{**old.to_dict(), "uuid": "MIG-other", "placement": 6}])
    )  # and someone else now holds its GPU instance id
    restarted = make_state(tmp_path, "h100-16-mig")
    report = restarted.recover()
    assert report.migs_recreated == [UID]
    new = restarted.prepared_claims()[UID].migs[0]
    assert new.uuid != old.uuid and new.placement == old.placement
    spec = spec_of(restarted)
    assert visible_of(spec) == new.uuid
    nodes = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert f"/dev/nvidia-caps/nvidia-cap{3 + new.gpu_minor * 135 + new.gpu_instance_id * 9}" in nodes
    # the answer kubelet gets does not change
    assert prepare(restarted, [result("gpu-1-mig-1g10gb-2", "mig")]).devices == state.prepared_claims()[UID].devices


def test_recover_removes_orphans(tmp_path):
    state = make_state(tmp_path, "h100-16-mig")
    prepare(state, [result("gpu-0")])
    orphan_uid = "deadbeef-0000-4000-8000-000000000000"
    write_spec(state.cdi_dir, orphan_uid, read_spec(state.cdi_dir, UID) or {})
    (state.cdi_dir / "k8s.other.com-claim_x.json").write_text("{}")
    simulated_mps(state).start(orphan_uid, ["GPU-x"], [10], None)
    gpu = inventory("h100-16-mig").gpu_by_index(3)
    from driver.mig import layout_for

    layout = layout_for(gpu.product_name)
    assert layout is not None
    leaked = state.mig.create(gpu, layout.profile("1g.10gb"), 0)
    report = make_state(tmp_path, "h100-16-mig").recover()
    assert report.orphan_specs_removed == [orphan_uid]
    assert report.orphan_migs_destroyed == [leaked.uuid]
    assert report.orphan_mps_stopped == [orphan_uid]
    assert claim_spec_uids(state.cdi_dir) == [UID]
    assert (state.cdi_dir / "k8s.other.com-claim_x.json").exists()
    assert state.prepared_claims()[UID].state == ClaimState.PREPARE_COMPLETED


def test_recover_reports_an_orphan_it_cannot_clean_and_goes_on(tmp_path):
    state = make_state(tmp_path)
    (state.state_dir / "mps" / "not a uid").mkdir(parents=True)
    orphan_uid = "deadbeef-0000-4000-8000-000000000000"
    write_spec(state.cdi_dir, orphan_uid, {"kind": "gpu.tessera.dev/claim"})
    report = make_state(tmp_path).recover()
    assert "is not a plain token" in report.failed["mps:not a uid"]
    assert report.orphan_specs_removed == [orphan_uid]
    assert claim_spec_uids(state.cdi_dir) == []


# --- concurrency ------------------------------------------------------------------------------


def test_concurrent_prepares_keep_the_checkpoint_consistent(tmp_path):
    state = make_state(tmp_path)
    uids = [f"00000000-0000-4000-8000-{n:012d}" for n in range(8)]
    results: dict[str, PrepareResult] = {}

    def worker(n: int) -> None:
        uid = uids[n]
        results[uid] = prepare(state, [share(f"gpu-{n % 4}", "2Gi", "gpu", uid)], uid=uid, name=f"c{n}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(not r.error for r in results.values())
    entries = make_state(tmp_path).prepared_claims()
    assert sorted(entries) == sorted(uids)
    assert all(e.state == ClaimState.PREPARE_COMPLETED for e in entries.values())
    assert sorted(claim_spec_uids(state.cdi_dir)) == sorted(uids)
    assert sorted(simulated_mps(state).daemons()) == sorted(uids)


def test_concurrent_exclusive_claims_on_one_gpu_let_exactly_one_win(tmp_path):
    state = make_state(tmp_path)
    uids = [f"00000000-0000-4000-8000-{n:012d}" for n in range(6)]
    results: dict[str, PrepareResult] = {}

    def worker(uid: str) -> None:
        results[uid] = prepare(state, [result("gpu-2")], uid=uid, name=uid[-4:])

    threads = [threading.Thread(target=worker, args=(u,)) for u in uids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [u for u, r in results.items() if not r.error]
    assert len(winners) == 1
    assert list(state.prepared_claims()) == winners
    assert claim_spec_uids(state.cdi_dir) == winners


# --- found by mutation testing ------------------------------------------------------------------


def test_exclusive_claim_on_a_card_holding_a_mig_instance_names_the_mig_use(tmp_path):
    state = make_state(tmp_path, "h100-16-mig")
    assert not prepare(state, [result("gpu-1-mig-1g10gb-2", "mig")], name="sliced").error
    got = prepare(state, [result("gpu-1")], uid=UID2, name="whole")
    assert got.error == (
        "gpu-1 is already prepared for claim team-a/sliced (mig use); this claim needs it for exclusive use, "
        "which cannot coexist; it can be prepared once that claim is released"
    )


def test_a_conflict_on_the_second_card_of_a_prepared_claim_is_found(tmp_path):
    state = make_state(tmp_path)
    assert not prepare(state, [result("gpu-0", "a"), result("gpu-4", "b")], name="two").error
    got = prepare(state, [share("gpu-4", "8Gi")], uid=UID2, name="shared")
    assert "already prepared for claim team-a/two (exclusive use)" in got.error
    assert UID2 not in state.prepared_claims()


def test_the_checkpoint_keeps_only_this_nodes_part_of_the_allocation(tmp_path):
    """Other pools' and drivers' results and configs are nulled in place, so result indices stay (an
    entry that is not an object is nulled too, as the allocation parser skips it)."""
    ours, config = result("gpu-0"), gpu_config()
    results = [ours, {**result("gpu-1"), "pool": "node-b"}, {**result("gpu-2"), "driver": "other.example.com"}]
    state = make_state(tmp_path)
    assert not prepare(state, results, [gpu_config(driver="other.example.com"), "junk", config]).error
    assert state.prepared_claims()[UID].allocation == {
        "devices": {"results": [ours, None, None], "config": [None, None, config]}
    }


def test_prepare_after_an_interrupted_unprepare_finishes_it_and_prepares_afresh(tmp_path):
    state = make_state(tmp_path)
    assert not prepare(state, [share("gpu-1", "8Gi")]).error
    state.steps.fault_hook = crash_at("unprepare-after-checkpoint-started")
    with pytest.raises(Crash):
        state.unprepare(ref())
    retry = make_state(tmp_path)
    assert not prepare(retry, [share("gpu-1", "8Gi")]).error
    assert retry.prepared_claims()[UID].state == ClaimState.PREPARE_COMPLETED
    assert retry.prepared_claims()[UID].mps == simulated_mps(retry).daemons()[UID]


def test_a_retry_adopts_the_daemon_a_failed_rollback_left_recorded(tmp_path, monkeypatch):
    """The rollback could not stop the daemon, so the entry records it: kubelet's retry adopts it
    instead of starting a second daemon for the claim."""

    def fail_after_start(step: str) -> None:
        if step == "after-mps-start":
            raise MpsError("injected after the daemon started")

    def refuse_stop(uid: str) -> None:
        raise MpsError("quit timed out")

    state = make_state(tmp_path, hook=fail_after_start)
    monkeypatch.setattr(state.mps, "stop", refuse_stop)
    assert prepare(state, [share("gpu-1", "8Gi")]).error == "injected after the daemon started"
    recorded = state.prepared_claims()[UID].mps
    assert recorded is not None
    retry = make_state(tmp_path)
    started: list[str] = []
    start = retry.mps.start

    def counting_start(uid, *args):
        started.append(uid)
        return start(uid, *args)

    monkeypatch.setattr(retry.mps, "start", counting_start)
    assert not prepare(retry, [share("gpu-1", "8Gi")]).error
    assert started == []
    assert retry.prepared_claims()[UID].mps == recorded
