"""The checkpoint's in-memory copy and the prepare's write budget.

CheckpointStore decodes the file again only when its identity changed (another process, a file
replaced by hand, a write that failed after its rename), and a prepare or unprepare writes the
checkpoint exactly twice. Real files under tmp_path throughout.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from driver.atomicfile import write_atomic
from kubeletplugin import checkpointstore
from kubeletplugin.checkpoint import Checkpoint, ClaimEntry, ClaimState
from kubeletplugin.checkpointstore import CheckpointStore
from kubeletplugin.migmanager import MigError
from kubeletplugin.state import DeviceState
from kubeletplugin.timeslicing import SimulatedTimeSlicer
from tests.builders.claims import UID, gpu_config, result, share
from tests.builders.state import make_state, prepare, ref


def entry(uid: str, state: ClaimState = ClaimState.PREPARE_COMPLETED) -> ClaimEntry:
    return ClaimEntry(uid=uid, namespace="team-a", name=uid[:4], state=state)


class DecodeCounter:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = checkpointstore.decode

        def counting(data: bytes) -> Checkpoint:
            self.calls += 1
            return real(data)

        monkeypatch.setattr(checkpointstore, "decode", counting)


def test_unchanged_file_is_not_decoded_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CheckpointStore(tmp_path)
    store.put(entry("a"))
    decodes = DecodeCounter(monkeypatch)
    for _ in range(5):
        assert list(store.load()) == ["a"]
        assert store.get("a") == entry("a")
    assert decodes.calls == 0  # the store's own write told it what the file holds


def test_write_by_another_store_is_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine, theirs = CheckpointStore(tmp_path), CheckpointStore(tmp_path)  # two pods of a rolling update
    mine.put(entry("a"))
    assert list(theirs.load()) == ["a"]
    decodes = DecodeCounter(monkeypatch)
    theirs.put(entry("b"))
    assert sorted(mine.load()) == ["a", "b"]
    assert decodes.calls == 1
    theirs.drop("a")
    assert mine.get("a") is None
    with mine.transaction() as entries:  # a transaction starts from the other store's write too
        assert sorted(entries) == ["b"]


def test_same_size_rewrite_by_another_store_is_seen(tmp_path: Path) -> None:
    mine, theirs = CheckpointStore(tmp_path), CheckpointStore(tmp_path)
    mine.put(entry("a", ClaimState.PREPARE_STARTED))
    # same length state names would give the same size; the replaced inode still differs
    theirs.put(entry("a", ClaimState.PREPARE_COMPLETED))
    assert mine.get("a") == entry("a", ClaimState.PREPARE_COMPLETED)


def test_file_removed_behind_the_store_reads_empty(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.put(entry("a"))
    store.path.unlink()
    assert store.load() == {}


def test_corrupt_file_written_behind_the_cache_is_moved_aside(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.put(entry("a"))
    tmp = tmp_path / "replacement"
    tmp.write_bytes(b'{"version": 1, "chec')
    tmp.rename(store.path)
    assert store.load() == {}
    assert [p.name.startswith("checkpoint.json.corrupt-") for p in tmp_path.glob("checkpoint.json.*")] == [True]
    store.put(entry("b"))
    assert list(CheckpointStore(tmp_path).load()) == ["b"]


def test_write_failing_after_its_rename_is_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CheckpointStore(tmp_path)
    store.put(entry("a"))
    real = write_atomic

    def renamed_then_failed(path: Path, data: bytes, mode: int) -> None:
        real(path, data, mode)
        raise OSError(5, "Input/output error", str(path.parent))  # the directory fsync failed

    monkeypatch.setattr(checkpointstore, "write_atomic", renamed_then_failed)
    with pytest.raises(OSError, match="Input/output error"):
        store.put(entry("b"))
    monkeypatch.undo()
    # the file does hold both now; the cache must not keep claiming it holds only "a"
    assert sorted(store.load()) == ["a", "b"]


def test_load_returns_a_copy(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.put(entry("a"))
    store.load().clear()
    assert list(store.load()) == ["a"]


# -- the write budget of a prepare --------------------------------------------------------------------


class WriteCounter:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.states: list[dict[str, str]] = []
        real = CheckpointStore.save

        def counting(store: CheckpointStore, entries: dict[str, ClaimEntry]) -> None:
            self.states.append({uid: e.state.value for uid, e in entries.items()})
            real(store, entries)

        monkeypatch.setattr(CheckpointStore, "save", counting)


CLAIMS: dict[str, tuple[str, list[dict[str, Any]], list[dict[str, Any]] | None]] = {
    "whole GPU": ("dgx-h100-8", [result("gpu-0")], None),
    "memory share (MPS)": ("dgx-h100-8", [share("gpu-1", "10Gi")], None),
    "dynamic MIG": ("h100-16-mig", [result("gpu-1-mig-1g10gb-2", "mig")], None),
    "time slicing": ("dgx-h100-8", [result("gpu-2")],
                     [gpu_config(strategy="TimeSlicing", timeSlicing={"interval": "Long"})]),
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(CLAIMS))
def test_prepare_and_unprepare_write_the_checkpoint_twice_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    profile, results, configs = CLAIMS[kind]
    state = make_state(tmp_path, profile, timeslicer=SimulatedTimeSlicer(tmp_path / "state"))
    writes = WriteCounter(monkeypatch)
    got = prepare(state, results, configs)
    assert not got.error, got.error
    assert writes.states == [{UID: "PrepareStarted"}, {UID: "PrepareCompleted"}]
    completed = state.prepared_claims()[UID]
    # what the skipped intermediate writes used to record is all in the completed entry
    assert completed.allocation is not None
    assert len(completed.migs) == len(state.mig.created())
    assert (completed.mps is not None) == (kind == "memory share (MPS)")
    assert bool(completed.time_slices) == (kind == "time slicing")
    writes.states.clear()
    state.unprepare(ref())
    assert writes.states == [{UID: "UnprepareStarted"}, {}]


def test_time_slices_are_recorded_before_they_are_applied(tmp_path: Path) -> None:
    seen: list[tuple[tuple[str, str], ...]] = []

    class Checking(SimulatedTimeSlicer):
        def set_interval(self, gpu_uuid: str, interval: str) -> None:
            recorded = CheckpointStore(tmp_path / "state").get(UID)
            assert recorded is not None
            seen.append(recorded.time_slices)
            super().set_interval(gpu_uuid, interval)

    state = make_state(tmp_path, timeslicer=Checking(tmp_path / "state"))
    got = prepare(state, [result("gpu-0")], [gpu_config(strategy="TimeSlicing", timeSlicing={"interval": "Long"})])
    assert not got.error
    gpu0 = state.inventory.gpus[0].uuid
    assert seen == [((gpu0, "Long"),)]


def test_failed_second_mig_create_rolls_back_the_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first instance is known only in memory when the second create fails; it must not leak."""
    state: DeviceState = make_state(tmp_path, "h100-16-mig")
    real = state.mig.create
    calls = 0

    def second_fails(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise MigError("gpu-2: NVML_ERROR_INSUFFICIENT_RESOURCES (injected)")
        return real(*args)

    monkeypatch.setattr(state.mig, "create", second_fails)
    got = prepare(state, [result("gpu-1-mig-1g10gb-2", "mig"), result("gpu-2-mig-1g10gb-2", "mig2")])
    assert "INSUFFICIENT_RESOURCES" in got.error
    assert calls == 2
    assert state.mig.created() == []
    assert state.prepared_claims() == {}


def test_failed_rollback_records_the_progress_for_the_retry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = make_state(tmp_path, "h100-16-mig")

    def broken_spec(*args: Any) -> None:
        raise OSError(28, "No space left on device", str(tmp_path / "cdi"))

    def broken_destroy(*args: Any) -> None:
        raise MigError("gpu-1: NVML_ERROR_IN_USE (injected)")

    with monkeypatch.context() as patch:
        patch.setattr("kubeletplugin.state.write_spec", broken_spec)
        patch.setattr(state.mig, "destroy", broken_destroy)
        got = prepare(state, [result("gpu-1-mig-1g10gb-2", "mig")])
    assert "No space left on device" in got.error
    recorded = state.prepared_claims()[UID]
    assert recorded.state == ClaimState.PREPARE_STARTED
    assert recorded.migs == tuple(state.mig.created())  # the instance the rollback could not destroy
    retried = prepare(state, [result("gpu-1-mig-1g10gb-2", "mig")])  # rolls forward onto it
    assert not retried.error
    assert len(state.mig.created()) == 1
    assert state.prepared_claims()[UID].migs == tuple(state.mig.created())


# -- group commit -------------------------------------------------------------------------------------


def _queued_behind_a_held_lock(store: CheckpointStore, actions: list[Any]) -> list[BaseException | None]:
    """Run each action in its own thread while this thread holds the store's lock, and release it only
    once all of them have queued their change: they then share whatever write comes next."""
    outcomes: list[BaseException | None] = [None] * len(actions)

    def run(i: int) -> None:
        try:
            actions[i]()
        except BaseException as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(actions))]
    with store.transaction():
        for t in threads:
            t.start()
        while len(store._queue) < len(actions):
            time.sleep(0.001)
    for t in threads:
        t.join()
    return outcomes


