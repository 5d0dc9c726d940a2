"""The differential corpus (tests/driver/cel/corpus.json) on both engines.

Expected values encode Kubernetes' behaviour (to be confirmed by the Go oracle, e2e/harness cel).
A case an engine gets wrong must be listed in tests/driver/cel/known_differences.yaml with the reason;
an unlisted difference fails, and so does a listed one that no longer differs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from driver.cel import DEFAULT_ENGINE, ENGINES
from tests.driver.cel.corpus import load, load_cases, load_known_differences, outcome

CASES = load_cases()
KNOWN = load_known_differences()


def test_corpus_is_well_formed() -> None:
    names = [c["name"] for c in CASES]
    assert len(names) == len(set(names)), "case names must be unique"
    for c in CASES:
        assert set(c) >= {"name", "expression", "device", "expect"}, c["name"]
        assert c["expect"] in (True, False, {"error": "compile"}, {"error": "runtime"}), c["name"]
        assert set(c["device"]) <= {"driver", "attributes", "capacity", "allowMultipleAllocations"}, c["name"]


def test_a_case_naming_a_device_missing_from_the_table_is_refused(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.json"
    corpus.write_text(json.dumps({"devices": {"gpu": {"driver": "gpu.tessera.dev"}},
                                  "cases": [{"name": "a", "expression": "true", "device": "gpu", "expect": True},
                                            {"name": "b", "expression": "true", "device": "mig", "expect": True}]}))
    with pytest.raises(ValueError, match=r"corpus\.json: cases name devices missing from its `devices` table: mig$"):
        load(corpus)


def test_known_differences_name_real_cases() -> None:
    names = {c["name"] for c in CASES}
    for engine, diffs in KNOWN.items():
        assert engine in ENGINES
        for name, reason in diffs.items():
            assert name in names, f"{engine}: unknown case {name}"
            assert len(reason) > 20, f"{engine}/{name}: say why"


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_case(case: dict, engine: str) -> None:
    got, message = outcome(case, engine)
    known = KNOWN.get(engine, {}).get(case["name"])
    if known is None:
        assert got == case["expect"], f"{case['expression']!r}: expected {case['expect']}, got {got} {message}"
    else:
        assert got != case["expect"], f"listed as a known difference but {engine} now agrees: remove it"


def test_default_engine_agrees_with_kubernetes_on_the_most_cases() -> None:
    agreements = {engine: sum(outcome(c, engine)[0] == c["expect"] for c in CASES) for engine in ENGINES}
    assert agreements[DEFAULT_ENGINE] == max(agreements.values()), agreements
