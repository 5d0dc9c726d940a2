"""`make bench-scale`: tessera on a kwok cluster of 1,000 (or more) GPU nodes, measured.

    python -m benchmarks.scale --nodes 1000 --output scale-1000.md

The cluster: e2e's control plane (etcd, kube-apiserver, kube-scheduler, controller-manager, client rate
limits raised as upstream's scheduler_perf runs them), kwok for the nodes (Ready, leases renewed, bound
pods Running), tessera's slices and Publisher for every node (benchmarks/scale/fleet.py; 60 % dgx-h100-8
with dynamic MIG, 30 % a100-pcie-4, 10 % t4-4) and `tessera controller` with its webhooks registered.
Measured, each with a reference from the same run: the controller's informer sync and memory, admission
latency through the apiserver, scheduling 2,000 pods with claims against 2,000 without, `tessera status`
and `tessera explain`, and a rollout storm (every publisher restarts at once). The run stops cleanly,
saying why, when the machine's free memory falls under --min-free-gib.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import structlog

from benchmarks.scale import apimetrics, cpusample, measure
from benchmarks.scale.cluster import GC_TRACED, MemoryGuard, ScaleCluster, mem_available_gib
from benchmarks.scale.fleet import ORIGINAL_DRIVER_VERSION, UPGRADED_DRIVER_VERSION
from benchmarks.scale.nodemix import claim_cases, fleet_with, plan_nodes
from benchmarks.stats import SUMMARY_HEADERS, machine, table
from e2e.processes import stop_leftovers


class Report:
    """Sections printed as they complete and kept for --output; raw figures kept for --json."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.data: dict[str, Any] = {}

    def add(self, title: str, text: str) -> None:
        block = f"#### {title}\n\n{text}\n"
        print("\n" + block, flush=True)
        self.parts.append(block)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        print(f"-- {name} (MemAvailable {mem_available_gib():.1f} GiB)", flush=True)
        yield
        self.data.setdefault("phases", {})[name] = round(time.perf_counter() - t0, 1)


def _admission_rows(results: dict[str, measure.AdmissionResult],
                    reference: dict[str, measure.AdmissionResult]) -> list[list[str]]:
    rows = []
    for name, r in results.items():
        ref = reference[name].summary
        s = r.summary
        rows.append([name, *s.row(), f"{r.first_ms:.0f}", str(r.denied), f"{ref.p50:.2f}", f"{ref.p99:.2f}",
                     f"{s.p50 - ref.p50:+.2f}", f"{s.p99 - ref.p99:+.2f}"])
    return rows


def run(args: argparse.Namespace, report: Report) -> None:
    fleet = fleet_with(args.dgx_mig)
    nodes = plan_nodes(args.nodes, fleet)
    work = Path(tempfile.mkdtemp(prefix="tessera-scale-", dir="/tmp"))
    cluster = ScaleCluster(work, nodes, fleet_processes=args.fleet_processes, min_free_gib=args.min_free_gib)
    report.data["nodes"] = args.nodes
    report.data["mix"] = {s.profile: sum(n.profile == s.profile for n in nodes) for s in fleet}
    report.data["dgx_mig"] = args.dgx_mig
    report.data["plugin_flow"] = args.plugin_flow
    report.data["stopped"] = ""
    try:
        _build(cluster, args, report)
        ctrl = _controller_and_admission(cluster, args, report)
        claims = _scheduling(cluster, args, report)
        _status_explain(cluster, args, report, claims)
        ctrl = measure.controller_memory(cluster, ctrl)
        with report.phase("delete pods"):
            measure.delete_pods(cluster.kube)
        _status_explain(cluster, args, report, 0, scheduler_idle=True)
        with report.phase("delete pods"):
            measure.delete_pods(cluster.kube)
        report.data["controller"] = asdict(ctrl)
        report.add("Controller (webhooks + informer)", table(
            ["start -> serving s", "start -> informer synced (/readyz) s", "RSS synced MiB",
             f"RSS after admission + {claims} claims MiB", "peak RSS MiB"],
            [[f"{ctrl.listening_s:.1f}", f"{ctrl.synced_s:.1f}", f"{ctrl.rss_synced_mib:.0f}",
              f"{ctrl.rss_after_mib:.0f}", f"{ctrl.peak_mib:.0f}"]]))
        if not args.skip_storms:
            _storms(cluster, args, report)
        if args.webhook_reference:
            _scheduling_without_webhooks(cluster, args, report)
    except MemoryGuard as exc:
        report.data["stopped"] = str(exc)
        report.add("Stopped: not enough memory", str(exc))
    finally:
        try:
            rss = measure.apiserver_rss(cluster)
            report.data["rss"] = rss
            report.add("Memory of every process at the end (MiB)", table(
                ["process", "RSS", "peak"], [[k, f"{v[0]:.0f}", f"{v[1]:.0f}"] for k, v in rss.items()]))
        finally:
            cluster.stop()
            stop_leftovers()
            shutil.rmtree(work, ignore_errors=True)


