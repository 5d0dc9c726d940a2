"""A real Kubernetes control plane plus tessera node agents, as local processes.

Used by the e2e pytest suite (one cluster per session) and by `make demo`. Every component is a
separate process of the Go harness (e2e/harness, built from Kubernetes' own modules) or of tessera
itself, with its output in a log file under the cluster's work dir. Nodes are fake Node objects;
the harness's `kubelet` role stands in for kubelet's DRA side on each of them.

Nothing here imports tessera's packages: the e2e tier talks to tessera only through its CLI, the
apiserver and the kubelet gRPC API, as a cluster would.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from e2e.kube import ADMIN_TOKEN, Kube, Obj, load_manifests
from e2e.network import (
    APISERVER_PORT,
    HUB_ADDRESS,
    KUBERNETES_SERVICE_IP,
    SERVICE_RANGE,
    PrivateNetwork,
    connect_in,
)
from e2e.node.realnode import RealNode, clean_stale_nodes, node_binaries, private_network_unavailable
from e2e.pki import Pki, write_service_account_key
from e2e.processes import REPO, ClusterError, ManagedProcess, free_port, wait_for

DRIVER = "gpu.tessera.dev"
PREPARED_ANNOTATION = "e2e.tessera.dev/prepared-devices"


# ---------------------------------------------------------------------------------------------
# the harness binary


def harness_path() -> Path:
    """The harness binary: $TESSERA_HARNESS, or build it (cached by content hash) with build.sh."""
    env = os.environ.get("TESSERA_HARNESS")
    if env:
        path = Path(env)
        if not os.access(path, os.X_OK):
            raise ClusterError(f"TESSERA_HARNESS={env} is not an executable file")
        return path
    proc = subprocess.run(["bash", str(REPO / "e2e/harness/build.sh"), "--print-path"],
                          stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise ClusterError(f"building the e2e harness failed (rc={proc.returncode}); see the output above")
    return Path(proc.stdout.strip())


# ---------------------------------------------------------------------------------------------
# control plane


@dataclass
class ControlPlane:
    """etcd, kube-apiserver, kube-scheduler and kube-controller-manager (its usual controllers).

    With a private network (root), they run in its hub namespace and the machine reaches the
    apiserver through a forwarder on 127.0.0.1 (e2e/network.py); without one, all of them listen on
    the machine's 127.0.0.1.
    """

    work_dir: Path
    harness: Path
    older_cluster: bool = False
    network: PrivateNetwork | None = None
    processes: dict[str, ManagedProcess] = field(default_factory=dict)
    pki: Pki = field(default_factory=Pki.create)
    apiserver_port: int = 0
    kube: Kube | None = None
    # An AdmissionConfiguration for kube-apiserver (e.g. a client certificate it presents to webhooks).
    admission_control_config: Path | None = None

    @property
    def kubeconfig(self) -> Path:
        """For clients on the machine: the forwarder's (or the apiserver's own) port on 127.0.0.1."""
        return self.work_dir / "kubeconfig"

    @property
    def internal_kubeconfig(self) -> Path:
        """For processes inside the private network (nodes, the control plane): the apiserver's own address."""
        return self.work_dir / "kubeconfig-internal" if self.network else self.kubeconfig

    @property
    def ca_file(self) -> Path:
        return self.work_dir / "pki" / "ca.crt"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    def enter(self) -> list[str]:
        """The argv prefix for a process that belongs with the control plane (its network namespace)."""
        return self.network.enter() if self.network else []

    def _start(self, name: str, argv: list[str], scratch: list[Path] | None = None,
               env: dict[str, str] | None = None) -> ManagedProcess:
        proc = ManagedProcess(name, [*self.enter(), *argv], self.work_dir / "logs" / f"{name}.log",
                              env=env, scratch=scratch or []).start()
        self.processes[name] = proc
        return proc

    def start(self, *, timeout: float = 180.0) -> Kube:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        pki_dir = self.work_dir / "pki"
        pki_dir.mkdir(exist_ok=True)
        self.ca_file.write_bytes(self.pki.ca_pem)
        cert, key = self.pki.issue_server(
            "kube-apiserver", pki_dir, ips=(HUB_ADDRESS, KUBERNETES_SERVICE_IP),
            names=("kubernetes", "kubernetes.default", "kubernetes.default.svc",
                   "kubernetes.default.svc.cluster.local"))
        # What the apiserver shows kubelets (logs, exec, port-forward); kubelets trust only this CA.
        kubelet_cert, kubelet_key = self.pki.issue_client("kube-apiserver-kubelet-client", ("system:masters",), pki_dir)
        sa_key = pki_dir / "sa.key"
        write_service_account_key(sa_key)
        tokens = pki_dir / "tokens.csv"
        tokens.write_text(f'{ADMIN_TOKEN},admin,admin,"system:masters"\n')

        # etcd's data is throw-away; tmpfs keeps its latency off the (shared) disk.
        shm = Path("/dev/shm")
        etcd_base = shm if shm.is_dir() and os.access(shm, os.W_OK) else self.work_dir
        etcd_dir = etcd_base / f"tessera-etcd-{os.getpid()}-{free_port()}"
        self._etcd_dir = etcd_dir
        etcd_port, peer_port = free_port(), free_port()
        etcd = self._start("etcd", [str(self.harness), "etcd", f"--data-dir={etcd_dir}",
                                    f"--listen-client-url=http://127.0.0.1:{etcd_port}",
                                    f"--listen-peer-url=http://127.0.0.1:{peer_port}"], scratch=[etcd_dir])
        wait_for(lambda: etcd.alive_and(lambda: "ready on" in etcd.log_path.read_text()),
                 timeout=60, what=f"etcd to be ready (log {etcd.log_path})")

        older = ["--older-cluster"] if self.older_cluster else []
        if self.network:
            # In the hub, on the kubernetes Service's port: pods reach it at 10.0.0.1:443 (e2e/network.py).
            listen = ["--bind-address=0.0.0.0", f"--secure-port={APISERVER_PORT}", f"--advertise-address={HUB_ADDRESS}"]
        else:
            self.apiserver_port = free_port()
            listen = ["--bind-address=127.0.0.1", f"--secure-port={self.apiserver_port}",
                      "--advertise-address=127.0.0.1",
                      # The Endpoints of `kubernetes` may not hold a loopback address.
                      "--endpoint-reconciler-type=none"]
        apiserver = self._start("apiserver", [
            str(self.harness), "apiserver",
            f"--etcd-servers=http://127.0.0.1:{etcd_port}", *listen,
            f"--tls-cert-file={cert}", f"--tls-private-key-file={key}",
            f"--cert-dir={pki_dir / 'generated'}",
            f"--client-ca-file={self.ca_file}",
            f"--kubelet-client-certificate={kubelet_cert}", f"--kubelet-client-key={kubelet_key}",
            # A node's InternalIP, never its name: names would be looked up in the machine's DNS.
            "--kubelet-preferred-address-types=InternalIP",
            # Webhook Services are called at their endpoints' pod addresses: there is no kube-proxy.
            "--enable-aggregator-routing=true",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={sa_key}", f"--service-account-signing-key-file={sa_key}",
            f"--service-cluster-ip-range={SERVICE_RANGE}",
            f"--token-auth-file={tokens}", "--authorization-mode=RBAC",
            "--allow-privileged=true", "--profiling=false", "-v=1", *older,
            *([f"--admission-control-config-file={self.admission_control_config}"]
              if self.admission_control_config else []),
        ])
        if self.network:
            forwarder, self.apiserver_port = self.network.forward(
                "apiserver-forward", self.harness, f"127.0.0.1:{APISERVER_PORT}", self.work_dir / "logs")
            self.processes["apiserver-forward"] = forwarder
        kube = Kube(self.server, self.ca_file)

        def ready() -> bool:
            apiserver.check_alive()
            return kube.healthy("/readyz")

        wait_for(ready, timeout=timeout, interval=0.5, what=f"kube-apiserver /readyz (log {apiserver.log_path})")
        self._write_kubeconfig(self.kubeconfig, self.server)
        if self.network:
            self._write_kubeconfig(self.internal_kubeconfig, f"https://{HUB_ADDRESS}:{APISERVER_PORT}")
        self.kube = kube

        sched_config = self.work_dir / "scheduler.yaml"
        # Short backoff: pods that were unschedulable get retried quickly once slices or claims change.
        sched_config.write_text(yaml.safe_dump({
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(self.internal_kubeconfig)},
            "leaderElection": {"leaderElect": False},
            "podInitialBackoffSeconds": 1, "podMaxBackoffSeconds": 2,
        }))
        self._start("scheduler", [str(self.harness), "scheduler", f"--config={sched_config}",
                                  "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "-v=2", *older])
        self._start("controller-manager", [
            str(self.harness), "controller-manager", f"--kubeconfig={self.internal_kubeconfig}",
            # The usual set, as a cluster runs it: namespaces delete, Deployments, Jobs, DaemonSets and
            # StatefulSets get their pods, ServiceAccounts and kube-root-ca.crt appear in every
            # namespace, Services get EndpointSlices, nodes whose kubelet stops renewing its Lease
            # are tainted. The DRA ones are named so that a release which stops enabling them by
            # default still runs them: claims from templates and their garbage collection, and
            # eviction from GPUs with a NoExecute taint (docs/health.md).
            "--controllers=*,resourceclaim-controller,device-taint-eviction-controller",
            f"--root-ca-file={self.ca_file}", f"--service-account-private-key-file={sa_key}",
            "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "-v=2", *older,
        ])
        wait_for(lambda: kube.get_or_none("Namespace", "default"), timeout=60, what="the default namespace")
        kcm_log = self.processes["controller-manager"].log_path
        wait_for(lambda: kube.get_or_none("ServiceAccount", "default", "default"), timeout=60,
                 what=f"the default ServiceAccount (controller-manager log {kcm_log})")
        return kube

    def _write_kubeconfig(self, path: Path, server: str) -> None:
        import base64

        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "tessera-e2e",
            "clusters": [{"name": "tessera-e2e", "cluster": {
                "server": server,
                "certificate-authority-data": base64.b64encode(self.pki.ca_pem).decode()}}],
            "users": [{"name": "admin", "user": {"token": ADMIN_TOKEN}}],
            "contexts": [{"name": "tessera-e2e", "context": {"cluster": "tessera-e2e", "user": "admin"}}],
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)

    def check_alive(self) -> None:
        for proc in self.processes.values():
            proc.check_alive()

    def stop(self) -> None:
        for name in ("controller-manager", "scheduler", "apiserver-forward", "apiserver", "etcd"):
            if name in self.processes:
                self.processes[name].stop()  # etcd's stop removes its data dir


# ---------------------------------------------------------------------------------------------
# fake nodes with tessera's node agent


def create_fake_node(kube: Kube, name: str) -> Obj:
    """A Node that the scheduler considers Ready and untainted; no kubelet will ever update it."""
    kube.apply({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                               "kubernetes.io/arch": "amd64", "e2e.tessera.dev/fake": "true"}},
        "spec": {"taints": []},
    })
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti"}
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return kube.patch_status("Node", name, {"status": {
        "capacity": resources, "allocatable": resources, "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake node",
                        "lastHeartbeatTime": now, "lastTransitionTime": now}],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
    }})


