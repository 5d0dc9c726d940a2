"""MPS control daemons, one per MPS group of a claim: where tessera's memory shares are enforced.

Each claim with shared cards gets its own `nvidia-cuda-mps-control` daemon with its own pipe,
log and shm directories under the state dir, named by the daemon's id: the claim's uid (its first
MPS group, and for most claims the only one), `<claim uid>-mps<n>` for further groups of a claim
whose requests use different MPS settings (driver.allocation.MpsGroup). Where a parameter or field
says `claim_uid`, it is that id. The daemon sees only the claim's GPUs
(CUDA_VISIBLE_DEVICES, in the same order as the container's visible devices) and gets a pinned
device memory limit per card, indexed by position in that list, set server-side through the
control pipe: the container never sees the limit in its own environment, so it cannot raise it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from driver.atomicfile import write_atomic
from driver.cdi import ContainerEdits, Mount, check_claim_uid
from driver.errors import DeviceError
from kubeletplugin.faults import MPS_START, FaultHook, crash_from_env
from kubeletplugin.nodelocks import SharedFileLock

log = structlog.get_logger(__name__)

MIB = 1024 * 1024
CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"
CONTAINER_SHM_DIR = "/dev/shm"
MPS_DAEMON_NAMES = ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server")


class MpsError(DeviceError):
    """An MPS daemon could not be started, configured or stopped."""

    reason = "mps"


def limit_mib(limit_bytes: int) -> int:
    """A pinned-memory limit in whole MiB, rounded down so it never exceeds the allocation."""
    mib = limit_bytes // MIB
    if mib < 1:
        raise MpsError(f"a memory limit of {limit_bytes} bytes is below MPS's smallest limit of 1 MiB")
    return mib


@dataclass(frozen=True)
class MpsPaths:
    root: Path
    pipe_dir: Path
    log_dir: Path
    shm_dir: Path

    def container_edits(self) -> ContainerEdits:
        """What a container needs to reach the claim's daemon: its pipe directory and its shm."""
        rw = ("rw", "nosuid", "nodev", "bind")
        return ContainerEdits(
            env=(f"CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIR}",),
            mounts=(
                Mount(str(self.pipe_dir), CONTAINER_PIPE_DIR, rw),
                Mount(str(self.shm_dir), CONTAINER_SHM_DIR, rw),
            ),
        )


def mps_paths(state_dir: Path, claim_uid: str) -> MpsPaths:
    root = state_dir / "mps" / check_claim_uid(claim_uid)
    return MpsPaths(root, root / "pipe", root / "log", root / "shm")


@dataclass(frozen=True)
class MpsDaemon:
    """What tessera remembers about a claim's daemon (stored in the checkpoint)."""

    claim_uid: str
    pipe_dir: str
    log_dir: str
    shm_dir: str
    gpu_uuids: tuple[str, ...]
    limits_mib: tuple[int, ...]
    active_thread_percentage: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "claimUID": self.claim_uid,
            "pipeDir": self.pipe_dir,
            "logDir": self.log_dir,
            "shmDir": self.shm_dir,
            "gpuUUIDs": list(self.gpu_uuids),
            "limitsMiB": list(self.limits_mib),
            "activeThreadPercentage": self.active_thread_percentage,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MpsDaemon:
        thread_percentage = data.get("activeThreadPercentage")
        return cls(
            claim_uid=str(data["claimUID"]),
            pipe_dir=str(data["pipeDir"]),
            log_dir=str(data["logDir"]),
            shm_dir=str(data["shmDir"]),
            gpu_uuids=tuple(str(u) for u in data["gpuUUIDs"]),
            limits_mib=tuple(int(m) for m in data["limitsMiB"]),
            active_thread_percentage=int(thread_percentage) if thread_percentage is not None else None,
        )


def control_commands(limits_mib: Sequence[int], active_thread_percentage: int | None) -> list[str]:
    """The lines fed to nvidia-cuda-mps-control after the daemon started; devices by index in its visible list."""
    lines = []
    if active_thread_percentage is not None:
        lines.append(f"set_default_active_thread_percentage {active_thread_percentage}")
    lines += [f"set_default_device_pinned_mem_limit {i} {mib}M" for i, mib in enumerate(limits_mib)]
    return lines


def _check_request(gpu_uuids: Sequence[str], limits_mib: Sequence[int], thread_percentage: int | None) -> None:
    if not gpu_uuids:
        raise MpsError("an MPS daemon needs at least one GPU")
    if len(gpu_uuids) != len(limits_mib):
        raise MpsError(f"{len(gpu_uuids)} GPUs but {len(limits_mib)} memory limits")
    if len(set(gpu_uuids)) != len(gpu_uuids):
        raise MpsError(f"a GPU appears twice in {list(gpu_uuids)}")
    if any(m < 1 for m in limits_mib):
        raise MpsError(f"memory limits must be at least 1 MiB, got {list(limits_mib)}")
    if thread_percentage is not None and not 1 <= thread_percentage <= 100:
        raise MpsError(f"active thread percentage must be 1..100, got {thread_percentage}")


