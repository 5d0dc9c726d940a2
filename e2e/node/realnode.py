"""A real Kubernetes node on this machine: kubelet v1.36.3 + containerd 2 + runc, with tessera's plugin.

Each node lives in its own mount namespace, held open by a `sleep` started under `unshare`. In it
the node's own directories are bind-mounted over `/var/lib`, `/var/log`, `/run`, `/opt` and
`/etc/hosts`, so kubelet, containerd, runc's shims and tessera's plugin use the very paths a real
node and the Helm chart use (`/var/lib/kubelet`, `/var/run/cdi`, `/var/lib/tessera`) while
everything they write lands under the node's work dir. The mounts are private: none is seen by the
machine, and all of them vanish with the namespace. Pods get a cgroup parent of the node's own
(`/tessera-e2e-<owner pid>-<node>`) so tear-down can find and kill every container process, even
those left by an interrupted run, and remove the cgroup directories.

Nothing here imports tessera: the plugin is started as a process with the DaemonSet's flags.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from e2e.network import NETNS_ENV, OWNER_ENV, NodeLink, PrivateNetwork, http_get, kill_namespace
from e2e.node.images import PAUSE_IMAGE, build_images, import_images
from e2e.processes import REPO, ClusterError, ManagedProcess, free_port, wait_for

DRIVER = "gpu.tessera.dev"
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PREFIX = "tessera-e2e-"
# cpu.shares of a node's cgroup (1024 is one process's): see RealNode._make_cgroups.
NODE_CPU_SHARES = 4096
# The node-side paths, exactly as the Helm chart's DaemonSet and a kubeadm node have them.
KUBELET_DIR = "/var/lib/kubelet"
CDI_DIR = "/var/run/cdi"
STATE_DIR = "/var/lib/tessera"
CONTAINERD_SOCK = "/run/containerd/containerd.sock"
# Each inside path -> the node work dir's subdirectory mounted over it.
# /run first, and with -n: util-linux records mounts in /run/mount/utab, which must be the node's own.
_BIND = {"/run": "run", "/var/lib": "varlib", "/var/log": "varlog", "/opt": "opt"}


class RealNodeUnavailable(RuntimeError):
    """This machine cannot run a real node; the message says exactly why."""


def _missing_tool(*tools: str) -> str:
    for tool in tools:
        if not any(os.access(Path(d) / tool, os.X_OK) for d in [*os.environ.get("PATH", "").split(":"), "/usr/sbin"]):
            return tool
    return ""


def private_network_unavailable() -> str:
    """Empty when the cluster can have its own network namespaces (e2e/network.py), else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = _missing_tool("unshare", "nsenter", "ip", "sysctl")
    return f"`{missing}` is not installed (util-linux, iproute2, procps)" if missing else ""


def real_node_unavailable() -> str:
    """Empty when a real node can run here, else the reason (the demo falls back to the stand-in)."""
    if os.geteuid() != 0:
        return "a real node needs root (mount namespaces, runc, cgroups); run as root or use the kubelet stand-in"
    missing = _missing_tool("unshare", "nsenter", "runc", "ip", "sysctl")
    if missing:
        return f"`{missing}` is not installed (e2e/node/build.sh installs runc; unshare/nsenter are in util-linux, " \
               "ip in iproute2, sysctl in procps)"
    with open("/proc/filesystems") as f:
        if "overlay" not in f.read():
            return "the kernel has no overlay filesystem, which containerd's snapshotter needs"
    if not (CGROUP_ROOT / "pids").is_dir() and not (CGROUP_ROOT / "cgroup.controllers").exists():
        return f"no cgroup hierarchy under {CGROUP_ROOT}"
    return ""


