"""The Go oracles (Kubernetes' own CEL library and structured allocator) against tessera's code."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import DRIVER, Cluster
from e2e.processes import REPO
from tests.driver.cel.corpus import load as load_corpus

CEL_CORPUS_DIR = REPO / "tests" / "driver" / "cel"


def harness_json(cluster: Cluster, role: str, payload: object, *args: str) -> tuple[int, Any]:
    proc = subprocess.run([str(cluster.harness), role, *args], input=json.dumps(payload), capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.stdout, f"{role}: no output (rc={proc.returncode}); stderr:\n{proc.stderr[-2000:]}"
    return proc.returncode, json.loads(proc.stdout)


GPU = {"driver": DRIVER, "allowMultipleAllocations": True,
       "attributes": {DRIVER: {"type": {"string": "gpu"}, "productName": {"string": "NVIDIA H100 80GB HBM3"},
                               "cudaComputeCapability": {"version": "9.0.0"}, "numaNode": {"int": 0}}},
       "capacity": {DRIVER: {"memory": "81559Mi"}}}


def test_cel_oracle_distinguishes_results_compile_and_runtime_errors(cluster: Cluster) -> None:
    cases = [
        {"name": "true", "expression": f'device.attributes["{DRIVER}"].type == "gpu"', "device": GPU},
        {"name": "false", "expression": f'device.attributes["{DRIVER}"].numaNode == 1', "device": GPU},
        {"name": "quantity", "expression": f'device.capacity["{DRIVER}"].memory.compareTo(quantity("80Gi")) < 0',
         "device": GPU},
        {"name": "semver", "device": GPU,
         "expression": f'device.attributes["{DRIVER}"].cudaComputeCapability.isGreaterThan(semver("8.0.0"))'},
        {"name": "missing", "expression": f'device.attributes["{DRIVER}"].profile == "1g.10gb"', "device": GPU},
        {"name": "syntax", "expression": "device.driver ==", "device": GPU},
    ]
    rc, results = harness_json(cluster, "cel", cases)
    assert rc == 0
    by_name = {r["name"]: r for r in results}
    assert by_name["true"]["result"] is True
    assert by_name["false"]["result"] is False
    assert by_name["quantity"]["result"] is True  # 81559Mi is just under 80Gi
    assert by_name["semver"]["result"] is True
    assert by_name["missing"]["error"] == "runtime"
    assert by_name["syntax"]["error"] == "compile"


def _corpus_files() -> list[Path]:
    return sorted(CEL_CORPUS_DIR.glob("*.json")) if CEL_CORPUS_DIR.is_dir() else []


def _oracle_outcome(result: dict[str, Any]) -> Any:
    return result["result"] if "result" in result else {"error": result["error"]}


@pytest.mark.parametrize("corpus", _corpus_files() or [None], ids=lambda p: p.name if p else "no-corpus")
def test_go_oracle_confirms_every_expectation_of_the_corpus(cluster: Cluster, corpus: Path | None) -> None:
    """The corpus pins Kubernetes' behaviour; Kubernetes' own CEL library must agree with every entry."""
    if corpus is None:
        pytest.skip("tests/driver/cel/*.json (the CEL corpus) does not exist yet")
    cases = load_corpus(corpus)
    rc, oracle = harness_json(cluster, "cel", cases)
    assert rc == 0
    wrong = [f"{c['name']}: corpus says {c['expect']}, Kubernetes gives {o}: {c['expression']}"
             for c, o in zip(cases, oracle, strict=True) if "expect" in c and _oracle_outcome(o) != c["expect"]]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("engine", ["celexpr", "celpy"])
def test_tessera_cel_engines_agree_with_kubernetes_on_the_corpus(cluster: Cluster, engine: str) -> None:
    """Every case on tessera's engines against the Go oracle; only documented differences are allowed."""
    try:
        from tests.driver.cel.corpus import load_known_differences, outcome
    except ImportError as exc:
        pytest.skip(f"the CEL corpus helpers (tests/driver/cel/corpus.py) are not there yet: {exc}")
    cases = load_corpus(CEL_CORPUS_DIR / "corpus.json")
    known = load_known_differences().get(engine, {})
    rc, oracle = harness_json(cluster, "cel", cases)
    assert rc == 0
    disagreements = []
    for case, want in zip(cases, oracle, strict=True):
        got, message = outcome(case, engine)
        if got != _oracle_outcome(want) and case["name"] not in known:
            disagreements.append(f"{case['name']}: tessera/{engine} {got} ({message}), kubernetes {want}: "
                                 f"{case['expression']}")
    assert not disagreements, "\n".join(disagreements)


def test_tessera_cost_estimate_equals_the_apiservers_on_the_cost_corpus(cluster: Cluster) -> None:
    """tests/driver/cel/cost_corpus.json: size-dependent selectors whose estimate tessera must get exactly as
    Kubernetes' validation computes it (k8s.io/dynamic-resource-allocation/cel with cost estimation)."""
    from driver.cel.analysis import analyze
    from driver.cel.syntax import parse

    cases = load_corpus(CEL_CORPUS_DIR / "cost_corpus.json")
    rc, oracle = harness_json(cluster, "cel", cases)
    assert rc == 0
    wrong = []
    for case, result in zip(cases, oracle, strict=True):
        mine = analyze(case["expression"], parse(case["expression"])).estimated_cost
        if not mine == result.get("estimatedCost") == case["estimatedCost"]:
            wrong.append(f"{case['name']}: tessera {mine}, kubernetes {result.get('estimatedCost')}, corpus "
                         f"{case['estimatedCost']}: {case['expression'][:120]}")
    assert not wrong, "\n".join(wrong)


def test_allocator_oracle_places_an_nvlink_quad_on_one_island(cluster: Cluster) -> None:
    try:
        from driver.discovery import load_inventory
        from driver.slices import build_slices
    except ImportError as exc:
        pytest.skip(f"driver.slices is not there yet: {exc}")
    node = "oracle-node"
    slices = build_slices(load_inventory(node, simulate="a100-pcie-4"), mig_strategy="none")
    for i, s in enumerate(slices):
        s.setdefault("metadata", {})["name"] = f"{node}-{i}"
    claim: dict[str, Any] = {
        "metadata": {"name": "pair", "namespace": "default", "uid": "00000000-0000-0000-0000-000000000001"},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER, "allocationMode": "ExactCount",
                                                      "count": 2}}],
            "constraints": [{"matchAttribute": f"{DRIVER}/nvlinkIsland"}]}},
    }
    klass = {"metadata": {"name": DRIVER},
             "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}
    payload = {"node": {"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}},
               "slices": slices, "classes": [klass], "claims": [claim]}
    rc, out = harness_json(cluster, "allocate", payload)
    assert rc == 0, out
    allocations: list[dict[str, Any]] = out["allocations"]
    (allocation,) = allocations
    devices = sorted(r["device"] for r in allocation["devices"]["results"])
    assert devices in (["gpu-0", "gpu-1"], ["gpu-2", "gpu-3"]), devices
    # Four GPUs on one island do not exist on this node: the allocator finds no solution.
    claim["spec"]["devices"]["requests"][0]["exactly"]["count"] = 4
    rc, out = harness_json(cluster, "allocate", payload)
    assert rc == 0, out
    assert not out["allocations"]
