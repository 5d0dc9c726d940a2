"""Scheduling through tessera's slices: pods per second bound by the real kube-scheduler.

50 fake DGX H100 nodes (400 GPUs) get the ResourceSlices tessera would publish for them
(build_slices, created directly: no plugins are needed to schedule). Pods use a
ResourceClaimTemplate, as the upstream scheduler_perf DRA scenarios do, so the ResourceClaim
controller creates each pod's claim and the scheduler allocates it: once with one whole GPU per
pod, once with a 10Gi memory share (consumable capacity) per pod. The figure is pods bound per
second from the first pod created to the last one bound.

Upstream context (kubernetes scheduler_perf, test driver with 10 devices per node, one device per
claim, 500 nodes): 40-80 pods/s, from kubernetes test/integration/scheduler_perf/dra/performance-config.yaml.
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from benchmarks import controlplane
from benchmarks.stats import table
from driver.discovery import load_inventory
from driver.slices import build_slices

if TYPE_CHECKING:
    from e2e.kube import Kube

NAMESPACE = "bench-sched"
NODES = 50
UPSTREAM = "40-80 pods/s (scheduler_perf, 500 nodes x 10 devices)"
CASES = {
    "1 whole GPU per pod": {"deviceClassName": "gpu.tessera.dev", "allocationMode": "ExactCount", "count": 1},
    "10Gi share per pod": {"deviceClassName": "shared.gpu.tessera.dev", "allocationMode": "ExactCount", "count": 1,
                           "capacity": {"requests": {"memory": "10Gi"}}},
}


@dataclass(frozen=True)
class SchedulingResult:
    case: str
    limits: str
    nodes: int
    gpus: int
    pods: int
    seconds: float
    create_seconds: float

    @property
    def pods_per_second(self) -> float:
        return self.pods / self.seconds


def publish_nodes(kube: Kube, count: int) -> int:
    """Fake nodes with their slices; returns the number of GPUs published."""
    gpus = 0
    for n in range(count):
        node = f"sched-{n:03d}"
        controlplane.fake_node(kube, node)
        inventory = load_inventory(node, simulate="dgx-h100-8")
        gpus += len(inventory.gpus)
        for s in build_slices(inventory, mig_strategy="static"):
            kube.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                         "metadata": {**s.get("metadata", {}), "generateName": f"{node}-gpu.tessera.dev-"},
                         "spec": s["spec"]})
    return gpus


def _pod(name: str, template: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": {
        "containers": [{"name": "cuda", "image": "registry.example/cuda:12",
                        "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
        "terminationGracePeriodSeconds": 0,
    }}


def _bound(kube: Kube) -> int:
    return sum(bool(p["spec"].get("nodeName")) for p in kube.list("Pod", NAMESPACE))


def _clean(kube: Kube, timeout: float = 120.0) -> None:
    """Delete the pods at once (no kubelet will); the garbage collector then removes their claims."""
    kube.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods", {"gracePeriodSeconds": 0})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not kube.list("Pod", NAMESPACE) and not kube.list("ResourceClaim", NAMESPACE):
            return
        time.sleep(0.5)
    raise TimeoutError(f"pods or claims of {NAMESPACE} still there after {timeout:.0f} s")


def measure(kube: Kube, case: str, pods: int, *, gpus: int, nodes: int, limits: str,
            timeout: float = 300.0) -> SchedulingResult:
    template = f"t-{abs(hash(case)) % 10_000}"
    kube.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": template, "namespace": NAMESPACE},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": CASES[case]}]}}}})
    names = [f"p-{i:04d}" for i in range(pods)]
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda n: kube.create(_pod(n, template)), names))
    created = time.perf_counter()
    deadline = time.monotonic() + timeout
    while _bound(kube) < pods:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{case}: only {_bound(kube)} of {pods} pods bound after {timeout:.0f} s")
        time.sleep(0.1)
    seconds = time.perf_counter() - start
    _clean(kube)
    return SchedulingResult(case, limits, nodes, gpus, pods, seconds, created - start)


def run(kube: Kube, pods: int, nodes: int = NODES, limits: str = "default") -> list[SchedulingResult]:
    controlplane.ensure_namespace(kube, NAMESPACE)
    gpus = publish_nodes(kube, nodes)
    return [measure(kube, case, pods, gpus=gpus, nodes=nodes, limits=limits) for case in CASES]


def render(results: list[SchedulingResult]) -> str:
    rows = [[r.case, r.limits, r.nodes, r.gpus, r.pods, f"{r.create_seconds:.1f}", f"{r.seconds:.1f}",
             f"{r.pods_per_second:.1f}", UPSTREAM] for r in results]
    return "Scheduling with tessera's slices (real kube-scheduler, ResourceClaimTemplate per pod)\n" + table(
        ["case", "client QPS limits", "nodes", "GPUs", "pods created", "create s", "create -> all bound s", "pods/s",
                  "upstream reference"], rows)