def node_binaries() -> Path:
    """kubelet, containerd, ctr, the runc shim and pause: $TESSERA_NODE_BIN, or built (cached) by build.sh."""
    env = os.environ.get("TESSERA_NODE_BIN", "").strip()
    if env:
        path = Path(env)
        if not os.access(path / "kubelet", os.X_OK):
            raise ClusterError(f"TESSERA_NODE_BIN={env} has no kubelet binary")
        return path
    proc = subprocess.run(["bash", str(REPO / "e2e/node/build.sh"), "--print-path"], stdout=subprocess.PIPE,
                          text=True, check=False)
    if proc.returncode != 0:
        raise ClusterError(f"building the node components failed (rc={proc.returncode}); see the output above")
    return Path(proc.stdout.strip())


# ---------------------------------------------------------------------------------------------
# cgroups and processes a node leaves behind


def _cgroup_hierarchies() -> list[Path]:
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return [CGROUP_ROOT]
    return [p for p in sorted(CGROUP_ROOT.iterdir()) if p.is_dir() and not p.is_symlink()]


def cgroup_procs_files(top: Path) -> Iterator[Path]:
    """The cgroup.procs file of `top` and of every group below it. os.walk skips a group that vanishes while it
    walks (runc or kubelet removing a container's group as its processes die); Path.rglob raised
    FileNotFoundError there and failed the node's teardown."""
    for parent, _, files in os.walk(top):
        if "cgroup.procs" in files:
            yield Path(parent) / "cgroup.procs"


