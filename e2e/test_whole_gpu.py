"""A whole-GPU pod end to end: scheduled, allocated, prepared by tessera, specs valid for runtimes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from e2e.cluster import DRIVER, Cluster, NodeAgent
from e2e.kube import Kube
from e2e.processes import wait_for
from e2e.workloads import (
    claim_spec,
    claim_template,
    consumed_memory,
    delete_pods,
    device_names,
    parse_quantity,
    pod,
    request,
    slices_of,
    wait_running,
)


def card_memory(kube: Kube, node: str, device: str) -> int:
    for s in slices_of(kube, node):
        for d in s["spec"].get("devices", []):
            if d["name"] == device:
                return parse_quantity(d["capacity"]["memory"]["value"])
    raise AssertionError(f"{device} is not published on {node}")


def cdi(cluster: Cluster, *args: str) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run([str(cluster.harness), "cdi", *args], capture_output=True, text=True, timeout=60, check=False)
    assert proc.stdout, f"cdi {args}: no output; stderr:\n{proc.stderr}"
    return proc.returncode, json.loads(proc.stdout)


def test_plugin_publishes_its_node_slices(kube: Kube, dgx: NodeAgent) -> None:
    slices = wait_for(lambda: slices_of(kube, dgx.name), timeout=30, what="tessera's slices for the dgx node")
    assert {f"gpu-{i}" for i in range(8)} <= device_names(slices)
    for s in slices:
        assert s["spec"]["pool"]["name"] == dgx.name
        assert s["spec"]["nodeName"] == dgx.name


def test_whole_gpu_pod_is_allocated_prepared_and_injectable(
    cluster: Cluster, kube: Kube, dgx: NodeAgent, namespace: str
) -> None:
    kube.create(claim_template("one-gpu", namespace, claim_spec(request())))
    kube.create(pod("whole", namespace, template="one-gpu", node=dgx.name))
    running = wait_running(kube, namespace, "whole")

    # The real scheduler allocated one of tessera's full GPUs on the node and reserved it for the pod.
    assert running.node == dgx.name
    (result,) = running.results
    assert result["driver"] == DRIVER and result["pool"] == dgx.name and result["device"].startswith("gpu-")
    assert "-mig-" not in result["device"]
    # A request without a capacity request consumes the whole card, which keeps shares off it.
    assert consumed_memory(result) == card_memory(kube, dgx.name, result["device"])
    assert [r["uid"] for r in running.claim["status"]["reservedFor"]] == [running.pod["metadata"]["uid"]]

    # The plugin answered kubelet with CDI ids for exactly that device.
    (prepared,) = running.prepared
    assert prepared["uid"] == running.claim["metadata"]["uid"]
    (dev,) = prepared["devices"]
    assert (dev["poolName"], dev["deviceName"]) == (dgx.name, result["device"])
    assert dev["cdiDeviceIDs"] and all(i.startswith(f"{DRIVER}/claim=") for i in dev["cdiDeviceIDs"])

    # The CDI reference library (what containerd/CRI-O use) accepts the spec dir and resolves the ids.
    rc, report = cdi(cluster, "validate", f"--spec-dir={dgx.cdi_dir}")
    assert rc == 0, report["errors"]
    assert set(dev["cdiDeviceIDs"]) <= set(report["devices"])
    rc, injected = cdi(cluster, "inject", f"--spec-dir={dgx.cdi_dir}", *dev["cdiDeviceIDs"])
    assert rc == 0, injected["errors"]
    assert not injected.get("unresolved")
    spec = injected["ociSpec"]
    env = spec["process"].get("env", [])
    assert "NVIDIA_VISIBLE_DEVICES=void" in env and not [e for e in env if e.startswith("CUDA_VISIBLE_DEVICES=")], env
    assert any(e.startswith("TESSERA_DEVICES_") for e in env), env
    assert spec["linux"].get("devices"), "no device nodes injected"

    # Deleting the pod unprepares the claim and removes its CDI spec.
    claim_uid = running.claim["metadata"]["uid"]
    delete_pods(kube, namespace, ["whole"])
    wait_for(lambda: any(c["uid"] == claim_uid for e in dgx.events("unprepared") for c in e["claims"]),
             timeout=30, what="NodeUnprepareResources for the claim")
    rc, report = cdi(cluster, "validate", f"--spec-dir={dgx.cdi_dir}")
    assert rc == 0
    assert not set(dev["cdiDeviceIDs"]) & set(report["devices"])
    assert not [p for p in Path(dgx.cdi_dir).iterdir() if claim_uid in p.name]


def test_prepare_is_refused_for_unknown_driver_results_never_sent(kube: Kube, dgx: NodeAgent) -> None:
    """Every registration the stand-in saw advertised the v1 service first, as tessera must."""
    regs = dgx.events("registered")
    assert regs, "the plugin never registered"
    for r in regs:
        assert r["driver"] == DRIVER
        assert r["service"] == "v1.DRAPlugin"
        assert r["versions"][0] == "v1.DRAPlugin"
    assert not dgx.events("registration-rejected")
