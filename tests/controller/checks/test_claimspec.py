"""controller.checks.claimspec: a claim spec read once, the same way for the checks and `tessera explain`."""

from __future__ import annotations

from controller.checks.claimspec import claim_spec, constraints, request_names, request_path, requests
from controller.explain.requests import claim_plan

SPEC = {"devices": {
    "requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev", "count": 2, "adminAccess": True,
                                    "tolerations": [{"key": "k", "operator": "Exists"}, "junk"]}},
        "not an object",
        {"name": "accel", "firstAvailable": [
            {"name": "big", "deviceClassName": "gpu.tessera.dev", "allocationMode": "All"},
            {"name": "small", "deviceClassName": "mig.gpu.tessera.dev", "count": "two"}]},
    ],
    "constraints": [{"requests": ["accel"], "matchAttribute": "gpu.tessera.dev/uuid"}, {"requests": ["gpu"]}, 7],
}}


def test_requests_with_their_bodies_paths_counts_and_modes() -> None:
    gpu, accel = requests(SPEC)
    assert (gpu.name, gpu.path) == ("gpu", "spec.devices.requests[0]")
    (body,) = gpu.bodies
    assert (body.ref, body.path, body.count, body.mode, body.admin_access) == (
        "gpu", "spec.devices.requests[0].exactly", 2, "ExactCount", True)
    assert body.tolerations == ({"key": "k", "operator": "Exists"},)
    assert accel.path == "spec.devices.requests[2]"
    assert [(b.ref, b.base, b.sub, b.mode, b.count) for b in accel.bodies] == [
        ("accel/big", "accel", "big", "All", 0), ("accel/small", "accel", "small", "ExactCount", 1)]
    assert body.body is SPEC["devices"]["requests"][0]["exactly"]  # the rewrite edits the spec through it


def test_names_paths_and_constraints() -> None:
    assert request_names(SPEC) == ["gpu", "accel", "accel/big", "accel/small"]
    assert request_path(SPEC, "spec.spec", "accel/small") == "spec.spec.devices.requests[2].firstAvailable[1]"
    assert request_path(SPEC, "spec", "gpu") == "spec.devices.requests[0]"
    assert request_path(SPEC, "spec", "nope") == "spec.devices.requests"
    found, problems = constraints(SPEC)
    assert [(c.kind, c.requests) for c in found] == [("matchAttribute", ("accel",))]
    assert found[0].applies("accel/big") and not found[0].applies("gpu")
    assert problems == ["constraint 1 has neither matchAttribute nor distinctAttribute"]


def test_a_template_carries_its_claim_spec_one_level_down() -> None:
    assert claim_spec({"spec": {"spec": SPEC}}, "ResourceClaimTemplate") == (SPEC, "spec.spec")
    assert claim_spec({"spec": SPEC}, "ResourceClaim") == (SPEC, "spec")
    assert claim_spec({"spec": "junk"}, "ResourceClaimTemplate") == (None, "spec.spec")


def test_explain_plans_the_requests_the_checks_walk() -> None:
    classes = {n: {"metadata": {"name": n}, "spec": {}} for n in ("gpu.tessera.dev", "mig.gpu.tessera.dev")}
    plan = claim_plan("default/c", SPEC, classes)
    walked = [[(b.ref, b.mode, b.count) for b in r.alternatives] for r in requests(SPEC)]
    planned = [[(s.ref, s.mode, s.count) for s in g.alternatives] for g in plan.groups]
    assert planned == walked
    assert plan.constraints == tuple(constraints(SPEC)[0])
