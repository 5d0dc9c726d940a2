"""The pure parts of the scale benchmark (benchmarks/scale): the node mix, the pods' claims, the fleet's
upgraded slices and the reading of the apiserver's request counters. Nothing timed, no cluster."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from benchmarks.scale import apimetrics, measure
from benchmarks.scale.fleet import UPGRADED_DRIVER_VERSION, node_slices, upgraded
from benchmarks.scale.nodemix import (
    CLAIM_CASES,
    FLEET,
    KWOK_ANNOTATION,
    apportion,
    kwok_node,
    plan_nodes,
    pod_cases,
    split,
    template_name,
)
from driver.poolvalidation import validate_pool

REPO = Path(__file__).resolve().parents[2]

# -- the node mix -----------------------------------------------------------------------------------


def test_a_thousand_nodes_are_exactly_600_dgx_300_a100_100_t4() -> None:
    counts = Counter(n.profile for n in plan_nodes(1000))
    assert counts == {"dgx-h100-8": 600, "a100-pcie-4": 300, "t4-4": 100}


def test_dgx_nodes_publish_dynamic_mig_and_the_others_static() -> None:
    strategies = {n.profile: n.mig_strategy for n in plan_nodes(10)}
    assert strategies == {"dgx-h100-8": "dynamic", "a100-pcie-4": "static", "t4-4": "static"}


def test_apportion_always_adds_up_to_the_total() -> None:
    for total in (0, 1, 2, 3, 7, 999, 1001, 4999):
        assert sum(apportion(total, [s.fraction for s in FLEET])) == total


def test_apportion_gives_the_leftover_to_the_largest_remainder() -> None:
    assert apportion(7, [0.6, 0.3, 0.1]) == [4, 2, 1]  # 4.2, 2.1, 0.7: the T4 share rounds up
    assert apportion(1, [0.6, 0.3, 0.1]) == [1, 0, 0]


@pytest.mark.parametrize("fractions", [[0.5, 0.4], [1.2, -0.2], []])
def test_apportion_refuses_fractions_that_are_not_a_split_of_one(fractions: list[float]) -> None:
    with pytest.raises(ValueError, match="add up to 1"):
        apportion(10, fractions)


def test_apportion_refuses_a_negative_node_count() -> None:
    with pytest.raises(ValueError, match="node count must be >= 0"):
        apportion(-1, [1.0])


def test_every_prefix_of_the_plan_keeps_the_mix() -> None:
    # a run stopped early (memory) still published a representative fleet
    plans = plan_nodes(1000)
    first = Counter(n.profile for n in plans[:100])
    assert first == {"dgx-h100-8": 60, "a100-pcie-4": 30, "t4-4": 10}


def test_node_names_are_unique_and_sort_in_plan_order() -> None:
    names = [n.name for n in plan_nodes(5000)]
    assert len(set(names)) == 5000
    assert names == sorted(names)


def test_kwok_takes_over_the_node_through_its_annotation() -> None:
    node = kwok_node("kwok-gpu-00001")
    assert node["metadata"]["annotations"] == {KWOK_ANNOTATION: "fake"}
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "kwok-gpu-00001"


def test_split_spreads_the_nodes_over_the_processes_without_loss() -> None:
    plans = plan_nodes(1001)
    parts = split(plans, 2)
    assert [len(p) for p in parts] == [501, 500]
    assert sorted(n.name for p in parts for n in p) == [n.name for n in plans]


def test_split_refuses_zero_processes() -> None:
    with pytest.raises(ValueError, match="publisher process count must be >= 1"):
        split(plan_nodes(3), 0)


# -- the pods' claims ---------------------------------------------------------------------------------


def test_pods_get_the_four_claim_kinds_in_turn() -> None:
    cases = pod_cases(2000)
    assert Counter(cases) == dict.fromkeys(CLAIM_CASES, 500)
    assert cases[:4] == list(CLAIM_CASES)


def test_pod_cases_need_at_least_one_case() -> None:
    with pytest.raises(ValueError, match="no claim cases"):
        pod_cases(3, ())


def test_template_names_are_valid_object_names() -> None:
    names = [template_name(c) for c in CLAIM_CASES]
    assert len(set(names)) == len(names)
    for name in names:
        assert name == name.lower() and name.replace("-", "").isalnum() and "--" not in name, name


def test_the_multi_card_case_asks_for_a_total_over_two_cards() -> None:
    devices = CLAIM_CASES["20Gi across 2 cards"]["devices"]
    assert devices["requests"][0]["exactly"]["count"] == 2
    assert devices["config"][0]["opaque"]["parameters"]["sharing"] == {"totalMemory": "20Gi"}


# -- the fleet's restart after a driver upgrade ---------------------------------------------------------


def test_upgraded_slices_change_every_devices_driver_version_and_stay_valid() -> None:
    before = node_slices("kwok-gpu-00000", "dgx-h100-8", "dynamic", upgrade=False)
    after = node_slices("kwok-gpu-00000", "dgx-h100-8", "dynamic", upgrade=True)
    devices = [d for s in after for d in s["spec"].get("devices") or []]
    assert devices and all(d["attributes"]["driverVersion"] == {"version": UPGRADED_DRIVER_VERSION} for d in devices)
    assert before != after
    assert validate_pool(after) == []  # the apiserver must accept them (a version like 580.95.05 is refused)


def test_upgraded_leaves_its_input_alone() -> None:
    before = node_slices("kwok-gpu-00000", "t4-4", "static", upgrade=False)
    version = before[0]["spec"]["devices"][0]["attributes"]["driverVersion"]
    upgraded(before)
    assert before[0]["spec"]["devices"][0]["attributes"]["driverVersion"] == version


# -- the apiserver's request counters -----------------------------------------------------------------

def _line(verb: str, code: str, value: int, resource: str = "resourceslices") -> str:
    # the labels the apiserver writes, in its order
    group = "resource.k8s.io" if resource == "resourceslices" else ""
    return (f'apiserver_request_total{{code="{code}",component="apiserver",group="{group}",resource="{resource}",'
            f'scope="resource",subresource="",verb="{verb}",version="v1"}} {value}')


METRICS = "\n".join([
    "# HELP apiserver_request_total [STABLE] Counter of apiserver requests",
    "# TYPE apiserver_request_total counter",
    _line("POST", "201", 10), _line("PUT", "200", 7), _line("PUT", "409", 2), _line("LIST", "429", 3),
    _line("GET", "429", 1, "nodes"),
    "# HELP apiserver_flowcontrol_rejected_requests_total [BETA] Requests rejected by API Priority and Fairness",
    "# TYPE apiserver_flowcontrol_rejected_requests_total counter",
    'apiserver_flowcontrol_rejected_requests_total{flow_schema="service-accounts",priority_level="workload-low",'
    'reason="queue-full"} 4',
    "",
])


def test_requests_are_counted_by_verb_resource_and_code() -> None:
    requests = apimetrics.parse_requests(METRICS)
    assert requests[("PUT", "resourceslices", "409")] == 2
    assert apimetrics.count_code(requests, "429") == 4
    assert apimetrics.count_code(requests, "429", "resourceslices") == 3
    assert apimetrics.parse_rejections(METRICS) == 4


def test_other_metrics_do_not_count_as_requests() -> None:
    assert apimetrics.parse_requests("# TYPE etcd_request_total counter\netcd_request_total{verb=\"GET\"} 5\n") == {}


def test_delta_is_what_happened_between_two_readings() -> None:
    before = apimetrics.parse_requests(METRICS)
    after = before.copy()
    after[("PUT", "resourceslices", "409")] += 5
    after[("DELETE", "resourceslices", "200")] = 1
    assert apimetrics.delta(before, after) == {("PUT", "resourceslices", "409"): 5,
                                               ("DELETE", "resourceslices", "200"): 1}


def test_by_verb_sorts_codes_into_ok_conflict_throttled_and_other() -> None:
    rows = apimetrics.by_verb(apimetrics.parse_requests(METRICS), "resourceslices")
    assert [(r.verb, r.total, r.ok, r.conflict, r.throttled, r.other) for r in rows] == [
        ("POST", 10, 10, 0, 0, 0), ("PUT", 9, 7, 2, 0, 0), ("LIST", 3, 0, 0, 3, 0)]


def test_last_increase_is_when_a_cumulative_count_last_went_up() -> None:
    assert apimetrics.last_increase([(0.0, 0), (1.0, 3), (2.0, 5), (3.0, 5)]) == 2.0
    assert apimetrics.last_increase([(0.0, 2), (1.0, 2)]) is None
    assert apimetrics.last_increase([]) is None


def test_scheduler_errors_are_counted_by_cause() -> None:
    from benchmarks.scale.measure import scheduler_errors

    log = ('E1128 "Error scheduling pod; retrying" err="running \\"DynamicResources\\" filter plugin: node n1: '
           'timed out trying to allocate devices"\nI1128 "Successfully bound pod to node"\n'
           'E1128 err="... timed out trying to allocate devices"\n')
    assert scheduler_errors(log) == {"timed out trying to allocate devices": 2}
    assert scheduler_errors("I1128 all fine\n") == {}


def test_the_static_variant_changes_only_the_dgx_nodes_and_drops_the_mig_pods() -> None:
    from benchmarks.scale.nodemix import claim_cases, fleet_with

    strategies = {n.profile: n.mig_strategy for n in plan_nodes(10, fleet_with("static"))}
    assert strategies == {"dgx-h100-8": "static", "a100-pcie-4": "static", "t4-4": "static"}
    assert "MIG 1g.10gb" not in claim_cases("static")
    assert claim_cases("dynamic") == tuple(CLAIM_CASES)


def test_an_unknown_dgx_mig_strategy_is_refused() -> None:
    from benchmarks.scale.nodemix import fleet_with

    with pytest.raises(ValueError, match="--dgx-mig must be none, static or dynamic"):
        fleet_with("mixed")


def test_the_plugin_flow_sends_the_node_agents_service_account_to_its_own_level() -> None:
    from benchmarks.scale.cluster import PLUGIN_NS, PLUGIN_SA, plugin_flow_objects

    level, schema = plugin_flow_objects()
    queuing = level["spec"]["limited"]["limitResponse"]["queuing"]
    assert queuing["handSize"] <= queuing["queues"]  # the apiserver refuses a hand larger than the deck
    assert schema["spec"]["priorityLevelConfiguration"]["name"] == level["metadata"]["name"]
    subject = schema["spec"]["rules"][0]["subjects"][0]["serviceAccount"]
    assert subject == {"name": PLUGIN_SA, "namespace": PLUGIN_NS}


def test_the_original_driver_version_is_what_the_simulated_profiles_publish() -> None:
    from benchmarks.scale.fleet import ORIGINAL_DRIVER_VERSION

    for profile, mig in (("dgx-h100-8", "dynamic"), ("a100-pcie-4", "static"), ("t4-4", "static")):
        devices = [d for s in node_slices("n", profile, mig, upgrade=False) for d in s["spec"].get("devices", [])]
        assert {d["attributes"]["driverVersion"]["version"] for d in devices} == {ORIGINAL_DRIVER_VERSION}


# -- the listing reference -------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "error"), [(measure.LIST_FLOOR, "ReadError: cannot read resourceslices"),
                                              (measure.FETCH_FLOOR, "Max retries exceeded")])
def test_the_references_reach_the_apiserver_through_tessera_s_client(tmp_path: Path, code: str, error: str) -> None:
    """The references run in a new interpreter, where a renamed reader would fail only at bench time: against
    a kubeconfig whose server refuses connections each must get as far as the read, and fail there."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }))
    proc = subprocess.run([sys.executable, "-c", code, str(kubeconfig)], capture_output=True, text=True,
                          cwd=REPO, check=False, timeout=60)
    assert proc.returncode == 1
    assert error in proc.stderr, proc.stderr[-2000:]


