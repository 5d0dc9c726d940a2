"""The kubelet stand-in's own checks, against a deliberately wrong DRA plugin: they must be able to fail.

The plugin here is a few lines of gRPC on tessera's generated protos, for a made-up driver, on a
node of its own; nothing of tessera's plugin is involved.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from e2e.cluster import Cluster, NodeAgent, create_fake_node
from e2e.kube import Kube
from e2e.processes import wait_for
from e2e.workloads import claim_spec, claim_template, delete_pods, pod, request, wait_running

FAKE_DRIVER = "fake.e2e.tessera.dev"
NODE = "e2e-fake-plugin"


@dataclass
class FakePlugin:
    """Registration + DRA v1 service whose answers a test switches between right and wrong."""

    versions: list[str]
    skip_claims: bool = True
    notifications: list[tuple[bool, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def serve(plugin: FakePlugin, registration_socket: Path, plugin_dir: Path) -> grpc.Server:
    from proto.dra.v1 import api_pb2 as dra
    from proto.dra.v1 import api_pb2_grpc as dra_grpc
    from proto.pluginregistration.v1 import api_pb2 as reg
    from proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc

    endpoint = plugin_dir / "dra.sock"

    class Registration(reg_grpc.RegistrationServicer):
        def GetInfo(self, request: Any, context: Any) -> Any:
            return reg.PluginInfo(type="DRAPlugin", name=FAKE_DRIVER, endpoint=str(endpoint),
                                  supported_versions=plugin.versions)

        def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
            with plugin.lock:
                plugin.notifications.append((request.plugin_registered, request.error))
            return reg.RegistrationStatusResponse()

    class DRA(dra_grpc.DRAPluginServicer):
        def NodePrepareResources(self, request: Any, context: Any) -> Any:
            resp = dra.NodePrepareResourcesResponse()
            if plugin.skip_claims:
                return resp  # kubelet must notice that the claims are missing from the answer
            for c in request.claims:
                resp.claims[c.uid].devices.append(dra.Device(
                    request_names=["gpu"], pool_name=NODE, device_name="dev-0",
                    cdi_device_ids=[f"{FAKE_DRIVER}/dev=dev-0"]))
            return resp

        def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
            resp = dra.NodeUnprepareResourcesResponse()
            for c in request.claims:
                resp.claims[c.uid].error = ""
            return resp

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    reg_grpc.add_RegistrationServicer_to_server(Registration(), server)
    dra_grpc.add_DRAPluginServicer_to_server(DRA(), server)
    plugin_dir.mkdir(parents=True, exist_ok=True)
    registration_socket.parent.mkdir(parents=True, exist_ok=True)
    server.add_insecure_port(f"unix://{endpoint}")
    server.add_insecure_port(f"unix://{registration_socket}")
    server.start()
    return server


@pytest.fixture(scope="module")
def fake_node(cluster: Cluster) -> Iterator[NodeAgent]:
    kube = cluster.kube
    create_fake_node(kube, NODE)
    kube.apply({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": FAKE_DRIVER},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{FAKE_DRIVER}"'}}]}})
    agent = NodeAgent(NODE, "none", cluster.work_dir / "nodes" / NODE, cluster.harness, cluster.kubeconfig)
    agent.start_kubelet()
    kube.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{NODE}-fake"},
                "spec": {"driver": FAKE_DRIVER, "nodeName": NODE,
                         "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                         "devices": [{"name": "dev-0"}]}})
    yield agent
    if agent.kubelet is not None:
        agent.kubelet.stop()
    kube.delete("ResourceSlice", f"{NODE}-fake")
    kube.delete("Node", NODE)


def test_a_plugin_without_a_known_service_version_is_rejected(fake_node: NodeAgent) -> None:
    plugin = FakePlugin(versions=["v1alpha3.Node"])
    server = serve(plugin, fake_node.registry_dir / "bad-reg.sock", fake_node.work_dir / "bad")
    try:
        wait_for(lambda: fake_node.events("registration-rejected"), timeout=30, what="the registration to be rejected")
        wait_for(lambda: plugin.notifications, timeout=10, what="NotifyRegistrationStatus")
        assert plugin.notifications[0][0] is False
        assert "v1.DRAPlugin" in plugin.notifications[0][1]
        assert not fake_node.events("registered")
    finally:
        server.stop(0)
        (fake_node.registry_dir / "bad-reg.sock").unlink(missing_ok=True)


def test_a_plugin_that_skips_a_claim_fails_the_prepare_until_it_answers(
    kube: Kube, fake_node: NodeAgent, namespace: str
) -> None:
    plugin = FakePlugin(versions=["v1.DRAPlugin"], skip_claims=True)
    server = serve(plugin, fake_node.registry_dir / "fake-reg.sock", fake_node.work_dir / "plugin")
    try:
        wait_for(lambda: fake_node.events("registered"), timeout=30, what="the fake plugin to register")
        kube.create(claim_template("fake", namespace, claim_spec(request(device_class=FAKE_DRIVER))))
        kube.create(pod("fake", namespace, template="fake", node=NODE))
        failed = wait_for(lambda: fake_node.events("prepare-failed"), timeout=60, what="the prepare to fail")
        assert "skipped ResourceClaim" in failed[0]["error"], failed[0]
        assert kube.get("Pod", "fake", namespace)["status"].get("phase") != "Running"

        plugin.skip_claims = False
        running = wait_running(kube, namespace, "fake")
        assert running.cdi_ids == [f"{FAKE_DRIVER}/dev=dev-0"]
    finally:
        # Unprepare needs the plugin: delete the pod while it still answers.
        delete_pods(kube, namespace)
        server.stop(0)


def test_a_deep_work_dir_gets_a_short_kubelet_dir_that_the_session_removes(tmp_path: Path) -> None:
    """Socket paths must fit 108 bytes, so a deep node directory links to a short one under /tmp; the
    session's teardown (conftest's work_dir) removes those, or every run leaves one behind."""
    from e2e.cluster import SHORT_DIRS, remove_short_dirs

    deep = tmp_path / ("d" * 60) / "nodes" / "a-node-with-a-long-name"
    agent = NodeAgent("a-node-with-a-long-name", "t4-4", deep, Path("/nonexistent"), Path("/nonexistent"))
    short = agent.kubelet_dir
    assert short.parent == Path("/tmp") and short.name.startswith("tessera-kubelet-")
    assert short in SHORT_DIRS and (deep / "kubelet").is_symlink()
    remove_short_dirs()
    assert not short.exists() and SHORT_DIRS == []
