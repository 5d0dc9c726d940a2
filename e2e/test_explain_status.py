"""`tessera explain` and `tessera status` against the real control plane: for each way a pod stays Pending,
the real scheduler reports it Unschedulable and the explanation names the step and the device or claim;
the allocator oracle (the scheduler's own Go code) agrees with explain's search on every node; status
matches the claims' allocations exactly.

The CLI runs as a user runs it, with the cluster's kubeconfig; pods use the fixtures' nodes.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import DRIVER, Cluster, create_fake_node
from e2e.kube import Kube, Obj
from e2e.processes import REPO, wait_for
from e2e.workloads import (
    claim_spec,
    claim_template,
    consumed_memory,
    parse_quantity,
    pod,
    request,
    slices_of,
    wait_running,
    wait_unschedulable,
)

A = f'device.attributes["{DRIVER}"]'
A100, DGX, MIG = "e2e-a100", "e2e-dgx", "e2e-mig"


def tessera(cluster: Cluster, *args: str) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "tessera", "--log-level", "error", *args,
                           "--kubeconfig", str(cluster.kubeconfig)],
                          capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def explain(cluster: Cluster, namespace: str, target: str) -> tuple[int, dict[str, Any]]:
    rc, out, err = tessera(cluster, "explain", target, "-n", namespace, "-o", "json")
    assert rc in (0, 1), f"tessera explain {target}: rc={rc}\n{err}"
    doc: dict[str, Any] = json.loads(out)
    return rc, doc


def pending(kube: Kube, namespace: str, name: str, spec: Obj, node: str | None = None) -> str:
    """A pod with a claim from `spec` that the scheduler reports Unschedulable; returns its message."""
    kube.create(claim_template(name, namespace, spec))
    kube.create(pod(name, namespace, template=name, node=node))
    return wait_unschedulable(kube, namespace, name)


def running(kube: Kube, namespace: str, name: str, spec: Obj, node: str | None = None) -> str:
    """A pod that got its devices; returns its claim's name."""
    kube.create(claim_template(name, namespace, spec))
    kube.create(pod(name, namespace, template=name, node=node))
    claim: str = wait_running(kube, namespace, name).claim["metadata"]["name"]
    return claim


def oracle_nodes(cluster: Cluster, kube: Kube, claim: Obj, nodes: list[str]) -> dict[str, list[str]]:
    """Per node, the devices the scheduler's own allocator (the harness's `allocate` role) gives the claim."""
    slices = [s for s in kube.list("ResourceSlice") if s["spec"]["driver"] == DRIVER]
    classes = kube.list("DeviceClass")
    allocated = [c for c in kube.list("ResourceClaim") if (c.get("status") or {}).get("allocation")]
    out = {}
    for node in nodes:
        payload = {"node": kube.get("Node", node), "slices": slices, "classes": classes, "claims": [claim],
                   "allocatedClaims": allocated}
        proc = subprocess.run([str(cluster.harness), "allocate"], input=json.dumps(payload), capture_output=True,
                              text=True, timeout=120, check=False)
        result = json.loads(proc.stdout)
        allocations = result.get("allocations") or []
        out[node] = [r["device"] for r in allocations[0]["devices"]["results"]] if allocations else []
    return out


def generated_claim(kube: Kube, namespace: str, pod_name: str) -> Obj:
    p = kube.get("Pod", pod_name, namespace)
    name = next(s["resourceClaimName"] for s in p["status"]["resourceClaimStatuses"])
    return kube.get("ResourceClaim", name, namespace)


def assert_oracle_agrees(cluster: Cluster, kube: Kube, namespace: str, pod_name: str, doc: dict[str, Any],
                         nodes: list[str]) -> None:
    """explain's search and the Go allocator find a solution on the same nodes (and the same devices)."""
    claim = generated_claim(kube, namespace, pod_name)
    oracle = oracle_nodes(cluster, kube, claim, nodes)
    [report] = doc["claims"]
    found = report.get("search", {}).get("nodesFound", [])
    assert sorted(n for n, devices in oracle.items() if devices) == sorted(found), (oracle, report)
    if report["picks"]:
        node = report["picks"][0]["node"]
        assert sorted(p["device"] for p in report["picks"]) == sorted(oracle[node])