def _build(cluster: ScaleCluster, args: argparse.Namespace, report: Report) -> None:
    with report.phase("control plane"):
        cluster.start_control_plane()
    kube = cluster.kube
    with report.phase("kwok nodes"):
        cluster.start_nodes()
    with report.phase("publish"):
        before = apimetrics.parse_requests(cluster.metrics_text())
        t0 = time.perf_counter()
        cluster.start_fleet()
        publish_s = time.perf_counter() - t0
        requests = apimetrics.delta(before, apimetrics.parse_requests(cluster.metrics_text()))
    slices, devices = measure.slices_total(kube)
    report.data.update(slices=slices, devices=devices, publish_s=round(publish_s, 1),
                       publish_requests={"/".join(k): v for k, v in requests.items()})
    report.add("The cluster", table(
        ["nodes", "mix", "ResourceSlices", "devices", "nodes Ready (kwok) s", "all slices published s",
         "409s", "429s", "publisher processes"],
        [[args.nodes, ", ".join(f"{k} {v}" for k, v in report.data["mix"].items()), slices, devices,
          f"{cluster.timings['nodes ready s']:.0f}", f"{publish_s:.0f}", apimetrics.count_code(requests, "409"),
          apimetrics.count_code(requests, "429"), args.fleet_processes]])
        + "\n\nFirst publish (every publisher starts at once), apiserver requests on resourceslices by verb\n\n"
        + _verb_table(requests))


def _controller_and_admission(cluster: ScaleCluster, args: argparse.Namespace,
                              report: Report) -> measure.ControllerResult:
    kube = cluster.kube
    measure.ensure_namespace(kube)
    with report.phase("admission without webhooks"):
        without, slow_without = _sampled_admission(cluster, args.reviews)
    with report.phase("controller start"):
        ctrl = measure.start_controller(cluster)
    with report.phase("admission with webhooks"):
        ctrl_before, api_before = cluster.controller_metrics_text(), cluster.metrics_text()
        with_hooks, slow_with = _sampled_admission(cluster, args.reviews)
        ctrl_after, api_after = cluster.controller_metrics_text(), cluster.metrics_text()
    before, after = apimetrics.parse_review_buckets(ctrl_before), apimetrics.parse_review_buckets(ctrl_after)
    calls_before, calls_after = (apimetrics.parse_buckets(text, apimetrics.WEBHOOK_HISTOGRAM, "name")
                                 for text in (api_before, api_after))
    builds_before, builds_after = (apimetrics.parse_buckets(text, apimetrics.SNAPSHOT_HISTOGRAM, "")
                                   for text in (ctrl_before, ctrl_after))
    builds = apimetrics.slower_than(builds_before, builds_after, 0.25).get("", (0, 0))
    slice_writes = sum(n for (verb, resource, _), n in apimetrics.delta(
        apimetrics.parse_requests(api_before), apimetrics.parse_requests(api_after)).items()
        if resource == "resourceslices" and verb in ("POST", "PUT", "PATCH", "DELETE"))
    denials = [f"{k}: {v.denied} denied, e.g. {v.denial}" for k, v in with_hooks.items() if v.denied]
    # The round trips above include the apiserver and the machine; the controller's own histogram says how
    # many of those reviews it took long to answer itself, the apiserver's how many of its calls to the
    # webhooks (the connection, the controller's event loop and its answer) took long.
    inside = {bound: apimetrics.slower_than(before, after, bound) for bound in (0.025, 0.1)}
    calls = apimetrics.slower_than(calls_before, calls_after, 0.1)
    report.data["admission_in_controller"] = {str(b): v for b, v in inside.items()}
    report.data["admission_webhook_calls"] = calls
    report.add("Admission through the apiserver (dry-run create, HTTPS, one at a time)", table(
        ["object", *SUMMARY_HEADERS, "first ms", "denied", "no webhook p50 ms", "no webhook p99 ms", "added p50 ms",
         "added p99 ms"], _admission_rows(with_hooks, without)) + "".join(f"\n\n{d}" for d in denials)
        + "\n\nThe same reviews as the controller timed them (its tessera_controller_admission_duration_seconds): "
        + "; ".join(f"{endpoint} {total} reviews, {inside[0.025][endpoint][1]} over 25 ms, {slow} over 100 ms"
                    for endpoint, (total, slow) in inside[0.1].items())
        + ". The apiserver's calls to the webhooks (its " + apimetrics.WEBHOOK_HISTOGRAM + "): "
        + "; ".join(f"{name} {total} calls, {slow} over 100 ms" for name, (total, slow) in calls.items())
        + f". Meanwhile the publishers wrote ResourceSlices {slice_writes} times and the controller rebuilt its "
        + f"device snapshot {builds[0]} times ({builds[1]} of them over 250 ms)."
        + f"\n\nRound trips over {measure.SLOW_MS:.0f} ms, with the CPU each process used meanwhile (2 cores) and "
        + "the Go GC cycles of " + ", ".join(GC_TRACED) + " they overlapped; with webhooks:\n\n"
        + "".join(f"- {line}\n" for line in slow_with or ["none"])
        + "\nwithout webhooks (before the controller started):\n\n"
        + "".join(f"- {line}\n" for line in slow_without or ["none"]))
    report.data["admission_slow"] = {"with": slow_with, "without": slow_without}
    report.data["admission_background"] = {"slice_writes": slice_writes, "snapshot_builds": builds[0]}
    report.data["admission"] = {k: asdict(v) for k, v in with_hooks.items()}
    report.data["admission_reference"] = {k: asdict(v) for k, v in without.items()}
    return measure.controller_memory(cluster, ctrl)


