"""The validator, rule by rule: each rule has a case the apiserver rejects and a nearby case it accepts."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from driver.poolvalidation import validate_pool
from driver.validation import FieldError, validate_slice

Obj = dict[str, Any]


def base_slice() -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gpu.tessera.dev-000", "labels": {"gpu.tessera.dev/node": "node-a"}},
        "spec": {
            "driver": "gpu.tessera.dev",
            "pool": {"name": "node-a", "generation": 0, "resourceSliceCount": 1},
            "nodeName": "node-a",
            "devices": [
                {
                    "name": "gpu-0",
                    "allowMultipleAllocations": True,
                    "attributes": {
                        "type": {"string": "gpu"},
                        "driverVersion": {"version": "550.54.15"},
                        "numaNode": {"int": 0},
                        "migEnabled": {"bool": False},
                        "resource.kubernetes.io/pciBusID": {"string": "0000:18:00.0"},
                    },
                    "capacity": {
                        "memory": {"value": "80Gi"},
                        "multiprocessors": {"value": "132", "requestPolicy": {"default": "0"}},
                    },
                }
            ],
        },
    }


def dev(obj: Obj, i: int = 0) -> Obj:
    device: Obj = obj["spec"]["devices"][i]
    return device


def counter_slice(*names: str) -> Obj:
    obj = base_slice()
    del obj["spec"]["devices"]
    obj["spec"]["sharedCounters"] = [{"name": n, "counters": {"memory": {"value": "80Gi"}}} for n in names]
    return obj


Mutation = Callable[[Obj], None]


def _set(path: str, value: Any) -> Mutation:
    def mutate(obj: Obj) -> None:
        *parents, last = path.split(".")
        cur: Any = obj
        for part in parents:
            cur = cur[int(part)] if part.isdigit() else cur[part]
        if value is _DELETE:
            del cur[last]
        else:
            cur[last] = value
    return mutate


_DELETE = object()


def _devices(n: int, consume: bool = False) -> Mutation:
    def mutate(obj: Obj) -> None:
        template = dev(obj)
        obj["spec"]["devices"] = []
        for i in range(n):
            d = copy.deepcopy(template)
            d["name"] = f"gpu-{i}"
            if consume:
                d["consumesCounters"] = [{"counterSet": "gpu-0-counters", "counters": {"memory": {"value": "1Gi"}}}]
            obj["spec"]["devices"].append(d)
    return mutate


def _attrs(n: int) -> Mutation:
    def mutate(obj: Obj) -> None:
        d = dev(obj)
        d["attributes"] = {f"a{i}": {"int": i} for i in range(n - len(d["capacity"]))}
    return mutate


def _policy(policy: Obj, value: str = "80Gi") -> Mutation:
    def mutate(obj: Obj) -> None:
        dev(obj)["capacity"]["memory"] = {"value": value, "requestPolicy": policy}
    return mutate


def _counter_sets(n: int) -> Mutation:
    def mutate(obj: Obj) -> None:
        del obj["spec"]["devices"]
        obj["spec"]["sharedCounters"] = [
            {"name": f"gpu-{i}-counters", "counters": {"memory": {"value": "80Gi"}}} for i in range(n)
        ]
    return mutate


def _consumes(consumptions: list[Obj]) -> Mutation:
    return _set("spec.devices.0.consumesCounters", consumptions)


def _taint(taint: Obj) -> Mutation:
    return _set("spec.devices.0.taints", [taint])


GI = {"value": "1Gi"}

# (rule, mutation the apiserver rejects, nearby mutation it accepts, path of the expected error)
RULES: list[tuple[str, Mutation, Mutation, str]] = [
    ("apiVersion must be resource.k8s.io/v1",
     _set("apiVersion", "resource.k8s.io/v1beta1"), _set("apiVersion", "resource.k8s.io/v1"), "apiVersion"),
    ("metadata.name is a DNS subdomain",
     _set("metadata.name", "Node_A-gpu"), _set("metadata.name", "node.a-gpu.tessera.dev-000"), "metadata.name"),
    ("metadata.name is at most 253 characters",
     _set("metadata.name", "a" * 254), _set("metadata.name", "a" * 253), "metadata.name"),
    ("generateName is a DNS subdomain prefix (a trailing '-' is fine)",
     lambda o: (o["metadata"].pop("name"), o["metadata"].update(generateName="Node_A-")),
     lambda o: (o["metadata"].pop("name"), o["metadata"].update(generateName="x" * 252 + "-")),
     "metadata.generateName"),
    ("label values are at most 63 characters",
     _set("metadata.labels", {"gpu.tessera.dev/node": "n" * 64}),
     _set("metadata.labels", {"gpu.tessera.dev/node": "n" * 63}), "metadata.labels[gpu.tessera.dev/node]"),
    ("label keys are qualified names",
     _set("metadata.labels", {"gpu.tessera.dev/no de": "x"}), _set("metadata.labels", {"gpu.tessera.dev/node": "x"}),
     "metadata.labels[gpu.tessera.dev/no de]"),
    ("owner references need apiVersion, kind, name and uid",
     _set("metadata.ownerReferences", [{"apiVersion": "v1", "kind": "Node", "name": "node-a"}]),
     _set("metadata.ownerReferences", [{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "u"}]),
     "metadata.ownerReferences[0].uid"),
    ("at most one owner reference is the controller",
     _set("metadata.ownerReferences", [{"apiVersion": "v1", "kind": "Node", "name": n, "uid": n, "controller": True}
                                       for n in ("a", "b")]),
     _set("metadata.ownerReferences", [{"apiVersion": "v1", "kind": "Node", "name": "a", "uid": "a",
                                        "controller": True}]),
     "metadata.ownerReferences"),
    ("driver is required", _set("spec.driver", _DELETE), _set("spec.driver", "gpu.tessera.dev"), "spec.driver"),
    ("driver is a DNS subdomain (case-insensitive)",
     _set("spec.driver", "gpu_tessera.dev"), _set("spec.driver", "GPU.tessera.dev"), "spec.driver"),
    ("driver is at most 63 characters",
     _set("spec.driver", "a" * 60 + ".dev"), _set("spec.driver", "a" * 59 + ".dev"), "spec.driver"),
    ("pool name segments are DNS subdomains",
     _set("spec.pool.name", "node-a//x"), _set("spec.pool.name", "node-a/x"), "spec.pool.name"),
    ("pool name is at most 253 characters",
     _set("spec.pool.name", "a" * 254), _set("spec.pool.name", "a" * 253), "spec.pool.name"),
    ("pool generation is >= 0",
     _set("spec.pool.generation", -1), _set("spec.pool.generation", 0), "spec.pool.generation"),
    ("resourceSliceCount is > 0",
     _set("spec.pool.resourceSliceCount", 0), _set("spec.pool.resourceSliceCount", 1), "spec.pool.resourceSliceCount"),
    ("exactly one node selection: none set",
     _set("spec.nodeName", _DELETE), _set("spec.nodeName", "node-a"), "spec"),
    ("exactly one node selection: two set",
     _set("spec.allNodes", True), lambda o: (o["spec"].pop("nodeName"), o["spec"].update(allNodes=True)), "spec"),
    ("nodeName is a valid node name",
     _set("spec.nodeName", "Node_A"), _set("spec.nodeName", "node-a.example.com"), "spec.nodeName"),
    ("nodeName must not be empty",
     _set("spec.nodeName", ""), _set("spec.nodeName", "n"), "spec.nodeName"),
    ("allNodes may only be true",
     lambda o: (o["spec"].pop("nodeName"), o["spec"].update(allNodes=False)),
     lambda o: (o["spec"].pop("nodeName"), o["spec"].update(allNodes=True)), "spec.allNodes"),
    ("nodeSelector has exactly one term",
     lambda o: (o["spec"].pop("nodeName"), o["spec"].update(nodeSelector={"nodeSelectorTerms": [{}, {}]})),
     lambda o: (o["spec"].pop("nodeName"), o["spec"].update(nodeSelector={"nodeSelectorTerms": [{}]})),
     "spec.nodeSelector.nodeSelectorTerms"),
    ("unknown spec fields are reported",
     _set("spec.device", []), _set("spec.devices", []), "spec.device"),
    ("devices and sharedCounters never share a slice",
     _set("spec.sharedCounters", [{"name": "c", "counters": {"x": GI}}]), _set("spec.devices", []), "spec"),
    ("at most 128 devices", _devices(129), _devices(128), "spec.devices"),
    ("at most 64 devices when counters are consumed", _devices(65, consume=True), _devices(64, consume=True),
     "spec.devices"),
    ("at most 64 devices when any device has taints",
     lambda o: (_devices(65)(o), dev(o).update(taints=[{"key": "k", "effect": "NoSchedule"}])),
     lambda o: (_devices(64)(o), dev(o).update(taints=[{"key": "k", "effect": "NoSchedule"}])), "spec.devices"),
    ("device names are DNS labels",
     _set("spec.devices.0.name", "gpu_0"), _set("spec.devices.0.name", "gpu-0-mig-1g10gb-0"), "spec.devices[0].name"),
    ("device names are at most 63 characters",
     _set("spec.devices.0.name", "g" * 64), _set("spec.devices.0.name", "g" * 63), "spec.devices[0].name"),
    ("device names are unique in a slice",
     lambda o: o["spec"]["devices"].append(copy.deepcopy(dev(o))),
     lambda o: o["spec"]["devices"].append({**copy.deepcopy(dev(o)), "name": "gpu-1"}), "spec.devices[1].name"),
    ("unknown device fields are reported",
     _set("spec.devices.0.allowMultipleAllocation", True), _set("spec.devices.0.allowMultipleAllocations", True),
     "spec.devices[0].allowMultipleAllocation"),
    ("at most 32 attributes and capacities per device", _attrs(33), _attrs(32), "spec.devices[0]"),
    ("attribute names are C identifiers",
     _set("spec.devices.0.attributes", {"product-name": {"string": "x"}}),
     _set("spec.devices.0.attributes", {"product_name": {"string": "x"}}), "spec.devices[0].attributes[product-name]"),
    ("attribute names are at most 32 characters",
     _set("spec.devices.0.attributes", {"a" * 33: {"int": 1}}),
     _set("spec.devices.0.attributes", {"a" * 32: {"int": 1}}),
     "spec.devices[0].attributes[" + "a" * 33 + "]"),
    ("attribute domains are DNS subdomains",
     _set("spec.devices.0.attributes", {"Resource_k8s.io/x": {"int": 1}}),
     _set("spec.devices.0.attributes", {"resource.kubernetes.io/x": {"int": 1}}),
     "spec.devices[0].attributes[Resource_k8s.io/x]"),
    ("attribute names have at most one slash (stricter than the 1.36 apiserver)",
     _set("spec.devices.0.attributes", {"a.io/b/c": {"int": 1}}),
     _set("spec.devices.0.attributes", {"a.io/c": {"int": 1}}),
     "spec.devices[0].attributes[a.io/b/c]"),
    ("attributes have exactly one value",
     _set("spec.devices.0.attributes.numaNode", {"int": 0, "string": "0"}),
     _set("spec.devices.0.attributes.numaNode", {"int": 0}), "spec.devices[0].attributes[numaNode]"),
    ("attributes need a value", _set("spec.devices.0.attributes.numaNode", {}),
     _set("spec.devices.0.attributes.numaNode", {"bool": True}), "spec.devices[0].attributes[numaNode]"),
    ("int attributes are 64-bit integers",
     _set("spec.devices.0.attributes.numaNode", {"int": 2**63}),
     _set("spec.devices.0.attributes.numaNode", {"int": 2**63 - 1}), "spec.devices[0].attributes[numaNode].int"),
    ("bool attributes are booleans",
     _set("spec.devices.0.attributes.migEnabled", {"bool": "false"}),
     _set("spec.devices.0.attributes.migEnabled", {"bool": False}), "spec.devices[0].attributes[migEnabled].bool"),
    ("string attributes are at most 64 bytes",
     _set("spec.devices.0.attributes.type", {"string": "é" * 33}),
     _set("spec.devices.0.attributes.type", {"string": "é" * 32}), "spec.devices[0].attributes[type].string"),
    ("versions are strict semver: no leading zeros",
     _set("spec.devices.0.attributes.driverVersion", {"version": "535.104.05"}),
     _set("spec.devices.0.attributes.driverVersion", {"version": "535.104.5"}),
     "spec.devices[0].attributes[driverVersion].version"),
    ("versions are strict semver: three components",
     _set("spec.devices.0.attributes.driverVersion", {"version": "12.4"}),
     _set("spec.devices.0.attributes.driverVersion", {"version": "12.4.0-rc.1+build.7"}),
     "spec.devices[0].attributes[driverVersion].version"),
    ("versions are at most 64 bytes",
     _set("spec.devices.0.attributes.driverVersion", {"version": "1.2.3+" + "b" * 59}),
     _set("spec.devices.0.attributes.driverVersion", {"version": "1.2.3+" + "b" * 58}),
     "spec.devices[0].attributes[driverVersion].version"),
    ("capacity names are qualified names",
     _set("spec.devices.0.capacity", {"gpu-memory": {"value": "1"}}),
     _set("spec.devices.0.capacity", {"gpu.tessera.dev/memory": {"value": "1"}}),
     "spec.devices[0].capacity[gpu-memory]"),
    ("capacity values are JSON numbers or quantity strings",
     _set("spec.devices.0.capacity.memory", {"value": True}),
     _set("spec.devices.0.capacity.memory", {"value": 1.5}), "spec.devices[0].capacity[memory].value"),
    ("capacity values are quantities", _set("spec.devices.0.capacity.memory", {"value": "80GB"}),
     _set("spec.devices.0.capacity.memory", {"value": "80G"}), "spec.devices[0].capacity[memory].value"),
    ("requestPolicy needs allowMultipleAllocations",
     _set("spec.devices.0.allowMultipleAllocations", _DELETE), _set("spec.devices.0.allowMultipleAllocations", True),
     "spec.devices[0].capacity[multiprocessors].requestPolicy"),
    ("requestPolicy: validValues and validRange exclude each other",
     _policy({"default": "1Gi", "validValues": ["1Gi"], "validRange": {"min": "1Gi"}}),
     _policy({"default": "1Gi", "validValues": ["1Gi"]}), "spec.devices[0].capacity[memory].requestPolicy"),
    ("requestPolicy: validValues need a default",
     _policy({"validValues": ["1Gi"]}), _policy({"default": "1Gi", "validValues": ["1Gi"]}),
     "spec.devices[0].capacity[memory].requestPolicy.default"),
    ("requestPolicy: validValues are ascending",
     _policy({"default": "1Gi", "validValues": ["2Gi", "1Gi"]}),
     _policy({"default": "1Gi", "validValues": ["1Gi", "2Gi"]}),
     "spec.devices[0].capacity[memory].requestPolicy.validValues[1]"),
    ("requestPolicy: at most 10 validValues",
     _policy({"default": "1Gi", "validValues": [f"{i}Gi" for i in range(1, 12)]}),
     _policy({"default": "1Gi", "validValues": [f"{i}Gi" for i in range(1, 11)]}),
     "spec.devices[0].capacity[memory].requestPolicy.validValues"),
    ("requestPolicy: validValues do not exceed the capacity",
     _policy({"default": "1Gi", "validValues": ["1Gi", "81Gi"]}),
     _policy({"default": "1Gi", "validValues": ["1Gi", "80Gi"]}),
     "spec.devices[0].capacity[memory].requestPolicy.validValues[1]"),
    ("requestPolicy: validValues contain the default",
     _policy({"default": "3Gi", "validValues": ["1Gi", "2Gi"]}),
     _policy({"default": "2Gi", "validValues": ["1Gi", "2Gi"]}),
     "spec.devices[0].capacity[memory].requestPolicy.validValues"),
    ("requestPolicy: validRange needs a default",
     _policy({"validRange": {"min": "1Gi"}}), _policy({"default": "1Gi", "validRange": {"min": "1Gi"}}),
     "spec.devices[0].capacity[memory].requestPolicy.default"),
    ("requestPolicy: validRange needs min",
     _policy({"default": "1Gi", "validRange": {"max": "2Gi"}}),
     _policy({"default": "1Gi", "validRange": {"min": "0", "max": "2Gi"}}),
     "spec.devices[0].capacity[memory].requestPolicy.validRange.min"),
    ("requestPolicy: min is not above the capacity",
     _policy({"default": "81Gi", "validRange": {"min": "81Gi"}}),
     _policy({"default": "80Gi", "validRange": {"min": "80Gi"}}),
     "spec.devices[0].capacity[memory].requestPolicy.validRange.min"),
    ("requestPolicy: default is not below min",
     _policy({"default": "1Gi", "validRange": {"min": "2Gi"}}),
     _policy({"default": "2Gi", "validRange": {"min": "2Gi"}}),
     "spec.devices[0].capacity[memory].requestPolicy.validRange.min"),
    ("requestPolicy: max is not above the capacity",
     _policy({"default": "1Gi", "validRange": {"min": "1Gi", "max": "81Gi"}}),
     _policy({"default": "1Gi", "validRange": {"min": "1Gi", "max": "80Gi"}}),
     "spec.devices[0].capacity[memory].requestPolicy.validRange.max"),
    ("requestPolicy: min is not above max",
     _policy({"default": "4Gi", "validRange": {"min": "4Gi", "max": "2Gi"}}),
     _policy({"default": "2Gi", "validRange": {"min": "2Gi", "max": "2Gi"}}),
     "spec.devices[0].capacity[memory].requestPolicy.validRange.max"),
    ("requestPolicy: default is not above max",
     _policy({"default": "3Gi", "validRange": {"min": "1Gi", "max": "2Gi"}}),
     _policy({"default": "2Gi", "validRange": {"min": "1Gi", "max": "2Gi"}}),
     "spec.devices[0].capacity[memory].requestPolicy.validRange.max"),
    ("requestPolicy: one step fits in the capacity",
     _policy({"default": "1Gi", "validRange": {"min": "1Gi", "step": "80Gi"}}),
     _policy({"default": "1Gi", "validRange": {"min": "1Gi", "step": "79Gi"}}),
     "spec.devices[0].capacity[memory].requestPolicy.validRange.step"),
    ("requestPolicy: default and max lie on the step grid",
     _policy({"default": "2Gi", "validRange": {"min": "1Gi", "step": "2Gi"}}),
     _policy({"default": "3Gi", "validRange": {"min": "1Gi", "max": "79Gi", "step": "2Gi"}}),
     "spec.devices[0].capacity[memory].requestPolicy.validRange.step"),
    ("consumesCounters: at most 2 entries",
     _consumes([{"counterSet": f"s{i}", "counters": {"c": GI}} for i in range(3)]),
     _consumes([{"counterSet": f"s{i}", "counters": {"c": GI}} for i in range(2)]), "spec.devices[0].consumesCounters"),
    ("consumesCounters: counter sets are unique",
     _consumes([{"counterSet": "s", "counters": {"c": GI}}] * 2),
     _consumes([{"counterSet": "s", "counters": {"c": GI}}]),
     "spec.devices[0].consumesCounters[1]"),
    ("consumesCounters: counterSet is a DNS label",
     _consumes([{"counterSet": "gpu_0", "counters": {"c": GI}}]),
     _consumes([{"counterSet": "gpu-0", "counters": {"c": GI}}]),
     "spec.devices[0].consumesCounters[0].counterSet"),
    ("consumesCounters: at least one counter",
     _consumes([{"counterSet": "s", "counters": {}}]), _consumes([{"counterSet": "s", "counters": {"c": GI}}]),
     "spec.devices[0].consumesCounters[0].counters"),
    ("consumesCounters: at most 32 counters",
     _consumes([{"counterSet": "s", "counters": {f"c{i}": GI for i in range(33)}}]),
     _consumes([{"counterSet": "s", "counters": {f"c{i}": GI for i in range(32)}}]),
     "spec.devices[0].consumesCounters[0].counters"),
    ("consumesCounters: counter names are DNS labels",
     _consumes([{"counterSet": "s", "counters": {"memorySlice0": GI}}]),
     _consumes([{"counterSet": "s", "counters": {"memory-slice-0": GI}}]),
     "spec.devices[0].consumesCounters[0].counters[memorySlice0]"),
    ("consumesCounters: counter values are quantities",
     _consumes([{"counterSet": "s", "counters": {"c": {"value": "lots"}}}]),
     _consumes([{"counterSet": "s", "counters": {"c": {"value": "1.5"}}}]),
     "spec.devices[0].consumesCounters[0].counters[c].value"),
    ("sharedCounters: at most 8 sets", _counter_sets(9), _counter_sets(8), "spec.sharedCounters"),
    ("sharedCounters: names are DNS labels",
     lambda o: (_counter_sets(1)(o), o["spec"]["sharedCounters"][0].update(name="GPU-0")),
     lambda o: (_counter_sets(1)(o), o["spec"]["sharedCounters"][0].update(name="gpu-0")),
     "spec.sharedCounters[0].name"),
    ("sharedCounters: names are unique",
     lambda o: (_counter_sets(2)(o), o["spec"]["sharedCounters"][1].update(name="gpu-0-counters")),
     _counter_sets(2), "spec.sharedCounters[1].name"),
    ("sharedCounters: at most 32 counters per set",
     lambda o: (_counter_sets(1)(o), o["spec"]["sharedCounters"][0].update(counters={f"c{i}": GI for i in range(33)})),
     lambda o: (_counter_sets(1)(o), o["spec"]["sharedCounters"][0].update(counters={f"c{i}": GI for i in range(32)})),
     "spec.sharedCounters[0].counters"),
    ("taints: at most 16", _set("spec.devices.0.taints", [{"key": f"k{i}", "effect": "None"} for i in range(17)]),
     _set("spec.devices.0.taints", [{"key": f"k{i}", "effect": "None"} for i in range(16)]), "spec.devices[0].taints"),
    ("taints: effect is None, NoSchedule or NoExecute",
     _taint({"key": "gpu.tessera.dev/unhealthy", "effect": "PreferNoSchedule"}),
     _taint({"key": "gpu.tessera.dev/unhealthy", "effect": "NoExecute"}), "spec.devices[0].taints[0].effect"),
    ("taints: key is required", _taint({"effect": "NoSchedule"}), _taint({"key": "k", "effect": "NoSchedule"}),
     "spec.devices[0].taints[0].key"),
    ("per-device node selection only with perDeviceNodeSelection",
     _set("spec.devices.0.nodeName", "node-a"),
     lambda o: (o["spec"].pop("nodeName"), o["spec"].update(perDeviceNodeSelection=True),
                dev(o).update(nodeName="node-a")),
     "spec.devices[0]"),
    ("perDeviceNodeSelection needs exactly one selection per device",
     lambda o: (o["spec"].pop("nodeName"), o["spec"].update(perDeviceNodeSelection=True)),
     lambda o: (o["spec"].pop("nodeName"), o["spec"].update(perDeviceNodeSelection=True),
                dev(o).update(allNodes=True)),
     "spec.devices[0]"),
]


def test_the_base_slice_is_valid() -> None:
    assert validate_slice(base_slice(), require_name=True) == []


@pytest.mark.parametrize(("rule", "bad", "good", "path"), RULES, ids=[r[0] for r in RULES])
def test_rule(rule: str, bad: Mutation, good: Mutation, path: str) -> None:
    rejected, accepted = base_slice(), base_slice()
    bad(rejected)
    good(accepted)
    errors = validate_slice(rejected, require_name=True)
    assert path in [e.path for e in errors], f"{rule}: expected an error at {path}, got {errors}"
    assert validate_slice(accepted, require_name=True) == [], rule


def test_a_capacity_without_value_is_zero_as_for_the_apiserver() -> None:
    obj = base_slice()
    dev(obj)["capacity"]["memory"] = {}
    assert validate_slice(obj) == []


def test_name_is_required_only_when_asked() -> None:
    obj = base_slice()
    del obj["metadata"]["name"]
    assert validate_slice(obj) == []
    assert validate_slice(obj, require_name=True) == [FieldError("metadata.name", "name or generateName is required")]


def test_errors_carry_a_prefix_path_and_read_as_path_colon_message() -> None:
    obj = base_slice()
    obj["spec"]["devices"][0]["name"] = "GPU 0"
    (error,) = validate_slice(obj, "items[3]")
    assert error.path == "items[3].spec.devices[0].name"
    assert str(error).startswith("items[3].spec.devices[0].name: ")
    assert "DNS label" in error.message


# -- quantities --------------------------------------------------------------------------------------------


def _capacity_errors(value: Any) -> list[FieldError]:
    obj = base_slice()
    dev(obj)["capacity"]["memory"] = {"value": value}
    return validate_slice(obj)


@pytest.mark.parametrize(
    "value", ["132", "80Gi", "1.5", "500m", "1k", "1E", "1e3", "2E-3", ".5Ki", "+3", "-1", "1n", "Gi", 7, 1.5, 1e21]
)
def test_quantities_the_apiserver_accepts_pass(value: Any) -> None:
    # driver.quantity parses like apimachinery (tests/driver/test_quantity.py pins the values); the
    # validator reads a JSON number by its text, as the apiserver does.
    assert _capacity_errors(value) == []


@pytest.mark.parametrize("value", ["", "80GB", "1.2.3", "1 Gi", "0x10", True, None, float("inf")])
def test_non_quantities_are_reported(value: Any) -> None:
    assert [str(e) for e in _capacity_errors(value)] == [
        f"spec.devices[0].capacity[memory].value: {value!r} is not a quantity, e.g. 80Gi or 132"
    ]


def test_quantities_compare_by_value_across_suffixes() -> None:
    obj = base_slice()
    dev(obj)["capacity"]["memory"] = {"value": "1Gi", "requestPolicy": {"default": "1073741824",
                                                                        "validValues": ["0.5Gi", "1073741824"]}}
    assert validate_slice(obj) == []
    dev(obj)["capacity"]["memory"]["value"] = "1G"  # 10**9 < 2**30: the option no longer fits
    assert [e.message for e in validate_slice(obj)] == ["option is larger than capacity value"]


# -- pool-level rules ------------------------------------------------------------------------------------------


def pool(*slices: Obj) -> list[Obj]:
    for i, obj in enumerate(slices):
        obj["metadata"]["name"] = f"node-a-gpu.tessera.dev-{i:03d}"
        obj["spec"]["pool"]["resourceSliceCount"] = len(slices)
    return list(slices)


def consuming_slice(set_name: str, counter: str, amount: str = "1Gi") -> Obj:
    obj = base_slice()
    dev(obj)["consumesCounters"] = [{"counterSet": set_name, "counters": {counter: {"value": amount}}}]
    return obj


def paths(errors: list[FieldError]) -> list[str]:
    return [e.path for e in errors]


def test_pool_needs_at_least_one_slice() -> None:
    assert paths(validate_pool([])) == [""]
    assert validate_pool(pool(base_slice())) == []


def test_pool_device_names_are_unique_across_slices() -> None:
    second = base_slice()
    assert paths(validate_pool(pool(base_slice(), second))) == ["[1].spec.devices[0].name"]
    renamed = base_slice()
    dev(renamed)["name"] = "gpu-1"
    assert validate_pool(pool(base_slice(), renamed)) == []


def test_pool_counter_set_names_are_unique_across_slices() -> None:
    errors = validate_pool(pool(counter_slice("gpu-0-counters"), counter_slice("gpu-0-counters")))
    assert paths(errors) == ["[1].spec.sharedCounters[0].name"]
    assert validate_pool(pool(counter_slice("gpu-0-counters"), counter_slice("gpu-1-counters"))) == []


def test_pool_counter_references_resolve_to_a_set() -> None:
    errors = validate_pool(pool(consuming_slice("gpu-9-counters", "memory"), counter_slice("gpu-0-counters")))
    assert paths(errors) == ["[0].spec.devices[0].consumesCounters[0].counterSet"]
    assert validate_pool(pool(consuming_slice("gpu-0-counters", "memory"), counter_slice("gpu-0-counters"))) == []


def test_pool_counter_references_resolve_to_a_counter() -> None:
    errors = validate_pool(pool(consuming_slice("gpu-0-counters", "compute-slices"), counter_slice("gpu-0-counters")))
    assert paths(errors) == ["[0].spec.devices[0].consumesCounters[0].counters[compute-slices]"]


def test_pool_devices_consume_no_more_than_the_counter_holds() -> None:
    errors = validate_pool(pool(consuming_slice("gpu-0-counters", "memory", "81Gi"), counter_slice("gpu-0-counters")))
    assert paths(errors) == ["[0].spec.devices[0].consumesCounters[0].counters[memory]"]
    assert validate_pool(pool(consuming_slice("gpu-0-counters", "memory", "80Gi"),
                              counter_slice("gpu-0-counters"))) == []


def test_pool_slices_share_one_generation() -> None:
    first, second = base_slice(), counter_slice("gpu-0-counters")
    second["spec"]["pool"]["generation"] = 1
    assert paths(validate_pool(pool(first, second))) == ["[1].spec.pool.generation"]
    first["spec"]["pool"]["generation"] = 1
    assert validate_pool(pool(first, second)) == []


def test_pool_slice_count_matches_the_number_of_slices() -> None:
    slices = pool(base_slice(), counter_slice("gpu-0-counters"))
    slices[0]["spec"]["pool"]["resourceSliceCount"] = 3
    assert paths(validate_pool(slices)) == ["[0].spec.pool.resourceSliceCount"]


def test_pool_slices_share_driver_and_pool_name() -> None:
    second = counter_slice("gpu-0-counters")
    second["spec"]["pool"]["name"] = "node-b"
    second["spec"]["driver"] = "other.example.com"
    assert paths(validate_pool(pool(base_slice(), second))) == ["[1].spec.driver", "[1].spec.pool.name"]
