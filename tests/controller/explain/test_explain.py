"""`tessera explain` against the fake apiserver: one Pending pod per failure kind, and the explanation
names the step and the device or claim in the way."""

from __future__ import annotations

import pytest

from controller.explain.explain import ClusterView, Explanation, NotFound, explain_claim, explain_pod
from tests.fakes.cluster import FakeCluster, exactly

D = 'device.attributes["gpu.tessera.dev"]'
ON_A = {"kubernetes.io/hostname": "node-a"}


@pytest.fixture
def cluster() -> FakeCluster:
    """node-a: 4x A100 40GB (NVLink pairs), node-b: 8x H100 (one island), node-m: one H100 with dynamic MIG."""
    c = FakeCluster()
    c.publish("node-a", "a100-pcie-4")
    c.publish("node-b", "dgx-h100-8")
    c.publish("node-m", "e2e/profiles/one-h100-mig.yaml", "dynamic")
    c.shipped_classes()
    return c


def view(c: FakeCluster) -> ClusterView:
    r = c.reader()
    return ClusterView(r.resource_slices(), r.device_classes(), r.resource_claims(), r.pods("default") or [],
                       r.nodes(), r.templates("default"))


def explain(c: FakeCluster, pod: str = "p") -> Explanation:
    return explain_pod(view(c), "default", pod)


def counts(e: Explanation, request: int = 0) -> dict[str, int]:
    f = e.claims[0].requests[request].funnel
    assert f is not None
    return {s.name: s.count for s in f.steps}


def test_all_matching_cards_taken_names_the_holders(cluster: FakeCluster) -> None:
    for i in range(4):
        cluster.run_pod(f"hold-{i}", f"hold-{i}", ("node-a", f"gpu-{i}"))
    cluster.claim("want", exactly())
    cluster.pod("p", "want", node_selector=ON_A)
    e = explain(cluster)
    assert not e.verdict.ok and e.verdict.step == "allocation"
    assert counts(e)["capacity"] == 4 and counts(e)["allocation"] == 0
    assert set(e.verdict.claims) == {f"default/hold-{i}" for i in range(4)}
    assert "default/hold-0" in e.verdict.pods and "node-a/gpu-0" in e.verdict.devices
    assert "delete pod default/hold-0 to free node-a/gpu-0" in e.verdict.fix


def test_memory_share_that_fits_on_no_card_names_the_largest_free_amount(cluster: FakeCluster) -> None:
    for i in range(4):
        cluster.run_pod(f"s-{i}", f"s-{i}", ("node-a", f"gpu-{i}"), memory="25Gi")
    cluster.claim("want", exactly(memory="20Gi", device_class="shared.gpu.tessera.dev"))
    cluster.pod("p", "want", node_selector=ON_A)
    e = explain(cluster)
    assert e.verdict.step == "capacity"
    assert "the largest free amount is 15Gi, on node-a/gpu-0" in e.verdict.reason
    assert "claim default/s-0 (pod default/s-0)" in e.verdict.reason
    assert e.verdict.fix.startswith("ask for 15Gi or less, or delete pod default/s-0")


def test_a_share_larger_than_every_card_is_a_capacity_failure_with_the_largest_card(cluster: FakeCluster) -> None:
    cluster.claim("want", exactly(memory="60Gi", device_class="shared.gpu.tessera.dev"))
    cluster.pod("p", "want", node_selector=ON_A)
    e = explain(cluster)
    assert e.verdict.step == "capacity"
    assert "has 40Gi of memory, the request asks 60Gi" in e.verdict.reason
    assert e.verdict.fix == "ask for at most 40Gi"


def test_a_capacity_key_spelled_with_the_domain_matches_nothing_as_in_the_scheduler(cluster: FakeCluster) -> None:
    cluster.claim("want", {"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev", "capacity": {
        "requests": {"gpu.tessera.dev/memory": "4Gi"}}}})
    cluster.pod("p", "want")
    e = explain(cluster)
    assert e.verdict.step == "capacity"
    assert "write capacity.requests.memory" in e.verdict.fix


