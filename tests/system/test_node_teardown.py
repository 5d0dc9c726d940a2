"""The real node's teardown walks its cgroup tree while runc and kubelet are still removing groups from it."""

from __future__ import annotations

import shutil
from pathlib import Path

from e2e.node.realnode import cgroup_procs_files


def _group(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "cgroup.procs").write_text("")
    return path


def test_every_group_s_procs_file_is_found(tmp_path: Path) -> None:
    top = _group(tmp_path / "node")
    _group(top / "kubepods" / "besteffort" / "pod-a" / "ctr-1")
    (top / "kubepods" / "cpu.shares").write_text("2")
    assert {p.relative_to(tmp_path).as_posix() for p in cgroup_procs_files(top)} == {
        "node/cgroup.procs", "node/kubepods/besteffort/pod-a/ctr-1/cgroup.procs"}


def test_a_group_removed_while_the_walk_is_under_way_is_skipped(tmp_path: Path) -> None:
    # a clean-clone `make test` failed its teardown with FileNotFoundError when Path.rglob descended into a
    # container's group that runc had removed after the walk listed its pod's groups
    top = _group(tmp_path / "node")
    pod = _group(top / "kubepods" / "besteffort" / "pod-a")
    containers = [_group(pod / f"ctr-{i}") for i in range(3)]
    for ctr in containers:
        _group(ctr / "inner")
    seen = []
    for procs in cgroup_procs_files(top):
        seen.append(procs)
        if procs.parent in containers:  # the pod's groups are listed: its other containers go away now
            for other in containers:
                if other != procs.parent:
                    shutil.rmtree(other)
    first = next(p.parent for p in seen if p.parent in containers)
    assert seen == [top / "cgroup.procs", pod / "cgroup.procs", first / "cgroup.procs",
                    first / "inner" / "cgroup.procs"]
