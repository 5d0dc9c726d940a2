"""Claims, templates and pods as users write them, and waits on what the control plane does with them.

Shared by the e2e scenarios and the demo. Everything returns the objects the apiserver stored, so
assertions are on what the real scheduler, ResourceClaim controller and kubelet stand-in wrote.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from driver.quantity import quantity_bytes
from e2e.cluster import DRIVER, PREPARED_ANNOTATION
from e2e.kube import Kube, KubeError, Obj
from e2e.processes import ClusterError, wait_for

GiB = 1024**3

SCHEDULE_TIMEOUT = 60.0


def request(name: str = "gpu", *, device_class: str = DRIVER, count: int = 1, memory: str | None = None,
            selectors: list[str] | None = None) -> Obj:
    """One `spec.devices.requests[]` entry asking for `count` devices of a class ("exactly")."""
    exactly: Obj = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"name": name, "exactly": exactly}


def claim_spec(*requests: Obj, same_island: bool = False, config: list[Obj] | None = None) -> Obj:
    devices: Obj = {"requests": list(requests)}
    if same_island:
        devices["constraints"] = [{"matchAttribute": f"{DRIVER}/nvlinkIsland"}]
    if config:
        devices["config"] = config
    return {"devices": devices}


def spread_config(total: str, *, same_island: bool = False, requests: tuple[str, ...] = ("gpus",)) -> list[Obj]:
    """A GpuConfig asking for `total` memory spread evenly over the request's `count` cards."""
    sharing: Obj = {"totalMemory": total}
    if same_island:
        sharing["sameNVLinkIsland"] = True
    return [{"requests": list(requests), "opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuConfig", "sharing": sharing}}}]


def time_slicing_config(interval: str = "Long", requests: tuple[str, ...] = ("gpu",)) -> list[Obj]:
    """A GpuConfig sharing the request's GPU by time-slicing with the given interval."""
    return [{"requests": list(requests), "opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": interval}}}}}]


def claim_template(name: str, namespace: str, spec: Obj) -> Obj:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"spec": spec}}


