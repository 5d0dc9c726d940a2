"""Checkpoint formats across upgrades and rollbacks, with files the previous format really wrote.

`tests/kubeletplugin/fixtures/checkpoint/format1.json` was written by the last format-1 build (branch harden-node,
f63a5b8) preparing a whole GPU and a 10Gi share. The previous build's reader is taken from git
history, so "a rollback can read what this build wrote" is checked against the code that would run.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kubeletplugin.checkpoint import FORMAT, CheckpointFromNewerBuild, ClaimEntry, ClaimState, encode
from kubeletplugin.checkpointstore import FILE_NAME, CheckpointStore
from tests.builders.checkpoint import full_entry
from tests.builders.claims import UID, share
from tests.builders.state import UID2, make_state, prepare

FIXTURE = Path(__file__).parent / "fixtures" / "checkpoint" / "format1.json"


def _install_format1(tmp_path: Path) -> Path:
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    target = state_dir / FILE_NAME
    shutil.copy(FIXTURE, target)
    target.chmod(0o600)
    return target


def test_a_format_1_file_is_read_and_every_claim_restored(tmp_path: Path) -> None:
    _install_format1(tmp_path)
    state = make_state(tmp_path)
    report = state.recover()
    entries = state.store.load()
    assert sorted(entries) == sorted([UID, UID2]) and not report.failed and not report.rolled_back
    assert all(e.state == ClaimState.PREPARE_COMPLETED for e in entries.values())
    assert sorted(report.specs_rewritten) == sorted([UID, UID2]), "specs rebuilt from the recorded allocations"
    assert entries[UID2].mps is not None and entries[UID2].mps.limits_mib == (10 * 1024,)
    assert not report.rebooted, "a format-1 file records no boot: its daemons are adopted when alive"


def test_the_next_write_upgrades_the_file_and_keeps_it_readable_by_format_1(tmp_path: Path) -> None:
    path = _install_format1(tmp_path)
    state = make_state(tmp_path)
    state.recover()
    prepare(state, [share("gpu-2", "5Gi")], uid="11111111-2222-4333-8444-555555555555", name="new")
    doc = json.loads(path.read_bytes())
    assert (doc["version"], doc["format"], doc["bootID"]) == (1, FORMAT, state.store.boot_id)
    assert _previous_build_reads(path, tmp_path) == sorted([UID, UID2, "11111111-2222-4333-8444-555555555555"])


def _previous_build_reads(path: Path, tmp_path: Path, marker: str = "READABLE_SINCE") -> list[str]:
    """The claim uids an older build decodes from `path` (by default the newest one before format 2;
    `marker` picks the newest build whose checkpoint.py lacks it), from its own tree (git archive) in
    its own interpreter, so what is checked is the code a rollback would run. Its error, if it refuses."""
    from e2e.node.previous_build import NoPreviousBuild, extract, last_commit_without

    try:
        tree = extract(last_commit_without("kubeletplugin/checkpoint.py", marker), tmp_path / f"previous-{marker}")
    except NoPreviousBuild as exc:
        pytest.skip(str(exc))
    script = ("import json, sys; from kubeletplugin.checkpoint import decode\n"
              "got = decode(open(sys.argv[1], 'rb').read())\n"
              "print(json.dumps(sorted(got.entries if hasattr(got, 'entries') else got)))")
    proc = subprocess.run([sys.executable, "-c", script, str(path)], cwd=tree, capture_output=True, text=True,
                          check=False, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"})
    if proc.returncode != 0:
        raise AssertionError(proc.stderr.strip().splitlines()[-1])
    uids: list[str] = json.loads(proc.stdout)
    return uids


def _two_daemons(uid: str) -> ClaimEntry:
    first = full_entry(uid).mps_daemons[0]
    second = dataclasses.replace(first, claim_uid=f"{uid}-mps1")
    return dataclasses.replace(full_entry(uid), mps_daemons=(first, second))


@pytest.mark.parametrize("marker", ["READABLE_SINCE", "SEVERAL_DAEMONS_SINCE"], ids=["format-1", "format-2"])
def test_older_builds_read_claims_of_one_daemon_and_refuse_a_claim_of_two(tmp_path: Path, marker: str) -> None:
    store = CheckpointStore(tmp_path / "state", boot_id="boot-a")
    store.save({UID: full_entry(UID)})
    assert json.loads(store.path.read_bytes())["version"] == 1
    assert _previous_build_reads(store.path, tmp_path, marker) == [UID]
    store.save({UID: full_entry(UID), UID2: _two_daemons(UID2)})
    assert json.loads(store.path.read_bytes())["version"] == 3
    # format 2 (the build before this one) keeps the file and stops; format 1 only says it cannot read it
    refusal = "CheckpointFromNewerBuild: written by a newer tessera" if marker != "READABLE_SINCE" else \
        "CheckpointError: version 3, this build reads version 1"
    with pytest.raises(AssertionError, match=refusal):
        _previous_build_reads(store.path, tmp_path, marker)
    assert CheckpointStore(tmp_path / "state").load()[UID2].mps_daemons == _two_daemons(UID2).mps_daemons


def test_a_file_from_a_newer_incompatible_build_is_kept_and_stops_the_agent(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, boot_id="boot-a")
    store.save({UID: full_entry(UID)})
    doc = json.loads(store.path.read_bytes())
    doc["version"], doc["format"] = FORMAT + 1, FORMAT + 1
    store.path.write_text(json.dumps(doc))
    fresh = CheckpointStore(tmp_path, boot_id="boot-a")
    with pytest.raises(CheckpointFromNewerBuild, match=f"reads formats up to {FORMAT}: roll the DaemonSet forward"):
        fresh.load()
    assert json.loads(store.path.read_bytes()) == doc, "the newer build's claims are left as they were"
    assert not list(tmp_path.glob(f"{FILE_NAME}.corrupt-*"))


def test_mps_daemons_of_another_boot_are_started_again_not_adopted(tmp_path: Path) -> None:
    first = make_state(tmp_path)
    first.store.boot_id = "boot-a"
    prepare(first, [share("gpu-1", "10Gi")])
    same_boot = make_state(tmp_path)
    same_boot.store.boot_id = "boot-a"
    report = same_boot.recover()
    assert not report.rebooted and report.mps_restarted == []
    rebooted = make_state(tmp_path)
    rebooted.store.boot_id = "boot-b"
    report = rebooted.recover()
    assert report.rebooted and report.mps_restarted == [UID]
    assert json.loads(rebooted.store.path.read_bytes())["bootID"] == "boot-b"


def test_encode_records_the_boot() -> None:
    doc = json.loads(encode({}, "0f0e0d0c-boot"))
    assert doc["bootID"] == "0f0e0d0c-boot" and doc["version"] == 1 and doc["format"] == FORMAT


def test_the_plugin_refuses_to_start_on_a_newer_builds_checkpoint(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from kubeletplugin.plugin import PluginConfig, run_plugin
    from tests.fakes.apiserver import FakeKubeAPI

    state_dir = tmp_path / "state"
    store = CheckpointStore(state_dir)
    store.save({UID: full_entry(UID)})
    doc = json.loads(store.path.read_bytes())
    doc["version"], doc["format"] = FORMAT + 1, FORMAT + 1
    store.path.write_text(json.dumps(doc))
    config = PluginConfig(node_name="node-a", kubelet_dir=tmp_path / "k", cdi_dir=tmp_path / "cdi",
                          state_dir=state_dir, simulate="mixed", metrics_addr="127.0.0.1:0")  # fmt: skip
    assert run_plugin(config, api=FakeKubeAPI()) == 1
    assert "written by a newer tessera" in capsys.readouterr().out
    assert json.loads(store.path.read_bytes()) == doc


def test_a_document_without_format_is_format_1_and_one_that_says_format_2_is_read_as_such() -> None:
    from kubeletplugin.checkpoint import decode

    doc = json.loads(encode({UID: full_entry()}, "boot-a"))
    assert decode(json.dumps(doc).encode()).format == FORMAT
    del doc["format"], doc["bootID"]
    legacy = decode(json.dumps(doc).encode())
    assert legacy.format == 1 and legacy.boot_id == "" and list(legacy.entries) == [UID]


@pytest.mark.parametrize("boot_id", [7, None, ["b"]])
def test_a_boot_id_that_is_not_a_string_is_refused_by_name(boot_id: object) -> None:
    from kubeletplugin.checkpoint import CheckpointError, decode

    doc = json.loads(encode({}, "boot-a"))
    doc["bootID"] = boot_id
    with pytest.raises(CheckpointError, match=f"^bootID must be a string, got {type(boot_id).__name__}$"):
        decode(json.dumps(doc).encode())


def test_the_boot_id_given_to_the_store_is_the_one_it_writes(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, boot_id="boot-given")
    assert store.boot_id == "boot-given"
    store.save({})
    assert json.loads(store.path.read_bytes())["bootID"] == "boot-given"


def test_stamping_the_boot_writes_only_an_existing_file_of_another_boot(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, boot_id="boot-b")
    store.stamp_boot()
    assert not store.path.exists(), "no file: nothing to stamp, and no empty checkpoint is created"
    CheckpointStore(tmp_path, boot_id="boot-a").save({UID: full_entry()})
    before = store.path.stat().st_ino
    store.stamp_boot()
    assert json.loads(store.path.read_bytes())["bootID"] == "boot-b" and store.read().boot_id == "boot-b"
    again = store.path.stat().st_ino
    assert again != before
    store.stamp_boot()
    assert store.path.stat().st_ino == again, "the same boot is not written twice"


def test_a_machine_without_a_boot_id_records_none(tmp_path: Path) -> None:
    from kubeletplugin.checkpointstore import current_boot_id

    assert current_boot_id(tmp_path / "missing") == ""
    (tmp_path / "boot_id").write_text("abc-123\n")
    assert current_boot_id(tmp_path / "boot_id") == "abc-123"


def test_a_file_this_store_saved_in_this_boot_is_not_stamped_again(tmp_path: Path) -> None:
    CheckpointStore(tmp_path, boot_id="boot-a").save({UID: full_entry()})
    store = CheckpointStore(tmp_path, boot_id="boot-b")
    store.save(dict(store.load()))  # recovery after a reboot writes the restored entries
    written = store.path.stat().st_ino
    store.stamp_boot()
    assert store.path.stat().st_ino == written, "the file already records this boot: no second write"


def test_the_boot_a_file_was_written_in_is_part_of_what_is_read(tmp_path: Path) -> None:
    CheckpointStore(tmp_path, boot_id="boot-a").save({UID: full_entry()})
    read = CheckpointStore(tmp_path, boot_id="boot-b").read()
    assert (read.boot_id, read.format, list(read.entries)) == ("boot-a", FORMAT, [UID])
