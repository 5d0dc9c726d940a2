"""Slice publishing: Publisher start until every slice is accepted, and a kubelet-style wipe until
all are back, for the whole-GPU DGX H100, its dynamic-MIG slice set and the 16-GPU MIG node.

Against a real kube-apiserver (benchmarks.controlplane) and, as the reference that isolates
tessera's own cost, against the in-memory apiserver of tests.fakes.apiserver.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from benchmarks import controlplane
from benchmarks.stats import Summary, summarize, table
from driver.discovery import load_inventory
from driver.kubeapi import KubeAPI
from driver.slices import build_slices
from kubeletplugin.publisher import Publisher
from tests.fakes.apiserver import FakeKubeAPI

if TYPE_CHECKING:
    from e2e.cluster import ControlPlane

CASES = (
    ("dgx-h100-8 whole GPU", "dgx-h100-8", "static"),
    ("dgx-h100-8 dynamic MIG", "dgx-h100-8", "dynamic"),
    ("h100-16-mig dynamic MIG", "h100-16-mig", "dynamic"),
)
TARGET_S = 1.0


@dataclass(frozen=True)
class PublishResult:
    case: str
    api_kind: str
    slices: int
    devices: int
    start_ms: float
    republish: Summary


@dataclass(frozen=True)
class Backend:
    """How one apiserver flavour adds a node, wipes its slices and counts them."""

    name: str
    api: KubeAPI
    add_node: Callable[[str], None]
    wipe: Callable[[str], None]
    wait_count: Callable[[str, int], float]


def memory_backend() -> Backend:
    api = FakeKubeAPI(record_calls=False)

    def wait(node: str, count: int) -> float:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if sum(s["spec"].get("nodeName") == node for s in api.slices.values()) == count:
                return time.perf_counter()
            time.sleep(0.001)
        raise TimeoutError(f"node {node} did not get its {count} slices back")

    def add(node: str) -> None:
        api.add_node(node)

    def wipe(node: str) -> None:
        api.wipe_node(node)

    return Backend("in-memory apiserver", api, add, wipe, wait)


def real_backend(plane: ControlPlane) -> Backend:
    from driver.kubeapi import RealKubeAPI

    kube = controlplane.kube_of(plane)
    return Backend("kube-apiserver", RealKubeAPI(str(plane.kubeconfig)),
                   lambda n: controlplane.fake_node(kube, n), lambda n: controlplane.wipe_node(kube, n),
                   lambda n, c: controlplane.wait_count(kube, n, c))


def measure(backend: Backend, case: tuple[str, str, str], node: str, wipes: int) -> PublishResult:
    name, profile, strategy = case
    backend.add_node(node)
    slices = build_slices(load_inventory(node, simulate=profile), mig_strategy=strategy)
    devices = sum(len(s["spec"].get("devices", [])) for s in slices)
    publisher = Publisher(backend.api, node, slices)
    t0 = time.perf_counter()
    publisher.start()
    try:
        if not publisher.wait_synced(60):
            raise TimeoutError(f"{name}: publisher did not sync within 60 s: {publisher.last_error}")
        start_ms = (time.perf_counter() - t0) * 1000
        backend.wait_count(node, len(slices))
        samples = []
        for _ in range(wipes):
            time.sleep(0.3)  # let the watch settle, as between two kubelet restarts
            t1 = time.perf_counter()
            backend.wipe(node)
            seen = backend.wait_count(node, len(slices))
            samples.append((seen - t1) * 1000)
    finally:
        publisher.stop(cleanup=True)
    return PublishResult(name, backend.name, len(slices), devices, start_ms, summarize(samples))


def run(backend: Backend, wipes: int, node_prefix: str = "pub") -> list[PublishResult]:
    return [measure(backend, case, f"{node_prefix}-{i}", wipes) for i, case in enumerate(CASES)]


def render(results: list[PublishResult]) -> str:
    rows = [[r.case, r.api_kind, r.slices, r.devices, f"{r.start_ms:.0f}", f"{r.republish.p50:.0f}",
             f"{r.republish.max:.0f}", f"{max(r.start_ms, r.republish.max) / 1000 / TARGET_S:.2f}"]
            for r in results]
    title = "ResourceSlice publishing (Publisher start -> all accepted; kubelet-style wipe -> all republished)"
    return title + "\n" + table(
        ["node", "apiserver", "slices", "devices", "start -> synced ms", "wipe -> back p50 ms", "wipe -> back max ms",
         "worst / 1 s target"], rows)


def main() -> None:
    print(render(run(memory_backend(), wipes=5)))


if __name__ == "__main__":
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    main()
