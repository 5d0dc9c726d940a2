"""Pod start-up on a real node: what tessera + DRA add between `create` and `Running`.

One real kubelet v1.36.3 + containerd node (dgx-h100-8, simulated GPUs) with the real scheduler,
ResourceClaim controller and tessera's webhook. Each round creates, one after another, the same
busybox pod with no claim, with a whole GPU, with a 10Gi share and with "12Gi across 4 cards",
and times create -> phase Running as the apiserver reports it; pods are deleted (and their claims
unprepared) before the next. The no-claim pod is the reference measured in the same run, so the
ratio is the figure. Then 100 pods are created at once, without and with claims (1Gi shares).

    python -m benchmarks.podstart_bench [--rounds N] [--burst N]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.stats import Summary, summarize, table
from e2e.cluster import Cluster, NodeSpec
from e2e.kube import Kube, Obj
from e2e.node.realnode import real_node_unavailable
from e2e.processes import wait_for
from e2e.realpods import probe_pod
from e2e.workloads import claim_spec, claim_template, delete_pods, ensure_namespace, request, spread_config

NODE = "bench-dgx"
NAMESPACE = "podstart"
POLL_S = 0.02

KINDS: dict[str, Obj | None] = {
    "no claim (reference)": None,
    "whole GPU": claim_spec(request()),
    "10Gi share": claim_spec(request(memory="10Gi")),
    "12Gi across 4 cards": claim_spec(request("gpu", count=4), config=spread_config("12Gi", requests=("gpu",))),
}


def _pod(name: str, template: str | None) -> Obj:
    return probe_pod(name, NAMESPACE, NODE, templates={"gpu": template} if template else None)


def _running(kube: Kube, name: str) -> bool:
    return bool(kube.get("Pod", name, NAMESPACE).get("status", {}).get("phase") == "Running")


def time_to_running(kube: Kube, obj: Obj, timeout: float = 120.0) -> float:
    """Milliseconds from the create call to the apiserver reporting the pod Running."""
    name = obj["metadata"]["name"]
    start = time.perf_counter()
    kube.create(obj)
    deadline = start + timeout
    while not _running(kube, name):
        if time.perf_counter() > deadline:
            raise TimeoutError(f"pod {name} did not run within {timeout:.0f}s")
        time.sleep(POLL_S)
    return (time.perf_counter() - start) * 1000


@dataclass(frozen=True)
class BurstResult:
    label: str
    all_running_ms: float
    per_pod: Summary


def burst(kube: Kube, label: str, count: int, template: str | None) -> BurstResult:
    """Create `count` pods at once; per-pod create -> Running, and until the last one runs."""
    names = [f"burst-{i}" for i in range(count)]
    created: dict[str, float] = {}
    done: dict[str, float] = {}
    start = time.perf_counter()
    for name in names:
        created[name] = time.perf_counter()
        kube.create(_pod(name, template))
    while len(done) < count:
        for p in kube.list("Pod", NAMESPACE):
            name = p["metadata"]["name"]
            if name in created and name not in done and p.get("status", {}).get("phase") == "Running":
                done[name] = time.perf_counter()
        if time.perf_counter() - start > 600:
            raise TimeoutError(f"{count - len(done)} of {count} pods not running after 600 s")
        time.sleep(0.1)
    result = BurstResult(label, (max(done.values()) - start) * 1000,
                         summarize([(done[n] - created[n]) * 1000 for n in names]))
    delete_pods(kube, NAMESPACE, timeout=300)
    return result


def run(rounds: int, burst_size: int, on_round: Callable[[int], None] | None = None) -> tuple[dict[str, Summary],
                                                                                                 list[BurstResult]]:
    reason = real_node_unavailable()
    if reason:
        raise SystemExit(f"pod start-up needs a real node: {reason}")
    with tempfile.TemporaryDirectory(prefix="tessera-podstart-", dir="/tmp") as work:
        cluster = Cluster(Path(work) / "cluster", [NodeSpec(NODE, "dgx-h100-8", "static", real=True)])
        try:
            cluster.start()
            kube = cluster.kube
            ensure_namespace(kube, NAMESPACE)
            for i, spec in enumerate(KINDS.values()):
                if spec is not None:
                    kube.apply(claim_template(f"t{i}", NAMESPACE, spec))
            # One warm-up pod per kind: the first container start pays for unpacking the image.
            samples: dict[str, list[float]] = {k: [] for k in KINDS}
            for r in range(rounds + 1):
                for i, (kind, spec) in enumerate(KINDS.items()):
                    ms = time_to_running(kube, _pod(f"p{i}-{r}", f"t{i}" if spec is not None else None))
                    if r:
                        samples[kind].append(ms)
                    delete_pods(kube, NAMESPACE, timeout=120)
                if on_round:
                    on_round(r)
            kube.apply(claim_template("share1", NAMESPACE, claim_spec(request(memory="1Gi"))))
            bursts = [burst(kube, f"{burst_size} pods, no claim", burst_size, None),
                      burst(kube, f"{burst_size} pods, a 1Gi share each", burst_size, "share1")]
            wait_for(lambda: not kube.list("Pod", NAMESPACE), timeout=120, what="benchmark pods gone")
            return {k: summarize(v) for k, v in samples.items()}, bursts
        finally:
            cluster.stop()


def render(singles: dict[str, Summary], bursts: list[BurstResult]) -> str:
    ref = singles["no claim (reference)"]
    rows = [[kind, f"{s.p50:.0f}", f"{s.p99:.0f}", f"{s.p50 / ref.p50:.2f}x", f"{s.p99 / ref.p99:.2f}x", str(s.n)]
            for kind, s in singles.items()]
    out = table(["pod", "p50 ms", "p99 ms", "p50 vs no claim", "p99 vs no claim", "n"], rows)
    base = bursts[0]
    brows = [[b.label, f"{b.all_running_ms:.0f}", f"{b.per_pod.p50:.0f}", f"{b.per_pod.p99:.0f}",
              f"{b.all_running_ms / base.all_running_ms:.2f}x"] for b in bursts]
    return out + "\n\n" + table(["burst", "all Running ms", "per-pod p50 ms", "per-pod p99 ms", "vs no claim"], brows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--burst", type=int, default=100)
    args = parser.parse_args()
    singles, bursts = run(args.rounds, args.burst, on_round=lambda r: print(f"round {r} done", flush=True))
    print(render(singles, bursts))


if __name__ == "__main__":
    main()
