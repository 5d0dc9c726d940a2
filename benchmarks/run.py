"""Run every benchmark and print (optionally write) the figures BENCHMARKS.md records.

    python -m benchmarks.run            # everything (`make bench`), about 5 minutes on 2 cores
    python -m benchmarks.run --quick    # small counts, in-process parts only (no control plane)
    python -m benchmarks.run --output results.md

The control-plane parts (real apiserver prepare, publishing, scheduling, footprint) need the e2e
harness: $TESSERA_HARNESS, as `make bench` sets it, or e2e/harness/build.sh builds it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import structlog

from benchmarks import admission_bench, cel_compare, fsync_floor, prepare_bench, publish_bench
from benchmarks.stats import Summary, machine, table


@dataclass(frozen=True)
class Params:
    """Iteration counts for one run; FULL is what BENCHMARKS.md quotes."""

    floor_iterations: int
    claims: int  # per claim shape, for prepare latency
    burst: int  # claims per throughput level
    concurrency: tuple[int, ...]  # concurrent kubelet calls per throughput level
    wipes: int
    admission_sizes: tuple[int, ...]
    admission_repeat: int
    cel_seconds: float
    cel_copies: int
    cel_heavy: bool
    cluster: bool
    cluster_claims: int
    scheduling_pods: int
    podstart_rounds: int
    podstart_burst: int
    warmup_s: float
    window_s: float
    round_trips: int


FULL = Params(
    floor_iterations=500, claims=200, burst=64, concurrency=prepare_bench.CONCURRENCY, wipes=5,
    admission_sizes=admission_bench.SIZES, admission_repeat=100, cel_seconds=2.0, cel_copies=20, cel_heavy=True,
    cluster=True, cluster_claims=100, scheduling_pods=200, podstart_rounds=20, podstart_burst=100,
    warmup_s=5.0, window_s=10.0, round_trips=50,
)
QUICK = Params(
    floor_iterations=50, claims=10, burst=8, concurrency=prepare_bench.CONCURRENCY, wipes=1,
    admission_sizes=(10, 1_000), admission_repeat=10, cel_seconds=0.2, cel_copies=5, cel_heavy=False,
    cluster=False, cluster_claims=5, scheduling_pods=20, podstart_rounds=2, podstart_burst=10,
    warmup_s=1.0, window_s=2.0, round_trips=5,
)


TUNED_QPS = 5000  # as good as unlimited here: what upstream's scheduler_perf runs with


class Report:
    """Sections in the order they ran; printed as they complete."""

    def __init__(self) -> None:
        self.sections: list[tuple[str, str, float]] = []

    @contextlib.contextmanager
    def section(self, title: str) -> Iterator[Callable[[str], None]]:
        print(f"\n## {title}", flush=True)
        t0 = time.perf_counter()
        parts: list[str] = []

        def add(text: str) -> None:
            print(text, flush=True)
            parts.append(text)

        yield add
        self.sections.append((title, "\n\n".join(parts), time.perf_counter() - t0))

    def markdown(self, header: str) -> str:
        body = [header]
        for title, text, seconds in self.sections:
            body.append(f"### {title}\n\n(ran in {seconds:.0f} s)\n\n{text}\n")
        return "\n".join(body)


def run(params: Params, report: Report, harness: Path | None) -> None:
    if params.cluster and harness is None:
        raise SystemExit("the control-plane benchmarks need the e2e harness: set TESSERA_HARNESS "
                         "(`make bench` does) or pass --quick")
    floor: Summary
    with report.section("Reference: one fsync'd atomic file write") as add:
        with tempfile.TemporaryDirectory(prefix="tessera-floor-", dir="/tmp") as d:
            floor = fsync_floor.measure(Path(d), params.floor_iterations)
        add(table(["p50 ms", "p99 ms", "mean ms", "max ms", "n"], [floor.row()]))

    with report.section("Prepare/unprepare, in-memory apiserver (tessera's own cost)") as add:
        add(prepare_bench.render(prepare_bench.run_in_memory(params.claims, params.concurrency, params.burst), floor))

    with report.section("Slice publishing, in-memory apiserver") as add:
        add(publish_bench.render(publish_bench.run(publish_bench.memory_backend(), params.wipes)))

    with report.section("Admission review latency by inventory size") as add:
        add(admission_bench.render(admission_bench.run(params.admission_repeat, params.admission_sizes)))

    with report.section("CEL evaluation rate: Python engines vs the Go oracle") as add:
        add(cel_compare.render(cel_compare.run(harness, params.cel_seconds, params.cel_copies,
                                               include_heavy=params.cel_heavy)))

    if params.cluster:
        run_cluster(params, report, floor)


def run_cluster(params: Params, report: Report, floor: Summary) -> None:
    from benchmarks import controlplane, footprint, scheduling_bench
    from driver.kubeapi import RealKubeAPI

    with controlplane.control_plane() as plane:
        kube = controlplane.kube_of(plane)
        with report.section("Slice publishing, real kube-apiserver") as add:
            add(publish_bench.render(publish_bench.run(publish_bench.real_backend(plane), params.wipes)))

        with report.section("Prepare/unprepare, claims from a real kube-apiserver") as add:
            controlplane.ensure_namespace(kube, prepare_bench.NAMESPACE)
            api = RealKubeAPI(str(plane.kubeconfig))
            result = prepare_bench.run(api, prepare_bench.ClaimSource.real(kube), "kube-apiserver",
                                       claims=params.cluster_claims, concurrency=params.concurrency,
                                       burst=params.burst, node_prefix="prep")
            add(prepare_bench.render(result, floor))

        with report.section("Scheduling through tessera's slices, default client rate limits") as add:
            add(scheduling_bench.render(scheduling_bench.run(kube, params.scheduling_pods,
                                                             limits="default (scheduler 50, controllers 20)")))

        with report.section("Footprint and admission over the wire") as add:
            baseline = footprint.interpreter_baseline()
            plugin = footprint.plugin_footprint(plane, params.warmup_s, params.window_s)
            controller, wire = footprint.controller_footprint(plane, params.warmup_s, params.window_s,
                                                              params.round_trips)
            add(footprint.render([plugin, controller], baseline, wire))

    from benchmarks import podstart_bench
    from e2e.node.realnode import real_node_unavailable

    with report.section("Pod start-up on a real node (kubelet v1.36.3 + containerd)") as add:
        reason = real_node_unavailable()
        if reason:
            add(f"skipped: {reason}")
        else:
            add(podstart_bench.render(*podstart_bench.run(params.podstart_rounds, params.podstart_burst)))

    with controlplane.control_plane(client_qps=TUNED_QPS) as plane, \
            report.section("Scheduling through tessera's slices, client rate limits raised") as add:
        add(scheduling_bench.render(scheduling_bench.run(controlplane.kube_of(plane), params.scheduling_pods,
                                                         limits=f"{TUNED_QPS} QPS")))


def harness_from_env() -> Path | None:
    value = os.environ.get("TESSERA_HARNESS")
    return Path(value) if value else None


def header(params: Params, argv: list[str]) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    facts = "\n".join(f"- {k}: {v}" for k, v in machine().items())
    command = "python -m benchmarks.run " + " ".join(argv)
    return f"## Results of `{command.strip()}` ({now})\n\n{facts}\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small counts, in-process benchmarks only")
    parser.add_argument("--cluster", action="store_true", help="with --quick: include the control-plane parts")
    parser.add_argument("--output", type=Path, help="also write the results as Markdown to this file")
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    params = QUICK if args.quick else FULL
    if args.quick and args.cluster:
        params = replace(params, cluster=True)
    harness = harness_from_env()
    if harness is None and params.cluster:
        from e2e.cluster import harness_path

        harness = harness_path()
    report = Report()
    started = time.perf_counter()
    run(params, report, harness)
    total = time.perf_counter() - started
    print(f"\nall benchmarks ran in {total:.0f} s", flush=True)
    if args.output:
        args.output.write_text(report.markdown(header(params, argv)) + f"\nTotal: {total:.0f} s.\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
