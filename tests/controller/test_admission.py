"""AdmissionReview in, AdmissionReview out: operations, kinds, deny messages, warnings, JSONPatch."""

from __future__ import annotations

import base64
import copy
import json

import jsonpatch
import pytest

from controller.admission import AdmissionHandler, ReviewError
from controller.checks.inputs import CheckContext
from controller.cluster.sampledevices import sample_index
from controller.cluster.schema import published_schema
from tests.builders.admission import GPU_CLASS, D, claim, multicard_spec, review
from tests.fakes.cluster import device_class


def apply_patch(obj: dict, patch: list[dict]) -> dict:
    """`obj` after the webhook's patch, applied by an RFC 6902 implementation (a copy; `obj` is kept)."""
    assert {op["op"] for op in patch} <= {"add", "replace"}  # the webhook never removes, moves or tests
    patched: dict = jsonpatch.apply_patch(obj, patch)
    return patched


def test_response_echoes_uid_and_allows_a_good_class(handler):
    body, verdict = handler.review("/validate-deviceclass", review(GPU_CLASS))
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    assert body["response"] == {"uid": "0f1e2d3c-0000-4000-8000-000000000001", "allowed": True}
    assert verdict.outcome == "allowed"


def test_bad_class_is_denied_with_every_error_in_the_message(handler):
    bad = device_class("bad.gpu.tessera.dev", f'{D}.uuid == "x"', f'{D}.prodName == "y"')
    body, verdict = handler.review("/validate-deviceclass", review(bad))
    response = body["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 422
    message = response["status"]["message"]
    assert message.startswith('tessera rejected DeviceClass "bad.gpu.tessera.dev" (2 errors):\n')
    assert "spec.selectors[0].cel.expression: reads \"uuid\"" in message
    assert 'spec.selectors[1].cel.expression: device.attributes["gpu.tessera.dev"].prodName' in message
    assert verdict.outcome == "denied"


def test_class_matching_nothing_is_allowed_with_a_warning(handler):
    cls = device_class("b200.gpu.tessera.dev", f'{D}.type == "gpu" && {D}.productName == "NVIDIA B200"')
    body, verdict = handler.review("/validate-deviceclass", review(cls))
    assert body["response"]["allowed"] is True
    [warning] = body["response"]["warnings"]
    assert warning.startswith("spec.selectors: DeviceClass \"b200.gpu.tessera.dev\" matches none of the 8")
    assert "nearest miss: node-a/gpu-0" in warning
    assert verdict.outcome == "warned"


def test_class_update_with_unchanged_spec_is_not_rejudged(handler):
    bad = device_class("bad.gpu.tessera.dev", f'{D}.uuid == "x"')
    relabelled = copy.deepcopy(bad)
    relabelled["metadata"]["labels"] = {"team": "a"}
    body, _ = handler.review("/validate-deviceclass", review(relabelled, operation="UPDATE", old=bad))
    assert body["response"]["allowed"] is True


def test_class_update_with_changed_spec_is_checked(handler):
    good = device_class("x.gpu.tessera.dev", f'{D}.type == "gpu"')
    bad = device_class("x.gpu.tessera.dev", f'{D}.uuid == "x"')
    body, _ = handler.review("/validate-deviceclass", review(bad, operation="UPDATE", old=good))
    assert body["response"]["allowed"] is False


def test_delete_is_allowed_without_checks(handler):
    bad = device_class("bad.gpu.tessera.dev", "(")
    request = review(bad, operation="DELETE")
    request["request"]["object"] = None
    body, _ = handler.review("/validate-deviceclass", request)
    assert body["response"]["allowed"] is True


def test_claim_with_qualified_capacity_key_is_denied(handler):
    spec = {"devices": {"requests": [{"name": "share", "exactly": {
        "deviceClassName": "gpu.tessera.dev", "capacity": {"requests": {"gpu.tessera.dev/memory": "4Gi"}}}}]}}
    body, _ = handler.review("/validate-resourceclaim", review(claim(spec)))
    assert body["response"]["allowed"] is False
    assert 'tessera rejected ResourceClaim "team-a/c"' in body["response"]["status"]["message"]
    assert "spec.devices.requests[0].exactly.capacity.requests[gpu.tessera.dev/memory]" in (
        body["response"]["status"]["message"])


def test_template_errors_use_spec_spec_paths(handler):
    spec = {"devices": {"requests": [{"name": "share", "exactly": {
        "deviceClassName": "gpu.tessera.dev", "capacity": {"requests": {"memory": "1.5Mi"}}}}]}}
    body, _ = handler.review("/validate-resourceclaim", review(claim(spec, kind="ResourceClaimTemplate")))
    assert body["response"]["allowed"] is False
    assert "spec.spec.devices.requests[0].exactly.capacity.requests[memory]" in body["response"]["status"]["message"]


def test_claim_update_is_always_allowed(handler):
    spec = {"devices": {"requests": [{"name": "share", "exactly": {
        "deviceClassName": "gpu.tessera.dev", "capacity": {"requests": {"gpu.tessera.dev/memory": "4Gi"}}}}]}}
    obj = claim(spec)
    body, _ = handler.review("/validate-resourceclaim", review(obj, operation="UPDATE", old=obj))
    assert body["response"]["allowed"] is True


def test_mutation_rewrites_multicard_claim_with_a_json_patch(handler):
    obj = claim(multicard_spec())
    body, verdict = handler.review("/mutate-resourceclaim", review(obj))
    response = body["response"]
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    patched = apply_patch(obj, json.loads(base64.b64decode(response["patch"])))
    [gpus] = patched["spec"]["devices"]["requests"]
    assert gpus["name"] == "gpus" and gpus["exactly"]["count"] == 2
    assert gpus["exactly"]["capacity"] == {"requests": {"memory": "4Gi"}}
    assert patched["spec"]["devices"]["constraints"] == [
        {"requests": ["gpus"], "distinctAttribute": "gpu.tessera.dev/uuid"}]
    assert json.loads(patched["metadata"]["annotations"]["gpu.tessera.dev/multi-card"])["gpus"]["perCard"] == "4Gi"
    assert verdict.outcome == "mutated"
    assert "warnings" not in response  # the request keeps its name: nothing for containers to change
    # what the validating webhook then sees is clean
    body, _ = handler.review("/validate-resourceclaim", review(patched))
    assert body["response"]["allowed"] is True


def test_mutation_adds_to_existing_annotations(handler):
    obj = claim(multicard_spec())
    obj["metadata"]["annotations"] = {"owner": "team-a"}
    body, _ = handler.review("/mutate-resourceclaim", review(obj))
    patched = apply_patch(obj, json.loads(base64.b64decode(body["response"]["patch"])))
    assert patched["metadata"]["annotations"]["owner"] == "team-a"
    assert "gpu.tessera.dev/multi-card" in patched["metadata"]["annotations"]


def test_mutation_of_a_template_patches_spec_spec(handler):
    obj = claim(multicard_spec(), kind="ResourceClaimTemplate")
    body, _ = handler.review("/mutate-resourceclaim", review(obj))
    patch = json.loads(base64.b64decode(body["response"]["patch"]))
    assert patch[0]["path"] == "/spec/spec/devices"
    patched = apply_patch(obj, patch)
    [gpus] = patched["spec"]["spec"]["devices"]["requests"]
    assert gpus["exactly"]["capacity"] == {"requests": {"memory": "4Gi"}}


def test_mutation_denies_a_total_that_does_not_divide(handler):
    body, _ = handler.review("/mutate-resourceclaim", review(claim(multicard_spec("10Gi", 3))))
    assert body["response"]["allowed"] is False
    assert "nearest valid totals: 9Gi or 12Gi" in body["response"]["status"]["message"]
    assert "patch" not in body["response"]


def test_mutation_without_multicard_returns_no_patch(handler):
    spec = {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.tessera.dev"}}]}}
    body, _ = handler.review("/mutate-resourceclaim", review(claim(spec)))
    assert body["response"] == {"uid": "0f1e2d3c-0000-4000-8000-000000000001", "allowed": True}


def test_unmutated_multicard_claim_is_denied_by_validation(handler):
    body, _ = handler.review("/validate-resourceclaim", review(claim(multicard_spec())))
    assert body["response"]["allowed"] is False
    assert "/mutate-resourceclaim" in body["response"]["status"]["message"]


def test_other_api_versions_are_allowed_with_a_warning(handler):
    body, _ = handler.review("/validate-deviceclass", review(device_class("x.gpu.tessera.dev", "("), version="v1beta2"))
    assert body["response"]["allowed"] is True
    assert "resource.k8s.io/v1 only" in body["response"]["warnings"][0]


def test_wrong_kind_for_the_endpoint_is_allowed_with_a_warning(handler):
    body, _ = handler.review("/validate-resourceclaim", review(GPU_CLASS))
    assert body["response"]["allowed"] is True
    assert "expects ResourceClaim or ResourceClaimTemplate" in body["response"]["warnings"][0]


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "x"}},
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"},
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": ""}},
    ],
)
def test_malformed_reviews_are_refused(handler, body):
    with pytest.raises(ReviewError):
        handler.review("/validate-deviceclass", body)


