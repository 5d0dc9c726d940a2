"""Load the differential corpus (corpus.json) and run a case on one engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from driver.cel import (
    STORED,
    CelBudgetExceeded,
    CelCompileError,
    CelEnvironment,
    CelRuntimeError,
    compile_selector,
    device_view,
)

HERE = Path(__file__).parent
CORPUS = HERE / "corpus.json"
COST_CORPUS = HERE / "cost_corpus.json"
KNOWN_DIFFERENCES = HERE / "known_differences.yaml"
K8S_TABLE = HERE / "k8s_table.json"


def load(path: Path) -> list[dict[str, Any]]:
    """A corpus file's cases, each with the name of its device replaced by the device from the file's
    `devices` table: the list form the Go oracle (`tessera-harness cel`) reads."""
    data: dict[str, Any] = json.loads(path.read_text())
    devices: dict[str, dict[str, Any]] = data["devices"]
    cases: list[dict[str, Any]] = data["cases"]
    unknown = sorted({c["device"] for c in cases} - devices.keys())
    if unknown:
        raise ValueError(f"{path.name}: cases name devices missing from its `devices` table: {', '.join(unknown)}")
    return [{**case, "device": devices[case["device"]]} for case in cases]


def load_cases() -> list[dict[str, Any]]:
    return load(CORPUS)


def load_known_differences() -> dict[str, dict[str, str]]:
    data: dict[str, dict[str, str]] = yaml.safe_load(KNOWN_DIFFERENCES.read_text())
    return data


def slice_device(device: dict[str, Any]) -> dict[str, Any]:
    """The corpus device (grouped by domain) as a ResourceSlice v1 device dict."""
    driver = device["driver"]
    attributes = {
        (name if domain == driver else f"{domain}/{name}"): value
        for domain, values in device.get("attributes", {}).items()
        for name, value in values.items()
    }
    capacity = {
        (name if domain == driver else f"{domain}/{name}"): {"value": value}
        for domain, values in device.get("capacity", {}).items()
        for name, value in values.items()
    }
    return {"name": "dev", "attributes": attributes, "capacity": capacity,
            "allowMultipleAllocations": device.get("allowMultipleAllocations", False)}


def environment(case: dict[str, Any]) -> CelEnvironment:
    """The case's `env` (as e2e/harness cel reads it), else the scheduler's stored environment."""
    env = case.get("env")
    if env is None:
        return STORED
    return CelEnvironment(env["type"], env["consumableCapacity"], env["listTypeAttributes"])


def outcome(case: dict[str, Any], engine: str) -> tuple[Any, str]:
    """(True | False | {"error": "compile"|"runtime"|"budget"|"cost"}, message). "budget": cel-cpp's
    iteration budget stopped the evaluation (outcome unknown); "cost": over the apiserver's cost limit,
    so Kubernetes rejects it at admission although its scheduler (the oracle here) would run it."""
    env = environment(case)
    try:
        selector = compile_selector(case["expression"], engine=engine, environment=env)
    except CelCompileError as e:
        if e.message.startswith("too complex, exceeds cost limit"):
            return {"error": "cost"}, e.message  # the apiserver's estimate; the scheduler never estimates
        return {"error": "compile"}, e.message
    view = device_view(case["device"]["driver"], slice_device(case["device"]),
                       list_type_attributes=env.list_type_attributes)
    try:
        return selector.evaluate(view), ""
    except CelRuntimeError as e:
        return {"error": "runtime"}, e.message
    except CelBudgetExceeded as e:
        return {"error": "budget"}, e.message


if __name__ == "__main__":
    # python -m tests.driver.cel.corpus tests/driver/cel/corpus.json | tessera-harness cel
    import sys

    json.dump(load(Path(sys.argv[1])), sys.stdout, indent=1)
    sys.stdout.write("\n")
