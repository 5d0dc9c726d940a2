"""Evaluation against the inventory: deduplication by what an expression reads, capacity fit, and the
lexical conjunct split behind the "nearest miss"."""

from __future__ import annotations

import copy

import pytest

from controller.cluster.capacityfit import CapacityNeed
from controller.cluster.celtext import split_conjuncts
from controller.cluster.devicegroups import dedup_safe, shapes
from controller.cluster.inventory import DeviceIndex
from controller.cluster.matching import Condition, Evaluator, Requirement, capacity_shortfall, match
from driver.cel import compile_selector

D = 'device.attributes["gpu.tessera.dev"]'


def cond(expression: str) -> Condition:
    return Condition("test selector 0", "spec.selectors[0].cel.expression", expression, compile_selector(expression))


def identical_gpus(count: int, nodes: int = 10, product: str = "NVIDIA H100 80GB HBM3") -> DeviceIndex:
    template = {
        "allowMultipleAllocations": True,
        "attributes": {"type": {"string": "gpu"}, "productName": {"string": product}, "numaNode": {"int": 0}},
        "capacity": {"memory": {"value": "80Gi"}},
    }
    slices = []
    per_node = count // nodes
    for n in range(nodes):
        devices = []
        for i in range(per_node):
            dev = copy.deepcopy(template)
            dev["name"] = f"gpu-{i}"
            dev["attributes"]["uuid"] = {"string": f"GPU-{n:04d}-{i:04d}"}
            devices.append(dev)
        slices.append({"metadata": {"name": f"node-{n}"}, "spec": {
            "driver": "gpu.tessera.dev", "nodeName": f"node-{n}",
            "pool": {"name": f"node-{n}", "generation": 0, "resourceSliceCount": 1}, "devices": devices}})
    return DeviceIndex.from_slices(slices)


def test_ten_thousand_identical_gpus_cost_one_evaluation():
    index = identical_gpus(10_000)
    evaluator = Evaluator()
    result = match(Requirement((cond(f'{D}.productName.startsWith("NVIDIA H100")'),)), index, evaluator)
    assert result.total == 10_000
    assert evaluator.evaluations == 1


def test_shapes_group_identical_devices_once_per_snapshot():
    index = identical_gpus(1000, nodes=4)
    expression = f'{D}.productName.startsWith("NVIDIA H100")'
    first = shapes(index, [(expression, compile_selector(expression))])
    assert len(first) == 1
    assert first[0].per_node == {f"node-{n}": 250 for n in range(4)}
    assert shapes(index, [(expression, compile_selector(expression))]) is first
    assert len(shapes(index, [(expression, compile_selector(expression))], capacity_keys=["memory"])) == 1


def test_shapes_keep_first_fit_order_and_split_on_read_values():
    index = identical_gpus(6, nodes=2)
    expression = f'{D}.uuid == "GPU-0001-0000"'
    groups = shapes(index, [(expression, compile_selector(expression))])
    assert [g.device.ref for g in groups] == [d.ref for d in index.devices]


def test_devices_that_differ_in_what_is_read_are_evaluated_apart():
    index = identical_gpus(20, nodes=2)
    evaluator = Evaluator()
    result = match(Requirement((cond(f'{D}.uuid.endsWith("0001")'),)), index, evaluator)
    assert result.per_node == {"node-0": 1, "node-1": 1}
    assert evaluator.evaluations == 20


def test_presence_of_a_key_is_part_of_the_shape():
    index = identical_gpus(4, nodes=1)
    del index.devices[0].spec["attributes"]["numaNode"]
    evaluator = Evaluator()
    result = match(Requirement((cond(f'"numaNode" in {D}'),)), index, evaluator)
    assert result.total == 3
    assert evaluator.evaluations == 2


def test_expression_hiding_its_reads_is_evaluated_per_device():
    expression = f'[{D}].exists(m, m.uuid == "GPU-0000-0002")'
    assert not dedup_safe(expression)
    index = identical_gpus(5, nodes=1)
    evaluator = Evaluator()
    result = match(Requirement((cond(expression),)), index, evaluator)
    assert result.total == 1
    assert evaluator.evaluations == 5


@pytest.mark.parametrize(
    ("expression", "safe"),
    [
        (f'{D}.type == "gpu"', True),
        (f'"uuid" in {D} && {D}.uuid == "x"', True),
        (f'cel.bind(g, {D}, g.uuid == "x")', True),
        (f"size({D}) > 2", True),
        (f'{D}.exists(k, {D}[k] == "x")', True),
        (f'[{D}].exists(m, m.uuid == "x")', False),
        ('cel.bind(a, device.attributes, a["gpu.tessera.dev"].uuid == "x")', False),
        ('device.attributes.exists(d, d == "x")', False),
        ('"device.attributes" == "x"', True),
    ],
)
def test_dedup_safety_of_expression_forms(expression, safe):
    assert dedup_safe(expression) is safe


def test_runtime_errors_are_remembered_per_condition():
    index = identical_gpus(4, nodes=1)
    result = match(Requirement((cond(f"{D}.productName > 5"),)), index, Evaluator())
    assert result.total == 0
    [failure] = result.failures
    assert failure.device.ref == "node-0/gpu-0"


def test_selectors_stop_at_the_first_false_like_the_scheduler():
    index = identical_gpus(4, nodes=1)
    result = match(Requirement((cond(f'{D}.type == "mig"'), cond(f"{D}.profile == 'x'"))), index, Evaluator())
    assert result.failures == ()


