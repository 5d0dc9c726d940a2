"""Recovery and retry paths of DeviceState that the main state tests did not pin down.

Found by mutation testing (docs/reliability.md, `make mutation`): each test here fails on a
mutant that survived the other tests, and on the defect that mutant stands for.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from kubeletplugin.checkpointstore import FILE_NAME
from kubeletplugin.mps import mps_paths
from kubeletplugin.state import DeviceState
from tests.builders.claims import UID, gpu_config, inventory, result, share
from tests.builders.state import (
    UID2,
    Crash,
    crash_at,
    make_state,
    prepare,
    ref,
    simulated_mps,
    spec_of,
    visible_of,
)

MIG = "h100-16-mig"


class Recorder:
    """Stands in for a module's structlog logger: records events with their bound and given fields.

    (structlog.testing.capture_logs misses loggers cached before it, which other tests' log setup causes.)
    """

    def __init__(self, events: list[dict[str, Any]] | None = None, **context: Any) -> None:
        self.events = [] if events is None else events
        self.context = context

    def bind(self, **kw: Any) -> Recorder:
        return Recorder(self.events, **{**self.context, **kw})

    def _record(self, level: str, event: str, **kw: Any) -> None:
        self.events.append({"event": event, "log_level": level, **self.context, **kw})

    def debug(self, event: str, **kw: Any) -> None:
        self._record("debug", event, **kw)

    def info(self, event: str, **kw: Any) -> None:
        self._record("info", event, **kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._record("warning", event, **kw)

    def error(self, event: str, **kw: Any) -> None:
        self._record("error", event, **kw)

    def exception(self, event: str, **kw: Any) -> None:
        self._record("error", event, **kw)


def test_restore_recreates_every_vanished_instance_not_only_up_to_a_live_one(tmp_path: Path) -> None:
    state = make_state(tmp_path, MIG)
    assert not prepare(state, [result("gpu-1-mig-1g10gb-0", "mig"), result("gpu-1-mig-1g10gb-2", "mig")]).error
    first, second = state.prepared_claims()[UID].migs
    state.mig.destroy(second)  # a GPU reset took the second instance; the first is alive
    restarted = make_state(tmp_path, MIG)
    report = restarted.recover()
    assert report.migs_recreated == [UID]
    kept, recreated = restarted.prepared_claims()[UID].migs
    assert kept == first and restarted.mig.exists(recreated) and recreated.placement == second.placement
    assert visible_of(spec_of(restarted)) == f"{first.uuid},{recreated.uuid}"


def test_restore_of_a_dynamic_mig_share_under_mps_restarts_its_daemon_on_the_new_instance(tmp_path: Path) -> None:
    state = make_state(tmp_path, MIG)
    mps = [gpu_config(strategy="MPS", mps={"activeThreadPercentage": 40})]
    assert not prepare(state, [result("gpu-1-mig-1g10gb-2", "mig")], mps).error
    (old,) = state.mig.created()
    state.mig.destroy(old)
    simulated_mps(state).registry.unlink()  # the node rebooted: instance and daemon gone
    restarted = make_state(tmp_path, MIG)
    report = restarted.recover()
    assert report.mps_restarted == [UID]
    (new,) = restarted.mig.created()
    daemon = simulated_mps(restarted).daemons()[UID]
    assert daemon.gpu_uuids == (new.uuid,)
    assert daemon.active_thread_percentage == 40
    assert restarted.prepared_claims()[UID].mps == daemon


def test_restore_restarts_a_daemon_with_its_thread_percentage(tmp_path: Path) -> None:
    state = make_state(tmp_path)
    config = [gpu_config(strategy="MPS", mps={"activeThreadPercentage": 25})]
    assert not prepare(state, [share("gpu-0", "4Gi")], config).error
    before = simulated_mps(state).daemons()[UID]
    simulated_mps(state).registry.unlink()
    restarted = make_state(tmp_path)
    assert restarted.recover().mps_restarted == [UID]
    assert simulated_mps(restarted).daemons()[UID] == before
    assert before.active_thread_percentage == 25


def test_restore_of_a_static_mig_claim_rebuilds_its_spec(tmp_path: Path) -> None:
    state = make_state(tmp_path, "mixed")
    instance = inventory("mixed").gpu_by_index(1).mig_instances[0]
    name = f"gpu-1-mig-{instance.profile.replace('.', '')}-{instance.placement_start}"
    assert not prepare(state, [result(name, "mig")]).error
    original = spec_of(state)
    (state.cdi_dir / f"gpu.tessera.dev-claim_{UID}.json").unlink()
    restarted = make_state(tmp_path, "mixed")
    report = restarted.recover()
    assert report.failed == {} and report.specs_rewritten == [UID]
    assert spec_of(restarted) == original


def test_a_legacy_entry_without_an_allocation_is_reported_with_the_way_out(tmp_path: Path) -> None:
    import json

    state = make_state(tmp_path)
    assert not prepare(state, [result("gpu-0")]).error
    path = state.state_dir / FILE_NAME
    doc = json.loads(path.read_bytes())
    del doc["claims"][UID]["allocation"]  # what an older tessera wrote
    from kubeletplugin.checkpoint import canonical

    doc["checksum"] = "sha256:" + __import__("hashlib").sha256(canonical(doc["claims"])).hexdigest()
    path.write_text(json.dumps(doc))
    report = make_state(tmp_path).recover()
    assert report.failed[UID] == (
        "checkpoint entry of claim team-a/claim records no allocation (written by an older tessera), so its CDI "
        "spec cannot be rebuilt; if the spec is gone, delete the pod so that kubelet prepares the claim again"
    )


def test_a_retried_prepare_reuses_only_an_unowned_instance_at_its_own_placement(tmp_path: Path) -> None:
    state = make_state(tmp_path, MIG)
    assert not prepare(state, [result("gpu-1-mig-1g10gb-0", "mig")], uid=UID2, name="other").error
    (owned,) = state.mig.created()
    gpu = inventory(MIG).gpu_by_index(1)
    from driver.mig import layout_for

    layout = layout_for(gpu.product_name)
    assert layout is not None
    leaked = state.mig.create(gpu, layout.profile("1g.10gb"), 4)  # unowned, but not at this claim's placement
    crashing = make_state(tmp_path, MIG, crash_at("after-checkpoint-started"))
    with pytest.raises(Crash):
        prepare(crashing, [result("gpu-1-mig-1g10gb-2", "mig")])
    retry = make_state(tmp_path, MIG)
    assert not prepare(retry, [result("gpu-1-mig-1g10gb-2", "mig")]).error
    (mine,) = retry.prepared_claims()[UID].migs
    assert mine.placement == 2 and mine not in (owned, leaked)
    assert retry.prepared_claims()[UID2].migs == (owned,)


def test_a_checkpoint_moved_aside_is_named_by_utc_time_and_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kubeletplugin.checkpointstore

    state = make_state(tmp_path)
    assert not prepare(state, [result("gpu-0")]).error
    (state.state_dir / FILE_NAME).write_text("{garbage")
    recorder = Recorder()
    monkeypatch.setattr(kubeletplugin.checkpointstore, "log", recorder)
    assert make_state(tmp_path).prepared_claims() == {}
    logs = recorder.events
    (aside,) = state.state_dir.glob(f"{FILE_NAME}.corrupt-*")
    assert re.fullmatch(r"checkpoint\.json\.corrupt-\d{8}T\d{6}\.\d{6}Z", aside.name), aside.name
    (event,) = [e for e in logs if e["event"].startswith("checkpoint unusable")]
    assert event["event"] == "checkpoint unusable; moved aside and starting with no prepared claims"
    assert event["path"] == str(state.state_dir / FILE_NAME)
    assert event["moved_to"] == str(aside)
    assert "not valid JSON" in event["reason"]
    assert event["log_level"] == "error"


def test_logs_name_the_claim_and_the_orphan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kubeletplugin.recovery
    import kubeletplugin.state

    state: DeviceState = make_state(tmp_path)
    assert not prepare(state, [result("gpu-0")]).error
    recorder = Recorder()
    monkeypatch.setattr(kubeletplugin.state, "log", recorder)
    monkeypatch.setattr(kubeletplugin.recovery, "log", recorder)
    state.unprepare(ref())
    (state.cdi_dir / f"gpu.tessera.dev-claim_{UID2}.json").write_text("{}")
    state.unprepare(ref(UID2, "stray"))
    (state.state_dir / "mps" / "not a uid").mkdir(parents=True)
    state.recover()
    events = {e["event"]: e for e in recorder.events}
    assert "claim unprepared" not in events  # the gRPC layer logs the outcome, once
    stray = events["removed a CDI spec of a claim not in the checkpoint"]
    assert (stray["claim_uid"], stray["claim"]) == (UID2, "team-a/stray")
    failed = events["orphan cleanup failed"]
    assert failed["orphan"] == "mps:not a uid" and failed["log_level"] == "error"


def test_a_running_daemon_with_a_thread_percentage_is_adopted_not_restarted(tmp_path: Path) -> None:
    state = make_state(tmp_path)
    config = [gpu_config(strategy="MPS", mps={"activeThreadPercentage": 25})]
    assert not prepare(state, [share("gpu-0", "4Gi")], config).error
    report = make_state(tmp_path).recover()
    assert report.mps_restarted == [] and report.failed == {}


def _put(state: DeviceState, **changes: Any) -> None:
    """Change the claim's checkpoint entry (as a forged or hand-edited checkpoint would)."""
    entry = state.store.get(UID)
    assert entry is not None
    state.store.put(dataclasses.replace(entry, **changes))


def test_unprepare_stops_a_running_daemon_the_entry_does_not_record(tmp_path: Path) -> None:
    """A crash between the daemon's start and PrepareCompleted leaves it unrecorded but running."""
    with pytest.raises(Crash):
        prepare(make_state(tmp_path, hook=crash_at("after-mps-start")), [share("gpu-1", "8Gi")])
    retry = make_state(tmp_path)
    assert retry.prepared_claims()[UID].mps is None and simulated_mps(retry).is_running(UID)
    retry.unprepare(ref())
    assert simulated_mps(retry).daemons() == {}
    assert not mps_paths(retry.state_dir, UID).root.exists()


def test_unprepare_of_a_claim_whose_daemon_died_still_removes_its_directories(tmp_path: Path) -> None:
    state = make_state(tmp_path)
    assert not prepare(state, [share("gpu-1", "8Gi")]).error
    simulated_mps(state).registry.unlink()  # the daemon died; its pipe and shm directories stayed
    assert mps_paths(state.state_dir, UID).root.exists()
    state.unprepare(ref())
    assert not mps_paths(state.state_dir, UID).root.exists()


def test_restore_restarts_a_live_daemon_whose_instance_came_back_under_a_new_uuid(tmp_path: Path) -> None:
    """The daemon still runs, but on the vanished instance: it is started again on the new one, and
    the checkpoint records the new daemon."""
    state = make_state(tmp_path, MIG)
    assert not prepare(state, [result("gpu-1-mig-1g10gb-2", "mig")], [gpu_config(strategy="MPS")]).error
    (old,) = state.mig.created()
    state.mig.destroy(old)
    # someone else now holds its GPU instance id, so the new instance gets another id and UUID
    (state.state_dir / "mig-instances.json").write_text(
        json.dumps([{**old.to_dict(), "uuid": "MIG-other", "placement": 6}])
    )
    restarted = make_state(tmp_path, MIG)
    report = restarted.recover()
    assert report.mps_restarted == [UID] and report.failed == {}
    (new,) = restarted.prepared_claims()[UID].migs
    assert new.uuid != old.uuid
    daemon = simulated_mps(restarted).daemons()[UID]
    assert daemon.gpu_uuids == (new.uuid,)
    assert restarted.prepared_claims()[UID].mps == daemon


@pytest.mark.parametrize(
    ("profile", "device", "changes", "error"),
    [
        pytest.param(
            MIG, "gpu-1-mig-1g10gb-2", {"migs": ()},
            "claim team-a/claim: no MIG instance recorded for gpu-1-mig-1g10gb-2", id="no-instance-recorded",
        ),
        pytest.param(
            "dgx-h100-8", "gpu-0", {"allocation": {}},
            "ResourceClaim team-a/claim is not allocated (status.allocation is missing)", id="empty-allocation",
        ),
    ],
)  # fmt: skip
def test_an_entry_that_cannot_be_restored_is_reported_with_the_claim(
    tmp_path: Path, profile: str, device: str, changes: dict[str, Any], error: str
) -> None:
    state = make_state(tmp_path, profile)
    assert not prepare(state, [result(device, "mig")]).error
    _put(state, **changes)
    assert make_state(tmp_path, profile).recover().failed == {UID: error}


def test_an_instance_on_a_gpu_without_a_mig_table_is_reported_with_the_gpu(tmp_path: Path) -> None:
    state = make_state(tmp_path, "mixed")
    assert not prepare(state, [result("gpu-0-mig-1g10gb-0", "mig")]).error
    (mig,) = state.prepared_claims()[UID].migs
    l4 = inventory("mixed").gpu_by_index(2)
    _put(state, migs=(dataclasses.replace(mig, gpu_uuid=l4.uuid, gpu_index=2, gpu_minor=2),))
    assert make_state(tmp_path, "mixed").recover().failed == {UID: "gpu-2: no MIG table for NVIDIA L4"}


def test_a_claim_with_two_mps_daemons_gets_both_back_after_a_reboot(tmp_path: Path) -> None:
    state = make_state(tmp_path)
    state.store.boot_id = "boot-a"
    configs = [gpu_config(requests=("a",), strategy="MPS", mps={"activeThreadPercentage": 30}),
               gpu_config(requests=("b",), strategy="MPS", mps={"activeThreadPercentage": 70})]  # fmt: skip
    assert not prepare(state, [result("gpu-0", "a"), result("gpu-1", "b")], configs).error
    simulated_mps(state).registry.unlink()  # the node rebooted: no daemon is left
    restarted = make_state(tmp_path)
    restarted.store.boot_id = "boot-b"
    report = restarted.recover()
    assert report.rebooted and report.mps_restarted == [UID] and not report.failed
    daemons = simulated_mps(restarted).daemons()
    assert sorted(daemons) == sorted([UID, f"{UID}-mps1"])
    assert restarted.prepared_claims()[UID].mps_daemons == (daemons[UID], daemons[f"{UID}-mps1"])
    assert (daemons[UID].active_thread_percentage, daemons[f"{UID}-mps1"].active_thread_percentage) == (30, 70)


def test_the_daemon_of_a_second_mps_group_is_no_orphan_and_one_no_entry_records_is(tmp_path: Path) -> None:
    state = make_state(tmp_path)
    configs = [gpu_config(requests=("a",), strategy="MPS", mps={"activeThreadPercentage": 30}),
               gpu_config(requests=("b",), strategy="MPS")]  # fmt: skip
    assert not prepare(state, [result("gpu-0", "a"), result("gpu-1", "b")], configs).error
    stray = "0a9b8c7d-0000-4000-8000-0000000000ff-mps1"
    simulated_mps(state).start(stray, ["GPU-x"], [1024], None)  # a crash left a second group's daemon of a gone claim
    report = make_state(tmp_path).recover()
    assert report.orphan_mps_stopped == [stray]
    assert sorted(simulated_mps(state).daemons()) == sorted([UID, f"{UID}-mps1"])
