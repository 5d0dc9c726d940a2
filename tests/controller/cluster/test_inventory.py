"""InventoryDevice's cached properties: computed on the first read of each device, then read from it."""

from __future__ import annotations

from typing import Any

import pytest

from controller.cluster import inventory
from controller.cluster.inventory import InventoryDevice

SPEC: dict[str, Any] = {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "productName": {"string": "H100"}},
                        "capacity": {"memory": {"value": "80Gi"}}}


def test_each_cached_property_is_computed_once_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[str] = []
    real = InventoryDevice.attribute

    def counting(self: InventoryDevice, domain: str, name: str) -> Any:
        reads.append(name)
        return real(self, domain, name)

    monkeypatch.setattr(InventoryDevice, "attribute", counting)
    one, two = (InventoryDevice("n", "n", "gpu.tessera.dev", SPEC) for _ in range(2))
    assert [one.device_type, one.device_type, one.product_name, one.product_name] == ["gpu", "gpu", "H100", "H100"]
    assert reads == ["type", "productName"]
    assert two.device_type == "gpu" and reads == ["type", "productName", "type"]  # per device, not per class
    assert one.memory == 80 << 30 and one.memory == 80 << 30


def test_the_descriptor_is_what_the_class_holds_and_keeps_the_docstring() -> None:
    descriptor = InventoryDevice.__dict__["device_type"]
    assert isinstance(descriptor, inventory.cached_property)
    assert InventoryDevice.device_type is descriptor
    assert descriptor.__doc__ == InventoryDevice.device_type.__doc__
