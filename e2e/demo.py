"""`make demo`: a local control plane with two simulated GPU nodes running tessera, and example claims.

    python -m e2e.demo up     # start (building the harness if needed), run examples, print a table
    python -m e2e.demo down   # stop everything started by `up`

State lives under ./.demo/ (kubeconfig, logs, CDI specs, the pids of the detached processes).
Nodes: `demo-dgx` (dgx-h100-8, dynamic MIG) and `demo-a100` (a100-pcie-4, static).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import time
from functools import partial

from e2e.cluster import DRIVER, Cluster, NodeSpec
from e2e.processes import REPO, ClusterError, wait_for
from e2e.workloads import (
    RunningPod,
    claim_spec,
    claim_template,
    consumed_memory,
    ensure_namespace,
    parse_quantity,
    pod,
    request,
    slices_of,
    wait_running,
)

DEMO_DIR = REPO / ".demo"
PIDS = DEMO_DIR / "pids.json"
NAMESPACE = "demo"
NODES = [NodeSpec("demo-dgx", "dgx-h100-8", "dynamic"), NodeSpec("demo-a100", "a100-pcie-4", "static")]
GiB = 1024**3

# (pod, what it shows, claim spec, node it is pinned to or None). The two shares are pinned to one
# node so that the scheduler's first-fit puts them on the same card.
EXAMPLES = [
    ("whole-gpu", "Whole GPU", claim_spec(request()), None),
    ("nvlink-pair", "2 GPUs on one NVLink island", claim_spec(request(count=2), same_island=True), None),
    ("share-10gi", "10 GiB memory share (MPS)", claim_spec(request(memory="10Gi")), "demo-a100"),
    ("share-10gi-b", "another 10 GiB share", claim_spec(request(memory="10Gi")), "demo-a100"),
    ("mig-1g", "MIG 1g.10gb (dynamic)", claim_spec(request(
        "gpu", device_class=f"mig.{DRIVER}", selectors=[f'device.attributes["{DRIVER}"].profile == "1g.10gb"'])),
     None),
]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def down() -> int:
    if not PIDS.exists():
        print("no demo is running (no .demo/pids.json)")
        return 0
    pids = json.loads(PIDS.read_text())
    # Reverse start order: node agents first, the apiserver and etcd last.
    for entry in reversed(pids["processes"]):
        if _alive(entry["pid"]):
            try:
                os.killpg(entry["pid"], signal.SIGTERM)
            except ProcessLookupError:
                continue
    deadline = time.monotonic() + 15
    for entry in reversed(pids["processes"]):
        while _alive(entry["pid"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(entry["pid"]):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(entry["pid"], signal.SIGKILL)
    for path in pids.get("cleanup", []):
        shutil.rmtree(path, ignore_errors=True)
    PIDS.unlink()
    print(f"demo stopped; logs kept under {DEMO_DIR}")
    return 0


def _row(running: RunningPod, what: str, memory_of: dict[tuple[str, str], int]) -> list[str]:
    per_card = []
    for r in running.results:
        used = consumed_memory(r) or memory_of.get((running.node, r["device"]), 0)
        per_card.append(f"{used / GiB:.1f}Gi")
    return [running.pod["metadata"]["name"], what, running.node, ",".join(running.devices), ",".join(per_card),
            "\n".join(running.cdi_ids)]


def _table(rows: list[list[str]]) -> str:
    header = ["POD", "EXAMPLE", "NODE", "DEVICES", "MEMORY/CARD", "CDI IDS"]
    widths = [max(len(header[i]), *(len(line) for r in rows for line in r[i].splitlines() or [""]))
              for i in range(len(header))]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    for r in rows:
        cells = [c.splitlines() or [""] for c in r]
        for i in range(max(len(c) for c in cells)):
            out.append("  ".join((c[i] if i < len(c) else "").ljust(w) for c, w in zip(cells, widths, strict=True)))
    return "\n".join(out)


def up() -> int:
    if PIDS.exists() and any(_alive(p["pid"]) for p in json.loads(PIDS.read_text())["processes"]):
        print(f"a demo is already running (kubeconfig {DEMO_DIR / 'cluster' / 'kubeconfig'}); `make demo-down` first")
        return 1
    if DEMO_DIR.exists():
        shutil.rmtree(DEMO_DIR / "cluster", ignore_errors=True)
    DEMO_DIR.mkdir(exist_ok=True)
    started = time.monotonic()
    cluster = Cluster(DEMO_DIR / "cluster", NODES)
    try:
        cluster.start()
    except (ClusterError, OSError) as exc:
        print(f"demo: the cluster did not come up: {exc}\n{cluster.diagnostics(20)}", file=sys.stderr)
        cluster.stop()
        return 1
    etcd_dir = getattr(cluster.control_plane, "_etcd_dir", None)
    cleanup = [str(etcd_dir)] if etcd_dir else []
    # Short kubelet dirs under /tmp (only for deep checkouts, see NodeAgent.kubelet_dir).
    cleanup += [str(a.kubelet_dir) for a in cluster.agents.values() if (a.work_dir / "kubelet").is_symlink()]
    PIDS.write_text(json.dumps({
        "processes": [{"name": p.name, "pid": p.pid} for p in cluster.processes()],
        "cleanup": cleanup,
    }, indent=1))
    print(f"control plane and {len(NODES)} nodes up in {time.monotonic() - started:.0f}s "
          f"(controller: {'on' if cluster.controller else 'off: ' + cluster.controller_skip_reason})")

    kube = cluster.kube
    ensure_namespace(kube, NAMESPACE)
    memory_of = {}
    for node in NODES:
        wait_for(partial(slices_of, kube, node.name), timeout=30, what=f"slices of {node.name}")
        for s in slices_of(kube, node.name):
            for d in s["spec"].get("devices", []):
                if "memory" in d.get("capacity", {}):
                    memory_of[(node.name, d["name"])] = parse_quantity(d["capacity"]["memory"]["value"])
    for name, _, spec, pinned in EXAMPLES:
        kube.apply(claim_template(name, NAMESPACE, spec))
        kube.apply(pod(name, NAMESPACE, template=name, node=pinned))
    rows, failures = [], []
    for name, what, _, _ in EXAMPLES:
        try:
            rows.append(_row(wait_running(kube, NAMESPACE, name, timeout=90), what, memory_of))
        except ClusterError as exc:
            failures.append(f"{name} ({what}): {exc}")
    print()
    print(_table(rows))
    for f in failures:
        print(f"\nNOT RUNNING: {f}")
    kubectl = _kubectl_hint()
    print(f"\nThe demo keeps running. kubeconfig: {cluster.kubeconfig}")
    print(f"  {kubectl} --kubeconfig {cluster.kubeconfig} get resourceslices,resourceclaims -A")
    print(f"logs: {cluster.work_dir}/logs and {cluster.work_dir}/nodes/*/   stop it with: make demo-down")
    # Detach: the processes live in their own sessions; leaving without stopping them keeps them up.
    return 1 if failures else 0


def _kubectl_hint() -> str:
    """The pinned kubectl 1.36.3 from hack/k8stools when it is already cached, else the harness's own."""
    try:
        from hack.k8stools import WHEEL_PROJECT, WHEEL_VERSION, default_cache_dir

        path = default_cache_dir() / f"{WHEEL_PROJECT}-{WHEEL_VERSION}" / "kubectl"
        if path.is_file():
            return str(path)
    except ImportError:
        pass
    return f"{os.environ.get('TESSERA_HARNESS', 'tessera-harness')} kubectl"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["up", "down"])
    args = parser.parse_args(argv)
    return up() if args.action == "up" else down()


if __name__ == "__main__":
    sys.exit(main())
