"""What a node could leave on the machine, as one comparable snapshot.

A real node must leave nothing behind: no entry in the machine's top-level directories, no mount,
no cgroup, no iptables rule and no process. Tests take a snapshot before and after starting and
stopping a node and compare.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

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


def _cgroups() -> list[str]:
    root = Path("/sys/fs/cgroup")
    out = []
    for hierarchy in sorted(root.iterdir()):
        if hierarchy.is_dir() and not hierarchy.is_symlink():
            out += [f"{hierarchy.name}/{d.name}" for d in sorted(hierarchy.iterdir()) if d.is_dir()]
    return out


def _iptables() -> list[str]:
    tool = shutil.which("iptables-save")
    if tool is None:
        return ["<iptables-save not installed>"]
    out = subprocess.run([tool], capture_output=True, text=True, check=False, timeout=30).stdout
    return [line for line in out.splitlines() if not line.startswith(("#", ":"))]


def _node_processes() -> list[str]:
    names = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm = (entry / "comm").read_text().strip()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            # A zombie is already dead; it waits only for the machine's init to reap it.
            if comm in NODE_PROCESSES and state != "Z":
                names.append(f"{comm}[{entry.name}]")
    return sorted(names)


def machine_snapshot() -> dict[str, list[str]]:
    snap = {f"ls {d}": _listing(d) for d in WATCHED_DIRS}
    snap["mounts"] = _mount_points()
    snap["cgroups"] = _cgroups()
    snap["iptables-save"] = _iptables()
    snap["node processes"] = _node_processes()
    return snap


def differences(before: dict[str, list[str]], after: dict[str, list[str]]) -> list[str]:
    """Human-readable differences: `<what>: + added` / `- removed`."""
    out = []
    for key, was in before.items():
        added = sorted(set(after[key]) - set(was))
        removed = sorted(set(was) - set(after[key]))
        out += [f"{key}: + {a}" for a in added] + [f"{key}: - {r}" for r in removed]
    return out
