"""The webhook admits a claim no device can serve today with a warning that names `tessera explain`."""

from __future__ import annotations

from controller.admission import AdmissionHandler
from tests.builders.admission import D, claim, review

B200_ONLY = [{"cel": {"expression": f'{D}.productName == "NVIDIA B200"'}}]
B200 = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev",
                                                             "selectors": B200_ONLY}}]}}


def test_a_claim_matching_no_device_points_to_tessera_explain_on_the_claim(handler: AdmissionHandler) -> None:
    body, _ = handler.review("/validate-resourceclaim", review(claim(B200, name="b200")))
    assert body["response"]["allowed"] is True
    [warning] = body["response"]["warnings"]
    assert "matches none of the 8 tessera devices" in warning
    assert warning.endswith("`tessera explain resourceclaim/b200 -n team-a` shows which step rules each device out")


def test_a_template_points_to_tessera_explain_on_a_pod_using_it(handler: AdmissionHandler) -> None:
    body, _ = handler.review("/validate-resourceclaim", review(claim(B200, kind="ResourceClaimTemplate")))
    [warning] = body["response"]["warnings"]
    assert "`tessera explain pod/<a pod using it> -n team-a`" in warning


def test_a_count_no_node_offers_points_to_tessera_explain(handler: AdmissionHandler) -> None:
    nine = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev", "count": 9}}]}}
    body, _ = handler.review("/validate-resourceclaim", review(claim(nine, name="nine")))
    [warning] = body["response"]["warnings"]
    assert "no node has more than 8 matching devices" in warning
    assert "`tessera explain resourceclaim/nine -n team-a`" in warning