def _sampled_admission(cluster: ScaleCluster,
                       reviews: int) -> tuple[dict[str, measure.AdmissionResult], list[str]]:
    """measure.admission with every process's CPU sampled throughout; the slow round trips accounted for."""
    sampler = cpusample.CpuSampler(cluster.pids())
    phase_start = cpusample.now()
    with sampler:
        results = measure.admission(cluster.kube, reviews)
    assert cluster.plane is not None
    cycles = [cycle for name in GC_TRACED if (proc := cluster.plane.processes.get(name)) and proc.alive()
              for cycle in cpusample.gc_cycles(name, proc.log_path.read_text(errors="replace"),
                                               cpusample.started_at(proc.pid))]
    return results, measure.slow_round_trips(results, sampler, cycles, phase_start)


def _scheduling(cluster: ScaleCluster, args: argparse.Namespace, report: Report) -> int:
    """Pods without claims, then as many with claims (kept for status and explain); the claims' count."""
    kube = cluster.kube
    log = cluster.plane.processes["scheduler"].log_path if cluster.plane else None
    with report.phase("scheduling without claims"):
        plain = measure.schedule(kube, args.pods, with_claims=False, window=args.window, scheduler_log=log)
        measure.delete_pods(kube)
    with report.phase("scheduling with claims"):
        claims = measure.schedule(kube, args.pods, with_claims=True, window=args.window, scheduler_log=log,
                                  cases_used=claim_cases(args.dgx_mig))
    ratio = claims.pods_per_second / plain.pods_per_second if plain.pods_per_second else 0.0
    report.data["scheduling"] = {"plain": asdict(plain), "claims": asdict(claims), "ratio": ratio}
    report.add(f"Scheduling on the same nodes, one run (window {args.window:.0f} s each)", table(
        ["pods", "created", "bound", "create s", "create -> last bound s", "pods/s bound", "-> all Running s",
         "ratio", "scheduler errors"],
        [[r.label, r.pods, r.bound, f"{r.create_s:.1f}", f"{r.bound_s:.1f}", f"{r.pods_per_second:.1f}",
          f"{r.running_s:.1f}", f"{r.pods_per_second / plain.pods_per_second:.2f}" if plain.pods_per_second else "-",
          "; ".join(f"{k}: {v}" for k, v in r.scheduler_errors.items()) or "none"] for r in (plain, claims)])
        + "\n\nclaims: " + ", ".join(f"{k} {v}" for k, v in claims.by_case.items()))
    return claims.bound


