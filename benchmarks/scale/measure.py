"""The scale benchmark's measurements, each against a reference taken in the same run.

Every function takes a started ScaleCluster and returns a frozen result; benchmarks/scale/report.py
turns them into the tables BENCHMARKS.md quotes.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.scale import apimetrics, cpusample
from benchmarks.scale.cluster import ScaleCluster, rss_mib
from benchmarks.scale.nodemix import CLAIM_CASES, pod_cases, template_name
from benchmarks.stats import Summary, summarize
from e2e.kube import Kube, KubeError
from e2e.processes import REPO, ClusterError, wait_for

Obj = dict[str, Any]
A = 'device.attributes["gpu.tessera.dev"]'
NAMESPACE = "bench-scale"


# ---------------------------------------------------------------------------------------------
# 1. the controller: informer sync and memory


@dataclass(frozen=True)
class ControllerResult:
    listening_s: float  # process start -> serving TLS with its webhooks registered
    synced_s: float  # process start -> /readyz 200 (the informer's first list of slices and classes is in)
    rss_synced_mib: float
    rss_after_mib: float = 0.0  # after the admission and scheduling phases (index built, claims watched)
    peak_mib: float = 0.0


def start_controller(cluster: ScaleCluster) -> ControllerResult:
    t0 = time.perf_counter()
    controller = cluster.start_controller()
    listening = time.perf_counter() - t0
    wait_for(cluster.controller_ready, timeout=600, interval=0.1, what="the controller's /readyz (informer synced)")
    synced = time.perf_counter() - t0
    assert controller.process is not None
    rss, _ = rss_mib(controller.process.pid)
    return ControllerResult(listening, synced, rss)


def controller_memory(cluster: ScaleCluster, before: ControllerResult) -> ControllerResult:
    assert cluster.controller is not None and cluster.controller.process is not None
    rss, peak = rss_mib(cluster.controller.process.pid)
    return ControllerResult(before.listening_s, before.synced_s, before.rss_synced_mib, rss, peak)


# ---------------------------------------------------------------------------------------------
# 2. admission through the apiserver


def _class(name: str) -> Obj:
    expression = f'device.driver == "gpu.tessera.dev" && {A}.type == "gpu" && {A}.productName.contains("H100")'
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]}}


def _share_claim(name: str) -> Obj:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "g", "exactly": {
                "deviceClassName": "shared.gpu.tessera.dev", "capacity": {"requests": {"memory": "10Gi"}}}}]}}}


def _spread_claim(name: str) -> Obj:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": CLAIM_CASES["20Gi across 2 cards"]}


REVIEWS: dict[str, Callable[[str], Obj]] = {
    "DeviceClass (H100 selector)": _class,
    "ResourceClaim (10Gi share)": _share_claim,
    "ResourceClaim (20Gi across 2 cards, mutated)": _spread_claim,
}


@dataclass(frozen=True)
class AdmissionResult:
    summary: Summary  # every round trip after the first three, answered or denied
    first_ms: float  # the very first (for the webhook: its first review of this inventory snapshot)
    denied: int  # refused by the webhook (e.g. its review deadline passed)
    denial: str  # the first refusal's message
    slow: tuple[tuple[float, float], ...] = ()  # (start, CLOCK_BOOTTIME s; ms) of each summarized one over SLOW_MS


SLOW_MS = 50.0  # admission's p99 target: the round trips over it are the ones the report accounts for


def round_trips(kube: Kube, make: Callable[[str], Obj], count: int) -> AdmissionResult:
    """Dry-run creates, one after another; the first three (connection set-up on both hops) are not in the
    summary. A refusal is counted and timed like an answer: the benchmark reports it, it does not stop."""
    samples = []
    slow = []
    first = 0.0
    denied = 0
    denial = ""
    for i in range(count + 3):
        started = cpusample.now()
        t0 = time.perf_counter()
        try:
            kube.create(make(f"adm-{i}"), dry_run=True)
        except KubeError as exc:
            if exc.status not in (400, 422):
                raise
            denied += 1
            denial = denial or exc.message
        elapsed = (time.perf_counter() - t0) * 1000
        if i == 0:
            first = elapsed
        if i >= 3:
            samples.append(elapsed)
            if elapsed > SLOW_MS:
                slow.append((started, elapsed))
    return AdmissionResult(summarize(samples), first, denied, denial[:300], tuple(slow))


def slow_round_trips(results: dict[str, AdmissionResult], sampler: cpusample.CpuSampler,
                     cycles: list[cpusample.GcCycle], phase_start: float) -> list[str]:
    """One line per round trip over SLOW_MS: when, how long, the processes that used the CPU meanwhile (two
    cores: more than the round trip's own length in all means it waited for a core) and the Go GC cycles
    it overlapped."""
    lines = []
    for name, result in results.items():
        for start, ms in result.slow:
            end = start + ms / 1000
            used = sampler.used(start, end)
            busy = ", ".join(f"{proc} {cpu * 1000:.0f}" for proc, cpu in used.items() if cpu > 0) or "nothing"
            gcs = "; ".join(f"{c.process} GC #{c.number} ({c.wall_ms:.0f} ms, {c.heap})"
                            for c in cpusample.overlapping(cycles, start, end)) or "none"
            lines.append(f"{name} at +{start - phase_start:.1f} s: {ms:.0f} ms; CPU ms meanwhile: {busy}; "
                         f"Go GC cycles: {gcs}")
    return lines


def admission(kube: Kube, count: int) -> dict[str, AdmissionResult]:
    return {name: round_trips(kube, make, count) for name, make in REVIEWS.items()}


def ensure_namespace(kube: Kube) -> None:
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})


# ---------------------------------------------------------------------------------------------
# 3. scheduling throughput, with and without claims


@dataclass(frozen=True)
class SchedulingResult:
    label: str
    pods: int
    create_s: float
    bound_s: float  # first create -> last pod bound, or -> the end of the window
    running_s: float  # first create -> last pod Running (kwok), or -> the end of the window
    bound: int  # pods bound (all of them, unless the window ended first)
    by_case: dict[str, int] = field(default_factory=dict)
    scheduler_errors: dict[str, int] = field(default_factory=dict)  # scheduler log lines by cause, this phase

    @property
    def pods_per_second(self) -> float:
        return self.bound / self.bound_s if self.bound_s else 0.0


SCHEDULER_ERRORS = ("timed out trying to allocate devices", "cannot allocate all claims",
                    "Too many requests", "context deadline exceeded")


def scheduler_errors(log_text: str) -> dict[str, int]:
    """Lines of the scheduler's log naming each known cause of a failed scheduling attempt."""
    return {cause: n for cause in SCHEDULER_ERRORS if (n := log_text.count(cause))}


def _pod(name: str, template: str | None) -> Obj:
    container: Obj = {"name": "main", "image": "registry.example/cuda:12"}
    spec: Obj = {"containers": [container], "terminationGracePeriodSeconds": 0}
    if template:
        container["resources"] = {"claims": [{"name": "gpu"}]}
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE,
                                                            "labels": {"bench": "scale"}}, "spec": spec}


