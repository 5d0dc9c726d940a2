"""DeviceClass rules: compile errors, unknown attributes with "did you mean", unguarded type-specific
reads, config decoding, and matching against the inventory with the nearest miss."""

from __future__ import annotations

import pytest

from controller.classchecks import check_device_class
from controller.context import CheckContext, class_targets_tessera
from controller.inventory import DeviceIndex
from controller.prototypes import prototype_index
from controller.schema import published_schema
from driver.discovery import load_inventory
from driver.slices import build_slices
from tests.test_webhook_fakecluster import device_class

D = 'device.attributes["gpu.tessera.dev"]'


@pytest.fixture(scope="module")
def inventory() -> DeviceIndex:
    slices = build_slices(load_inventory("node-a", simulate="dgx-h100-8"), mig_strategy="static")
    slices += build_slices(load_inventory("node-b", simulate="a100-pcie-4"), mig_strategy="dynamic")
    return DeviceIndex.from_slices(slices)


def context(inventory: DeviceIndex | None) -> CheckContext:
    return CheckContext(schema=published_schema(), prototypes=prototype_index(), inventory=inventory)


def check(*expressions: str, inventory: DeviceIndex | None = None, name: str = "x.gpu.tessera.dev", config=None):
    return check_device_class(device_class(name, *expressions, config=config), context(inventory))


def only(report):
    assert len(report.findings) == 1, report.findings
    return report.findings[0]


def test_compile_error_shows_expression_column_and_message():
    finding = only(check(f'{D}.type == '))
    assert finding.severity == "error"
    assert finding.path == "spec.selectors[0].cel.expression"
    assert "column 46" in finding.message
    assert "syntax error" in finding.message
    assert f' | {D}.type == ' in finding.message
    assert finding.message.rstrip().endswith("^")


def test_unknown_field_on_device_is_a_compile_error():
    finding = only(check('device.attribtes["gpu.tessera.dev"].type == "gpu"'))
    assert "undefined field 'attribtes'" in finding.message


def test_unknown_attribute_suggests_the_nearest_published_name():
    finding = only(check(f'{D}.prodName == "x"'))
    assert finding.path == "spec.selectors[0].cel.expression"
    assert 'tessera never publishes the attribute "prodName"' in finding.message
    assert 'did you mean "productName"?' in finding.message
    assert "docs/attributes.md" in finding.message


def test_unknown_attribute_without_a_close_name_still_points_at_the_docs():
    finding = only(check(f'{D}.zzzzzz == "x"'))
    assert "did you mean" not in finding.message
    assert "docs/attributes.md" in finding.message


def test_attribute_in_the_wrong_domain_names_the_right_one():
    finding = only(check(f'{D}.pciBusID == "0000:18:00.0"'))
    assert 'publishes "pciBusID" in domain "resource.kubernetes.io"' in finding.message
    assert 'device.attributes["resource.kubernetes.io"].pciBusID' in finding.message


def test_misspelled_domain_suggests_tesseras_domain():
    finding = only(check('device.attributes["gpu.tesera.dev"].type == "gpu"'))
    assert 'no domain "gpu.tesera.dev"; did you mean "gpu.tessera.dev"?' in finding.message


def test_unknown_capacity_suggests_memory():
    finding = only(check('device.capacity["gpu.tessera.dev"].mem.compareTo(quantity("1Gi")) > 0'))
    assert 'the capacity "mem"' in finding.message
    assert 'did you mean "memory"?' in finding.message


def test_unguarded_type_specific_read_is_rejected_with_the_guarded_form():
    finding = only(check(f'{D}.uuid.startsWith("GPU-")'))
    assert finding.severity == "error"
    assert 'reads "uuid" (column 38) without a guard, but only devices of type gpu carry it' in finding.message
    assert "on a mig device such as" in finding.message
    assert "no such key: uuid" in finding.message
    assert "aborts scheduling of every pod" in finding.message
    assert f'"uuid" in {D} && {D}.uuid' in finding.message
    assert f'{D}.?uuid.orValue("")' in finding.message
    assert f'{D}.type == "gpu" && ...' in finding.message


def test_unguarded_mig_only_read_names_mig_as_the_carrier():
    finding = only(check(f'{D}.profile == "1g.10gb"'))
    assert "only devices of type mig carry it" in finding.message
    assert "on a gpu device" in finding.message


@pytest.mark.parametrize(
    "expression",
    [
        f'{D}.type == "gpu" && {D}.uuid.startsWith("GPU-")',
        f'"uuid" in {D} && {D}.uuid.startsWith("GPU-")',
        f'has({D}.uuid) && {D}.uuid.startsWith("GPU-")',
        f'{D}.?uuid.orValue("") == "GPU-1"',
        f'cel.bind(g, {D}, g.type == "mig" && g.profile == "1g.10gb")',
    ],
)
def test_guarded_reads_pass(expression):
    assert check(expression).findings == ()


