"""One real control plane (e2e.cluster: etcd, kube-apiserver, scheduler, claim controller) shared by the
benchmarks that need an apiserver, plus the object helpers they have in common."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import ControlPlane, create_fake_node, harness_path
from e2e.kube import Kube, load_manifests
from e2e.processes import ManagedProcess

REPO = Path(__file__).resolve().parent.parent
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@dataclass
class TunedControlPlane(ControlPlane):
    """The e2e control plane with the scheduler's and controller-manager's client rate limits raised.

    Their defaults (scheduler 50 QPS, controller-manager 20 QPS) cap DRA scheduling at about 10 pods/s
    (each pod costs the claim controller a claim create and a pod status write); upstream's
    scheduler_perf runs without such limits, so its figures compare with this one.
    """

    client_qps: int = 5000
    # components whose Go runtime logs each GC cycle (GODEBUG=gctrace=1) to their log, for attribution
    gc_trace: tuple[str, ...] = ()

    def _start(self, name: str, argv: list[str], *args: Any, **kwargs: Any) -> ManagedProcess:
        if name in self.gc_trace:
            kwargs["env"] = {**(kwargs.get("env") or {}), "GODEBUG": "gctrace=1"}
        if name == "controller-manager":
            argv = [*argv, f"--kube-api-qps={self.client_qps}", f"--kube-api-burst={self.client_qps}"]
        if name == "scheduler":
            config = Path(next(a for a in argv if a.startswith("--config=")).split("=", 1)[1])
            data = yaml.safe_load(config.read_text())
            data["clientConnection"].update(qps=self.client_qps, burst=self.client_qps)
            config.write_text(yaml.safe_dump(data))
        return super()._start(name, argv, *args, **kwargs)


@contextlib.contextmanager
def control_plane(*, client_qps: int | None = None) -> Iterator[ControlPlane]:
    """A started control plane in a temp dir, with tessera's DeviceClasses applied; stopped afterwards.

    `client_qps` raises the scheduler's and controller-manager's client rate limits (TunedControlPlane).
    """
    work = Path(tempfile.mkdtemp(prefix="tessera-bench-cp-"))
    plane = ControlPlane(work, harness_path()) if client_qps is None else \
        TunedControlPlane(work, harness_path(), client_qps=client_qps)
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
