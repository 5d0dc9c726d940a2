"""Running commands inside an image's root filesystem without leaving a trace on the machine.

The build runs in a mount namespace of its own (hack/image/build.sh starts it with
`unshare --mount --propagation private`), so every mount here vanishes with the process. Two more
things keep the machine as it was (docs/deploy-probe.md found both):
- `mount -n` never records a mount in /run/mount/utab;
- a private tmpfs over /run takes whatever mmdebstrap's own mounts would write there (an empty
  /run/mount appeared on the machine otherwise, because /run itself is shared).
Commands in the root filesystem run with `unshare --net`: nothing in the build after the downloads
can reach the network, so the wheels and the Debian base are all it can use.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

PRIVATE_ENV = "TESSERA_IMAGE_PRIVATE_MOUNTS"


class BuildError(RuntimeError):
    pass


def tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")
    if path is None:
        raise BuildError(f"`{name}` is not installed; hack/image/build.sh installs the build's tools as root")
    return path


def run(cmd: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 1800,
        what: str = "") -> str:
    proc = subprocess.run(list(cmd), env=dict(env) if env is not None else None, capture_output=True,
                          text=True, check=False, timeout=timeout)
    if proc.returncode != 0:
        out = (proc.stdout + proc.stderr).strip()
        raise BuildError(f"{what or cmd[0]} failed (exit {proc.returncode}): `{_shown(cmd)}`\n{out[-3000:]}")
    return proc.stdout


def _shown(cmd: Sequence[str]) -> str:
    """The command for an error message, an inline script cut to its first line."""
    def short(arg: str) -> str:
        lines = [line for line in arg.splitlines() if line.strip()]
        return arg if len(lines) <= 1 and len(arg) <= 200 else (lines[0][:80] if lines else "") + " ..."
    return " ".join(short(a) for a in cmd)


def require_private_namespace() -> None:
    if os.environ.get(PRIVATE_ENV) != "1":
        raise BuildError("the image build mounts file systems and must run in a private mount namespace: "
                         "start it with hack/image/build.sh (or `make image`), not python -m directly")


_run_is_private = False


def private_run() -> None:
    """Put a tmpfs over /run in this (private) namespace, keeping the resolver configuration working
    where /etc/resolv.conf points into /run (systemd-resolved)."""
    global _run_is_private  # noqa: PLW0603 - once per process, and the process is the namespace
    if _run_is_private:
        return
    require_private_namespace()
    resolv = Path("/etc/resolv.conf").resolve()
    saved = resolv.read_bytes() if resolv.is_relative_to("/run") and resolv.is_file() else None
    run([tool("mount"), "-n", "-t", "tmpfs", "-o", "mode=0755", "tessera-image-run", "/run"], what="mount /run")
    if saved is not None:
        resolv.parent.mkdir(parents=True, exist_ok=True)
        resolv.write_bytes(saved)
    _run_is_private = True


@contextlib.contextmanager
def overlay(lowers: Sequence[Path], upper: Path, scratch: Path) -> Iterator[Path]:
    """Mount lowers (top first) with `upper` on top at scratch/merged; yields the merged root."""
    require_private_namespace()
    work, merged = scratch / "work", scratch / "merged"
    for d in (upper, work, merged):
        d.mkdir(parents=True, exist_ok=True)
    opts = f"lowerdir={':'.join(str(p) for p in lowers)},upperdir={upper},workdir={work}"
    run([tool("mount"), "-n", "-t", "overlay", "tessera-image", "-o", opts, str(merged)], what="overlay mount")
    try:
        yield merged
    finally:
        run([tool("umount"), "-n", str(merged)], what="overlay unmount")
        shutil.rmtree(work, ignore_errors=True)
        merged.rmdir()


def in_root(root: Path, cmd: Sequence[str], env: Mapping[str, str], *, user: str | None = None,
            timeout: float = 1800, what: str = "") -> str:
    """Run cmd inside root with exactly `env`, without network, as root or as `user` ("uid:gid")."""
    chroot = [tool("chroot"), *([f"--userspec={user}"] if user else []), str(root)]
    return run([tool("unshare"), "--net", *chroot, *cmd], env=env, timeout=timeout, what=what or cmd[0])
