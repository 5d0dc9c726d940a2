"""The claim the scheduler makes for a pod's extended resources (Kubernetes 1.36, gate DRAExtendedResource).

A container that asks for `gpu.tessera.dev/gpu: 2` in its resources names no claim: the scheduler maps the
name to the DeviceClass whose `spec.extendedResourceName` it is (or to class C for the name
`deviceclass.resource.kubernetes.io/C`), and once it can allocate, creates one ResourceClaim for the pod and
records it in `pod.status.extendedResourceClaimStatus`. Before that there is no claim to read, so explain
builds the one the scheduler would: one ExactCount request per container (init containers first) and
resource, named `container-<i>-request-<j>` (j: the resource's place among the container's sorted resource
names), for the quantity asked.

Not modelled: resources that a node's allocatable lists (a device plugin serves them there, not DRA), and
the reuse of an init container's devices by later containers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controller.checks.classes import scheduler_pick
from driver.quantity import quantity_bytes_or_none

Obj = dict[str, Any]
CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"


@dataclass(frozen=True)
class ExtendedAsk:
    container: str
    resource: str
    count: int
    class_name: str
    request: str  # container-<i>-request-<j>

    def describe(self) -> str:
        return f"{self.resource}: {self.count} (container {self.container})"


def resource_classes(classes: Mapping[str, Obj]) -> dict[str, str]:
    """Extended resource name -> the DeviceClass the scheduler satisfies it from."""
    named: dict[str, list[Obj]] = {}
    for cls in classes.values():
        name = (cls.get("spec") or {}).get("extendedResourceName")
        if isinstance(name, str) and name:
            named.setdefault(name, []).append(cls)
    return {name: str(scheduler_pick(found)["metadata"]["name"]) for name, found in named.items()}


def extended_asks(pod: Mapping[str, Any], classes: Mapping[str, Obj]) -> list[ExtendedAsk]:
    """What the pod's containers ask for through extended resources that a DeviceClass answers."""
    by_resource = resource_classes(classes)
    spec = pod.get("spec") or {}
    containers = [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
    asks = []
    for i, container in enumerate(c for c in containers if isinstance(c, Mapping)):
        resources = container.get("resources") or {}
        # extended resources cannot be overcommitted: the apiserver makes requests equal to limits
        wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for j, resource in enumerate(sorted(wanted)):
            class_name = by_resource.get(resource)
            if class_name is None and resource.startswith(CLASS_PREFIX):
                candidate = resource[len(CLASS_PREFIX):]
                class_name = candidate if candidate in classes else None
            count = quantity_bytes_or_none(wanted[resource])
            if class_name and count:
                asks.append(ExtendedAsk(str(container.get("name", "")), resource, count, class_name,
                                        f"container-{i}-request-{j}"))
    return asks


def claim_spec_for(asks: list[ExtendedAsk]) -> Obj:
    """The ResourceClaimSpec the scheduler would create for these asks."""
    return {"devices": {"requests": [
        {"name": a.request, "exactly": {"deviceClassName": a.class_name, "allocationMode": "ExactCount",
                                        "count": a.count}} for a in asks]}}


def extended_claim_name(pod: Mapping[str, Any]) -> str:
    """The claim the scheduler created for the pod's extended resources ("" while there is none)."""
    status = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    return str(status.get("resourceClaimName") or "") if isinstance(status, Mapping) else ""