# The short kubelet directories made under /tmp (NodeAgent.kubelet_dir): the session's work dir only holds
# links to them, so removing it would leave them behind.
SHORT_DIRS: list[Path] = []


def remove_short_dirs() -> None:
    while SHORT_DIRS:
        shutil.rmtree(SHORT_DIRS.pop(), ignore_errors=True)


@dataclass
class NodeAgent:
    """One fake node: the harness's kubelet stand-in and `tessera kubelet-plugin` for it."""

    name: str
    profile: str
    work_dir: Path
    harness: Path
    kubeconfig: Path
    mig_strategy: str = "static"
    kubelet: ManagedProcess | None = None
    plugin: ManagedProcess | None = None
    metrics_port: int = 0

    @property
    def kubelet_dir(self) -> Path:
        """`<work dir>/kubelet`, or a short directory under /tmp linked there when the plugin's socket
        paths would not fit the 108-byte limit of unix socket addresses (deep checkouts)."""
        path = self.work_dir / "kubelet"
        if path.is_symlink():
            return path.resolve()
        if len(str(path / "plugins_registry" / "gpu.tessera.dev-reg.sock")) <= 100 or path.exists():
            return path
        short = Path(tempfile.mkdtemp(prefix="tessera-kubelet-", dir="/tmp"))
        SHORT_DIRS.append(short)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(short)
        return path.resolve()

    @property
    def registry_dir(self) -> Path:
        return self.kubelet_dir / "plugins_registry"

    @property
    def cdi_dir(self) -> Path:
        return self.work_dir / "cdi"

    @property
    def state_dir(self) -> Path:
        return self.work_dir / "state"

    @property
    def results(self) -> Path:
        return self.work_dir / "kubelet-events.jsonl"

    def events(self, kind: str | None = None) -> list[Obj]:
        """The kubelet stand-in's records (registrations, prepares, unprepares), oldest first."""
        try:
            lines = self.results.read_text().splitlines()
        except FileNotFoundError:
            return []
        out = [json.loads(line) for line in lines if line.strip()]
        return [e for e in out if kind is None or e["event"] == kind]

    def start_kubelet(self, *, timeout: float = 30.0) -> None:
        """Start (or restart) the kubelet stand-in; like kubelet it wipes the node's slices first."""
        for d in (self.registry_dir, self.cdi_dir, self.state_dir):
            d.mkdir(parents=True, exist_ok=True)
        starts = len(self.events("started"))
        self.kubelet = ManagedProcess(f"kubelet-{self.name}", [
            str(self.harness), "kubelet", f"--kubeconfig={self.kubeconfig}", f"--node-name={self.name}",
            f"--registry-dir={self.registry_dir}", f"--results={self.results}",
        ], self.work_dir / "kubelet.log").start()
        kubelet = self.kubelet
        wait_for(lambda: kubelet.alive_and(lambda: len(self.events("started")) > starts),
                 timeout=timeout, what=f"kubelet stand-in of {self.name} to start")

    def plugin_argv(self) -> list[str]:
        return [
            sys.executable, "-m", "tessera", "--log-format=json", "kubelet-plugin",
            f"--node-name={self.name}", f"--simulate={self.profile}", f"--kubeconfig={self.kubeconfig}",
            f"--kubelet-dir={self.kubelet_dir}", f"--cdi-dir={self.cdi_dir}", f"--state-dir={self.state_dir}",
            f"--mig-strategy={self.mig_strategy}", f"--metrics-addr=127.0.0.1:{self.metrics_port}",
        ]

    def start_plugin(self, *, timeout: float = 60.0) -> None:
        """Start (or restart) tessera's plugin and wait until the kubelet stand-in registered it."""
        if not self.metrics_port:
            self.metrics_port = free_port()
        registered = len(self.events("registered"))
        self.plugin = ManagedProcess(f"plugin-{self.name}", self.plugin_argv(), self.work_dir / "plugin.log").start()
        plugin = self.plugin
        wait_for(lambda: plugin.alive_and(lambda: len(self.events("registered")) > registered),
                 timeout=timeout, what=f"tessera kubelet-plugin on {self.name} to register with the kubelet stand-in")

    def stop(self) -> None:
        for proc in (self.plugin, self.kubelet):
            if proc is not None:
                proc.stop()

    def logs(self) -> list[ManagedProcess]:
        return [p for p in (self.kubelet, self.plugin) if p is not None]


