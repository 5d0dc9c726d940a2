"""DeviceClass rules: compile errors, unknown attributes with "did you mean", unguarded type-specific
reads, config decoding, and matching against the inventory with the nearest miss."""

from __future__ import annotations

import pytest

from controller.checks.classes import check_device_class
from controller.checks.inputs import CheckContext
from controller.checks.ownership import class_targets_tessera
from controller.cluster.inventory import DeviceIndex
from controller.cluster.sampledevices import sample_index
from controller.cluster.schema import published_schema
from driver.discovery import load_inventory
from driver.slices import build_slices
from tests.fakes.cluster import device_class

D = 'device.attributes["gpu.tessera.dev"]'


@pytest.fixture(scope="module")
def inventory() -> DeviceIndex:
    slices = build_slices(load_inventory("node-a", simulate="dgx-h100-8"), mig_strategy="static")
    slices += build_slices(load_inventory("node-b", simulate="a100-pcie-4"), mig_strategy="dynamic")
    return DeviceIndex.from_slices(slices)


def context(inventory: DeviceIndex | None) -> CheckContext:
    return CheckContext(schema=published_schema(), samples=sample_index(), inventory=inventory)


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


# --- extended resource names shared by two classes ----------------------------------------------------------

GPU_SELECTOR = f'device.driver == "gpu.tessera.dev" && {D}.type == "gpu"'


def er_class(name: str, resource: str | None, created: str | None = None, selector: str = GPU_SELECTOR):
    obj = device_class(name, selector)
    if resource is not None:
        obj["spec"]["extendedResourceName"] = resource
    if created is not None:
        obj["metadata"]["creationTimestamp"] = created
    return obj


def er_check(obj, *existing):
    ctx = context(None)
    ctx.classes = {c["metadata"]["name"]: c for c in existing}
    ctx.classes_complete = True
    return check_device_class(obj, ctx)


def test_a_new_class_taking_an_existing_extended_resource_name_warns_that_it_wins():
    old = er_class("gpu.tessera.dev", "nvidia.com/gpu", "2026-01-01T00:00:00Z")
    new = er_class("b200.gpu.tessera.dev", "nvidia.com/gpu", "2026-03-01T10:00:00Z")
    finding = only(er_check(new, old))
    assert finding.severity == "warning"
    assert finding.path == "spec.extendedResourceName"
    assert 'DeviceClass "gpu.tessera.dev" already answers the extended resource "nvidia.com/gpu"' in finding.message
    assert 'pods asking for "nvidia.com/gpu" get devices from "b200.gpu.tessera.dev"' in finding.message


def test_updating_the_older_class_warns_that_the_newer_one_keeps_the_name():
    newer = er_class("b200.gpu.tessera.dev", "nvidia.com/gpu", "2026-03-01T10:00:00Z")
    older = er_class("gpu.tessera.dev", "nvidia.com/gpu", "2026-01-01T00:00:00Z")
    assert 'get devices from "b200.gpu.tessera.dev"' in only(er_check(older, newer)).message


def test_classes_created_in_the_same_second_resolve_to_the_name_that_sorts_first():
    a = er_class("a.gpu.tessera.dev", "gpu.tessera.dev/gpu", "2026-03-01T10:00:00Z")
    z = er_class("z.gpu.tessera.dev", "gpu.tessera.dev/gpu", "2026-03-01T10:00:00Z")
    assert 'get devices from "a.gpu.tessera.dev"' in only(er_check(z, a)).message
    assert 'get devices from "a.gpu.tessera.dev"' in only(er_check(a, z)).message


def test_a_class_without_creation_time_is_the_newest_one_being_created():
    old = er_class("z.gpu.tessera.dev", "gpu.tessera.dev/gpu", "2026-03-01T10:00:00Z")
    new = er_class("a.gpu.tessera.dev", "gpu.tessera.dev/gpu")
    assert 'get devices from "a.gpu.tessera.dev"' in only(er_check(new, old)).message


def test_every_other_class_with_the_name_is_listed():
    one = er_class("one.gpu.tessera.dev", "nvidia.com/gpu", "2026-01-01T00:00:00Z")
    two = er_class("two.gpu.tessera.dev", "nvidia.com/gpu", "2026-02-01T00:00:00Z")
    new = er_class("gpu.tessera.dev", "nvidia.com/gpu", "2025-01-01T00:00:00Z")
    message = only(er_check(new, one, two)).message
    assert 'DeviceClasses "one.gpu.tessera.dev", "two.gpu.tessera.dev" already answer the extended' in message
    assert 'get devices from "two.gpu.tessera.dev"' in message


def test_distinct_or_absent_names_and_the_class_itself_do_not_warn():
    mine = er_class("gpu.tessera.dev", "gpu.tessera.dev/gpu", "2026-01-01T00:00:00Z")
    assert er_check(er_class("gpu.tessera.dev", "gpu.tessera.dev/gpu"), mine).findings == ()
    assert er_check(er_class("mig-1g.10gb.gpu.tessera.dev", "gpu.tessera.dev/mig-1g.10gb"), mine).findings == ()
    assert er_check(er_class("h100.gpu.tessera.dev", None), mine).findings == ()


def test_another_drivers_class_taking_a_name_tessera_answers_is_warned_too():
    ours = er_class("gpu.tessera.dev", "nvidia.com/gpu", "2026-01-01T00:00:00Z")
    theirs = er_class("gpu.nvidia.com", "nvidia.com/gpu", "2026-02-01T00:00:00Z", 'device.driver == "gpu.nvidia.com"')
    report = er_check(theirs, ours)
    assert not report.targets_tessera
    assert 'get devices from "gpu.nvidia.com"' in only(report).message
    # Two classes of other drivers are none of tessera's business.
    other = er_class("tpu.example.com", "nvidia.com/gpu", "2026-01-01T00:00:00Z", 'device.driver == "tpu.example.com"')
    assert er_check(theirs, other).findings == ()
