"""GPU health latency on a real node: injected event -> taint published -> pod evicted.

One real kubelet v1.36.3 + containerd node (a100-pcie-4, simulated GPUs) with the real scheduler,
ResourceClaim controller and kube-controller-manager's device-taint-eviction-controller. Each round
starts a pod holding a whole GPU, appends a double-bit ECC event for that GPU to the node agent's
health event log (what `tessera inject-health-event` does), and times, from the append:
- the NoExecute taint visible on the device in the apiserver's ResourceSlices,
- the pod marked for deletion by the eviction controller (deletionTimestamp set),
- the pod gone (kubelet stopped it and tessera unprepared its claim).
The log is then removed (the agent starts its book over, the taint goes) before the next round.

    python -m benchmarks.health_bench [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.stats import Summary, summarize, table
from e2e.cluster import Cluster, NodeSpec
from e2e.kube import Kube, Obj
from e2e.node.realnode import RealNode, real_node_unavailable
from e2e.processes import wait_for
from e2e.realpods import probe_pod
from e2e.workloads import claim_spec, claim_template, ensure_namespace, pod_claim_name, request, slices_of

NODE = "bench-a100"
NAMESPACE = "health"
POLL_S = 0.02
EVENT_LOG = "health-events.jsonl"
STAGES = ("taint published", "pod marked for eviction", "pod gone")


def _taints(kube: Kube) -> dict[str, list[Obj]]:
    return {d["name"]: d["taints"] for s in slices_of(kube, NODE) for d in s["spec"].get("devices", [])
            if d.get("taints")}


def one_round(kube: Kube, node: RealNode, name: str) -> dict[str, float]:
    kube.create(probe_pod(name, NAMESPACE, NODE, templates={"gpu": "whole"}))
    pod = wait_for(lambda: (p := kube.get("Pod", name, NAMESPACE)).get("status", {}).get("phase") == "Running"
                   and p, timeout=120, what=f"pod {name} to run")
    claim_name = pod_claim_name(pod)
    assert claim_name
    device = kube.get("ResourceClaim", claim_name, NAMESPACE)["status"]["allocation"]["devices"]["results"][0]["device"]
    line = json.dumps({"gpu": int(device.split("-")[1]), "event": "ecc-double-bit", "time": time.time()}) + "\n"
    seen: dict[str, float] = {}
    start = time.perf_counter()
    with (node.state_dir / EVENT_LOG).open("a") as f:
        f.write(line)
    deadline = start + 120
    while len(seen) < len(STAGES):
        now = time.perf_counter()
        if now > deadline:
            raise TimeoutError(f"round {name}: only {sorted(seen)} after 120 s")
        if STAGES[0] not in seen and device in _taints(kube):
            seen[STAGES[0]] = (time.perf_counter() - start) * 1000
        current = kube.get_or_none("Pod", name, NAMESPACE)
        if STAGES[1] not in seen and (current is None or current["metadata"].get("deletionTimestamp")):
            seen[STAGES[1]] = (time.perf_counter() - start) * 1000
        if current is None:
            seen.setdefault(STAGES[2], (time.perf_counter() - start) * 1000)
        time.sleep(POLL_S)
    (node.state_dir / EVENT_LOG).unlink()
    wait_for(lambda: not _taints(kube), timeout=30, what="the taint to go")
    wait_for(lambda: not kube.list("ResourceClaim", NAMESPACE), timeout=60, what="the evicted pod's claim to go")
    return seen


def run(rounds: int, on_round: Callable[[int], None] | None = None) -> dict[str, Summary]:
    reason = real_node_unavailable()
    if reason:
        raise SystemExit(f"the health benchmark needs a real node: {reason}")
    with tempfile.TemporaryDirectory(prefix="tessera-health-", dir="/tmp") as work:
        cluster = Cluster(Path(work) / "cluster", [NodeSpec(NODE, "a100-pcie-4", "static", real=True)])
        try:
            cluster.start()
            kube = cluster.kube
            node = cluster.real_nodes[NODE]
            ensure_namespace(kube, NAMESPACE)
            kube.apply(claim_template("whole", NAMESPACE, claim_spec(request())))
            samples: dict[str, list[float]] = {s: [] for s in STAGES}
            for r in range(rounds + 1):  # round 0 warms up (image unpack, informers)
                seen = one_round(kube, node, f"victim-{r}")
                if r:
                    for stage, ms in seen.items():
                        samples[stage].append(ms)
                if on_round:
                    on_round(r)
            return {s: summarize(v) for s, v in samples.items()}
        finally:
            cluster.stop()


def render(results: dict[str, Summary]) -> str:
    rows = [[stage, f"{s.p50:.0f}", f"{s.p99:.0f}", f"{s.max:.0f}", str(s.n)] for stage, s in results.items()]
    return table(["event appended ->", "p50 ms", "p99 ms", "max ms", "n"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    results = run(args.rounds, on_round=lambda r: print(f"round {r} done", flush=True))
    print(render(results))


if __name__ == "__main__":
    main()
