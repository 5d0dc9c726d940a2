"""Which MIG instances a prepare creates, and which it takes over from an earlier attempt of its claim.

An attempt whose rollback failed records its instances in the PrepareStarted entry; kubelet's retry
must take over exactly those (each for its own device), create again the ones that vanished, and on
a new failure leave nothing behind. Each test names the defect it catches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from driver.mig import MigProfile, layout_for
from driver.model import Gpu
from kubeletplugin.checkpoint import ClaimState
from kubeletplugin.migmanager import CreatedMig, MigError
from kubeletplugin.state import DeviceState
from tests.builders.claims import UID, inventory, result
from tests.builders.state import Crash, crash_at, make_state, prepare, spec_of, visible_of

MIG = "h100-16-mig"


def _fails_and_cannot_roll_back(step: str) -> None:
    if step in ("after-mig-create", "unprepare-after-mps-stop"):
        raise MigError(f"injected at {step}")


def _recorded_attempt(tmp_path: Path, results: list[dict[str, Any]]) -> tuple[CreatedMig, ...]:
    """A prepare that failed after creating its instances, and whose rollback failed too: what it
    leaves is a PrepareStarted entry that records the instances."""
    state = make_state(tmp_path, MIG, _fails_and_cannot_roll_back)
    assert prepare(state, results).error == "injected at after-mig-create"
    entry = state.prepared_claims()[UID]
    assert entry.state == ClaimState.PREPARE_STARTED and len(entry.migs) == len(results)
    return entry.migs


def _instances_of(state: DeviceState) -> set[CreatedMig]:
    return set(state.mig.created())


def test_a_retry_takes_over_each_recorded_instance_for_its_own_device(tmp_path: Path) -> None:
    """Two instances of one profile on one GPU (placements 0 and 2), and one at placement 0 of
    another GPU: each device gets back the instance at its own GPU and placement."""
    results = [
        result("gpu-1-mig-1g10gb-0", "a"),
        result("gpu-1-mig-1g10gb-2", "b"),
        result("gpu-2-mig-1g10gb-0", "c"),
    ]
    recorded = _recorded_attempt(tmp_path, results)
    retry = make_state(tmp_path, MIG)
    assert not prepare(retry, results).error
    assert retry.prepared_claims()[UID].migs == recorded
    assert _instances_of(retry) == set(recorded)  # nothing new created, nothing left over
    assert visible_of(spec_of(retry)) == ",".join(m.uuid for m in recorded)


def test_a_retry_creates_again_a_recorded_instance_that_vanished(tmp_path: Path) -> None:
    results = [result("gpu-1-mig-1g10gb-0", "a"), result("gpu-2-mig-1g10gb-0", "b")]
    first, second = _recorded_attempt(tmp_path, results)
    retry = make_state(tmp_path, MIG)
    retry.mig.destroy(first)  # a reset of gpu-1 took it
    assert not prepare(retry, results).error
    migs = retry.prepared_claims()[UID].migs
    assert [(m.gpu_uuid, m.placement) for m in migs] == [(first.gpu_uuid, 0), (second.gpu_uuid, 0)]
    assert migs[1] == second
    assert _instances_of(retry) == set(migs)  # the one in the entry exists


def test_a_retry_that_fails_again_destroys_what_it_took_over_and_what_it_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first device's instance is created again, the second's cannot be; the third device's
    recorded instance has not been reached yet, and the rollback must still destroy it."""
    results = [
        result("gpu-1-mig-1g10gb-0", "a"),
        result("gpu-2-mig-1g10gb-0", "b"),
        result("gpu-3-mig-1g10gb-0", "c"),
    ]
    first, second, _third = _recorded_attempt(tmp_path, results)
    retry = make_state(tmp_path, MIG)
    retry.mig.destroy(first)
    retry.mig.destroy(second)
    create = retry.mig.create

    def refuse_gpu_2(gpu: Gpu, profile: MigProfile, placement: int) -> CreatedMig:
        if gpu.index == 2:
            raise MigError("gpu-2: GPU instance creation refused")
        return create(gpu, profile, placement)

    monkeypatch.setattr(retry.mig, "create", refuse_gpu_2)
    assert prepare(retry, results).error == "gpu-2: GPU instance creation refused"
    assert retry.mig.created() == []
    assert retry.prepared_claims() == {}


def test_a_retry_after_a_crash_takes_over_every_instance_it_had_created(tmp_path: Path) -> None:
    results = [result("gpu-1-mig-1g10gb-0", "a"), result("gpu-1-mig-1g10gb-2", "b")]
    with pytest.raises(Crash):
        prepare(make_state(tmp_path, MIG, crash_at("after-mig-create")), results)
    created = make_state(tmp_path, MIG).mig.created()
    assert len(created) == 2
    retry = make_state(tmp_path, MIG)
    assert not prepare(retry, results).error
    assert retry.prepared_claims()[UID].migs == tuple(created)
    assert retry.mig.created() == created


def test_a_first_prepare_does_not_take_over_an_instance_nobody_owns(tmp_path: Path) -> None:
    """Only a retry knows that an unowned instance at its placement is its own; for a first
    attempt it is someone else's (a claim whose entry was lost), and sharing it is refused."""
    state = make_state(tmp_path, MIG)
    gpu = inventory(MIG).gpu_by_index(1)
    layout = layout_for(gpu.product_name)
    assert layout is not None
    theirs = state.mig.create(gpu, layout.profile("1g.10gb"), 2)
    got = prepare(state, [result("gpu-1-mig-1g10gb-2", "mig")])
    assert "overlaps GPU instance" in got.error
    assert state.mig.created() == [theirs]


def test_a_device_other_than_a_dynamic_instance_before_one_does_not_stop_its_creation(tmp_path: Path) -> None:
    state = make_state(tmp_path, MIG)
    assert not prepare(state, [result("gpu-0", "whole"), result("gpu-1-mig-1g10gb-2", "mig")]).error
    (created,) = state.mig.created()
    assert state.prepared_claims()[UID].migs == (created,)
    assert visible_of(spec_of(state)) == f"{inventory(MIG).gpus[0].uuid},{created.uuid}"


def test_one_instance_serves_a_device_allocated_twice_in_a_claim(tmp_path: Path) -> None:
    """A request with adminAccess may get the same MIG device as another request of the claim."""
    state = make_state(tmp_path, MIG)
    got = prepare(state, [result("gpu-1-mig-1g10gb-2", "a"), result("gpu-1-mig-1g10gb-2", "b", adminAccess=True)])
    assert not got.error
    (created,) = state.mig.created()
    assert state.prepared_claims()[UID].migs == (created,)
    assert [d.cdi_device_ids for d in got.devices] == [
        (f"gpu.tessera.dev/claim={UID}-gpu-1-mig-1g10gb-2-0",),
        (f"gpu.tessera.dev/claim={UID}-gpu-1-mig-1g10gb-2-1",),
    ]
