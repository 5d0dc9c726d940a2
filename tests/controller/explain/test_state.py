"""AllocatedState.fits_counters: the fast yes/no `tessera status` asks of every free MIG placement must agree
with counter_shortfalls, the full check explain reports from, in every case the slices can present."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from controller.explain.explain import ClusterView
from tests.fakes.cluster import FakeCluster

Obj = dict[str, Any]


def mig_cluster() -> FakeCluster:
    c = FakeCluster()
    c.publish("node-m", "e2e/profiles/one-h100-mig.yaml", "dynamic")
    c.publish("node-n", "e2e/profiles/one-h100-mig.yaml", "dynamic")
    c.run_pod("m", "m", ("node-m", "gpu-0-mig-3g40gb-0"))
    c.run_pod("m1", "m1", ("node-m", "gpu-0-mig-1g10gb-6"))
    return c


def devices_of(slices: list[Obj], node: str) -> list[Obj]:
    return [d for s in slices if s["spec"].get("nodeName") == node for d in s["spec"].get("devices") or ()]


def shared_counters(slices: list[Obj], node: str) -> list[Obj]:
    return [c for s in slices if s["spec"].get("nodeName") == node for c in s["spec"].get("sharedCounters") or ()]


def overdrawn(slices: list[Obj]) -> None:
    """node-m's card has no memory slice 0, which its allocated 3g.40gb holds: every placement there fails, even
    those that use none of slice 0 (the scheduler checks every counter of the pool)."""
    for counter_set in shared_counters(slices, "node-m"):
        counter_set["counters"]["memory-slice-0"]["value"] = "0"


def two_entries(slices: list[Obj]) -> None:
    """A device lists its counter set twice: the amounts add up (node-n's free 4g.40gb no longer fits)."""
    for device in devices_of(slices, "node-n"):
        if device["name"].startswith("gpu-0-mig-4g40gb"):
            device["consumesCounters"] = device["consumesCounters"] * 2


def unknown_set(slices: list[Obj]) -> None:
    """Counters of a set the pool does not publish are not checked (counter_shortfalls skips them)."""
    for device in devices_of(slices, "node-n")[:3]:
        device["consumesCounters"][0]["counterSet"] = "no-such-set"


def too_big(slices: list[Obj]) -> None:
    """A device that alone needs more than its card has, and counters the set does not hold."""
    for device in devices_of(slices, "node-n"):
        if device["name"].startswith("gpu-0-mig-7g"):
            device["consumesCounters"][0]["counters"]["compute-slices"]["value"] = "8"
        if device["name"].startswith("gpu-0-mig-1g10gb"):
            device["consumesCounters"][0]["counters"]["not-published"] = {"value": "1000"}


def fractional(slices: list[Obj]) -> None:
    """Counter values that are not whole numbers."""
    for counter_set in shared_counters(slices, "node-n"):
        counter_set["counters"]["compute-slices"]["value"] = "1500m"


def view_after(change: Any) -> ClusterView:
    """mig_cluster's view, its slices changed by `change` first (None: as published)."""
    r = mig_cluster().reader()
    slices = copy.deepcopy(r.resource_slices())
    if change is not None:
        change(slices)
    return ClusterView(slices, {}, r.resource_claims())


@pytest.mark.parametrize("change", [None, overdrawn, two_entries, unknown_set, too_big, fractional])
def test_fits_counters_agrees_with_counter_shortfalls(change: Any) -> None:
    view = view_after(change)
    verdicts = {d.ref: (view.state.fits_counters(d), not view.state.counter_shortfalls(d)) for d in view.index.devices}
    assert verdicts and all(fast == full for fast, full in verdicts.values()), \
        {ref: v for ref, v in verdicts.items() if v[0] != v[1]}
    # every case decides both ways somewhere, or the comparison above proves little
    assert {fast for fast, _ in verdicts.values()} == {True, False}


def test_what_the_cases_change_shows_in_the_verdicts() -> None:
    def fits(change: Any) -> dict[str, bool]:
        view = view_after(change)
        return {d.ref: view.state.fits_counters(d) for d in view.index.devices}

    before = fits(None)
    assert before["node-n/gpu-0-mig-4g40gb-0"] and before["node-n/gpu-0-mig-7g80gb-0"]
    assert before["node-m/gpu-0-mig-1g10gb-4"] and not before["node-m/gpu-0-mig-1g10gb-0"]
    assert not fits(overdrawn)["node-m/gpu-0-mig-1g10gb-4"]
    assert not fits(two_entries)["node-n/gpu-0-mig-4g40gb-0"]
    assert not fits(too_big)["node-n/gpu-0-mig-7g80gb-0"]
    assert fits(too_big)["node-n/gpu-0-mig-1g10gb-0"]
