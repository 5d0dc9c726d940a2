"""Admission latency of the webhook's checks against a large inventory (same code path as a review,
without the HTTPS layer): 1,250 simulated DGX H100 nodes = 10,000 GPUs, plus 40 dynamic-MIG nodes.

Run: python -m benchmarks.webhook_bench [--nodes N] [--repeat R]. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from controller.admission import AdmissionHandler
from controller.checks.inputs import CheckContext
from controller.cluster.inventory import DeviceIndex
from controller.cluster.sampledevices import sample_index
from controller.cluster.schema import published_schema
from driver.discovery import load_inventory
from driver.slices import build_slices

A = 'device.attributes["gpu.tessera.dev"]'
GPU_CLASS = {
    "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.tessera.dev"},
    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "gpu.tessera.dev" && {A}.type == "gpu"'}}]},
}


def inventory(nodes: int) -> DeviceIndex:
    template = build_slices(load_inventory("template", simulate="dgx-h100-8"), mig_strategy="static")
    mig = build_slices(load_inventory("template-mig", simulate="h100-16-mig"), mig_strategy="dynamic")
    slices = []
    for n in range(nodes):
        for s in template:
            slices.append(renamed(s, f"dgx-{n:05d}"))
    for n in range(max(nodes // 32, 1)):
        for s in mig:
            slices.append(renamed(s, f"mig-{n:04d}"))
    return DeviceIndex.from_slices(slices)


def renamed(slice_: dict[str, Any], node: str) -> dict[str, Any]:
    spec = dict(slice_["spec"], nodeName=node, pool=dict(slice_["spec"]["pool"], name=node))
    return {"metadata": {"name": f"{node}-{id(slice_)}"}, "spec": spec}


def review(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "kind": {"group": "resource.k8s.io", "version": "v1", "kind": kind},
                        "operation": "CREATE", "object": obj}}


CASES = {
    "class: matches": review("DeviceClass", GPU_CLASS),
    "class: matches nothing (nearest miss)": review("DeviceClass", {
        "metadata": {"name": "b200.gpu.tessera.dev"},
        "spec": {"selectors": [{"cel": {"expression": f'{A}.type == "gpu" && {A}.productName == "NVIDIA B200"'}}]}}),
    "claim: 4Gi share": review("ResourceClaim", {
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "s", "exactly": {
            "deviceClassName": "gpu.tessera.dev", "capacity": {"requests": {"memory": "4Gi"}}}}]}}}),
    "claim: H100 by selector, count 4": review("ResourceClaim", {
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "g", "exactly": {
            "deviceClassName": "gpu.tessera.dev", "count": 4,
            "selectors": [{"cel": {"expression": f'{A}.productName.startsWith("NVIDIA H100")'}}]}}]}}}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    started = time.perf_counter()
    index = inventory(args.nodes)
    built = time.perf_counter() - started
    sample_devices = sample_index()
    handler = AdmissionHandler(lambda: CheckContext(
        schema=published_schema(), samples=sample_devices, inventory=index,
        classes={"gpu.tessera.dev": GPU_CLASS}, classes_complete=True))
    print(f"inventory: {len(index)} devices on {len(index.nodes)} nodes (built in {built:.2f} s)")
    print(f"{'review':40} {'median ms':>10} {'max ms':>10}  outcome")
    endpoint = {"DeviceClass": "/validate-deviceclass"}
    for name, body in CASES.items():
        path = endpoint.get(body["request"]["kind"]["kind"], "/validate-resourceclaim")
        times = []
        outcome = ""
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            _, verdict = handler.review(path, body)
            times.append((time.perf_counter() - t0) * 1000)
            outcome = verdict.outcome
        print(f"{name:40} {statistics.median(times):10.1f} {max(times):10.1f}  {outcome}")


if __name__ == "__main__":
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    main()