@dataclass
class Controller:
    """`tessera controller` started by hand beside the apiserver (in its network namespace, if it has
    one), serving the admission webhooks at a URL on 127.0.0.1. The chart's Deployment replaces it
    where a test does not need to start the controller itself."""

    work_dir: Path
    kubeconfig: Path
    pki: Pki
    # The control plane's argv prefix and network namespace holder (None: the machine's own network).
    enter: list[str] = field(default_factory=list)
    netns_pid: int | None = None
    port: int = 0
    metrics_port: int = 0  # its Prometheus /metrics (plain HTTP)
    process: ManagedProcess | None = None

    def start(self, kube: Kube, *, timeout: float = 60.0) -> None:
        cert, key = self.pki.issue_server("tessera-controller", self.work_dir / "pki")
        self.port = free_port()
        self.metrics_port = free_port()
        self.process = ManagedProcess("controller", [
            *self.enter, sys.executable, "-m", "tessera", "--log-format=json", "controller",
            f"--kubeconfig={self.kubeconfig}", f"--tls-cert={cert}", f"--tls-key={key}",
            f"--listen=127.0.0.1:{self.port}", f"--metrics-addr=127.0.0.1:{self.metrics_port}",
        ], self.work_dir / "logs" / "controller.log").start()
        proc = self.process
        ctx = ssl.create_default_context(cafile=None)
        ctx.load_verify_locations(cadata=self.pki.ca_pem.decode())

        def listening() -> bool:
            proc.check_alive()
            with connect_in(self.netns_pid, ("127.0.0.1", self.port), timeout=2) as sock, \
                    ctx.wrap_socket(sock, server_hostname="localhost"):
                return True

        wait_for(listening, timeout=timeout, what=f"tessera controller to serve TLS (log {proc.log_path})")
        import base64

        ca_bundle = base64.b64encode(self.pki.ca_pem).decode()

        def hook(name: str, path: str, resources: list[str], operations: list[str]) -> Obj:
            return {
                "name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
                "timeoutSeconds": 10,
                "clientConfig": {"url": f"https://127.0.0.1:{self.port}{path}", "caBundle": ca_bundle},
                "rules": [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": operations,
                           "resources": resources, "scope": "*"}],
            }

        kube.apply({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                    "metadata": {"name": "tessera"}, "webhooks": [
                        hook("deviceclasses.gpu.tessera.dev", "/validate-deviceclass", ["deviceclasses"],
                             ["CREATE", "UPDATE"]),
                        hook("resourceclaims.gpu.tessera.dev", "/validate-resourceclaim",
                             ["resourceclaims", "resourceclaimtemplates"], ["CREATE", "UPDATE"]),
                    ]})
        kube.apply({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                    "metadata": {"name": "tessera"}, "webhooks": [
                        hook("mutate-resourceclaims.gpu.tessera.dev", "/mutate-resourceclaim",
                             ["resourceclaims", "resourceclaimtemplates"], ["CREATE"]),
                    ]})

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


