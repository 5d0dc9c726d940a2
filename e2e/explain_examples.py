"""Pending pods of every kind on the running demo cluster, each explained by `tessera explain`: the source of
the examples in docs/operations.md and the README tour.

    make demo
    .venv/bin/python -m e2e.explain_examples run     # creates namespace troubleshoot, prints each explanation
    .venv/bin/tessera status --kubeconfig .demo/cluster/kubeconfig --svg docs/status-demo.svg   # after `clean`
    .venv/bin/python -m e2e.explain_examples clean   # removes what `run` added

Besides its own namespace, `run` adds the DeviceClass t4.gpu.tessera.dev and a node `demo-spare` whose one
GPU carries a NoSchedule taint in its ResourceSlice; `clean` removes them. The last example, `stale`, is a
claim allocated (by hand, as a scheduler reading an out-of-date slice would) a device demo-a100 does not
have: kubelet's prepare keeps failing, and explain quotes it.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from e2e.cluster import DRIVER, create_fake_node
from e2e.kube import Kube, Obj
from e2e.processes import REPO, wait_for
from e2e.workloads import (
    claim,
    claim_spec,
    claim_template,
    delete_pods,
    ensure_namespace,
    pod,
    request,
    slices_of,
    wait_running,
    wait_unschedulable,
)

NS = "troubleshoot"
A = f'device.attributes["{DRIVER}"]'
T4_CLASS = f"t4.{DRIVER}"
SPARE = "demo-spare"


def _kube(kubeconfig: Path) -> Kube:
    config = yaml.safe_load(kubeconfig.read_text())
    return Kube(config["clusters"][0]["cluster"]["server"], kubeconfig.parent / "pki" / "ca.crt")


def _pod(kube: Kube, name: str, spec: Obj, node: str | None = None, *, running: bool = False,
         edit: Callable[[Obj], None] | None = None) -> None:
    kube.apply(claim_template(name, NS, spec))
    obj = pod(name, NS, template=name, node=node)
    if edit:
        edit(obj)
    kube.apply(obj)
    if running:
        wait_running(kube, NS, name, timeout=90)
    else:
        wait_unschedulable(kube, NS, name)


def _explain(kubeconfig: Path, name: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "tessera", "--log-level", "error", "explain", f"pod/{name}", "-n", NS,
                           "--kubeconfig", str(kubeconfig)], capture_output=True, text=True, cwd=REPO, check=False)
    print(f"$ tessera explain pod/{name} -n {NS}\n{proc.stdout}{proc.stderr}", flush=True)


def _taint_spare(kube: Kube) -> None:
    create_fake_node(kube, SPARE)
    device = copy.deepcopy(next(d for s in slices_of(kube, "demo-a100") for d in s["spec"]["devices"]
                                if d["name"] == "gpu-0"))
    device["attributes"]["uuid"] = {"string": "GPU-00000000-0000-4000-8000-0000000000aa"}
    device["taints"] = [{"key": "example.com/repair", "value": "fan", "effect": "NoSchedule"}]
    kube.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{SPARE}-gpus"},
                "spec": {"driver": DRIVER, "nodeName": SPARE, "devices": [device],
                         "pool": {"name": SPARE, "generation": 0, "resourceSliceCount": 1}}})


def allocate_by_hand(kube: Kube, name: str, namespace: str, node: str, device: str) -> None:
    """Write claim `name`'s status.allocation as the scheduler would for `device` of `node`'s pool, whether the
    node has it or not (allocationTimestamp included: the scheduler's PreBind adds it to an allocation without
    one, and the apiserver refuses that change)."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    kube.patch_status("ResourceClaim", name, {"status": {"allocation": {
        "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": node, "device": device}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}, "allocationTimestamp": now}}},
        namespace)


def prepare_events(kube: Kube, namespace: str, pod_name: str) -> list[Obj]:
    """kubelet's FailedPrepareDynamicResources events about the pod."""
    return [e for e in kube.list("Event", namespace)
            if e["involvedObject"].get("name") == pod_name and e.get("reason") == "FailedPrepareDynamicResources"]


