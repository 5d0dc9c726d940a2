"""tessera's cost estimate equals cel-go's (as the apiserver computes it) on size-dependent selectors.

tests/driver/cel/cost_corpus.json pins cel-go's estimate for each case; e2e/test_oracles.py re-checks every
pinned number against Kubernetes' own compiler (the Go oracle), so these tests need no Go."""

from __future__ import annotations

from typing import Any

import pytest

from driver.cel import CelCompileError, compile_selector
from driver.cel.analysis import analyze
from driver.cel.limits import MAX_COST
from driver.cel.syntax import parse
from tests.driver.cel.corpus import COST_CORPUS, load

CASES: list[dict[str, Any]] = load(COST_CORPUS)
BY_NAME = {c["name"]: c for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_estimate_equals_cel_go(case: dict[str, Any]) -> None:
    expression = case["expression"]
    assert analyze(expression, parse(expression)).estimated_cost == case["estimatedCost"], expression


def test_string_doubling_through_cel_bind_is_over_the_limit() -> None:
    # 665 bytes that build a 512 MiB string: once charged 1 per `+` and admitted
    case = BY_NAME["issue12-bind-doubling-23-levels"]
    with pytest.raises(CelCompileError) as info:
        compile_selector(case["expression"])
    assert info.value.message.startswith(f"too complex, exceeds cost limit: estimated cost {case['estimatedCost']} "
                                         f"> {MAX_COST}")


@pytest.mark.parametrize("name", ["bind-doubling-12-levels", "bind-doubling-14-levels"])
def test_shorter_doubling_is_admitted_with_its_size_based_cost(name: str) -> None:
    case = BY_NAME[name]
    assert compile_selector(case["expression"]).estimated_cost == case["estimatedCost"]


@pytest.mark.parametrize(("expression", "cost"), [
    ('device.driver + device.driver == ""', 17),  # 126 bytes of result: ceil(12.6) + 4 for the reads
    ('"a" + "b" == "ab"', 2),
    ("[1, 2] + [3] == [1, 2, 3]", 32),  # list concatenation is O(1)
])  # fmt: skip
def test_concatenation_is_charged_by_the_size_of_its_result(expression: str, cost: int) -> None:
    assert compile_selector(expression).estimated_cost == cost


@pytest.mark.parametrize(("expression", "cost"), [
    ('device.capacity["gpu.tessera.dev"].?memory.orValue(quantity("0")) == quantity("80Gi")', 8),
    ('device.capacity["gpu.tessera.dev"].?memory.value() == quantity("80Gi")', 7),
])  # fmt: skip
def test_an_optional_capacity_compared_as_a_quantity_is_admitted_at_kubernetes_cost(expression: str, cost: int) -> None:
    # issue 24: once estimated at 2^64/10 (an optional's value had no type) and denied as too complex
    from driver.cel import device_view

    selector = compile_selector(expression)
    assert selector.estimated_cost == cost
    gpu = device_view("gpu.tessera.dev", {"name": "gpu-0", "capacity": {"memory": {"value": "80Gi"}}})
    assert selector.evaluate(gpu) is True
