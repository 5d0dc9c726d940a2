"""The e2e cluster's own network: a network namespace for the control plane and one per real node.

Kind runs each node in a container with its own network and a pod network inside it. Here the same
shape is made from network namespaces that the run creates itself, and nothing is added to the
machine's own interfaces, routes or iptables:

    machine (untouched)          hub namespace (control plane)              node namespace (one per real node)
    127.0.0.1:<port> --------->  lo 127.0.0.1, 10.0.0.1 (kubernetes svc)
      (forwarder, inherited       br0 10.200.0.1/24 ---------- veth ------- eth0 10.200.0.1x/24, default via hub
       listening socket)          route 10.201.<i>.0/24 via node i          cni0 10.201.<i>.1/24 (bridge CNI) -- pods

- The control plane (etcd, kube-apiserver, scheduler, controller-manager) runs in the hub. The
  apiserver listens on :443 there, so `kubernetes.default` (10.0.0.1:443, the first address of the
  service range) reaches it from every pod without kube-proxy: the address is the hub's own.
- The apiserver reaches kubelets (`kubectl logs`/`exec`) at their node address and webhook pods at
  their pod address (`--enable-aggregator-routing`: a Service is called at its endpoints).
- The machine's side reaches the apiserver only through a forwarder: this process opens a listening
  socket on the machine's 127.0.0.1 and hands it to the harness's `forward` role started inside the
  hub. A socket keeps the namespace it was made in, so no interface joins the two.
- Nothing in the private network has a route to anything else: the hub has no default route, so a
  packet for any other address (a DNS server, a registry, a Service address that no proxy
  translates) is refused inside the machine instead of leaving it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from e2e.processes import ClusterError, ManagedProcess, wait_for

HUB_ADDRESS = "10.200.0.1"
HUB_MAC = "02:00:0a:c8:00:01"  # locally administered, fixed: see PrivateNetwork.start
NODE_NETWORK = ipaddress.ip_network("10.200.0.0/24")
POD_NETWORK = ipaddress.ip_network("10.201.0.0/16")
SERVICE_RANGE = ipaddress.ip_network("10.0.0.0/24")
# The `kubernetes` Service takes the first address of the service range.
KUBERNETES_SERVICE_IP = str(SERVICE_RANGE.network_address + 1)
APISERVER_PORT = 443
# Addresses a connection of the run may have at its far end: the machine's loopback and the private network.
PRIVATE_RANGES = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"), NODE_NETWORK, POD_NETWORK,
                  SERVICE_RANGE)
# Set in a namespace holder's environment: "<pid of the run that owns it>:<work dir>" (stale clean-up).
OWNER_ENV = "TESSERA_E2E_NODE"
# Set on the hub's holder: its namespace is a network namespace only (no mount namespace of its own).
NETNS_ENV = "TESSERA_E2E_NETNS"
_CLONE_NEWNET = 0x40000000


def in_private_network(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in net for net in PRIVATE_RANGES if net.version == ip.version)


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    if proc.returncode != 0:
        raise ClusterError(f"`{' '.join(argv)}` failed (rc={proc.returncode}): {proc.stderr.strip()}")


def net_enter(pid: int) -> list[str]:
    """The argv prefix that runs a command in the network namespace of `pid` (and nothing else of it)."""
    return ["nsenter", f"--net=/proc/{pid}/ns/net", "--"]


def connect_in(pid: int | None, address: tuple[str, int], timeout: float = 5.0) -> socket.socket:
    """A TCP connection made inside the network namespace of `pid` (this namespace when None).

    The namespace of a socket is fixed when it is made, so a short-lived thread joins the namespace,
    connects and ends; the socket then works from any thread of this process.
    """
    if pid is None:
        return socket.create_connection(address, timeout=timeout)
    result: dict[str, object] = {}

    def connect() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
        try:
            if libc.setns(fd, _CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns into the network namespace of pid {pid}: {os.strerror(err)}")
            result["sock"] = socket.create_connection(address, timeout=timeout)
        except BaseException as exc:  # handed to the caller's thread
            result["error"] = exc
        finally:
            os.close(fd)

    thread = threading.Thread(target=connect, name=f"netns-connect-{pid}")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    sock = result["sock"]
    assert isinstance(sock, socket.socket)
    return sock


def http_get(pid: int | None, host: str, port: int, path: str, timeout: float = 5.0) -> tuple[int, str]:
    """A plain HTTP GET inside a network namespace: (status, body)."""
    import http.client

    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    conn.sock = connect_in(pid, (host, port), timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


@dataclass(frozen=True)
class NodeLink:
    """Where one node sits on the private network."""

    index: int
    address: str  # the node's InternalIP (eth0 in its namespace)
    pod_cidr: str  # the node's pods, on its cni0 bridge

    @property
    def veth(self) -> str:
        return f"veth-n{self.index}"


def node_link(index: int) -> NodeLink:
    if not 1 <= index <= 200:
        raise ValueError(f"node index {index} is outside 1..200")
    address = str(NODE_NETWORK.network_address + 10 + index)
    pods = ipaddress.ip_network(f"{POD_NETWORK.network_address + (index << 8)}/24")
    return NodeLink(index, address, str(pods))


@dataclass
class PrivateNetwork:
    """The hub namespace (control plane, node network bridge) and the links to each node's namespace."""

    work_dir: Path
    owner: int = field(default_factory=os.getpid)
    holder: ManagedProcess | None = None
    links: dict[str, NodeLink] = field(default_factory=dict)
    forwarders: list[ManagedProcess] = field(default_factory=list)

    @property
    def pid(self) -> int:
        assert self.holder is not None, "the private network is not started"
        return self.holder.pid

    def enter(self) -> list[str]:
        return net_enter(self.pid)

    def start(self) -> PrivateNetwork:
        self.holder = ManagedProcess(
            "netns-hub", ["unshare", "--net", "--", "sleep", "infinity"], self.work_dir / "logs" / "netns-hub.log",
            env={OWNER_ENV: f"{self.owner}:{self.work_dir}", NETNS_ENV: "hub"}).start()
        holder = self.holder
        wait_for(lambda: holder.alive_and(lambda: _namespace(holder.pid, "net") != _namespace(os.getpid(), "net")),
                 timeout=10, what="the control plane's network namespace")
        prefix = self.enter()
        _run([*prefix, "ip", "link", "set", "lo", "up"])
        _run([*prefix, "ip", "addr", "add", f"{KUBERNETES_SERVICE_IP}/32", "dev", "lo"])
        # A bridge takes the lowest MAC address of its ports unless it has one of its own: every node
        # attached later could change it, and the nodes' ARP entries for the hub would point nowhere
        # until they expire (seen as webhook calls timing out while a node started).
        _run([*prefix, "ip", "link", "add", "br0", "address", HUB_MAC, "type", "bridge"])
        _run([*prefix, "ip", "addr", "add", f"{HUB_ADDRESS}/{NODE_NETWORK.prefixlen}", "dev", "br0"])
        _run([*prefix, "ip", "link", "set", "br0", "up"])
        # Routes pods of one node to another node's pods; a namespace's forwarding switch is its own.
        _run([*prefix, "sysctl", "-qw", "net.ipv4.ip_forward=1"])
        return self

    def attach(self, node: str, node_pid: int) -> NodeLink:
        """Join the network namespace of `node_pid` (a node's holder) to the hub with a veth pair."""
        link = self.links.get(node) or node_link(len(self.links) + 1)
        self.links[node] = link
        hub, inside = self.enter(), net_enter(node_pid)
        _run([*hub, "ip", "link", "add", link.veth, "type", "veth", "peer", "name", "eth0", "netns", str(node_pid)])
        _run([*hub, "ip", "link", "set", link.veth, "master", "br0", "up"])
        _run([*inside, "ip", "link", "set", "lo", "up"])
        _run([*inside, "ip", "addr", "add", f"{link.address}/{NODE_NETWORK.prefixlen}", "dev", "eth0"])
        _run([*inside, "ip", "link", "set", "eth0", "up"])
        _run([*inside, "ip", "route", "add", "default", "via", HUB_ADDRESS])
        _run([*inside, "sysctl", "-qw", "net.ipv4.ip_forward=1"])
        # A restarted node gets a new namespace: replace the route to its pods.
        _run([*hub, "ip", "route", "replace", link.pod_cidr, "via", link.address])
        return link

    def forward(self, name: str, harness: Path, to: str, log_dir: Path) -> tuple[ManagedProcess, int]:
        """A forwarder from a fresh port on the machine's 127.0.0.1 to `to` inside the hub; (process, port)."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        port: int = listener.getsockname()[1]
        fd = listener.fileno()
        try:
            proc = ManagedProcess(name, [*self.enter(), str(harness), "forward", f"--listen-fd={fd}", f"--to={to}"],
                                  log_dir / f"{name}.log", pass_fds=(fd,)).start()
        finally:
            listener.close()  # the forwarder holds its own copy
        self.forwarders.append(proc)
        return proc, port

    def stop(self) -> None:
        for proc in self.forwarders:
            proc.stop()
        if self.holder is not None and self.holder.alive():
            kill_namespace(self.holder.pid, "net")
            self.holder.stop()


def _namespace(pid: int, kind: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return ""


def kill_namespace(holder_pid: int, kind: str) -> None:
    """SIGKILL every process still in the holder's namespace of `kind` ("mnt" for a node, "net" for the
    hub: shims, a stuck kubelet, the control plane), then the holder. The namespace, with a network
    namespace's veths and routes, goes with the last of them."""
    ns = _namespace(holder_pid, kind)
    if not ns:
        return
    for _ in range(100):
        members = [int(e.name) for e in Path("/proc").iterdir()
                   if e.name.isdigit() and int(e.name) != holder_pid and _namespace(int(e.name), kind) == ns]
        if not members:
            break
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(holder_pid, signal.SIGKILL)