# -- one Pending pod per failure kind --------------------------------------------------------------------


def test_a_class_that_matches_no_device(cluster: Cluster, kube: Kube, namespace: str) -> None:
    name = f"t4-{namespace}.{DRIVER}"
    kube.apply({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression":
                                                f'device.driver == "{DRIVER}" && {A}.productName.contains("T4")'}}]}})
    try:
        pending(kube, namespace, "t4", claim_spec(request(device_class=name)))
        rc, doc = explain(cluster, namespace, "pod/t4")
    finally:
        kube.delete("DeviceClass", name)
    assert rc == 1
    assert doc["verdict"]["step"] == "class"
    assert f'DeviceClass "{name}" matches none of the' in doc["verdict"]["reason"]
    steps = {s["step"]: s["count"] for s in doc["claims"][0]["requests"][0]["steps"]}
    assert steps["driver"] > 0 and steps["class"] == 0


def test_request_selectors_that_rule_out_every_device(cluster: Cluster, kube: Kube, namespace: str) -> None:
    pending(kube, namespace, "b200", claim_spec(request(selectors=[f'{A}.productName == "NVIDIA B200"'])))
    rc, doc = explain(cluster, namespace, "b200")
    assert rc == 1 and doc["verdict"]["step"] == "selectors"
    assert doc["verdict"]["devices"], doc["verdict"]  # the nearest miss is named
    assert "productName" in doc["verdict"]["fix"]


def test_memory_that_fits_on_no_card(cluster: Cluster, kube: Kube, namespace: str) -> None:
    holders = [running(kube, namespace, f"hold-{i}", claim_spec(request(memory="25Gi")), A100) for i in range(4)]
    pending(kube, namespace, "big-share", claim_spec(request(memory="20Gi")), A100)
    rc, doc = explain(cluster, namespace, "pod/big-share")
    verdict = doc["verdict"]
    assert rc == 1 and verdict["step"] == "capacity"
    assert "the largest free amount is 15Gi" in verdict["reason"]
    [device] = verdict["devices"]
    assert device.startswith(f"{A100}/gpu-")
    [holder] = verdict["claims"]
    assert holder in {f"{namespace}/{h}" for h in holders}
    assert verdict["pods"] and verdict["pods"][0].startswith(f"{namespace}/hold-")
    assert verdict["fix"].startswith("ask for 15Gi or less")


def test_all_cards_taken(cluster: Cluster, kube: Kube, namespace: str) -> None:
    holders = {running(kube, namespace, f"whole-{i}", claim_spec(request()), A100) for i in range(4)}
    pending(kube, namespace, "fifth", claim_spec(request()), A100)
    rc, doc = explain(cluster, namespace, "pod/fifth")
    verdict = doc["verdict"]
    assert rc == 1 and verdict["step"] == "allocation"
    assert set(verdict["claims"]) == {f"{namespace}/{h}" for h in holders}
    assert set(verdict["pods"]) == {f"{namespace}/whole-{i}" for i in range(4)}
    assert sorted(verdict["devices"]) == [f"{A100}/gpu-{i}" for i in range(4)]


def test_match_attribute_that_no_node_can_meet(cluster: Cluster, kube: Kube, namespace: str) -> None:
    pending(kube, namespace, "three-linked", claim_spec(request(count=3), same_island=True), A100)
    rc, doc = explain(cluster, namespace, "pod/three-linked")
    verdict = doc["verdict"]
    assert rc == 1 and verdict["step"] == "constraints"
    assert "matchAttribute" in verdict["reason"] and "the largest group is 2 on e2e-a100" in verdict["reason"]
    assert_oracle_agrees(cluster, kube, namespace, "three-linked", doc, [A100])


