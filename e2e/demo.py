"""`make demo`: a local control plane with two simulated GPU nodes, tessera installed by its chart, example claims.

    python -m e2e.demo up     # start (building the harness and node components if needed), run examples
    python -m e2e.demo down   # stop everything started by `up`, and check the machine is as it was

State lives under ./.demo/ (kubeconfig, logs, CDI specs, the pids of the detached processes).
Nodes: `demo-dgx` (dgx-h100-8, dynamic MIG) and `demo-a100` (a100-pcie-8-mig: four whole A100s and four
cut into MIG instances as NVIDIA's quickstart machine is, static MIG), each a real
kubelet v1.36.3 + containerd 2 node (e2e/node) in its own network namespace (e2e/network.py), whose
containers print what they were given. tessera's image is built (`make image`), loaded into both
nodes and installed with `helm upgrade --install ... -f helm/values-simulated.yaml`, as the README
says. Where a real node cannot run (not root, no overlayfs), the demo says why, uses the kubelet
stand-in and starts tessera's processes by hand.
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
from pathlib import Path

import yaml

from e2e.chart import NAMESPACE as CHART_NAMESPACE
from e2e.chart import (
    RELEASE,
    build_image,
    install_args,
    install_into,
    kubectl,
    simulated_node_labels,
    tools,
)
from e2e.cluster import DRIVER, Cluster, NodeSpec
from e2e.kube import Kube, Obj
from e2e.network import kill_namespace
from e2e.node.hermetic import differences, machine_snapshot
from e2e.node.realnode import kill_node, pid_alive, real_node_unavailable
from e2e.processes import REPO, ClusterError, wait_for
from e2e.realpods import StartedPod, probe_pod, wait_reported
from e2e.workloads import (
    claim_spec,
    claim_template,
    consumed_memory,
    ensure_namespace,
    parse_quantity,
    pod,
    pod_claim_name,
    request,
    slices_of,
    spread_config,
    time_slicing_config,
    wait_running,
)

DEMO_DIR = REPO / ".demo"
PIDS = DEMO_DIR / "pids.json"
MACHINE_BEFORE = DEMO_DIR / "machine-before.json"
NAMESPACE = "demo"
DGX, A100 = "demo-dgx", "demo-a100"
GiB = 1024**3



def _nvidia_claim_spec(name: str) -> Obj:
    """The claim spec of the ResourceClaimTemplate in e2e/nvidia_specs/<name>.yaml (NVIDIA's, names translated)."""
    docs = yaml.safe_load_all((REPO / "e2e" / "nvidia_specs" / f"{name}.yaml").read_text())
    spec: Obj = next(d for d in docs if d and d["kind"] == "ResourceClaimTemplate")["spec"]["spec"]
    return spec


# (pod, what it shows, claim spec, node it is pinned to, its containers: names, or names -> the request each
# names). Every example is pinned, so the two shares land on one card (first fit) and the table reads the
# same on every run.
EXAMPLES: list[tuple[str, str, Obj, str, list[str] | dict[str, str]]] = [
    ("whole-gpu", "Whole GPU", claim_spec(request()), DGX, ["cuda"]),
    ("nvlink-pair", "2 GPUs on one NVLink island", claim_spec(request(count=2), same_island=True), A100, ["cuda"]),
    ("share-10gi", "10 GiB memory share (MPS)", claim_spec(request(memory="10Gi")), A100, ["cuda"]),
    ("share-10gi-b", "another 10 GiB share", claim_spec(request(memory="10Gi")), A100, ["cuda"]),
    ("spread-12gi", "12Gi across 4 cards (3Gi each)",
     claim_spec(request("gpu", count=4), config=spread_config("12Gi", requests=("gpu",))), DGX, ["cuda"]),
    ("mig-1g", "MIG 1g.10gb (dynamic)", claim_spec(request(
        "gpu", device_class=f"mig.{DRIVER}", selectors=[f'device.attributes["{DRIVER}"].profile == "1g.10gb"'])),
     DGX, ["cuda"]),
    ("time-sliced", "1 GPU time-sliced by 2 containers",
     claim_spec(request(device_class=f"timeslicing.{DRIVER}"), config=time_slicing_config()), A100,
     ["trainer", "sidecar"]),
    ("gpu-test4", "NVIDIA's gpu-test4: 4 MIG devices\nof one A100, one per container", _nvidia_claim_spec("gpu-test4"),
     A100, {"ctr0": "mig-1g-5gb-0", "ctr1": "mig-1g-5gb-1", "ctr2": "mig-2g-10gb", "ctr3": "mig-3g-20gb"}),
]


def demo_nodes() -> tuple[list[NodeSpec], str]:
    """Real nodes where this machine can run them (tessera installed by the chart, each node's profile from
    its labels), else the stand-in with tessera started by hand, and the reason why."""
    reason = real_node_unavailable()
    real = not reason
    nodes = [NodeSpec(name, profile, mig, real=real, labels=simulated_node_labels(profile, mig),
                      plugin_by_hand=not real)
             for name, profile, mig in ((DGX, "dgx-h100-8", "dynamic"), (A100, "a100-pcie-8-mig", "static"))]
    return nodes, reason


def _link_tools() -> Path:
    """.demo/bin/{helm,kubectl}: the pinned versions, for the README's `export PATH=$PWD/.demo/bin:$PATH`."""
    bin_dir = DEMO_DIR / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, path in (("helm", tools().helm), ("kubectl", tools().kubectl)):
        link = bin_dir / name
        link.unlink(missing_ok=True)
        link.symlink_to(path)
    return bin_dir


def down() -> int:
    if not PIDS.exists():
        print("no demo is running (no .demo/pids.json)")
        return 0
    pids = json.loads(PIDS.read_text())
    for node in pids.get("realNodes", []):
        kill_node(node["holder"], node["cgroup"])
    if "network" in pids:
        kill_namespace(pids["network"]["holder"], "net")
    # Reverse start order: node agents first, the apiserver and etcd last.
    for entry in reversed(pids["processes"]):
        if pid_alive(entry["pid"]):
            try:
                os.killpg(entry["pid"], signal.SIGTERM)
            except ProcessLookupError:
                continue
    deadline = time.monotonic() + 15
    for entry in reversed(pids["processes"]):
        while pid_alive(entry["pid"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_alive(entry["pid"]):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(entry["pid"], signal.SIGKILL)
    for path in pids.get("cleanup", []):
        shutil.rmtree(path, ignore_errors=True)
    PIDS.unlink()
    print(f"demo stopped; logs kept under {DEMO_DIR}")
    if MACHINE_BEFORE.exists():
        left = differences(json.loads(MACHINE_BEFORE.read_text()), machine_snapshot())
        MACHINE_BEFORE.unlink()
        if left:
            print("the machine differs from before the demo:\n  " + "\n  ".join(left))
            return 1
        print("the machine is as it was before `make demo` (/, /opt, /var/lib, /var/log, /etc/cni, /run, "
              "mounts, cgroups, iptables, interfaces, addresses, routes, node processes)")
    return 0


def _table(rows: list[list[str]], last: str) -> str:
    header = ["POD", "EXAMPLE", "NODE", "DEVICES", "MEMORY/CARD", last]
    widths = [max(len(header[i]), *(len(line) for r in rows for line in r[i].splitlines() or [""]))
              for i in range(len(header))]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    for r in rows:
        cells = [c.splitlines() or [""] for c in r]
        for i in range(max(len(c) for c in cells)):
            out.append("  ".join((c[i] if i < len(c) else "").ljust(w) for c, w in zip(cells, widths, strict=True)))
    return "\n".join(out)


def _short(ids: list[str]) -> str:
    return ",".join(i[:12] for i in ids)


def _seen_inside(started: StartedPod) -> str:
    """What each container printed about itself, a few lines per container."""
    lines = []
    for name, view in started.views.items():
        gpu_nodes = [d.removeprefix("/dev/") for d in view.devices if d[len("/dev/nvidia"):][:1].isdigit()
                     or d.startswith("/dev/nvidia-caps/")]
        lines.append(f"{name}: GPUs {_short(view.visible)}")
        lines.append(f"  /dev: {' '.join(gpu_nodes) or '-'}" + (f"  MPS pipe: {view.mps_dir}" if view.mps_dir else ""))
    return "\n".join(lines)


def _claim_results(kube: Kube, pod_obj: Obj) -> tuple[str, list[Obj]]:
    name = pod_claim_name(pod_obj)
    assert name, f"pod {pod_obj['metadata']['name']} has no resolved claim"
    results: list[Obj] = kube.get("ResourceClaim", name, NAMESPACE)["status"]["allocation"]["devices"]["results"]
    return pod_obj["spec"]["nodeName"], results


def _separator(results: list[Obj]) -> str:
    """Devices side by side, or one per line when their names would widen the table (MIG devices)."""
    return ",\n" if len(",".join(r["device"] for r in results)) > 30 else ","


def _device_cells(results: list[Obj]) -> str:
    return _separator(results).join(r["device"] for r in results)


def _memory_cells(node: str, results: list[Obj], memory_of: dict[tuple[str, str], int]) -> str:
    return _separator(results).join(
        f"{(consumed_memory(r) or memory_of.get((node, r['device']), 0)) / GiB:.1f}Gi" for r in results)


def _run_examples(cluster: Cluster, memory_of: dict[tuple[str, str], int]) -> tuple[list[list[str]], list[str]]:
    kube = cluster.kube
    real = bool(cluster.real_nodes)
    for name, _, spec, node, containers in EXAMPLES:
        kube.apply(claim_template(name, NAMESPACE, spec))
        if real:
            probe = probe_pod(name, NAMESPACE, node, templates={"gpu": name},
                              containers={c: ["gpu"] for c in containers})
            for c in probe["spec"]["containers"]:
                if isinstance(containers, dict):  # each container names its request, as NVIDIA's gpu-test4 does
                    c["resources"]["claims"][0]["request"] = containers[c["name"]]
            kube.apply(probe)
        else:
            kube.apply(pod(name, NAMESPACE, template=name, node=node))
    rows, failures = [], []
    for name, what, _, node, _ in EXAMPLES:
        try:
            if real:
                started = wait_reported(kube, cluster.real_nodes[node], NAMESPACE, name, timeout=90)
                on, results = _claim_results(kube, started.pod)
                rows.append([name, what, on, _device_cells(results),
                             _memory_cells(on, results, memory_of), _seen_inside(started)])
            else:
                running = wait_running(kube, NAMESPACE, name, timeout=90)
                rows.append([name, what, running.node, _device_cells(running.results),
                             _memory_cells(running.node, running.results, memory_of), "\n".join(running.cdi_ids)])
        except ClusterError as exc:
            failures.append(f"{name} ({what}): {exc}")
    return rows, failures


def up() -> int:
    if PIDS.exists() and any(pid_alive(p["pid"]) for p in json.loads(PIDS.read_text())["processes"]):
        print(f"a demo is already running (kubeconfig {DEMO_DIR / 'cluster' / 'kubeconfig'}); `make demo-down` first")
        return 1
    if DEMO_DIR.exists():
        shutil.rmtree(DEMO_DIR / "cluster", ignore_errors=True)
    DEMO_DIR.mkdir(exist_ok=True)
    nodes, fallback = demo_nodes()
    if fallback:
        print(f"NOTICE: no real node on this machine ({fallback});\n"
              "        the demo runs tessera behind the kubelet stand-in, and no container starts.")
    else:
        MACHINE_BEFORE.write_text(json.dumps(machine_snapshot()))
    started = time.monotonic()
    real = not fallback
    image = None
    if real:
        # Before the cluster: a failed build leaves nothing running; a cached one takes a second.
        image = build_image()
        _link_tools()
        print(f"image {image.reference} ready in {time.monotonic() - started:.0f}s ({image.archive})")
    cluster = Cluster(DEMO_DIR / "cluster", nodes, detached=True, with_controller=not real, device_classes=not real)
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
        "realNodes": [{"name": n.name, "holder": n.holder.pid, "cgroup": n.cgroup_name}
                      for n in cluster.real_nodes.values() if n.holder is not None],
        **({"network": {"holder": cluster.network.pid}} if cluster.network else {}),
        "cleanup": cleanup,
    }, indent=1))
    kind = "real kubelet v1.36.3 + containerd" if cluster.real_nodes else "kubelet stand-in"
    print(f"control plane and {len(nodes)} nodes ({kind}) up in {time.monotonic() - started:.0f}s")
    kube = cluster.kube
    if image is not None:
        try:
            install_into(cluster, image)
        except ClusterError as exc:
            print(f"demo: installing tessera with helm failed: {exc}\n{cluster.diagnostics(20)}\n"
                  "the cluster keeps running for a look; `make demo-down` stops it", file=sys.stderr)
            return 1
        print(f"tessera installed by its chart in {time.monotonic() - started:.0f}s: "
              f"helm {' '.join(install_args())}")
    else:
        controller = "on" if cluster.controller else "off: " + cluster.controller_skip_reason
        print(f"tessera started by hand (controller: {controller})")

    ensure_namespace(kube, NAMESPACE)
    memory_of = {}
    for node in nodes:
        wait_for(partial(slices_of, kube, node.name), timeout=30, what=f"slices of {node.name}")
        for s in slices_of(kube, node.name):
            for d in s["spec"].get("devices", []):
                if "memory" in d.get("capacity", {}):
                    memory_of[(node.name, d["name"])] = parse_quantity(d["capacity"]["memory"]["value"])
    rows, failures = _run_examples(cluster, memory_of)
    print()
    print(_table(rows, last="SEEN INSIDE THE CONTAINER" if cluster.real_nodes else "CDI IDS"))
    for f in failures:
        print(f"\nNOT RUNNING: {f}")
    elapsed = time.monotonic() - started
    if image is not None:
        pods = kubectl(cluster.kubeconfig, "get", "pods", "-n", CHART_NAMESPACE, "-o", "wide")
        print(f"\ntessera's own components are pods of the chart's DaemonSet and Deployment "
              f"(kubectl get pods -n {CHART_NAMESPACE} -o wide):\n{pods.stdout.rstrip() or pods.stderr.rstrip()}")
        print(f"\nThe demo keeps running ({elapsed:.0f}s to this table). To look around, as in the README's tour:")
        print(f"  export PATH={DEMO_DIR / 'bin'}:$PATH KUBECONFIG={cluster.kubeconfig}")
        print(f"  kubectl logs -n {NAMESPACE} whole-gpu            # what the container saw")
        print(f"  helm status {RELEASE} -n {CHART_NAMESPACE}")
        print("  kubectl get nodes -o wide; kubectl get resourceslices,resourceclaims -A")
    else:
        kubectl_bin = _kubectl_hint()
        print(f"\nThe demo keeps running ({elapsed:.0f}s to this table); kubeconfig: {cluster.kubeconfig}")
        print(f"  {kubectl_bin} --kubeconfig {cluster.kubeconfig} get nodes -o wide")
        print(f"  {kubectl_bin} --kubeconfig {cluster.kubeconfig} get resourceslices,resourceclaims -A")
    state_dirs = [n.state_dir for n in cluster.real_nodes.values()] + [a.state_dir for a in cluster.agents.values()]
    if state_dirs:
        print(f"  GPU health (docs/health.md): {sys.executable} -m tessera inject-health-event "
              f"--state-dir {state_dirs[0]} --gpu 0 --event xid --xid 79   (the node's GPU 0 falls off the bus; "
              "its pods are evicted; removing the state dir's health-events.jsonl clears it)")
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
