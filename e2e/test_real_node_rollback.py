"""Rolling the kubelet plugin back to the previous checkpoint format and forward again, pods running.

The previous build is the newest commit whose checkpoint has no `READABLE_SINCE` (format 1), run from
its own tree (git archive) on the same real node, state dir and kubelet. Nothing may be lost either
way: pods keep running, each build unprepares claims the other prepared, and no spec is duplicated.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from e2e.cluster import Cluster
from e2e.kube import Kube
from e2e.node.previous_build import NoPreviousBuild, extract, last_commit_without
from e2e.node.realnode import RealNode
from e2e.processes import wait_for
from e2e.realpods import cdi_specs, mps_daemons, probe_pod, wait_reported
from e2e.workloads import claim_spec, claim_template, delete_pods, pod_claim_name, request
from kubeletplugin.checkpoint import FORMAT


def _claim_uid(kube: Kube, namespace: str, pod: str) -> str:
    name = pod_claim_name(kube.get("Pod", pod, namespace))
    assert name
    uid: str = kube.get("ResourceClaim", name, namespace)["metadata"]["uid"]
    return uid


def _container_id(kube: Kube, namespace: str, pod: str) -> str:
    status = kube.get("Pod", pod, namespace)["status"]
    assert status["phase"] == "Running"
    [container] = status["containerStatuses"]
    assert container["restartCount"] == 0
    cid: str = container["containerID"]
    return cid


def _unprepared(node: RealNode, uid: str) -> bool:
    return not cdi_specs(node, uid) and uid not in mps_daemons(node)


def _run(kube: Kube, node: RealNode, namespace: str, name: str) -> str:
    kube.create(probe_pod(name, namespace, node.name, templates={"gpu": "share"}))
    assert wait_reported(kube, node, namespace, name).views["probe"].visible
    return _claim_uid(kube, namespace, name)


def test_rollback_to_format_1_and_forward_keeps_every_claim(
    cluster: Cluster, real_a100: RealNode, namespace: str, tmp_path: Path
) -> None:
    try:
        previous = extract(last_commit_without("kubeletplugin/checkpoint.py", "READABLE_SINCE"), tmp_path / "prev")
    except NoPreviousBuild as exc:
        pytest.skip(str(exc))
    kube = cluster.kube
    checkpoint = real_a100.state_dir / "checkpoint.json"
    kube.create(claim_template("share", namespace, claim_spec(request(memory="4Gi"))))
    first = _run(kube, real_a100, namespace, "before-rollback")
    second = _run(kube, real_a100, namespace, "kept-across")
    assert json.loads(checkpoint.read_bytes())["format"] == FORMAT
    kept_container = _container_id(kube, namespace, "kept-across")
    try:
        # Roll back: the format-1 build reads the format-2 file, and can release a claim prepared by format 2.
        assert real_a100.plugin is not None
        real_a100.plugin.stop()
        real_a100.start_plugin(source=previous)
        delete_pods(kube, namespace, ["before-rollback"])
        wait_for(lambda: _unprepared(real_a100, first), timeout=60,
                 what="the format-1 build to unprepare a claim the format-2 build prepared")
        third = _run(kube, real_a100, namespace, "during-rollback")
        assert "format" not in json.loads(checkpoint.read_bytes()), "format 1 wrote the file"
    finally:
        # Forward again: this build reads what format 1 wrote.
        assert real_a100.plugin is not None
        real_a100.plugin.stop()
        real_a100.start_plugin()
    assert _container_id(kube, namespace, "kept-across") == kept_container, "the pod's container was restarted"
    assert kept_container.split("//", 1)[-1] in real_a100.running_containers()
    for uid in (second, third):
        assert len(cdi_specs(real_a100, uid)) == 1
    delete_pods(kube, namespace)
    wait_for(lambda: _unprepared(real_a100, second) and _unprepared(real_a100, third), timeout=60,
             what="this build to unprepare claims prepared before and during the rollback")
    assert json.loads(checkpoint.read_bytes())["format"] == FORMAT
