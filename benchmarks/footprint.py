"""Footprint of tessera's two long-running processes: the kubelet plugin and the controller.

Each runs as the real command (`python -m tessera kubelet-plugin` / `controller`) against the
benchmark control plane. Reported: process start until its work is visible (the plugin's slices
accepted by the apiserver; the controller serving TLS with its webhooks registered), then, after a
warm-up, resident memory (VmRSS) and idle CPU (utime + stime over a window), both from /proc.
The reference is the bare interpreter: `python -c "import time; time.sleep(...)"`'s RSS.

Also, while the controller's webhooks are registered: apiserver round trips (dry-run creates)
of a ResourceClaim and a DeviceClass with and without tessera's admission webhooks in the path.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks import controlplane
from benchmarks.stats import Summary, summarize, table
from driver.discovery import load_inventory
from driver.slices import build_slices
from e2e.cluster import Controller
from e2e.processes import ManagedProcess, free_port

if TYPE_CHECKING:
    from e2e.cluster import ControlPlane
    from e2e.kube import Kube

CLK_TCK = os.sysconf("SC_CLK_TCK")
A = 'device.attributes["gpu.tessera.dev"]'


@dataclass(frozen=True)
class Footprint:
    process: str
    ready_s: float
    rss_mib: float
    cpu_percent: float
    window_s: float


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS (a kernel thread?)")


def cpu_seconds(pid: int) -> float:
    # fields after the parenthesised command name; utime and stime are the 14th and 15th overall
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def idle(pid: int, warmup_s: float, window_s: float) -> tuple[float, float]:
    """(RSS MiB, CPU percent of one core) after `warmup_s`, CPU averaged over `window_s`."""
    time.sleep(warmup_s)
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(window_s)
    c1, t1 = cpu_seconds(pid), time.monotonic()
    return rss_mib(pid), (c1 - c0) / (t1 - t0) * 100


def interpreter_baseline() -> float:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.5)
        return rss_mib(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def plugin_footprint(plane: ControlPlane, warmup_s: float, window_s: float) -> Footprint:
    kube = controlplane.kube_of(plane)
    node = controlplane.unique("footprint")
    controlplane.fake_node(kube, node)
    expected = len(build_slices(load_inventory(node, simulate="dgx-h100-8"), mig_strategy="static"))
    with tempfile.TemporaryDirectory(prefix="tsf-", dir="/tmp") as d:
        root = Path(d)
        argv = [sys.executable, "-m", "tessera", "--log-format=json", "kubelet-plugin", f"--node-name={node}",
                "--simulate=dgx-h100-8", f"--kubeconfig={plane.kubeconfig}", f"--kubelet-dir={root / 'kubelet'}",
                f"--cdi-dir={root / 'cdi'}", f"--state-dir={root / 'state'}",
                f"--metrics-addr=127.0.0.1:{free_port()}", "--cleanup-on-exit"]
        t0 = time.perf_counter()
        proc = ManagedProcess("plugin", argv, root / "plugin.log").start()
        try:
            ready = controlplane.wait_count(kube, node, expected, timeout=120, interval=0.02) - t0
            proc.check_alive()
            rss, cpu = idle(proc.pid, warmup_s, window_s)
        finally:
            proc.stop()
    return Footprint("kubelet plugin (dgx-h100-8, simulated)", ready, rss, cpu, window_s)


@dataclass(frozen=True)
class WireResult:
    review: str
    without: Summary
    with_webhook: Summary


def _claim(name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "g", "exactly": {
                "deviceClassName": "shared.gpu.tessera.dev", "capacity": {"requests": {"memory": "4Gi"}}}}]}}}


def _class(name: str) -> dict[str, Any]:
    expression = f'device.driver == "gpu.tessera.dev" && {A}.type == "gpu"'
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]}}


def _round_trips(kube: Kube, make: Any, count: int) -> Summary:
    samples = []
    for i in range(count + 3):
        t0 = time.perf_counter()
        kube.create(make(f"wire-{i}"), dry_run=True)
        if i >= 3:  # the first calls open connections on both hops
            samples.append((time.perf_counter() - t0) * 1000)
    return summarize(samples)


def controller_footprint(plane: ControlPlane, warmup_s: float, window_s: float,
                         round_trips: int) -> tuple[Footprint, list[WireResult]]:
    kube = controlplane.kube_of(plane)
    makers = {"ResourceClaim (4Gi share)": _claim, "DeviceClass": _class}
    without = {name: _round_trips(kube, make, round_trips) for name, make in makers.items()}
    with tempfile.TemporaryDirectory(prefix="tsc-") as d:
        controller = Controller(Path(d), plane.kubeconfig, plane.pki)
        t0 = time.perf_counter()
        try:
            controller.start(kube)
            ready = time.perf_counter() - t0
            assert controller.process is not None
            pid = controller.process.pid
            rss, cpu = idle(pid, warmup_s, window_s)  # the warm-up also lets its inventory cache sync
            with_hook = {name: _round_trips(kube, make, round_trips) for name, make in makers.items()}
        finally:
            # the webhooks fail closed: they must not outlive the controller
            for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
                with contextlib.suppress(Exception):
                    kube.delete(kind, "tessera")
            controller.stop()
    wire = [WireResult(name, without[name], with_hook[name]) for name in makers]
    return Footprint("controller (webhooks + inventory cache)", ready, rss, cpu, window_s), wire


def render(footprints: list[Footprint], baseline_mib: float, wire: list[WireResult]) -> str:
    rows = [[f.process, f"{f.ready_s:.2f}", f"{f.rss_mib:.0f}", f"{f.rss_mib / baseline_mib:.1f}x",
             f"{f.cpu_percent:.2f}", f"{f.window_s:.0f}"] for f in footprints]
    out = [f"Process footprint (reference: a bare `python -c sleep` is {baseline_mib:.0f} MiB RSS)",
           table(["process", "start -> ready s", "RSS MiB", "RSS / bare interpreter", "idle CPU % of a core",
                  "CPU window s"], rows)]
    if wire:
        out += ["", "Apiserver round trip (dry-run create over HTTPS), without and with tessera's webhooks",
                table(["object", "without p50 ms", "without p99 ms", "with p50 ms", "with p99 ms",
                       "added p50 ms"],
                      [[w.review, f"{w.without.p50:.2f}", f"{w.without.p99:.2f}", f"{w.with_webhook.p50:.2f}",
                        f"{w.with_webhook.p99:.2f}", f"{w.with_webhook.p50 - w.without.p50:.2f}"] for w in wire])]
    return "\n".join(out)