def claim(name: str, namespace: str, spec: Obj) -> Obj:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def pod(name: str, namespace: str, *, template: str | None = None, claim_name: str | None = None,
        node: str | None = None) -> Obj:
    """A pod whose one container uses the pod claim "gpu" (from a template or an existing claim)."""
    pod_claim: Obj = {"name": "gpu"}
    if template:
        pod_claim["resourceClaimTemplateName"] = template
    else:
        pod_claim["resourceClaimName"] = claim_name
    spec: Obj = {
        "containers": [{"name": "cuda", "image": "registry.example/cuda-sample:12.4",
                        "command": ["nvidia-smi", "-L"], "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [pod_claim],
        "terminationGracePeriodSeconds": 5,
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def ensure_namespace(kube: Kube, name: str) -> None:
    """The namespace, once its `default` ServiceAccount exists: until the controller-manager has made
    it, the ServiceAccount admission plugin refuses every pod there."""
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    wait_for(lambda: kube.get_or_none("ServiceAccount", "default", name), timeout=30,
             what=f"the default ServiceAccount of namespace {name}")


@dataclass(frozen=True)
class RunningPod:
    """A pod the kubelet stand-in started, with its allocated claim and what the plugin prepared."""

    pod: Obj
    claim: Obj
    prepared: list[Obj]

    @property
    def node(self) -> str:
        node: str = self.pod["spec"]["nodeName"]
        return node

    @property
    def results(self) -> list[Obj]:
        results: list[Obj] = self.claim["status"]["allocation"]["devices"]["results"]
        return results

    @property
    def devices(self) -> list[str]:
        return [r["device"] for r in self.results]

    @property
    def cdi_ids(self) -> list[str]:
        return [i for c in self.prepared for d in c["devices"] for i in d["cdiDeviceIDs"]]


def pod_claim_name(pod_obj: Obj, pod_claim: str = "gpu") -> str | None:
    for pc in pod_obj["spec"].get("resourceClaims", []):
        if pc["name"] == pod_claim and pc.get("resourceClaimName"):
            name: str = pc["resourceClaimName"]
            return name
    for st in pod_obj.get("status", {}).get("resourceClaimStatuses", []):
        if st["name"] == pod_claim and st.get("resourceClaimName"):
            generated: str = st["resourceClaimName"]
            return generated
    return None


def wait_running(kube: Kube, namespace: str, name: str, timeout: float = SCHEDULE_TIMEOUT) -> RunningPod:
    """Wait until the pod is Running with its devices prepared; on timeout say what the pod is stuck on."""

    def running() -> Obj | None:
        p = kube.get("Pod", name, namespace)
        prepared = PREPARED_ANNOTATION in p["metadata"].get("annotations", {})
        if p.get("status", {}).get("phase") == "Running" and prepared:
            return p
        return None

    try:
        p = wait_for(running, timeout=timeout, what=f"pod {namespace}/{name} to run")
    except ClusterError as exc:
        raise ClusterError(f"{exc}\n{describe_pod(kube, namespace, name)}") from None
    claim_name = pod_claim_name(p)
    assert claim_name, f"running pod {namespace}/{name} has no resolved claim"
    c = kube.get("ResourceClaim", claim_name, namespace)
    prepared = json.loads(p["metadata"]["annotations"][PREPARED_ANNOTATION])
    return RunningPod(p, c, prepared)


def wait_unschedulable(kube: Kube, namespace: str, name: str, timeout: float = SCHEDULE_TIMEOUT) -> str:
    """Wait for the scheduler to report the pod Unschedulable; return the scheduler's message."""

    def unschedulable() -> str | None:
        p = kube.get("Pod", name, namespace)
        assert not p["spec"].get("nodeName"), f"pod {namespace}/{name} was scheduled to {p['spec']['nodeName']}"
        for cond in p.get("status", {}).get("conditions", []):
            if cond["type"] == "PodScheduled" and cond["status"] == "False" and cond.get("reason") == "Unschedulable":
                message: str = cond.get("message", "")
                return message
        return None

    return wait_for(unschedulable, timeout=timeout, what=f"pod {namespace}/{name} to be reported Unschedulable")


def describe_pod(kube: Kube, namespace: str, name: str) -> str:
    try:
        p = kube.get("Pod", name, namespace)
    except KubeError as exc:
        return f"pod {namespace}/{name}: {exc}"
    lines = [f"pod {namespace}/{name}: node={p['spec'].get('nodeName')} phase={p.get('status', {}).get('phase')}"]
    for cond in p.get("status", {}).get("conditions", []):
        lines.append(f"  condition {cond['type']}={cond['status']} {cond.get('reason', '')}: {cond.get('message', '')}")
    claim_name = pod_claim_name(p)
    if claim_name:
        c = kube.get_or_none("ResourceClaim", claim_name, namespace)
        status = (c or {}).get("status", {})
        lines.append(f"  claim {claim_name}: allocation={json.dumps(status.get('allocation'))} "
                     f"reservedFor={json.dumps(status.get('reservedFor'))}")
    for ev in kube.list("Event", namespace, field_selector=f"involvedObject.name={name}"):
        lines.append(f"  event {ev.get('type')} {ev.get('reason')}: {ev.get('message')}")
    return "\n".join(lines)


def delete_pods(kube: Kube, namespace: str, names: list[str] | None = None, timeout: float = 60.0) -> None:
    """Delete pods the way a user does (graceful) and wait until they and their generated claims are gone."""
    pods = [p["metadata"]["name"] for p in kube.list("Pod", namespace)] if names is None else names
    for name in pods:
        kube.delete("Pod", name, namespace)
    wait_for(lambda: not any(kube.get_or_none("Pod", n, namespace) for n in pods), timeout=timeout,
             what=f"pods {pods} in {namespace} to be deleted")

    def generated_claims_gone() -> bool:
        # only the deleted pods' claims: other pods of the namespace may still be using theirs
        return not [c for c in kube.list("ResourceClaim", namespace)
                    if any(o.get("kind") == "Pod" and o.get("name") in pods
                           for o in c["metadata"].get("ownerReferences", []))]

    wait_for(generated_claims_gone, timeout=timeout, what=f"generated ResourceClaims in {namespace} to be deleted")


def slices_of(kube: Kube, node: str) -> list[Obj]:
    return [s for s in kube.list("ResourceSlice", field_selector=f"spec.nodeName={node}")
            if s["spec"]["driver"] == DRIVER]


def device_names(slices: list[Obj]) -> set[str]:
    return {d["name"] for s in slices for d in s["spec"].get("devices", [])}


def parse_quantity(q: str | int) -> int:
    """Whole-number Kubernetes quantities as the apiserver prints capacities ("10Gi", "85520809984")."""
    return quantity_bytes(q, whole=True)


def consumed_memory(result: Obj) -> int:
    """Bytes of `memory` an allocation result consumed (whole devices report none)."""
    raw: Any = result.get("consumedCapacity", {}).get("memory")
    return parse_quantity(raw) if raw is not None else 0
