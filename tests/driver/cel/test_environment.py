"""The DRA CEL environment as a selector author and the scheduler see it, on both engines."""

from __future__ import annotations

import threading

import pytest

from driver.cel import (
    DEFAULT_ENGINE,
    ENGINE_ENV_VAR,
    CelCompileError,
    CelRuntimeError,
    DeviceViewError,
    compile_selector,
    device_view,
)
from driver.cel.limits import MAX_EXPRESSION_BYTES
from driver.quantity import Quantity
from driver.semver import Version

DRIVER = "gpu.tessera.dev"
A = f'device.attributes["{DRIVER}"]'
GPU = {
    "name": "gpu-0",
    "attributes": {
        "type": {"string": "gpu"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "driverVersion": {"version": "550.54.15"},
        "numaNode": {"int": 1},
        "migCapable": {"bool": True},
        "resource.kubernetes.io/pciBusID": {"string": "0000:1b:00.0"},
    },
    "capacity": {"memory": {"value": "80Gi"}, "multiprocessors": {"value": "132"}},
    "allowMultipleAllocations": True,
}

ENGINES = ["celexpr", "celpy"]


@pytest.fixture(scope="module")
def gpu():
    return device_view(DRIVER, GPU)


def run(expression: str, engine: str, device) -> bool:
    return compile_selector(expression, engine=engine).evaluate(device)


@pytest.mark.parametrize("engine", ENGINES)
def test_typical_class_selector_matches(engine: str, gpu) -> None:
    expression = (f'device.driver == "{DRIVER}" && {A}.type == "gpu" && '
                  f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0 && '
                  f'{A}.driverVersion.isGreaterThan(semver("550.0.0"))')
    assert run(expression, engine, gpu) is True


@pytest.mark.parametrize("engine", ENGINES)
def test_missing_key_is_a_runtime_error_naming_the_key(engine: str, gpu) -> None:
    with pytest.raises(CelRuntimeError, match="no such key: profile"):
        run(f'{A}.profile == "1g.10gb"', engine, gpu)


@pytest.mark.parametrize("engine", ENGINES)
def test_unknown_domain_is_an_empty_map(engine: str, gpu) -> None:
    assert run('size(device.attributes["nvidia.com"]) == 0', engine, gpu) is True
    assert run('"nvidia.com" in device.attributes', engine, gpu) is False
    with pytest.raises(CelRuntimeError, match="no such key: model"):
        run('device.attributes["nvidia.com"].model == "x"', engine, gpu)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    "expression",
    [f'"profile" in {A} && {A}.profile == "1g.10gb"', f'has({A}.profile) && {A}.profile == "1g.10gb"',
     f'{A}.type == "mig" && {A}.profile == "1g.10gb"'],
)
def test_guarded_reads_give_false_not_an_error(engine: str, expression: str, gpu) -> None:
    assert run(expression, engine, gpu) is False


def test_optional_guard_on_the_default_engine(gpu) -> None:
    assert run(f'{A}.?profile.orValue("none") == "none"', DEFAULT_ENGINE, gpu) is True


@pytest.mark.parametrize("engine", ENGINES)
def test_non_bool_result_is_a_runtime_error(engine: str, gpu) -> None:
    with pytest.raises(CelRuntimeError, match="could not be converted to bool"):
        run(f"{A}.productName", engine, gpu)


@pytest.mark.parametrize("engine", ENGINES)
def test_bind(engine: str, gpu) -> None:
    assert run(f'cel.bind(g, {A}, g.numaNode == 1 && g.migCapable)', engine, gpu) is True


@pytest.mark.parametrize("engine", ENGINES)
def test_string_extension(engine: str, gpu) -> None:
    # (split(" ")[1].lowerAscii() would exceed the apiserver's cost limit: an element of split() has no
    # known size)
    assert run(f'{A}.productName.split(" ")[0] == "NVIDIA" && {A}.productName.lowerAscii().contains("h100")',
               engine, gpu) is True


