"""What recover() removes that no checkpoint entry owns, and how it goes through the claims.

Temp files of interrupted atomic writes, orphans whose cleanup fails, claims dropped or locked by
the other instance of a rolling update while recovery waits: each test names the defect it catches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from driver.cdi import spec_path
from kubeletplugin.migmanager import MigError
from kubeletplugin.state import DeviceState
from tests.builders.claims import UID, result
from tests.builders.state import UID2, make_state, prepare

STALE = 1_000_000_000.0  # 2001: long before any agent started


def _temp_file(directory: Path, name: str, mtime: float = STALE) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("half a write")
    os.utime(path, (mtime, mtime))
    return path


def test_stale_temp_files_of_both_directories_are_removed_and_reported(tmp_path: Path) -> None:
    state = make_state(tmp_path)
    spec_tmp = _temp_file(state.cdi_dir, f".{spec_path(state.cdi_dir, UID).name}.k3j2.tmp")
    checkpoint_tmp = _temp_file(state.state_dir, ".checkpoint.json.x81q.tmp")
    report = state.recover()
    assert report.temp_files_removed == sorted([str(spec_tmp), str(checkpoint_tmp)])
    assert not spec_tmp.exists() and not checkpoint_tmp.exists()
    assert report.failed == {}


def test_another_drivers_temp_file_in_the_cdi_dir_is_left_alone(tmp_path: Path) -> None:
    state = make_state(tmp_path)
    theirs = _temp_file(state.cdi_dir, ".k8s.other.com-claim_x.json.a1.tmp")
    assert state.recover().temp_files_removed == []
    assert theirs.exists()


def test_a_temp_file_not_older_than_the_agent_is_kept_and_the_next_stale_one_still_removed(tmp_path: Path) -> None:
    """A file as young as this agent may be a write of the other instance still in progress; the
    files after it in the listing are still looked at."""
    state = make_state(tmp_path)
    young = _temp_file(state.state_dir, ".a-young.tmp", state.recovery.started)  # written as this agent started
    later = _temp_file(state.state_dir, ".b-later.tmp", state.recovery.started + 60)
    stale = _temp_file(state.state_dir, ".c-stale.tmp")
    report = state.recover()
    assert report.temp_files_removed == [str(stale)]
    assert young.exists() and later.exists() and not stale.exists()


def test_a_temp_file_that_vanishes_before_it_is_looked_at_does_not_stop_the_scan(tmp_path: Path) -> None:
    state = make_state(tmp_path)
    state.state_dir.mkdir(parents=True, exist_ok=True)
    (state.state_dir / ".a-gone.tmp").symlink_to(tmp_path / "nowhere")  # stat() finds nothing, as after a race
    stale = _temp_file(state.state_dir, ".b-stale.tmp")
    assert state.recover().temp_files_removed == [str(stale)]
    assert not stale.exists()


def test_a_temp_file_that_cannot_be_removed_is_reported_and_recovery_goes_on(tmp_path: Path) -> None:
    state = make_state(tmp_path)
    stuck = state.state_dir / ".a-stuck.tmp"
    stuck.mkdir(parents=True)  # unlink() refuses a directory
    os.utime(stuck, (STALE, STALE))
    stale = _temp_file(state.state_dir, ".b-stale.tmp")
    report = state.recover()
    assert list(report.failed) == [f"tmp:{stuck}"]
    assert "Is a directory" in report.failed[f"tmp:{stuck}"]
    assert not stale.exists()


def test_an_orphan_spec_that_cannot_be_removed_is_reported(tmp_path: Path) -> None:
    state = make_state(tmp_path)
    orphan = spec_path(state.cdi_dir, UID2)
    orphan.mkdir(parents=True)  # unlink() refuses a directory
    report = state.recover()
    assert list(report.failed) == [f"cdi:{UID2}"]
    assert "Is a directory" in report.failed[f"cdi:{UID2}"]


def test_an_orphan_mig_instance_that_cannot_be_destroyed_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = make_state(tmp_path, "h100-16-mig")
    assert not prepare(state, [result("gpu-1-mig-1g10gb-2", "mig")]).error
    (leaked,) = state.mig.created()
    state.store.drop(UID)  # its claim is gone, the instance stayed

    def refuse(mig: object) -> None:
        raise MigError("GPU instance busy")

    monkeypatch.setattr(state.mig, "destroy", refuse)
    report = state.recover()
    assert report.failed == {f"mig:{leaked.uuid}": "GPU instance busy"}


# --- going through the claims -------------------------------------------------------------------


def _two_claims(tmp_path: Path) -> DeviceState:
    state = make_state(tmp_path)
    assert not prepare(state, [result("gpu-0")]).error
    assert not prepare(state, [result("gpu-1")], uid=UID2, name="other").error
    for uid in (UID, UID2):
        spec_path(state.cdi_dir, uid).unlink()  # the CDI dir is a tmpfs: gone after a reboot
    return state


def test_a_claim_the_other_instance_released_meanwhile_does_not_stop_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """recover_claims() waits for each claim's node-wide lock; whoever held it may have unprepared
    the claim. The claims after it are restored all the same."""
    state = _two_claims(tmp_path)
    first, second = state.store.load()
    real_claim = state.locks.node_locks.claim

    @contextlib.contextmanager
    def claim(uid: str) -> Iterator[None]:
        with real_claim(uid):
            if uid == first:
                state.store.drop(uid)  # what the other instance did while we waited
            yield

    monkeypatch.setattr(state.locks.node_locks, "claim", claim)
    report = state.recover_claims()
    assert report.specs_rewritten == [second]
    assert report.failed == {}
    assert state.store.get(first) is None


def test_recover_claims_takes_each_claims_node_wide_lock_and_recover_takes_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """recover_claims() runs beside the other instance, so each claim waits for that instance's
    calls; recover() holds the node lock already (a claim lock under it would be taken twice)."""
    state = _two_claims(tmp_path)
    locked: list[str] = []
    real_claim = state.locks.node_locks.claim

    @contextlib.contextmanager
    def claim(uid: str) -> Iterator[None]:
        locked.append(uid)
        with real_claim(uid):
            yield

    monkeypatch.setattr(state.locks.node_locks, "claim", claim)
    assert sorted(state.recover_claims().specs_rewritten) == sorted([UID, UID2])
    assert sorted(locked) == sorted([UID, UID2])
    locked.clear()
    for uid in (UID, UID2):
        spec_path(state.cdi_dir, uid).unlink()
    assert sorted(state.recover().specs_rewritten) == sorted([UID, UID2])
    assert locked == []


def test_a_claim_that_fails_to_restore_does_not_stop_the_next(tmp_path: Path) -> None:
    state = _two_claims(tmp_path)
    first, second = state.store.load()
    entry = state.store.get(first)
    assert entry is not None
    state.store.put(dataclasses.replace(entry, allocation=None))
    report = state.recover()
    assert list(report.failed) == [first]
    assert report.specs_rewritten == [second]
