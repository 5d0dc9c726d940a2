"""Static analysis: which attributes/capacities a selector reads, guardedness, result type, cost."""

from __future__ import annotations

import pytest

from driver.cel import AttributeRead, CelCompileError, compile_selector
from driver.cel.analysis import analyze
from driver.cel.syntax import parse

A = 'device.attributes["gpu.tessera.dev"]'


def reads(expression: str) -> list[tuple[str, str, str, bool]]:
    return [(r.kind, r.domain, r.name, r.guarded) for r in compile_selector(expression).reads]


def test_plain_read_is_unguarded_and_resolves_the_domain() -> None:
    (read,) = compile_selector(A + '.productName == "x"').reads
    assert read == AttributeRead("attribute", "gpu.tessera.dev", "productName", False, 38, "string")


def test_standard_domain_is_resolved() -> None:
    assert reads('device.attributes["resource.kubernetes.io"].pciBusID != ""') == [
        ("attribute", "resource.kubernetes.io", "pciBusID", False)]


def test_select_form_domain_and_index_form_name() -> None:
    assert reads('device.attributes.example["name"] == "x"') == [("attribute", "example", "name", False)]


def test_capacity_read() -> None:
    assert reads('device.capacity["gpu.tessera.dev"].memory.isInteger()') == [
        ("capacity", "gpu.tessera.dev", "memory", False)]


@pytest.mark.parametrize(
    "expression",
    [
        f'"profile" in {A} && {A}.profile == "1g.10gb"',
        f'{A}.profile == "1g.10gb" && "profile" in {A}',
        f'has({A}.profile) && {A}.profile == "1g.10gb"',
        f'has({A}.profile) ? {A}.profile == "1g.10gb" : false',
        f'!has({A}.profile) ? false : {A}.profile == "1g.10gb"',
        f'!("profile" in {A}) || {A}.profile == "1g.10gb"',
        f'{A}.?profile.orValue("") == "1g.10gb"',
        f'{A}[?"profile"].orValue("") == "1g.10gb"',
        f'("type" in {A} && "profile" in {A}) && ({A}.type == "mig" && {A}.profile == "1g.10gb")',
    ],
)
def test_guard_forms_mark_every_profile_read_guarded(expression: str) -> None:
    profile_reads = [r for r in compile_selector(expression).reads if r.name == "profile"]
    assert profile_reads
    assert all(r.guarded for r in profile_reads), profile_reads


@pytest.mark.parametrize(
    "expression",
    [
        f'{A}.profile == "1g.10gb"',
        f'{A}.profile == "1g.10gb" || "profile" in {A}',  # a positive test guards nothing in ||
        f'has({A}.profile) ? false : {A}.profile == "x"',  # the else branch runs when it is absent
        f'"uuid" in {A} && {A}.profile == "x"',  # guards a different attribute
        f'"profile" in device.attributes["other.dev"] && {A}.profile == "x"',  # a different domain
    ],
)
def test_unguarded_reads_are_reported(expression: str) -> None:
    profile_reads = [r for r in compile_selector(expression).reads if r.name == "profile" and
                     r.domain == "gpu.tessera.dev"]
    assert any(not r.guarded for r in profile_reads)


def test_bind_resolves_the_alias() -> None:
    assert reads(f'cel.bind(g, {A}, g.type == "mig" && "profile" in g && g.profile == "x")') == [
        ("attribute", "gpu.tessera.dev", "type", False),
        ("attribute", "gpu.tessera.dev", "profile", True),
        ("attribute", "gpu.tessera.dev", "profile", True),
    ]


def test_bind_of_the_attributes_map_resolves_domains() -> None:
    assert reads('cel.bind(attrs, device.attributes, attrs["gpu.tessera.dev"].uuid != "")') == [
        ("attribute", "gpu.tessera.dev", "uuid", False)]


def test_dynamic_key_is_star() -> None:
    assert reads(f'["uuid", "type"].exists(k, {A}[k] == "gpu")') == [("attribute", "gpu.tessera.dev", "*", False)]


def test_iterating_a_domain_guards_its_own_keys() -> None:
    assert reads(f'{A}.exists(k, {A}[k] == 7)') == [("attribute", "gpu.tessera.dev", "*", True)]


def test_nested_comprehension_over_domains() -> None:
    assert reads('device.attributes.all(d, device.attributes[d].exists(k, k == "x"))') == []


def test_column_points_at_the_name() -> None:
    expression = f'{A}.type == "gpu" && {A}.numaNode == 0'
    columns = [r.column for r in compile_selector(expression).reads]
    assert [expression[c - 1:c + 3] for c in columns] == ["type", "numa"]


def test_value_type_from_usage() -> None:
    sel = compile_selector(f'{A}.driverVersion.isGreaterThan(semver("550.0.0")) && {A}.numaNode == 0 && '
                           f'{A}.productName.startsWith("NVIDIA")')
    assert [r.value_type for r in sel.reads] == ["semver", "int", "string"]