def _scheduling_without_webhooks(cluster: ScaleCluster, args: argparse.Namespace, report: Report) -> None:
    """The claims case once more with tessera's webhooks unregistered: what the webhooks add to scheduling.
    The multi-card case is left out (without the mutating webhook it is a different request)."""
    kube = cluster.kube
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        kube.delete(kind, "tessera")
    log = cluster.plane.processes["scheduler"].log_path if cluster.plane else None
    cases = tuple(c for c in claim_cases(args.dgx_mig) if "across" not in c)
    with report.phase("scheduling with claims, no webhooks"):
        bare = measure.schedule(kube, args.pods, with_claims=True, window=args.window, scheduler_log=log,
                                cases_used=cases)
        measure.delete_pods(kube)
    report.data["scheduling_no_webhooks"] = asdict(bare)
    plain = report.data["scheduling"]["plain"]
    ratio = bare.pods_per_second / (plain["bound"] / plain["bound_s"]) if plain["bound_s"] else 0.0
    report.add("Scheduling with claims, tessera's webhooks unregistered (same run)", table(
        ["pods", "created", "bound", "create -> last bound s", "pods/s bound", "ratio to no claims",
         "scheduler errors"],
        [[bare.label, bare.pods, bare.bound, f"{bare.bound_s:.1f}", f"{bare.pods_per_second:.1f}", f"{ratio:.2f}",
          "; ".join(f"{k}: {v}" for k, v in bare.scheduler_errors.items()) or "none"]])
        + "\n\nclaims: " + ", ".join(f"{k} {v}" for k, v in bare.by_case.items()))


def _status_explain(cluster: ScaleCluster, args: argparse.Namespace, report: Report, claims: int, *,
                    scheduler_idle: bool = False) -> None:
    """status and explain on a Pending pod, beside the references; `scheduler_idle`: with no pod left for
    kube-scheduler to retry (the pending pod names no running scheduler), the same cluster otherwise."""
    with report.phase("status and explain" + (", scheduler idle" if scheduler_idle else "")):
        measure.pending_pod(cluster.kube, scheduler=measure.NO_SCHEDULER if scheduler_idle else None)
        settled = measure.settle(cluster) if scheduler_idle else None
        kubeconfig = str(cluster.plane.kubeconfig) if cluster.plane else ""
        sampler = cpusample.CpuSampler(cluster.pids(), interval=0.5)
        with sampler:  # its first sample is taken on entering: `started` comes after one
            started = cpusample.now()
            runs = [measure.reference_fetch(kubeconfig, args.cli_runs),
                    measure.reference_list(kubeconfig, args.cli_runs),
                    measure.cli(["status", f"--kubeconfig={kubeconfig}"], args.cli_runs),
                    measure.cli(["explain", f"pod/{measure.PENDING_POD}", "-n", measure.NAMESPACE,
                                 f"--kubeconfig={kubeconfig}"], args.cli_runs)]
            ended = cpusample.now()
    busy = sampler.used(started, ended)
    report.data["cli_scheduler_idle" if scheduler_idle else "cli"] = [asdict(r) for r in runs]
    when = ("kube-scheduler idle: no pod to retry" if scheduler_idle
            else "kube-scheduler retrying the claim pods it could not place")
    report.add(f"Whole-cluster reads with {claims} allocated claims, {when} (wall time of a new process)", table(
        ["command", "median s", "max s", "runs", "exit", "lines out"],
        [[r.command, f"{r.median_s:.2f}", f"{max(r.wall_s):.2f}", len(r.wall_s), r.rc, r.output_lines]
         for r in runs])
        + (f"\n\nBefore these reads the cluster's processes were left to settle for {settled:.0f} s (until they used "
           f"under {measure.SETTLED_CORES} of a core)." if settled is not None else "")
        + f"\n\nCPU seconds the cluster's processes used during these reads ({ended - started:.0f} s, the commands "
        + "themselves not counted): " + ", ".join(f"{name} {cpu:.1f}" for name, cpu in busy.items() if cpu >= 0.05))
    report.data["cli_cpu_scheduler_idle" if scheduler_idle else "cli_cpu"] = busy


def _storms(cluster: ScaleCluster, args: argparse.Namespace, report: Report) -> None:
    storms = []
    for round_no, upgrade in ((2, False), (3, True)):
        with report.phase(f"storm {'upgrade' if upgrade else 'restart'}"):
            storms.append(measure.storm(cluster, upgrade=upgrade, round_no=round_no))
    if args.plugin_flow:
        # the same upgrade again (back to the first slices), the node agents now in a priority level of their own
        cluster.add_plugin_flow()
        with report.phase("storm upgrade, own priority level"):
            storms.append(measure.storm(cluster, upgrade=False, round_no=4, kind="upgrade, own APF level"))
    # after the last storm every slice must carry its driverVersion (the upgrade's, or again the first one's)
    version = UPGRADED_DRIVER_VERSION if storms[-1].kind == "upgrade" else ORIGINAL_DRIVER_VERSION
    current, total = measure.verify_upgraded(cluster.kube, args.nodes, version)
    report.data["storms"] = [{**asdict(s), "requests": {"/".join(k): v for k, v in s.requests.items()}}
                             for s in storms]
    report.data["storm_verified"] = [current, total]
    report.add(_storm_title(storms, current, total), _storm_tables(storms))


