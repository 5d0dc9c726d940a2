"""Session fixtures: one real control plane and three fake GPU nodes for the whole e2e run.

Starting the control plane costs ~10-20 s; every scenario shares it and cleans up its own pods so
the next one finds the nodes empty. When a test fails, the tail of every component's log is
attached to the report, and the work dir (logs, CDI specs, kubelet records) is kept.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.chart import build_image, install_into, simulated_node_labels
from e2e.cluster import Cluster, NodeAgent, NodeSpec, plugin_available, remove_short_dirs
from e2e.kube import Kube
from e2e.node.hermetic import differences, machine_snapshot
from e2e.node.realnode import RealNode, real_node_unavailable
from e2e.processes import REPO, stop_leftovers, wait_for
from e2e.realpods import REAL_NODE_TAINT, REAL_NODE_TAINT_KEY
from e2e.workloads import delete_pods, ensure_namespace

DGX = "e2e-dgx"
A100 = "e2e-a100"
MIG = "e2e-mig"

NODES = [
    NodeSpec(DGX, "dgx-h100-8", "static"),
    NodeSpec(A100, "a100-pcie-4", "static"),
    # One H100 in MIG mode with no instances: dynamic MIG creates them at prepare.
    NodeSpec(MIG, str(REPO / "e2e" / "profiles" / "one-h100-mig.yaml"), "dynamic"),
]

# Real kubelet v1.36.3 + containerd nodes (e2e/node), where this machine can run them.
REAL_A100 = "real-a100"
REAL_DGX = "real-dgx"
REAL_NODE_SKIP = real_node_unavailable()
# Tainted so that the stand-in scenarios' unpinned pods (which never start a container) stay off
# them; the real-node probe pods tolerate it (e2e/realpods.py). Where real nodes run, tessera is
# installed with its chart: the webhook is the chart's Deployment (on the real nodes) behind its
# Service, and real-dgx's plugin the chart's DaemonSet pod. real-a100's plugin is started by hand,
# because its tests crash, restart and replace it at fault points (restarts, rollback to the previous
# build, surge instances, health replay).
REAL_LABEL = "e2e.tessera.dev/node-kind=real"
REAL_NODES = [] if REAL_NODE_SKIP else [
    NodeSpec(REAL_A100, "a100-pcie-4", "static", real=True, taints=(REAL_NODE_TAINT,), labels=(REAL_LABEL,)),
    # Dynamic MIG: whole GPUs and MIG instances made at prepare, on one kind of node.
    NodeSpec(REAL_DGX, "dgx-h100-8", "dynamic", real=True, taints=(REAL_NODE_TAINT,),
             labels=(REAL_LABEL, *simulated_node_labels("dgx-h100-8", "dynamic")), plugin_by_hand=False),
]
# The chart's pods run on the tainted real nodes (the controller nowhere else: a stand-in node would
# only pretend to run it); the webhook gets the hand-started one's timeout, since reviews on this
# 2-core machine wait behind the whole suite.
CHART_SETS = (
    "controller.nodeSelector.e2e\\.tessera\\.dev/node-kind=real",  # helm --set escapes the dots of a key
    f"controller.tolerations[0].key={REAL_NODE_TAINT_KEY}", "controller.tolerations[0].operator=Exists",
    f"kubeletPlugin.tolerations[0].key={REAL_NODE_TAINT_KEY}", "kubeletPlugin.tolerations[0].operator=Exists",
    "webhook.timeoutSeconds=10",
)

_state: dict[str, Any] = {}
MACHINE_BEFORE: dict[str, list[str]] = {}


def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    del item
    if call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception):
        _state["failed"] = True  # keep the work dir


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    outcome: Any = yield
    if outcome.excinfo is not None:
        # the session's cluster, or the module's own one (a fixture named after it that holds a Cluster)
        own = [v for v in getattr(item, "funcargs", {}).values() if isinstance(getattr(v, "cluster", None), Cluster)]
        cluster = own[0].cluster if own else _state.get("cluster")
        if isinstance(cluster, Cluster):
            item.add_report_section("call", "component logs", cluster.diagnostics())
            item.add_report_section("call", "work dir", str(cluster.work_dir))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    del session, exitstatus
    left = stop_leftovers()
    if left:
        print(f"\ne2e: stopped components that were still running at the end of the session: {left}")


@pytest.fixture(scope="session")
def work_dir() -> Iterator[Path]:
    # Short and under /tmp: unix socket paths must stay below 108 bytes.
    path = Path(tempfile.mkdtemp(prefix="tessera-e2e-", dir="/tmp"))
    yield path
    if "failed" not in _state:
        remove_short_dirs()
        shutil.rmtree(path, ignore_errors=True)
    else:
        print(f"\ne2e work dir kept for inspection: {path}")


@pytest.fixture(scope="session")
def cluster(work_dir: Path) -> Iterator[Cluster]:
    """The control plane, tessera's DeviceClasses and webhook, the three stand-in nodes and the real ones."""
    reason = plugin_available()
    nodes = NODES + REAL_NODES if not reason else []
    chart = bool(REAL_NODES) and not reason
    # Built before the snapshot: the image cache is not the nodes' doing.
    image = build_image() if chart else None
    c = Cluster(work_dir / "cluster", nodes, with_controller=not chart, device_classes=not chart)
    _state["cluster"] = c
    # Taken before any real node starts: what the machine must look like again once they are gone.
    MACHINE_BEFORE.update(machine_snapshot())
    try:
        c.start()
        if image is not None:
            install_into(c, image, *CHART_SETS)
            c.webhook = "the chart's Deployment"
    except Exception:
        print(c.diagnostics(60))
        c.stop()
        raise
    yield c
    c.stop()
    if REAL_NODES:
        left = differences(MACHINE_BEFORE, machine_snapshot())
        assert not left, f"the e2e session's real nodes left this on the machine: {left}"