def test_capacity_need_larger_than_the_device_is_a_shortfall():
    [device] = identical_gpus(1, nodes=1).devices
    assert capacity_shortfall(device, CapacityNeed("memory", 4 << 30, "4Gi")) is None
    assert capacity_shortfall(device, CapacityNeed("memory", 100 << 30, "100Gi")) == (
        "it has 80Gi of memory, the request asks 100Gi")
    assert capacity_shortfall(device, CapacityNeed("gpu.tessera.dev/memory", 1, "1")) == (
        "it has no capacity 'gpu.tessera.dev/memory'")


def test_capacity_request_policy_limits_are_respected():
    [device] = identical_gpus(1, nodes=1).devices
    device.spec["capacity"]["memory"]["requestPolicy"] = {"default": "1Gi", "validRange": {"min": "1Gi", "max": "8Gi"}}
    assert "at most 8Gi" in capacity_shortfall(device, CapacityNeed("memory", 16 << 30, "16Gi"))
    device.spec["capacity"]["memory"]["requestPolicy"] = {"default": "1Gi", "validValues": ["1Gi", "2Gi"]}
    assert "largest memory share is 2Gi" in capacity_shortfall(device, CapacityNeed("memory", 4 << 30, "4Gi"))


def test_nearest_miss_reports_the_capacity_shortfall():
    index = identical_gpus(2, nodes=1)
    result = match(Requirement((cond(f'{D}.type == "gpu"'),), (CapacityNeed("memory", 100 << 30, "100Gi"),)),
                   index, Evaluator())
    assert result.total == 0
    assert result.nearest_miss.failed == ("capacity.requests.memory: it has 80Gi of memory, the request asks 100Gi",)


# -- conjunct split ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "parts"),
    [
        ("a && b && c", ["a", "b", "c"]),
        ("a && (b || c)", ["a", "(b || c)"]),
        ("a && b || c", ["a && b || c"]),
        ("a ? b : c && d", ["a ? b : c && d"]),
        ('x.?y.orValue("") == "a&&b" && z', ['x.?y.orValue("") == "a&&b"', "z"]),
        ("m[?'k'].hasValue() && n", ["m[?'k'].hasValue()", "n"]),
        ("f(a && b) && c", ["f(a && b)", "c"]),
        ("r'\\' && b", ["r'\\'", "b"]),
        ("'it\\'s && ok' && b", ["'it\\'s && ok'", "b"]),
        ('"""multi && line""" && b', ['"""multi && line"""', "b"]),
        ("a && // comment && here\n b", ["a", "// comment && here\n b"]),
        ("a &&", ["a &&"]),
        ("single", ["single"]),
    ],
)
def test_split_conjuncts(expression, parts):
    assert split_conjuncts(expression) == parts


# -- device kinds: a fleet of identical nodes grouped by kind, not device by device ---------------------------

def _fleet_index(nodes: int = 3) -> DeviceIndex:
    from driver.discovery import load_inventory
    from driver.slices import build_slices

    slices = [s for n in range(nodes)
              for s in build_slices(load_inventory(f"dgx-{n}", simulate="dgx-h100-8"), mig_strategy="dynamic")]
    return DeviceIndex.from_slices(slices)


def _grouped(index: DeviceIndex, reads: tuple, capacity: tuple = ()) -> list:
    from controller.cluster.devicegroups import group

    return [(s.device.ref, s.per_node) for s in group(index, (False, reads, capacity))]


READS_TYPE_MEMORY = (("attribute", "gpu.tessera.dev", "type"), ("capacity", "gpu.tessera.dev", "memory"))


def test_grouping_by_kind_gives_the_same_shapes_as_grouping_every_device() -> None:
    from controller.cluster.devicegroups import prepare_kinds

    plain, by_kind = _fleet_index(), _fleet_index()
    prepare_kinds(by_kind)
    for reads, capacity in ((READS_TYPE_MEMORY, ()), (READS_TYPE_MEMORY, ("memory",)), ((), ())):
        assert _grouped(by_kind, reads, capacity) == _grouped(plain, reads, capacity)


def test_grouping_walks_kinds_not_devices_once_they_are_prepared(monkeypatch) -> None:
    from controller.cluster import devicegroups

    index = _fleet_index()
    devicegroups.prepare_kinds(index)
    calls = []
    real = devicegroups.shape_key
    monkeypatch.setattr(devicegroups, "shape_key", lambda *a: calls.append(1) or real(*a))
    _grouped(index, READS_TYPE_MEMORY)
    kinds = len({d.kind_key for d in index.devices})
    assert len(calls) == kinds < len(index.devices) // 3  # fewer kinds than one node has devices


def test_a_read_of_a_per_device_attribute_groups_every_device() -> None:
    from controller.cluster.devicegroups import prepare_kinds

    index = _fleet_index()
    prepare_kinds(index)
    shapes_by_uuid = _grouped(index, (("attribute", "gpu.tessera.dev", "uuid"),))
    assert shapes_by_uuid == _grouped(_fleet_index(), (("attribute", "gpu.tessera.dev", "uuid"),))
    assert len(shapes_by_uuid) == 3 * 8 + 1  # every GPU apart; MIG placements have no uuid


def test_devices_of_one_kind_share_one_kind_key() -> None:
    # 93,000 devices of a few dozen kinds: one key per kind in memory, not one per device
    index = _fleet_index(2)
    twins = [d for d in index.devices if d.name == "gpu-0"]
    assert len(twins) == 2 and twins[0].kind_key is twins[1].kind_key
