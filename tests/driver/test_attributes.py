"""The published attribute schema: complete per device type, valid for the API, for every built-in profile."""

from __future__ import annotations

from typing import Any

import pytest

from driver.attributes import (
    DEVICE_ATTRIBUTES,
    DEVICE_CAPACITIES,
    NUMA_NODE,
    PCI_BUS_ID,
    PCIE_ROOT,
    WHEN_KNOWN_ATTRIBUTES,
    AttributeValueError,
    clip_string,
    gpu_attributes,
    mig_attributes,
    to_semver,
    type_specific_attributes,
)
from driver.discovery import load_inventory
from driver.grammars import qualified_name_errors
from driver.semver import Version
from driver.simulated import builtin_profiles
from driver.slices import build_slices
from tests.builders.inventory import make_gpu, make_inventory


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("550.54.15", "550.54.15"),
        ("535.104.05", "535.104.5"),
        ("560.35.03", "560.35.3"),
        ("12.4", "12.4.0"),
        ("9.0", "9.0.0"),
        ("8", "8.0.0"),
        ("v12.4", "12.4.0"),
        ("31.0.15.3640", "31.0.15+3640"),
        (" 470.82.01 ", "470.82.1"),
    ],
)
def test_versions_become_strict_semver(raw: str, expected: str) -> None:
    assert to_semver(raw, "x") == expected
    assert Version.is_valid(expected)


@pytest.mark.parametrize("raw", ["", "abc", "12.x", "1..2", "550.54.15-beta"])
def test_unparseable_versions_name_the_field(raw: str) -> None:
    with pytest.raises(AttributeValueError) as info:
        to_semver(raw, "inventory.driver_version")
    assert info.value.field_path == "inventory.driver_version"
    assert "550.54.15" in info.value.message


def test_strings_longer_than_64_bytes_are_cut_on_a_character_boundary() -> None:
    long = "NVIDIA " + "é" * 40
    clipped = clip_string(long, "gpus[0].product_name")
    assert len(clipped.encode()) <= 64
    assert long.startswith(clipped)
    assert clip_string("NVIDIA H100", "x") == "NVIDIA H100"


def test_schema_keys_are_valid_qualified_names_and_kinds() -> None:
    for attrs in DEVICE_ATTRIBUTES.values():
        for name, (kind, description) in attrs.items():
            assert qualified_name_errors(name) == [], name
            assert kind in {"int", "bool", "string", "version"}
            assert description
    for name in DEVICE_CAPACITIES:
        assert qualified_name_errors(name) == []


def test_attributes_plus_capacities_stay_within_the_32_per_device_limit() -> None:
    for attrs in DEVICE_ATTRIBUTES.values():
        assert len(attrs) + len(WHEN_KNOWN_ATTRIBUTES) + len(DEVICE_CAPACITIES) <= 32


def test_type_specific_attributes_are_exactly_the_ones_the_design_names() -> None:
    assert type_specific_attributes() == {
        "uuid": ("gpu",),
        "migCapable": ("gpu",),
        "migEnabled": ("gpu",),
        "nvlinkPeers": ("gpu",),
        "profile": ("mig",),
        "placement": ("mig",),
        "parentUUID": ("mig",),
    }


def test_gpu_attributes_carry_the_inventory_facts() -> None:
    gpu = make_gpu(3, numa_node=-1, nvlink_peers=0, nvlink_island="solo-3", pci_bus_id="0000:3B:00.0")
    inv = make_inventory(gpu, driver_version="535.104.05", cuda_driver_version="12.2")
    attrs = gpu_attributes(inv, gpu)
    assert list(attrs) == list(DEVICE_ATTRIBUTES["gpu"])
    assert attrs["type"] == {"string": "gpu"}
    assert attrs["uuid"] == {"string": gpu.uuid}
    assert attrs["driverVersion"] == {"version": "535.104.5"}
    assert attrs["cudaDriverVersion"] == {"version": "12.2.0"}
    assert attrs["cudaComputeCapability"] == {"version": "9.0.0"}
    assert attrs["migCapable"] == {"bool": True}
    assert attrs["migEnabled"] == {"bool": False}
    assert attrs["numaNode"] == {"int": -1}
    assert attrs["nvlinkPeers"] == {"int": 0}
    assert attrs["nvlinkIsland"] == {"string": "solo-3"}
    assert attrs[PCI_BUS_ID] == {"string": "0000:3b:00.0"}
    assert attrs[PCIE_ROOT] == {"string": "pci0000:03"}