@pytest.fixture
def machine_before(cluster: Cluster) -> dict[str, list[str]]:
    """The machine as it was before the session's real nodes started (e2e/node/hermetic.py)."""
    del cluster
    return MACHINE_BEFORE


@pytest.fixture
def kube(cluster: Cluster) -> Kube:
    return cluster.kube


def _agent(cluster: Cluster, name: str) -> NodeAgent:
    reason = plugin_available()
    if reason:
        pytest.skip(reason)
    return cluster.agents[name]


@pytest.fixture
def dgx(cluster: Cluster) -> NodeAgent:
    return _agent(cluster, DGX)


@pytest.fixture
def a100(cluster: Cluster) -> NodeAgent:
    return _agent(cluster, A100)


@pytest.fixture
def mig_node(cluster: Cluster) -> NodeAgent:
    return _agent(cluster, MIG)


def _real(cluster: Cluster, name: str) -> RealNode:
    if REAL_NODE_SKIP:
        pytest.skip(f"no real node on this machine: {REAL_NODE_SKIP}")
    if plugin_available():
        pytest.skip(plugin_available())
    return cluster.real_nodes[name]


@pytest.fixture
def real_a100(cluster: Cluster) -> RealNode:
    return _real(cluster, REAL_A100)


@pytest.fixture
def real_dgx(cluster: Cluster) -> RealNode:
    return _real(cluster, REAL_DGX)


@pytest.fixture
def namespace(kube: Kube, cluster: Cluster) -> Iterator[str]:
    """A fresh namespace per test; its pods are deleted (and their devices unprepared) afterwards."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    ensure_namespace(kube, name)
    yield name
    if cluster.control_plane and cluster.control_plane.processes["apiserver"].alive():
        delete_pods(kube, name)
        for c in kube.list("ResourceClaim", name):
            kube.delete("ResourceClaim", c["metadata"]["name"], name)
        # Pods a Deployment's garbage collection already removed are not in delete_pods' list, and their claims
        # may still hold devices: the next test's pods would be placed around them (four 10Gi shares spread over
        # two cards once). Every claim of the namespace gone means every device it held is free again.
        wait_for(lambda: not kube.list("ResourceClaim", name), timeout=60,
                 what=f"the ResourceClaims of {name} to be deleted and their devices freed")


@pytest.fixture
def controller(cluster: Cluster) -> Cluster:
    if not cluster.webhook:
        pytest.skip(cluster.controller_skip_reason or "tessera controller was not started")
    return cluster
