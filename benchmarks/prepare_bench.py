"""NodePrepareResources / NodeUnprepareResources over the real unix socket, as kubelet calls them.

The plugin side is tessera's own: DraService behind a UnixSocketServer, and the DeviceState a
simulated node runs (file-backed MPS and MIG stand-ins, real CDI and checkpoint files on disk). The
claims come either from an in-memory apiserver (tests.fakes.apiserver: tessera's own cost) or from a
real kube-apiserver (the GET over HTTPS included), selected by the `api` given to `run()`.

Per claim shape (whole GPU, dynamic MIG, one memory share, a 4-card share) it reports prepare and
unprepare latency; for shares it reports throughput with 1, 8 and 64 concurrent kubelet calls; and
one instrumented pass breaks a prepare down into the steps DeviceState takes.

Run: python -m benchmarks.prepare_bench [--claims N]. Prints tables; asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from benchmarks.stats import SUMMARY_HEADERS, Summary, summarize, table
from driver import DRIVER_NAME
from driver.discovery import load_inventory
from driver.kubeapi import KubeAPI, Obj
from kubeletplugin.draservice import DraService
from kubeletplugin.grpcservers import UnixSocketServer
from kubeletplugin.metrics import PluginMetrics
from kubeletplugin.plugin import build_device_state
from kubeletplugin.pluginconfig import PluginConfig
from kubeletplugin.state import DeviceState
from proto.dra.v1 import api_pb2 as v1
from proto.dra.v1 import api_pb2_grpc as v1_grpc
from tests.fakes.apiserver import FakeKubeAPI

if TYPE_CHECKING:
    from e2e.kube import Kube

NAMESPACE = "bench"
SHARE = "10Gi"
CONCURRENCY = (1, 8, 64)


class BenchmarkError(RuntimeError):
    """A prepare or unprepare failed: a benchmark of a failing path would measure the wrong thing."""


@dataclass(frozen=True)
class Shape:
    """One kind of claim: the node profile it needs and its allocation results for claim number i."""

    profile: str
    mig_strategy: str
    request: Obj
    results: Callable[[str, int], list[Obj]]


def _result(pool: str, device: str, **extra: Any) -> Obj:
    return {"request": "gpu", "driver": DRIVER_NAME, "pool": pool, "device": device, **extra}


def _share(pool: str, device: str) -> Obj:
    return _result(pool, device, shareID=str(uuid.uuid4()), consumedCapacity={"memory": SHARE})


def _exactly(count: int = 1, memory: str | None = None) -> Obj:
    exactly: Obj = {"deviceClassName": DRIVER_NAME, "allocationMode": "ExactCount", "count": count}
    if memory:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {"name": "gpu", "exactly": exactly}


SHAPES: dict[str, Shape] = {
    "whole GPU": Shape("dgx-h100-8", "static", _exactly(), lambda pool, i: [_result(pool, f"gpu-{i % 8}")]),
    # a dynamic MIG instance is created at prepare and destroyed at unprepare (in the simulated journal)
    "MIG 1g.10gb (dynamic)": Shape(
        "h100-16-mig", "dynamic", _exactly(),
        lambda pool, i: [_result(pool, f"gpu-{i % 16}-mig-1g10gb-{(i // 16) % 7}")],
    ),
    "10Gi share (MPS)": Shape("dgx-h100-8", "static", _exactly(memory=SHARE),
                              lambda pool, i: [_share(pool, f"gpu-{i % 8}")]),
    "4-card 10Gi share (MPS)": Shape(
        "dgx-h100-8", "static", _exactly(4, SHARE),
        lambda pool, i: [_share(pool, f"gpu-{(i + k) % 8}") for k in range(4)],
    ),
}


def claim_object(name: str, shape: Shape, pool: str, i: int) -> tuple[Obj, Obj]:
    """(the claim as a user creates it, its status.allocation as the scheduler writes it)."""
    claim: Obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                  "metadata": {"name": name, "namespace": NAMESPACE},
                  "spec": {"devices": {"requests": [shape.request]}}}
    allocation: Obj = {
        "devices": {"results": shape.results(pool, i), "config": []},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [pool]}]}]},
    }
    return claim, allocation


class ClaimSource:
    """Where the benchmark's allocated claims live; `add` returns the claim's uid."""

    def __init__(self, add: Callable[[Obj, Obj], str]) -> None:
        self.add = add

    @classmethod
    def memory(cls, api: FakeKubeAPI) -> ClaimSource:
        def add(claim: Obj, allocation: Obj) -> str:
            uid = str(uuid.uuid4())
            meta = {**claim["metadata"], "uid": uid}
            api.add_claim({**claim, "metadata": meta, "status": {"allocation": allocation}})
            return uid

        return cls(add)

    @classmethod
    def real(cls, kube: Kube) -> ClaimSource:
        """Claims created in a real apiserver, allocated by writing status as the scheduler would."""

        def add(claim: Obj, allocation: Obj) -> str:
            meta = claim["metadata"]
            created = kube.create(claim)
            kube.patch_status("ResourceClaim", meta["name"], {"status": {"allocation": allocation}}, meta["namespace"])
            return str(created["metadata"]["uid"])

        return cls(add)


# ---------------------------------------------------------------------------------------------
# one simulated node's plugin, serving on a real unix socket


class NodePlugin:
    """DeviceState + DraService + the DRA socket of one simulated node, in a short temp dir."""

    def __init__(self, api: KubeAPI, node: str, profile: str, mig_strategy: str) -> None:
        self.node = node
        self.root = Path(tempfile.mkdtemp(prefix="tsb-", dir="/tmp"))
        self.config = PluginConfig(
            node_name=node, kubelet_dir=self.root / "kubelet", cdi_dir=self.root / "cdi",
            state_dir=self.root / "state", simulate=profile, mig_strategy=mig_strategy,
        )
        self.state: DeviceState = build_device_state(self.config, load_inventory(node, simulate=profile))
        self.service = DraService(api, self.state, metrics=PluginMetrics(), pool=node)
        self.server = UnixSocketServer("dra", self.config.socket_paths.dra_socket, [self.service.add_to],
                                       max_workers=16)
        self.server.start()
        self.channel = grpc.insecure_channel(f"unix:{self.config.socket_paths.dra_socket}")
        self.stub = v1_grpc.DRAPluginStub(self.channel)

    def prepare(self, name: str, uid: str) -> None:
        resp = self.stub.NodePrepareResources(v1.NodePrepareResourcesRequest(
            claims=[v1.Claim(namespace=NAMESPACE, name=name, uid=uid)]), timeout=45)
        entry = resp.claims[uid]
        if entry.error or not entry.devices:
            raise BenchmarkError(f"prepare of {NAMESPACE}/{name} failed: {entry.error or 'no devices'}")

    def empty_calls(self, count: int) -> Summary:
        """Latency of NodePrepareResources with no claims: the floor of any call over this socket."""
        samples = []
        for i in range(count + 3):
            t0 = time.perf_counter()
            self.stub.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=[]), timeout=45)
            if i >= 3:
                samples.append((time.perf_counter() - t0) * 1000)
        return summarize(samples)

    def unprepare(self, name: str, uid: str) -> None:
        resp = self.stub.NodeUnprepareResources(v1.NodeUnprepareResourcesRequest(
            claims=[v1.Claim(namespace=NAMESPACE, name=name, uid=uid)]), timeout=45)
        if resp.claims[uid].error:
            raise BenchmarkError(f"unprepare of {NAMESPACE}/{name} failed: {resp.claims[uid].error}")

    def close(self) -> None:
        self.channel.close()
        self.server.stop(1)
        self.service.close()
        shutil.rmtree(self.root, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# step timings


@dataclass
class StepTimer:
    """Time spent per step label, summed over every call, from wrappers patched in for one pass."""

    totals: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - t0
                with self.lock:
                    self.totals[label] += elapsed
                    self.calls[label] += 1

        return timed


@contextlib.contextmanager
def instrumented(api: KubeAPI, timer: StepTimer) -> Iterator[None]:
    """Patch timing wrappers around the steps of a prepare/unprepare; everything is restored after."""
    import kubeletplugin.devicesteps as steps_mod
    import kubeletplugin.state as state_mod
    from kubeletplugin.checkpointstore import CheckpointStore
    from kubeletplugin.migmanager import SimulatedMigManager
    from kubeletplugin.mps import SimulatedMpsControl

    targets: list[tuple[Any, str, str]] = [
        (api, "get_resource_claim", "apiserver GET claim"),
        (CheckpointStore, "save", "checkpoint write (fsync)"),
        (CheckpointStore, "load", "checkpoint read"),
        (state_mod, "plan_claim", "allocation + config parse"),
        (state_mod, "write_spec", "CDI spec write (fsync)"),
        (state_mod, "remove_spec", "CDI spec delete (fsync dir)"),
        (steps_mod, "remove_spec", "CDI spec delete (fsync dir)"),
        (SimulatedMpsControl, "start", "MPS daemon start (fake)"),
        (SimulatedMpsControl, "stop", "MPS daemon stop (fake)"),
        (SimulatedMigManager, "create", "MIG create (simulated)"),
        (SimulatedMigManager, "destroy", "MIG destroy (simulated)"),
    ]
    saved = []
    for owner, attr, label in targets:
        original = getattr(owner, attr)
        saved.append((owner, attr, original, attr in vars(owner)))
        setattr(owner, attr, timer.wrap(label, original))
    try:
        yield
    finally:
        for owner, attr, original, own in reversed(saved):
            if own:
                setattr(owner, attr, original)
            else:  # an instance that found the method on its class: drop the instance attribute
                delattr(owner, attr)


# ---------------------------------------------------------------------------------------------
# the measurements


@dataclass(frozen=True)
class ShapeResult:
    shape: str
    prepare: Summary
    unprepare: Summary
    steps_ms: dict[str, float]  # mean milliseconds per claim and step, prepare + unprepare
    other_prepare_ms: float  # prepare latency not inside any timed step: gRPC, service, locking, JSON


@dataclass(frozen=True)
class ThroughputResult:
    concurrency: int
    claims: int
    seconds: float
    prepare: Summary

    @property
    def per_second(self) -> float:
        return self.claims / self.seconds


@dataclass
class PrepareReport:
    api_kind: str
    shapes: list[ShapeResult] = field(default_factory=list)
    throughput: list[ThroughputResult] = field(default_factory=list)
    # the same call with no claims: gRPC over the socket plus DraService's batch handling, no claim work
    empty_call: Summary | None = None


class Bench:
    """Runs every measurement against one API (memory or real) with plugins per node profile."""

    def __init__(self, api: KubeAPI, source: ClaimSource, node_prefix: str) -> None:
        self.api = api
        self.source = source
        self.node_prefix = node_prefix
        self._plugins: dict[tuple[str, str], NodePlugin] = {}
        self._counter = 0

    def plugin(self, shape: Shape) -> NodePlugin:
        key = (shape.profile, shape.mig_strategy)
        if key not in self._plugins:
            node = f"{self.node_prefix}-{len(self._plugins)}"
            self._plugins[key] = NodePlugin(self.api, node, shape.profile, shape.mig_strategy)
        return self._plugins[key]

    def claims(self, shape: Shape, count: int) -> list[tuple[str, str]]:
        plugin = self.plugin(shape)
        out = []
        for i in range(count):
            self._counter += 1
            name = f"c{self._counter:06d}"
            claim, allocation = claim_object(name, shape, plugin.node, i)
            out.append((name, self.source.add(claim, allocation)))
        return out

    def latency(self, shape_name: str, count: int) -> ShapeResult:
        shape = SHAPES[shape_name]
        plugin = self.plugin(shape)
        warm = self.claims(shape, min(count, 3))
        for name, uid in warm:
            plugin.prepare(name, uid)
            plugin.unprepare(name, uid)
        prepares, unprepares = [], []
        for name, uid in self.claims(shape, count):
            t0 = time.perf_counter()
            plugin.prepare(name, uid)
            t1 = time.perf_counter()
            plugin.unprepare(name, uid)
            t2 = time.perf_counter()
            prepares.append((t1 - t0) * 1000)
            unprepares.append((t2 - t1) * 1000)
        # a separate pass with the step wrappers, so the latencies above carry no instrumentation
        timer = StepTimer()
        instrumented_claims = self.claims(shape, max(count // 2, 2))
        prepare_total = 0.0
        with instrumented(self.api, timer):
            prepare_steps = StepTimer()
            for name, uid in instrumented_claims:
                before = dict(timer.totals)
                t0 = time.perf_counter()
                plugin.prepare(name, uid)
                prepare_total += time.perf_counter() - t0
                for label, total in timer.totals.items():
                    prepare_steps.totals[label] += total - before.get(label, 0.0)
                plugin.unprepare(name, uid)
        n = len(instrumented_claims)
        steps = {label: total * 1000 / n for label, total in sorted(timer.totals.items(), key=lambda kv: -kv[1])}
        other = (prepare_total - sum(prepare_steps.totals.values())) * 1000 / n
        return ShapeResult(shape_name, summarize(prepares), summarize(unprepares), steps, other)

    def throughput(self, concurrency: int, per_thread: int) -> ThroughputResult:
        shape = SHAPES["10Gi share (MPS)"]
        plugin = self.plugin(shape)
        work = [self.claims(shape, per_thread) for _ in range(concurrency)]
        samples: list[float] = []
        errors: list[BaseException] = []
        lock = threading.Lock()
        start = threading.Barrier(concurrency + 1)

        def worker(claims: list[tuple[str, str]]) -> None:
            try:
                start.wait()
                for name, uid in claims:
                    t0 = time.perf_counter()
                    plugin.prepare(name, uid)
                    elapsed = (time.perf_counter() - t0) * 1000
                    plugin.unprepare(name, uid)
                    with lock:
                        samples.append(elapsed)
            except BaseException as exc:  # reported after the join, with the others' results
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(w,)) for w in work]
        for t in threads:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - t0
        if errors:
            raise BenchmarkError(f"{len(errors)} of {concurrency} workers failed; first: {errors[0]}")
        return ThroughputResult(concurrency, concurrency * per_thread, seconds, summarize(samples))

    def close(self) -> None:
        for plugin in self._plugins.values():
            plugin.close()


def run(api: KubeAPI, source: ClaimSource, api_kind: str, *, claims: int, node_prefix: str = "bench-node",
        concurrency: tuple[int, ...] = CONCURRENCY, burst: int = 64) -> PrepareReport:
    """Every shape's latency (one simulated node per profile) and the share throughput."""
    bench = Bench(api, source, node_prefix)
    report = PrepareReport(api_kind)
    try:
        report.empty_call = bench.plugin(SHAPES["whole GPU"]).empty_calls(max(claims, 10))
        for shape_name in SHAPES:
            report.shapes.append(bench.latency(shape_name, claims))
        for c in concurrency:
            # the same number of claims at every level: `burst` of them, split over c callers
            report.throughput.append(bench.throughput(c, max(1, burst // c)))
    finally:
        bench.close()
    return report


def run_in_memory(claims: int, concurrency: tuple[int, ...] = CONCURRENCY, burst: int = 64) -> PrepareReport:
    api = FakeKubeAPI(record_calls=False)
    return run(api, ClaimSource.memory(api), "in-memory apiserver", claims=claims, concurrency=concurrency,
               burst=burst)


def render(report: PrepareReport, floor: Summary | None) -> str:
    lines = [f"Prepare/unprepare over the DRA unix socket, claims from the {report.api_kind}"]
    rows = []
    for r in report.shapes:
        get = r.steps_ms.get("apiserver GET claim", 0.0)
        own = r.prepare.p50 - get
        row = [r.shape, *r.prepare.row()[:2], f"{r.prepare.p99 - get:.2f}", f"{own:.2f}", *r.unprepare.row()[:2]]
        if floor is not None:
            row.append(f"{own / floor.p50:.1f}x")
        rows.append(row)
    headers = ["claim", "prepare p50 ms", "prepare p99 ms", "p99 - GET ms", "own cost p50 ms (- GET)",
               "unprepare p50 ms", "unprepare p99 ms"]
    if floor is not None:
        headers.append(f"own / fsync floor ({floor.p50:.2f} ms)")
    lines.append(table(headers, rows))
    if report.empty_call is not None:
        e = report.empty_call
        lines.append(f"\nReference: NodePrepareResources with no claims over the same socket (gRPC + service): "
                     f"p50 {e.p50:.2f} ms, p99 {e.p99:.2f} ms.")
    lines.append("")
    lines.append("Where a prepare + unprepare spends its time (mean ms per claim, instrumented pass)")
    labels = sorted({label for r in report.shapes for label in r.steps_ms})
    step_rows = [[label, *(f"{r.steps_ms.get(label, 0.0):.2f}" for r in report.shapes)] for label in labels]
    step_rows.append(["(prepare outside these steps: gRPC, service, locks)",
                      *(f"{r.other_prepare_ms:.2f}" for r in report.shapes)])
    lines.append(table(["step", *(r.shape for r in report.shapes)], step_rows))
    lines.append("")
    lines.append("Throughput: concurrent kubelet calls, each preparing then unpreparing one 10Gi share claim")
    lines.append(table(["concurrent calls", "claims", "claims/s (prepare+unprepare)", *SUMMARY_HEADERS[:2]],
                       [[t.concurrency, t.claims, f"{t.per_second:.0f}", f"{t.prepare.p50:.2f}",
                         f"{t.prepare.p99:.2f}"] for t in report.throughput]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> PrepareReport:
    from benchmarks import fsync_floor

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--claims", type=int, default=200, help="claims per shape for the latency figures")
    args = parser.parse_args(argv)
    floor = fsync_floor.main(["--iterations", "300"])
    report = run_in_memory(args.claims)
    print(render(report, floor))
    return report


if __name__ == "__main__":
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    main()