def _unbound(kube: Kube) -> int:
    return len(kube.list("Pod", NAMESPACE, field_selector="spec.nodeName="))


def _not_running(kube: Kube) -> int:
    return len(kube.list("Pod", NAMESPACE, field_selector="status.phase!=Running"))


def schedule(kube: Kube, pods: int, *, with_claims: bool, window: float, scheduler_log: Path | None = None,
             cases_used: tuple[str, ...] = tuple(CLAIM_CASES)) -> SchedulingResult:
    """Create `pods` pods at once and wait until all are bound and Running, for at most `window` seconds; a
    window that ends first gives the pods bound by then (the rest stay, for `tessera explain` and status)."""
    cases = pod_cases(pods, cases_used) if with_claims else ["none"] * pods
    if with_claims:
        for case in cases_used:
            spec = CLAIM_CASES[case]
            kube.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                        "metadata": {"name": template_name(case), "namespace": NAMESPACE}, "spec": {"spec": spec}})
    log_start = scheduler_log.stat().st_size if scheduler_log else 0
    prefix = "c" if with_claims else "n"
    work = [(f"{prefix}-{i:05d}", None if case == "none" else template_name(case)) for i, case in enumerate(cases)]
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda w: kube.create(_pod(*w)), work))
    created = time.perf_counter() - start
    deadline = time.monotonic() + window
    bound_s = 0.0
    unbound = pods
    while time.monotonic() < deadline:
        if not bound_s:
            unbound = _unbound(kube)
            if unbound == 0:
                bound_s = time.perf_counter() - start
        if bound_s and _not_running(kube) == 0:
            break
        time.sleep(0.5)
    running_s = time.perf_counter() - start
    if not bound_s:
        unbound = _unbound(kube)
        bound_s = running_s
    by_case = {case: cases.count(case) for case in dict.fromkeys(cases)} if with_claims else {}
    errors: dict[str, int] = {}
    if scheduler_log:
        with scheduler_log.open("rb") as f:
            f.seek(log_start)
            errors = scheduler_errors(f.read().decode(errors="replace"))
    label = f"with claims ({len(cases_used)} kinds, round-robin)" if with_claims else "without claims (reference)"
    return SchedulingResult(label, pods, created, bound_s, running_s, pods - unbound, by_case, errors)


