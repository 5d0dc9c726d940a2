"""One booking rule (kube-scheduler's) for what allocated claims hold, whoever asks: the memory metrics,
`tessera status` and `tessera explain` agree, and an adminAccess result holds nothing in any of them."""

from __future__ import annotations

from fractions import Fraction

import pytest

from controller.cluster.booking import Booking, bookings
from controller.cluster.memoryusage import memory_usage
from controller.explain.explain import ClusterView
from controller.explain.status import cluster_status
from tests.fakes.cluster import FakeCluster, exactly

GiB = 1 << 30


def result(device: str, **extra: object) -> dict:
    return {"request": "gpu", "driver": "gpu.tessera.dev", "pool": "node-a", "device": device, **extra}


def claim(*results: dict) -> dict:
    return {"metadata": {"name": "c", "namespace": "default"},
            "status": {"allocation": {"devices": {"results": list(results)}}}}


def test_admin_access_and_other_drivers_hold_nothing() -> None:
    held = list(bookings(claim(result("gpu-0", adminAccess=True), result("gpu-1"),
                               {**result("nic-0"), "driver": "nic.example.com"})))
    assert [b.key for b in held] == [("gpu.tessera.dev", "node-a", "gpu-1")]


def test_a_share_holds_its_consumed_memory_and_anything_else_the_whole_device() -> None:
    share = Booking(("gpu.tessera.dev", "node-a", "gpu-0"), "gpu", "id", {"memory": Fraction(4 * GiB)})
    whole = Booking(("gpu.tessera.dev", "node-a", "gpu-1"), "gpu")
    assert share.memory(40 * GiB) == 4 * GiB
    assert whole.memory(40 * GiB) == 40 * GiB


@pytest.fixture
def cluster() -> FakeCluster:
    """node-a (4x A100 40GB): a 10Gi share on gpu-0, and a monitoring claim with adminAccess on gpu-1."""
    c = FakeCluster()
    c.publish("node-a", "a100-pcie-4")
    c.run_pod("share", "share", ("node-a", "gpu-0"), memory="10Gi")
    c.claim("monitor", exactly())
    allocated = c.allocate("monitor", ("node-a", "gpu-1"), pod="monitor")
    allocated["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    return c


def test_metrics_status_and_explain_book_the_same_memory(cluster: FakeCluster) -> None:
    r = cluster.reader()
    view = ClusterView(r.resource_slices(), {}, r.resource_claims())
    metrics = memory_usage(view.index, r.resource_claims())["node-a"]
    status = cluster_status(view)
    held_in_status = sum(g.allocated for n in status.nodes for g in n.gpus)
    held_in_explain = sum(view.state.used_memory(d) for d in view.index.devices)
    assert metrics.allocated == held_in_status == held_in_explain == 10 * GiB
    gpu_1 = next(g for g in status.nodes[0].gpus if g.name == "gpu-1")
    assert gpu_1.segments == [] and gpu_1.free == 40 * GiB
