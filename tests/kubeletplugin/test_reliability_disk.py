"""Checkpoint and disk faults: damaged checkpoints, a full or read-only CDI dir, a full state dir.

Each fault is injected two ways where the machine allows: for real (a 64 KiB tmpfs that fills up,
a read-only remount; needs root and mount(2), skipped otherwise) and by making the system calls
fail with the same errno (always runs). The claim must fail alone with an error that says what
went wrong, leave no partial file, hold no GPU, and prepare normally once the disk is back.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from driver.cdi import claim_spec_uids, read_spec
from kubeletplugin.checkpoint import ClaimState, encode
from kubeletplugin.checkpointstore import FILE_NAME, CheckpointStore
from kubeletplugin.draservice import claim_failure
from kubeletplugin.kubeletclaims import ClaimRef
from kubeletplugin.mps import SimulatedMpsControl
from kubeletplugin.state import DeviceState
from tests.builders.claims import make_claim, result, share
from tests.builders.state import make_steps

UID = "00000000-0000-4000-8000-0000000d15c0"
UID2 = "00000000-0000-4000-8000-0000000d15c1"


def node(root: Path) -> DeviceState:
    return DeviceState(make_steps(root), "node-a")


def prepare_share(state: DeviceState, uid: str = UID, device: str = "gpu-1") -> str:
    """The error text kubelet gets for the prepare ("" when it succeeds)."""
    ref = ClaimRef("team-a", uid[-4:], uid)
    try:
        state.prepare(ref, make_claim([share(device, "4Gi")], uid=uid, name=uid[-4:]))
    except Exception as exc:
        return claim_failure("prepare", ref, exc).message
    return ""


def leftovers(*dirs: Path) -> list[str]:
    return [p.name for d in dirs if d.exists() for p in d.rglob(".*.tmp")]


def assert_holds_nothing(state: DeviceState) -> None:
    assert state.store.load() == {}
    assert claim_spec_uids(state.cdi_dir) == []
    assert isinstance(state.mps, SimulatedMpsControl)
    assert state.mps.daemons() == {}
    assert leftovers(state.cdi_dir, state.state_dir) == []


def assert_failed_claim_gone(state: DeviceState, failed: str, kept: str, kept_spec: object) -> None:
    """The claim whose prepare failed holds nothing (entry, spec, daemon); the other claim is untouched."""
    assert leftovers(state.cdi_dir, state.state_dir) == []
    entries = node(state.state_dir.parent).store.load()  # as a fresh reader of the file sees it
    assert sorted(entries) == [kept], f"the failed claim is still in the checkpoint: {entries.get(failed)}"
    assert entries[kept].state == ClaimState.PREPARE_COMPLETED
    assert claim_spec_uids(state.cdi_dir) == [kept]
    assert read_spec(state.cdi_dir, kept) == kept_spec
    assert isinstance(state.mps, SimulatedMpsControl)
    assert sorted(state.mps.daemons()) == [kept]


# -- damaged checkpoints ---------------------------------------------------------------------------------


def _good_checkpoint(root: Path) -> bytes:
    state = node(root)
    assert prepare_share(state) == ""
    assert not state.prepare(ClaimRef("team-a", "w", UID2), make_claim([result("gpu-3")], uid=UID2, name="w")).error
    return (state.state_dir / FILE_NAME).read_bytes()


def _damage_cases(good: bytes) -> Iterator[tuple[str, bytes]]:
    rng = random.Random(5)
    for _ in range(12):
        cut = rng.randrange(0, len(good))
        yield f"truncated at byte {cut}", good[:cut]
    for _ in range(12):
        at = rng.randrange(0, len(good))
        flipped = bytearray(good)
        flipped[at] ^= 1 << rng.randrange(8)
        if bytes(flipped) != good:
            yield f"bit flip at byte {at}", bytes(flipped)
    doc = json.loads(good)
    yield "future version", json.dumps({**doc, "version": 2}).encode()
    yield "no version", json.dumps({k: v for k, v in doc.items() if k != "version"}).encode()
    yield "empty file", b""
    yield "binary garbage", os.urandom(256)
    yield "claims not an object", encode({}).replace(b'"claims": {}', b'"claims": []')


def test_damaged_checkpoints_are_moved_aside_and_the_node_cleans_up(tmp_path: Path) -> None:
    good = _good_checkpoint(tmp_path / "good")
    cases = list(_damage_cases(good))
    survived = 0
    for n, (what, data) in enumerate(cases):
        root = tmp_path / f"case{n}"
        _good_checkpoint(root)
        (root / "state" / FILE_NAME).write_bytes(data)
        restarted = node(root)
        report = restarted.recover()
        entries = restarted.store.load()
        if entries:  # a flip inside whitespace can leave the content valid: then nothing may be lost
            assert sorted(entries) == sorted([UID, UID2]), what
            assert all(e.state == ClaimState.PREPARE_COMPLETED for e in entries.values()), what
            continue
        aside = list((root / "state").glob(f"{FILE_NAME}.corrupt-*"))
        assert len(aside) == 1, what
        assert aside[0].stat().st_mode & 0o777 == 0o600, what
        # no checkpoint: the specs and the daemon are orphans; kubelet re-prepares what it still needs
        assert sorted(report.orphan_specs_removed) == sorted([UID, UID2]), what
        assert report.orphan_mps_stopped == [UID], what
        assert_holds_nothing(restarted)
        assert prepare_share(restarted) == "", what
        survived += 1
    print(f"damaged checkpoints recovered: {survived} of {len(cases)} variants (the rest stayed valid)")
    assert survived >= 20


def test_unreadable_checkpoint_fails_the_claim_not_the_process(tmp_path: Path) -> None:
    state = node(tmp_path)
    (state.state_dir / FILE_NAME).mkdir()  # EISDIR: cannot be read, cannot be moved aside as a file either
    error = prepare_share(state)
    assert "Is a directory" in error and "checkpoint.json" in error
    assert claim_spec_uids(state.cdi_dir) == []


# -- full and read-only disks, injected -----------------------------------------------------------------


def _fail_fsync_under(directory: Path, err: int, when: Callable[[], bool] = lambda: True) -> Callable[[int], None]:
    real = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(directory)) and when():
            raise OSError(err, os.strerror(err))
        real(fd)

    return fsync


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS, errno.EIO])
@pytest.mark.parametrize("where", ["cdi", "state", "state-late"])
def test_write_failure_fails_the_claim_alone_and_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int, where: str
) -> None:
    state = node(tmp_path)
    assert prepare_share(state, UID2, "gpu-5") == ""  # a claim prepared before the disk filled up
    before = read_spec(state.cdi_dir, UID2)
    # "state-late": the state disk fails only while the claim's spec exists, so the PrepareCompleted
    # write fails and the rollback has a spec and a daemon to take back (and can then drop the entry)
    late = where == "state-late"
    when = (lambda: os.path.exists(state.cdi_dir / f"gpu.tessera.dev-claim_{UID}.json")) if late else (lambda: True)
    monkeypatch.setattr(os, "fsync", _fail_fsync_under(tmp_path / where.removesuffix("-late"), err, when))
    error = prepare_share(state)
    assert os.strerror(err) in error, error
    assert "internal error" not in error, error
    monkeypatch.undo()
    # before any recovery: the failed prepare rolled itself back and holds nothing
    assert_failed_claim_gone(state, UID, UID2, before)
    restarted = node(tmp_path)
    report = restarted.recover()
    assert report.rolled_back == [] and report.orphan_specs_removed == [] and report.orphan_mps_stopped == []
    assert sorted(restarted.store.load()) == [UID2]
    assert prepare_share(restarted) == ""  # and with the disk back, the claim prepares
    assert sorted(claim_spec_uids(restarted.cdi_dir)) == sorted([UID, UID2])


# -- full and read-only disks, for real --------------------------------------------------------------------


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "cdi"
    mount.mkdir()
    if shutil.which("mount") is None or shutil.which("umount") is None:
        pytest.skip("no mount(8) here")
    # -n everywhere: util-linux would otherwise record the mount in the machine's /run/mount/utab
    proc = subprocess.run(["mount", "-n", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-n", "-l", str(mount)], check=False)


def test_full_cdi_tmpfs(tiny_tmpfs: Path) -> None:
    state = node(tiny_tmpfs.parent)
    assert prepare_share(state, UID2, "gpu-5") == ""
    filler = tiny_tmpfs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    error = prepare_share(state)
    assert "No space left on device" in error, error
    assert "internal error" not in error
    assert sorted(p.name for p in tiny_tmpfs.iterdir()) == sorted(["filler", f"gpu.tessera.dev-claim_{UID2}.json"])
    assert_failed_claim_gone(state, UID, UID2, read_spec(state.cdi_dir, UID2))
    filler.unlink()
    assert prepare_share(state) == ""


def test_read_only_cdi_mount(tiny_tmpfs: Path) -> None:
    state = node(tiny_tmpfs.parent)
    assert prepare_share(state, UID2, "gpu-5") == ""
    subprocess.run(["mount", "-n", "-o", "remount,ro", str(tiny_tmpfs)], check=True)
    error = prepare_share(state)
    assert "Read-only file system" in error, error
    assert_failed_claim_gone(state, UID, UID2, read_spec(state.cdi_dir, UID2))
    # unprepare cannot delete the spec either: an error kubelet retries, the entry kept for the retry
    with pytest.raises(OSError, match="Read-only file system"):
        state.unprepare(ClaimRef("team-a", UID2[-4:], UID2))
    subprocess.run(["mount", "-n", "-o", "remount,rw", str(tiny_tmpfs)], check=True)
    state.unprepare(ClaimRef("team-a", UID2[-4:], UID2))
    assert prepare_share(state) == ""
    assert claim_spec_uids(state.cdi_dir) == [UID]


def test_checkpoint_store_reads_through_a_missing_state_dir(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "not-yet")
    assert store.load() == {}