@functools.cache
def controller_available() -> str:
    """Empty when `tessera controller` is implemented, else why not (the webhook scenarios skip)."""
    proc = subprocess.run([sys.executable, "-m", "tessera", "controller", "--help"], capture_output=True,
                          text=True, cwd=REPO, check=False, timeout=60)
    if proc.returncode != 0 or "--tls-cert" not in proc.stdout:
        return "tessera controller is not implemented yet (`tessera controller --help` has no --tls-cert)"
    return ""


@functools.cache
def plugin_available() -> str:
    """Empty when `tessera kubelet-plugin` is implemented, else why not."""
    proc = subprocess.run([sys.executable, "-m", "tessera", "kubelet-plugin", "--help"], capture_output=True,
                          text=True, cwd=REPO, check=False, timeout=60)
    if proc.returncode != 0 or "--kubelet-dir" not in proc.stdout:
        return "tessera kubelet-plugin is not implemented yet (`tessera kubelet-plugin --help` has no --kubelet-dir)"
    return ""


# ---------------------------------------------------------------------------------------------
# the whole thing


@dataclass(frozen=True)
class NodeSpec:
    name: str
    profile: str
    mig_strategy: str = "static"
    # A real kubelet + containerd node (e2e/node) instead of a fake Node with the kubelet stand-in.
    real: bool = False
    # Node taints kubelet registers the node with (`key=value:Effect`), e.g. to keep other pods off it.
    taints: tuple[str, ...] = ()
    # Node labels kubelet registers the node with (`key=value`), e.g. the one the chart maps to a profile.
    labels: tuple[str, ...] = ()
    # A real node's plugin: started by hand (tests that crash, restart or replace it at a fault point),
    # or left to the chart's DaemonSet (False).
    plugin_by_hand: bool = True


