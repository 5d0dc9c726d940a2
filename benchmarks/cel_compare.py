"""CEL evaluations per second: cel-expr-python and cel-python (tessera's engines) against the Go oracle
(the harness's `cel` role: k8s.io/dynamic-resource-allocation/cel, the scheduler's own code), on the
same inputs in the same run.

Inputs: every selector of the shipped DeviceClasses (deviceclasses/*.yaml) on every device of a
DGX H100 and a dynamic-MIG H100 node, and every corpus case (tests/driver/cel/corpus.json) that compiles.

Go runs as one process per batch, so its per-evaluation time is taken from two batches of different
size: (time(K copies) - time(1 copy)) / ((K - 1) * cases). That removes process start and
compilation; it still includes decoding each case's device from JSON and encoding its result,
which the Python figures do not pay, so the ratio understates Go's lead slightly.
(benchmarks.cel_bench is the CEL engineer's per-selector table of the two Python engines.)
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks.stats import table
from driver import DRIVER_NAME
from driver.cel import CelBudgetExceeded, CelCompileError, CelRuntimeError, compile_selector, device_view
from driver.discovery import load_inventory
from driver.slices import build_slices
from tests.driver.cel.corpus import load as load_corpus

REPO = Path(__file__).resolve().parent.parent
ENGINES = ("celexpr", "celpy")
# a 10,000-step comprehension: about a second per evaluation in Python, so it gets its own row
HEAVY = frozenset({"ten-thousand-iterations"})


@dataclass(frozen=True)
class Case:
    """One expression on one device, in ResourceSlice form (driver + device dict)."""

    name: str
    expression: str
    driver: str
    device: dict[str, Any]
    corpus_device: dict[str, Any] | None = None  # the oracle reads corpus devices in their own form

    def oracle_input(self) -> dict[str, Any]:
        if self.corpus_device is not None:
            return {"name": self.name, "expression": self.expression, "device": self.corpus_device}
        return {"name": self.name, "expression": self.expression,
                "device": {"driver": self.driver, "attributes": self.device.get("attributes", {}),
                           "capacity": self.device.get("capacity", {}),
                           "allowMultipleAllocations": self.device.get("allowMultipleAllocations", False)}}


def shipped_selectors() -> list[str]:
    out = []
    for path in sorted((REPO / "deviceclasses").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "DeviceClass":
                out += [s["cel"]["expression"] for s in doc["spec"].get("selectors", []) if "cel" in s]
    return out


def shipped_cases() -> list[Case]:
    devices = [d for profile, strategy in (("dgx-h100-8", "static"), ("h100-16-mig", "dynamic"))
               for s in build_slices(load_inventory("bench", simulate=profile), mig_strategy=strategy)
               for d in s["spec"].get("devices", [])]
    return [Case(f"class{i}/{d['name']}", e, DRIVER_NAME, d)
            for i, e in enumerate(shipped_selectors()) for d in devices]


def _slice_device(device: dict[str, Any]) -> dict[str, Any]:
    """A corpus device (attributes and capacity grouped by domain) as a ResourceSlice device."""
    driver = device["driver"]

    def key(domain: str, name: str) -> str:
        return name if domain == driver else f"{domain}/{name}"

    return {
        "name": "dev",
        "attributes": {key(d, n): v for d, values in device.get("attributes", {}).items() for n, v in values.items()},
        "capacity": {key(d, n): {"value": v} for d, values in device.get("capacity", {}).items()
                     for n, v in values.items()},
        "allowMultipleAllocations": device.get("allowMultipleAllocations", False),
    }


def corpus_cases() -> list[Case]:
    """Corpus cases that compile on both engines (a compile error evaluates nothing)."""
    out = []
    for case in load_corpus(REPO / "tests" / "driver" / "cel" / "corpus.json"):
        try:
            for engine in ENGINES:
                compile_selector(case["expression"], engine=engine)
        except CelCompileError:
            continue
        out.append(Case(case["name"], case["expression"], case["device"]["driver"], _slice_device(case["device"]),
                        case["device"]))
    return out


def python_rate(engine: str, cases: list[Case], budget_s: float) -> float:
    """Evaluations per second, compiled selectors and device views prepared outside the timing."""
    compiled = {e: compile_selector(e, engine=engine) for e in {c.expression for c in cases}}
    pairs = [(compiled[c.expression], device_view(c.driver, c.device)) for c in cases]
    count = 0
    start = time.perf_counter()
    while True:
        for selector, view in pairs:
            # a runtime error is an evaluation too (the scheduler treats it as no match); on the heavy
            # case cel-expr-python stops at its iteration budget, and that stop is what gets timed
            with contextlib.suppress(CelRuntimeError, CelBudgetExceeded):
                selector.evaluate(view)
        count += len(pairs)
        elapsed = time.perf_counter() - start
        if elapsed >= budget_s:
            return count / elapsed


def _run_oracle(harness: Path, cases: list[dict[str, Any]]) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cases, f)
        path = f.name
    try:
        t0 = time.perf_counter()
        proc = subprocess.run([str(harness), "cel", f"--corpus={path}"], capture_output=True, text=True, check=False)
        elapsed = time.perf_counter() - t0
    finally:
        Path(path).unlink()
    if proc.returncode != 0:
        raise RuntimeError(f"the Go CEL oracle failed (rc={proc.returncode}): {proc.stderr[-2000:]}")
    return elapsed


def _go_seconds_per_case(harness: Path, base: list[dict[str, Any]], copies: int, tries: int) -> float:
    small = min(_run_oracle(harness, base) for _ in range(tries))
    big = min(_run_oracle(harness, base * copies) for _ in range(tries))
    return (big - small) / ((copies - 1) * len(base))


def go_rate(harness: Path, cases: list[Case], copies: int, tries: int = 3) -> tuple[float, float]:
    """(raw, net) evaluations per second inside the Go process, process start and compilation subtracted.

    Raw still pays the oracle's JSON decoding of each device and encoding of each result; net also
    subtracts that, measured as the same devices with the expression `true`.
    """
    per_case = _go_seconds_per_case(harness, [c.oracle_input() for c in cases], copies, tries)
    trivial = [{**c.oracle_input(), "expression": "true"} for c in cases]
    io_per_case = _go_seconds_per_case(harness, trivial, copies, tries)
    if per_case <= 0:
        raise RuntimeError("the Go batch difference is not positive: raise --copies so it outweighs the noise")
    net = per_case - io_per_case
    return 1 / per_case, (1 / net if net > 0 else float("inf"))


@dataclass(frozen=True)
class CelResult:
    inputs: str
    cases: int
    rates: dict[str, float]  # engine -> evaluations per second


def run(harness: Path | None, budget_s: float, copies: int, *, include_heavy: bool = True) -> list[CelResult]:
    out = []
    corpus = corpus_cases()
    light = [c for c in corpus if c.name not in HEAVY]
    heavy = [c for c in corpus if c.name in HEAVY]
    sets = [("shipped DeviceClass selectors x node devices", shipped_cases()),
            ("tests/driver/cel corpus, compiling cases but the heavy one", light)]
    if include_heavy:
        sets.append((f"tests/driver/cel corpus: {', '.join(sorted(HEAVY))}", heavy))
    for label, cases in sets:
        rates = {engine: python_rate(engine, cases, budget_s) for engine in ENGINES}
        if harness is not None:
            raw, net = go_rate(harness, cases, copies)
            rates["go (cel-go oracle)"] = raw
            rates["go minus JSON I/O"] = net
        out.append(CelResult(label, len(cases), rates))
    return out


def render(results: list[CelResult]) -> str:
    engines = list(results[0].rates)
    rows = []
    for r in results:
        # the raw Go rate still pays JSON decoding per case: its ratio is a lower bound on Go's lead
        go = r.rates.get("go (cel-go oracle)")
        ratios = [f"{go / r.rates[e]:.2f}x" if go else "n/a" for e in ENGINES]
        rows.append([r.inputs, r.cases, *(_rate(r.rates[e]) for e in engines), *ratios])
    note = ("\n`go minus JSON I/O` subtracts the same devices with the expression `true`; \"below resolution\" "
            "means the evaluation cost is lost in the decoding cost's run-to-run noise. On the heavy case "
            "cel-expr-python stops at its 10,000-iteration budget (outcome unknown) rather than finishing it.")
    return "CEL evaluations per second (one thread)\n" + table(
        ["inputs", "cases", *engines, *(f"go (raw) / {e}" for e in ENGINES)], rows) + note


def _rate(value: float) -> str:
    if value == float("inf"):
        return "below resolution"
    return f"{value:,.0f}" if value >= 10 else f"{value:.2f}"


def main() -> None:
    import argparse
    import os

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=2.0, help="time budget per Python engine and input set")
    parser.add_argument("--copies", type=int, default=20, help="repetitions of the inputs in the big Go batch")
    args = parser.parse_args()
    harness = Path(os.environ["TESSERA_HARNESS"]) if os.environ.get("TESSERA_HARNESS") else None
    print(render(run(harness, args.seconds, args.copies)))


if __name__ == "__main__":
    main()