@dataclass(frozen=True)
class Connection:
    namespace: str  # "machine" or the holder's pid
    netid: str
    local: str
    peer: str
    process: str

    @property
    def peer_host(self) -> str:
        host = self.peer.rsplit(":", 1)[0]
        return host.strip("[]")


def connections(netns_pid: int | None = None) -> list[Connection]:
    """Every TCP and UDP socket with a peer (`ss -tunap`) in a network namespace (None: the machine's)."""
    argv = [*(net_enter(netns_pid) if netns_pid else []), "ss", "-tunapH"]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    if proc.returncode != 0:
        raise ClusterError(f"`{' '.join(argv)}` failed: {proc.stderr.strip()}")
    out = []
    for line in proc.stdout.splitlines():
        fields = line.split(None, 6)
        if len(fields) < 6 or fields[5].endswith(":*"):  # listening or unconnected: no peer
            continue
        out.append(Connection("machine" if netns_pid is None else str(netns_pid), fields[0], fields[4], fields[5],
                              fields[6] if len(fields) > 6 else ""))
    return out


def off_machine(conns: list[Connection], pids: set[int] | None = None) -> list[Connection]:
    """The connections whose far end is outside the machine's loopback and the private network; with
    `pids`, only those of these processes (the machine's namespace is shared with everything else)."""
    import re

    def ours(c: Connection) -> bool:
        return pids is None or any(int(p) in pids for p in re.findall(r"pid=(\d+)", c.process))

    return [c for c in conns if ours(c) and not in_private_network(c.peer_host)]
