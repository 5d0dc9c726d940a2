"""Soak: memory shares created and deleted at a steady rate on the e2e cluster, leaks recorded.

`make soak` (10 minutes) or `python -m e2e.soak --minutes N [--rate PODS_PER_MIN] [--live N]`.
Not part of CI. One fake node (4x A100 40GB, simulated) runs tessera's plugin behind the kubelet
stand-in, with tessera's controller in the admission path. Every 60/rate seconds a pod with a
memory-share claim (from a template, so the claim is created and garbage-collected with the pod)
is created; once more than `--live` pods exist, the oldest is deleted. Every 10 s the resident
memory, open file descriptors and threads of the plugin and the controller are sampled from
/proc. At the end everything is deleted and the node must hold nothing: no CDI spec, no MPS
daemon, no checkpoint entry. The summary (also written as JSON) gives first, last and peak of each
figure, the growth over the run after a one-minute warm-up, and the pod counts.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.cluster import NodeSpec, running_cluster
from e2e.kube import Kube, KubeError
from e2e.workloads import claim_spec, claim_template, ensure_namespace, pod, request

NODE = "soak-a100"
NAMESPACE = "soak"
SAMPLE_EVERY_S = 10.0
WARMUP_S = 60.0
RUNNING_TIMEOUT_S = 120.0


def proc_figures(pid: int) -> dict[str, int]:
    """Resident memory (KiB), threads and open file descriptors of a live process, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "rss_kib": int(fields["VmRSS"].split()[0]),
        "threads": int(fields["Threads"].strip()),
        "fds": len(list(Path(f"/proc/{pid}/fd").iterdir())),
    }


@dataclass
class Tracked:
    name: str
    created: float
    running_at: float | None = None
    deleted_at: float | None = None


@dataclass
class Soak:
    kube: Kube
    pids: dict[str, int]
    rate_per_min: float
    live: int
    samples: list[dict[str, Any]] = field(default_factory=list)
    pods: deque[Tracked] = field(default_factory=deque)
    deleting: list[Tracked] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: {"created": 0, "running": 0, "deleted": 0,
                                                           "not_running_in_time": 0, "api_errors": 0})
    latencies: list[float] = field(default_factory=list)

    def sample(self, t: float) -> None:
        row: dict[str, Any] = {"t": round(t, 1)}
        for name, pid in self.pids.items():
            row[name] = proc_figures(pid)
        self.samples.append(row)

    def tick(self, n: int, now: float) -> None:
        name = f"share-{n:05d}"
        try:
            self.kube.create(pod(name, NAMESPACE, template="share", node=NODE))
            self.pods.append(Tracked(name, now))
            self.counts["created"] += 1
        except KubeError as exc:
            self.counts["api_errors"] += 1
            print(f"create {name}: {exc}", file=sys.stderr)
        self.observe(now)
        while len(self.pods) > self.live:
            self.delete(self.pods.popleft(), now)

    def observe(self, now: float) -> None:
        for p in self.pods:
            if p.running_at is None:
                obj = self.kube.get_or_none("Pod", p.name, NAMESPACE)
                if obj and obj.get("status", {}).get("phase") == "Running":
                    p.running_at = now
                    self.counts["running"] += 1
                    self.latencies.append(now - p.created)
                elif now - p.created > RUNNING_TIMEOUT_S and not getattr(p, "late", False):
                    self.counts["not_running_in_time"] += 1
                    p.late = True  # type: ignore[attr-defined]
        for p in list(self.deleting):
            if self.kube.get_or_none("Pod", p.name, NAMESPACE) is None:
                self.deleting.remove(p)
                self.counts["deleted"] += 1

    def delete(self, p: Tracked, now: float) -> None:
        self.kube.delete("Pod", p.name, NAMESPACE)
        p.deleted_at = now
        self.deleting.append(p)


def growth(samples: list[dict[str, Any]], who: str, key: str) -> dict[str, Any]:
    values = [(s["t"], s[who][key]) for s in samples if who in s]
    settled = [v for t, v in values if t >= WARMUP_S] or [v for _, v in values]
    return {"first": values[0][1], "last": values[-1][1], "peak": max(v for _, v in values),
            "after_warmup_first": settled[0], "after_warmup_growth": settled[-1] - settled[0]}


