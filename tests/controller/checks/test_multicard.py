"""The multi-card rewrite: "N across M" keeps the request and asks for N/M on each of its M devices."""

from __future__ import annotations

import copy
import json

import pytest

from controller.checks.multicard import ANNOTATION, Rewrite, pending_findings, rewrite_claim_spec

UUID = {"distinctAttribute": "gpu.tessera.dev/uuid"}
ISLAND = {"matchAttribute": "gpu.tessera.dev/nvlinkIsland"}


def ours(name: str) -> bool:
    return name.endswith("gpu.tessera.dev")


def gpu_config(sharing: dict | None = None, requests: list[str] | None = None) -> dict:
    params: dict = {"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig"}
    if sharing is not None:
        params["sharing"] = sharing
    entry: dict = {"opaque": {"driver": "gpu.tessera.dev", "parameters": params}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def spec_with(count: int = 2, total: str | None = "8Gi", island: bool | None = None, **exactly) -> dict:
    sharing: dict = {}
    if total is not None:
        sharing["totalMemory"] = total
    if island is not None:
        sharing["sameNVLinkIsland"] = island
    return {
        "devices": {
            "requests": [
                {"name": "gpus", "exactly": {"deviceClassName": "gpu.tessera.dev", "count": count, **exactly}}
            ],
            "config": [gpu_config(sharing, ["gpus"])],
        }
    }


def bare_config() -> dict:
    return gpu_config(None, ["gpus"])


# -- the new shape ------------------------------------------------------------------------------


def test_total_over_two_cards_keeps_the_request_and_asks_half_per_device_on_distinct_uuids():
    result = rewrite_claim_spec(spec_with(2, "8Gi"), "spec", ours)
    assert not result.findings
    assert result.spec["devices"] == {
        "requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.tessera.dev", "count": 2,
                                                  "capacity": {"requests": {"memory": "4Gi"}}}}],
        "constraints": [{"requests": ["gpus"], **UUID}],
        "config": [bare_config()],
    }


def test_same_nvlink_island_adds_match_attribute_over_the_request():
    result = rewrite_claim_spec(spec_with(4, "16Gi", island=True), "spec", ours)
    devices = result.spec["devices"]
    assert devices["requests"][0]["exactly"]["count"] == 4
    assert devices["requests"][0]["exactly"]["capacity"] == {"requests": {"memory": "4Gi"}}
    assert devices["constraints"] == [{"requests": ["gpus"], **UUID}, {"requests": ["gpus"], **ISLAND}]


def test_eight_cards_of_two_gib():
    result = rewrite_claim_spec(spec_with(8, "16Gi"), "spec", ours)
    assert result.spec["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": "gpu.tessera.dev", "count": 8, "capacity": {"requests": {"memory": "2Gi"}}}


def test_config_keeps_its_request_reference_and_loses_the_multicard_fields():
    result = rewrite_claim_spec(spec_with(2, "8Gi", island=True), "spec", ours)
    assert result.spec["devices"]["config"] == [bare_config()]


def test_other_sharing_settings_survive_the_rewrite():
    spec = spec_with(2, "8Gi")
    spec["devices"]["config"][0]["opaque"]["parameters"]["sharing"]["mps"] = {"activeThreadPercentage": 50}
    result = rewrite_claim_spec(spec, "spec", ours)
    params = result.spec["devices"]["config"][0]["opaque"]["parameters"]
    assert params["sharing"] == {"mps": {"activeThreadPercentage": 50}}


def test_configs_of_other_drivers_are_left_alone():
    spec = spec_with(2, "8Gi")
    other = {"requests": ["gpus"], "opaque": {"driver": "nic.example.com", "parameters": {"totalMemory": "1"}}}
    spec["devices"]["config"].insert(0, other)
    result = rewrite_claim_spec(spec, "spec", ours)
    assert result.spec["devices"]["config"] == [other, bare_config()]