def test_mig_attributes_carry_the_partition_and_its_parent() -> None:
    gpu = make_gpu(1)
    attrs = mig_attributes(make_inventory(gpu), gpu, "2g.20gb", 4)
    assert list(attrs) == [*DEVICE_ATTRIBUTES["mig"], NUMA_NODE]
    assert attrs["type"] == {"string": "mig"}
    assert attrs["profile"] == {"string": "2g.20gb"}
    assert attrs["placement"] == {"int": 4}
    assert attrs["parentUUID"] == {"string": gpu.uuid}
    assert attrs["productName"] == {"string": gpu.product_name}
    assert "uuid" not in attrs


def test_an_invalid_cuda_version_is_reported_with_its_inventory_field() -> None:
    gpu = make_gpu(0)
    with pytest.raises(AttributeValueError, match=r"inventory\.cuda_driver_version"):
        gpu_attributes(make_inventory(gpu, cuda_driver_version="twelve"), gpu)


def _check_value(kind: str, value: dict[str, Any]) -> None:
    assert list(value) == [kind]
    raw = value[kind]
    if kind == "int":
        assert isinstance(raw, int) and not isinstance(raw, bool)
    elif kind == "bool":
        assert isinstance(raw, bool)
    else:
        assert isinstance(raw, str) and len(raw.encode()) <= 64
        if kind == "version":
            assert Version.is_valid(raw), raw


@pytest.mark.parametrize("strategy", ["static", "dynamic"])
@pytest.mark.parametrize("profile", builtin_profiles())
def test_every_device_of_every_profile_carries_its_whole_attribute_set(profile: str, strategy: str) -> None:
    slices = build_slices(load_inventory("node-a", simulate=profile), mig_strategy=strategy)
    seen_types = set()
    for obj in slices:
        for dev in obj["spec"].get("devices") or []:
            dtype = dev["attributes"]["type"]["string"]
            seen_types.add(dtype)
            schema = DEVICE_ATTRIBUTES[dtype]
            # the built-in profiles all report NUMA nodes, so the standard numaNode is there too
            assert set(dev["attributes"]) == set(schema) | set(WHEN_KNOWN_ATTRIBUTES), dev["name"]
            for name, (kind, _) in {**schema, **WHEN_KNOWN_ATTRIBUTES}.items():
                _check_value(kind, dev["attributes"][name])
            assert set(dev["capacity"]) == set(DEVICE_CAPACITIES)
    if strategy == "dynamic":
        # Under static a node in MIG mode without instances (h100-16-mig) rightly publishes nothing.
        assert seen_types, f"profile {profile} published no devices"


def test_the_builtin_profiles_exercise_both_device_types() -> None:
    types = set()
    for profile in builtin_profiles():
        for obj in build_slices(load_inventory("node-a", simulate=profile), mig_strategy="static"):
            types.update(d["attributes"]["type"]["string"] for d in obj["spec"].get("devices") or [])
    assert types == {"gpu", "mig"}


def test_the_standard_numa_node_is_published_beside_tesseras_own_where_the_gpu_has_one() -> None:
    gpu = make_gpu(2, numa_node=1)
    inv = make_inventory(gpu)
    for attrs in (gpu_attributes(inv, gpu), mig_attributes(inv, gpu, "1g.10gb", 0)):
        assert attrs[NUMA_NODE] == {"int": 1}
        assert attrs["numaNode"] == {"int": 1}
        assert qualified_name_errors(NUMA_NODE) == []


def test_the_standard_numa_node_is_omitted_where_the_platform_reports_none() -> None:
    # KEP-6072: a device without NUMA affinity carries no resource.kubernetes.io/numaNode, so matchAttribute
    # never pairs it with another such device; tessera's own numaNode still says -1
    gpu = make_gpu(2, numa_node=-1)
    inv = make_inventory(gpu)
    for attrs in (gpu_attributes(inv, gpu), mig_attributes(inv, gpu, "1g.10gb", 0)):
        assert NUMA_NODE not in attrs
        assert attrs["numaNode"] == {"int": -1}
