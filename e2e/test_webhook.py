"""tessera's admission webhook, registered with the real apiserver: what users see when they get it wrong."""

from __future__ import annotations

import json
from typing import Any

import pytest

from e2e.cluster import DRIVER, Cluster, NodeAgent
from e2e.kube import Kube, KubeError
from e2e.workloads import GiB, claim, claim_spec, consumed_memory, parse_quantity, pod, request, wait_running


def device_class(name: str, expression: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]}}


def rejected(kube: Kube, obj: dict[str, Any]) -> str:
    with pytest.raises(KubeError) as info:
        kube.create(obj, dry_run=True)
    assert info.value.status in (400, 403, 422), info.value
    return info.value.message


def test_device_class_with_a_misspelt_attribute_is_rejected_with_a_suggestion(controller: Cluster) -> None:
    message = rejected(controller.kube, device_class(
        "typo.gpu.tessera.dev", f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].prodcutName == "x"'))
    assert "productName" in message, message


def test_device_class_reading_a_mig_only_attribute_unguarded_is_rejected(controller: Cluster) -> None:
    expression = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].profile == "1g.10gb"'
    message = rejected(controller.kube, device_class("unguarded.gpu.tessera.dev", expression))
    assert "profile" in message, message


def test_device_class_matching_no_device_is_admitted_with_a_warning(controller: Cluster, dgx: NodeAgent) -> None:
    del dgx  # slices must exist for "matches nothing" to mean something
    kube = controller.kube
    kube.create(device_class("b200.gpu.tessera.dev", f'device.driver == "{DRIVER}" && '
                             f'device.attributes["{DRIVER}"].productName == "NVIDIA B200"'), dry_run=True)
    assert kube.last_warnings, "no warning for a class that matches no device"
    assert any("matches none" in w and "b200.gpu.tessera.dev" in w for w in kube.last_warnings), kube.last_warnings


def test_a_total_across_two_cards_lands_on_distinct_cards_under_the_request_the_user_named(
    controller: Cluster, dgx: NodeAgent, namespace: str
) -> None:
    """"8 GiB across 2 cards": the mutating webhook asks for 4 GiB on each of the request's two devices."""
    kube = controller.kube
    config = [{"requests": ["gpus"], "opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuConfig", "sharing": {"totalMemory": "8Gi"}}}}]
    stored = kube.create(claim("spread", namespace, claim_spec(request("gpus", count=2), config=config)))
    devices = stored["spec"]["devices"]
    [gpus] = devices["requests"]
    assert gpus["name"] == "gpus" and gpus["exactly"]["count"] == 2
    assert parse_quantity(gpus["exactly"]["capacity"]["requests"]["memory"]) == 4 * GiB
    assert devices["constraints"] == [{"requests": ["gpus"], "distinctAttribute": f"{DRIVER}/uuid"}]
    assert "totalMemory" not in json.dumps(devices["config"])
    assert json.loads(stored["metadata"]["annotations"][f"{DRIVER}/multi-card"]) == {
        "gpus": {"totalMemory": "8Gi", "cards": 2, "perCard": "4Gi", "sameNVLinkIsland": False}}
    assert not kube.last_warnings, kube.last_warnings

    # A container may keep naming the request: the allocation results carry that same name.
    spread = pod("spread", namespace, claim_name="spread", node=dgx.name)
    spread["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu", "request": "gpus"}]
    kube.create(spread)
    running = wait_running(kube, namespace, "spread")
    assert [r["request"] for r in running.results] == ["gpus", "gpus"]
    assert len(set(running.devices)) == 2, "the two 4 GiB halves must be on different cards"
    for r in running.results:
        assert r.get("shareID") and consumed_memory(r) == 4 * GiB
