"""What a node could leave on the machine, as one comparable snapshot.

A real node must leave nothing behind: no entry in the machine's top-level directories, no mount,
no cgroup, no iptables rule, no interface, address or route, and no process. Tests take a snapshot
before and after starting and stopping a node and compare.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from e2e.network import OWNER_ENV
from e2e.node.realnode import CGROUP_PREFIX, pid_alive

WATCHED_DIRS = ("/", "/opt", "/var/lib", "/var/log", "/etc/cni", "/run")
NODE_PROCESSES = ("containerd", "containerd-shim", "containerd-shim-runc-v2", "kubelet", "runc", "pause")


def _listing(path: str) -> list[str]:
    try:
        return sorted(p.name for p in Path(path).iterdir())
    except FileNotFoundError:
        return ["<absent>"]


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return sorted(line.split()[4] for line in f)


def _others_live_owners() -> set[int]:
    """Other runs (another e2e session, a running demo) whose real nodes are up: not ours to judge."""
    owners = set()
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        for d in hierarchy.glob(CGROUP_PREFIX + "*") if hierarchy.is_dir() else ():
            m = re.match(re.escape(CGROUP_PREFIX) + r"(\d+)-", d.name)
            if m and int(m.group(1)) != os.getpid() and pid_alive(int(m.group(1))):
                owners.add(int(m.group(1)))
    return owners


def _theirs(name: str, others: set[int]) -> bool:
    m = re.match(re.escape(CGROUP_PREFIX) + r"(\d+)-", name)
    return m is not None and int(m.group(1)) in others


def _cgroups(others: set[int]) -> list[str]:
    root = Path("/sys/fs/cgroup")
    out = []
    for hierarchy in sorted(root.iterdir()):
        if hierarchy.is_dir() and not hierarchy.is_symlink():
            out += [f"{hierarchy.name}/{d.name}" for d in sorted(hierarchy.iterdir())
                    if d.is_dir() and not _theirs(d.name, others)]
    return out


def _iptables() -> list[str]:
    tool = shutil.which("iptables-save")
    if tool is None:
        return ["<iptables-save not installed>"]
    out = subprocess.run([tool], capture_output=True, text=True, check=False, timeout=30).stdout
    return [line for line in out.splitlines() if not line.startswith(("#", ":"))]


def _host_network() -> list[str]:
    """The machine's own interfaces, addresses and routes: the private network adds none of them."""
    out = []
    for argv in (["ip", "-o", "link"], ["ip", "-o", "addr"], ["ip", "route"], ["ip", "-6", "route"]):
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
        out += [f"{' '.join(argv[1:])}: {line.strip()}" for line in proc.stdout.splitlines() if line.strip()]
    return out


def _foreign_namespaces(others: set[int]) -> set[str]:
    """Mount namespaces of other runs' nodes (their holders carry the owner in their environment)."""
    out = set()
    wanted = {f"{OWNER_ENV}={pid}:".encode() for pid in others}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                env = (entry / "environ").read_bytes().split(b"\0")
                if any(v.startswith(w) for v in env for w in wanted):
                    out.add(os.readlink(entry / "ns" / "mnt"))
            except OSError:
                continue
    return out


def _foreign(entry: Path, others: set[int], namespaces: set[str]) -> bool:
    try:
        if os.readlink(entry / "ns" / "mnt") in namespaces:
            return True
        return any(_theirs(part, others) for line in (entry / "cgroup").read_text().splitlines()
                   for part in line.split(":", 2)[-1].split("/"))
    except OSError:
        return True


def _node_processes(others: set[int]) -> list[str]:
    namespaces = _foreign_namespaces(others) if others else set()
    names = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm = (entry / "comm").read_text().strip()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            # A zombie is already dead; it waits only for the machine's init to reap it.
            if comm in NODE_PROCESSES and state != "Z" and not (others and _foreign(entry, others, namespaces)):
                names.append(f"{comm}[{entry.name}]")
    return sorted(names)


def machine_snapshot() -> dict[str, list[str]]:
    snap = {f"ls {d}": _listing(d) for d in WATCHED_DIRS}
    snap["mounts"] = _mount_points()
    # Another run's nodes (a second e2e session, a demo) come and go on their own: left out.
    others = _others_live_owners()
    snap["cgroups"] = _cgroups(others)
    snap["iptables-save"] = _iptables()
    snap["host network"] = _host_network() if shutil.which("ip") else ["<iproute2 not installed>"]
    snap["node processes"] = _node_processes(others)
    return snap


# Processes that were there before and are gone after belong to another run that ended meanwhile (a
# second e2e session, a demo): only new ones can be this run's leftovers.
ONLY_ADDITIONS = ("node processes",)


def differences(before: dict[str, list[str]], after: dict[str, list[str]]) -> list[str]:
    """Human-readable differences: `<what>: + added` / `- removed`."""
    out = []
    for key, was in before.items():
        added = sorted(set(after[key]) - set(was))
        removed = [] if key in ONLY_ADDITIONS else sorted(set(was) - set(after[key]))
        out += [f"{key}: + {a}" for a in added] + [f"{key}: - {r}" for r in removed]
    return out