def test_the_controller_s_own_review_times_are_read_from_its_metrics() -> None:
    """The bench tells slow round trips from reviews the controller itself was slow to answer by reading its
    histogram before and after a phase: read from the controller's real registry, so a renamed metric fails."""
    from prometheus_client import generate_latest

    from controller.metrics import ControllerMetrics

    metrics = ControllerMetrics()
    metrics.observe("/validate-deviceclass", "DeviceClass", "allowed", 0.004)
    before = apimetrics.parse_review_buckets(generate_latest(metrics.registry).decode())
    for seconds in (0.003, 0.02, 0.03, 0.2, 0.4):
        metrics.observe("/validate-deviceclass", "DeviceClass", "allowed", seconds)
    metrics.observe("/validate-claim", "ResourceClaim", "allowed", 0.001)
    after = apimetrics.parse_review_buckets(generate_latest(metrics.registry).decode())
    assert apimetrics.slower_than(before, after, 0.025) == {"/validate-claim": (1, 0), "/validate-deviceclass": (5, 3)}
    assert apimetrics.slower_than(before, after, 0.1) == {"/validate-claim": (1, 0), "/validate-deviceclass": (5, 2)}
    assert apimetrics.slower_than(after, after, 0.1) == {}
    with pytest.raises(ValueError, match="not a bound"):
        apimetrics.slower_than(before, after, 0.03)