def node_leftovers(cluster: Any) -> dict[str, Any]:
    agent = cluster.agents[NODE]
    specs = sorted(p.name for p in agent.cdi_dir.glob("gpu.tessera.dev-claim_*.json"))
    mps_file = agent.state_dir / "fake-mps.json"
    mps = json.loads(mps_file.read_text()) if mps_file.exists() else {}
    checkpoint = agent.state_dir / "checkpoint.json"
    claims = json.loads(checkpoint.read_text())["claims"] if checkpoint.exists() else {}
    return {"cdi_specs": specs, "mps_daemons": sorted(mps), "checkpoint_claims": sorted(claims)}


def run(minutes: float, rate: float, live: int, out: Path | None, work_dir: Path) -> dict[str, Any]:
    nodes = [NodeSpec(NODE, "a100-pcie-4", "static")]
    with running_cluster(work_dir, nodes) as cluster:
        kube = cluster.kube
        ensure_namespace(kube, NAMESPACE)
        kube.create(claim_template("share", NAMESPACE, claim_spec(request(memory="2Gi"))))
        agent = cluster.agents[NODE]
        assert agent.plugin is not None
        pids = {"plugin": agent.plugin.pid}
        if cluster.controller is not None and cluster.controller.process is not None:
            pids["controller"] = cluster.controller.process.pid
        soak = Soak(kube, pids, rate, live)
        start = time.monotonic()
        end = start + minutes * 60
        interval = 60.0 / rate
        next_tick, next_sample, n = start, start, 0
        soak.sample(0.0)
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_tick:
                soak.tick(n, now - start)
                n += 1
                next_tick += interval
            if now >= next_sample:
                soak.sample(now - start)
                next_sample += SAMPLE_EVERY_S
                s = soak.samples[-1]
                print(f"[{now - start:6.0f}s] pods created={soak.counts['created']} running={soak.counts['running']} "
                      f"deleted={soak.counts['deleted']} | " + " | ".join(
                          f"{k} rss={v['rss_kib'] // 1024} MiB fds={v['fds']} threads={v['threads']}"
                          for k, v in s.items() if k != "t"), flush=True)  # fmt: skip
            time.sleep(min(0.2, max(0.0, min(next_tick, next_sample) - time.monotonic())))
        # drain: everything deleted, then the node must hold nothing
        while soak.pods:
            soak.delete(soak.pods.popleft(), time.monotonic() - start)
        drain_deadline = time.monotonic() + 180
        while (soak.deleting or kube.list("ResourceClaim", NAMESPACE)) and time.monotonic() < drain_deadline:
            soak.observe(time.monotonic() - start)
            time.sleep(0.5)
        time.sleep(2.0)  # the last unprepare calls
        soak.sample(time.monotonic() - start)
        leftovers = node_leftovers(cluster)
        summary = {
            "minutes": minutes, "rate_per_min": rate, "live_pods": live, "counts": soak.counts,
            "pod_start_seconds": {
                "median": sorted(soak.latencies)[len(soak.latencies) // 2] if soak.latencies else None,
                "max": max(soak.latencies) if soak.latencies else None,
            },
            "figures": {who: {key: growth(soak.samples, who, key) for key in ("rss_kib", "fds", "threads")}
                        for who in pids},
            "node_leftovers_after_drain": leftovers,
            "claims_left": len(kube.list("ResourceClaim", NAMESPACE)),
            "samples": soak.samples,
        }  # fmt: skip
    if out is not None:
        out.write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to create and delete shares")
    parser.add_argument("--rate", type=float, default=30.0, help="pods created per minute")
    parser.add_argument("--live", type=int, default=8, help="pods kept alive at once; older ones are deleted")
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write the JSON summary with every sample (default: a new file under /tmp)")
    args = parser.parse_args(argv)
    if args.out is None:  # never inside the checkout
        args.out = Path(tempfile.gettempdir()) / f"tessera-soak-{time.strftime('%Y%m%dT%H%M%S')}.json"
    with tempfile.TemporaryDirectory(prefix="tessera-soak-", dir="/tmp") as work:
        summary = run(args.minutes, args.rate, args.live, args.out, Path(work))
    brief = {k: v for k, v in summary.items() if k != "samples"}
    print(json.dumps(brief, indent=1))
    left = summary["node_leftovers_after_drain"]
    clean = not any(left.values()) and summary["claims_left"] == 0
    print("node clean after drain" if clean else f"LEAK: {left}, claims left {summary['claims_left']}")
    print(f"summary with every sample: {args.out}")
    return 0 if clean and summary["counts"]["not_running_in_time"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