def delete_pods(kube: Kube, timeout: float = 600.0) -> None:
    """Every pod of the namespace at once (kwok removes them); then their claims go with the garbage collector."""
    # 2,000 pods with claims take the apiserver more than a client's usual 30 s; it goes on deleting if we stop
    # waiting for its answer, and the wait below is what counts
    with contextlib.suppress(TimeoutError, OSError):
        kube.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods", {"gracePeriodSeconds": 0},
                     params={"labelSelector": "bench=scale"}, timeout=300.0)
    wait_for(lambda: not kube.list("Pod", NAMESPACE, label_selector="bench=scale")
             and not kube.list("ResourceClaim", NAMESPACE), timeout=timeout, interval=1.0,
             what=f"the pods and claims of {NAMESPACE} to be gone")


# ---------------------------------------------------------------------------------------------
# 4. tessera status / explain on the whole cluster


PENDING_POD = "nine-h100"
# No scheduler runs under this name: a pod that names it stays Pending without kube-scheduler retrying it
NO_SCHEDULER = "no-scheduler.bench-scale"


@dataclass(frozen=True)
class CliResult:
    command: str
    wall_s: list[float]
    rc: int
    output_lines: int

    @property
    def median_s(self) -> float:
        return statistics.median(self.wall_s)


def pending_pod(kube: Kube, *, scheduler: str | None = None) -> None:
    """A pod no node can take (9 H100s; a DGX has 8), which `tessera explain` must explain. With `scheduler`
    (NO_SCHEDULER), kube-scheduler leaves it alone: one unschedulable claim pod on 600 dynamic-MIG nodes
    keeps it at most of two cores."""
    spec = {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "h100.gpu.tessera.dev", "allocationMode": "ExactCount", "count": 9}}]}}
    kube.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": PENDING_POD, "namespace": NAMESPACE}, "spec": {"spec": spec}})
    pod = _pod(PENDING_POD, PENDING_POD)
    if scheduler is not None:
        pod["spec"]["schedulerName"] = scheduler
    kube.apply(pod)
    if scheduler is not None:
        # its claim comes from the template as for any pod (kube-controller-manager); explain reads it
        wait_for(lambda: bool(kube.list("ResourceClaim", NAMESPACE)), timeout=120, interval=0.5,
                 what=f"the claim of pod {PENDING_POD}")
        return

    def unschedulable() -> bool:
        pod = kube.get("Pod", PENDING_POD, NAMESPACE)
        return any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
                   for c in (pod.get("status") or {}).get("conditions") or [])

    # A scheduler busy with thousands of pods may not get to it soon; explain reads the cluster either way.
    with contextlib.suppress(ClusterError):
        wait_for(unschedulable, timeout=120, interval=1.0, what=f"pod {PENDING_POD} to be reported Unschedulable")


SETTLED_CORES = 0.3


