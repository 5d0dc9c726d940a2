"""A cluster without DRAConsumableCapacity/DRAPartitionableDevices (1.34/1.35 defaults): tessera still works."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.cluster import DRIVER, Cluster, NodeSpec, plugin_available
from e2e.kube import KubeError
from e2e.processes import wait_for
from e2e.workloads import claim_spec, claim_template, ensure_namespace, pod, request, slices_of, wait_running

NODE = "e2e-old-a100"


@pytest.fixture(scope="module")
def older(work_dir: Path) -> Iterator[Cluster]:
    reason = plugin_available()
    if reason:
        pytest.skip(reason)
    c = Cluster(work_dir / "older", [NodeSpec(NODE, "a100-pcie-4")], older_cluster=True, with_controller=False)
    try:
        c.start()
    except Exception:
        print(c.diagnostics(60))
        c.stop()
        raise
    yield c
    c.stop()


def test_slices_are_accepted_with_the_new_fields_dropped(older: Cluster) -> None:
    # the node agent publishes in its own thread once it is up; the cluster's start does not wait for that
    slices = wait_for(lambda: slices_of(older.kube, NODE), timeout=30,
                      what="tessera's slices on the older cluster (none published)")
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    assert {d["name"] for d in devices} >= {f"gpu-{i}" for i in range(4)}
    # The apiserver strips fields of disabled features: every GPU is then simply exclusive.
    assert not any(d.get("allowMultipleAllocations") for d in devices)


def test_whole_gpus_still_work(older: Cluster) -> None:
    kube = older.kube
    ensure_namespace(kube, "older")
    kube.create(claim_template("pair", "older", claim_spec(request(count=2), same_island=True)))
    kube.create(pod("pair", "older", template="pair", node=NODE))
    running = wait_running(kube, "older", "pair")
    assert sorted(running.devices) in (["gpu-0", "gpu-1"], ["gpu-2", "gpu-3"])
    assert all(r["driver"] == DRIVER and not r.get("shareID") for r in running.results)
    assert running.cdi_ids


def test_memory_share_requests_are_refused_or_become_whole_gpus(older: Cluster) -> None:
    """Without consumable capacity a capacity request cannot be honoured; it must never double-book a card."""
    kube = older.kube
    ensure_namespace(kube, "older-share")
    try:
        kube.create(claim_template("share", "older-share", claim_spec(request(memory="10Gi"))))
    except KubeError as exc:
        assert exc.status in (400, 422), exc
        return
    kube.create(pod("share", "older-share", template="share", node=NODE))
    running = wait_running(kube, "older-share", "share")
    assert not running.results[0].get("shareID")
