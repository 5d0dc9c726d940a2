"""A real node leaves the machine as it found it: after a clean stop, and after its run was killed.

Each test starts one more real node (kubelet + containerd + tessera's plugin, a t4-4 profile) next to
the session's, runs a pod with a GPU on it, takes it down and compares a snapshot of the machine
(top-level directories, /opt, /var/lib, /var/log, /etc/cni, /run, mounts, cgroups, iptables-save,
node processes) with the one taken before the node started.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

from e2e.cluster import Cluster, NodeSpec
from e2e.kube import Kube
from e2e.network import PrivateNetwork
from e2e.node.hermetic import differences, machine_snapshot
from e2e.node.realnode import RealNode, clean_stale_nodes, node_binaries
from e2e.processes import wait_for
from e2e.realpods import probe_pod, wait_reported
from e2e.workloads import claim_spec, claim_template, delete_pods, request


def _scratch_node(cluster: Cluster, owner: int | None = None) -> RealNode:
    node = cluster.real_node(NodeSpec(f"real-scratch-{uuid.uuid4().hex[:4]}", "t4-4", real=True))
    if owner is not None:
        node.owner = owner
    return node


def _assert_untouched(before: dict[str, list[str]], session_start: dict[str, list[str]]) -> None:
    """Nothing new since `before`; and directories, mounts and iptables as they were before the session's
    own real nodes started (their cgroups and processes legitimately exist while the session runs)."""
    after = machine_snapshot()
    assert differences(before, after) == []
    shared = [k for k in session_start if k not in ("cgroups", "node processes")]
    assert differences({k: session_start[k] for k in shared}, {k: after[k] for k in shared}) == []


def _run_a_pod(kube: Kube, node: RealNode, namespace: str) -> None:
    kube.create(claim_template("probe", namespace, claim_spec(request())))
    kube.create(probe_pod("probe", namespace, node.name, templates={"gpu": "probe"}))
    view = wait_reported(kube, node, namespace, "probe").views["probe"]
    assert view.visible, "the pod on the scratch node got no GPU"


def test_node_start_and_stop_leave_the_machine_untouched(
    cluster: Cluster, namespace: str, machine_before: dict[str, list[str]]
) -> None:
    node_binaries()  # built before the snapshot: the build cache is not the node's doing
    before = machine_snapshot()
    node = _scratch_node(cluster)
    try:
        node.start()
        during = machine_snapshot()
        assert differences(before, during), "the snapshot does not see a running node (the check could not fail)"
        _run_a_pod(cluster.kube, node, namespace)
        delete_pods(cluster.kube, namespace)
    finally:
        node.stop()
        cluster.kube.delete("Node", node.name)
    _assert_untouched(before, machine_before)


def test_an_interrupted_run_is_cleaned_up_by_the_next(
    cluster: Cluster, namespace: str, machine_before: dict[str, list[str]]
) -> None:
    before = machine_snapshot()
    # The node's owner is a run that has already gone away, as if `make test` had been killed.
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    node = _scratch_node(cluster, owner=int(gone))
    try:
        node.start()
        _run_a_pod(cluster.kube, node, namespace)
        assert node.running_containers()
        cleaned = clean_stale_nodes()
        assert str(node.work_dir) in cleaned and node.cgroup_name in cleaned
        _assert_untouched(before, machine_before)
    finally:
        node.stop()
        # The node is gone: nothing will confirm the pod's end, so it is removed without waiting.
        cluster.kube.delete("Pod", "probe", namespace, grace_seconds=0)
        cluster.kube.delete("Node", node.name)



def test_an_interrupted_runs_network_is_cleaned_up_by_the_next(tmp_path: Path) -> None:
    """The control plane's network namespace of a run that was killed goes with the next run's clean-up."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    network = PrivateNetwork(tmp_path, owner=int(gone)).start()
    try:
        holder = network.holder
        assert holder is not None and holder.alive()
        cleaned = clean_stale_nodes()
        assert str(tmp_path) in cleaned
        wait_for(lambda: not holder.alive(), timeout=10, what="the stale network's holder to be gone")
    finally:
        network.stop()