def test_a_type_test_in_an_earlier_selector_guards_a_later_one():
    report = check(f'{D}.type == "mig"', f'{D}.profile == "1g.10gb"')
    assert report.findings == ()


def test_a_type_test_in_a_later_selector_does_not_guard_an_earlier_one():
    finding = only(check(f'{D}.profile == "1g.10gb"', f'{D}.type == "mig"'))
    assert finding.path == "spec.selectors[0].cel.expression"


def test_class_of_another_driver_is_not_checked():
    obj = device_class("nic.example.com", 'device.attributes["nic.example.com"].speed > 10')
    assert not class_targets_tessera(obj)
    report = check_device_class(obj, context(None))
    assert not report.targets_tessera and report.findings == ()


def test_class_targets_tessera_by_name_selector_or_config():
    assert class_targets_tessera(device_class("gpu.tessera.dev"))
    assert class_targets_tessera(device_class("whatever", 'device.driver == "gpu.tessera.dev"'))
    cfg = [{"opaque": {"driver": "gpu.tessera.dev", "parameters": {}}}]
    assert class_targets_tessera(device_class("whatever", config=cfg))


def test_invalid_class_config_is_rejected_with_the_field_path():
    cfg = [{"opaque": {"driver": "gpu.tessera.dev", "parameters": {
        "apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 150}}}}}]
    finding = only(check(config=cfg))
    assert finding.path == "spec.config[0].opaque.parameters.sharing.mps.activeThreadPercentage"
    assert "150" in finding.message


def test_unknown_config_field_is_rejected():
    cfg = [{"opaque": {"driver": "gpu.tessera.dev", "parameters": {
        "apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharng": {}}}}]
    finding = only(check(config=cfg))
    assert finding.path == "spec.config[0].opaque.parameters.sharng"
    assert "did you mean 'sharing'" in finding.message


def test_total_memory_in_a_class_config_is_rejected():
    cfg = [{"opaque": {"driver": "gpu.tessera.dev", "parameters": {
        "apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"totalMemory": "8Gi"}}}}]
    finding = only(check(config=cfg))
    assert finding.path == "spec.config[0].opaque.parameters.sharing.totalMemory"
    assert "belongs in a ResourceClaim's config" in finding.message


def test_other_drivers_config_is_not_decoded():
    cfg = [{"opaque": {"driver": "nic.example.com", "parameters": {"anything": 1}}}]
    assert check(config=cfg).findings == ()


def test_class_is_matched_against_the_inventory(inventory):
    report = check(f'{D}.type == "gpu"', inventory=inventory)
    assert report.findings == ()
    assert report.match.per_node == {"node-a": 8, "node-b": 4}
    assert report.match.summary() == f"12 of {len(inventory)} devices on 2 nodes (node-a: 8, node-b: 4)"


def test_class_matching_nothing_warns_with_the_nearest_miss(inventory):
    report = check(
        f'device.driver == "gpu.tessera.dev" && {D}.type == "gpu" && {D}.productName == "NVIDIA A100 80GB"',
        inventory=inventory,
    )
    finding = only(report)
    assert finding.severity == "warning"
    assert finding.path == "spec.selectors"
    assert f"matches none of the {len(inventory)} tessera devices" in finding.message
    assert "nearest miss: node-a/gpu-0 (gpu, NVIDIA H100 80GB HBM3) fails" in finding.message
    assert f'`{D}.productName == "NVIDIA A100 80GB"`' in finding.message


def test_nearest_miss_prefers_the_device_failing_fewer_conditions(inventory):
    finding = only(check(f'{D}.productName == "NVIDIA A100-PCIE-40GB" && {D}.type == "gpu" && {D}.numaNode == 7',
                         inventory=inventory))
    assert "nearest miss: node-b/gpu-" in finding.message
    assert f"`{D}.numaNode == 7`" in finding.message


def test_no_warning_without_an_inventory():
    assert check(f'{D}.productName == "nope"').findings == ()


def test_runtime_error_on_a_live_device_is_rejected(inventory):
    finding = only(check(f"{D}.productName > 5", inventory=inventory))
    assert finding.severity == "error"
    assert "fails at runtime on node-a/gpu-0" in finding.message
    assert "No matching overloads" in finding.message or "no such overload" in finding.message.lower()


def test_selector_must_be_a_cel_expression():
    obj = {"metadata": {"name": "gpu.tessera.dev"}, "spec": {"selectors": [{"cel": {}}]}}
    finding = only(check_device_class(obj, context(None)))
    assert finding.path == "spec.selectors[0].cel.expression"
    assert "must be a non-empty CEL expression" in finding.message