def test_mig_counters_used_up_name_the_instance_that_holds_them(cluster: FakeCluster) -> None:
    cluster.run_pod("big", "big", ("node-m", "gpu-0-mig-7g80gb-0"))
    cluster.claim("want", exactly(device_class="mig.gpu.tessera.dev", selectors=[f'{D}.profile == "1g.10gb"']))
    cluster.pod("p", "want")
    e = explain(cluster)
    assert e.verdict.step == "counters"
    assert counts(e)["taints"] == 7 and counts(e)["counters"] == 0
    assert "held by node-m/gpu-0-mig-7g80gb-0 of claim default/big (pod default/big)" in e.verdict.reason
    assert e.verdict.claims == ("default/big",)


def test_a_whole_gpu_on_a_dynamic_mig_card_takes_every_mig_placement(cluster: FakeCluster) -> None:
    cluster.run_pod("whole", "whole", ("node-m", "gpu-0"))
    cluster.claim("want", exactly(device_class="mig.gpu.tessera.dev"))
    cluster.pod("p", "want")
    e = explain(cluster)
    assert e.verdict.step == "counters"
    assert "node-m/gpu-0 of claim default/whole" in e.verdict.reason


def test_match_attribute_that_no_node_satisfies_names_the_largest_group(cluster: FakeCluster) -> None:
    cluster.claim("want", exactly(count=3), constraints=[{"matchAttribute": "gpu.tessera.dev/nvlinkIsland"}])
    cluster.pod("p", "want", node_selector=ON_A)
    e = explain(cluster)
    assert e.verdict.step == "constraints"
    assert "the largest group is 2 on node-a" in e.verdict.reason
    assert e.verdict.fix.startswith("ask for at most 2 devices, or drop the matchAttribute")
    assert e.claims[0].tried == ("node-a",) and e.claims[0].found == ()


def test_distinct_attribute_that_no_node_satisfies(cluster: FakeCluster) -> None:
    cluster.claim("want", exactly(count=2), constraints=[{"distinctAttribute": "gpu.tessera.dev/productName"}])
    cluster.pod("p", "want")
    e = explain(cluster)
    assert e.verdict.step == "constraints"
    assert "distinctAttribute" in e.verdict.reason and "1 distinct value" in e.verdict.reason


def test_a_class_that_matches_nothing_suggests_classes_that_do(cluster: FakeCluster) -> None:
    cluster.add_class("t4.gpu.tessera.dev", f'device.driver == "gpu.tessera.dev" && {D}.productName.contains("T4")')
    cluster.claim("want", exactly(device_class="t4.gpu.tessera.dev"))
    cluster.pod("p", "want")
    e = explain(cluster)
    assert e.verdict.step == "class"
    assert counts(e) == {"driver": 31, "class": 0, "selectors": 0, "capacity": 0, "allocation": 0, "taints": 0,
                         "counters": 0}
    assert 'DeviceClass "t4.gpu.tessera.dev" matches none of the 31' in e.verdict.reason
    assert "gpu.tessera.dev (13)" in e.verdict.fix


def test_request_selectors_that_rule_out_every_device_show_what_the_nearest_device_has(cluster: FakeCluster) -> None:
    cluster.claim("want", exactly(selectors=[f'{D}.productName == "NVIDIA B200"']))
    cluster.pod("p", "want")
    e = explain(cluster)
    assert e.verdict.step == "selectors"
    assert counts(e)["class"] == 13
    assert "productName='NVIDIA A100-PCIE-40GB'" in e.verdict.fix


def test_a_taint_that_is_not_tolerated_names_the_taint_and_the_toleration(cluster: FakeCluster) -> None:
    taint = {"key": "example.com/repair", "value": "fan", "effect": "NoSchedule"}
    cluster.edit_device("node-a", "gpu-0", taints=[taint])
    cluster.claim("want", exactly())
    cluster.pod("p", "want", node_selector=ON_A)
    for i in (1, 2, 3):
        cluster.run_pod(f"h{i}", f"h{i}", ("node-a", f"gpu-{i}"))
    e = explain(cluster)
    # gpu-1..3 are taken (allocation), gpu-0 is left and tainted
    assert e.verdict.step == "taints"
    assert e.verdict.devices == ("node-a/gpu-0",)
    assert "example.com/repair=fan:NoSchedule" in e.verdict.reason
    assert 'key: example.com/repair, operator: Equal, value: "fan", effect: NoSchedule' in e.verdict.fix


