"""Extended resources backed by DRA (Kubernetes 1.36, DRAExtendedResource): pods that ask for
`resources.limits: {gpu.tessera.dev/gpu: N}` and write no claim, on real nodes.

The scheduler maps the name to the DeviceClass whose spec.extendedResourceName it is, creates one
claim for the pod (annotated resource.kubernetes.io/extended-resource-claim) and records it in
pod.status.extendedResourceClaimStatus; kubelet prepares it through tessera like any other claim.
Every check is on what the container printed and on the objects the control plane wrote.
"""

from __future__ import annotations

import re
from typing import Any

from e2e.cluster import DRIVER
from e2e.kube import Kube, Obj
from e2e.node.realnode import RealNode
from e2e.processes import wait_for
from e2e.realpods import StartedPod, probe_pod, wait_reported
from e2e.workloads import claim_spec, claim_template, pod_claim_name, request, slices_of

GPU_RESOURCE = f"{DRIVER}/gpu"
SPECIAL_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"


def _limited(pod: Obj, limits: dict[str, str]) -> Obj:
    pod["spec"]["containers"][0]["resources"]["limits"] = limits
    return pod


def _special_claim(kube: Kube, started: StartedPod) -> Obj:
    status = started.pod["status"].get("extendedResourceClaimStatus")
    assert status, f"the scheduler recorded no extended-resource claim in the pod's status: {started.pod['status']}"
    c = kube.get("ResourceClaim", status["resourceClaimName"], started.pod["metadata"]["namespace"])
    assert c["metadata"]["annotations"][SPECIAL_CLAIM_ANNOTATION] == "true"
    assert [o["uid"] for o in c["metadata"]["ownerReferences"]] == [started.uid]
    return c


def _uuids(kube: Kube, node: RealNode, claim_obj: Obj) -> list[str]:
    """The UUIDs of a claim's allocated devices (MIG devices: their parent's), from the node's slices."""
    attrs = {d["name"]: d.get("attributes", {})
             for s in slices_of(kube, node.name) for d in s["spec"].get("devices", [])}
    out = []
    for result in claim_obj["status"]["allocation"]["devices"]["results"]:
        assert result["driver"] == DRIVER and result["pool"] == node.name
        value = attrs[result["device"]].get("uuid") or attrs[result["device"]].get(f"{DRIVER}/uuid") or {}
        out.append(str(next(iter(value.values()), result["device"])))
    return out


def _gpu_nodes(view_devices: list[str]) -> list[str]:
    return sorted(d for d in view_devices if re.fullmatch(r"/dev/nvidia\d+", d))


def test_real_nodes_advertise_nothing_for_the_extended_resources(kube: Kube, real_a100: RealNode) -> None:
    # DRA-backed extended resources are the scheduler's business: the node's capacity never lists them,
    # which is what makes the scheduler turn the request into a claim (allocatable 0 => DRA).
    status = kube.get("Node", real_a100.name)["status"]
    for field in ("capacity", "allocatable"):
        assert not [r for r in status.get(field, {}) if r.startswith(f"{DRIVER}/") or r == "nvidia.com/gpu"]
    assert kube.get("DeviceClass", DRIVER)["spec"]["extendedResourceName"] == GPU_RESOURCE


def test_deployment_asking_for_two_gpus_by_extended_resource(kube: Kube, real_a100: RealNode, namespace: str) -> None:
    template = _limited(probe_pod("ignored", namespace, real_a100.name), {GPU_RESOURCE: "2"})
    labels = {"app": "trainer"}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "trainer", "namespace": namespace},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": template["spec"]}},
    }
    assert "resourceClaims" not in template["spec"] or not template["spec"]["resourceClaims"]
    kube.create(deployment)
    try:
        pods = wait_for(lambda: kube.list("Pod", namespace, label_selector="app=trainer"), timeout=60,
                        what="the Deployment's ReplicaSet to create its pod")
        started = wait_reported(kube, real_a100, namespace, pods[0]["metadata"]["name"])
        view = started.views["probe"]
        c = _special_claim(kube, started)
        requests = c["spec"]["devices"]["requests"]
        assert [r["exactly"]["deviceClassName"] for r in requests] == [DRIVER]
        assert requests[0]["exactly"]["count"] == 2
        # Two distinct GPUs, the very ones allocated, seen from inside the container.
        assert len(view.visible) == 2 and len(set(view.visible)) == 2
        assert sorted(view.visible) == sorted(_uuids(kube, real_a100, c))
        assert len(_gpu_nodes(view.devices)) == 2
        mappings = started.pod["status"]["extendedResourceClaimStatus"]["requestMappings"]
        assert mappings == [{"containerName": "probe", "resourceName": GPU_RESOURCE,
                             "requestName": requests[0]["name"]}]
    finally:
        kube.delete("Deployment", "trainer", namespace)
        wait_for(lambda: not kube.list("ReplicaSet", namespace), timeout=60,
                 what="the garbage collector to delete the Deployment's ReplicaSet")


