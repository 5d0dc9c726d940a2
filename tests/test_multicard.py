"""The multi-card rewrite: "N across M" becomes M per-card requests tied by distinctAttribute."""

from __future__ import annotations

import copy
import json

from controller.multicard import ANNOTATION, fmt_bytes, pending_findings, rewrite_claim_spec


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


def test_total_over_two_cards_becomes_two_requests_of_half_with_distinct_uuid():
    result = rewrite_claim_spec(spec_with(2, "8Gi"), "spec", ours)
    assert not result.findings
    devices = result.spec["devices"]
    assert devices["requests"] == [
        {"name": "gpus-0", "exactly": {"deviceClassName": "gpu.tessera.dev", "count": 1,
                                       "capacity": {"requests": {"memory": "4Gi"}}}},
        {"name": "gpus-1", "exactly": {"deviceClassName": "gpu.tessera.dev", "count": 1,
                                       "capacity": {"requests": {"memory": "4Gi"}}}},
    ]
    assert devices["constraints"] == [{"requests": ["gpus-0", "gpus-1"], "distinctAttribute": "gpu.tessera.dev/uuid"}]


def test_config_requests_are_renamed_and_multicard_fields_removed():
    result = rewrite_claim_spec(spec_with(2, "8Gi", island=True), "spec", ours)
    config = result.spec["devices"]["config"]
    assert config == [
        {"requests": ["gpus-0", "gpus-1"],
         "opaque": {"driver": "gpu.tessera.dev",
                    "parameters": {"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig"}}}
    ]


def test_same_nvlink_island_adds_match_attribute_over_the_new_requests():
    result = rewrite_claim_spec(spec_with(4, "16Gi", island=True), "spec", ours)
    constraints = result.spec["devices"]["constraints"]
    names = ["gpus-0", "gpus-1", "gpus-2", "gpus-3"]
    assert {"requests": names, "distinctAttribute": "gpu.tessera.dev/uuid"} in constraints
    assert {"requests": names, "matchAttribute": "gpu.tessera.dev/nvlinkIsland"} in constraints


def test_other_sharing_settings_survive_the_rewrite():
    spec = spec_with(2, "8Gi")
    spec["devices"]["config"][0]["opaque"]["parameters"]["sharing"]["mps"] = {"activeThreadPercentage": 50}
    result = rewrite_claim_spec(spec, "spec", ours)
    params = result.spec["devices"]["config"][0]["opaque"]["parameters"]
    assert params["sharing"] == {"mps": {"activeThreadPercentage": 50}}


def test_selectors_tolerations_and_position_are_kept():
    spec = spec_with(2, "8Gi", selectors=[{"cel": {"expression": "true"}}],
                     tolerations=[{"key": "k", "operator": "Exists"}])
    spec["devices"]["requests"].insert(0, {"name": "first", "exactly": {"deviceClassName": "other.example.com"}})
    spec["devices"]["requests"].append({"name": "last", "exactly": {"deviceClassName": "other.example.com"}})
    result = rewrite_claim_spec(spec, "spec", ours)
    names = [r["name"] for r in result.spec["devices"]["requests"]]
    assert names == ["first", "gpus-0", "gpus-1", "last"]
    share = result.spec["devices"]["requests"][1]["exactly"]
    assert share["selectors"] == [{"cel": {"expression": "true"}}]
    assert share["tolerations"] == [{"key": "k", "operator": "Exists"}]


