"""Crash and restart behaviour: kubelet wiping slices, the plugin dying in the middle of a prepare."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

from e2e.cluster import DRIVER, Cluster, NodeAgent
from e2e.kube import Kube
from e2e.processes import wait_for
from e2e.workloads import claim_spec, claim_template, device_names, pod, request, slices_of, wait_running


def claim_specs(agent: NodeAgent, claim_uid: str) -> list[str]:
    return sorted(p.name for p in agent.cdi_dir.iterdir() if claim_uid in p.name)


def test_kubelet_restart_wipes_slices_which_are_republished_and_running_claims_survive(
    kube: Kube, a100: NodeAgent, namespace: str
) -> None:
    kube.create(claim_template("one", namespace, claim_spec(request())))
    kube.create(pod("survivor", namespace, template="one", node=a100.name))
    before = wait_running(kube, namespace, "survivor")
    uid = before.claim["metadata"]["uid"]
    spec_before = (a100.cdi_dir / f"{DRIVER}-claim_{uid}.json").read_text()
    published = device_names(slices_of(kube, a100.name))
    assert published

    assert a100.kubelet is not None
    a100.kubelet.stop()
    wipes = len(a100.events("wiped-slices"))
    a100.start_kubelet()
    (wipe,) = a100.events("wiped-slices")[wipes:]
    assert wipe["deleted"] >= 1, "the restarted kubelet found none of tessera's slices to wipe"
    wiped_at = time.monotonic()

    # tessera's publisher notices the deletion and publishes the same devices again.
    wait_for(lambda: device_names(slices_of(kube, a100.name)) == published, timeout=30,
             what="tessera to republish its slices after kubelet wiped them", interval=0.05)
    print(f"slices republished {time.monotonic() - wiped_at:.2f}s after the wipe")

    # The running claim is untouched: same allocation, same reservation, same CDI spec.
    claim = kube.get("ResourceClaim", before.claim["metadata"]["name"], namespace)
    assert claim["status"]["allocation"] == before.claim["status"]["allocation"]
    assert claim["status"]["reservedFor"] == before.claim["status"]["reservedFor"]
    assert kube.get("Pod", "survivor", namespace)["status"]["phase"] == "Running"
    assert (a100.cdi_dir / f"{DRIVER}-claim_{uid}.json").read_text() == spec_before

    # Like the real kubelet, the restarted stand-in prepares the running pod's claim again;
    # tessera must answer exactly as the first time.
    def re_prepared() -> list[dict[str, Any]]:
        return [c for e in a100.events("prepared")[1:] for c in e["claims"] if c["uid"] == uid]

    again = wait_for(re_prepared, timeout=30, what="the restarted kubelet to prepare the running claim again")
    assert again[-1]["devices"] == before.prepared[0]["devices"]


def test_plugin_killed_during_prepare_is_retried_without_duplicate_specs(
    cluster: Cluster, kube: Kube, a100: NodeAgent, namespace: str
) -> None:
    assert a100.plugin is not None
    started = len(a100.events("prepare-started"))
    kube.create(claim_template("one", namespace, claim_spec(request())))
    kube.create(pod("crash", namespace, template="one", node=a100.name))

    # Kill the plugin the moment kubelet's NodePrepareResources call for this pod goes out: the
    # call is then in flight (queued or half done inside tessera) when the process dies.
    def prepare_under_way() -> bool:
        return any(e["pod"] == f"{namespace}/crash" for e in a100.events("prepare-started")[started:])

    wait_for(prepare_under_way, timeout=60, interval=0.005, what="kubelet to start preparing the pod")
    a100.plugin.kill()
    a100.start_plugin()

    running = wait_running(kube, namespace, "crash")
    attempts = [e["event"] for e in a100.events() if e.get("pod") == f"{namespace}/crash"]
    print(f"kubelet's view of the crashed prepare: {attempts}")
    uid = running.claim["metadata"]["uid"]
    assert claim_specs(a100, uid) == [f"{DRIVER}-claim_{uid}.json"], "exactly one CDI spec per claim"
    proc = subprocess.run([str(cluster.harness), "cdi", "validate", f"--spec-dir={a100.cdi_dir}"],
                          capture_output=True, text=True, timeout=60, check=False)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, report["errors"]
    assert set(running.cdi_ids) <= set(report["devices"])
    (result,) = running.results
    assert [d["deviceName"] for c in running.prepared for d in c["devices"]] == [result["device"]]
