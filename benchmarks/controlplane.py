"""One real control plane (e2e.cluster: etcd, kube-apiserver, scheduler, claim controller) shared by the
benchmarks that need an apiserver, plus the object helpers they have in common."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from e2e.cluster import ControlPlane, create_fake_node, harness_path
from e2e.kube import Kube, load_manifests

REPO = Path(__file__).resolve().parent.parent
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@contextlib.contextmanager
def control_plane() -> Iterator[ControlPlane]:
    """A started control plane in a temp dir, with tessera's DeviceClasses applied; stopped afterwards."""
    work = Path(tempfile.mkdtemp(prefix="tessera-bench-cp-"))
    plane = ControlPlane(work, harness_path())
    try:
        kube = plane.start()
        for obj in load_manifests(REPO / "deviceclasses"):
            if obj.get("kind") == "DeviceClass":
                kube.apply(obj)
        yield plane
    finally:
        plane.stop()
        shutil.rmtree(work, ignore_errors=True)


def kube_of(plane: ControlPlane) -> Kube:
    if plane.kube is None:
        raise RuntimeError("control plane not started")
    return plane.kube


def ensure_namespace(kube: Kube, name: str) -> None:
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def fake_node(kube: Kube, name: str) -> None:
    create_fake_node(kube, name)


def node_slices(kube: Kube, node: str) -> list[dict[str, object]]:
    return kube.list("ResourceSlice", field_selector=f"spec.nodeName={node}")


def wipe_node(kube: Kube, node: str) -> None:
    """What kubelet does when it starts or a plugin goes away: delete the node's slices, all at once."""
    kube.request("DELETE", SLICES, params={"fieldSelector": f"spec.nodeName={node}"})


def wait_count(kube: Kube, node: str, count: int, timeout: float = 60.0, interval: float = 0.005) -> float:
    """Poll until the node has exactly `count` slices; the perf_counter time it was first seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(node_slices(kube, node)) == count:
            return time.perf_counter()
        time.sleep(interval)
    raise TimeoutError(f"node {node} did not reach {count} ResourceSlices within {timeout:.0f} s")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"