class MpsControl(Protocol):
    state_dir: Path

    def start(
        self, claim_uid: str, gpu_uuids: Sequence[str], limits_mib: Sequence[int], active_thread_percentage: int | None
    ) -> MpsDaemon: ...

    def stop(self, claim_uid: str) -> None: ...

    def is_running(self, claim_uid: str) -> bool: ...

    def adopt(self, daemon: MpsDaemon) -> bool: ...


def _make_dirs(paths: MpsPaths) -> None:
    # Containers run as arbitrary users and must create their client pipes and shm segments here.
    for d in (paths.root, paths.pipe_dir, paths.log_dir, paths.shm_dir):
        d.mkdir(parents=True, exist_ok=True)
    # explicit modes: a permissive umask (000 in some runtimes) must not leave the log world-writable
    for d in (paths.root.parent, paths.root, paths.log_dir):
        os.chmod(d, 0o755)
    for d in (paths.pipe_dir, paths.shm_dir):
        os.chmod(d, 0o1777)


def _daemon_record(
    paths: MpsPaths, claim_uid: str, uuids: Sequence[str], limits: Sequence[int], thread_percentage: int | None
) -> MpsDaemon:
    return MpsDaemon(
        claim_uid,
        str(paths.pipe_dir),
        str(paths.log_dir),
        str(paths.shm_dir),
        tuple(uuids),
        tuple(limits),
        thread_percentage,
    )


