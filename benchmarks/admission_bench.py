"""Admission latency of tessera's webhook checks as the inventory grows: 10, 1,000 and 100,000 GPUs.

The inventories are what a big fleet looks like: most nodes are identical DGX H100s, and about one
node in a thousand has other cards (A100 PCIe, T4, a mixed MIG node, a dynamic-MIG H100 node), so
the webhook's grouping of devices into shapes is what keeps a review's cost flat. The reviews are
the webhook benchmark's cases (benchmarks.webhook_bench), run through AdmissionHandler.review, the
code path of an HTTPS review minus the TLS layer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from benchmarks.stats import Summary, summarize, table
from benchmarks.webhook_bench import CASES, GPU_CLASS, renamed
from controller.admission import AdmissionHandler
from controller.checks.inputs import CheckContext
from controller.cluster.inventory import DeviceIndex
from controller.cluster.sampledevices import sample_index
from controller.cluster.schema import published_schema
from driver.discovery import load_inventory
from driver.slices import build_slices

SIZES = (10, 1_000, 100_000)
DISTINCT = (("a100-pcie-4", "static"), ("t4-4", "static"), ("mixed", "static"), ("h100-16-mig", "dynamic"))
TARGET_P99_MS = 20.0


@dataclass(frozen=True)
class AdmissionResult:
    gpus: int
    devices: int
    nodes: int
    build_s: float
    reviews: dict[str, tuple[Summary, str]]


def fleet(gpus: int) -> tuple[list[dict[str, Any]], int]:
    """ResourceSlices of about `gpus` GPUs (mostly DGX H100), and the exact GPU count."""
    templates = {p: (build_slices(inv, mig_strategy=s), len(inv.gpus))
                 for p, s in (("dgx-h100-8", "static"), *DISTINCT)
                 for inv in [load_inventory("template", simulate=p)]}
    distinct_nodes = max(1, gpus // 1000)
    slices: list[dict[str, Any]] = []
    total = 0
    for n in range(distinct_nodes):
        profile = DISTINCT[n % len(DISTINCT)][0]
        template, count = templates[profile]
        slices += [renamed(s, f"{profile}-{n:04d}") for s in template]
        total += count
    dgx, per_node = templates["dgx-h100-8"]
    n = 0
    while total < gpus:
        slices += [renamed(s, f"dgx-{n:06d}") for s in dgx]
        total += per_node
        n += 1
    return slices, total


def measure(gpus: int, repeat: int) -> AdmissionResult:
    slices, total = fleet(gpus)
    t0 = time.perf_counter()
    index = DeviceIndex.from_slices(slices)
    build_s = time.perf_counter() - t0
    sample_devices = sample_index()
    handler = AdmissionHandler(lambda: CheckContext(
        schema=published_schema(), samples=sample_devices, inventory=index,
        classes={"gpu.tessera.dev": GPU_CLASS}, classes_complete=True))
    reviews = {}
    for name, body in CASES.items():
        is_class = body["request"]["kind"]["kind"] == "DeviceClass"
        path = "/validate-deviceclass" if is_class else "/validate-resourceclaim"
        handler.review(path, body)  # the first review of a snapshot groups it into shapes
        samples = []
        outcome = ""
        for _ in range(repeat):
            t1 = time.perf_counter()
            _, verdict = handler.review(path, body)
            samples.append((time.perf_counter() - t1) * 1000)
            outcome = verdict.outcome
        reviews[name] = (summarize(samples), outcome)
    return AdmissionResult(total, len(index), len(index.nodes), build_s, reviews)


def run(repeat: int, sizes: tuple[int, ...] = SIZES) -> list[AdmissionResult]:
    return [measure(n, repeat) for n in sizes]


def render(results: list[AdmissionResult]) -> str:
    rows = []
    for r in results:
        for name, (s, outcome) in r.reviews.items():
            rows.append([f"{r.gpus:,}", f"{r.devices:,}", name, f"{s.p50:.2f}", f"{s.p99:.2f}",
                         f"{s.p99 / TARGET_P99_MS:.2f}", outcome])
    head = "Admission review latency (AdmissionHandler.review, warm inventory snapshot)\n"
    builds = "\n".join(f"- {r.gpus:,} GPUs on {r.nodes:,} nodes ({r.devices:,} devices): index built in "
                       f"{r.build_s:.2f} s" for r in results)
    return head + table(["GPUs", "devices", "review", "p50 ms", "p99 ms", "p99 / 20 ms target", "outcome"],
                        rows) + "\n" + builds


def main() -> None:
    print(render(run(repeat=50)))


if __name__ == "__main__":
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    main()