@pytest.mark.parametrize("engine", ENGINES)
def test_standard_attribute_domain(engine: str, gpu) -> None:
    assert run('device.attributes["resource.kubernetes.io"].pciBusID.startsWith("0000:1b")', engine, gpu) is True


@pytest.mark.parametrize("engine", ENGINES)
def test_allow_multiple_allocations(engine: str, gpu) -> None:
    assert run("device.allowMultipleAllocations", engine, gpu) is True
    plain = device_view(DRIVER, {"name": "gpu-1"})
    assert run("device.allowMultipleAllocations", engine, plain) is False


def test_compile_error_shows_the_expression_and_a_caret() -> None:
    with pytest.raises(CelCompileError) as info:
        compile_selector("device.driver == 1 && device.foo")
    err = info.value
    assert err.expression == "device.driver == 1 && device.foo"
    assert err.column == 15
    lines = str(err).splitlines()
    assert lines[1] == " | device.driver == 1 && device.foo"
    assert lines[2] == " | " + " " * 14 + "^"
    assert "_==_" in err.message


def test_syntax_error_column_on_a_later_line() -> None:
    with pytest.raises(CelCompileError) as info:
        compile_selector('device.driver == "x" &&\n  )')
    assert (info.value.line, info.value.column) == (2, 3)
    assert "line 2, column 3" in str(info.value)


def test_expression_over_the_length_limit_is_rejected_without_compiling() -> None:
    expression = '"' + "x" * MAX_EXPRESSION_BYTES + '" == device.driver'
    with pytest.raises(CelCompileError, match="too long") as info:
        compile_selector(expression)
    assert info.value.column == 0


def test_length_limit_counts_utf8_bytes() -> None:
    expression = 'device.driver == "' + "é" * 5200 + '"'
    assert len(expression) < MAX_EXPRESSION_BYTES < len(expression.encode())
    with pytest.raises(CelCompileError, match="too long"):
        compile_selector(expression)


@pytest.mark.parametrize("engine", ENGINES)
def test_cost_limit_rejects_nested_comprehensions_over_strings(engine: str) -> None:
    name = f"{A}.productName.split(\"\")"
    hostile = f'{name}.all(a, {name}.all(b, {name}.all(c, {name}.all(d, a + b + c + d != ""))))'
    with pytest.raises(CelCompileError, match="exceeds cost limit"):
        compile_selector(hostile, engine=engine)


def test_engine_from_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENGINE_ENV_VAR, "celpy")
    assert compile_selector("true").engine == "celpy"
    monkeypatch.setenv(ENGINE_ENV_VAR, "celexpr")
    assert compile_selector("true").engine == "celexpr"
    assert compile_selector("true", engine="celpy").engine == "celpy"


def test_unknown_engine_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown CEL engine 'rust'"):
        compile_selector("true", engine="rust")
    monkeypatch.setenv(ENGINE_ENV_VAR, "go")
    with pytest.raises(ValueError, match=ENGINE_ENV_VAR):
        compile_selector("true")


def test_compiled_selectors_are_cached() -> None:
    first = compile_selector('device.driver == "cached"')
    assert compile_selector('device.driver == "cached"') is first


def test_compile_errors_are_not_cached_as_successes() -> None:
    for _ in range(2):
        with pytest.raises(CelCompileError):
            compile_selector("device.nope")


@pytest.mark.parametrize("engine", ENGINES)
def test_evaluation_is_thread_safe(engine: str) -> None:
    selector = compile_selector(f"{A}.numaNode == 1", engine=engine)
    devices = [device_view(DRIVER, {"name": f"gpu-{i}", "attributes": {"numaNode": {"int": i % 2}}})
               for i in range(40)]
    results: dict[int, bool] = {}

    def work(offset: int) -> None:
        for i in range(offset, len(devices), 4):
            results[i] = selector.evaluate(devices[i])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: i % 2 == 1 for i in range(40)}