def test_distinct_attribute_that_no_node_can_meet(cluster: Cluster, kube: Kube, namespace: str) -> None:
    spec = claim_spec(request(count=2))
    spec["devices"]["constraints"] = [{"distinctAttribute": f"{DRIVER}/productName"}]
    pending(kube, namespace, "two-models", spec)
    rc, doc = explain(cluster, namespace, "pod/two-models")
    verdict = doc["verdict"]
    assert rc == 1 and verdict["step"] == "constraints"
    assert "distinctAttribute" in verdict["reason"]
    assert_oracle_agrees(cluster, kube, namespace, "two-models", doc, [A100, DGX, MIG])


def test_mig_counters_used_up(cluster: Cluster, kube: Kube, namespace: str) -> None:
    mig = f"mig.{DRIVER}"
    holder = running(kube, namespace, "mig-7g", claim_spec(request(device_class=mig, selectors=[
        f'{A}.profile == "7g.80gb"'])), MIG)
    pending(kube, namespace, "mig-1g", claim_spec(request(device_class=mig, selectors=[f'{A}.profile == "1g.10gb"'])),
            MIG)
    rc, doc = explain(cluster, namespace, "pod/mig-1g")
    verdict = doc["verdict"]
    assert rc == 1 and verdict["step"] == "counters"
    assert verdict["claims"] == [f"{namespace}/{holder}"] and verdict["pods"] == [f"{namespace}/mig-7g"]
    assert f"held by {MIG}/gpu-0-mig-7g80gb-0" in verdict["reason"]


@pytest.fixture
def tainted_node(kube: Kube) -> Iterator[str]:
    """A node with one tessera GPU that carries a NoSchedule taint (spec.devices[].taints: DRADeviceTaints is on
    by default in 1.36; DeviceTaintRule needs the off-by-default DRADeviceTaintRules). No plugin runs there, so
    nothing republishes the slice."""
    name = "e2e-taint"
    create_fake_node(kube, name)
    device = copy.deepcopy(next(d for s in slices_of(kube, A100) for d in s["spec"]["devices"]
                                if d["name"] == "gpu-0"))
    device["attributes"]["uuid"] = {"string": "GPU-00000000-0000-4000-8000-00000000e2e1"}
    device["taints"] = [{"key": "example.com/repair", "value": "fan", "effect": "NoSchedule"}]
    kube.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{name}-gpus"},
                "spec": {"driver": DRIVER, "nodeName": name, "pool": {"name": name, "generation": 0,
                                                                       "resourceSliceCount": 1},
                         "devices": [device]}})
    stored = kube.get("ResourceSlice", f"{name}-gpus")
    if not stored["spec"]["devices"][0].get("taints"):
        kube.delete("ResourceSlice", f"{name}-gpus")
        kube.delete("Node", name)
        pytest.skip("this apiserver drops spec.devices[].taints (DRADeviceTaints off)")
    yield name
    kube.delete("ResourceSlice", f"{name}-gpus")
    kube.delete("Node", name)


def test_a_taint_that_is_not_tolerated(cluster: Cluster, kube: Kube, namespace: str, tainted_node: str) -> None:
    pending(kube, namespace, "untolerated", claim_spec(request()), tainted_node)
    rc, doc = explain(cluster, namespace, "pod/untolerated")
    verdict = doc["verdict"]
    assert rc == 1 and verdict["step"] == "taints"
    assert verdict["devices"] == [f"{tainted_node}/gpu-0"]
    assert "example.com/repair=fan:NoSchedule" in verdict["reason"]
    # with the toleration explain proposes, the scheduler places the pod there
    tolerating = claim_spec(request())
    tolerating["devices"]["requests"][0]["exactly"]["tolerations"] = [
        {"key": "example.com/repair", "operator": "Equal", "value": "fan", "effect": "NoSchedule"}]
    kube.create(claim_template("tolerating", namespace, tolerating))
    kube.create(pod("tolerating", namespace, template="tolerating", node=tainted_node))
    wait_for(lambda: kube.get("Pod", "tolerating", namespace)["spec"].get("nodeName") == tainted_node, timeout=60,
             what="the tolerating pod to be bound to the tainted node")
    kube.delete("Pod", "tolerating", namespace, grace_seconds=0)  # no kubelet there to finish a graceful delete


