"""`tessera explain` past the scheduler (issue 25): a pod whose claims are allocated but whose prepare keeps
failing is explained with kubelet's message and tessera's fix; the claim the scheduler makes for extended
resources is read (and built, before the scheduler has made it); DeviceTaintRules taint devices as they do
in the scheduler."""

from __future__ import annotations

import pytest

from controller.explain.explain import ClusterView, Explanation, explain_pod
from controller.explain.nodeside import PrepareFailure, prepare_failure, prepare_verdict
from controller.explain.render import render_json, render_text
from tests.fakes.cluster import FakeCluster, exactly

# kubelet 1.36's words (older kubelets wrote "for claim NAMESPACE/NAME")
KUBELET = ("Failed to prepare dynamic resources: prepare dynamic resources: NodePrepareResources failed for "
           "ResourceClaim held: ")
STALE = ("device 'gpu-9' is not on node node-a (this node has: gpu-0, gpu-1, gpu-2, gpu-3); the ResourceSlice is "
         "out of date, delete the claim's pod so it is scheduled again")
CONFIG = ("spec.devices.config[0].opaque.parameters.sharing: one MPS daemon serves the whole claim, so either all "
          "of its devices use strategy MPS or none")


@pytest.fixture
def cluster() -> FakeCluster:
    c = FakeCluster()
    c.publish("node-a", "a100-pcie-4")
    c.shipped_classes()
    return c


def view(c: FakeCluster) -> ClusterView:
    r = c.reader()
    return ClusterView(r.resource_slices(), r.device_classes(), r.resource_claims(), r.pods("default") or [],
                       r.nodes(), r.templates("default"), events=list(c.event_objects),
                       taint_rules=c.taint_rule_objects or [])


def bound(c: FakeCluster, name: str = "p") -> None:
    """Pod `name` bound to node-a with its claim allocated: kubelet's turn."""
    c.claim("held", exactly())
    c.allocate("held", ("node-a", "gpu-0"), pod=name)
    pod = c.pod(name, "held")
    pod["spec"]["nodeName"] = "node-a"


def test_a_prepare_that_keeps_failing_is_explained_with_kubelets_message_and_tesseras_fix(
        cluster: FakeCluster) -> None:
    bound(cluster)
    cluster.event("p", "FailedPrepareDynamicResources", KUBELET + STALE, count=5, node="node-a")
    e = explain_pod(view(cluster), "default", "p")
    assert not e.verdict.ok and e.verdict.step == "prepare"
    assert e.prepare == PrepareFailure("node-a", KUBELET + STALE, 5, "2026-01-01T00:00:00Z", "default/held", STALE)
    assert "kubelet on node-a cannot prepare claim default/held" in e.verdict.reason
    assert STALE in e.verdict.reason and "5 times so far" in e.verdict.reason
    assert e.verdict.fix.startswith("the claim holds devices node-a no longer publishes: delete pod default/p")
    text = render_text(e)
    assert f"  kubelet on node-a (5 times, last at 2026-01-01T00:00:00Z): {KUBELET + STALE}" in text
    assert "Why: every claim is allocated, but kubelet on node-a cannot prepare" in text
    assert "tessera's part is done" not in text
    assert render_json(e)["prepare"]["agentError"] == STALE


@pytest.mark.parametrize(("message", "fix"), [
    (KUBELET + CONFIG, "change the claim's GpuConfig"),
    ("Failed to prepare dynamic resources: NodePrepareResources failed for claim default/held: " + STALE,
     "the claim holds devices node-a no longer publishes"),
    ("Failed to prepare dynamic resources: plugin name gpu.tessera.dev not found in the list of registered DRA "
     "plugins", "start tessera's kubelet plugin on node-a"),
    ("Failed to prepare dynamic resources: NodePrepareResources failed: rpc error: code = DeadlineExceeded desc = "
     "context deadline exceeded", "check that the node agent on node-a runs"),
    ("Failed to prepare dynamic resources: something else", "read the log of tessera's node agent on node-a"),
])
def test_each_kind_of_prepare_failure_gets_its_fix(message: str, fix: str) -> None:
    pod = {"metadata": {"name": "p", "uid": "u"}, "spec": {"nodeName": "node-a"}, "status": {"phase": "Pending"}}
    event = {"reason": "FailedPrepareDynamicResources", "involvedObject": {"name": "p", "uid": "u"},
             "message": message}
    failure = prepare_failure(pod, [event])
    assert failure is not None
    assert prepare_verdict(failure, "default/p").fix.startswith(fix)