def _verb_table(requests: apimetrics.Requests) -> str:
    return table(["verb", "total", "2xx", "409", "429", "other"],
                 [[r.verb, r.total, r.ok, r.conflict, r.throttled, r.other]
                  for r in apimetrics.by_verb(requests, "resourceslices")])


def _storm_title(storms: list[measure.StormResult], current: int, total: int) -> str:
    return (f"Rollout storm: every publisher restarts at once ({storms[0].nodes} nodes); after the last one "
            f"{current} of {total} slices carry its driverVersion")


def _storm_tables(storms: list[measure.StormResult]) -> str:
    rows = []
    for s in storms:
        last = "none" if s.last_429_s is None else f"{s.last_429_s:.0f} s"
        rows.append([s.kind, f"{s.converged_s:.1f}", f"{s.p50_node_s:.1f}",
                     apimetrics.count_code(s.requests, "409"), apimetrics.count_code(s.requests, "429"),
                     s.rejected_apf, last, s.publisher_errors])
    out = [table(["storm", "start -> last node current s", "median node s", "409s", "429s", "APF rejections",
                  "last new 429 at", "publisher failed syncs"], rows)]
    reviews = [[s.kind, *s.admission.summary.row(), s.admission.denied,
                f"{s.reference.summary.p50:.2f}" if s.reference else "-",
                f"{s.reference.summary.p99:.2f}" if s.reference else "-"] for s in storms if s.admission]
    if reviews:
        out.append("\nDuring each storm: a 10Gi share claim (tessera's webhooks) and a ConfigMap (no webhook, the "
                   "reference), dry-run creates through the apiserver, one pair every 0.25 s\n")
        out.append(table(["storm", *SUMMARY_HEADERS, "denied", "ConfigMap p50 ms", "ConfigMap p99 ms"], reviews))
    for s in storms:
        out.append(f"\n{s.kind}: apiserver requests on resourceslices during the storm, by verb\n")
        out.append(_verb_table(s.requests))
    return "\n".join(out)


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C, so the `finally` that stops every process still runs."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=2000, help="pods per scheduling case (default 2000)")
    parser.add_argument("--dgx-mig", choices=("dynamic", "static", "none"), default="dynamic",
                        help="MIG strategy of the DGX nodes (default dynamic, as issue 27 asks; static shows what "
                             "dynamic MIG's 152 devices and counters per node cost the scheduler)")
    parser.add_argument("--plugin-flow", action="store_true",
                        help="after the storms, give the node agents their own API Priority and Fairness level (a "
                             "FlowSchema for their service account) and storm once more")
    parser.add_argument("--skip-storms", action="store_true", help="leave out the rollout storms")
    parser.add_argument("--webhook-reference", action="store_true",
                        help="at the end, schedule the claims once more with tessera's webhooks unregistered")
    parser.add_argument("--window", type=float, default=300.0,
                        help="seconds each scheduling case may take before it is cut off (default 300)")
    parser.add_argument("--reviews", type=int, default=200, help="admission round trips per object (default 200)")
    parser.add_argument("--cli-runs", type=int, default=3, help="runs of status and explain (default 3)")
    parser.add_argument("--fleet-processes", type=int, default=2, help="processes hosting the publishers")
    parser.add_argument("--min-free-gib", type=float, default=2.0,
                        help="stop cleanly when the machine's MemAvailable falls under this (default 2)")
    parser.add_argument("--output", type=Path, help="also write the tables as Markdown here")
    parser.add_argument("--json", type=Path, help="also write the raw figures as JSON here")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.pods < 1:
        parser.error("--nodes and --pods must be at least 1")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    signal.signal(signal.SIGTERM, _interrupt)
    report = Report()
    started = time.perf_counter()
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    rc = 0
    try:
        run(args, report)
    except (Exception, KeyboardInterrupt):  # still write what was measured, and say where it broke
        traceback.print_exc()
        report.add("Failed", "```\n" + traceback.format_exc()[-3000:] + "\n```")
        rc = 1
    total = time.perf_counter() - started
    facts = "\n".join(f"- {k}: {v}" for k, v in machine().items())
    header = f"### `python -m benchmarks.scale {' '.join(argv)}` ({stamp}, {total:.0f} s)\n\n{facts}\n"
    write: Callable[[Path, str], int] = lambda p, t: p.write_text(t)  # noqa: E731
    if args.output:
        write(args.output, header + "\n" + "\n".join(report.parts))
    if args.json:
        write(args.json, json.dumps({**report.data, "seconds": round(total), "when": stamp}, indent=1, default=str))
    print(f"\nscale benchmark ran in {total:.0f} s", flush=True)
    return rc
