"""The scale benchmark's cluster: e2e's control plane, kwok's fake nodes, tessera's publishers and controller.

Everything is a child process (e2e.processes.ManagedProcess) stopped by `ScaleCluster.stop`, which the
benchmark calls in a `finally`, so a failed run leaves nothing behind either.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.controlplane import TunedControlPlane
from benchmarks.scale.nodemix import KWOK_SELECTOR, NodePlan, kwok_node, split
from e2e.cluster import Controller, harness_path
from e2e.kube import Kube, KubeError, load_manifests
from e2e.processes import REPO, ClusterError, ManagedProcess, free_port, wait_for

PLUGIN_NS = "tessera"
PLUGIN_SA = "tessera-kubelet-plugin"
Obj = dict[str, Any]
# The Go components whose GC cycles the admission report places beside its slow round trips.
GC_TRACED = ("etcd", "apiserver")


def kwok_paths() -> tuple[Path, Path]:
    """kwok and its stages.yaml, built (cached by content hash) by build-kwok.sh."""
    proc = subprocess.run(["bash", str(REPO / "benchmarks/scale/build-kwok.sh"), "--print-path"],
                          stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise ClusterError(f"building kwok failed (rc={proc.returncode}); see the output above")
    binary = Path(proc.stdout.strip())
    return binary, binary.parent / "stages.yaml"


def mem_available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024 / 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable")


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MiB: now and its peak."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def plugin_flow_objects(queue_length: int = 1000) -> list[Obj]:
    """A priority level of their own for tessera's node agents, and the FlowSchema that sends them there.

    Every node's agent runs as the same service account, so API Priority and Fairness sees 1,000 nodes as
    one flow of the workload-low level, queued in a handful of queues of 50: a rollout storm overflows
    them (429). Here the agents get their own seats, and a queue long enough to hold a whole fleet's burst,
    so a request waits for its turn instead of being refused.
    """
    return [
        {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
         "metadata": {"name": PLUGIN_SA},
         "spec": {"type": "Limited", "limited": {
             "nominalConcurrencyShares": 40,
             "limitResponse": {"type": "Queue", "queuing": {"queues": 16, "handSize": 4,
                                                             "queueLengthLimit": queue_length}}}}},
        {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema", "metadata": {"name": PLUGIN_SA},
         "spec": {"priorityLevelConfiguration": {"name": PLUGIN_SA}, "matchingPrecedence": 500,
                  "distinguisherMethod": {"type": "ByUser"},
                  "rules": [{"subjects": [{"kind": "ServiceAccount",
                                           "serviceAccount": {"name": PLUGIN_SA, "namespace": PLUGIN_NS}}],
                             "resourceRules": [{"verbs": ["*"], "apiGroups": ["resource.k8s.io", ""],
                                                "resources": ["resourceslices", "nodes", "resourceclaims"],
                                                "clusterScope": True, "namespaces": ["*"]}]}]}},
    ]


class MemoryGuard(RuntimeError):
    """The machine ran low on memory; the message says at what point and how much was left."""


@dataclass
class ScaleCluster:
    work_dir: Path
    nodes: list[NodePlan]
    fleet_processes: int = 2
    client_qps: int = 5000
    min_free_gib: float = 2.0
    plane: TunedControlPlane | None = None
    kwok: ManagedProcess | None = None
    fleets: list[ManagedProcess] = field(default_factory=list)
    controller: Controller | None = None
    plugin_kubeconfig: Path | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def kube(self) -> Kube:
        assert self.plane is not None and self.plane.kube is not None, "control plane not started"
        return self.plane.kube

    # -- set-up -----------------------------------------------------------------------------------

    def start_control_plane(self) -> None:
        self.plane = TunedControlPlane(self.work_dir, harness_path(), client_qps=self.client_qps,
                                       gc_trace=GC_TRACED)
        kube = self.plane.start()
        for obj in load_manifests(REPO / "deviceclasses"):
            if obj.get("kind") == "DeviceClass":
                kube.apply(obj)
        self.plugin_kubeconfig = self._plugin_identity()

    def add_plugin_flow(self) -> None:
        """The node agents' own API Priority and Fairness level (plugin_flow_objects)."""
        for obj in plugin_flow_objects():
            self.kube.request("POST", f"/apis/flowcontrol.apiserver.k8s.io/v1/{obj['kind'].lower()}s", obj)

    def _plugin_identity(self) -> Path:
        """A kubeconfig for the publishers with a service account token, as the chart's DaemonSet has.

        Not the admin token: system:masters is exempt from API Priority and Fairness, so publishers using
        it could never be throttled, which is what the rollout storm is about.
        """
        kube = self.kube
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PLUGIN_NS}})
        kube.request("POST", f"/api/v1/namespaces/{PLUGIN_NS}/serviceaccounts", {
            "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": PLUGIN_SA, "namespace": PLUGIN_NS}})
        # The chart's rules for the node agent (helm/tessera/templates/kubelet-plugin-rbac.yaml), in short.
        kube.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": PLUGIN_SA},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
                      {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
                      {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
                       "verbs": ["list", "watch", "create", "update", "delete"]}]})
        kube.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": PLUGIN_SA},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": PLUGIN_SA},
            "subjects": [{"kind": "ServiceAccount", "name": PLUGIN_SA, "namespace": PLUGIN_NS}]})
        token = kube.request("POST", f"/api/v1/namespaces/{PLUGIN_NS}/serviceaccounts/{PLUGIN_SA}/token", {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": 86400}})["status"]["token"]
        assert self.plane is not None
        path = self.work_dir / "plugin-kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "plugin",
            "clusters": [{"name": "scale", "cluster": {
                "server": self.plane.server,
                "certificate-authority-data": base64.b64encode(self.plane.pki.ca_pem).decode()}}],
            "users": [{"name": "plugin", "user": {"token": token}}],
            "contexts": [{"name": "plugin", "context": {"cluster": "scale", "user": "plugin"}}],
        }))
        path.chmod(0o600)
        return path

    def start_nodes(self, timeout: float = 600.0) -> None:
        """The Node objects, then kwok, which makes them Ready and keeps their leases and heartbeats."""
        kube = self.kube
        t0 = time.perf_counter()

        def create(plan: NodePlan) -> None:
            try:
                kube.create(kwok_node(plan.name))
            except KubeError as exc:
                if exc.status != 409:
                    raise

        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(create, self.nodes))
        binary, stages = kwok_paths()
        assert self.plane is not None
        self.kwok = ManagedProcess("kwok", [
            str(binary), f"--kubeconfig={self.plane.kubeconfig}", f"--config={stages}",
            f"--manage-nodes-with-annotation-selector={KWOK_SELECTOR}",
            "--node-lease-duration-seconds=40", f"--server-address=127.0.0.1:{free_port()}",
            "--cidr=10.128.0.0/12", "--node-ip=127.0.0.1",
        ], self.work_dir / "logs" / "kwok.log").start()
        kwok = self.kwok
        wait_for(lambda: kwok.alive_and(lambda: self.ready_nodes() >= len(self.nodes)), timeout=timeout, interval=2.0,
                 what=f"kwok to make {len(self.nodes)} nodes Ready (log {kwok.log_path})")
        self.timings["nodes ready s"] = time.perf_counter() - t0

    def ready_nodes(self) -> int:
        listing = self.kube.request("GET", "/api/v1/nodes", params={"labelSelector": "type=kwok"})
        return sum(any(c.get("type") == "Ready" and c.get("status") == "True"
                       for c in (n.get("status") or {}).get("conditions") or []) for n in listing["items"])

    def start_fleet(self, timeout: float = 1800.0) -> None:
        """The publishers, split over `fleet_processes` processes; waits until every node's slices are in."""
        assert self.plugin_kubeconfig is not None
        for i, part in enumerate(split(self.nodes, self.fleet_processes)):
            base = self.work_dir / f"fleet-{i}"
            base.mkdir(parents=True, exist_ok=True)
            (base / "nodes.json").write_text(json.dumps([p.__dict__ for p in part]))
            (base / "commands").write_text("")
            self.fleets.append(ManagedProcess(f"fleet-{i}", [
                sys.executable, "-m", "benchmarks.scale.fleet",
                f"--kubeconfig={self.plugin_kubeconfig}", f"--nodes={base / 'nodes.json'}",
                f"--events={base / 'events.jsonl'}", f"--commands={base / 'commands'}",
            ], base / "fleet.log").start())
        self.wait_round(1, timeout)

    def events(self) -> list[Obj]:
        out: list[Obj] = []
        for i in range(len(self.fleets)):
            path = self.work_dir / f"fleet-{i}" / "events.jsonl"
            if path.exists():
                out.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
        return out

    def check(self, what: str, synced: int) -> None:
        for proc in self.fleets:
            proc.check_alive()
        free = mem_available_gib()
        if free < self.min_free_gib:
            raise MemoryGuard(f"MemAvailable fell to {free:.1f} GiB (floor {self.min_free_gib} GiB) while {what}, "
                              f"with {synced} of {len(self.nodes)} nodes' slices published")

    def wait_round(self, round_no: int, timeout: float) -> list[Obj]:
        """Every fleet's `round-done` of `round_no`; its events (round-start, synced, round-done)."""
        deadline = time.monotonic() + timeout
        while True:
            events = [e for e in self.events() if e.get("round") == round_no]
            if sum(e["event"] == "round-done" for e in events) == len(self.fleets):
                return events
            self.check(f"round {round_no} of publishing", sum(e["event"] == "synced" for e in events))
            if time.monotonic() > deadline:
                raise ClusterError(f"round {round_no}: not every node's slices published after {timeout:.0f} s")
            time.sleep(1.0)

    def command_fleet(self, command: str) -> None:
        for i in range(len(self.fleets)):
            with (self.work_dir / f"fleet-{i}" / "commands").open("a") as f:
                f.write(command + "\n")

    def wait_built(self, count: int, timeout: float = 900.0) -> None:
        deadline = time.monotonic() + timeout
        while sum(e["event"] == "built" for e in self.events()) < count * len(self.fleets):
            self.check("building the restarted publishers", len(self.nodes))
            if time.monotonic() > deadline:
                raise ClusterError(f"the fleet did not build its new publishers within {timeout:.0f} s")
            time.sleep(1.0)

    def start_controller(self) -> Controller:
        assert self.plane is not None
        self.controller = Controller(self.work_dir / "controller", self.plane.kubeconfig, self.plane.pki)
        self.controller.start(self.kube, timeout=300.0)
        return self.controller

    def controller_ready(self) -> bool:
        assert self.controller is not None and self.plane is not None
        ctx = ssl.create_default_context(cadata=self.plane.pki.ca_pem.decode())
        ctx.check_hostname = False
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{self.controller.port}/readyz", context=ctx,
                                        timeout=5) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def controller_metrics_text(self) -> str:
        """The controller's own /metrics (plain HTTP on the loopback)."""
        assert self.controller is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{self.controller.metrics_port}/metrics", timeout=10) as resp:
            return str(resp.read().decode())

    def metrics_text(self) -> str:
        """The apiserver's /metrics (the admin token may read it)."""
        assert self.plane is not None
        req = urllib.request.Request(self.plane.server + "/metrics",
                                     headers={"Authorization": f"Bearer {self.kube.token}"})
        ctx = ssl.create_default_context(cadata=self.plane.pki.ca_pem.decode())
        with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
            return str(resp.read().decode())

    def running(self) -> list[ManagedProcess]:
        """Every process of the benchmark cluster still alive: control plane, kwok, publishers, controller."""
        procs = list(self.plane.processes.values()) if self.plane else []
        procs += [p for p in (self.kwok,) if p is not None] + self.fleets
        if self.controller and self.controller.process:
            procs.append(self.controller.process)
        return [p for p in procs if p.alive()]

    def pids(self) -> dict[str, int]:
        """Each running process's pid by its name (what benchmarks.scale.cpusample samples)."""
        return {p.name: p.pid for p in self.running()}

    # -- tear-down --------------------------------------------------------------------------------

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()
        for proc in self.fleets:
            proc.stop(timeout=30.0)
        if self.kwok is not None:
            self.kwok.stop()
        if self.plane is not None:
            self.plane.stop()