DEFAULT_CLASS: Obj = {
    "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": DRIVER},
    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
}


@dataclass
class Cluster:
    work_dir: Path
    nodes: list[NodeSpec]
    harness: Path = field(default_factory=harness_path)
    older_cluster: bool = False
    with_controller: bool = True
    control_plane: ControlPlane | None = None
    agents: dict[str, NodeAgent] = field(default_factory=dict)
    real_nodes: dict[str, RealNode] = field(default_factory=dict)
    controller: Controller | None = None
    controller_skip_reason: str = ""
    # Who serves the admission webhooks: "" (nobody), the hand-started controller, or the chart's.
    webhook: str = ""
    # Real nodes that outlive this process (the demo) are owned by the apiserver: stale once it is gone.
    detached: bool = False
    # tessera's DeviceClasses applied from deviceclasses/ (False: the chart brings its own).
    device_classes: bool = True
    # The private network of e2e/network.py: None decides by what the machine allows (root: yes).
    private_network: bool | None = None
    network: PrivateNetwork | None = None

    @property
    def kube(self) -> Kube:
        assert self.control_plane is not None and self.control_plane.kube is not None, "cluster not started"
        return self.control_plane.kube

    @property
    def kubeconfig(self) -> Path:
        assert self.control_plane is not None
        return self.control_plane.kubeconfig

    def start(self) -> Cluster:
        self.network = self._network()
        self.control_plane = ControlPlane(self.work_dir, self.harness, older_cluster=self.older_cluster,
                                          network=self.network)
        kube = self.control_plane.start()
        stand_ins = [spec for spec in self.nodes if not spec.real]
        for spec in stand_ins:
            create_fake_node(kube, spec.name)
        if self.device_classes:
            self.apply_device_classes()
        if self.with_controller:
            self.controller_skip_reason = controller_available()
            if not self.controller_skip_reason:
                self.controller = Controller(self.work_dir, self.control_plane.internal_kubeconfig,
                                             self.control_plane.pki, self.control_plane.enter(),
                                             self.network.pid if self.network else None)
                self.controller.start(kube)
                self.webhook = "tessera controller started by hand"
        for spec in stand_ins:
            agent = NodeAgent(spec.name, spec.profile, self.work_dir / "nodes" / spec.name, self.harness,
                              self.kubeconfig, spec.mig_strategy)
            self.agents[spec.name] = agent
            # kubelet first: it wipes the node's slices at start, as the real one does.
            agent.start_kubelet()
        for agent in self.agents.values():
            agent.start_plugin()
        for spec in self.nodes:
            if spec.real:
                node = self.real_node(spec)
                if self.detached and self.control_plane is not None:
                    node.owner = self.control_plane.processes["apiserver"].pid
                self.real_nodes[spec.name] = node
                node.start()
        return self

    def real_node(self, spec: NodeSpec) -> RealNode:
        """A real node of this cluster (not started): its own namespaces on the cluster's network."""
        if self.network is None or self.control_plane is None:
            raise ClusterError(f"real node {spec.name} needs a started cluster with a private network "
                               f"({private_network_unavailable() or 'this cluster was made without one'})")
        return RealNode(spec.name, spec.profile, self.work_dir / "nodes" / spec.name, node_binaries(),
                        self.control_plane.internal_kubeconfig, spec.mig_strategy, taints=spec.taints,
                        labels=spec.labels, network=self.network, ca_file=self.control_plane.ca_file,
                        plugin_by_hand=spec.plugin_by_hand)

    def _network(self) -> PrivateNetwork | None:
        """The private network where this machine can make one (root), else None: the loopback."""
        wanted = self.private_network if self.private_network is not None else not private_network_unavailable()
        if not wanted:
            return None
        if any(spec.real for spec in self.nodes):
            clean_stale_nodes()
        # A detached cluster (the demo) outlives this process: `make demo-down` removes its network.
        return PrivateNetwork(self.work_dir, owner=0 if self.detached else os.getpid()).start()

    def apply_device_classes(self) -> list[str]:
        """tessera's shipped DeviceClasses (deviceclasses/), or the basic class while there are none."""
        shipped = [m for m in load_manifests(REPO / "deviceclasses") if m.get("kind") == "DeviceClass"] \
            if (REPO / "deviceclasses").is_dir() else []
        for obj in shipped or [DEFAULT_CLASS]:
            self.kube.apply(obj)
        return [o["metadata"]["name"] for o in shipped or [DEFAULT_CLASS]]

    def processes(self) -> list[ManagedProcess]:
        procs = list(self.control_plane.processes.values()) if self.control_plane else []
        if self.controller and self.controller.process:
            procs.append(self.controller.process)
        for agent in self.agents.values():
            procs.extend(agent.logs())
        if self.network and self.network.holder:
            procs.append(self.network.holder)
        for node in self.real_nodes.values():
            procs.extend(node.logs())
        return procs

    def diagnostics(self, lines: int = 30) -> str:
        parts = []
        for proc in self.processes():
            state = "running" if proc.alive() else f"exited rc={proc.popen.returncode if proc.popen else None}"
            parts.append(f"----- {proc.name} ({state}) {proc.log_path} -----\n{proc.tail(lines)}")
        return "\n".join(parts)

    def stop(self) -> None:
        for node in self.real_nodes.values():
            node.stop()
        for agent in self.agents.values():
            agent.stop()
        if self.controller:
            self.controller.stop()
        if self.control_plane:
            self.control_plane.stop()
        if self.network:
            self.network.stop()


@contextlib.contextmanager
def running_cluster(work_dir: Path, nodes: list[NodeSpec], **kwargs: Any) -> Iterator[Cluster]:
    cluster = Cluster(work_dir, nodes, **kwargs)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
