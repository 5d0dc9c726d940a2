"""GPU health on real nodes: an injected event becomes a device taint, kube-controller-manager's device
taint eviction controller evicts the pods, kubelet shows the health in pod status, the scheduler keeps
new claims off the GPU, a reset clears what the policy clears, and a recovery clears the taint so that
the scheduler places pods on the GPU again.

Events go in the way a demo injects them: appended to the node agent's `health-events.jsonl` (what
`tessera inject-health-event` writes). Every test removes the log afterwards, which starts the agent's
book over and takes the taints away, so the shared nodes are clean for the next test.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.cluster import DRIVER
from e2e.kube import Kube, Obj
from e2e.node.realnode import RealNode
from e2e.processes import wait_for
from e2e.realpods import cdi_specs, mps_daemons, probe_pod, wait_reported
from e2e.workloads import (
    claim,
    claim_spec,
    claim_template,
    pod_claim_name,
    request,
    slices_of,
    time_slicing_config,
    wait_unschedulable,
)

EVENT_LOG = "health-events.jsonl"
LOST = f"{DRIVER}/gpu-lost"
ECC = f"{DRIVER}/ecc-double-bit"
XID = f"{DRIVER}/xid"


def inject(node: RealNode, gpu: int, event: str, **extra: Any) -> float:
    line = json.dumps({"gpu": gpu, "event": event, "time": time.time(), **extra}) + "\n"
    with (node.state_dir / EVENT_LOG).open("a") as f:
        f.write(line)
    return time.monotonic()


def taints(kube: Kube, node: RealNode) -> dict[str, list[Obj]]:
    return {d["name"]: d["taints"] for s in slices_of(kube, node.name) for d in s["spec"].get("devices", [])
            if d.get("taints")}


def gpu_index(device: str) -> int:
    return int(device.split("-")[1])


def tolerating(req: Obj, key: str, effect: str) -> Obj:
    req["exactly"]["tolerations"] = [{"key": key, "operator": "Exists", "effect": effect}]
    return req


@pytest.fixture
def healthy_after(kube: Kube, real_a100: RealNode, real_dgx: RealNode) -> Iterator[None]:
    yield
    for node in (real_a100, real_dgx):
        (node.state_dir / EVENT_LOG).unlink(missing_ok=True)
    for node in (real_a100, real_dgx):
        wait_for(lambda n=node: not taints(kube, n), timeout=30, what=f"health taints on {node.name} to go")


def _allocated(kube: Kube, namespace: str, pod: Obj, pod_claim: str = "gpu") -> Obj:
    name = pod_claim_name(pod, pod_claim)
    assert name
    return kube.get("ResourceClaim", name, namespace)


def _devices(claim_obj: Obj) -> list[str]:
    return [r["device"] for r in claim_obj["status"]["allocation"]["devices"]["results"]]


@pytest.fixture
def deployment_removed(kube: Kube, namespace: str) -> Iterator[None]:
    """Deletes the namespace's Deployments and waits for their ReplicaSets to go, before the namespace
    fixture deletes the pods (a live ReplicaSet would start new ones on a node being torn down)."""
    yield
    for d in kube.list("Deployment", namespace):
        kube.delete("Deployment", d["metadata"]["name"], namespace)
    wait_for(lambda: not kube.list("ReplicaSet", namespace), timeout=60,
             what="the garbage collector to delete the Deployment's ReplicaSets")


def test_gpu_lost_taints_evicts_unprepares_and_the_deployment_moves(
    kube: Kube, real_a100: RealNode, namespace: str, healthy_after: None, deployment_removed: None
) -> None:
    kube.create(claim_template("whole", namespace, claim_spec(request())))
    pod_spec = probe_pod("x", namespace, real_a100.name, templates={"gpu": "whole"})["spec"]
    kube.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "trainer", "namespace": namespace},
                 "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "trainer"}},
                          "template": {"metadata": {"labels": {"app": "trainer"}}, "spec": pod_spec}}})

    def running_pod() -> Obj | None:
        pods = [p for p in kube.list("Pod", namespace) if p.get("status", {}).get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")]
        return pods[0] if len(pods) == 1 else None

    first = wait_for(running_pod, timeout=90, what="the deployment's pod to run")
    started = wait_reported(kube, real_a100, namespace, first["metadata"]["name"])
    first_claim = _allocated(kube, namespace, started.pod)
    [device] = _devices(first_claim)
    uid = first_claim["metadata"]["uid"]
    assert cdi_specs(real_a100, uid)

    inject(real_a100, gpu_index(device), "xid", xid=79)
    tainted = wait_for(lambda: taints(kube, real_a100).get(device), timeout=10,
                       what=f"a {LOST} taint on {device}")
    assert [(t["key"], t["value"], t["effect"]) for t in tainted] == [(LOST, "fallen-off-bus", "NoExecute")]

    # evicted by kube-controller-manager, unprepared by kubelet, claim gone with its pod
    wait_for(lambda: kube.get_or_none("Pod", first["metadata"]["name"], namespace) is None, timeout=60,
             what="the pod on the lost GPU to be evicted")
    wait_for(lambda: not cdi_specs(real_a100, uid), timeout=60, what="the evicted claim's CDI spec to go")
    wait_for(lambda: kube.get_or_none("ResourceClaim", first_claim["metadata"]["name"], namespace) is None,
             timeout=60, what="the evicted pod's claim to be deleted (deallocated)")

    replacement = wait_for(running_pod, timeout=90, what="the deployment's replacement pod to run")
    assert replacement["metadata"]["uid"] != first["metadata"]["uid"]
    [moved] = _devices(_allocated(kube, namespace, replacement))
    assert moved != device


def test_double_bit_ecc_evicts_both_shares_but_not_the_mig_pod_on_another_gpu(
    kube: Kube, real_dgx: RealNode, namespace: str, healthy_after: None
) -> None:
    kube.create(claim_template("share", namespace, claim_spec(request(memory="10Gi"))))
    kube.create(claim_template("mig", namespace, claim_spec(request(
        device_class=f"mig.{DRIVER}", selectors=[f'device.attributes["{DRIVER}"].profile == "1g.10gb"']))))
    for name, template in (("share-a", "share"), ("share-b", "share"), ("mig", "mig")):
        kube.create(probe_pod(name, namespace, real_dgx.name, templates={"gpu": template}))
    pods = {n: wait_reported(kube, real_dgx, namespace, n).pod for n in ("share-a", "share-b", "mig")}
    claims = {n: _allocated(kube, namespace, p) for n, p in pods.items()}
    share_dev = _devices(claims["share-a"])[0]
    assert _devices(claims["share-b"]) == [share_dev], "first fit puts both shares on one card"
    mig_dev = _devices(claims["mig"])[0]
    if gpu_index(mig_dev) == gpu_index(share_dev):
        pytest.fail(f"the MIG device {mig_dev} landed on the shares' GPU; the test needs them apart")
    share_uids = [claims[n]["metadata"]["uid"] for n in ("share-a", "share-b")]
    assert all(u in mps_daemons(real_dgx) for u in share_uids)

    on_gpu = {d["name"] for s in slices_of(kube, real_dgx.name) for d in s["spec"].get("devices", [])
              if gpu_index(d["name"]) == gpu_index(share_dev)}
    assert len(on_gpu) > 1, "dynamic MIG publishes the GPU and its partitions"
    inject(real_dgx, gpu_index(share_dev), "ecc-double-bit")
    # every partition of the GPU carries it (the slices of one pool are written one after the other)
    wait_for(lambda: set(taints(kube, real_dgx)) == on_gpu, timeout=10,
             what=f"an {ECC} taint on {share_dev} and every partition of it, on nothing else")

    for name in ("share-a", "share-b"):
        wait_for(lambda n=name: kube.get_or_none("Pod", n, namespace) is None, timeout=60,
                 what=f"{name} on the GPU with a double-bit ECC error to be evicted")
    wait_for(lambda: not any(u in mps_daemons(real_dgx) for u in share_uids), timeout=60,
             what="the evicted shares' MPS daemons to stop")
    assert not any(cdi_specs(real_dgx, u) for u in share_uids)
    mig_pod = kube.get("Pod", "mig", namespace)
    assert mig_pod["status"]["phase"] == "Running" and not mig_pod["metadata"].get("deletionTimestamp")

    # the same error on the MIG device's GPU evicts the MIG pod, and the MIG instance is destroyed
    mig_uid = claims["mig"]["metadata"]["uid"]
    inject(real_dgx, gpu_index(mig_dev), "ecc-double-bit")
    wait_for(lambda: kube.get_or_none("Pod", "mig", namespace) is None, timeout=60,
             what="the MIG pod on the second GPU with an ECC error to be evicted")
    wait_for(lambda: not cdi_specs(real_dgx, mig_uid), timeout=60, what="the MIG claim's CDI spec to go")


def _resource_health(kube: Kube, namespace: str, name: str) -> list[Obj]:
    statuses = kube.get("Pod", name, namespace).get("status", {}).get("containerStatuses") or []
    return [r for s in statuses for entry in s.get("allocatedResourcesStatus") or [] for r in entry["resources"]]


def test_no_schedule_keeps_new_claims_off_a_tolerating_claim_gets_it_and_reset_clears(
    kube: Kube, real_a100: RealNode, namespace: str, healthy_after: None
) -> None:
    # A claim that tolerates the XID taint is allowed onto the GPU; it also outlives a NoExecute
    # taint it tolerates, and shows kubelet's view of the device's health in its pod status.
    for gpu in range(4):
        if gpu != 2:
            inject(real_a100, gpu, "xid", xid=94)
    wait_for(lambda: len(taints(kube, real_a100)) == 3, timeout=10, what="XID taints on three GPUs")

    kube.create(claim("plain", namespace, claim_spec(request())))
    kube.create(probe_pod("plain", namespace, real_a100.name, claims={"gpu": "plain"}))
    plain = wait_reported(kube, real_a100, namespace, "plain")
    assert _devices(_allocated(kube, namespace, plain.pod)) == ["gpu-2"], "the only GPU without the taint"

    tolerant = claim_spec(tolerating(request(), XID, "NoSchedule"))
    tolerant["devices"]["requests"][0]["exactly"]["tolerations"].append(
        {"key": ECC, "operator": "Exists", "effect": "NoExecute"})
    kube.create(claim("diag", namespace, tolerant))
    kube.create(probe_pod("diag", namespace, real_a100.name, claims={"gpu": "diag"}))
    diag = wait_reported(kube, real_a100, namespace, "diag")
    [diag_dev] = _devices(_allocated(kube, namespace, diag.pod))
    assert diag_dev != "gpu-2"

    # the pod stays (it tolerates the NoExecute taint) and its status says the device is unhealthy
    inject(real_a100, gpu_index(diag_dev), "ecc-double-bit", message="uncorrectable ECC error in HBM")

    def unhealthy() -> list[Obj] | None:
        found = [r for r in _resource_health(kube, namespace, "diag")
                 if "uncorrectable ECC error in HBM" in r.get("message", "")]
        return found or None

    # the GPU already had the XID (it was tolerated): kubelet shows both conditions in tessera's message
    [status] = wait_for(unhealthy, timeout=60, what="allocatedResourcesStatus to show the ECC error")
    assert status["health"] == "Unhealthy"
    assert status["message"] == ("tessera: ecc-double-bit: uncorrectable ECC error in HBM; xid: critical XID 94")
    assert kube.get("Pod", "diag", namespace)["status"]["phase"] == "Running"

    # a simulated reset clears both taints on that GPU (both clear on reset by default)
    inject(real_a100, gpu_index(diag_dev), "reset")
    wait_for(lambda: diag_dev not in taints(kube, real_a100), timeout=10, what=f"the taints on {diag_dev} to go")
    wait_for(lambda: {r.get("health") for r in _resource_health(kube, namespace, "diag")} == {"Healthy"},
             timeout=60, what="the pod's device to read Healthy again")

    # the apiserver stores the taints exactly as published (timeAdded included): no update loop
    assert real_a100.plugin is not None
    assert "stored the slice differently" not in real_a100.plugin.log_path.read_text(errors="replace")


def test_time_sliced_claim_is_evicted_with_its_gpu(
    kube: Kube, real_a100: RealNode, namespace: str, healthy_after: None
) -> None:
    config = time_slicing_config()
    kube.create(claim("sliced", namespace, claim_spec(request(device_class=f"timeslicing.{DRIVER}"), config=config)))
    kube.create(probe_pod("sliced", namespace, real_a100.name, claims={"gpu": "sliced"},
                          containers={"trainer": ["gpu"], "sidecar": ["gpu"]}))
    started = wait_reported(kube, real_a100, namespace, "sliced")
    sliced = _allocated(kube, namespace, started.pod)
    [device] = _devices(sliced)
    uid = sliced["metadata"]["uid"]
    assert cdi_specs(real_a100, uid)

    inject(real_a100, gpu_index(device), "gpu-lost")
    wait_for(lambda: kube.get_or_none("Pod", "sliced", namespace) is None, timeout=60,
             what="the time-sliced pod on the lost GPU to be evicted")
    wait_for(lambda: not cdi_specs(real_a100, uid), timeout=60, what="the time-sliced claim to be unprepared")
    # a claim the user created (not from a template) stays, deallocated once no pod uses it
    wait_for(lambda: not kube.get("ResourceClaim", "sliced", namespace).get("status", {}).get("allocation"),
             timeout=60, what="the time-sliced claim to be deallocated")


def test_a_taint_keeps_pods_off_recovery_clears_it_and_pods_land_again(
    kube: Kube, real_a100: RealNode, namespace: str, healthy_after: None
) -> None:
    # every GPU of the node has an uncorrectable ECC error: no pod can get one
    for gpu in range(4):
        inject(real_a100, gpu, "ecc-double-bit")
    wait_for(lambda: len(taints(kube, real_a100)) == 4, timeout=10, what="ECC taints on all four GPUs")
    kube.create(claim("after-reset", namespace, claim_spec(request())))
    kube.create(probe_pod("after-reset", namespace, real_a100.name, claims={"gpu": "after-reset"}))
    message = wait_unschedulable(kube, namespace, "after-reset")
    assert "cannot allocate all claims" in message

    # GPU 2 was reset and reads healthy again: what NVML's recovery check reports on a real GPU
    inject(real_a100, 2, "recovered", condition="ecc-double-bit")
    wait_for(lambda: "gpu-2" not in taints(kube, real_a100), timeout=10, what="gpu-2's ECC taint to clear")
    assert sorted(taints(kube, real_a100)) == ["gpu-0", "gpu-1", "gpu-3"]
    started = wait_reported(kube, real_a100, namespace, "after-reset")
    assert _devices(_allocated(kube, namespace, started.pod)) == ["gpu-2"]
    statuses = _resource_health(kube, namespace, "after-reset")
    assert {r.get("health") for r in statuses} <= {"Healthy"}, statuses
