"""A 30 s kube-apiserver outage on a real control plane, with a claim prepared and pods to come.

Its own small cluster (one simulated A100 node, no webhook), so stopping the apiserver cannot
disturb the session's scenarios. While the apiserver process is stopped: tessera's plugin stays up,
its prepared claim keeps its CDI spec, kubelet's prepare call for a claim it cannot read gets a
per-claim, retryable error, and /healthz stays 200. After the apiserver is started again: the same
claim answers the same CDI ids, and the publisher, whose watch broke with the apiserver, repairs a
deletion of its slices. (A new pod is not part of it: kube-scheduler itself took 45-87 s to schedule
again after such an outage, which would time the scheduler's informers, not tessera.)
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.cluster import Cluster, NodeSpec, plugin_available, running_cluster
from e2e.processes import wait_for
from e2e.workloads import (
    claim_spec,
    claim_template,
    device_names,
    ensure_namespace,
    pod,
    request,
    slices_of,
    wait_running,
)
from kubeletplugin.kubeletclaims import ClaimRef
from tests.fakes.kubeletclient import PluginConnection

NODE = "outage-a100"
NAMESPACE = "outage"
OUTAGE_S = 30.0


@pytest.fixture(scope="module")
def small_cluster(work_dir: Path) -> Iterator[Cluster]:
    reason = plugin_available()
    if reason:
        pytest.skip(reason)
    with running_cluster(work_dir / "outage", [NodeSpec(NODE, "a100-pcie-4", "static")], with_controller=False) as c:
        yield c


def healthz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_apiserver_stopped_for_30s_then_everything_converges(small_cluster: Cluster) -> None:
    kube = small_cluster.kube
    agent = small_cluster.agents[NODE]
    assert small_cluster.control_plane is not None and agent.plugin is not None
    apiserver = small_cluster.control_plane.processes["apiserver"]
    ensure_namespace(kube, NAMESPACE)
    kube.create(claim_template("share", NAMESPACE, claim_spec(request(memory="4Gi"))))
    kube.create(pod("before", NAMESPACE, template="share", node=NODE))
    before = wait_running(kube, NAMESPACE, "before")
    meta = before.claim["metadata"]
    ref = ClaimRef(NAMESPACE, meta["name"], meta["uid"])
    spec = agent.cdi_dir / f"gpu.tessera.dev-claim_{ref.uid}.json"
    published = device_names(slices_of(kube, NODE))
    dra_socket = agent.kubelet_dir / "plugins" / "gpu.tessera.dev" / "dra.sock"

    apiserver.stop()
    stopped = time.monotonic()
    answered = 0
    with PluginConnection(str(dra_socket), "v1.DRAPlugin", "gpu.tessera.dev", ()) as conn:
        while time.monotonic() - stopped < OUTAGE_S:
            answer = conn.prepare([ref])[ref.uid]
            assert "apiserver unreachable" in answer.error and "kubelet will retry" in answer.error, answer
            answered += 1
            assert agent.plugin.alive(), agent.plugin.tail()
            assert spec.exists(), "a prepared claim lost its CDI spec during the outage"
            assert healthz(agent.metrics_port)[0] == 200
            time.sleep(2.0)
        outage = time.monotonic() - stopped

        apiserver.start()
        returned = time.monotonic()
        wait_for(lambda: kube.healthy("/readyz"), timeout=120, interval=0.5, what="the apiserver to be ready again")
        stages = {"apiserver ready": time.monotonic() - returned}
        again = wait_for(lambda: (a := conn.prepare([ref])[ref.uid]) and not a.error and a, timeout=60,
                         what="the prepared claim to be readable again")  # fmt: skip
    assert [d["cdi_device_ids"] for d in again.devices] == [d["cdiDeviceIDs"] for c in before.prepared
                                                            for d in c["devices"]]  # fmt: skip
    stages["claim readable"] = time.monotonic() - returned

    # the publisher's watch came back: a deletion of its slices is repaired
    for s in slices_of(kube, NODE):
        kube.delete("ResourceSlice", s["metadata"]["name"])
    wait_for(lambda: device_names(slices_of(kube, NODE)) == published, timeout=90,
             what="tessera to republish its slices after the outage")
    stages["deleted slices republished"] = time.monotonic() - returned
    wait_for(lambda: healthz(agent.metrics_port)[1].strip() == "ok (publisher synced)", timeout=60,
             what="the plugin to report its publisher synced")
    print(f"real apiserver stopped {outage:.0f} s: {answered} prepares answered with a retryable error; "
          "seconds after it was started again: " + ", ".join(f"{k} {v:.1f}" for k, v in stages.items()))