def test_concurrent_changes_share_one_durable_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CheckpointStore(tmp_path)
    store.put(entry("gone"))
    writes = WriteCounter(monkeypatch)
    uids = [f"claim-{i}" for i in range(6)]
    actions: list[Any] = [lambda u=u: store.put(entry(u)) for u in uids]
    outcomes = _queued_behind_a_held_lock(store, [*actions, lambda: store.drop("gone")])
    assert outcomes == [None] * 7
    assert len(writes.states) == 1  # one write for all seven changes
    assert sorted(CheckpointStore(tmp_path).load()) == uids


def test_failed_group_write_fails_every_change_in_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CheckpointStore(tmp_path)
    store.put(entry("kept"))

    def full(path: Path, data: bytes, mode: int) -> None:
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(checkpointstore, "write_atomic", full)
    outcomes = _queued_behind_a_held_lock(store, [lambda u=u: store.put(entry(u)) for u in ("a", "b", "c")])
    monkeypatch.undo()
    assert all(isinstance(o, OSError) and o.strerror == "No space left on device" for o in outcomes), outcomes
    assert all(isinstance(o, OSError) and o.filename == str(store.path) for o in outcomes)
    assert list(store.load()) == ["kept"]  # none of them is in the file, nor claimed by the cache
    store.put(entry("a"))  # and the next change is not stuck behind the failed ones
    assert sorted(CheckpointStore(tmp_path).load()) == ["a", "kept"]


def test_young_file_rewritten_in_place_with_the_same_identity_is_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Coarse file times can leave an in-place rewrite of the same size with the same identity: a
    file modified shortly before the cache was taken is compared by content, not by identity."""
    store = CheckpointStore(tmp_path)
    store.put(entry("a"))
    monkeypatch.setattr(CheckpointStore, "_identity", staticmethod(lambda st: (1, 2, 3, 4)))  # never changes
    store.load()
    original = store.path.read_bytes()
    store.path.write_bytes(original.replace(b'"checksum": "sha256:', b'"checksum": "sha256:0')[:len(original)])
    assert store.load() == {}  # the damaged content was noticed and moved aside
    assert len(list(tmp_path.glob("checkpoint.json.corrupt-*"))) == 1
