"""The webhook warns about device tolerations that reach GPUs tessera tainted as unhealthy (docs/health.md)."""

from __future__ import annotations

from typing import Any

import pytest

from controller.admission import AdmissionHandler
from controller.checks.inputs import CheckContext
from controller.cluster.inventory import DeviceIndex
from controller.cluster.sampledevices import sample_index
from controller.cluster.schema import published_schema
from controller.cluster.taints import tolerates
from driver.discovery import load_inventory
from driver.slices import build_slices
from tests.builders.admission import GPU_CLASS, claim, review

LOST = {"key": "gpu.tessera.dev/gpu-lost", "value": "fallen-off-bus", "effect": "NoExecute",
        "timeAdded": "2026-11-25T13:00:00Z"}
XID = {"key": "gpu.tessera.dev/xid", "value": "94", "effect": "NoSchedule", "timeAdded": "2026-11-25T13:00:00Z"}


@pytest.fixture(scope="module")
def handler() -> AdmissionHandler:
    slices = build_slices(load_inventory("node-a", simulate="dgx-h100-8"), taints={3: [LOST], 5: [XID]})
    index = DeviceIndex.from_slices(slices)

    def context() -> CheckContext:
        return CheckContext(schema=published_schema(), samples=sample_index(), inventory=index,
                            classes={"gpu.tessera.dev": GPU_CLASS}, classes_complete=True)

    return AdmissionHandler(context)


def spec(*tolerations: dict[str, Any]) -> dict[str, Any]:
    return {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.tessera.dev", "tolerations": list(tolerations)}}]}}


def warnings(handler: AdmissionHandler, obj: dict[str, Any]) -> list[str]:
    body, _ = handler.review("/validate-resourceclaim", review(obj))
    assert body["response"]["allowed"] is True
    return list(body["response"].get("warnings") or [])


def test_a_keyless_exists_toleration_warns_and_names_the_tainted_devices_it_admits(handler: AdmissionHandler) -> None:
    [w] = warnings(handler, claim(spec({"operator": "Exists"})))
    assert w.startswith("spec.devices.requests[0].exactly.tolerations[0]: tolerates every device taint")
    assert "node-a/gpu-3 (gpu.tessera.dev/gpu-lost=fallen-off-bus:NoExecute)" in w
    assert "node-a/gpu-5 (gpu.tessera.dev/xid=94:NoSchedule)" in w


def test_tolerating_gpu_lost_warns_in_a_template_too(handler: AdmissionHandler) -> None:
    [w] = warnings(handler, claim(spec({"key": "gpu.tessera.dev/gpu-lost", "operator": "Exists"}),
                                  kind="ResourceClaimTemplate"))
    assert w.startswith("spec.spec.devices.requests[0].exactly.tolerations[0]: tolerates gpu.tessera.dev/gpu-lost")
    assert "node-a/gpu-3" in w and "gpu-5" not in w


def test_a_toleration_naming_the_taint_a_diagnostics_job_needs_is_quiet(handler: AdmissionHandler) -> None:
    assert warnings(handler, claim(spec({"key": "gpu.tessera.dev/xid", "operator": "Exists",
                                         "effect": "NoSchedule"}))) == []


@pytest.mark.parametrize(("toleration", "taint", "expected"), [
    ({"operator": "Exists"}, LOST, True),
    ({"operator": "Exists", "effect": "NoSchedule"}, LOST, False),
    ({"key": "gpu.tessera.dev/xid", "value": "94"}, XID, True),
    ({"key": "gpu.tessera.dev/xid", "value": "48"}, XID, False),
    ({"key": "gpu.tessera.dev/xid", "operator": "Exists"}, LOST, False),
])
def test_toleration_matching_follows_the_device_toleration_rules(toleration: dict[str, Any], taint: dict[str, Any],
                                                                  expected: bool) -> None:
    assert tolerates(toleration, taint) is expected


def test_a_device_held_back_by_a_taint_the_request_does_not_tolerate_is_not_listed_as_admitted() -> None:
    maintenance = {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"}
    slices = build_slices(load_inventory("node-a", simulate="dgx-h100-8"), taints={3: [LOST, maintenance], 4: [LOST]})
    index = DeviceIndex.from_slices(slices)
    handler = AdmissionHandler(lambda: CheckContext(schema=published_schema(), samples=sample_index(), inventory=index,
                                                    classes={"gpu.tessera.dev": GPU_CLASS}, classes_complete=True))
    [w] = warnings(handler, claim(spec({"key": "gpu.tessera.dev/gpu-lost", "operator": "Exists"})))
    assert "node-a/gpu-4 (gpu.tessera.dev/gpu-lost=fallen-off-bus:NoExecute)" in w
    assert "gpu-3" not in w, "the maintenance taint still keeps gpu-3 from this claim"
