"""Seeded differential tests of tessera's CEL environment against Kubernetes' own (the Go oracle,
`tessera-harness cel`), compiled as the apiserver compiles a selector: outcome and estimated cost.

- Optional values (`.?`, `[?]`, optional.of/none/ofNonZeroValue, first/last, or, optMap/optFlatMap,
  orValue/value/hasValue): random selectors from fixed seeds (tests/driver/cel/fuzz_oracle.py).
- The two environments (new vs stored expressions) under every setting of the DRAConsumableCapacity
  and DRAListTypeAttributes gates, on the forms they change.

No cluster is needed, only the harness binary (built by e2e/harness/build.sh, or $TESSERA_HARNESS).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from e2e.cluster import harness_path
from tests.driver.cel.fuzz_oracle import DEVICE, A, differential, optional_cases

SEEDS = (1, 2, 3, 4)
PER_SEED = 250


@pytest.fixture(scope="module")
def harness() -> str:
    return str(harness_path())


@pytest.mark.parametrize("seed", SEEDS)
def test_optional_forms_agree_with_kubernetes_in_outcome_and_cost(harness: str, seed: int) -> None:
    disagreements = differential(harness, optional_cases(seed, PER_SEED))
    assert not disagreements, f"{len(disagreements)} of {PER_SEED}:\n" + "\n".join(disagreements[:20])


LIST_DEVICE: dict[str, Any] = {**DEVICE, "attributes": {**DEVICE["attributes"], "gpu.tessera.dev": {
    **DEVICE["attributes"]["gpu.tessera.dev"], "ids": {"ints": [1, 2, 3]}, "tags": {"strings": ["a", "b"]}}}}
ENVIRONMENT_FORMS = [
    "device.allowMultipleAllocations",
    f"{A}.type.includes(\"gpu\")",
    f"{A}.ids.includes(2)",
    f"{A}.ids.exists(x, x == 2)",
    f"{A}.tags.all(t, t != \"\")",
    f"{A}.type.exists(x, x == \"g\")",
    f"size({A}.tags) == 2",
    f"{A}.numaNode == 1",
    "dyn(true)",
    f"[{A}.numaNode, dyn(1)].size() == 2",
    f"{A}.?ids.orValue([]).size() == 3",
]


@pytest.mark.parametrize(("kind", "consumable", "list_types"),
                         list(itertools.product(("new", "stored"), (False, True), (False, True))))
def test_environment_dependent_forms_agree_with_kubernetes(harness: str, kind: str, consumable: bool,
                                                           list_types: bool) -> None:
    env = {"type": kind, "consumableCapacity": consumable, "listTypeAttributes": list_types}
    device = LIST_DEVICE if list_types else DEVICE
    cases = [{"name": f"env-{i}", "expression": e, "device": device, "env": env}
             for i, e in enumerate(ENVIRONMENT_FORMS)]
    disagreements = differential(harness, cases)
    assert not disagreements, "\n".join(disagreements)