def test_an_old_failure_does_not_count_once_the_pod_got_past_it(cluster: FakeCluster) -> None:
    bound(cluster)
    cluster.event("p", "FailedPrepareDynamicResources", KUBELET + STALE, node="node-a")
    cluster.pod_objects[("default", "p")]["status"]["conditions"] = [
        {"type": "PodReadyToStartContainers", "status": "True"}]
    e = explain_pod(view(cluster), "default", "p")
    assert e.verdict.ok and e.prepare is None
    assert "every claim is allocated" in e.verdict.reason


def test_events_of_an_earlier_pod_of_the_same_name_are_ignored(cluster: FakeCluster) -> None:
    bound(cluster)
    event = cluster.event("p", "FailedPrepareDynamicResources", KUBELET + STALE, node="node-a")
    event["involvedObject"]["uid"] = "an-earlier-pod"
    assert explain_pod(view(cluster), "default", "p").verdict.ok


def with_gpus(pod: dict, limits: dict[str, str], container: int = 0) -> dict:
    pod["spec"]["containers"][container]["resources"] = {"limits": limits}
    return pod


def test_extended_resources_are_explained_before_the_scheduler_makes_their_claim(cluster: FakeCluster) -> None:
    for i in range(4):
        cluster.run_pod(f"h{i}", f"h{i}", ("node-a", f"gpu-{i}"))
    pod = cluster.pod("p")
    pod["spec"]["resourceClaims"] = []
    with_gpus(pod, {"cpu": "1", "gpu.tessera.dev/gpu": "2"})
    e = explain_pod(view(cluster), "default", "p")
    (claim,) = e.claims
    assert claim.ref == "default/p-extended-resources"
    assert "gpu.tessera.dev/gpu: 2 (container c)" in claim.origin
    (request,) = claim.requests
    assert (request.spec.ref, request.spec.class_name, request.spec.count) == (
        "container-0-request-1", "gpu.tessera.dev", 2)  # cpu sorts first
    assert e.verdict.step == "allocation" and "held by other claims" in e.verdict.reason


def test_the_claim_the_scheduler_made_for_extended_resources_is_read(cluster: FakeCluster) -> None:
    cluster.claim("p-extended-resources-x7k2", {"name": "container-0-request-0",
                                               "exactly": {"deviceClassName": "gpu.tessera.dev", "count": 1}})
    cluster.allocate("p-extended-resources-x7k2", ("node-a", "gpu-1"), pod="p", request="container-0-request-0")
    pod = with_gpus(cluster.pod("p", phase="Running"), {"gpu.tessera.dev/gpu": "1"})
    pod["spec"]["resourceClaims"] = []
    pod["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": "p-extended-resources-x7k2",
                                                    "requestMappings": []}
    e = explain_pod(view(cluster), "default", "p")
    (claim,) = e.claims
    assert claim.allocated and claim.ref == "default/p-extended-resources-x7k2"
    assert "claim made by the scheduler" in claim.origin
    assert e.verdict.ok


def test_a_pod_with_neither_claims_nor_extended_resources_is_not_tesseras(cluster: FakeCluster) -> None:
    pod = with_gpus(cluster.pod("p"), {"example.com/fpga": "1"})
    pod["spec"]["resourceClaims"] = []
    e: Explanation = explain_pod(view(cluster), "default", "p")
    assert "uses no ResourceClaim and no extended resource" in e.problem


def test_a_device_taint_rule_taints_devices_as_the_scheduler_sees_them(cluster: FakeCluster) -> None:
    cluster.taint_rule_objects = [{
        "apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule", "metadata": {"name": "maintenance"},
        "spec": {"deviceSelector": {"driver": "gpu.tessera.dev", "pool": "node-a"},
                 "taint": {"key": "example.com/maintenance", "value": "fans", "effect": "NoSchedule"}}}]
    cluster.claim("want", exactly())
    cluster.pod("p", "want")
    e = explain_pod(view(cluster), "default", "p")
    assert e.verdict.step == "taints"
    assert "example.com/maintenance=fans:NoSchedule (from DeviceTaintRule maintenance)" in e.verdict.reason
    assert "delete or narrow DeviceTaintRule maintenance" in e.verdict.fix


def test_a_device_taint_rule_for_another_pool_or_without_a_selector_taints_nothing(cluster: FakeCluster) -> None:
    taint = {"key": "example.com/maintenance", "effect": "NoSchedule"}
    cluster.taint_rule_objects = [
        {"metadata": {"name": "elsewhere"}, "spec": {"deviceSelector": {"pool": "node-z"}, "taint": taint}},
        {"metadata": {"name": "no-selector"}, "spec": {"taint": taint}},
    ]
    cluster.claim("want", exactly())
    cluster.pod("p", "want")
    assert explain_pod(view(cluster), "default", "p").verdict.ok
