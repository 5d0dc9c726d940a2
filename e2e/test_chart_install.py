"""tessera installed as users install it: the image on each node and `helm install` of the chart.

Its own cluster of two real nodes (kubelet v1.36.3 + containerd), each a different simulated machine
chosen by a node label, and nothing of tessera started by hand: the plugin is the chart's DaemonSet,
the webhook the chart's Deployment behind its Service, with the chart's TLS, RBAC, DeviceClasses and
ValidatingAdmissionPolicy. The commands are the README's, values only through -f and --set. The tests
run in file order on one release: install, use, the webhook down, an upgrade, a missing image, then
uninstall.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from e2e.chart import (
    CONTROLLER_SELECTOR,
    NAMESPACE,
    PLUGIN_SELECTOR,
    RELEASE,
    Image,
    build_image,
    helm,
    install,
    install_into,
    kubectl,
    load_image,
    ready,
    simulated_node_labels,
    tools,
    wait_components_ready,
)
from e2e.cluster import Cluster, NodeSpec, running_cluster
from e2e.conftest import REAL_NODE_SKIP
from e2e.kube import Kube, KubeError, Obj
from e2e.network import HUB_ADDRESS, NODE_NETWORK, POD_NETWORK, connections, off_machine
from e2e.node.images import WORKLOAD_IMAGE
from e2e.processes import REPO, wait_for
from e2e.realpods import PodLoop, failed_prepares, probe_pod, wait_reported
from e2e.workloads import claim_spec, claim_template, ensure_namespace, request, slices_of, spread_config

DGX, A100 = "chart-dgx", "chart-a100"
NODES = [NodeSpec(name, profile, mig, real=True, labels=simulated_node_labels(profile, mig), plugin_by_hand=False)
         for name, profile, mig in ((DGX, "dgx-h100-8", "dynamic"), (A100, "a100-pcie-4", "static"))]

pytestmark = pytest.mark.skipif(bool(REAL_NODE_SKIP), reason=REAL_NODE_SKIP or "real nodes available")


@dataclass
class Installed:
    cluster: Cluster
    image: Image
    output: str  # what `helm install` printed (NOTES included)

    @property
    def kube(self) -> Kube:
        return self.cluster.kube

    @property
    def kubeconfig(self) -> Path:
        return self.cluster.kubeconfig


@pytest.fixture(scope="module")
def installed(work_dir: Path) -> Iterator[Installed]:
    image = build_image()
    with running_cluster(work_dir / "chart", NODES, with_controller=False, device_classes=False) as cluster:
        yield Installed(cluster, image, install_into(cluster, image))


def pods(kube: Kube, selector: str) -> list[Obj]:
    return [p for p in kube.list("Pod", NAMESPACE, label_selector=selector) if "deletionTimestamp" not in p["metadata"]]


def namespace_for(kube: Kube, prefix: str) -> str:
    name = f"{prefix}-{int(time.time() * 1000) % 100000}"
    ensure_namespace(kube, name)
    return name


# ---------------------------------------------------------------------------------------------
# install and use


def test_the_chart_runs_tessera_as_pods_on_the_nodes(installed: Installed) -> None:
    kube = installed.kube
    assert f"tessera 0.1.0 is installed in namespace {NAMESPACE}, image {installed.image.reference}" \
        in installed.output
    plugins = pods(kube, PLUGIN_SELECTOR)
    assert sorted(p["spec"]["nodeName"] for p in plugins) == sorted([A100, DGX])
    assert all(ready(p) for p in plugins)
    assert len([p for p in pods(kube, CONTROLLER_SELECTOR) if ready(p)]) == 2
    for node in installed.cluster.real_nodes.values():
        assert node.registrations() >= 1, f"kubelet on {node.name} never registered the DaemonSet's plugin"
    # each node publishes the machine its label names, with its MIG strategy
    dgx = [d for s in slices_of(kube, DGX) for d in s["spec"].get("devices", [])]
    a100 = [d for s in slices_of(kube, A100) for d in s["spec"].get("devices", [])]
    assert any(d["attributes"]["type"]["string"] == "mig" for d in dgx), "no dynamic MIG devices on the DGX"
    assert all("A100" in d["attributes"]["productName"]["string"] for d in a100)
    assert not any(d["attributes"]["type"]["string"] == "mig" for d in a100)
    version = kubectl(installed.kubeconfig, "version", "-o", "json")
    assert version.returncode == 0 and '"gitVersion": "v1.36.3"' in version.stdout, version.stdout + version.stderr


def test_a_claim_pod_runs_and_kubectl_logs_shows_its_gpus(installed: Installed) -> None:
    kube = installed.kube
    ns = namespace_for(kube, "chart-spread")
    # 8Gi across 2 cards: the chart's mutating webhook, reached through its Service, rewrites it.
    kube.create(claim_template("spread", ns, claim_spec(request("gpu", count=2),
                                                        config=spread_config("8Gi", requests=("gpu",)))))
    kube.create(probe_pod("spread", ns, DGX, templates={"gpu": "spread"}))
    view = wait_reported(kube, installed.cluster.real_nodes[DGX], ns, "spread").views["probe"]
    assert len(set(view.visible)) == 2, view
    logs = kubectl(installed.kubeconfig, "logs", "-n", ns, "spread")
    assert logs.returncode == 0, logs.stderr
    assert all(uuid in logs.stdout for uuid in view.visible), logs.stdout


def test_the_webhook_denies_a_broken_deviceclass_through_its_service(installed: Installed) -> None:
    with pytest.raises(KubeError) as denied:
        installed.kube.create({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                               "metadata": {"name": "typo.gpu.tessera.dev"}, "spec": {"selectors": [{"cel": {
                                   "expression": 'device.attributes["gpu.tessera.dev"].prodcutName == "x"'}}]}})
    assert "productName" in denied.value.message, denied.value.message


def test_a_job_that_uses_a_claim_runs_to_completion(installed: Installed) -> None:
    kube = installed.kube
    ns = namespace_for(kube, "chart-job")
    kube.create(claim_template("one-gpu", ns, claim_spec(request())))
    show = "env | grep ^TESSERA_DEVICES_ && ls /dev | grep -E '^nvidia[0-9]+$'"
    kube.create({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": ns}, "spec": {
        "backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": A100},
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [{"name": "train", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never",
                            "command": ["/bin/sh", "-c", show],
                            "resources": {"claims": [{"name": "gpu"}]}}]}}}})

    def complete() -> bool:
        conditions = kube.get("Job", "train", ns).get("status", {}).get("conditions", [])
        assert not any(c["type"] == "Failed" and c["status"] == "True" for c in conditions), conditions
        return any(c["type"] == "Complete" and c["status"] == "True" for c in conditions)

    wait_for(complete, timeout=120, what="the Job to complete")
    logs = kubectl(installed.kubeconfig, "logs", "-n", ns, "job/train")
    # the GPU's UUID in tessera's list, and its device node, which is what makes it visible to CUDA
    assert "=GPU-" in logs.stdout and re.search(r"^nvidia\d+$", logs.stdout, re.M), logs.stdout + logs.stderr


def test_deleting_a_namespace_finishes_with_its_pods_and_claims(installed: Installed) -> None:
    kube = installed.kube
    ns = namespace_for(kube, "chart-gone")
    kube.create(claim_template("share", ns, claim_spec(request(memory="2Gi"))))
    kube.create(probe_pod("holder", ns, A100, templates={"gpu": "share"}))
    wait_reported(kube, installed.cluster.real_nodes[A100], ns, "holder")
    deleted = kubectl(installed.kubeconfig, "delete", "namespace", ns, "--wait=false")
    assert deleted.returncode == 0, deleted.stderr
    # the namespace controller removes the pod, the claim and the template; kubelet unprepares
    wait_for(lambda: kube.get_or_none("Namespace", ns) is None, timeout=60, what=f"namespace {ns} to be deleted")


def test_no_connection_of_the_run_leaves_the_machine(installed: Installed) -> None:
    cluster = installed.cluster
    kube = cluster.kube
    ns = namespace_for(kube, "chart-net")
    kube.create(claim_template("one", ns, claim_spec(request())))
    kube.create(probe_pod("talk", ns, DGX, templates={"gpu": "one"}))
    wait_reported(kube, cluster.real_nodes[DGX], ns, "talk")
    # keep an apiserver -> kubelet stream open while looking (kubectl logs -f)
    with kubectl_follow(installed.kubeconfig, ns, "talk"):
        assert cluster.network is not None
        inside = connections(cluster.network.pid)
        for node in cluster.real_nodes.values():
            inside += connections(node.holder_pid)
        ours = {p.pid for p in cluster.processes() if p.alive()} | {os.getpid()}
        machine = off_machine(connections(), ours)
    assert off_machine(inside) == [] and machine == []
    peers = {ipaddress.ip_address(c.peer_host.removeprefix("::ffff:")) for c in inside}
    # the check sees the private network at work: streams to kubelets and to pods (webhook, probes)
    assert any(p in NODE_NETWORK and str(p) != HUB_ADDRESS for p in peers), peers
    assert any(p in POD_NETWORK for p in peers), peers


@contextlib.contextmanager
def kubectl_follow(kubeconfig: Path, namespace: str, pod: str) -> Iterator[None]:
    proc = subprocess.Popen([str(tools().kubectl), f"--kubeconfig={kubeconfig}", "logs", "-f", "-n", namespace, pod],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # the stream is open once the first line arrived
        yield
    finally:
        proc.kill()
        proc.wait()


def readme_tour_commands() -> list[str]:
    """Every `$ kubectl ...` and `$ helm ...` line of the README's tour."""
    text = (REPO / "README.md").read_text()
    tour = text[text.index("## A 5-minute tour"):text.index("## Layout")]
    return [line[2:].strip() for line in tour.splitlines() if line.startswith(("$ kubectl ", "$ helm "))]