def test_a_tolerated_taint_does_not_rule_the_device_out(cluster: FakeCluster) -> None:
    cluster.edit_device("node-a", "gpu-0", taints=[{"key": "example.com/repair", "effect": "NoExecute"}])
    cluster.claim("want", exactly(tolerations=[{"key": "example.com/repair", "operator": "Exists"}]))
    cluster.pod("p", "want", node_selector=ON_A)
    assert counts(explain(cluster))["taints"] == 4


def test_more_devices_than_any_node_has_is_a_count_failure(cluster: FakeCluster) -> None:
    cluster.claim("want", exactly(count=9))
    cluster.pod("p", "want")
    e = explain(cluster)
    assert e.verdict.step == "count"
    assert "the most any node has left for it is 8 (on node-b)" in e.verdict.reason


def test_a_pod_pending_for_another_reason_is_told_tesseras_part_is_fine(cluster: FakeCluster) -> None:
    cluster.claim("want", exactly(count=2), constraints=[{"matchAttribute": "gpu.tessera.dev/nvlinkIsland"}])
    cluster.pod("p", "want", message="0/3 nodes are available: 3 Insufficient cpu.")
    e = explain(cluster)
    assert e.verdict.ok
    assert "tessera's part is fine" in e.verdict.reason
    assert e.verdict.nodes == ("node-a", "node-b")
    assert [p.device.ref for p in e.claims[0].picks] == ["node-a/gpu-0", "node-a/gpu-1"]


def test_an_allocated_claim_is_reported_with_its_devices_and_pods(cluster: FakeCluster) -> None:
    cluster.run_pod("r", "held", ("node-b", "gpu-3"))
    e = explain(cluster, "r")
    assert e.verdict.ok and e.claims[0].allocated
    assert e.claims[0].reserved_for == ("default/r",)
    assert "every claim is allocated" in e.verdict.reason


def test_the_pod_may_only_run_where_no_tessera_device_is(cluster: FakeCluster) -> None:
    cluster.add_node("cpu-only")
    cluster.nodes["cpu-only"]["metadata"]["labels"] = {"kubernetes.io/hostname": "cpu-only"}
    cluster.claim("want", exactly())
    cluster.pod("p", "want", node_selector={"kubernetes.io/hostname": "cpu-only"})
    e = explain(cluster)
    assert e.verdict.step == "driver"
    assert "node-a, node-b, node-m" in e.verdict.fix


def test_a_missing_class_is_named_with_the_closest_existing_one(cluster: FakeCluster) -> None:
    cluster.claim("want", exactly(device_class="mig.gpu.tesera.dev"))
    cluster.pod("p", "want")
    e = explain(cluster)
    assert e.verdict.step == "class"
    assert 'did you mean "mig.gpu.tessera.dev"' in e.verdict.fix


def test_a_selector_runtime_error_is_reported_as_the_scheduler_would_abort(cluster: FakeCluster) -> None:
    cluster.add_class("any.gpu.tessera.dev", 'device.driver == "gpu.tessera.dev"')
    cluster.claim("want", exactly(device_class="any.gpu.tessera.dev", selectors=[f"{D}.profile == 'x'"]))
    cluster.pod("p", "want")
    e = explain(cluster)
    assert e.verdict.step == "runtime-error"
    assert "fails at runtime on node-a/gpu-0" in e.verdict.reason


def test_first_available_falls_back_to_the_second_alternative(cluster: FakeCluster) -> None:
    cluster.claim("want", {"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu.tessera.dev", "count": 5},
        {"name": "small", "deviceClassName": "gpu.tessera.dev", "count": 2}]})
    cluster.pod("p", "want", node_selector=ON_A)
    e = explain(cluster)
    assert e.verdict.ok
    assert {p.request for p in e.claims[0].picks} == {"gpu/small"}


def test_each_claim_fits_alone_but_not_together(cluster: FakeCluster) -> None:
    cluster.claim("one", exactly(count=3))
    cluster.claim("two", exactly(count=2))
    cluster.pod("p", "one", "two", node_selector=ON_A)
    e = explain(cluster)
    assert all(c.verdict.ok for c in e.claims)
    assert e.verdict.step == "pod"