class NvidiaMpsControl:
    """Runs the real `nvidia-cuda-mps-control` binary (from the driver root or PATH).

    With `isolate_shm` the daemon starts in its own mount namespace whose /dev/shm is the claim's
    shm directory, the same directory the container gets as /dev/shm, so clients and server meet
    there and no other claim's daemon does.
    """

    def __init__(
        self,
        state_dir: Path,
        control_binary: str | Path = "nvidia-cuda-mps-control",
        *,
        isolate_shm: bool = True,
        timeout_s: float = 10.0,
        library_dirs: Sequence[Path] = (),
    ) -> None:
        self.state_dir = state_dir
        self.control_binary = str(control_binary)
        self.library_dirs = tuple(library_dirs)
        self.isolate_shm = isolate_shm
        self.timeout_s = timeout_s

    def _env(self, paths: MpsPaths, gpu_uuids: Sequence[str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        if self.library_dirs:
            # a driver-root binary must load the driver root's libcuda / NVML
            env["LD_LIBRARY_PATH"] = ":".join(str(d) for d in self.library_dirs)
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(paths.pipe_dir)
        env["CUDA_MPS_LOG_DIRECTORY"] = str(paths.log_dir)
        if gpu_uuids is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_uuids)
        return env

    def _send(self, paths: MpsPaths, lines: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.control_binary],
            input="".join(f"{line}\n" for line in lines),
            env=self._env(paths),
            capture_output=True,
            text=True,
            timeout=self.timeout_s,
            check=False,
        )

    def start(
        self, claim_uid: str, gpu_uuids: Sequence[str], limits_mib: Sequence[int], active_thread_percentage: int | None
    ) -> MpsDaemon:
        _check_request(gpu_uuids, limits_mib, active_thread_percentage)
        paths = mps_paths(self.state_dir, claim_uid)
        if self.is_running(claim_uid):
            # settings may differ from what is running; a fresh daemon is the only way to be sure
            self.stop(claim_uid)
        # a daemon that died leaves its control socket and lock behind, which a new one trips over
        shutil.rmtree(paths.pipe_dir, ignore_errors=True)
        _make_dirs(paths)
        if self.isolate_shm:
            cmd = [
                "unshare", "--mount", "--propagation", "private", "--",
                "sh", "-c", 'mount --bind "$1" /dev/shm && exec "$2" -d', "sh", str(paths.shm_dir), self.control_binary,
            ]  # fmt: skip
        else:
            cmd = [self.control_binary, "-d"]
        try:
            started = subprocess.run(
                cmd,
                env=self._env(paths, gpu_uuids),
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsError(f"claim {claim_uid}: cannot start {self.control_binary}: {exc}") from exc
        if started.returncode != 0:
            raise MpsError(
                f"claim {claim_uid}: {self.control_binary} -d exited with {started.returncode}: "
                f"{(started.stderr or started.stdout).strip()}"
            )
        lines = control_commands(limits_mib, active_thread_percentage)
        try:
            configured = self._send(paths, lines)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.stop(claim_uid)
            raise MpsError(f"claim {claim_uid}: cannot configure the MPS daemon: {exc}") from exc
        if configured.returncode != 0:
            self.stop(claim_uid)
            raise MpsError(
                f"claim {claim_uid}: the MPS daemon refused its limits ({'; '.join(lines)}): "
                f"{(configured.stderr or configured.stdout).strip()}"
            )
        log.info("mps daemon started", claim_uid=claim_uid, gpus=list(gpu_uuids), limits_mib=list(limits_mib))
        return _daemon_record(paths, claim_uid, gpu_uuids, limits_mib, active_thread_percentage)

    def is_running(self, claim_uid: str) -> bool:
        paths = mps_paths(self.state_dir, claim_uid)
        if not (paths.pipe_dir / "control").exists():
            return False
        try:
            return self._send(paths, ["get_server_list"]).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def adopt(self, daemon: MpsDaemon) -> bool:
        running = self.is_running(daemon.claim_uid)
        log.info("mps daemon adopted" if running else "mps daemon gone", claim_uid=daemon.claim_uid)
        return running

    def stop(self, claim_uid: str) -> None:
        paths = mps_paths(self.state_dir, claim_uid)
        if self.is_running(claim_uid):
            try:
                self._send(paths, ["quit"])
            except (OSError, subprocess.TimeoutExpired) as exc:
                log.warning("mps quit failed", claim_uid=claim_uid, error=str(exc))
            deadline = time.monotonic() + self.timeout_s
            while time.monotonic() < deadline and self.is_running(claim_uid):
                time.sleep(0.2)
        for pid in _daemon_pids(paths.pipe_dir):
            log.warning("killing leftover mps process", claim_uid=claim_uid, pid=pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(paths.root, ignore_errors=True)
        log.info("mps daemon stopped", claim_uid=claim_uid)


def _daemon_pids(pipe_dir: Path) -> list[int]:
    """MPS control/server processes whose environment points at this pipe directory."""
    wanted = f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # not /proc/<pid>/comm: the kernel cuts it to 15 characters, both names become "nvidia-cuda-mps"
            argv0 = (entry / "cmdline").read_bytes().split(b"\0", 1)[0]
            if os.path.basename(argv0.decode(errors="replace")) not in MPS_DAEMON_NAMES:
                continue
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


class SimulatedMpsControl:
    """MpsControl for tests and simulated nodes: daemons are records in `<state>/fake-mps.json`.

    The record file outlives the process, so a restarted (or SIGKILLed) plugin finds its daemons
    again, as it would find real ones. It is replaced by rename but not fsync'd: a rename already
    outlives a killed process, and only a power loss could undo it, which stops real daemons too.
    Directories are created like the real ones, and the lines the real daemon would be fed are
    written to `<log dir>/control.log`.
    """

    def __init__(self, state_dir: Path, *, fault_hook: FaultHook = crash_from_env) -> None:
        self.state_dir = state_dir
        self.fault_hook = fault_hook  # kubeletplugin.faults: tests make start fail through it
        self._lock = SharedFileLock(self.registry)

    @property
    def registry(self) -> Path:
        # the name predates "Simulated"; kept, so that the other build of a rolling update finds the records
        return self.state_dir / "fake-mps.json"

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.registry.read_text())
        except FileNotFoundError:
            return {}
        return data if isinstance(data, dict) else {}

    def _save(self, data: dict[str, Any]) -> None:
        self.state_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        write_atomic(self.registry, json.dumps(data, sort_keys=True, indent=1).encode(), 0o600, durable=False)

    def daemons(self) -> dict[str, MpsDaemon]:
        with self._lock:
            return {uid: MpsDaemon.from_dict(rec) for uid, rec in self._load().items()}

    def start(
        self, claim_uid: str, gpu_uuids: Sequence[str], limits_mib: Sequence[int], active_thread_percentage: int | None
    ) -> MpsDaemon:
        _check_request(gpu_uuids, limits_mib, active_thread_percentage)
        self.fault_hook(MPS_START)
        paths = mps_paths(self.state_dir, claim_uid)
        _make_dirs(paths)
        (paths.pipe_dir / "control").touch()
        lines = control_commands(limits_mib, active_thread_percentage)
        write_atomic(
            paths.log_dir / "control.log", "".join(f"{line}\n" for line in lines).encode(), 0o644, durable=False
        )
        daemon = _daemon_record(paths, claim_uid, gpu_uuids, limits_mib, active_thread_percentage)
        with self._lock:
            data = self._load()
            data[claim_uid] = daemon.to_dict()
            self._save(data)
        return daemon

    def stop(self, claim_uid: str) -> None:
        with self._lock:
            data = self._load()
            if data.pop(claim_uid, None) is not None:
                self._save(data)
        shutil.rmtree(mps_paths(self.state_dir, claim_uid).root, ignore_errors=True)

    def is_running(self, claim_uid: str) -> bool:
        with self._lock:
            return claim_uid in self._load()

    def adopt(self, daemon: MpsDaemon) -> bool:
        with self._lock:
            return self._load().get(daemon.claim_uid) == daemon.to_dict()