def _stale(kube: Kube, kubeconfig: Path) -> None:
    kube.apply(claim("stale", NS, claim_spec(request())))
    allocate_by_hand(kube, "stale", NS, "demo-a100", "gpu-9")
    kube.apply(pod("stale", NS, claim_name="stale", node="demo-a100"))
    wait_for(lambda: prepare_events(kube, NS, "stale"), timeout=120, what="kubelet's prepare to fail")
    _explain(kubeconfig, "stale")


def run(kubeconfig: Path) -> None:
    kube = _kube(kubeconfig)
    ensure_namespace(kube, NS)
    mig = f"mig.{DRIVER}"
    kube.apply({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": T4_CLASS},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}" && {A}.type == "gpu" && '
                                                              f'{A}.productName.contains("T4")'}}]}})
    gpu6 = next(d for s in slices_of(kube, "demo-dgx") for d in s["spec"].get("devices", []) if d["name"] == "gpu-6")
    distinct = claim_spec(request(count=2))
    distinct["devices"]["constraints"] = [{"distinctAttribute": f"{DRIVER}/productName"}]

    def hungry(obj: Obj) -> None:
        obj["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "1000"}

    examples: list[tuple[str, Obj, str | None]] = [
        ("t4-gpu", claim_spec(request(device_class=T4_CLASS)), None),
        ("b200", claim_spec(request(selectors=[f'{A}.productName == "NVIDIA B200"'])), None),
        ("three-linked-shares", claim_spec(request(count=3, memory="10Gi"), same_island=True), "demo-a100"),
        ("two-models", distinct, None),
        ("nine-h100", claim_spec(request(count=9, device_class=f"h100.{DRIVER}")), None),
        ("share-45gi", claim_spec(request(memory="45Gi")), "demo-a100"),
        ("mig-on-gpu-6", claim_spec(request(device_class=mig, selectors=[
            f'{A}.profile == "1g.10gb"', f'{A}.parentUUID == "{gpu6["attributes"]["uuid"]["string"]}"'])), None),
    ]
    for name, spec, node in examples:
        _pod(kube, name, spec, node)
        _explain(kubeconfig, name)
    _pod(kube, "cpu-hungry", claim_spec(request(count=2), same_island=True), edit=hungry)
    _explain(kubeconfig, "cpu-hungry")
    for i in (0, 1):  # two cards of demo-a100 get 25Gi shares, so no card has 25Gi left
        _pod(kube, f"hold-25gi-{i}", claim_spec(request(memory="25Gi")), "demo-a100", running=True)
    for name, spec in (("share-25gi", claim_spec(request(memory="25Gi"))), ("whole-a100", claim_spec(request()))):
        _pod(kube, name, spec, "demo-a100")
        _explain(kubeconfig, name)
    _taint_spare(kube)
    _pod(kube, "on-spare", claim_spec(request()), SPARE)
    _explain(kubeconfig, "on-spare")
    _stale(kube, kubeconfig)


def clean(kubeconfig: Path) -> None:
    kube = _kube(kubeconfig)
    if kube.get_or_none("Namespace", NS):
        delete_pods(kube, NS)
        for template in kube.list("ResourceClaimTemplate", NS):
            kube.delete("ResourceClaimTemplate", template["metadata"]["name"], NS)
        kube.delete("ResourceClaim", "stale", NS)
    kube.delete("ResourceSlice", f"{SPARE}-gpus")
    kube.delete("Node", SPARE)
    kube.delete("DeviceClass", T4_CLASS)
    print(f"removed the examples (namespace {NS} is kept, empty)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.explain_examples", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["run", "clean"])
    parser.add_argument("--kubeconfig", type=Path, default=REPO / ".demo" / "cluster" / "kubeconfig")
    args = parser.parse_args(argv)
    (run if args.action == "run" else clean)(args.kubeconfig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
