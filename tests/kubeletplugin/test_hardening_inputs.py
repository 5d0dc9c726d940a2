"""Smaller hardening of the node agent and the CLI (issue 12, item 6), one test per defect.

- a deeply nested checkpoint is moved aside like any corrupt one, instead of a RecursionError that
  kept the agent from starting;
- names are matched to the end of the string: `$` accepted a trailing newline, so `abc\\n` passed
  as a claim UID and `gpu-2\\n` as a device;
- the per-claim lock table holds only claims in flight (it grew by one entry per UID ever seen);
- `tessera check` refuses an alias bomb, an alias cycle, deep nesting and oversized files with an
  error naming the file and the limit, instead of eating gigabytes.
"""

from __future__ import annotations

import hashlib
import io
import json
import threading
import time
from pathlib import Path

import pytest

from driver import safeyaml
from driver.allocation import AllocationError, resolve_device
from driver.cdi import CdiError, check_claim_uid, device_name
from driver.grammars import is_c_identifier, is_dns_label, is_dns_subdomain
from driver.semver import Version
from kubeletplugin.checkpoint import MAX_DEPTH, CheckpointError, canonical, decode
from kubeletplugin.checkpointstore import FILE_NAME
from kubeletplugin.kubeletclaims import ClaimRef
from tessera.cmd_check import check_files
from tests.builders.claims import UID, inventory, result, share
from tests.builders.state import make_state, prepare

# -- deeply nested checkpoints ----------------------------------------------------------------------


def _checkpoint(claims: object) -> bytes:
    checksum = "sha256:" + hashlib.sha256(canonical(claims)).hexdigest()  # type: ignore[arg-type]
    return json.dumps({"version": 1, "checksum": checksum, "claims": claims}).encode()


def test_a_checkpoint_too_deep_for_the_parser_is_moved_aside_and_the_agent_starts(tmp_path: Path) -> None:
    state = make_state(tmp_path)
    assert prepare(state, [result("gpu-0")]).error == ""
    deep = b'{"version": 1, "checksum": "x", "claims": {"a": ' + b"[" * 200_000 + b"]" * 200_000 + b"}}"
    (state.state_dir / FILE_NAME).write_bytes(deep)
    restarted = make_state(tmp_path)
    report = restarted.recover()  # used to raise RecursionError here
    assert restarted.prepared_claims() == {}
    assert len(list(restarted.state_dir.glob(f"{FILE_NAME}.corrupt-*"))) == 1
    assert report.orphan_specs_removed == [UID]
    assert prepare(restarted, [result("gpu-0")]).error == ""


def test_a_valid_checkpoint_nested_past_the_limit_is_refused(tmp_path: Path) -> None:
    state = make_state(tmp_path)
    assert prepare(state, [result("gpu-0")]).error == ""
    claims = json.loads((state.state_dir / FILE_NAME).read_bytes())["claims"]
    nested: object = "x"
    for _ in range(MAX_DEPTH - 3):  # under the document, claims, the entry and its allocation: one too many
        nested = [nested]
    claims[UID]["allocation"]["extra"] = nested  # parses fine; deeper than anything tessera writes
    with pytest.raises(CheckpointError, match=f"nested deeper than {MAX_DEPTH} levels"):
        decode(_checkpoint(claims))
    claims[UID]["allocation"]["extra"] = nested[0]  # type: ignore[index]  # exactly at the limit: accepted
    assert UID in decode(_checkpoint(claims)).entries


# -- names matched to the end -----------------------------------------------------------------------


@pytest.mark.parametrize("uid", ["abc\n", f"{UID}\n"])
def test_a_claim_uid_with_a_trailing_newline_is_refused(tmp_path: Path, uid: str) -> None:
    with pytest.raises(CdiError, match="not a plain token"):
        check_claim_uid(uid)
    state = make_state(tmp_path)
    with pytest.raises(CdiError, match="not a plain token"):
        state.prepare(ClaimRef("team-a", "claim", uid), {})
    with pytest.raises(CdiError, match="not a plain token"):
        state.unprepare(ClaimRef("team-a", "claim", uid))
    assert list(state.cdi_dir.iterdir()) == []


@pytest.mark.parametrize("device", ["gpu-2\n", "gpu-1-mig-1g10gb-0\n"])
def test_a_device_name_with_a_trailing_newline_is_not_a_device(tmp_path: Path, device: str) -> None:
    with pytest.raises(AllocationError, match="not a tessera device name"):
        resolve_device(inventory("h100-16-mig"), device)
    state = make_state(tmp_path)
    got = prepare(state, [share(device, "4Gi")])
    assert "not a tessera device name" in got.error
    assert state.prepared_claims() == {}
    with pytest.raises(CdiError):
        device_name(UID, device)