def test_unknown_endpoint_is_refused(handler):
    with pytest.raises(ReviewError, match="unknown endpoint"):
        handler.review("/validate-pod", review(GPU_CLASS))


def test_objects_of_other_groups_are_allowed_with_a_warning(handler):
    request = review(GPU_CLASS)
    request["request"]["kind"]["group"] = "example.com"
    body, _ = handler.review("/validate-deviceclass", request)
    assert body["response"]["allowed"] is True
    assert body["response"]["warnings"] == ["tessera does not check DeviceClass objects of group example.com"]


def test_template_without_a_spec_is_denied_with_the_path(handler):
    obj = claim({}, kind="ResourceClaimTemplate")
    obj["spec"] = {"spec": "not an object"}
    body, _ = handler.review("/validate-resourceclaim", review(obj))
    assert body["response"]["allowed"] is False
    assert "spec.spec: must be an object" in body["response"]["status"]["message"]


def test_class_sharing_an_extended_resource_name_is_admitted_with_a_warning():
    taken = copy.deepcopy(GPU_CLASS)
    taken["metadata"]["name"] = "b200.gpu.tessera.dev"
    taken["spec"]["extendedResourceName"] = "gpu.tessera.dev/gpu"
    existing = copy.deepcopy(GPU_CLASS)
    existing["spec"]["extendedResourceName"] = "gpu.tessera.dev/gpu"
    existing["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"

    def context() -> CheckContext:
        return CheckContext(schema=published_schema(), samples=sample_index(), inventory=None,
                            classes={"gpu.tessera.dev": existing}, classes_complete=True)

    response = AdmissionHandler(context).review("/validate-deviceclass", review(taken))[0]["response"]
    assert response["allowed"] is True
    (warning,) = response["warnings"]
    assert warning.startswith('spec.extendedResourceName: DeviceClass "gpu.tessera.dev" already answers')
    assert 'get devices from "b200.gpu.tessera.dev"' in warning
