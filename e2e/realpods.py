"""Pods for real nodes whose containers print what they were given, and waits that read it back.

Every probe container runs a short busybox script: it prints the GPU-related environment, the
`/dev/nvidia*` device nodes and the MPS pipe directory it sees, between markers, then sleeps. The
e2e tests and the demo read that report from kubelet's pod log directory: it is the container's own
view, after kubelet handed the CDI ids to containerd and the runtime applied tessera's spec.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

from e2e.kube import Kube, Obj
from e2e.node.images import WORKLOAD_IMAGE
from e2e.node.realnode import RealNode
from e2e.processes import ClusterError, wait_for
from e2e.workloads import describe_pod

# e2e taints its real nodes with this so that stand-in scenarios' pods stay off them; probes tolerate it.
REAL_NODE_TAINT_KEY = "e2e.tessera.dev/real-node"
REAL_NODE_TAINT = f"{REAL_NODE_TAINT_KEY}=true:NoSchedule"
BEGIN, END = "=== tessera probe begin ===", "=== tessera probe end ==="
PROBE_SCRIPT = (
    f'echo "{BEGIN}"; '
    "env | grep -E '^(CUDA|NVIDIA|TESSERA)_' | sort | sed 's/^/env /'; "
    "for d in /dev/nvidia* /dev/nvidia-caps/*; do [ -c \"$d\" ] && echo \"dev $d\"; done; "
    "if [ -d /tmp/nvidia-mps ]; then echo \"mps-dir /tmp/nvidia-mps\"; "
    "for f in /tmp/nvidia-mps/*; do [ -e \"$f\" ] && echo \"mps-file $f\"; done; fi; "
    f'echo "{END}"; exec sleep 3600'
)


def probe_container(name: str, claims: list[str]) -> Obj:
    return {"name": name, "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never",
            "command": ["/bin/sh", "-c", PROBE_SCRIPT], "resources": {"claims": [{"name": c} for c in claims]}}


def probe_pod(name: str, namespace: str, node: str, *, templates: dict[str, str] | None = None,
              claims: dict[str, str] | None = None, containers: dict[str, list[str]] | None = None) -> Obj:
    """A pod pinned to `node` whose containers report their devices.

    `templates` / `claims` map pod-claim names to ResourceClaimTemplates / ResourceClaims;
    `containers` maps container names to the pod claims each uses (default: one container, all).
    """
    pod_claims: list[Obj] = [{"name": n, "resourceClaimTemplateName": t} for n, t in (templates or {}).items()]
    pod_claims += [{"name": n, "resourceClaimName": c} for n, c in (claims or {}).items()]
    names = [pc["name"] for pc in pod_claims]
    spec: Obj = {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "containers": [probe_container(c, used) for c, used in (containers or {"probe": names}).items()],
        "resourceClaims": pod_claims, "terminationGracePeriodSeconds": 1, "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "tolerations": [{"key": REAL_NODE_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


@dataclass
class ContainerView:
    """What one container printed about itself."""

    env: dict[str, str] = field(default_factory=dict)
    devices: list[str] = field(default_factory=list)
    mps_dir: str = ""
    mps_files: list[str] = field(default_factory=list)

    @property
    def visible(self) -> list[str]:
        """The GPU and MIG UUIDs tessera's specs gave the container: the TESSERA_DEVICES_<claim>_<request>
        lists (one per claim and request; the device nodes are what makes them visible to CUDA)."""
        out: list[str] = []
        for key in sorted(self.env):
            if key.startswith("TESSERA_DEVICES_") and self.env[key]:
                out += [v for v in self.env[key].split(",") if v not in out]
        if not out and self.env.get("CUDA_VISIBLE_DEVICES"):  # a spec an older build wrote (rollback tests)
            out = self.env["CUDA_VISIBLE_DEVICES"].split(",")
        return out


def parse_report(log: str) -> ContainerView | None:
    if END not in log:
        return None
    view = ContainerView()
    body = log.split(BEGIN, 1)[-1].split(END, 1)[0]
    for line in body.splitlines():
        kind, _, rest = line.strip().partition(" ")
        if kind == "env":
            key, _, value = rest.partition("=")
            view.env[key] = value
        elif kind == "dev":
            view.devices.append(rest)
        elif kind == "mps-dir":
            view.mps_dir = rest
        elif kind == "mps-file":
            view.mps_files.append(rest)
    return view


@dataclass(frozen=True)
class StartedPod:
    pod: Obj
    views: dict[str, ContainerView]

    @property
    def uid(self) -> str:
        uid: str = self.pod["metadata"]["uid"]
        return uid


def wait_reported(kube: Kube, node: RealNode, namespace: str, name: str, timeout: float = 90.0) -> StartedPod:
    """Wait until the pod runs on `node` and every container has printed its report."""

    def reported() -> StartedPod | None:
        node.logs()[0].check_alive()
        p = kube.get("Pod", name, namespace)
        if p.get("status", {}).get("phase") != "Running":
            return None
        views = {}
        for c in p["spec"]["containers"]:
            view = parse_report(node.container_log(namespace, name, c["name"]))
            if view is None:
                return None
            views[c["name"]] = view
        return StartedPod(p, views)

    try:
        return wait_for(reported, timeout=timeout, interval=0.3, what=f"pod {namespace}/{name} to run and report")
    except ClusterError as exc:
        raise ClusterError(f"{exc}\n{describe_pod(kube, namespace, name)}") from None


def cdi_specs(node: RealNode, claim_uid: str) -> list[Path]:
    """The claim's CDI spec files on the node (a writer's dot-named temp file is not a spec)."""
    return sorted(p for p in node.cdi_dir.iterdir() if claim_uid in p.name and not p.name.startswith("."))


def mps_daemons(node: RealNode) -> dict[str, Obj]:
    """The MPS daemons the node's plugin recorded, by claim uid (SimulatedMpsControl's registry)."""
    path = node.state_dir / "fake-mps.json"
    data: dict[str, Obj] = json.loads(path.read_text()) if path.exists() else {}
    return data


KEEP = 3  # the first pods run through the whole upgrade; later ones are deleted again (short claims)


class PodLoop:
    """Creates pods one after another on `node`, each waited for until it runs and reports its devices
    (claims from the namespace's ResourceClaimTemplate `share`): the load of an upgrade test."""

    def __init__(self, kube: Kube, node: RealNode, namespace: str) -> None:
        self.kube, self.node, self.namespace = kube, node, namespace
        self.created: list[str] = []
        self.running: list[str] = []
        self.visible: dict[str, list[str]] = {}  # pod -> the GPUs its container saw
        self.deleted: list[str] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="pod-loop", daemon=True)

    def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            name = f"p{i:03d}"
            try:
                self.kube.create(probe_pod(name, self.namespace, self.node.name, templates={"gpu": "share"}))
                self.created.append(name)
                started = wait_reported(self.kube, self.node, self.namespace, name, timeout=60)
            except Exception as exc:
                self.errors.append(f"{name}: {exc}")
                return
            self.visible[name] = started.views["probe"].visible
            self.running.append(name)
            if i - 2 >= KEEP:  # the pod before last goes away: its claim is unprepared meanwhile
                old = f"p{i - 2:03d}"
                self.kube.delete("Pod", old, self.namespace)
                self.deleted.append(old)
            i += 1

    def wait_running(self, count: int, what: str) -> None:
        wait_for(lambda: len(self.running) >= count or bool(self.errors), timeout=180, what=what)
        assert not self.errors, self.errors


def failed_prepares(kube: Kube, namespace: str) -> list[str]:
    """Every FailedPrepareDynamicResources-like event in the namespace: what a user would see go wrong."""
    return [f"{e['involvedObject'].get('name')}: {e.get('reason')}: {e.get('message')}"
            for e in kube.list("Event", namespace) if "Prepare" in e.get("reason", "")]
