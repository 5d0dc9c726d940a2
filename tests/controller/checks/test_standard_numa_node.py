"""The admission checks know `resource.kubernetes.io/numaNode`, the Kubernetes-standard attribute tessera
publishes beside its own numaNode on every GPU whose platform reports a NUMA node (KEP-6072)."""

from __future__ import annotations

from pathlib import Path

import yaml

from controller.checks.classes import check_device_class
from controller.checks.inputs import CheckContext
from controller.cluster.inventory import DeviceIndex
from controller.cluster.sampledevices import sample_index
from controller.cluster.schema import published_schema
from driver.discovery import load_inventory
from driver.slices import build_slices
from tests.fakes.cluster import device_class

S = 'device.attributes["resource.kubernetes.io"]'
NO_NUMA_PROFILE = {
    "description": "two T4s on a board that reports no NUMA node", "driverVersion": "550.54.15",
    "cudaDriverVersion": "12.4",
    "gpus": [{"count": 2, "productName": "Tesla T4", "brand": "Tesla", "architecture": "Turing",
              "cudaComputeCapability": "7.5", "memory": "15360Mi", "multiprocessors": 40, "numaNode": -1}],
}


def findings(expression: str, inventory: DeviceIndex | None = None) -> list[tuple[str, str]]:
    ctx = CheckContext(schema=published_schema(), samples=sample_index(), inventory=inventory)
    report = check_device_class(device_class("numa.gpu.tessera.dev", expression), ctx)
    return [(f.severity, f.message) for f in report.findings]


def test_the_standard_numa_node_is_a_known_attribute_of_both_device_types() -> None:
    schema = published_schema()
    assert schema.carried_by("resource.kubernetes.io", "numaNode") == ("gpu", "mig")
    assert schema.kinds[("resource.kubernetes.io", "numaNode")] == "int"
    assert findings(f'"numaNode" in {S} && {S}.numaNode == 0') == []
    assert findings(f"{S}.?numaNode.orValue(-1) == 0") == []


def test_a_misspelt_standard_numa_node_gets_a_did_you_mean() -> None:
    [(severity, message)] = findings(f"{S}.numa_node == 0")
    assert severity == "error"
    assert 'did you mean "numaNode"?' in message


def test_an_unguarded_read_is_warned_about_the_gpus_without_a_numa_node() -> None:
    [(severity, message)] = findings(f"{S}.numaNode == 0")
    assert severity == "warning"
    assert 'reads "resource.kubernetes.io/numaNode" (column 45) without a guard' in message
    assert f"{S}.?numaNode.orValue(-1)" in message


def test_a_live_gpu_without_a_numa_node_makes_the_unguarded_read_an_error(tmp_path: Path) -> None:
    profile = tmp_path / "no-numa.yaml"
    profile.write_text(yaml.safe_dump(NO_NUMA_PROFILE))
    index = DeviceIndex.from_slices(build_slices(load_inventory("board", simulate=str(profile)), mig_strategy="none"))
    errors = [m for severity, m in findings(f"{S}.numaNode == 0", index) if severity == "error"]
    assert errors and "fails at runtime on board/gpu-0" in errors[0] and "no such key: numaNode" in errors[0]
