"""A forged checkpoint or state directory cannot make a container mount what tessera would not.

The attack: a local user who can write the state directory (or the checkpoint in it) plants a
checkpoint whose entry carries a CDI spec that bind-mounts the host's `/` read-write, with a
recomputed checksum (it is not keyed). After a reboot wiped /var/run/cdi, recovery used to write
that stored spec back verbatim. Now the directories are checked at start, a checkpoint someone
else owns or may write is moved aside, and recovery rebuilds each spec from the recorded
allocation with the code prepare uses.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from driver.cdi import claim_spec_uids, read_spec, spec_path
from kubeletplugin.checkpoint import canonical
from kubeletplugin.checkpointstore import FILE_NAME, CheckpointStore
from kubeletplugin.fsguard import UnsafeDirectoryError
from kubeletplugin.mps import mps_paths
from tests.builders.claims import UID, share
from tests.builders.state import make_state, prepare, simulated_mps

OTHER_UID = 65534
ROOT_MOUNT = {"hostPath": "/", "containerPath": "/host", "options": ["rw", "rbind"]}


def _mounts(spec: dict[str, Any]) -> list[dict[str, Any]]:
    edits = [spec.get("containerEdits") or {}] + [d.get("containerEdits") or {} for d in spec.get("devices", [])]
    return [m for e in edits for m in e.get("mounts", [])]


def _forge(state_dir: Path, edit: Any) -> None:
    """Rewrite the checkpoint's claims with `edit` and a valid (unkeyed) checksum, as an attacker can."""
    path = state_dir / FILE_NAME
    doc = json.loads(path.read_bytes())
    edit(doc["claims"])
    doc["checksum"] = "sha256:" + hashlib.sha256(canonical(doc["claims"])).hexdigest()
    path.write_text(json.dumps(doc))


def test_recovery_never_writes_a_spec_stored_in_the_checkpoint(tmp_path: Path) -> None:
    state = make_state(tmp_path)
    assert prepare(state, [share("gpu-0", "4Gi")]).error == ""
    original = read_spec(state.cdi_dir, UID)
    assert original is not None
    evil = json.loads(json.dumps(original))
    evil["containerEdits"]["mounts"] = [*evil["containerEdits"].get("mounts", []), ROOT_MOUNT]

    def plant(claims: dict[str, Any]) -> None:
        # both the field older builds restored verbatim and the one this build records
        claims[UID]["cdiSpec"] = evil
        if "allocation" in claims[UID]:  # and stray fields in the recorded allocation, which must be ignored
            claims[UID]["allocation"]["cdiSpec"] = evil
            claims[UID]["allocation"]["devices"]["results"][0]["containerEdits"] = {"mounts": [ROOT_MOUNT]}

    _forge(state.state_dir, plant)
    spec_path(state.cdi_dir, UID).unlink()  # a reboot wiped /var/run/cdi
    restarted = make_state(tmp_path)
    report = restarted.recover()
    assert report.specs_rewritten == [UID]
    rebuilt = read_spec(restarted.cdi_dir, UID)
    assert rebuilt == original  # what prepare made, rebuilt from the allocation
    assert rebuilt is not None
    assert ROOT_MOUNT not in _mounts(rebuilt)
    # the only mounts are tessera's own: the claim's MPS directories
    own = {m.host_path for m in mps_paths(restarted.state_dir, UID).container_edits().mounts}
    assert {m["hostPath"] for m in _mounts(rebuilt)} <= own


def test_a_forged_allocation_can_only_name_devices_of_this_node(tmp_path: Path) -> None:
    state = make_state(tmp_path)
    assert prepare(state, [share("gpu-0", "4Gi")]).error == ""

    def retarget(claims: dict[str, Any]) -> None:
        claims[UID]["allocation"]["devices"]["results"][0]["device"] = "../../../../etc"

    _forge(state.state_dir, retarget)
    spec_path(state.cdi_dir, UID).unlink()
    restarted = make_state(tmp_path)
    report = restarted.recover()
    assert "../../../../etc" in report.failed[UID]  # refused, named; nothing written for it
    assert claim_spec_uids(restarted.cdi_dir) == []


@pytest.mark.parametrize("how", ["owner", "mode"])
def test_a_checkpoint_someone_else_can_write_is_moved_aside(tmp_path: Path, how: str) -> None:
    if how == "owner" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    state = make_state(tmp_path)
    assert prepare(state, [share("gpu-0", "4Gi")]).error == ""
    path = state.state_dir / FILE_NAME
    if how == "owner":
        os.chown(path, OTHER_UID, OTHER_UID)
    else:
        os.chmod(path, 0o666)
    restarted = make_state(tmp_path)
    report = restarted.recover()
    assert restarted.prepared_claims() == {}
    assert list(state.state_dir.glob(f"{FILE_NAME}.corrupt-*"))
    # an untrusted checkpoint is no checkpoint: the node cleans up, kubelet prepares again
    assert report.orphan_specs_removed == [UID]
    assert simulated_mps(restarted).daemons() == {}
    assert prepare(restarted, [share("gpu-0", "4Gi")]).error == ""


@pytest.mark.parametrize(("which", "how"), [("state", "mode"), ("cdi", "mode"), ("state", "owner"), ("cdi", "owner")])
def test_state_and_cdi_dirs_others_can_write_are_refused_with_the_fix(tmp_path: Path, which: str, how: str) -> None:
    if how == "owner" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    directory = tmp_path / which
    directory.mkdir()
    if how == "owner":
        os.chown(directory, OTHER_UID, OTHER_UID)
    else:
        os.chmod(directory, 0o777)
    with pytest.raises(UnsafeDirectoryError) as err:
        make_state(tmp_path)
    message = str(err.value)
    assert f"--{which}-dir {directory}" in message
    assert f"uid {OTHER_UID}" in message if how == "owner" else "mode 0777" in message
    assert f"chown {os.geteuid()} {directory} && chmod go-w {directory}" in message
    assert not (tmp_path / "state" / FILE_NAME).exists()


def test_new_dirs_are_created_private_whatever_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0)
    try:
        state = make_state(tmp_path)
    finally:
        os.umask(previous)
    for d in (state.state_dir, state.cdi_dir):
        assert d.stat().st_mode & 0o777 == 0o755


def test_the_plugin_refuses_to_start_on_an_unsafe_state_dir(tmp_path: Path) -> None:
    from kubeletplugin.plugin import PluginConfig, run_plugin
    from tests.fakes.apiserver import FakeKubeAPI

    (tmp_path / "state").mkdir(mode=0o777)
    os.chmod(tmp_path / "state", 0o777)
    config = PluginConfig(node_name="node-a", kubelet_dir=tmp_path / "k", cdi_dir=tmp_path / "cdi",
                          state_dir=tmp_path / "state", simulate="mixed", metrics_addr="127.0.0.1:0")  # fmt: skip
    assert run_plugin(config, api=FakeKubeAPI()) == 1
    assert CheckpointStore(tmp_path / "state").load() == {}