def _kill_cgroup_tree(name: str) -> None:
    """SIGKILL every process in the cgroup `name` (all hierarchies) and remove its directories."""
    for _ in range(50):
        alive = False
        for hierarchy in _cgroup_hierarchies():
            top = hierarchy / name
            if not top.is_dir():
                continue
            for procs in cgroup_procs_files(top):
                with contextlib.suppress(OSError):
                    for pid in procs.read_text().split():
                        alive = True
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), signal.SIGKILL)
        if not alive:
            break
        time.sleep(0.1)
    for hierarchy in _cgroup_hierarchies():
        top = hierarchy / name
        if top.is_dir():
            # Bottom-up; os.walk skips a directory that vanishes while it walks (kubelet removing a pod's
            # group), where Path.rglob raised FileNotFoundError and left the node's groups behind.
            for parent, dirs, _ in os.walk(top, topdown=False):
                for d in dirs:
                    with contextlib.suppress(OSError):
                        os.rmdir(os.path.join(parent, d))
            with contextlib.suppress(OSError):
                top.rmdir()


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (it may belong to another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_node(holder_pid: int, cgroup_name: str) -> None:
    """Tear down a node from another process (`make demo-down`): its namespace, then its pods' cgroups."""
    kill_namespace(holder_pid, "mnt")
    _kill_cgroup_tree(cgroup_name)


def clean_stale_nodes() -> list[str]:
    """Tear down what an earlier, interrupted run left: namespaces and cgroups whose owner is gone."""
    cleaned: list[str] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        hub = NETNS_ENV.encode() + b"=hub" in environ
        for var in environ:
            if var.startswith(OWNER_ENV.encode() + b"="):
                owner, _, node_dir = var.split(b"=", 1)[1].decode().partition(":")
                # Owner 0: a detached cluster (the demo), removed only by `make demo-down`.
                if owner.isdigit() and int(owner) > 0 and not pid_alive(int(owner)) and int(owner) != os.getpid():
                    kill_namespace(int(entry.name), "net" if hub else "mnt")
                    cleaned.append(node_dir)
    pattern = re.compile(re.escape(CGROUP_PREFIX) + r"(\d+)-")
    for hierarchy in _cgroup_hierarchies():
        for d in hierarchy.glob(CGROUP_PREFIX + "*"):
            m = pattern.match(d.name)
            if m and not pid_alive(int(m.group(1))):
                _kill_cgroup_tree(d.name)
                cleaned.append(d.name)
    return sorted(set(cleaned))


# ---------------------------------------------------------------------------------------------
# the node


@dataclass
class RealNode:
    """kubelet + containerd + tessera's kubelet plugin for one node, in the node's mount namespace."""

    name: str
    profile: str
    work_dir: Path
    bins: Path
    kubeconfig: Path
    mig_strategy: str = "static"
    taints: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    plugin_by_hand: bool = True
    # The cluster's private network (the node gets a namespace of its own on it) and the CA that
    # signs the apiserver's client certificate: kubelet answers only the apiserver.
    network: PrivateNetwork | None = None
    ca_file: Path | None = None
    link: NodeLink | None = None
    holder: ManagedProcess | None = None
    containerd: ManagedProcess | None = None
    kubelet: ManagedProcess | None = None
    plugin: ManagedProcess | None = None
    ports: dict[str, int] = field(default_factory=dict)
    # The run that owns the node: when this pid is gone, the next run's clean_stale_nodes() tears it down.
    owner: int = field(default_factory=os.getpid)

    # ---- paths

    def host_path(self, inside: str) -> Path:
        """Where a path of the node (`/var/lib/kubelet/...`, `/var/run/cdi/...`) is on this machine."""
        path = inside.replace("/var/run/", "/run/", 1) if inside.startswith("/var/run/") else inside
        for mount, sub in _BIND.items():
            if path == mount or path.startswith(mount + "/"):
                return self.work_dir / sub / path[len(mount) + 1:]
        raise ValueError(f"{inside} is not inside the node's own directories ({', '.join(_BIND)})")

    @property
    def cgroup_name(self) -> str:
        return f"{CGROUP_PREFIX}{self.owner}-{self.name}"

    @property
    def cdi_dir(self) -> Path:
        return self.host_path(CDI_DIR)

    @property
    def state_dir(self) -> Path:
        return self.host_path(STATE_DIR)

    @property
    def pod_logs_dir(self) -> Path:
        return self.host_path("/var/log/pods")

    @property
    def podresources_socket(self) -> Path:
        return self.host_path(f"{KUBELET_DIR}/pod-resources/kubelet.sock")

    def enter(self) -> list[str]:
        """The argv prefix that runs a command inside the node, with the node dir as working directory."""
        assert self.holder is not None, f"node {self.name} is not started"
        # A scratch working directory, never `/`: kubelet deletes some paths relative to its cwd.
        return ["nsenter", f"--target={self.holder.pid}", "--mount", "--net", f"--wd={self.work_dir}", "--"]

    def ctr(self) -> list[str]:
        return [*self.enter(), str(self.bins / "ctr"), f"--address={CONTAINERD_SOCK}"]

    # ---- start

    @property
    def address(self) -> str:
        """The node's InternalIP on the cluster's private network."""
        assert self.link is not None, f"node {self.name} is not started"
        return self.link.address

    def start(self, *, timeout: float = 120.0) -> RealNode:
        if self.network is None or self.ca_file is None:
            raise ClusterError(f"real node {self.name} needs the cluster's private network and CA")
        for sub in (*_BIND.values(), "cni", "etc"):
            (self.work_dir / sub).mkdir(parents=True, exist_ok=True)
        (self.work_dir / "etc" / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")
        (self.work_dir / "etc" / "resolv.conf").write_text("# no name servers: nothing leaves this machine\n")
        self._make_cgroups()
        self._start_namespace()
        self.link = self.network.attach(self.name, self.holder_pid)
        # The node's own name, for anything inside that looks it up: never the machine's DNS.
        hosts = f"127.0.0.1 localhost\n::1 localhost\n{self.address} {self.name}\n"
        (self.work_dir / "etc" / "hosts").write_text(hosts)
        self._start_containerd(timeout)
        self.start_kubelet(timeout=timeout)
        if self.plugin_by_hand:
            self.start_plugin(timeout=timeout)
        return self

    def _make_cgroups(self) -> None:
        for hierarchy in _cgroup_hierarchies():
            node = hierarchy / self.cgroup_name
            node.mkdir(exist_ok=True)
            # All of a node's pods share this one group. At the default weight, the group counts as a
            # single busy process of the machine, and a loaded machine starves the webhook and plugin
            # pods behind it; a real node has its CPUs to itself, so give the group the weight of several.
            for knob, weight in (("cpu.shares", NODE_CPU_SHARES), ("cpu.weight", NODE_CPU_SHARES * 100 // 1024)):
                if (node / knob).exists():  # only the hierarchy with the cpu controller has it
                    (node / knob).write_text(str(weight))

    @property
    def holder_pid(self) -> int:
        assert self.holder is not None, f"node {self.name} is not started"
        return self.holder.pid

    def _start_namespace(self) -> None:
        binds = " && ".join(f'mount -n --bind "$1/{sub}" {mount}' for mount, sub in _BIND.items())
        script = (f'set -e; {binds} && mount -n --bind "$1/etc/hosts" /etc/hosts && touch "$1/ns-ready" '
                  "&& exec sleep infinity")
        ready = self.work_dir / "ns-ready"
        ready.unlink(missing_ok=True)
        self.holder = ManagedProcess(
            f"ns-{self.name}", ["unshare", "--mount", "--net", "--propagation", "private", "--", "sh", "-c", script,
                                "sh", str(self.work_dir)],
            self.work_dir / "logs" / "namespace.log", env={OWNER_ENV: f"{self.owner}:{self.work_dir}"}).start()
        holder = self.holder
        wait_for(lambda: holder.alive_and(ready.exists), timeout=20, what=f"the mount namespace of node {self.name}")

    def _containerd_config(self) -> Path:
        runtime = "io.containerd.cri.v1.runtime"
        config = "\n".join([
            "version = 3",
            'root = "/var/lib/containerd"',
            'state = "/run/containerd"',
            "[grpc]", f'  address = "{CONTAINERD_SOCK}"',
            "[ttrpc]", f'  address = "{CONTAINERD_SOCK}.ttrpc"',
            "[debug]", '  level = "info"',
            "[plugins.'io.containerd.internal.v1.opt']", '  path = "/opt/containerd"',
            "[plugins.'io.containerd.nri.v1.nri']", "  disable = true",
            f"[plugins.'{runtime}']",
            f'  cdi_spec_dirs = ["{CDI_DIR}"]',
            # Without CAP_SYS_RESOURCE runc cannot lower oom_score_adj below its own.
            "  restrict_oom_score_adj = true",
            f"[plugins.'{runtime}'.cni]",
            '  bin_dirs = ["/usr/lib/cni"]',
            f'  conf_dir = "{self.work_dir / "cni"}"',
            f"[plugins.'{runtime}'.containerd]", '  default_runtime_name = "runc"',
            f"[plugins.'{runtime}'.containerd.runtimes.runc]", '  runtime_type = "io.containerd.runc.v2"',
            f"[plugins.'{runtime}'.containerd.runtimes.runc.options]", "  SystemdCgroup = false",
            "[plugins.'io.containerd.cri.v1.images']", '  snapshotter = "overlayfs"',
            "[plugins.'io.containerd.cri.v1.images'.pinned_images]", f'  sandbox = "{PAUSE_IMAGE}"',
            "[plugins.'io.containerd.grpc.v1.cri']",
            '  stream_server_address = "127.0.0.1"', '  stream_server_port = "0"',
            "",
        ])
        path = self.work_dir / "containerd.toml"
        path.write_text(config)
        # The pod network: a bridge in the node's own namespace, the node's pod range, routed (no NAT,
        # so no iptables rule anywhere) to the other nodes and the control plane through the hub.
        assert self.link is not None
        (self.work_dir / "cni" / "10-pods.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "tessera-e2e-pods", "plugins": [{
                "type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": self.link.pod_cidr}]],
                         "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "/var/lib/cni/networks"},
            }]}))
        return path

    def _env(self) -> dict[str, str]:
        return {"PATH": f"{self.bins}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

    def _start_containerd(self, timeout: float) -> None:
        config = self._containerd_config()
        self.containerd = ManagedProcess(f"containerd-{self.name}",
                                         [*self.enter(), str(self.bins / "containerd"), f"--config={config}"],
                                         self.work_dir / "logs" / "containerd.log", env=self._env()).start()
        containerd = self.containerd
        sock = self.host_path(CONTAINERD_SOCK)
        wait_for(lambda: containerd.alive_and(sock.exists), timeout=timeout,
                 what=f"containerd of {self.name} (log {containerd.log_path})")
        import_images(self.ctr(), build_images(self.bins))

    def _kubelet_config(self) -> Path:
        # The node has a network namespace of its own: kubelet's usual ports clash with nothing.
        self.ports.setdefault("kubelet", 10250)
        self.ports.setdefault("healthz", 10248)
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "failCgroupV1": False, "failSwapOn": False, "cgroupDriver": "cgroupfs", "cgroupsPerQOS": True,
            "cgroupRoot": f"/{self.cgroup_name}", "enforceNodeAllocatable": [],
            "address": self.address, "port": self.ports["kubelet"], "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": self.ports["healthz"],
            # As kubeadm sets it up: the apiserver's client certificate or a token the apiserver
            # vouches for, and every request authorized by the apiserver (SubjectAccessReview).
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.ca_file)}},
            "authorization": {"mode": "Webhook"},
            "evictionHard": {k: "0%" for k in ("memory.available", "nodefs.available", "nodefs.inodesFree",
                                                "imagefs.available", "imagefs.inodesFree")},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "podLogsDir": "/var/log/pods", "volumePluginDir": f"{KUBELET_DIR}/volumeplugins",
            "makeIPTablesUtilChains": False, "resolvConf": str(self.work_dir / "etc" / "resolv.conf"),
            "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCK}", "imageServiceEndpoint": f"unix://{CONTAINERD_SOCK}",
            "serializeImagePulls": False, "nodeStatusReportFrequency": "10s", "syncFrequency": "5s",
            "fileCheckFrequency": "5s", "shutdownGracePeriod": "0s",
        }
        path = self.work_dir / "kubelet-config.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def kubelet_argv(self) -> list[str]:
        return [*self.enter(), str(self.bins / "kubelet"), f"--config={self._kubelet_config()}",
                f"--kubeconfig={self.kubeconfig}", f"--root-dir={KUBELET_DIR}", f"--cert-dir={KUBELET_DIR}/pki",
                f"--hostname-override={self.name}", f"--node-ip={self.address}", "-v=2",
                *([f"--register-with-taints={','.join(self.taints)}"] if self.taints else []),
                *([f"--node-labels={','.join(self.labels)}"] if self.labels else [])]

    def start_kubelet(self, *, timeout: float = 120.0) -> None:
        """Start (or restart) kubelet and wait until it reports the node Ready."""
        self.kubelet = ManagedProcess(f"kubelet-{self.name}", self.kubelet_argv(),
                                      self.work_dir / "logs" / "kubelet.log", env=self._env()).start()
        kubelet = self.kubelet

        def healthy() -> bool:
            kubelet.check_alive()
            return http_get(self.holder_pid, "127.0.0.1", self.ports["healthz"], "/healthz", timeout=2)[0] == 200

        wait_for(healthy, timeout=timeout, interval=0.5,
                 what=f"kubelet of {self.name} /healthz (log {kubelet.log_path})")

    def plugin_argv(self, instance_id: str = "") -> list[str]:
        """The DaemonSet's flags; with an instance id (the chart passes the pod UID), its own sockets and port."""
        port = self.ports.setdefault(f"metrics-{instance_id}" if instance_id else "metrics", free_port())
        argv = [*self.enter(), sys.executable, "-m", "tessera", "--log-format=json", "kubelet-plugin",
                f"--node-name={self.name}", f"--simulate={self.profile}", f"--kubeconfig={self.kubeconfig}",
                f"--kubelet-dir={KUBELET_DIR}", f"--cdi-dir={CDI_DIR}", f"--state-dir={STATE_DIR}",
                f"--mig-strategy={self.mig_strategy}", f"--metrics-addr=127.0.0.1:{port}"]
        return [*argv, f"--instance-id={instance_id}"] if instance_id else argv

    def registrations(self) -> int:
        """How many times kubelet's plugin watcher has registered tessera on this node."""
        if self.kubelet is None:
            return 0
        try:
            text = self.kubelet.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return 0
        return len(re.findall(r'"Connection changed".*driverName="' + re.escape(DRIVER) + r'".*connected=true', text))

    def start_plugin(self, *, timeout: float = 60.0, source: Path | None = None) -> None:
        """Start (or restart) tessera's plugin and wait until the real kubelet registered it.

        `source`: run the tessera in that directory (another build's tree) instead of this checkout's.
        """
        before = self.registrations()
        # nsenter --wd moves the plugin to the node dir, so the other tree is put on the import path
        env = {**self._env(), "PYTHONPATH": str(source)} if source else self._env()
        self.plugin = ManagedProcess(f"plugin-{self.name}", self.plugin_argv(),
                                     self.work_dir / "logs" / "plugin.log", env=env, cwd=source).start()
        plugin = self.plugin
        wait_for(lambda: plugin.alive_and(lambda: self.registrations() > before), timeout=timeout,
                 what=f"kubelet on {self.name} to register tessera's plugin (log {plugin.log_path})")

    def start_instance(self, instance_id: str, *, timeout: float = 60.0) -> ManagedProcess:
        """One more plugin process beside any running one, as a rolling update's new pod; returns once
        kubelet registered it (it does not replace `self.plugin`)."""
        before = self.registrations()
        proc = ManagedProcess(f"plugin-{self.name}-{instance_id}", self.plugin_argv(instance_id),
                              self.work_dir / "logs" / f"plugin-{instance_id}.log", env=self._env()).start()
        wait_for(lambda: proc.alive_and(lambda: self.registrations() > before), timeout=timeout,
                 what=f"kubelet on {self.name} to register plugin instance {instance_id} (log {proc.log_path})")
        return proc

    # ---- what a user would look at

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """The container's own output, from kubelet's pod log directory (CRI log format stripped)."""
        lines: list[str] = []
        for path in sorted(self.pod_logs_dir.glob(f"{namespace}_{pod}_*/{container}/*.log")):
            for line in path.read_text(errors="replace").splitlines():
                parts = line.split(" ", 3)
                lines.append(parts[3] if len(parts) == 4 else line)
        return "\n".join(lines)

    def plugin_log(self) -> str:
        """Everything tessera's plugin logged on this node: the hand-started process's log file, and the
        container logs of the chart's DaemonSet pods (oldest pod first)."""
        parts = []
        if self.plugin is not None and self.plugin.log_path.exists():
            parts.append(self.plugin.log_path.read_text(errors="replace"))
        pods = sorted(self.pod_logs_dir.glob("*_*-kubelet-plugin-*_*/plugin"), key=lambda d: d.stat().st_mtime)
        for container in pods:
            for path in sorted(container.glob("*.log")):
                parts += [line.split(" ", 3)[3] if line.count(" ") >= 3 else line
                          for line in path.read_text(errors="replace").splitlines()]
        return "\n".join(parts)

    def running_containers(self) -> list[str]:
        proc = subprocess.run([*self.ctr(), "-n", "k8s.io", "tasks", "ls", "-q"], capture_output=True, text=True,
                              check=False, timeout=30)
        return proc.stdout.split()

    # ---- stop

    def stop_kubelet(self) -> None:
        if self.kubelet is not None:
            self.kubelet.stop()

    def stop(self) -> None:
        """Stop everything, remove every container, shim, mount and cgroup the node made."""
        if self.plugin is not None:
            self.plugin.stop()
        self.stop_kubelet()
        if self.containerd is not None and self.containerd.alive():
            for task in self.running_containers():
                subprocess.run([*self.ctr(), "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", task],
                               capture_output=True, check=False, timeout=30)
        _kill_cgroup_tree(self.cgroup_name)
        if self.containerd is not None:
            self.containerd.stop()
        if self.holder is not None and self.holder.alive():
            kill_namespace(self.holder.pid, "mnt")
            self.holder.stop()
        _kill_cgroup_tree(self.cgroup_name)

    def logs(self) -> list[ManagedProcess]:
        return [p for p in (self.containerd, self.kubelet, self.plugin) if p is not None]