def test_requests_of_one_claim_that_compete_for_the_same_card(cluster: FakeCluster) -> None:
    cluster.claim("want", exactly("a", memory="30Gi", device_class="shared.gpu.tessera.dev"),
                  exactly("b", memory="30Gi", device_class="shared.gpu.tessera.dev"),
                  constraints=[{"matchAttribute": "gpu.tessera.dev/uuid"}])
    cluster.pod("p", "want", node_selector=ON_A)
    e = explain(cluster)
    assert e.verdict.step == "constraints"  # one card cannot hold 60Gi, two cards have different uuids


def test_a_claim_created_from_a_template_not_yet_is_explained_from_the_template(cluster: FakeCluster) -> None:
    cluster.template_objects[("default", "t")] = {"metadata": {"name": "t", "namespace": "default"},
                                                  "spec": {"spec": {"devices": {"requests": [exactly(count=9)]}}}}
    pod = cluster.pod("p")
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "t"}]
    e = explain(cluster)
    assert "claim not created yet" in e.claims[0].origin
    assert e.verdict.step == "count"


def test_explain_claim_works_without_a_pod(cluster: FakeCluster) -> None:
    cluster.claim("want", exactly(count=3), constraints=[{"matchAttribute": "gpu.tessera.dev/nvlinkIsland"}])
    e = explain_claim(view(cluster), "default", "want")
    assert e.verdict.ok  # node-b has 8 GPUs on one island
    assert e.claims[0].origin == "used by no pod"


def test_unknown_pod_or_claim_is_not_found(cluster: FakeCluster) -> None:
    with pytest.raises(NotFound, match='pod "nope" not found'):
        explain(cluster, "nope")
    with pytest.raises(NotFound, match='resourceclaim "nope"'):
        explain_claim(view(cluster), "default", "nope")


def test_a_pod_without_claims_is_not_tesseras_business(cluster: FakeCluster) -> None:
    cluster.pod("p")
    assert "uses no ResourceClaim" in explain(cluster).problem


def test_requests_that_each_fit_but_not_together_on_the_only_card_they_accept(cluster: FakeCluster) -> None:
    uuid = cluster._device("node-a", "gpu-0")["attributes"]["uuid"]["string"]
    pick = [f'{D}.uuid == "{uuid}"']
    cluster.claim("want", exactly("a", memory="30Gi", device_class="shared.gpu.tessera.dev", selectors=pick),
                  exactly("b", memory="30Gi", device_class="shared.gpu.tessera.dev", selectors=pick))
    cluster.pod("p", "want")
    e = explain(cluster)
    assert [r.verdict.ok for r in e.claims[0].requests] == [True, True]
    assert e.verdict.step == "combined"


def test_the_funnel_counts_what_the_webhooks_match_counts(cluster: FakeCluster) -> None:
    """Selectors and capacity go through the webhook's own code: with nothing allocated, the devices left after
    the capacity step are exactly those controller.cluster.matching.match accepts."""
    from controller.checks.claimspec import RequestBody
    from controller.cluster.matching import Evaluator, Requirement, match
    from controller.explain.funnel import funnel
    from controller.explain.requests import request_spec

    v = view(cluster)
    bodies = [exactly()["exactly"], exactly(memory="30Gi", device_class="shared.gpu.tessera.dev")["exactly"],
              exactly(memory="50Gi", device_class="shared.gpu.tessera.dev")["exactly"],
              exactly(device_class="mig.gpu.tessera.dev", selectors=[f'{D}.profile.startsWith("3g")'])["exactly"],
              exactly(device_class="h100.gpu.tessera.dev", selectors=[f"{D}.numaNode == 1"])["exactly"]]
    for body in bodies:
        spec = request_spec(RequestBody("gpu", body, "spec.devices.requests[0].exactly"), v.classes)
        f = funnel(spec, v.index, None, v.state, Evaluator())
        webhook = match(Requirement(spec.all_conditions, spec.needs), v.index, Evaluator())
        assert f.step("capacity").count == webhook.total, body
        assert f.step("capacity").per_node == dict(webhook.per_node), body


def test_a_taken_static_mig_instance_is_held_by_its_claim() -> None:
    c = FakeCluster()
    c.publish("node-x", "mixed")  # gpu-1 in MIG mode with three static instances
    c.shipped_classes()
    c.run_pod("holder", "holder", ("node-x", "gpu-1-mig-3g40gb-0"))
    c.claim("want", exactly(device_class="mig.gpu.tessera.dev", selectors=[f'{D}.profile == "3g.40gb"']))
    c.pod("p", "want")
    e = explain(c)
    assert e.verdict.step == "allocation"
    assert e.verdict.devices == ("node-x/gpu-1-mig-3g40gb-0",) and e.verdict.pods == ("default/holder",)


