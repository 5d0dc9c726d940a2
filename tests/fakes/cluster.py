"""The fake apiserver (tests.fakes.apiserver) with what `tessera explain` and `tessera status` read: nodes,
DeviceClasses, claims and templates, pods; plus helpers that write what the scheduler would (an
allocation with shares) so tests can set up a busy cluster. Unit tests only."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import yaml

from driver.discovery import load_inventory
from driver.names import slice_name
from driver.slices import build_slices
from tests.fakes.apiserver import FakeKubeAPI
from tests.paths import REPO

Obj = dict[str, Any]
DRIVER = "gpu.tessera.dev"


class FakeCluster(FakeKubeAPI):
    """Implements tessera.clusterread.ClusterReader's reads over the fake's objects."""

    def __init__(self) -> None:
        super().__init__()
        self.classes: dict[str, Obj] = {}
        self.pod_objects: dict[tuple[str, str], Obj] = {}
        self.template_objects: dict[tuple[str, str], Obj] = {}
        self.context_namespace = "default"
        self.nodes_readable = True

    # -- setup -------------------------------------------------------------------------------------
    def publish(self, node: str, profile: str, mig_strategy: str = "static") -> None:
        """The slices tessera's plugin publishes for a simulated node."""
        self.add_node(node)
        self.nodes[node]["metadata"]["labels"] = {"kubernetes.io/hostname": node}
        for i, s in enumerate(build_slices(load_inventory(node, simulate=profile), mig_strategy=mig_strategy)):
            s.setdefault("metadata", {})["name"] = slice_name(node, i)
            self.create_resource_slice(s)

    def shipped_classes(self) -> None:
        for path in sorted((REPO / "deviceclasses").glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc and doc.get("kind") == "DeviceClass":
                    self.classes[doc["metadata"]["name"]] = doc

    def add_class(self, name: str, *expressions: str) -> None:
        self.classes[name] = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
                              "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]}}

    def claim(self, name: str, *requests: Obj, namespace: str = "default", constraints: list[Obj] | None = None) -> Obj:
        devices: Obj = {"requests": list(requests)}
        if constraints:
            devices["constraints"] = constraints
        return self.add_claim({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                               "metadata": {"name": name, "namespace": namespace}, "spec": {"devices": devices}})

    def pod(self, name: str, *claims: str, namespace: str = "default", node_selector: dict[str, str] | None = None,
            phase: str = "Pending", message: str = "") -> Obj:
        spec: Obj = {"containers": [{"name": "c", "image": "x"}],
                     "resourceClaims": [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]}
        if node_selector:
            spec["nodeSelector"] = node_selector
        status: Obj = {"phase": phase}
        if message:
            status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                     "message": message}]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace,
                                                               "uid": str(uuid.uuid4())},
               "spec": spec, "status": status}
        self.pod_objects[(namespace, name)] = pod
        return pod

    def allocate(self, claim: str, *devices: tuple[str, str], memory: str | None = None, pod: str | None = None,
                 namespace: str = "default", request: str = "gpu") -> Obj:
        """Write status.allocation as the scheduler does for tessera's devices: a shareID and consumedCapacity on
        devices that allow multiple allocations (the whole memory when `memory` is None)."""
        obj = self.claims[(namespace, claim)]
        results = []
        for node, device in devices:
            spec = self._device(node, device)
            result: Obj = {"request": request, "driver": DRIVER, "pool": node, "device": device}
            if spec.get("allowMultipleAllocations"):
                result["shareID"] = str(uuid.uuid4())
                consumed = {}
                for key, cap in spec.get("capacity", {}).items():
                    policy = cap.get("requestPolicy") or {}
                    consumed[key] = (memory if key == "memory" and memory else
                                     policy.get("default", cap["value"]))
                result["consumedCapacity"] = consumed
            results.append(result)
        node = devices[0][0]
        obj["status"] = {"allocation": {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
        if pod:
            obj["status"]["reservedFor"] = [{"resource": "pods", "name": pod, "uid": str(uuid.uuid4())}]
        return obj

    def run_pod(self, name: str, claim: str, *devices: tuple[str, str], memory: str | None = None,
                namespace: str = "default") -> None:
        """A running pod that holds `devices` through its claim (a whole GPU, or a `memory` share of one)."""
        self.claim(claim, exactly(memory=memory), namespace=namespace)
        self.allocate(claim, *devices, memory=memory, pod=name, namespace=namespace)
        self.pod(name, claim, namespace=namespace, phase="Running")

    def _device(self, node: str, device: str) -> Obj:
        for s in self.slices.values():
            if s["spec"].get("nodeName") == node:
                for d in s["spec"].get("devices") or ():
                    if d["name"] == device:
                        return dict(d)
        raise KeyError(f"{node}/{device}")

    def edit_device(self, node: str, device: str, **fields: Any) -> None:
        for name, s in self.slices.items():
            for d in s["spec"].get("devices") or ():
                if s["spec"].get("nodeName") == node and d["name"] == device:
                    self.external_edit_slice(name, lambda _s, d=d: d.update(copy.deepcopy(fields)))
                    return
        raise KeyError(f"{node}/{device}")

    def reader(self) -> FakeReader:
        return FakeReader(self)


class FakeReader:
    """tessera.clusterread.ClusterReader's reads over a FakeCluster."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.context_namespace = cluster.context_namespace

    def resource_slices(self) -> list[Obj]:
        return copy.deepcopy(list(self.cluster.slices.values()))

    def device_classes(self) -> dict[str, Obj]:
        return copy.deepcopy(self.cluster.classes)

    def resource_claims(self) -> list[Obj]:
        return copy.deepcopy(list(self.cluster.claims.values()))

    def templates(self, namespace: str) -> list[Obj]:
        return [copy.deepcopy(t) for (ns, _), t in self.cluster.template_objects.items() if ns == namespace]

    def pods(self, namespace: str | None = None) -> list[Obj] | None:
        return [copy.deepcopy(p) for (ns, _), p in self.cluster.pod_objects.items() if namespace in (None, ns)]

    def nodes(self) -> list[Obj] | None:
        return copy.deepcopy(list(self.cluster.nodes.values())) if self.cluster.nodes_readable else None


def exactly(name: str = "gpu", *, device_class: str = DRIVER, count: int = 1, memory: str | None = None,
            selectors: list[str] | None = None, tolerations: list[Obj] | None = None, mode: str = "ExactCount") -> Obj:
    body: Obj = {"deviceClassName": device_class, "allocationMode": mode}
    if mode == "ExactCount":
        body["count"] = count
    if memory:
        body["capacity"] = {"requests": {"memory": memory}}
    if selectors:
        body["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    if tolerations:
        body["tolerations"] = tolerations
    return {"name": name, "exactly": body}