def test_existing_constraints_naming_the_request_are_renamed():
    spec = spec_with(2, "8Gi")
    spec["devices"]["constraints"] = [{"requests": ["gpus"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}]
    result = rewrite_claim_spec(spec, "spec", ours)
    assert result.spec["devices"]["constraints"][0] == {
        "requests": ["gpus-0", "gpus-1"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}


def test_config_for_all_requests_stays_for_all():
    spec = spec_with(2, "8Gi")
    del spec["devices"]["config"][0]["requests"]
    result = rewrite_claim_spec(spec, "spec", ours)
    assert "requests" not in result.spec["devices"]["config"][0]
    assert len(result.spec["devices"]["requests"]) == 2


def test_input_is_not_modified():
    spec = spec_with(2, "8Gi")
    before = copy.deepcopy(spec)
    rewrite_claim_spec(spec, "spec", ours)
    assert spec == before


def test_rewrite_is_idempotent():
    once = rewrite_claim_spec(spec_with(2, "8Gi", island=True), "spec", ours)
    twice = rewrite_claim_spec(once.spec, "spec", ours)
    assert not twice.changed and not twice.findings
    assert twice.spec == once.spec


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
    assert finding.message.endswith("nearest valid totals: 4Gi (the smallest)")


def test_total_in_mebibytes_that_splits_into_whole_gib_is_accepted():
    result = rewrite_claim_spec(spec_with(2, "4096Mi"), "spec", ours)
    assert result.spec["devices"]["requests"][0]["exactly"]["capacity"] == {"requests": {"memory": "2Gi"}}


def test_count_one_with_total_becomes_a_single_share_keeping_the_name():
    result = rewrite_claim_spec(spec_with(1, "6Gi"), "spec", ours)
    [request] = result.spec["devices"]["requests"]
    assert request == {"name": "gpus", "exactly": {"deviceClassName": "gpu.tessera.dev", "count": 1,
                                                   "capacity": {"requests": {"memory": "6Gi"}}}}
    assert "constraints" not in result.spec["devices"] or result.spec["devices"]["constraints"] == []


def test_allocation_mode_all_with_total_is_rejected():
    spec = spec_with(2, "8Gi", allocationMode="All")
    del spec["devices"]["requests"][0]["exactly"]["count"]
    [finding] = rewrite_claim_spec(spec, "spec", ours).findings
    assert finding.path == "spec.devices.requests[0].exactly.allocationMode"
    assert "use allocationMode ExactCount with count" in finding.message


def test_total_together_with_capacity_request_is_rejected():
    spec = spec_with(2, "8Gi", capacity={"requests": {"memory": "4Gi"}})
    [finding] = rewrite_claim_spec(spec, "spec", ours).findings
    assert finding.path == "spec.devices.requests[0].exactly.capacity.requests"
    assert "use one" in finding.message


def test_split_names_that_clash_with_an_existing_request_are_rejected():
    spec = spec_with(2, "8Gi")
    spec["devices"]["requests"].append({"name": "gpus-1", "exactly": {"deviceClassName": "x.example.com"}})
    [finding] = rewrite_claim_spec(spec, "spec", ours).findings
    assert 'already has a request named "gpus-1"' in finding.message


def test_split_name_longer_than_a_dns_label_is_rejected():
    spec = spec_with(2, "8Gi")
    long_name = "g" * 62
    spec["devices"]["requests"][0]["name"] = long_name
    spec["devices"]["config"][0]["requests"] = [long_name]
    [finding] = rewrite_claim_spec(spec, "spec", ours).findings
    assert "too long to split" in finding.message


def test_requests_of_other_drivers_classes_are_left_alone():
    spec = spec_with(2, "8Gi")
    spec["devices"]["requests"][0]["exactly"]["deviceClassName"] = "nic.example.com"
    result = rewrite_claim_spec(spec, "spec", ours)
    assert not result.changed and not result.findings


def test_claim_without_multicard_settings_is_unchanged():
    spec = spec_with(2, None)
    result = rewrite_claim_spec(spec, "spec", ours)
    assert not result.changed
    assert result.spec == spec


def test_island_without_total_constrains_the_request_itself():
    result = rewrite_claim_spec(spec_with(2, None, island=True), "spec", ours)
    assert result.spec["devices"]["requests"][0]["name"] == "gpus"
    assert result.spec["devices"]["constraints"] == [
        {"requests": ["gpus"], "matchAttribute": "gpu.tessera.dev/nvlinkIsland"}]
    assert "sharing" not in result.spec["devices"]["config"][0]["opaque"]["parameters"]


def first_available_spec(count: int, config_requests: list[str]) -> dict:
    return {
        "devices": {
            "requests": [{"name": "accel", "firstAvailable": [
                {"name": "big", "deviceClassName": "gpu.tessera.dev", "count": count},
                {"name": "small", "deviceClassName": "mig.gpu.tessera.dev"},
            ]}],
            "config": [gpu_config({"totalMemory": "8Gi"}, config_requests)],
        }
    }


def test_multicard_inside_first_available_is_rejected_with_the_reason():
    [finding] = rewrite_claim_spec(first_available_spec(2, ["accel/big"]), "spec", ours).findings
    assert finding.path == "spec.devices.requests[0].firstAvailable[0]"
    assert "cannot rewrite inside firstAvailable" in finding.message
    assert "own `exactly` request" in finding.message


def test_single_card_total_inside_first_available_becomes_a_share():
    result = rewrite_claim_spec(first_available_spec(1, ["accel/big"]), "spec", ours)
    assert not result.findings
    subs = result.spec["devices"]["requests"][0]["firstAvailable"]
    assert subs[0] == {"name": "big", "deviceClassName": "gpu.tessera.dev", "count": 1,
                       "capacity": {"requests": {"memory": "8Gi"}}}
    assert subs[1] == {"name": "small", "deviceClassName": "mig.gpu.tessera.dev"}


def test_annotation_records_the_original_ask():
    result = rewrite_claim_spec(spec_with(2, "8Gi", island=True), "spec", ours)
    assert json.loads(result.annotation()) == {
        "gpus": {"totalMemory": "8Gi", "cards": 2, "perCard": "4Gi", "sameNVLinkIsland": True,
                 "requests": ["gpus-0", "gpus-1"]}}
    assert ANNOTATION == "gpu.tessera.dev/multi-card"


def test_warning_tells_containers_to_reference_the_claim():
    [warning] = rewrite_claim_spec(spec_with(2, "8Gi"), "spec", ours).warnings
    assert 'names request "gpus" in resources.claims[].request' in warning


def test_template_paths_are_used_in_errors():
    [finding] = rewrite_claim_spec(spec_with(3, "10Gi"), "spec.spec", ours).findings
    assert finding.path.startswith("spec.spec.devices.config[0]")


def test_pending_rewrite_is_an_error_for_the_validating_webhook():
    [finding] = pending_findings(spec_with(2, "8Gi"), "spec", ours)
    assert finding.severity == "error"
    assert finding.path == "spec.devices.requests[0]"
    assert "mutating webhook (/mutate-resourceclaim)" in finding.message


def test_rewritten_claim_has_nothing_pending():
    rewritten = rewrite_claim_spec(spec_with(2, "8Gi"), "spec", ours).spec
    assert pending_findings(rewritten, "spec", ours) == []


def test_fmt_bytes():
    assert fmt_bytes(4 << 30) == "4Gi"
    assert fmt_bytes(1536 << 20) == "1536Mi"
    assert fmt_bytes(1000) == "1000"


def test_total_that_is_not_whole_bytes_is_rejected():
    [finding] = rewrite_claim_spec(spec_with(2, "0.5"), "spec", ours).findings
    assert finding.path == "spec.devices.config[0].opaque.parameters.sharing.totalMemory"
    assert finding.message == "0.5 is not a whole number of bytes; write it like 16Gi"


def test_subrequest_with_total_and_its_own_capacity_is_rejected():
    spec = first_available_spec(1, ["accel/big"])
    spec["devices"]["requests"][0]["firstAvailable"][0]["capacity"] = {"requests": {"memory": "4Gi"}}
    [finding] = rewrite_claim_spec(spec, "spec", ours).findings
    assert finding.path == "spec.devices.requests[0].firstAvailable[0].capacity.requests"


def test_island_on_a_multi_device_subrequest_constrains_that_subrequest():
    spec = first_available_spec(2, ["accel/big"])
    spec["devices"]["config"][0]["opaque"]["parameters"]["sharing"] = {"sameNVLinkIsland": True}
    result = rewrite_claim_spec(spec, "spec", ours)
    assert result.spec["devices"]["constraints"] == [
        {"requests": ["accel/big"], "matchAttribute": "gpu.tessera.dev/nvlinkIsland"}]