def test_selectors_tolerations_and_other_requests_are_kept_in_place():
    spec = spec_with(2, "8Gi", selectors=[{"cel": {"expression": "true"}}],
                     tolerations=[{"key": "k", "operator": "Exists"}])
    spec["devices"]["requests"].insert(0, {"name": "first", "exactly": {"deviceClassName": "other.example.com"}})
    spec["devices"]["requests"].append({"name": "last", "exactly": {"deviceClassName": "other.example.com"}})
    result = rewrite_claim_spec(spec, "spec", ours)
    requests = result.spec["devices"]["requests"]
    assert [r["name"] for r in requests] == ["first", "gpus", "last"]
    assert requests[0] == spec["devices"]["requests"][0] and requests[2] == spec["devices"]["requests"][2]
    share = requests[1]["exactly"]
    assert share["selectors"] == [{"cel": {"expression": "true"}}]
    assert share["tolerations"] == [{"key": "k", "operator": "Exists"}]


def test_existing_constraints_are_kept_and_ours_appended():
    spec = spec_with(2, "8Gi")
    pcie = {"requests": ["gpus"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}
    spec["devices"]["constraints"] = [pcie]
    result = rewrite_claim_spec(spec, "spec", ours)
    assert result.spec["devices"]["constraints"] == [pcie, {"requests": ["gpus"], **UUID}]


def test_a_constraint_the_claim_already_has_is_not_added_twice():
    spec = spec_with(2, "8Gi", island=True)
    spec["devices"]["constraints"] = [{"requests": ["gpus"], **UUID}]
    result = rewrite_claim_spec(spec, "spec", ours)
    assert result.spec["devices"]["constraints"] == [{"requests": ["gpus"], **UUID}, {"requests": ["gpus"], **ISLAND}]


def test_config_for_all_requests_stays_for_all():
    spec = spec_with(2, "8Gi")
    del spec["devices"]["config"][0]["requests"]
    result = rewrite_claim_spec(spec, "spec", ours)
    assert "requests" not in result.spec["devices"]["config"][0]
    assert result.spec["devices"]["constraints"] == [{"requests": ["gpus"], **UUID}]


def test_the_later_config_entry_wins_for_the_total():
    spec = spec_with(2, "8Gi")
    spec["devices"]["config"].append(gpu_config({"totalMemory": "12Gi"}, ["gpus"]))
    result = rewrite_claim_spec(spec, "spec", ours)
    assert result.spec["devices"]["requests"][0]["exactly"]["capacity"] == {"requests": {"memory": "6Gi"}}
    assert [r.total for r in result.rewrites] == ["12Gi"]


def test_input_is_not_modified():
    spec = spec_with(2, "8Gi", island=True)
    spec["devices"]["constraints"] = [{"requests": ["gpus"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}]
    before = copy.deepcopy(spec)
    rewrite_claim_spec(spec, "spec", ours)
    assert spec == before


def test_rewrite_is_idempotent():
    once = rewrite_claim_spec(spec_with(2, "8Gi", island=True), "spec", ours)
    twice = rewrite_claim_spec(once.spec, "spec", ours)
    assert not twice.changed and not twice.findings
    assert twice.spec == once.spec


def test_total_in_mebibytes_that_splits_into_whole_gib_is_accepted():
    result = rewrite_claim_spec(spec_with(2, "4096Mi"), "spec", ours)
    assert result.spec["devices"]["requests"][0]["exactly"]["capacity"] == {"requests": {"memory": "2Gi"}}


def test_count_one_with_total_becomes_a_single_share_without_constraints():
    result = rewrite_claim_spec(spec_with(1, "6Gi", island=True), "spec", ours)
    [request] = result.spec["devices"]["requests"]
    assert request == {"name": "gpus", "exactly": {"deviceClassName": "gpu.tessera.dev", "count": 1,
                                                   "capacity": {"requests": {"memory": "6Gi"}}}}
    assert result.spec["devices"]["constraints"] == []
    assert [r.describe() for r in result.rewrites] == ['request "gpus" becomes a share of 6Gi of one GPU']


def test_count_left_out_means_one_card_and_is_written_out():
    spec = spec_with(1, "6Gi")
    del spec["devices"]["requests"][0]["exactly"]["count"]
    result = rewrite_claim_spec(spec, "spec", ours)
    assert result.spec["devices"]["requests"][0]["exactly"]["count"] == 1


# -- rules --------------------------------------------------------------------------------------


def test_total_that_does_not_split_into_whole_gib_is_rejected_with_nearest_totals():
    result = rewrite_claim_spec(spec_with(3, "10Gi"), "spec", ours)
    assert not result.changed
    [finding] = result.findings
    assert finding.path == "spec.devices.config[0].opaque.parameters.sharing.totalMemory"
    assert finding.message == (
        "10Gi across 3 cards is not a whole number of GiB per card; nearest valid totals: 9Gi or 12Gi"
    )


def test_total_smaller_than_one_gib_per_card_offers_the_smallest_valid_total():
    [finding] = rewrite_claim_spec(spec_with(4, "2Gi"), "spec", ours).findings
    assert finding.message == "2Gi across 4 cards is not a whole number of GiB per card; nearest valid totals: " \
                              "4Gi (the smallest)"


def test_total_that_is_not_whole_bytes_is_rejected():
    [finding] = rewrite_claim_spec(spec_with(2, "0.5"), "spec", ours).findings
    assert finding.path == "spec.devices.config[0].opaque.parameters.sharing.totalMemory"
    assert finding.message == "0.5 is not a whole number of bytes; write it like 16Gi"


def test_allocation_mode_all_with_total_is_rejected():
    spec = spec_with(2, "8Gi", allocationMode="All")
    del spec["devices"]["requests"][0]["exactly"]["count"]
    result = rewrite_claim_spec(spec, "spec", ours)
    [finding] = result.findings
    assert finding.path == "spec.devices.requests[0].exactly.allocationMode"
    assert finding.message == (
        'request "gpus" uses allocationMode All, but sharing.totalMemory '
        "(spec.devices.config[0].opaque.parameters.sharing.totalMemory) spreads memory over a known number of "
        "cards: use allocationMode ExactCount with count: <number of cards>")
    assert result.spec == spec  # a rejected claim is returned as it came


def test_total_together_with_capacity_request_is_rejected():
    spec = spec_with(2, "8Gi", capacity={"requests": {"memory": "4Gi"}})
    [finding] = rewrite_claim_spec(spec, "spec", ours).findings
    assert finding.path == "spec.devices.requests[0].exactly.capacity.requests"
    assert finding.message == (
        'request "gpus" names capacity.requests and its config sets sharing.totalMemory '
        "(spec.devices.config[0].opaque.parameters.sharing.totalMemory); use one: totalMemory for a total "
        "across count cards, capacity.requests.memory for one share per card")


def test_every_bad_request_is_reported_and_nothing_is_rewritten():
    spec = spec_with(3, "10Gi")
    spec["devices"]["requests"].append(
        {"name": "more", "exactly": {"deviceClassName": "gpu.tessera.dev", "count": 2}})
    spec["devices"]["config"].append(gpu_config({"totalMemory": "8Gi"}, ["more"]))
    spec["devices"]["requests"].append(
        {"name": "all", "exactly": {"deviceClassName": "gpu.tessera.dev", "allocationMode": "All"}})
    spec["devices"]["config"].append(gpu_config({"totalMemory": "8Gi"}, ["all"]))
    result = rewrite_claim_spec(spec, "spec", ours)
    assert [f.path for f in result.findings] == [
        "spec.devices.config[0].opaque.parameters.sharing.totalMemory",
        "spec.devices.requests[2].exactly.allocationMode",
    ]
    assert not result.changed and result.spec == spec


def test_rewrite_that_would_pass_the_constraint_limit_is_rejected():
    spec = spec_with(2, "8Gi", island=True)
    spec["devices"]["constraints"] = [
        {"requests": ["gpus"], "matchAttribute": f"example.com/a{k}"} for k in range(31)]
    result = rewrite_claim_spec(spec, "spec", ours)
    [finding] = result.findings
    assert finding.path == "spec.devices.constraints"
    assert finding.message.startswith(
        "the multi-card rewrite needs 33 constraints, more than the 32 a claim may have; split the claim")
    assert not result.changed and result.spec == spec


def test_rewrite_that_reaches_exactly_the_constraint_limit_is_accepted():
    spec = spec_with(2, "8Gi", island=True)
    spec["devices"]["constraints"] = [
        {"requests": ["gpus"], "matchAttribute": f"example.com/a{k}"} for k in range(30)]
    result = rewrite_claim_spec(spec, "spec", ours)
    assert not result.findings and len(result.spec["devices"]["constraints"]) == 32


def test_constraints_that_are_not_a_list_are_rejected_instead_of_replaced():
    spec = spec_with(2, "8Gi")
    spec["devices"]["constraints"] = {"requests": ["gpus"]}
    result = rewrite_claim_spec(spec, "spec", ours)
    [finding] = result.findings
    assert finding.path == "spec.devices.constraints"
    assert finding.message == "must be a list of constraints, got dict"
    assert not result.changed and result.spec == spec


def test_requests_of_other_drivers_classes_are_left_alone():
    spec = spec_with(2, "8Gi")
    spec["devices"]["requests"][0]["exactly"]["deviceClassName"] = "nic.example.com"
    result = rewrite_claim_spec(spec, "spec", ours)
    assert not result.changed and not result.findings
    assert result.spec == spec


def test_claim_without_multicard_settings_is_unchanged():
    spec = spec_with(2, None)
    result = rewrite_claim_spec(spec, "spec", ours)
    assert not result.changed
    assert result.spec == spec


def test_claim_without_requests_is_unchanged():
    for spec in ({}, {"devices": {}}, {"devices": {"requests": "x"}}):
        result = rewrite_claim_spec(spec, "spec", ours)
        assert not result.changed and not result.findings


def test_island_without_total_constrains_the_request_itself():
    result = rewrite_claim_spec(spec_with(2, None, island=True), "spec", ours)
    assert result.spec["devices"]["requests"][0] == spec_with(2, None)["devices"]["requests"][0]
    assert result.spec["devices"]["constraints"] == [{"requests": ["gpus"], **ISLAND}]
    assert "sharing" not in result.spec["devices"]["config"][0]["opaque"]["parameters"]
    assert [r.describe() for r in result.rewrites] == ['request "gpus" keeps its 2 devices on one NVLink island']


def test_island_without_total_on_allocation_mode_all_constrains_all_devices():
    spec = spec_with(2, None, island=True, allocationMode="All")
    del spec["devices"]["requests"][0]["exactly"]["count"]
    result = rewrite_claim_spec(spec, "spec", ours)
    assert result.spec["devices"]["constraints"] == [{"requests": ["gpus"], **ISLAND}]
    assert [r.describe() for r in result.rewrites] == ['request "gpus" keeps all its devices on one NVLink island']


def test_island_on_a_single_device_is_nothing_to_rewrite():
    result = rewrite_claim_spec(spec_with(1, None, island=True), "spec", ours)
    assert not result.changed


def test_island_false_is_nothing_to_rewrite():
    result = rewrite_claim_spec(spec_with(2, None, island=False), "spec", ours)
    assert not result.changed


# -- firstAvailable -----------------------------------------------------------------------------


def first_available_spec(count: int, config_requests: list[str], sharing: dict | None = None) -> dict:
    return {
        "devices": {
            "requests": [{"name": "accel", "firstAvailable": [
                {"name": "big", "deviceClassName": "gpu.tessera.dev", "count": count},
                {"name": "small", "deviceClassName": "nic.example.com"},
            ]}],
            "config": [gpu_config(sharing or {"totalMemory": "8Gi"}, config_requests)],
        }
    }


def test_multicard_subrequest_is_rewritten_in_place_with_constraints_naming_it():
    result = rewrite_claim_spec(first_available_spec(2, ["accel/big"]), "spec", ours)
    assert not result.findings
    devices = result.spec["devices"]
    assert devices["requests"][0]["firstAvailable"] == [
        {"name": "big", "deviceClassName": "gpu.tessera.dev", "count": 2,
         "capacity": {"requests": {"memory": "4Gi"}}},
        {"name": "small", "deviceClassName": "nic.example.com"},
    ]
    assert devices["constraints"] == [{"requests": ["accel/big"], **UUID}]
    assert devices["config"] == [gpu_config(None, ["accel/big"])]
    assert [r.describe() for r in result.rewrites] == [
        'request "accel/big" (8Gi across 2 cards) asks for 4Gi on each of 2 distinct GPUs']


def test_multicard_subrequest_on_one_island():
    spec = first_available_spec(4, ["accel/big"], {"totalMemory": "16Gi", "sameNVLinkIsland": True})
    result = rewrite_claim_spec(spec, "spec", ours)
    assert result.spec["devices"]["constraints"] == [
        {"requests": ["accel/big"], **UUID}, {"requests": ["accel/big"], **ISLAND}]


def test_config_naming_the_whole_request_rewrites_each_tessera_subrequest():
    spec = first_available_spec(2, ["accel"])
    spec["devices"]["requests"][0]["firstAvailable"][1] = {"name": "one", "deviceClassName": "gpu.tessera.dev"}
    spec["devices"]["requests"][0]["firstAvailable"].append({"name": "nic", "deviceClassName": "nic.example.com"})
    result = rewrite_claim_spec(spec, "spec", ours)
    subs = result.spec["devices"]["requests"][0]["firstAvailable"]
    assert subs[0]["capacity"] == {"requests": {"memory": "4Gi"}} and subs[0]["count"] == 2
    assert subs[1]["capacity"] == {"requests": {"memory": "8Gi"}} and subs[1]["count"] == 1
    assert subs[2] == {"name": "nic", "deviceClassName": "nic.example.com"}
    assert result.spec["devices"]["constraints"] == [{"requests": ["accel/big"], **UUID}]


def test_single_card_total_inside_first_available_becomes_a_share():
    result = rewrite_claim_spec(first_available_spec(1, ["accel/big"]), "spec", ours)
    assert not result.findings
    subs = result.spec["devices"]["requests"][0]["firstAvailable"]
    assert subs[0] == {"name": "big", "deviceClassName": "gpu.tessera.dev", "count": 1,
                       "capacity": {"requests": {"memory": "8Gi"}}}
    assert subs[1] == {"name": "small", "deviceClassName": "nic.example.com"}
    assert result.spec["devices"]["constraints"] == []


def test_subrequest_with_total_and_its_own_capacity_is_rejected():
    spec = first_available_spec(1, ["accel/big"])
    spec["devices"]["requests"][0]["firstAvailable"][0]["capacity"] = {"requests": {"memory": "4Gi"}}
    [finding] = rewrite_claim_spec(spec, "spec", ours).findings
    assert finding.path == "spec.devices.requests[0].firstAvailable[0].capacity.requests"
    assert finding.message.startswith('request "accel/big" names capacity.requests')


def test_subrequest_with_total_and_allocation_mode_all_is_rejected():
    spec = first_available_spec(1, ["accel/big"])
    sub = spec["devices"]["requests"][0]["firstAvailable"][0]
    del sub["count"]
    sub["allocationMode"] = "All"
    [finding] = rewrite_claim_spec(spec, "spec", ours).findings
    assert finding.path == "spec.devices.requests[0].firstAvailable[0].allocationMode"


def test_subrequest_total_that_does_not_split_is_rejected():
    [finding] = rewrite_claim_spec(first_available_spec(3, ["accel/big"]), "spec", ours).findings
    assert finding.path == "spec.devices.config[0].opaque.parameters.sharing.totalMemory"
    assert finding.message.endswith("nearest valid totals: 6Gi or 9Gi")


def test_island_on_a_multi_device_subrequest_constrains_that_subrequest():
    result = rewrite_claim_spec(first_available_spec(2, ["accel/big"], {"sameNVLinkIsland": True}), "spec", ours)
    assert result.spec["devices"]["constraints"] == [{"requests": ["accel/big"], **ISLAND}]
    assert result.spec["devices"]["requests"][0]["firstAvailable"][0] == {
        "name": "big", "deviceClassName": "gpu.tessera.dev", "count": 2}


def test_first_available_rewrite_is_idempotent():
    once = rewrite_claim_spec(first_available_spec(2, ["accel/big"], {"totalMemory": "8Gi",
                                                                       "sameNVLinkIsland": True}), "spec", ours)
    twice = rewrite_claim_spec(once.spec, "spec", ours)
    assert not twice.changed and twice.spec == once.spec


# -- what the webhooks do with it ---------------------------------------------------------------


def test_annotation_records_the_original_ask():
    result = rewrite_claim_spec(spec_with(2, "8Gi", island=True), "spec", ours)
    assert json.loads(result.annotation()) == {
        "gpus": {"totalMemory": "8Gi", "cards": 2, "perCard": "4Gi", "sameNVLinkIsland": True}}
    assert ANNOTATION == "gpu.tessera.dev/multi-card"


def test_describe_says_what_the_request_now_asks_for():
    [rewrite] = rewrite_claim_spec(spec_with(2, "8Gi", island=True), "spec", ours).rewrites
    assert rewrite == Rewrite("gpus", 2, "4Gi", True, "8Gi")
    assert rewrite.describe() == (
        'request "gpus" (8Gi across 2 cards) asks for 4Gi on each of 2 distinct GPUs, all on one NVLink island')


def test_template_paths_are_used_in_errors():
    [finding] = rewrite_claim_spec(spec_with(3, "10Gi"), "spec.spec", ours).findings
    assert finding.path == "spec.spec.devices.config[0].opaque.parameters.sharing.totalMemory"


def test_pending_rewrite_is_an_error_for_the_validating_webhook():
    [finding] = pending_findings(spec_with(2, "8Gi"), "spec", ours)
    assert finding.severity == "error"
    assert finding.path == "spec.devices.requests[0]"
    assert finding.message == (
        "needs tessera's mutating webhook (/mutate-resourceclaim) to rewrite it (request \"gpus\" (8Gi across 2 "
        "cards) asks for 4Gi on each of 2 distinct GPUs), and that did not happen, so the scheduler would ignore "
        "sharing.totalMemory/sameNVLinkIsland; install the MutatingWebhookConfiguration of the tessera chart, or "
        "write capacity.requests.memory per card and the constraints yourself")


def test_pending_rewrite_of_a_subrequest_points_at_the_subrequest():
    [finding] = pending_findings(first_available_spec(2, ["accel/big"]), "spec", ours)
    assert finding.path == "spec.devices.requests[0].firstAvailable[0]"


def test_pending_findings_include_what_cannot_be_rewritten():
    [finding] = pending_findings(spec_with(3, "10Gi"), "spec", ours)
    assert finding.path == "spec.devices.config[0].opaque.parameters.sharing.totalMemory"


def test_rewritten_claims_have_nothing_pending():
    for spec in (spec_with(2, "8Gi", island=True), first_available_spec(2, ["accel/big"])):
        rewritten = rewrite_claim_spec(spec, "spec", ours).spec
        assert pending_findings(rewritten, "spec", ours) == []


# -- found by mutation testing (docs/reliability.md): paths the tests above did not pin down -----------


def test_requests_after_ones_that_are_skipped_are_still_rewritten():
    spec = spec_with(2, "8Gi")
    devices = spec["devices"]
    devices["requests"] = [
        "not an object",
        {"name": "nic", "exactly": {"deviceClassName": "nic.example.com", "count": 2}},
        {"name": "plain", "exactly": {"deviceClassName": "gpu.tessera.dev"}},  # no total: nothing to do
        *devices["requests"],
    ]
    result = rewrite_claim_spec(spec, "spec", ours)
    assert not result.findings
    assert result.spec["devices"]["requests"][:3] == devices["requests"][:3]
    assert result.spec["devices"]["requests"][3]["exactly"]["capacity"] == {"requests": {"memory": "4Gi"}}
    assert result.spec["devices"]["constraints"] == [{"requests": ["gpus"], **UUID}]


def test_a_bad_request_does_not_hide_the_next_one_or_crash_on_a_non_object_request():
    spec = spec_with(3, "10Gi")
    spec["devices"]["requests"].insert(0, "not an object")
    spec["devices"]["requests"].append({"name": "more", "exactly": {"deviceClassName": "gpu.tessera.dev", "count": 3}})
    spec["devices"]["config"].append(gpu_config({"totalMemory": "10Gi"}, ["more"]))
    result = rewrite_claim_spec(spec, "spec", ours)
    assert len(result.findings) == 2
    assert not result.changed and result.spec == spec


def test_a_refused_rewrite_returns_a_copy_that_shares_nothing_with_the_input():
    bad_total = spec_with(3, "10Gi")
    bad_constraints = spec_with(2, "8Gi")
    bad_constraints["devices"]["constraints"] = {"not": "a list"}
    too_many = spec_with(2, "8Gi")
    too_many["devices"]["constraints"] = [{"requests": [f"r{n}"], **UUID} for n in range(32)]
    for spec in (bad_total, bad_constraints, too_many):
        before = copy.deepcopy(spec)
        result = rewrite_claim_spec(spec, "spec", ours)
        assert result.findings and result.spec == before
        result.spec["devices"]["requests"][0]["exactly"]["count"] = 99  # a caller editing the answer
        assert spec == before


def test_another_drivers_config_keeps_its_own_total_memory():
    spec = spec_with(2, "8Gi")
    foreign = {"opaque": {"driver": "gpu.nvidia.com", "parameters": {"sharing": {"totalMemory": "8Gi"}}}}
    spec["devices"]["config"].append(foreign)
    result = rewrite_claim_spec(spec, "spec", ours)
    assert result.spec["devices"]["config"][-1] == foreign


def test_a_tessera_alternative_after_another_drivers_one_is_still_rewritten():
    spec = {"devices": {
        "requests": [{"name": "accel", "firstAvailable": [
            {"name": "nic", "deviceClassName": "nic.example.com", "count": 2},
            {"name": "multi", "deviceClassName": "gpu.tessera.dev", "count": 2},
        ]}],
        "config": [gpu_config({"totalMemory": "8Gi"}, ["accel"])],
    }}  # fmt: skip
    result = rewrite_claim_spec(spec, "spec", ours)
    assert not result.findings
    subs = result.spec["devices"]["requests"][0]["firstAvailable"]
    assert subs[0] == {"name": "nic", "deviceClassName": "nic.example.com", "count": 2}
    assert subs[1]["capacity"] == {"requests": {"memory": "4Gi"}}


# -- survivors of the mutation run (docs/reliability.md section 9) ---------------------------------


@pytest.mark.parametrize("count", [0, -1, True, "2", 1.5])
def test_a_count_that_is_not_a_whole_number_of_cards_is_denied_at_the_count(count):
    spec = spec_with(2, "8Gi")
    spec["devices"]["requests"][0]["exactly"]["count"] = count
    [finding] = rewrite_claim_spec(spec, "spec", ours).findings
    assert finding.path == "spec.devices.requests[0].exactly.count"
    assert finding.message == (
        f'request "gpus" asks for count: {json.dumps(count)}, but sharing.totalMemory '
        "(spec.devices.config[0].opaque.parameters.sharing.totalMemory) is spread over count cards: count must "
        "be a whole number of cards, at least 1")


def test_a_missing_count_is_one_card():
    spec = spec_with(2, "8Gi")
    del spec["devices"]["requests"][0]["exactly"]["count"]
    result = rewrite_claim_spec(spec, "spec", ours)
    assert not result.findings
    assert result.spec["devices"]["requests"][0]["exactly"]["count"] == 1
    assert result.spec["devices"]["requests"][0]["exactly"]["capacity"] == {"requests": {"memory": "8Gi"}}
    assert not result.spec["devices"].get("constraints")  # one card: nothing to keep distinct


def test_the_constraint_limit_error_names_both_settings_that_add_constraints():
    spec = spec_with(2, "8Gi", island=True)
    spec["devices"]["constraints"] = [
        {"requests": ["gpus"], "matchAttribute": f"example.com/a{k}"} for k in range(31)]
    [finding] = rewrite_claim_spec(spec, "spec", ours).findings
    assert finding.message == (
        "the multi-card rewrite needs 33 constraints, more than the 32 a claim may have; split the claim, or drop "
        "constraints that repeat what sharing.totalMemory and sameNVLinkIsland already ask for")


def test_pending_paths_skip_requests_and_alternatives_that_are_not_objects():
    spec = first_available_spec(2, ["accel/big"])
    spec["devices"]["requests"].insert(0, "not an object")
    spec["devices"]["requests"][1]["firstAvailable"].insert(0, 7)
    [finding] = pending_findings(spec, "spec", ours)
    assert finding.path == "spec.devices.requests[1].firstAvailable[1]"


def test_island_only_rewrite_of_a_request_without_a_count_is_nothing_to_do():
    spec = spec_with(2, None, island=True)
    del spec["devices"]["requests"][0]["exactly"]["count"]
    result = rewrite_claim_spec(spec, "spec", ours)
    assert not result.findings and not result.changed


def test_a_rewrite_strips_only_tessera_configs_that_carry_the_multicard_settings():
    spec = spec_with(2, "8Gi")
    keep_mps = gpu_config({"strategy": "MPS"}, ["gpus"])
    no_params = {"opaque": {"driver": "gpu.tessera.dev"}, "requests": ["gpus"]}
    spec["devices"]["config"] += [keep_mps, no_params, "not an object"]
    result = rewrite_claim_spec(spec, "spec", ours)
    assert not result.findings
    assert result.spec["devices"]["config"] == [bare_config(), keep_mps, no_params, "not an object"]
