"""AdmissionReviews and ResourceClaims as the apiserver sends them, and an AdmissionHandler over
a simulated DGX H100 node."""

from __future__ import annotations

from controller.admission import AdmissionHandler
from controller.checks.inputs import CheckContext
from controller.cluster.inventory import DeviceIndex
from controller.cluster.sampledevices import sample_index
from controller.cluster.schema import published_schema
from driver.discovery import load_inventory
from driver.slices import build_slices
from tests.fakes.cluster import device_class

D = 'device.attributes["gpu.tessera.dev"]'
GPU_CLASS = device_class("gpu.tessera.dev", f'device.driver == "gpu.tessera.dev" && {D}.type == "gpu"')


def dgx_handler() -> AdmissionHandler:
    """An AdmissionHandler over one simulated DGX H100 node and the gpu.tessera.dev class."""
    slices = build_slices(load_inventory("node-a", simulate="dgx-h100-8"), mig_strategy="static")
    index = DeviceIndex.from_slices(slices)

    def context() -> CheckContext:
        return CheckContext(schema=published_schema(), samples=sample_index(), inventory=index,
                            classes={"gpu.tessera.dev": GPU_CLASS}, classes_complete=True)

    return AdmissionHandler(context)


def review(obj: dict, *, operation: str = "CREATE", old: dict | None = None, version: str = "v1") -> dict:
    kind = obj["kind"]
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0f1e2d3c-0000-4000-8000-000000000001",
            "kind": {"group": "resource.k8s.io", "version": version, "kind": kind},
            "resource": {"group": "resource.k8s.io", "version": version, "resource": kind.lower() + "s"},
            "operation": operation,
            "name": obj["metadata"].get("name", ""),
            "namespace": obj["metadata"].get("namespace", ""),
            "object": obj,
            "oldObject": old,
            "dryRun": False,
        },
    }


def claim(spec: dict, name: str = "c", kind: str = "ResourceClaim") -> dict:
    if kind == "ResourceClaimTemplate":
        spec = {"spec": spec}
    return {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": {"name": name, "namespace": "team-a"},
            "spec": spec}


def multicard_spec(total: str = "8Gi", count: int = 2) -> dict:
    return {"devices": {
        "requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.tessera.dev", "count": count}}],
        "config": [{"requests": ["gpus"], "opaque": {"driver": "gpu.tessera.dev", "parameters": {
            "apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"totalMemory": total}}}}],
    }}
