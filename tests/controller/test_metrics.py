"""Controller metrics (admission counts and latency, GPU memory per node) and the wired-up controller
(cache + webhook + /metrics) against the in-memory apiserver."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import urllib.request

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from controller.app import ControllerApp, parse_address
from controller.cluster.inventory import DeviceIndex
from controller.metrics import ControllerMetrics
from driver.discovery import load_inventory
from driver.slices import build_slices
from tests.builders.webhook import CA, admission_review
from tests.fakes.cluster import FakeCluster, device_class

D = 'device.attributes["gpu.tessera.dev"]'


def samples(registry) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def node_slices(node: str = "node-a") -> list[dict]:
    return build_slices(load_inventory(node, simulate="dgx-h100-8"), mig_strategy="static")


def share_claim(device: str, memory: str | None) -> dict:
    result = {"request": "r", "driver": "gpu.tessera.dev", "pool": "node-a", "device": device}
    if memory:
        result["shareID"] = "3f2c8a9e-5d41-4b7a-9e2f-6c0d1a2b3c4d"
        result["consumedCapacity"] = {"memory": memory}
    return {"metadata": {"name": f"c-{device}", "namespace": "default"},
            "status": {"allocation": {"devices": {"results": [result]}}}}


def test_admissions_are_counted_by_endpoint_kind_and_outcome():
    metrics = ControllerMetrics()
    metrics.observe("/validate-deviceclass", "DeviceClass", "denied", 0.003)
    metrics.observe("/validate-deviceclass", "DeviceClass", "denied", 0.004)
    values = samples(metrics.registry)
    key = (("endpoint", "/validate-deviceclass"), ("kind", "DeviceClass"), ("outcome", "denied"))
    assert values[("tessera_controller_admission_requests_total", key)] == 2
    count = ("tessera_controller_admission_duration_seconds_count", (("endpoint", "/validate-deviceclass"),))
    assert values[count] == 2


def test_gpu_memory_per_node_from_slices_and_claims():
    index = DeviceIndex.from_slices(node_slices())
    claims = [share_claim("gpu-0", "4Gi"), share_claim("gpu-1", None)]
    metrics = ControllerMetrics(lambda: (index, claims))
    values = samples(metrics.registry)
    node = (("node", "node-a"),)
    total = 8 * 81559 * 2**20
    assert values[("tessera_controller_gpu_memory_total_bytes", node)] == total
    assert values[("tessera_controller_gpu_memory_allocated_bytes", node)] == 4 * 2**30 + 81559 * 2**20
    assert values[("tessera_controller_gpu_memory_free_bytes", node)] == total - 4 * 2**30 - 81559 * 2**20
    assert values[("tessera_controller_devices", node)] == 8


def test_no_memory_series_before_the_inventory_is_known():
    metrics = ControllerMetrics(lambda: (None, []))
    assert not any(name.startswith("tessera_controller_gpu_memory") for name, _ in samples(metrics.registry))


@pytest.mark.parametrize(
    ("text", "address"),
    [
        (":8443", ("", 8443)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("[::1]:9401", ("::1", 9401)),
        ("0.0.0.0", ("0.0.0.0", 7)),
    ],
)
def test_parse_address(text, address):
    assert parse_address(text, 7) == address


@pytest.mark.parametrize("text", ["host:port", ":99999", "a:-1"])
def test_parse_address_rejects_garbage(text):
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        parse_address(text, 1)


def wait_for(predicate, timeout: float = 10.0) -> bool:
    pause = threading.Event()
    for _ in range(int(timeout / 0.02)):
        if predicate():
            return True
        pause.wait(0.02)
    return predicate()


@pytest.mark.slow
def test_controller_serves_reviews_with_the_live_inventory_and_exports_metrics(tmp_path):
    cluster = FakeCluster()
    for i, s in enumerate(node_slices()):
        s["metadata"]["name"] = f"node-a-gpu.tessera.dev-{i}"
        cluster.create_resource_slice(s)
    cluster.add_device_class(device_class("gpu.tessera.dev", f'{D}.type == "gpu"'))
    cluster.add_claim_watched(share_claim("gpu-0", "8Gi"))
    ca = CA()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    ca.issue(cert, key)
    app = ControllerApp(cluster, tls_cert=str(cert), tls_key=str(key), listen=("127.0.0.1", 0),
                        metrics_addr=("127.0.0.1", 0), watch_timeout=1, backoff_initial=0.01, backoff_max=0.05)
    app.start()
    try:
        assert app.cache.wait_synced(10)
        conn = http.client.HTTPSConnection("127.0.0.1", app.webhook.port, timeout=10,
                                           context=ssl.create_default_context(cadata=ca.pem().decode()))
        # a claim for the class known only through the cache, asking for more than any GPU holds
        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": "big", "namespace": "default"},
                 "spec": {"devices": {"requests": [{"name": "r", "exactly": {
                     "deviceClassName": "gpu.tessera.dev", "capacity": {"requests": {"memory": "100Gi"}}}}]}}}
        conn.request("POST", "/validate-resourceclaim", body=json.dumps(admission_review(claim)))
        response = json.loads(conn.getresponse().read())["response"]
        assert response["allowed"] is False
        assert "largest GPU in the cluster has (81559Mi on node-a/gpu-0" in response["status"]["message"]

        port = app._metrics_server.server_address[1]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert 'tessera_controller_gpu_memory_allocated_bytes{node="node-a"} 8.589934592e+09' in text
        assert ('tessera_controller_admission_requests_total{endpoint="/validate-resourceclaim",'
                'kind="ResourceClaim",outcome="denied"} 1.0') in text
        assert "tessera_controller_snapshot_build_seconds_count 1.0" in text  # the first snapshot

        # a node joins: the snapshot is rebuilt, and the rebuild counted
        extra = node_slices()[0]
        extra["metadata"]["name"] = "node-b-gpu.tessera.dev-0"
        extra["spec"]["nodeName"] = "node-b"
        cluster.create_resource_slice(extra)

        def builds() -> str:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert wait_for(lambda: "tessera_controller_snapshot_build_seconds_count 2.0" in builds())
    finally:
        cluster.close_watches()
        app.stop()


def test_the_controller_hands_the_gil_over_quickly_while_it_runs_and_restores_it(tmp_path):
    # reviews cross threads a dozen times; at CPython's 5 ms each crossing behind the snapshot warmer took 5 ms
    import sys

    from controller.app import REVIEW_SWITCH_INTERVAL_S

    ca = CA()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    ca.issue(cert, key)
    before = sys.getswitchinterval()
    app = ControllerApp(FakeCluster(), tls_cert=str(cert), tls_key=str(key), listen=("127.0.0.1", 0),
                        metrics_addr=None, watch_timeout=1, backoff_initial=0.01, backoff_max=0.05)
    app.start()
    try:
        assert sys.getswitchinterval() == pytest.approx(REVIEW_SWITCH_INTERVAL_S)
        assert before > REVIEW_SWITCH_INTERVAL_S
    finally:
        app.stop()
    assert sys.getswitchinterval() == pytest.approx(before)


def test_before_the_cache_syncs_reviews_skip_inventory_checks_and_readyz_fails(tmp_path):
    cluster = FakeCluster()
    cluster.fail_next(10_000, status=503, reason="ServiceUnavailable")
    ca = CA()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    ca.issue(cert, key)
    app = ControllerApp(cluster, tls_cert=str(cert), tls_key=str(key), listen=("127.0.0.1", 0), metrics_addr=None,
                        watch_timeout=1, backoff_initial=0.01, backoff_max=0.02)
    app.start()
    try:
        ctx = app.context()
        assert ctx.inventory is None and not ctx.classes_complete
        conn = http.client.HTTPSConnection("127.0.0.1", app.webhook.port, timeout=10,
                                           context=ssl.create_default_context(cadata=ca.pem().decode()))
        conn.request("GET", "/readyz")
        ready = conn.getresponse()
        assert (ready.status, ready.read()) == (503, b"inventory not synced\n")
        cls = device_class("b200.gpu.tessera.dev", f'{D}.type == "gpu" && {D}.productName == "NVIDIA B200"')
        conn.request("POST", "/validate-deviceclass", body=json.dumps(admission_review(cls)))
        response = json.loads(conn.getresponse().read())["response"]
        assert response == {"uid": "6a1c1f8e-0000-4000-8000-00000000beef", "allowed": True}
    finally:
        cluster.close_watches()
        app.stop()