def test_the_readmes_helm_and_kubectl_lines_work_verbatim(installed: Installed) -> None:
    kube, cluster = installed.kube, installed.cluster
    commands = readme_tour_commands()
    assert len(commands) >= 6 and any(c.startswith("helm upgrade --install") for c in commands), commands
    # what the demo has that the tour names: its namespace and the whole-GPU pod
    ensure_namespace(kube, "demo")
    kube.create(claim_template("whole-gpu", "demo", claim_spec(request())))
    kube.create(probe_pod("whole-gpu", "demo", DGX, templates={"gpu": "whole-gpu"}))
    wait_reported(kube, cluster.real_nodes[DGX], "demo", "whole-gpu")
    env = {**os.environ, "KUBECONFIG": str(installed.kubeconfig),
           "PATH": f"{tools().helm.parent}:{os.environ.get('PATH', '')}"}
    for command in commands:
        proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300, env=env,
                              cwd=REPO, check=False)
        assert proc.returncode == 0, f"README: `{command}` failed (rc {proc.returncode}):\n{proc.stderr}"
    wait_components_ready(kube, [DGX, A100], controllers=2)


# ---------------------------------------------------------------------------------------------
# the webhook down, an upgrade, a missing image


def test_with_no_webhook_replica_claims_follow_the_failure_policy(installed: Installed) -> None:
    kube, kubeconfig = installed.kube, installed.kubeconfig
    ns = namespace_for(kube, "chart-nowebhook")
    scaled = kubectl(kubeconfig, "scale", "deployment", f"{RELEASE}-controller", "-n", NAMESPACE, "--replicas=0")
    assert scaled.returncode == 0, scaled.stderr
    try:
        # gone, not just terminating: a replica serves reviews until it has exited
        wait_for(lambda: not kube.list("Pod", NAMESPACE, label_selector=CONTROLLER_SELECTOR), timeout=90,
                 what="the controller pods to be gone")
        # failurePolicy Fail (the default): no claim gets in unchecked
        with pytest.raises(KubeError) as refused:
            kube.create(claim_template("any", ns, claim_spec(request())))
        assert "failed calling webhook" in refused.value.message, refused.value.message
        assert kube.get_or_none("ResourceClaimTemplate", "any", ns) is None
    finally:
        kubectl(kubeconfig, "scale", "deployment", f"{RELEASE}-controller", "-n", NAMESPACE, "--replicas=2")
    wait_components_ready(kube, [DGX, A100], controllers=2)
    wait_for(lambda: _created(kube, claim_template("any", ns, claim_spec(request()))), timeout=60,
             what="claim creation to work again once the controller is back")