@pytest.mark.parametrize("check", [is_dns_label, is_dns_subdomain, is_c_identifier])
def test_name_checks_refuse_a_trailing_newline(check: object) -> None:
    assert check("abc")  # type: ignore[operator]
    assert not check("abc\n")  # type: ignore[operator]


def test_semver_refuses_a_trailing_newline() -> None:
    assert Version.is_valid("1.2.3") and not Version.is_valid("1.2.3\n")


# -- the per-claim lock table -----------------------------------------------------------------------


@pytest.mark.slow
def test_unprepares_of_unknown_uids_leave_no_lock_behind(tmp_path: Path) -> None:
    state = make_state(tmp_path)
    for n in range(50_000):
        state.unprepare(ClaimRef("default", "gone", f"00000000-0000-4000-8000-{n:012d}"))
    assert state.locks.in_use() == {}


def test_a_claim_lock_lives_while_it_is_held_or_awaited_and_still_serializes(tmp_path: Path) -> None:
    state = make_state(tmp_path)
    ref = ClaimRef("team-a", "claim", UID)
    done = threading.Event()

    def unprepare() -> None:
        state.unprepare(ref)
        done.set()

    with state.locks.hold(UID):
        worker = threading.Thread(target=unprepare)
        worker.start()
        deadline = time.monotonic() + 10
        while state.locks.in_use().get(UID, 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert state.locks.in_use()[UID] == 2  # the unprepare waits for the same lock, not a new one
        assert not done.wait(0.05)
    worker.join(10)
    assert done.is_set()
    assert state.locks.in_use() == {}


# -- `tessera check` on hostile YAML ----------------------------------------------------------------


def _bomb(levels: int) -> str:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for n in range(1, levels):
        lines.append(f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]")
    # as opaque config parameters: the decoder's error quotes the value, which once expanded is 9**levels strings
    lines += ["apiVersion: resource.k8s.io/v1", "kind: ResourceClaim", "metadata: {name: bomb}",
              "spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.tessera.dev}}],",
              f"  config: [{{opaque: {{driver: gpu.tessera.dev, parameters: *l{levels - 1}}}}}]}}}}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def _check(path: Path) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = check_files([str(path)], slices=None, kubeconfig=None, out=out, err=err)
    return code, err.getvalue()


@pytest.mark.timeout(60)
def test_check_refuses_an_alias_bomb_naming_the_file_and_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb(9))  # 9**9 strings once expanded, from a 1 KiB file
    code, err = _check(path)
    assert code == 2
    assert str(path) in err and f"{safeyaml.MAX_ALIAS_EXPANSION:,} nodes" in err


@pytest.mark.timeout(60)
def test_check_refuses_a_bomb_just_over_the_limit_and_accepts_modest_aliases(tmp_path: Path) -> None:
    over = tmp_path / "over.yaml"
    over.write_text(_bomb(7))  # about 4.8 million nodes expanded: over the 1 million limit
    assert _check(over)[0] == 2
    fine = tmp_path / "fine.yaml"
    fine.write_text(_bomb(3))  # 729 strings: aliases are allowed, only their blow-up is not
    code, err = _check(fine)
    assert code == 1 and err == ""  # checked: the parameters are no GpuConfig


@pytest.mark.parametrize(
    ("text", "message"),
    [("a: &a [*a]\n", "cycle"), ("[" * 100_000 + "]" * 100_000, "nested too deeply")],
)
def test_check_refuses_alias_cycles_and_deep_nesting(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "hostile.yaml"
    path.write_text(text)
    code, err = _check(path)
    assert code == 2
    assert str(path) in err and message in err


def test_check_refuses_a_file_over_the_size_limit_without_reading_it_all(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("wb") as f:
        f.truncate(safeyaml.MAX_BYTES + 4096)  # sparse: costs no disk
    code, err = _check(path)
    assert code == 2
    assert str(path) in err and f"{safeyaml.MAX_BYTES:,}-byte limit" in err


def test_simulated_profiles_get_the_same_limits(tmp_path: Path) -> None:
    from driver.discovery import load_inventory
    from driver.errors import DiscoveryError

    path = tmp_path / "profile.yaml"
    path.write_text(_bomb(8))
    with pytest.raises(DiscoveryError, match="alias bomb"):
        load_inventory("node-a", simulate=str(path))
