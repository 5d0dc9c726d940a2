"""How long `tessera status` takes to work out a large fleet, from slices already read.

The fleet is issue 27's mix, built by tessera's own slice code from the simulated profiles: 60 % DGX
H100 nodes with dynamic MIG (152 devices each: 8 GPUs and every MIG placement), 30 % A100 PCIe x4 and
10 % T4 x4, nothing allocated. The figure is the wall time of cluster_status on the view (reading the
slices from the apiserver is not included; `make bench-scale` measures the whole command against a real
apiserver): for every MIG placement it checks whether the GPU's shared counters still allow it, so the
time follows the number of placements.

    python -m benchmarks.status_bench                    # 100 and 1,000 nodes
    python -m benchmarks.status_bench --nodes 300        # one size
"""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

import structlog

from benchmarks.stats import machine, table
from controller.explain.explain import ClusterView
from controller.explain.status import cluster_status
from driver.discovery import load_inventory
from driver.slices import build_slices


def fleet(nodes: int) -> list[dict[str, Any]]:
    """Issue 27's node mix, in a fixed order (6 DGX, 3 A100, 1 T4 per 10 nodes)."""
    slices: list[dict[str, Any]] = []
    for i in range(nodes):
        kind = "dgx-h100-8" if i % 10 < 6 else "a100-pcie-4" if i % 10 < 9 else "t4-4"
        inventory = load_inventory(f"node-{i:04d}", simulate=kind)
        slices += build_slices(inventory, mig_strategy="dynamic" if kind == "dgx-h100-8" else "static")
    return slices


def measure(nodes: int, repeats: int) -> list[str]:
    slices = fleet(nodes)
    view = ClusterView(slices=slices, classes={}, claims=[])
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        report = cluster_status(view, [])
        times.append(time.perf_counter() - started)
    gpus = sum(len(n.gpus) for n in report.nodes)
    devices = sum(len(s["spec"].get("devices") or []) for s in slices)
    return [str(nodes), f"{len(slices):,}", f"{devices:,}", str(gpus), f"{min(times):.2f}", f"{max(times):.2f}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.status_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    rows = [measure(n, args.repeats) for n in args.nodes]
    print(machine())
    print(table(["nodes", "slices", "devices", "GPUs", "best s", "worst s"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