def _created(kube: Kube, obj: Obj) -> bool:
    try:
        kube.create(obj)
    except KubeError as exc:
        if "failed calling webhook" in exc.message:
            return False
        raise
    return True


def test_helm_upgrade_to_a_new_image_surges_without_a_failed_prepare(installed: Installed) -> None:
    kube, kubeconfig, cluster = installed.kube, installed.kubeconfig, installed.cluster
    new = build_image(f"{installed.image.tag}-next")
    for node in cluster.real_nodes.values():
        load_image(node, new)
    ns = namespace_for(kube, "chart-upgrade")
    kube.create(claim_template("share", ns, claim_spec(request(memory="1Gi"))))
    most_per_node: dict[str, int] = {}
    watching = threading.Event()

    def watch_surge() -> None:
        while not watching.is_set():
            counts: dict[str, int] = {}
            for p in pods(kube, PLUGIN_SELECTOR):
                counts[p["spec"].get("nodeName", "")] = counts.get(p["spec"].get("nodeName", ""), 0) + 1
            for node_name, n in counts.items():
                most_per_node[node_name] = max(most_per_node.get(node_name, 0), n)
            time.sleep(0.3)

    loop = PodLoop(kube, cluster.real_nodes[A100], ns)
    watcher = threading.Thread(target=watch_surge, daemon=True)
    loop.thread.start()
    watcher.start()
    try:
        loop.wait_running(3, "pods to run before the upgrade")
        upgraded = helm(kubeconfig, "upgrade", RELEASE, "helm/tessera", "-n", NAMESPACE, "--reuse-values",
                        "--set", f"image.tag={new.tag}", "--wait", "--timeout", "4m")
        assert upgraded.returncode == 0, upgraded.stderr
        loop.wait_running(len(loop.running) + 3, "pods to run after the upgrade")
    finally:
        loop.stop.set()
        watching.set()
        loop.thread.join(90)
        watcher.join(10)
    assert not loop.errors, loop.errors
    assert failed_prepares(kube, ns) == []
    assert loop.created == loop.running
    # maxSurge 1: the new plugin pod ran beside the old one on each node before the old one went
    assert most_per_node.get(A100, 0) >= 2 and most_per_node.get(DGX, 0) >= 2, most_per_node
    images = {p["spec"]["containers"][0]["image"] for p in pods(kube, PLUGIN_SELECTOR)}
    assert images == {new.reference}


