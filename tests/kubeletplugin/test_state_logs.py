"""The log events of the node agent's claim state that operators search for, with their fields.

One row per event: a scenario that reaches it, and the fields the event must carry (the claim, the
GPU, the error). An event renamed or a field dropped breaks the searches and alerts built on them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import structlog

from driver.cdi import spec_path
from kubeletplugin.mps import MpsError
from kubeletplugin.state import DeviceState
from kubeletplugin.timeslicing import SimulatedTimeSlicer, TimeSliceError
from tests.builders.claims import UID, gpu_config, inventory, result, share
from tests.builders.state import Crash, crash_at, make_state, prepare, ref

Scenario = Callable[[Path, pytest.MonkeyPatch], None]


def _restore_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = make_state(tmp_path)
    assert not prepare(state, [result("gpu-0")]).error
    entry = state.store.get(UID)
    assert entry is not None
    state.store.put(dataclasses.replace(entry, allocation=None))
    make_state(tmp_path).recover()


def _interval_reset_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slicer = SimulatedTimeSlicer(tmp_path / "state")
    state = make_state(tmp_path, timeslicer=slicer)
    config = [gpu_config(strategy="TimeSlicing", timeSlicing={"interval": "Long"})]
    assert not prepare(state, [result("gpu-3")], config).error

    def refuse(gpu_uuid: str, interval: str) -> None:
        raise TimeSliceError("nvidia-smi exited with 4")

    monkeypatch.setattr(slicer, "set_interval", refuse)
    state.unprepare(ref())


def _rolled_back_at_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(Crash):
        prepare(make_state(tmp_path, hook=crash_at("after-cdi-write")), [result("gpu-0")])
    make_state(tmp_path).recover()


def _claims_recovered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = make_state(tmp_path)
    assert not prepare(state, [result("gpu-0")]).error
    spec_path(state.cdi_dir, UID).unlink()
    make_state(tmp_path).recover_claims()


def _rollback_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, record_fails: bool = False) -> None:
    def fail_after_start(step: str) -> None:
        if step == "after-mps-start":
            raise MpsError("injected after the daemon started")

    def refuse(*args: Any) -> None:
        raise MpsError("quit timed out")

    state = make_state(tmp_path, hook=fail_after_start)
    monkeypatch.setattr(state.mps, "stop", refuse)
    if record_fails:
        monkeypatch.setattr(state.store, "put", refuse)
    assert prepare(state, [share("gpu-1", "8Gi")]).error


def _record_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _rollback_fails(tmp_path, monkeypatch, record_fails=True)


def _interval_without_slicer(interval: str) -> Scenario:
    def scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        config = [gpu_config(strategy="TimeSlicing", timeSlicing={"interval": interval})]
        assert not prepare(make_state(tmp_path), [result("gpu-0")], config).error

    return scenario


GPU3 = inventory().gpu_by_index(3).uuid
NOT_APPLIED = "time-slice interval not applied: no time slicer configured"

# (scenario, event, the fields it must carry; None: the event must not be logged)
ROWS: list[Any] = [
    pytest.param(
        _restore_fails, "recovery of a claim failed", {"log_level": "error", "claim_uid": UID}, id="restore-failed"
    ),
    pytest.param(
        _interval_reset_fails,
        "cannot reset the time-slice interval",
        {"log_level": "error", "claim_uid": UID, "gpu_uuid": GPU3, "error": "nvidia-smi exited with 4"},
        id="interval-reset-failed",
    ),
    pytest.param(
        _rolled_back_at_start, "recovery done", {"log_level": "info", "rolled_back": [UID]}, id="recovery-done"
    ),
    pytest.param(
        _claims_recovered, "claims recovered", {"log_level": "info", "specs_rewritten": [UID]}, id="claims-recovered"
    ),
    pytest.param(
        _rollback_fails,
        "rollback of a failed prepare failed",
        {"log_level": "error", "claim_uid": UID},
        id="rollback-failed",
    ),
    pytest.param(
        _record_fails,
        "cannot record the failed prepare's progress",
        {"log_level": "error", "claim_uid": UID},
        id="progress-not-recorded",
    ),
    pytest.param(
        _interval_without_slicer("Long"), NOT_APPLIED, {"log_level": "warning", "claim_uid": UID}, id="not-applied"
    ),
    pytest.param(_interval_without_slicer("Default"), NOT_APPLIED, None, id="default-needs-no-slicer"),
]


@pytest.mark.parametrize(("scenario", "event", "fields"), ROWS)
def test_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scenario: Scenario, event: str, fields: dict[str, Any] | None
) -> None:
    with structlog.testing.capture_logs() as logs:
        scenario(tmp_path, monkeypatch)
    found = [e for e in logs if e["event"] == event]
    if fields is None:
        assert found == []
        return
    assert len(found) == 1, [e["event"] for e in logs]
    assert {k: found[0].get(k) for k in fields} == fields


def test_recovery_done_carries_only_what_happened(tmp_path: Path) -> None:
    """The summary lists the non-empty parts of the report, so one line says what recovery did."""
    with pytest.raises(Crash):
        prepare(make_state(tmp_path, hook=crash_at("after-cdi-write")), [result("gpu-0")])
    state: DeviceState = make_state(tmp_path)
    with structlog.testing.capture_logs() as logs:
        state.recover()
    (done,) = [e for e in logs if e["event"] == "recovery done"]
    assert {k: v for k, v in done.items() if k not in ("event", "log_level")} == {"rolled_back": [UID]}