def settle(cluster: ScaleCluster, *, window: float = 2.0, timeout: float = 120.0) -> float:
    """Wait until the cluster's processes together use under SETTLED_CORES of a core over `window` seconds
    (after deleting 2,000 pods the apiserver, the garbage collector and kwok stay busy for a while); the
    seconds waited. Gives up quietly after `timeout`: the report says how long it waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        with cpusample.CpuSampler(cluster.pids(), interval=window) as sampler:
            time.sleep(window)
        if sampler.cores() < SETTLED_CORES:
            break
    return time.monotonic() - t0


def cli(argv: list[str], runs: int) -> CliResult:
    walls = []
    proc: subprocess.CompletedProcess[str] | None = None
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "tessera", "--log-level", "error", *argv], capture_output=True,
                              text=True, cwd=REPO, check=False, timeout=600)
        walls.append(time.perf_counter() - t0)
    assert proc is not None
    return CliResult("tessera " + " ".join(a for a in argv if not a.startswith("--kubeconfig")), walls,
                     proc.returncode, len(proc.stdout.splitlines()))


# what reference_list runs in a new interpreter (argv[1]: the kubeconfig): the reads status and explain make
LIST_FLOOR = ("import sys; from tessera import clusterread as r; api = r.connect(sys.argv[1]); "
              "print(len(r.resource_slices(api)), len(r.resource_claims(api)))")


# what reference_fetch runs: the same two lists read off the connection and dropped, nothing decoded
FETCH_FLOOR = "import sys; from benchmarks.scale.measure import fetch_lists; fetch_lists(sys.argv[1])"


def fetch_lists(kubeconfig: str) -> None:
    """Read tessera's slices and every claim as bytes and drop them: what the apiserver takes to send them."""
    from driver import DRIVER_NAME
    from driver.kubeapi import RESOURCE_GROUP, RESOURCE_VERSION
    from tessera import clusterread

    custom: Any = clusterread.connect(kubeconfig)._custom
    for plural, selector in (("resourceslices", f"spec.driver={DRIVER_NAME}"), ("resourceclaims", None)):
        answer = custom.list_cluster_custom_object(RESOURCE_GROUP, RESOURCE_VERSION, plural, field_selector=selector,
                                                   _preload_content=False, _request_timeout=600)
        size = sum(len(chunk) for chunk in answer.stream(1 << 18))
        if answer.status != 200 or not size:
            raise SystemExit(f"{plural}: HTTP {answer.status}, {size} bytes")


def reference_list(kubeconfig: str, runs: int) -> CliResult:
    """The floor any whole-cluster tool pays: a new interpreter listing tessera's slices and every claim."""
    return _python_runs("python: list slices + claims (reference)", LIST_FLOOR, kubeconfig, runs)


def reference_fetch(kubeconfig: str, runs: int) -> CliResult:
    """Kubernetes' share of that floor: a new interpreter reading the same two answers without decoding them."""
    return _python_runs("python: fetch slices + claims, not decoded (reference)", FETCH_FLOOR, kubeconfig, runs)


def _python_runs(label: str, code: str, kubeconfig: str, runs: int) -> CliResult:
    walls = []
    rc = 0
    for _ in range(runs):
        t0 = time.perf_counter()
        rc = subprocess.run([sys.executable, "-c", code, kubeconfig], capture_output=True, cwd=REPO, check=False,
                            timeout=600).returncode
        walls.append(time.perf_counter() - t0)
    return CliResult(label, walls, rc, 1)


# ---------------------------------------------------------------------------------------------
# 5. the rollout storm


@dataclass(frozen=True)
class StormResult:
    kind: str  # "restart" (same slices) or "upgrade" (every slice changes)
    nodes: int
    converged_s: float  # every publisher started at once -> the last node's slices accepted
    p50_node_s: float
    requests: apimetrics.Requests
    rejected_apf: int
    last_429_s: float | None  # seconds after the start at which the apiserver last counted a new 429
    publisher_errors: int
    series: list[tuple[float, int]] = field(default_factory=list)  # (s since start, cumulative 429s)
    admission: AdmissionResult | None = None  # claim reviews sent while the storm ran
    reference: AdmissionResult | None = None  # ConfigMap creates (no webhook) sent right after each of them


def _config_map(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NAMESPACE},
            "data": {"k": "v"}}


class StormReviews:
    """Dry-run creates through the apiserver, in a thread, until stopped: a 10Gi share claim (which tessera's
    webhooks review) and, right after it, a ConfigMap (which no webhook sees), the reference taken in the
    same instant; one pair every `pace` s. What a user creating claims sees while every node republishes."""

    def __init__(self, kube: Kube, pace: float = 0.25) -> None:
        self._kube = kube
        self._pace = pace
        self._stop = threading.Event()
        self._samples: dict[str, list[float]] = {"claim": [], "reference": []}
        self._denied = 0
        self._denial = ""
        self._thread = threading.Thread(target=self._run, name="storm-reviews", daemon=True)

    def __enter__(self) -> StormReviews:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _timed(self, what: str, obj: Obj) -> None:
        t0 = time.perf_counter()
        try:
            self._kube.create(obj, dry_run=True)
        except KubeError as exc:
            self._denied += what == "claim"
            self._denial = self._denial or exc.message
        self._samples[what].append((time.perf_counter() - t0) * 1000)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            self._timed("claim", _share_claim(f"storm-{i}"))
            self._timed("reference", _config_map(f"storm-{i}"))
            i += 1
            self._stop.wait(self._pace)

    def result(self, what: str = "claim") -> AdmissionResult | None:
        samples = self._samples[what]
        if not samples:
            return None
        return AdmissionResult(summarize(samples), samples[0], self._denied if what == "claim" else 0,
                               self._denial[:300])


