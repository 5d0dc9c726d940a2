"""How long `tessera explain` takes on a claim that makes the scheduler's search backtrack, by cluster size.

The claim (issue 24) asks for 8 whole GPUs in 8 requests with `matchAttribute` on the GPU uuid between the
first and the last: two requests would have to share one card, which a whole GPU never does, so on every
node the search tries every way to fill the 7 requests between them before it gives up. The nodes are
DGX H100s (8 GPUs each, as `tessera inventory --simulate dgx-h100-8` publishes them); the pod may use any
node. Two fleets: `same`, idle identical nodes (one search answers for all of them), and `distinct`, where
each node's gpu-0 reports a slightly different memory size (as cards of one model do under NVML), so no
two nodes are alike and only the overall deadline bounds the time. The figure is the wall time of
explain_pod on the view (the apiserver reads are not included), the searches run and their steps, and the
answer: one the budget cut short says so.

    python -m benchmarks.explain_bench                          # both fleets at 1, 4, 16 and 100 nodes
    python -m benchmarks.explain_bench --nodes 1 4 --fleet same   # a subset
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import yaml

from benchmarks.stats import machine, table
from controller.explain.explain import ClusterView, explain_pod
from driver import DRIVER_NAME
from driver.discovery import load_inventory
from driver.names import slice_name
from driver.quantity import canonical_quantity, quantity_bytes
from driver.slices import build_slices

REPO = Path(__file__).resolve().parent.parent
NODES = (1, 4, 16, 100)
REQUESTS = 8
TARGET_S = 5.0  # issue 24: under 5 s at 100 nodes

Obj = dict[str, Any]


FLEETS = ("same", "distinct")


@dataclass(frozen=True)
class ExplainResult:
    fleet: str
    nodes: int
    seconds: float
    runs: int
    steps: int
    cut_short: bool
    step: str
    reason: str


def classes() -> dict[str, Obj]:
    out: dict[str, Obj] = {}
    for path in sorted((REPO / "deviceclasses").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "DeviceClass":
                out[doc["metadata"]["name"]] = doc
    return out


def cluster(nodes: int, *, distinct: bool = False) -> tuple[list[Obj], list[Obj]]:
    """The slices of `nodes` DGX H100 nodes, and their Node objects; `distinct`: each node's gpu-0 has n+1 MiB
    less memory than the profile's."""
    slices: list[Obj] = []
    node_objs: list[Obj] = []
    for n in range(nodes):
        name = f"dgx-{n:03d}"
        for i, s in enumerate(build_slices(load_inventory(name, simulate="dgx-h100-8"))):
            s.setdefault("metadata", {})["name"] = slice_name(name, i)
            for device in s["spec"].get("devices") or () if distinct else ():
                if device["name"] == "gpu-0":
                    memory = device["capacity"]["memory"]
                    memory["value"] = canonical_quantity(quantity_bytes(memory["value"]) - ((n + 1) << 20),
                                                         binary=True)
            slices.append(s)
        node_objs.append({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
    return slices, node_objs


def backtracking_claim(namespace: str = "bench") -> tuple[Obj, Obj]:
    """The claim of issue 24 and a Pending pod that uses it."""
    requests = [{"name": f"r{i}", "exactly": {"deviceClassName": DRIVER_NAME, "count": 1}} for i in range(REQUESTS)]
    constraint = {"requests": ["r0", f"r{REQUESTS - 1}"], "matchAttribute": f"{DRIVER_NAME}/uuid"}
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "backtrack", "namespace": namespace},
             "spec": {"devices": {"requests": requests, "constraints": [constraint]}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "backtrack", "namespace": namespace},
           "spec": {"containers": [{"name": "c", "image": "x"}],
                    "resourceClaims": [{"name": "gpus", "resourceClaimName": "backtrack"}]},
           "status": {"phase": "Pending"}}
    return claim, pod


def run_one(fleet: str, nodes: int, device_classes: dict[str, Obj]) -> ExplainResult:
    slices, node_objs = cluster(nodes, distinct=fleet == "distinct")
    claim, pod = backtracking_claim()
    view = ClusterView(slices, device_classes, [claim], [pod], node_objs)
    started = time.perf_counter()
    explanation = explain_pod(view, "bench", "backtrack")
    seconds = time.perf_counter() - started
    search = explanation.search
    return ExplainResult(fleet, nodes, seconds, search.runs, search.steps, search.cut_short,
                         explanation.verdict.step, explanation.verdict.reason)


def run(node_counts: tuple[int, ...] = NODES, fleets: tuple[str, ...] = FLEETS) -> list[ExplainResult]:
    device_classes = classes()
    return [run_one(f, n, device_classes) for f in fleets for n in node_counts]


def report(results: list[ExplainResult]) -> str:
    rows = [[r.fleet, r.nodes, f"{r.seconds:.2f}", r.runs, r.steps, "yes" if r.cut_short else "no", r.step,
             r.reason[:90]] for r in results]
    return table(["fleet", "nodes", "explain s", "searches", "steps", "cut short", "verdict step",
                  "verdict (start)"], rows)


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))  # discovery's info
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=list(NODES))
    parser.add_argument("--fleet", choices=FLEETS, nargs="+", default=list(FLEETS))
    args = parser.parse_args()
    info = machine()
    print(f"machine: {info}")
    print(report(run(tuple(args.nodes), tuple(args.fleet))))
    print(f"target: under {TARGET_S:.0f} s at 100 nodes")


if __name__ == "__main__":
    main()