@pytest.mark.parametrize(
    ("expression", "result_type"),
    [("true", "bool"), (f"{A}.migCapable", "dyn"), ('device.driver == "x"', "bool"),
     (f'{A}.?migCapable.orValue(false)', "dyn"), ("device.allowMultipleAllocations", "bool")],
)
def test_result_type(expression: str, result_type: str) -> None:
    assert compile_selector(expression).result_type == result_type


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("device.foo", "undefined field 'foo'"),
        ('device.driver + "x"', "must evaluate to bool"),
        ('[1, "a"].size() == 2', "homogeneous"),
        ('device.driver.matches("(")', "invalid regular expression"),
        ('quantity("1").sign() == 1', "no matching overload for 'sign'"),
        ("nosuchfunction(1)", "undeclared reference to 'nosuchfunction'"),
        ("device.attributes[1].x", "keys of device maps are strings"),
        ('quantity("1") < quantity("2")', "no matching overload for '_<_'"),
        ('"abc".reverse() == "cba"', "no matching overload for 'reverse'"),
        ("x.exists(y, true)", "undeclared reference to 'x'"),
    ],
)
def test_static_errors(expression: str, message: str) -> None:
    with pytest.raises(CelCompileError, match=message):
        compile_selector(expression)


D = 'device.attributes["dra.example.com"]'
DC = 'device.capacity["dra.example.com"]'
TEN = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"


def _seven_nested_alls() -> str:
    body = "int('1'.find('[0-9]*')) < 100"
    for var in ("z5", "z4", "z3", "z2", "z", "y", "x"):
        body = f"{TEN}.all({var}, {body})"
    return body


# Estimated costs pinned by Kubernetes' own DRA CEL tests (k8s.io/dynamic-resource-allocation
# cel/compile_test.go); the estimator reproduces cel-go's model for these shapes.
@pytest.mark.parametrize(
    ("expression", "cost"),
    [
        ('device.attributes["no-such-domain"].noSuchAttr.isGreaterThan(quantity("0"))', 6),
        ('"no-such-domain" in device.attributes', 3),
        ('device.driver == ""', 2),
        ('device.driver == "dra.example.com"', 4),
        (f"{D}.name", 4),
        (f'{D}["name"]', 4),
        (f"cel.bind(dra, {D}, dra.name)", 15),
        (f"{D}.name > 0", 5),
        (f'{D}.name == "fish"', 5),
        (f"{D}.names.exists(x, x > 0)", 5 + 6 * 64),
        (f'{D}.names.all(x, x != "")', 5 + 4 * 64),
        (f'{D}.names.all(x, x.isGreaterThan(semver("0.0.1")))', 5 + 6 * 64),
        (f'{D}.name.exists(x, x.isGreaterThan(semver("0.0.1")))', 5 + 7 * 64),
        (f"{D}.names.size() == 2", 6),
        (f"{D}.name.includes(true)", 4 + 48),
        (f'{D}.name.includes(semver("1.0.0"))', 4 + 48 + 1),
        (f"1 in {D}.names", 4 + 64),
        (f'{D}.name.isGreaterThan(semver("0.0.1"))', 6),
        (f'{D}.name.isGreaterThan(semver("v0.0.1", true)) && isSemver("v1.0.0", true)', 7),
        (f'{DC}.name.isGreaterThan(quantity("1Ki"))', 6),
        (f'"name" in {DC} && {DC}.name.isGreaterThan(quantity("1Ki"))', 10),
        (f'!("name" in {DC}) || {DC}.name.isGreaterThan(quantity("1Ki"))', 11),
        (f"{D}.a && {D}.b && {D}.c", 12),
        ('device.attributes.exists_one(x, x == "dra.example.com")', 164),
        (f'{D}.exists_one(x, x == "services")', 133),
        ('device.capacity.exists_one(x, x == "dra.example.com")', 164),
        (f'{DC}.exists_one(x, x == "memory")', 133),
        (f'{D}.services.split("example").size() >= 2', 19),
        (f'{D}.services.matches("[^a]?sym")', 18),
        ("device.allowMultipleAllocations == true", 3),
        (_seven_nested_alls(), 85_555_551),
    ],
)
def test_estimated_cost_matches_pinned_kubernetes_values(expression: str, cost: int) -> None:
    assert analyze(expression, parse(expression)).estimated_cost == cost


def test_cost_of_a_range_with_a_literal_bound_is_finite() -> None:
    assert analyze("lists.range(3).all(i, i < 3)", parse("lists.range(3).all(i, i < 3)")).estimated_cost < 100


def test_cost_of_a_range_with_an_unknown_bound_is_rejected() -> None:
    with pytest.raises(CelCompileError, match="exceeds cost limit"):
        compile_selector(f"lists.range({A}.numaNode).all(i, i >= 0)")