def test_mig_profile_by_extended_resource(kube: Kube, real_dgx: RealNode, namespace: str) -> None:
    kube.create(_limited(probe_pod("mig", namespace, real_dgx.name), {f"{DRIVER}/mig-1g.10gb": "1"}))
    started = wait_reported(kube, real_dgx, namespace, "mig")
    c = _special_claim(kube, started)
    (request_,) = c["spec"]["devices"]["requests"]
    assert request_["exactly"]["deviceClassName"] == f"mig-1g.10gb.{DRIVER}"
    (result,) = c["status"]["allocation"]["devices"]["results"]
    assert "-mig-1g10gb-" in result["device"], result
    view = started.views["probe"]
    assert len(view.visible) == 1 and view.visible[0].startswith("MIG-")
    assert len([d for d in view.devices if d.startswith("/dev/nvidia-caps/nvidia-cap")]) == 2


def test_pod_mixing_an_extended_resource_and_a_claim(kube: Kube, real_a100: RealNode, namespace: str) -> None:
    kube.create(claim_template("one", namespace, claim_spec(request())))
    pod = probe_pod("mixed", namespace, real_a100.name, templates={"gpu": "one"},
                    containers={"with-claim": ["gpu"], "with-limit": []})
    pod["spec"]["containers"][1]["resources"]["limits"] = {GPU_RESOURCE: "1"}
    kube.create(pod)
    started = wait_reported(kube, real_a100, namespace, "mixed")
    special = _special_claim(kube, started)
    user_claim = kube.get("ResourceClaim", str(pod_claim_name(started.pod, "gpu")), namespace)
    assert special["metadata"]["name"] != user_claim["metadata"]["name"]
    mappings = started.pod["status"]["extendedResourceClaimStatus"]["requestMappings"]
    assert [(m["containerName"], m["resourceName"]) for m in mappings] == [("with-limit", GPU_RESOURCE)]
    by_claim, by_limit = started.views["with-claim"], started.views["with-limit"]
    assert by_claim.visible == _uuids(kube, real_a100, user_claim)
    assert by_limit.visible == _uuids(kube, real_a100, special)
    assert len(by_claim.visible) == len(by_limit.visible) == 1 and by_claim.visible != by_limit.visible
    assert len(_gpu_nodes(by_claim.devices)) == len(_gpu_nodes(by_limit.devices)) == 1


def test_unknown_extended_resource_stays_pending(kube: Kube, real_a100: RealNode, namespace: str) -> None:
    # A typo is neither a class's name nor in the node's allocatable: nothing is allocated, the pod waits.
    kube.create(_limited(probe_pod("typo", namespace, real_a100.name), {f"{DRIVER}/gpus": "1"}))

    def unschedulable() -> Any:
        p = kube.get("Pod", "typo", namespace)
        return [c for c in p["status"].get("conditions", []) if c["type"] == "PodScheduled"
                and c["status"] == "False" and f"{DRIVER}/gpus" in c.get("message", "")]

    wait_for(unschedulable, timeout=60, what="the scheduler to report the unknown extended resource")
    assert not [c for c in kube.list("ResourceClaim", namespace)
                if c["metadata"].get("annotations", {}).get(SPECIAL_CLAIM_ANNOTATION)]


def test_webhook_warns_when_a_second_class_takes_the_same_extended_resource(kube: Kube, controller: Any) -> None:
    del controller
    selector = {"cel": {"expression": f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"'}}
    names = [f"e2e-dup-{x}.{DRIVER}" for x in ("a", "b")]
    try:
        for name in names:
            kube.create({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
                         "spec": {"selectors": [selector], "extendedResourceName": "e2e.example.com/dup"}})
            if name == names[0]:
                assert not [w for w in kube.last_warnings if "extendedResourceName" in w]
        warned = [w for w in kube.last_warnings if "spec.extendedResourceName" in w]
        assert warned, kube.last_warnings
        assert f'DeviceClass \\"{names[0]}\\" already answers' in warned[0] or \
            f'DeviceClass "{names[0]}" already answers' in warned[0]
        # Created in the same second or later: the scheduler's pick is the newer class, or the name first in sort order.
        created = {n: kube.get("DeviceClass", n)["metadata"]["creationTimestamp"] for n in names}
        expected = names[1] if created[names[1]] > created[names[0]] else names[0]
        assert f'get devices from \\"{expected}\\"' in warned[0] or f'get devices from "{expected}"' in warned[0]
    finally:
        for name in names:
            kube.delete("DeviceClass", name)


def test_one_container_with_a_claim_and_an_extended_resource_sees_both(
        kube: Kube, real_a100: RealNode, namespace: str) -> None:
    kube.create(claim_template("one", namespace, claim_spec(request())))
    kube.create(_limited(probe_pod("both", namespace, real_a100.name, templates={"gpu": "one"}), {GPU_RESOURCE: "1"}))
    started = wait_reported(kube, real_a100, namespace, "both")
    special = _special_claim(kube, started)
    user_claim = kube.get("ResourceClaim", str(pod_claim_name(started.pod, "gpu")), namespace)
    view = started.views["probe"]
    # each claim's list survives (its own variable), and no variable narrows what CUDA sees to one claim
    assert len(_gpu_nodes(view.devices)) == 2
    assert sorted(view.visible) == sorted(_uuids(kube, real_a100, user_claim) + _uuids(kube, real_a100, special))
    assert "CUDA_VISIBLE_DEVICES" not in view.env and view.env["NVIDIA_VISIBLE_DEVICES"] == "void"