@pytest.mark.parametrize(("toleration", "tolerated"), [
    ({"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}, True),
    ({"key": "k", "value": "v"}, True),  # Equal is the default operator, any effect
    ({"key": "k", "operator": "Equal", "value": "w"}, False),
    ({"key": "k", "operator": "Exists"}, True),
    ({"operator": "Exists"}, True),  # empty key with Exists tolerates everything
    ({"key": "other", "operator": "Exists"}, False),
    ({"key": "k", "operator": "Exists", "effect": "NoExecute"}, False),
])
def test_tolerations_follow_the_scheduler(toleration: dict[str, str], tolerated: bool) -> None:
    from controller.cluster.taints import tolerates

    assert tolerates(toleration, {"key": "k", "value": "v", "effect": "NoSchedule"}) is tolerated


def test_a_request_for_another_drivers_class_is_left_to_that_driver(cluster: FakeCluster) -> None:
    cluster.add_class("nic.example.com", 'device.driver == "nic.example.com"')
    cluster.claim("want", exactly(), exactly("nic", device_class="nic.example.com"))
    cluster.pod("p", "want")
    e = explain(cluster)
    assert e.verdict.ok
    nic = e.claims[0].requests[1]
    assert nic.funnel is None and "not tessera's" in nic.verdict.reason


def test_a_share_with_a_full_card_among_the_candidates_is_still_a_memory_failure(cluster: FakeCluster) -> None:
    """A card held whole has no room either: the answer is the largest free amount, not 'taken'."""
    cluster.run_pod("whole", "whole", ("node-a", "gpu-0"))
    cluster.run_pod("s1", "s1", ("node-a", "gpu-1"), memory="10Gi")
    cluster.run_pod("s2", "s2", ("node-a", "gpu-1"), memory="10Gi")
    cluster.run_pod("s3", "s3", ("node-a", "gpu-2"), memory="25Gi")
    cluster.run_pod("s4", "s4", ("node-a", "gpu-3"), memory="25Gi")
    cluster.claim("want", exactly(memory="25Gi"))
    cluster.pod("p", "want", node_selector=ON_A)
    e = explain(cluster)
    assert e.verdict.step == "capacity"
    assert "the largest free amount is 20Gi, on node-a/gpu-1" in e.verdict.reason
    assert e.verdict.claims == ("default/s1", "default/s2")
    assert "claim default/s1 (pod default/s1) and claim default/s2 (pod default/s2)" in e.verdict.reason


def test_a_missing_class_in_any_alternative_stops_the_claim(cluster: FakeCluster) -> None:
    """The scheduler validates every subrequest's class before it searches: one missing class is an error."""
    cluster.claim("want", {"name": "gpu", "firstAvailable": [
        {"name": "ok", "deviceClassName": "gpu.tessera.dev", "count": 1},
        {"name": "gone", "deviceClassName": "retired.gpu.tessera.dev", "count": 1}]})
    cluster.pod("p", "want")
    e = explain(cluster)
    assert e.verdict.step == "class"
    assert 'DeviceClass "retired.gpu.tessera.dev", which does not exist' in e.verdict.reason


def test_a_tessera_health_taint_says_the_gpu_is_unhealthy_and_tolerating_is_for_diagnostics(
    cluster: FakeCluster,
) -> None:
    taint = {"key": "gpu.tessera.dev/ecc-double-bit", "value": "double-bit", "effect": "NoExecute"}
    cluster.edit_device("node-a", "gpu-0", taints=[taint])
    cluster.claim("want", exactly())
    cluster.pod("p", "want", node_selector=ON_A)
    for i in (1, 2, 3):
        cluster.run_pod(f"h{i}", f"h{i}", ("node-a", f"gpu-{i}"))
    e = explain(cluster)
    assert e.verdict.step == "taints"
    assert e.verdict.fix.startswith("tessera marked the GPU unhealthy (gpu.tessera.dev/ecc-double-bit=double-bit:"
                                    "NoExecute; docs/health.md)")
    assert "for a diagnostics job only" in e.verdict.fix