def test_an_image_missing_on_the_nodes_shows_in_the_pod_and_the_notes(installed: Installed) -> None:
    kube, kubeconfig = installed.kube, installed.kubeconfig
    before = {p["metadata"]["name"] for p in pods(kube, PLUGIN_SELECTOR)}
    upgraded = helm(kubeconfig, "upgrade", RELEASE, "helm/tessera", "-n", NAMESPACE, "--reuse-values",
                    "--set", "image.tag=never-built")
    assert upgraded.returncode == 0, upgraded.stderr
    assert "ErrImagePull" in upgraded.stdout and "ctr -n k8s.io images import" in upgraded.stdout, upgraded.stdout
    try:
        def stuck() -> str:
            for p in pods(kube, PLUGIN_SELECTOR):
                for status in p.get("status", {}).get("containerStatuses", []):
                    waiting = status.get("state", {}).get("waiting", {})
                    if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff"):
                        return f"{waiting['reason']}: {waiting.get('message', '')}"
            return ""

        reason = wait_for(stuck, timeout=120, what="a plugin pod to report the missing image")
        assert "tessera.local/tessera:never-built" in reason, reason
        # the surge keeps the old pods serving: no node lost its plugin or its slices
        assert before <= {p["metadata"]["name"] for p in pods(kube, PLUGIN_SELECTOR) if ready(p)}
        assert slices_of(kube, A100) and slices_of(kube, DGX)
    finally:
        rolled = helm(kubeconfig, "rollback", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "4m")
        assert rolled.returncode == 0, rolled.stderr
    wait_components_ready(kube, [DGX, A100], controllers=2)


# ---------------------------------------------------------------------------------------------
# uninstall


def test_helm_uninstall_removes_tessera_and_running_pods_keep_running(installed: Installed) -> None:
    kube, kubeconfig, cluster = installed.kube, installed.kubeconfig, installed.cluster
    ns = namespace_for(kube, "chart-left")
    kube.create(claim_template("one", ns, claim_spec(request())))
    kube.create(probe_pod("stays", ns, A100, templates={"gpu": "one"}))
    wait_reported(kube, cluster.real_nodes[A100], ns, "stays")

    gone = helm(kubeconfig, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "2m")
    assert gone.returncode == 0, gone.stderr
    wait_for(lambda: not kube.list("Pod", NAMESPACE, label_selector=PLUGIN_SELECTOR), timeout=60,
             what="the plugin pods to be gone")
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        assert not [o for o in kube.list(kind) if o["metadata"]["name"].startswith(RELEASE)], kind
    assert not [c for c in kube.list("DeviceClass") if c["metadata"]["name"].endswith("gpu.tessera.dev")]
    for node in cluster.real_nodes.values():
        registry = node.host_path("/var/lib/kubelet/plugins_registry")
        assert not [p for p in registry.iterdir() if "tessera" in p.name], list(registry.iterdir())
        plugin_dir = node.host_path("/var/lib/kubelet/plugins/gpu.tessera.dev")
        assert not any(p.suffix == ".sock" for p in plugin_dir.iterdir()) if plugin_dir.exists() else True
    # kubelet wipes a driver's slices once its plugin has been gone for 30 s
    wait_for(lambda: not slices_of(kube, A100) and not slices_of(kube, DGX), timeout=90,
             what="kubelet to delete tessera's ResourceSlices")
    # the pod that held a GPU keeps running, its container never restarted
    pod = kube.get("Pod", "stays", ns)
    status = pod["status"]["containerStatuses"][0]
    assert pod["status"]["phase"] == "Running" and "running" in status["state"] and status["restartCount"] == 0

    # its claim can only be released by tessera: installed again, kubelet unprepares it and the pod goes
    kube.delete("Pod", "stays", ns)
    time.sleep(5)
    assert kube.get_or_none("Pod", "stays", ns) is not None, "the pod went without tessera unpreparing its claim"
    install(kubeconfig)
    wait_for(lambda: kube.get_or_none("Pod", "stays", ns) is None, timeout=120,
             what="the pod to finish terminating once tessera is back")
    assert failed_prepares(kube, ns) == []
    helm(kubeconfig, "uninstall", RELEASE, "-n", NAMESPACE, "--wait")