def test_device_view_splits_domains_and_parses_values() -> None:
    view = device_view(DRIVER, GPU)
    assert view.attributes[DRIVER]["driverVersion"] == Version.parse("550.54.15")
    assert view.attributes["resource.kubernetes.io"]["pciBusID"] == "0000:1b:00.0"
    assert view.capacity[DRIVER]["memory"] == Quantity.parse("80Gi")
    assert view.allow_multiple_allocations is True


def test_device_view_reads_capacity_through_the_canonical_form() -> None:
    view = device_view(DRIVER, {"name": "d", "capacity": {"memory": {"value": "1000m"}}})
    assert view.capacity[DRIVER]["memory"].as_int64() == 1


def test_device_view_list_attributes() -> None:
    view = device_view(DRIVER, {"name": "d", "attributes": {"ids": {"ints": [1, 2]}}})
    assert view.attributes[DRIVER]["ids"] == [1, 2]


@pytest.mark.parametrize(
    ("device", "path"),
    [
        ({"attributes": {"v": {"version": "v1.0.0"}}}, "attributes['v'].version"),
        ({"attributes": {"v": {"int": "3"}}}, "attributes['v'].int"),
        ({"attributes": {"v": {"int": 1, "bool": True}}}, "attributes['v']"),
        ({"attributes": {"v": {"float": 1.5}}}, "attributes['v']"),
        ({"capacity": {"memory": {"value": "80 Gi"}}}, "capacity['memory'].value"),
        ({"capacity": {"memory": "80Gi"}}, "capacity['memory'].value"),
        ({"allowMultipleAllocations": "yes"}, "allowMultipleAllocations"),
    ],
)
def test_device_view_errors_name_the_field(device: dict, path: str) -> None:
    with pytest.raises(DeviceViewError) as info:
        device_view(DRIVER, {"name": "d", **device})
    assert info.value.path == path


def test_without_cel_expr_python_the_default_fails_instead_of_falling_back_to_celpy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from driver.cel import selector

    monkeypatch.delenv(ENGINE_ENV_VAR, raising=False)
    monkeypatch.setattr(selector, "celexpr_available", lambda: False)
    with pytest.raises(selector.CelEngineMissing, match=f"set {ENGINE_ENV_VAR}=celpy"):
        compile_selector('device.driver == "no-fallback"')
    # chosen by name, either engine is used
    assert compile_selector('device.driver == "no-fallback"', engine="celpy").engine == "celpy"
    monkeypatch.setenv(ENGINE_ENV_VAR, "celpy")
    assert compile_selector('device.driver == "no-fallback"').engine == "celpy"


@pytest.mark.parametrize("engine", ENGINES)
def test_capacity_is_read_in_its_canonical_form(engine: str) -> None:
    # the apiserver stores 1000m as "1": the scheduler sees an integer, a literal 1000m is not one
    view = device_view(DRIVER, {"name": "d", "capacity": {"cores": {"value": "1000m"}}})
    assert run(f'device.capacity["{DRIVER}"].cores.isInteger()', engine, view) is True
    assert run('quantity("1000m").isInteger()', engine, view) is False


@pytest.mark.parametrize("engine", ENGINES)
def test_list_attributes_need_the_feature_gate(engine: str) -> None:
    device = {"name": "d", "attributes": {"ids": {"ints": [1, 2]}, "n": {"int": 1}}}
    with pytest.raises(CelRuntimeError, match=f"attribute {DRIVER}/ids: unsupported attribute value"):
        run(f"{A}.n == 1", engine, device_view(DRIVER, device))
    gated = device_view(DRIVER, device, list_type_attributes=True)
    assert run(f"{A}.ids.includes(2)", engine, gated) is True


def test_non_string_expression_is_a_compile_error() -> None:
    with pytest.raises(CelCompileError, match="must be a string, not int"):
        compile_selector(42)  # type: ignore[arg-type]
    with pytest.raises(CelCompileError, match="must be a string, not dict"):
        compile_selector({"cel": "true"})  # type: ignore[arg-type]
