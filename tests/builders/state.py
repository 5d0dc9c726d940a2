"""A DeviceState over real files in a temporary folder, and the crash hooks, claims and readers its tests share."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]

from driver.cdi import read_spec
from kubeletplugin.devicesteps import DeviceSteps
from kubeletplugin.draservice import claim_failure
from kubeletplugin.kubeletclaims import ClaimRef, PrepareResult
from kubeletplugin.migmanager import SimulatedMigManager
from kubeletplugin.mps import SimulatedMpsControl
from kubeletplugin.state import DeviceState
from tests.builders.claims import UID, inventory, make_claim
from tests.paths import CDI_SCHEMA

UID2 = "0a9b8c7d-0000-4000-8000-000000000002"
SCHEMA = json.loads(CDI_SCHEMA.read_text())


class Crash(BaseException):
    """Stands in for the process dying at a step (BaseException: nothing in DeviceState catches it)."""


def crash_at(step: str):
    def hook(current: str) -> None:
        if current == step:
            raise Crash(step)

    return hook


def no_crash(step: str) -> None:
    del step


def make_steps(root: Path, profile: str = "dgx-h100-8", hook=no_crash, **kwargs) -> DeviceSteps:
    """The device steps of a simulated node whose state and CDI directories are under `root`."""
    state_dir = root / "state"
    return DeviceSteps(
        inventory(profile),
        root / "cdi",
        state_dir,
        kwargs.pop("mps", None) or SimulatedMpsControl(state_dir),
        kwargs.pop("mig", None) or SimulatedMigManager(state_dir),
        fault_hook=hook,
        **kwargs,
    )


def make_state(tmp_path: Path, profile: str = "dgx-h100-8", hook=no_crash, **kwargs) -> DeviceState:
    return DeviceState(make_steps(tmp_path, profile, hook, **kwargs), "node-a")


def ref(uid: str = UID, name: str = "claim") -> ClaimRef:
    return ClaimRef("team-a", name, uid)


def prepare(state: DeviceState, results, configs=None, uid: str = UID, name: str = "claim") -> PrepareResult:
    """DeviceState.prepare, a failure as the error text kubelet gets for it."""
    claim_ref = ref(uid, name)
    try:
        return state.prepare(claim_ref, make_claim(results, configs, uid=uid, name=name))
    except Exception as exc:
        return PrepareResult(error=claim_failure("prepare", claim_ref, exc).message)


def unprepare(state: DeviceState, claim_ref: ClaimRef) -> str:
    """DeviceState.unprepare as kubelet sees it: "" or the error text."""
    try:
        state.unprepare(claim_ref)
    except Exception as exc:
        return claim_failure("unprepare", claim_ref, exc).message
    return ""


def spec_of(state: DeviceState, uid: str = UID) -> dict[str, Any]:
    spec = read_spec(state.cdi_dir, uid)
    assert spec is not None
    jsonschema.Draft202012Validator(SCHEMA).validate(spec)
    return spec


def env_of(spec: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in spec["containerEdits"]["env"])


def device_env(spec: dict[str, Any], index: int) -> dict[str, str]:
    """The environment one CDI device of the spec adds."""
    return dict(e.split("=", 1) for e in spec["devices"][index]["containerEdits"].get("env", []))


def visible_of(spec: dict[str, Any]) -> str:
    """The GPU and MIG UUIDs the spec's devices list (TESSERA_DEVICES_*), in order, each once, comma-separated."""
    seen: list[str] = []
    for i in range(len(spec["devices"])):
        for key, value in device_env(spec, i).items():
            if key.startswith("TESSERA_DEVICES_"):
                seen += [v for v in value.split(",") if v not in seen]
    return ",".join(seen)


def simulated_mps(state: DeviceState) -> SimulatedMpsControl:
    assert isinstance(state.mps, SimulatedMpsControl)
    return state.mps
