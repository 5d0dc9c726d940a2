"""The saved GPU health conditions of an NVML node (`<state dir>/health-conditions.json`): a damaged or
planted file never stops the agent, and a surge rollout hands the conditions over (issue 24 items 1, 4).

NVML nodes are built here from the NVML stand-in (tests/fakes/nvml.py): discovery through it, the
plugin's NVML health source on it, everything else real (sockets, files, the publisher against the
apiserver stand-in).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from driver.health import EventClass
from kubeletplugin.healthmonitor import HealthMonitor
from kubeletplugin.plugin import HEALTH_CONDITIONS_FILE
from tests.builders.health import (
    T0,
    Harness,
    nvml_plugin,
    reset_pending,
    saved,
    stored_taints,
    taints_of,
    wait_until,
)
from tests.fakes.apiserver import FakeKubeAPI
from tests.fakes.nvml import dgx_h100_node

NODE = "node-a"
ECC = "gpu.tessera.dev/ecc-double-bit"


@pytest.fixture
def fake() -> Iterator[FakeKubeAPI]:
    api = FakeKubeAPI()
    api.add_node(NODE)
    yield api
    api.close_watches()


@pytest.fixture(autouse=True)
def quick_nvml_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("driver.nvmlevents.CHECK_INTERVAL_S", 0.1)


# -- a surge rollout keeps health (issue 24 item 4) ---------------------------------------------------


def test_the_instance_that_takes_over_publishes_and_keeps_the_conditions_the_old_one_saved(
        root: Path, fake: FakeKubeAPI) -> None:
    old_node, new_node = dgx_h100_node(), dgx_h100_node()
    old = nvml_plugin(root, fake, old_node, "old-pod")
    new = nvml_plugin(root, fake, new_node, "new-pod")
    try:
        old.start()
        assert old.publisher.wait_synced(30)
        new.start()  # a standby: the old pod publishes
        assert not new.leadership.leader
        # the error reaches the old instance only (it came before the new one registered its events)
        old_node.nvml.double_bit_ecc(3)
        reset_pending(new_node.nvml, 3)
        wait_until(lambda: stored_taints(fake).get("gpu-3") == [ECC], what="the old instance's ECC taint")
        assert saved(root) == {"3": ["ecc-double-bit"]}
        old.stop()
        wait_until(lambda: new.leadership.leader, what="the new instance to take over publishing")
        assert new.publisher.wait_synced(30)
        time.sleep(0.5)  # a few NVML checks of the new instance: the GPU still wants its reset
        assert stored_taints(fake) == {"gpu-3": [ECC]}
        # the new instance's own next save keeps what it took over
        new_node.nvml.pending_events.append((5, new_node.nvml.nvmlEventTypeXidCriticalError, 94))
        wait_until(lambda: "gpu-5" in stored_taints(fake), what="an XID taint from the new instance")
        assert saved(root) == {"3": ["ecc-double-bit"], "5": ["xid"]}
    finally:
        new.stop()
        old.stop()


def test_a_standby_instance_never_overwrites_what_the_publishing_one_saved(root: Path, fake: FakeKubeAPI) -> None:
    old_node, new_node = dgx_h100_node(), dgx_h100_node()
    old = nvml_plugin(root, fake, old_node, "old-pod")
    new = nvml_plugin(root, fake, new_node, "new-pod")
    try:
        old.start()
        new.start()
        old_node.nvml.double_bit_ecc(3)
        reset_pending(new_node.nvml, 3)
        wait_until(lambda: saved(root).get("3"), what="the old instance to save its ECC condition")
        new_node.nvml.pending_events.append((6, new_node.nvml.nvmlEventTypeXidCriticalError, 94))
        wait_until(lambda: new.health_monitor.active_conditions(6), what="the standby to see its own XID")
        assert saved(root) == {"3": ["ecc-double-bit"]}
    finally:
        new.stop()
        old.stop()


# -- saved content that cannot stop the agent (issue 24 item 1) ---------------------------------------


SAVED_GOOD = {"event": "gpu-lost", "value": "fallen-off-bus", "message": "lost", "since": T0}


@pytest.mark.parametrize(("content", "kept"), [
    (json.dumps({"0": [{**SAVED_GOOD, "since": 1.79e12}]}), {}),  # milliseconds: year 58877
    ('{"0": [{"event": "gpu-lost", "value": "x", "since": NaN}]}', {}),
    (json.dumps({"1": [SAVED_GOOD], "2": [{**SAVED_GOOD, "since": "yesterday"}]}), {"gpu-1-mig-1g10gb-6": 1}),
    ("{not json", {}),
    ("[" * 100_000, {}),
    ('{"0": [' + '{"event": "xid", "value": "94", "since": 1790000000}' + "]" + "x" * 100, {}),  # torn write
    ("\x00\xff\xfe binary", {}),
    ("[]", {}),
], ids=["milliseconds", "nan", "one-bad-entry", "not-json", "deep", "truncated", "binary", "wrong-type"])
def test_damaged_saved_conditions_are_moved_aside_and_the_good_entries_kept(
        tmp_path: Path, content: str, kept: dict[str, int]) -> None:
    state = tmp_path / HEALTH_CONDITIONS_FILE
    state.write_text(content, errors="surrogateescape")
    state.chmod(0o600)
    h = Harness()
    with structlog.testing.capture_logs() as logs:
        h.monitor = HealthMonitor(h.inventory, "static", h.board, h.published.append, state_file=state)
        h.monitor.refresh()
    assert {d: len(ts) for d, ts in taints_of(h.published[-1]).items() if d.startswith("gpu-1-mig-1g")} == kept
    [moved] = [e for e in logs if e["event"] == "saved GPU health conditions unusable; moved aside"]
    assert moved["path"] == str(state) and Path(moved["moved_to"]).read_text(errors="surrogateescape") == content
    assert moved["moved_to"].startswith(f"{state}.corrupt-")
    assert not state.exists()


def test_a_planted_saved_file_is_refused_by_owner_or_mode(tmp_path: Path) -> None:
    state = tmp_path / HEALTH_CONDITIONS_FILE
    state.write_text(json.dumps({"0": [SAVED_GOOD]}))
    state.chmod(0o666)
    h = Harness()
    with structlog.testing.capture_logs() as logs:
        h.monitor = HealthMonitor(h.inventory, "static", h.board, h.published.append, state_file=state)
    h.monitor.refresh()
    assert taints_of(h.published[-1]) == {}
    assert [e["reason"] for e in logs if e["event"].endswith("moved aside")] == ["mode 0666 lets others write it"]


def test_an_nvml_node_whose_saved_file_holds_a_millisecond_time_starts_and_publishes(
        root: Path, fake: FakeKubeAPI) -> None:
    (root / "state").mkdir(mode=0o755)
    good = {"event": "ecc-double-bit", "value": "double-bit", "message": "m", "since": T0}
    path = root / "state" / HEALTH_CONDITIONS_FILE
    path.write_text(json.dumps({"2": [good], "4": [{**good, "since": 1.79e12}]}))
    path.chmod(0o600)
    node = dgx_h100_node()
    reset_pending(node.nvml, 2)
    plugin = nvml_plugin(root, fake, node)
    try:
        plugin.start()  # before the fix: ValueError "year 58877 is out of range" out of start()
        assert plugin.publisher.wait_synced(30)
        assert stored_taints(fake) == {"gpu-2": [ECC]}
        assert saved(root) == {"2": ["ecc-double-bit"]}  # the good entry written back, the bad one gone
        assert [p.name.split(".corrupt-")[0] for p in (root / "state").glob("*.corrupt-*")] == [HEALTH_CONDITIONS_FILE]
    finally:
        plugin.stop()


def test_a_damaged_file_that_cannot_be_moved_aside_is_ignored_with_a_message(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / HEALTH_CONDITIONS_FILE
    state.write_text("{not json")
    state.chmod(0o600)

    def read_only(src: Any, dst: Any) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(os, "rename", read_only)
    h = Harness()
    with structlog.testing.capture_logs() as logs:
        h.monitor = HealthMonitor(h.inventory, "static", h.board, h.published.append, state_file=state)
    h.monitor.refresh()
    assert taints_of(h.published[-1]) == {}
    [error] = [e for e in logs if e["event"].startswith("saved GPU health conditions unusable and cannot be moved")]
    assert error["path"] == str(state) and "Read-only file system" in error["error"]


def test_conditions_for_a_gpu_this_node_no_longer_has_are_kept_with_a_warning(tmp_path: Path) -> None:
    state = tmp_path / HEALTH_CONDITIONS_FILE
    state.write_text(json.dumps({"42": [SAVED_GOOD]}))
    state.chmod(0o600)
    h = Harness()
    with structlog.testing.capture_logs() as logs:
        h.monitor = HealthMonitor(h.inventory, "static", h.board, h.published.append, state_file=state)
    h.monitor.refresh()
    assert taints_of(h.published[-1]) == {}
    assert any(e["event"].startswith("saved GPU health conditions name a GPU") and e["gpu"] == 42 for e in logs)
    assert h.monitor.active_conditions(42) == {EventClass.GPU_LOST: "fallen-off-bus"}