def test_a_pod_pending_for_another_reason_is_told_tesseras_part_is_fine(cluster: Cluster, kube: Kube,
                                                                         namespace: str) -> None:
    kube.create(claim_template("cpu-hungry", namespace, claim_spec(request(count=2), same_island=True)))
    hungry = pod("cpu-hungry", namespace, template="cpu-hungry")
    hungry["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "1000"}
    kube.create(hungry)
    message = wait_unschedulable(kube, namespace, "cpu-hungry")
    assert "Insufficient cpu" in message
    rc, doc = explain(cluster, namespace, "pod/cpu-hungry")
    assert rc == 0 and doc["verdict"]["ok"]
    assert "tessera's part is fine" in doc["verdict"]["reason"]
    assert "Insufficient cpu" in doc["schedulerMessage"]
    assert_oracle_agrees(cluster, kube, namespace, "cpu-hungry", doc, [A100, DGX, MIG])


# -- status --------------------------------------------------------------------------------------------


def _allocations(kube: Kube) -> set[tuple[str, str, str, tuple[str, ...], int]]:
    """(node, device, claim, pods, memory) of every tessera result of every allocated claim."""
    memory_of = {(s["spec"]["nodeName"], d["name"]): parse_quantity(d["capacity"]["memory"]["value"])
                 for s in kube.list("ResourceSlice") if s["spec"]["driver"] == DRIVER
                 for d in s["spec"].get("devices", []) if "memory" in d.get("capacity", {})}
    out = set()
    for c in kube.list("ResourceClaim"):
        allocation = (c.get("status") or {}).get("allocation")
        if not allocation:
            continue
        ns = c["metadata"]["namespace"]
        pods = tuple(f"{ns}/{r['name']}" for r in c["status"].get("reservedFor", []))
        for r in allocation["devices"]["results"]:
            if r["driver"] == DRIVER:
                memory = consumed_memory(r) or memory_of[(r["pool"], r["device"])]
                out.add((r["pool"], r["device"], f"{ns}/{c['metadata']['name']}", pods, memory))
    return out


def test_status_matches_the_claims_allocations_and_draws_valid_svg(cluster: Cluster, kube: Kube, namespace: str,
                                                                    tmp_path: Path) -> None:
    mig = f"mig.{DRIVER}"
    # a whole GPU on e2e-mig's card would take every MIG slice there: the whole cards go to e2e-dgx
    examples = [("whole", claim_spec(request()), DGX), ("pair", claim_spec(request(count=2), same_island=True), DGX),
                ("share-a", claim_spec(request(memory="10Gi")), A100),
                ("share-b", claim_spec(request(memory="10Gi")), A100),
                ("mig-1g", claim_spec(request(device_class=mig, selectors=[f'{A}.profile == "1g.10gb"'])), MIG)]
    for name, spec, node in examples:
        running(kube, namespace, name, spec, node)
    svg = tmp_path / "cards.svg"
    rc, out, err = tessera(cluster, "status", "-o", "json", "--svg", str(svg))
    assert rc == 0, err
    doc = json.loads(out)
    shown = {(n["name"], a["device"], a["claim"], tuple(a["pods"]), a["memoryBytes"])
             for n in doc["nodes"] for g in n["gpus"] for a in g["allocations"]}
    assert shown == _allocations(kube)
    mine = {a[3][0].split("/", 1)[1] for a in shown if a[2].startswith(f"{namespace}/")}
    assert mine == {name for name, _, _ in examples}
    root = ET.parse(svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    segments = [r for r in root.iter("{http://www.w3.org/2000/svg}rect") if r.get("class") == "seg"]
    assert len(segments) == len(shown)
    rc, table, _ = tessera(cluster, "status")
    assert rc == 0
    for name, _, _ in examples:
        assert f"pod {namespace}/{name}" in table
