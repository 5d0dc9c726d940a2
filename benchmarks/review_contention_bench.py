"""Review latency while the controller rebuilds its device snapshot in the same process (issue 27): the
real HTTPS server (controller/webhook.py) answering a benign claim review, once with nothing else running
and once while another thread rebuilds a snapshot of dynamic-MIG nodes back to back, as the controller's
warmer does while slices change. Both at CPython's default GIL switch interval and at the controller's
(controller.app.REVIEW_SWITCH_INTERVAL_S), alternating, in one process; the rebuilds per second say what
the shorter interval costs the warmer.

Run: python -m benchmarks.review_contention_bench [--samples 200] [--nodes 100] [--rounds 2]
Prints a table; asserts nothing (the numbers go to BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import logging
import ssl
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from benchmarks.stats import SUMMARY_HEADERS, Summary, machine, table
from benchmarks.webhook_bench import GPU_CLASS, inventory, renamed
from benchmarks.webhook_load_bench import Client, certificate, measure
from controller.admission import AdmissionHandler
from controller.app import REVIEW_SWITCH_INTERVAL_S
from controller.checks.inputs import CheckContext
from controller.cluster.devicegroups import prepare_kinds
from controller.cluster.inventory import DeviceIndex
from controller.cluster.sampledevices import sample_index
from controller.cluster.schema import published_schema
from controller.webhook import CertificateStore, WebhookServer
from driver.discovery import load_inventory
from driver.slices import build_slices

CPYTHON_DEFAULT_S = 0.005


@dataclass(frozen=True)
class Row:
    interval_s: float
    quiet: Summary
    rebuilding: Summary
    rebuilds_per_s: float


def _rebuild_source(nodes: int) -> list[dict[str, object]]:
    template = build_slices(load_inventory("template", simulate="dgx-h100-8"), mig_strategy="dynamic")
    return [renamed(s, f"dgx-{n:05d}") for n in range(nodes) for s in template]


def run(samples: int = 200, nodes: int = 100, rounds: int = 2) -> list[Row]:
    index = inventory(125)
    slices = _rebuild_source(nodes)
    sample_devices = sample_index()
    handler = AdmissionHandler(lambda: CheckContext(
        schema=published_schema(), samples=sample_devices, inventory=index,
        classes={"gpu.tessera.dev": GPU_CLASS}, classes_complete=True))
    previous = sys.getswitchinterval()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tessera-contention-") as d:
        cert, key, pem = certificate(Path(d))
        server = WebhookServer(handler, CertificateStore(str(cert), str(key)), "127.0.0.1", 0)
        server.start()
        client = Client(server.port, ssl.create_default_context(cadata=pem))
        try:
            measure(client, 10, Counter())  # warm: compiled selectors, connection
            for _ in range(rounds):
                for interval in (CPYTHON_DEFAULT_S, REVIEW_SWITCH_INTERVAL_S):
                    sys.setswitchinterval(interval)
                    quiet = measure(client, samples, Counter())[0]
                    busy, rate = _while_rebuilding(slices, lambda: measure(client, samples, Counter())[0])
                    rows.append(Row(interval, quiet, busy, rate))
        finally:
            sys.setswitchinterval(previous)
            client.close()
            server.stop()
    return rows


def _while_rebuilding(slices: list[dict[str, object]], work: Callable[[], Summary]) -> tuple[Summary, float]:
    """`work`'s result while another thread rebuilds snapshots of `slices`; and the rebuilds per second."""
    stop = threading.Event()
    builds = 0

    def rebuild() -> None:
        nonlocal builds
        while not stop.is_set():
            prepare_kinds(DeviceIndex.from_slices(slices))
            builds += 1

    thread = threading.Thread(target=rebuild, name="rebuild", daemon=True)
    started = time.perf_counter()
    thread.start()
    try:
        result = work()
    finally:
        stop.set()
        thread.join()
    return result, builds / (time.perf_counter() - started)


def render(rows: list[Row], nodes: int) -> str:
    body = []
    for row in rows:
        label = f"{row.interval_s * 1000:g} ms" + (" (CPython default)" if row.interval_s == CPYTHON_DEFAULT_S
                                                    else " (controller)")
        for what, s in (("quiet", row.quiet), (f"rebuilding {nodes} nodes' snapshot", row.rebuilding)):
            body.append([label, what, *s.row(), f"{row.rebuilds_per_s:.1f}" if what != "quiet" else "-"])
    return table(["switch interval", "meanwhile", *SUMMARY_HEADERS, "rebuilds/s"], body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=100, help="dynamic-MIG DGX nodes in the rebuilt snapshot")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    facts = "\n".join(f"- {k}: {v}" for k, v in machine().items())
    rows = run(args.samples, args.nodes, args.rounds)
    sys.stdout.write(f"{facts}\n\n{render(rows, args.nodes)}\n")


if __name__ == "__main__":
    main()