def storm(cluster: ScaleCluster, *, upgrade: bool, round_no: int, timeout: float = 900.0,
          kind: str = "") -> StormResult:
    """Every publisher restarts at once: with the same slices, or (`upgrade`) after a driver upgrade."""
    kind = kind or ("upgrade" if upgrade else "restart")
    built = sum(e["event"] == "built" for e in cluster.events()) // max(1, len(cluster.fleets))
    cluster.command_fleet(f"prepare {'upgrade' if upgrade else 'restart'}")
    cluster.wait_built(built + 1)
    before_text = cluster.metrics_text()
    before = apimetrics.parse_requests(before_text)
    rejected0 = apimetrics.parse_rejections(before_text)
    t0 = time.time()
    cluster.command_fleet("go")
    with StormReviews(cluster.kube) as reviews:
        series, events, now_text = _follow_storm(cluster, kind, round_no, before, t0=t0, timeout=timeout)
    after = apimetrics.parse_requests(now_text)
    starts = [e["t"] for e in events if e["event"] == "round-start"]
    synced = sorted(e["t"] for e in events if e["event"] == "synced")
    start = min(starts)
    return StormResult(
        kind, len(synced), synced[-1] - start, statistics.median(synced) - start, apimetrics.delta(before, after),
        apimetrics.parse_rejections(now_text) - rejected0, apimetrics.last_increase(series),
        sum(e.get("errors", 0) for e in events if e["event"] == "round-done"), series, reviews.result(),
        reviews.result("reference"))


def _follow_storm(cluster: ScaleCluster, kind: str, round_no: int, before: apimetrics.Requests, *, t0: float,
                  timeout: float) -> tuple[list[tuple[float, int]], list[Obj], str]:
    """Read the apiserver's 429 count every second until every fleet converged, then 5 s more."""
    series: list[tuple[float, int]] = []
    deadline = time.monotonic() + timeout
    while True:
        now = apimetrics.parse_requests(cluster.metrics_text())
        series.append((time.time() - t0, apimetrics.count_code(apimetrics.delta(before, now), "429")))
        events = [e for e in cluster.events() if e.get("round") == round_no]
        if sum(e["event"] == "round-done" for e in events) == len(cluster.fleets):
            break
        cluster.check(f"the {kind} storm", sum(e["event"] == "synced" for e in events))
        if time.monotonic() > deadline:
            raise TimeoutError(f"{kind} storm: not converged after {timeout:.0f} s")
        time.sleep(1.0)
    # a few more seconds of readings: a 429 after the last node converged still counts
    now_text = ""
    for _ in range(5):
        time.sleep(1.0)
        now_text = cluster.metrics_text()
        series.append((time.time() - t0, apimetrics.count_code(apimetrics.delta(before, apimetrics.parse_requests(
            now_text)), "429")))
    return series, events, now_text


def verify_upgraded(kube: Kube, nodes: int, driver_version: str) -> tuple[int, int]:
    """(slices carrying the upgraded driverVersion on every device, all of tessera's slices) in one list."""
    items = kube.list("ResourceSlice", field_selector="spec.driver=gpu.tessera.dev")
    current = sum(all((d.get("attributes") or {}).get("driverVersion", {}).get("version") == driver_version
                      for d in (s["spec"].get("devices") or [])) for s in items)
    return current, len(items)


def apiserver_rss(cluster: ScaleCluster) -> dict[str, tuple[float, float]]:
    """(RSS, peak) MiB of every process of the benchmark cluster."""
    out = {}
    for proc in cluster.running():
        try:
            out[proc.name] = rss_mib(proc.pid)
        except (OSError, KeyError):
            continue
    return out


def slices_total(kube: Kube) -> tuple[int, int]:
    """(ResourceSlices, devices in them) of tessera's driver."""
    try:
        items = kube.list("ResourceSlice", field_selector="spec.driver=gpu.tessera.dev")
    except KubeError:
        return 0, 0
    return len(items), sum(len(s["spec"].get("devices") or []) for s in items)