def test_the_apiserver_s_webhook_call_times_are_summed_by_webhook_name() -> None:
    def text(fast: int, slow: int) -> str:
        lines = ["# TYPE apiserver_admission_webhook_admission_duration_seconds histogram"]
        for operation in ("CREATE", "UPDATE"):
            labels = f'name="claims.tessera.dev",operation="{operation}",rejected="false",type="validating"'
            for le, count in (("0.025", fast), ("0.1", fast), ("0.5", fast + slow), ("+Inf", fast + slow)):
                lines.append(f'apiserver_admission_webhook_admission_duration_seconds_bucket{{{labels},le="{le}"}} '
                             f"{count}")
        return "\n".join(lines) + "\n"

    before = apimetrics.parse_buckets(text(1, 0), apimetrics.WEBHOOK_HISTOGRAM, "name")
    after = apimetrics.parse_buckets(text(5, 2), apimetrics.WEBHOOK_HISTOGRAM, "name")
    assert apimetrics.slower_than(before, after, 0.1) == {"claims.tessera.dev": (12, 4)}


def test_the_controller_s_snapshot_rebuilds_are_read_from_its_metrics() -> None:
    """The admission report counts the snapshot rebuilds that ran during a phase (a rebuild takes a core for
    about half a second at 1,000 nodes): read from the controller's real registry."""
    from prometheus_client import generate_latest

    from controller.metrics import ControllerMetrics

    metrics = ControllerMetrics()
    metrics.observe_build(3.0)  # the first snapshot, before the phase
    before = apimetrics.parse_buckets(generate_latest(metrics.registry).decode(), apimetrics.SNAPSHOT_HISTOGRAM, "")
    for seconds in (0.1, 0.4, 0.6):
        metrics.observe_build(seconds)
    after = apimetrics.parse_buckets(generate_latest(metrics.registry).decode(), apimetrics.SNAPSHOT_HISTOGRAM, "")
    assert apimetrics.slower_than(before, after, 0.25) == {"": (3, 2)}
    assert apimetrics.slower_than(after, after, 0.25) == {}


class _RecordingKube:
    """Applies recorded; the claim from the pod's template is there at once; no pod status to read."""

    def __init__(self) -> None:
        self.applied: list[dict[str, object]] = []

    def apply(self, obj: dict[str, object]) -> dict[str, object]:
        self.applied.append(obj)
        return obj

    def list(self, kind: str, namespace: str = "", **_: object) -> list[dict[str, object]]:
        return [{"metadata": {"name": "claim"}}] if kind == "ResourceClaim" else []

    def get(self, *args: object) -> dict[str, object]:
        raise AssertionError("a pod no scheduler takes is never waited on to be Unschedulable")


def test_the_pending_pod_for_the_idle_reads_names_no_running_scheduler() -> None:
    kube = _RecordingKube()
    measure.pending_pod(kube, scheduler=measure.NO_SCHEDULER)  # type: ignore[arg-type]
    template, pod = kube.applied
    assert template["kind"] == "ResourceClaimTemplate"
    assert pod["spec"]["schedulerName"] == measure.NO_SCHEDULER  # type: ignore[index]
    assert measure.NO_SCHEDULER != "default-scheduler"
