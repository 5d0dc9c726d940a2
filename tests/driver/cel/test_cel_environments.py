"""The two CEL environments (new vs stored expressions) and the DRA feature gates that shape them.

Each expectation here was confirmed with Kubernetes' own compiler (e2e/test_cel_oracle_environments.py
runs the same forms through the Go oracle under every gate setting)."""

from __future__ import annotations

import pytest

from driver.cel import NEW, STORED, CelCompileError, CelEnvironment, compile_selector, device_view, with_feature_gates

D = 'device.attributes["dra.example.com"]'
LIST_GATE_ON = CelEnvironment("new", list_type_attributes=True)
IDS = {"name": "d", "attributes": {"ids": {"ints": [1, 2, 3]}, "name": {"string": "gpu"}}}


def compiles(expression: str, environment: CelEnvironment) -> bool:
    try:
        compile_selector(expression, environment=environment)
    except CelCompileError:
        return False
    return True


def test_the_defaults_are_kubernetes_1_36s() -> None:
    assert STORED.consumable_capacity is True and STORED.list_type_attributes is False
    assert NEW.kind == "new" and STORED.kind == "stored"
    assert NEW.describe() == "new expressions (DRAConsumableCapacity=true, DRAListTypeAttributes=false)"


@pytest.mark.parametrize(("environment", "declared"), [
    (NEW, False), (LIST_GATE_ON, True), (STORED, True), (CelEnvironment("stored", list_type_attributes=True), True),
])  # fmt: skip
def test_includes_is_declared_for_stored_selectors_or_with_list_type_attributes(environment: CelEnvironment,
                                                                               declared: bool) -> None:
    assert compiles(f'{D}.name.includes("gpu")', environment) is declared


def test_a_new_selector_calling_includes_without_the_gate_names_the_gate() -> None:
    with pytest.raises(CelCompileError, match=r"undeclared reference to 'includes': .*DRAListTypeAttributes"):
        compile_selector(f'{D}.name.includes("gpu")', environment=NEW)


@pytest.mark.parametrize(("environment", "declared"), [
    (CelEnvironment("new", consumable_capacity=False), False), (NEW, True),
    (CelEnvironment("stored", consumable_capacity=False), True),
])  # fmt: skip
def test_allow_multiple_allocations_needs_the_gate_only_in_a_new_selector(environment: CelEnvironment,
                                                                         declared: bool) -> None:
    assert compiles("device.allowMultipleAllocations", environment) is declared


def test_a_comprehension_over_a_list_attribute_compiles_and_runs_only_with_list_type_attributes() -> None:
    expression = f"{D}.ids.exists(x, x == 2)"
    with pytest.raises(CelCompileError, match="type 'any' cannot be range of a comprehension"):
        compile_selector(expression, environment=NEW)
    selector = compile_selector(expression, environment=LIST_GATE_ON)
    assert selector.estimated_cost == 5 + 6 * 64  # 64 elements: the larger of the value and list bounds
    assert selector.evaluate(device_view("dra.example.com", IDS, list_type_attributes=True)) is True


def test_a_dyn_result_is_accepted_only_with_list_type_attributes() -> None:
    with pytest.raises(CelCompileError, match="must evaluate to bool or the unknown type, not dyn"):
        compile_selector("dyn(true)", environment=NEW)
    assert compile_selector("dyn(true)", environment=LIST_GATE_ON).estimated_cost == 1


def test_a_declared_dyn_does_not_mix_with_other_types_in_a_literal() -> None:
    assert not compiles("[dyn(1), 1].size() == 2", NEW)
    assert not compiles(f"[{D}.name, 1].size() == 2", LIST_GATE_ON)
    assert compiles(f"[{D}.name, dyn(1)].size() == 2", LIST_GATE_ON)


def test_each_environment_has_its_own_compiled_selector() -> None:
    expression = f'{D}.name.includes("gpu")'
    assert compile_selector(expression, environment=STORED) is compile_selector(expression, environment=STORED)
    with pytest.raises(CelCompileError):
        compile_selector(expression, environment=NEW)


@pytest.mark.parametrize(("text", "consumable", "list_types"), [
    ("", True, False),
    ("DRAListTypeAttributes=true", True, True),
    (" DRAConsumableCapacity = FALSE , DRAListTypeAttributes=True,", False, True),
])  # fmt: skip
def test_feature_gates_are_read_like_the_apiservers_flag(text: str, consumable: bool, list_types: bool) -> None:
    environment = with_feature_gates(text, NEW)
    assert (environment.kind, environment.consumable_capacity, environment.list_type_attributes) == (
        "new", consumable, list_types)


@pytest.mark.parametrize(("text", "message"), [
    ("DRAPrioritizedList=true", "'DRAPrioritizedList' does not change the DRA CEL environment; tessera knows "
                                "DRAConsumableCapacity, DRAListTypeAttributes"),
    ("DRAListTypeAttributes", "write DRAListTypeAttributes=true or DRAListTypeAttributes=false"),
    ("DRAListTypeAttributes=yes", "write DRAListTypeAttributes=true or DRAListTypeAttributes=false"),
])  # fmt: skip
def test_a_bad_feature_gate_entry_is_named_with_the_fix(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        with_feature_gates(text)


def test_an_unknown_environment_kind_is_refused() -> None:
    with pytest.raises(ValueError, match='kind must be "new" or "stored", not \'old\''):
        CelEnvironment("old")  # type: ignore[arg-type]
