"""The fake apiserver (tests.fakes.apiserver) with the rest of a cluster: DeviceClasses, claims and
templates, pods, and the class and claim list/watch the controller's informer runs; what `tessera
explain` and `tessera status` read; plus helpers that write what the scheduler would (an allocation
with shares) so tests can set up a busy cluster."""

from __future__ import annotations

import copy
import queue
import uuid
from collections.abc import Iterator
from typing import Any

import yaml

from controller.cluster.objects import by_name
from driver.discovery import load_inventory
from driver.kubeapi import ApiError, WatchEvent
from driver.names import slice_name
from driver.slices import build_slices
from tessera import clusterread
from tests.fakes.apiserver import FakeKubeAPI
from tests.paths import REPO

Obj = dict[str, Any]
DRIVER = "gpu.tessera.dev"


def device_class(name: str, *expressions: str, config: list | None = None) -> Obj:
    spec: Obj = {"selectors": [{"cel": {"expression": e}} for e in expressions]}
    if config is not None:
        spec["config"] = config
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


class FakeCluster(FakeKubeAPI):
    """One cluster for the controller's informer (watches of slices, classes, claims) and for what `tessera
    explain`, `status` and `check` read through driver.kubeapi.RealKubeAPI (the list_* calls below; `reader()`
    runs tessera.clusterread over them)."""

    def __init__(self) -> None:
        super().__init__()
        self.classes: dict[str, Obj] = {}
        self.pod_objects: dict[tuple[str, str], Obj] = {}
        self.template_objects: dict[tuple[str, str], Obj] = {}
        self.event_objects: list[Obj] = []
        self.taint_rule_objects: list[Obj] | None = None  # None: DeviceTaintRules are not served
        self.namespace = "default"  # the kubeconfig context's
        self.nodes_readable = True
        # watchers of classes and claims (the slice watchers are FakeKubeAPI's), for the controller's informer
        self._other_watchers: dict[str, list[queue.Queue[WatchEvent | None]]] = {"classes": [], "claims": []}

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
        self.classes[name] = device_class(name, *expressions)

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

    # -- the reads of tessera explain / status / check (RealKubeAPI's) -------------------------------------
    def list_pods(self, namespace: str | None = None) -> Obj:
        return {"items": [copy.deepcopy(p) for (ns, _), p in self.pod_objects.items() if namespace in (None, ns)]}

    def list_nodes(self) -> Obj:
        if not self.nodes_readable:
            raise ApiError(403, "Forbidden", "nodes is forbidden")
        return {"items": copy.deepcopy(list(self.nodes.values()))}

    def list_resource_claim_templates(self, namespace: str) -> Obj:
        return {"items": [copy.deepcopy(t) for (ns, _), t in self.template_objects.items() if ns == namespace]}

    def list_events(self, namespace: str, field_selector: str = "") -> Obj:
        wanted = dict(part.split("=", 1) for part in field_selector.split(",") if part)
        fields = {"involvedObject.kind": lambda e: e["involvedObject"].get("kind"),
                  "involvedObject.name": lambda e: e["involvedObject"].get("name"), "reason": lambda e: e.get("reason")}
        return {"items": [copy.deepcopy(e) for e in self.event_objects
                          if e["metadata"]["namespace"] == namespace
                          and all(fields[k](e) == v for k, v in wanted.items())]}

    def list_device_taint_rules(self) -> Obj | None:
        return None if self.taint_rule_objects is None else {"items": copy.deepcopy(self.taint_rule_objects)}

    def event(self, pod: str, reason: str, message: str, *, namespace: str = "default", count: int = 1,
              last: str = "2026-01-01T00:00:00Z", node: str = "") -> Obj:
        """An event about pod `pod`, as kubelet records one."""
        obj = self.pod_objects.get((namespace, pod)) or {"metadata": {}}
        event = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": f"{pod}.{len(self.event_objects)}",
                                                                   "namespace": namespace},
                 "involvedObject": {"kind": "Pod", "name": pod, "namespace": namespace,
                                    "uid": obj["metadata"].get("uid", "")},
                 "reason": reason, "message": message, "type": "Warning", "count": count, "lastTimestamp": last,
                 "source": {"component": "kubelet", "host": node}}
        self.event_objects.append(event)
        return event

    # -- list/watch of classes and claims, as the controller's informer reads them --------------------
    def watching(self) -> bool:
        """Whether a slice, a class and a claim watch are open (the fake does not replay missed events)."""
        with self._lock:
            return bool(self._watchers) and all(self._other_watchers.values())

    def close_watches(self) -> None:
        super().close_watches()
        with self._lock:
            for watchers in self._other_watchers.values():
                for q in watchers:
                    q.put(None)

    def _emit_to(self, what: str, type_: str, obj: Obj) -> None:
        for q in self._other_watchers[what]:
            q.put(WatchEvent(type_, copy.deepcopy(obj)))

    def add_device_class(self, obj: Obj) -> Obj:
        with self._lock:
            obj = copy.deepcopy(obj)
            existed = obj["metadata"]["name"] in self.classes
            self.classes[obj["metadata"]["name"]] = self._bump(obj)
            self._emit_to("classes", "MODIFIED" if existed else "ADDED", obj)
            return obj

    def delete_device_class(self, name: str) -> None:
        with self._lock:
            obj = self.classes.pop(name)
            self._rv += 1
            self._emit_to("classes", "DELETED", obj)

    def add_claim_watched(self, claim: Obj) -> Obj:
        with self._lock:
            claim = copy.deepcopy(claim)
            claim["metadata"].setdefault("namespace", "default")
            self.claims[(claim["metadata"]["namespace"], claim["metadata"]["name"])] = self._bump(claim)
            self._emit_to("claims", "ADDED", claim)
            return claim

    def list_device_classes(self) -> Obj:
        self._enter("list_classes")
        with self._lock:
            items = [copy.deepcopy(c) for c in self.classes.values()]
            return {"kind": "DeviceClassList", "metadata": {"resourceVersion": str(self._rv)}, "items": items}

    def list_resource_claims(self) -> Obj:
        self._enter("list_claims")
        with self._lock:
            items = [copy.deepcopy(c) for c in self.claims.values()]
            return {"kind": "ResourceClaimList", "metadata": {"resourceVersion": str(self._rv)}, "items": items}

    def _watch(self, what: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        self._enter(f"watch_{what}")
        q: queue.Queue[WatchEvent | None] = queue.Queue()
        with self._lock:
            self._other_watchers[what].append(q)
        try:
            while True:
                try:
                    event = q.get(timeout=timeout_seconds)
                except queue.Empty:
                    return
                if event is None:
                    return
                yield event
        finally:
            with self._lock:
                self._other_watchers[what].remove(q)

    def watch_device_classes(self, resource_version: str, timeout_seconds: int = 60) -> Iterator[WatchEvent]:
        return self._watch("classes", timeout_seconds)

    def watch_resource_claims(self, resource_version: str, timeout_seconds: int = 60) -> Iterator[WatchEvent]:
        return self._watch("claims", timeout_seconds)


class FakeReader:
    """tessera.clusterread's reads over a FakeCluster, for tests that build a ClusterView themselves."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster

    def resource_slices(self) -> list[Obj]:
        return clusterread.resource_slices(self.cluster)  # type: ignore[arg-type]

    def device_classes(self) -> dict[str, Obj]:
        return by_name(clusterread.device_classes(self.cluster))  # type: ignore[arg-type]

    def resource_claims(self) -> list[Obj]:
        return clusterread.resource_claims(self.cluster)  # type: ignore[arg-type]

    def templates(self, namespace: str) -> list[Obj]:
        return clusterread.templates(self.cluster, namespace)  # type: ignore[arg-type]

    def pods(self, namespace: str | None = None) -> list[Obj] | None:
        return clusterread.pods(self.cluster, namespace)  # type: ignore[arg-type]

    def nodes(self) -> list[Obj] | None:
        return clusterread.nodes(self.cluster)  # type: ignore[arg-type]


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
