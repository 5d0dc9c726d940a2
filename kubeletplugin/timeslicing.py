"""The time-slice length of whole GPUs whose claim asks for `strategy: TimeSlicing`.

CUDA already time-slices processes that share a card; the config only picks how long each turn
is. It is a per-GPU setting (`nvidia-smi compute-policy --set-timeslice`), set at prepare and put
back to the driver default at unprepare, since the card is exclusive to the claim meanwhile.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import structlog

from driver.atomicfile import write_atomic
from driver.config import TIME_SLICE_INTERVALS
from driver.errors import DeviceError
from kubeletplugin.nodelocks import SharedFileLock

log = structlog.get_logger(__name__)

# nvidia-smi's numbering of the intervals
TIME_SLICE_VALUES = {name: value for value, name in enumerate(TIME_SLICE_INTERVALS)}


class TimeSliceError(DeviceError):
    """The GPU's time-slice setting could not be changed."""

    reason = "time_slice"


class TimeSlicer(Protocol):
    def set_interval(self, gpu_uuid: str, interval: str) -> None: ...


def _value(interval: str) -> int:
    if interval not in TIME_SLICE_VALUES:
        raise TimeSliceError(f"unknown time-slice interval {interval!r}; one of {', '.join(TIME_SLICE_INTERVALS)}")
    return TIME_SLICE_VALUES[interval]


class NvidiaSmiTimeSlicer:
    """Runs `nvidia-smi compute-policy -i <uuid> --set-timeslice <n>` (the binary may come from the driver root)."""

    def __init__(
        self, binary: str | Path = "nvidia-smi", *, library_dirs: Sequence[Path] = (), timeout_s: float = 15.0
    ) -> None:
        self.binary = str(binary)
        self.library_dirs = tuple(library_dirs)
        self.timeout_s = timeout_s

    def set_interval(self, gpu_uuid: str, interval: str) -> None:
        cmd = [self.binary, "compute-policy", "-i", gpu_uuid, "--set-timeslice", str(_value(interval))]
        env = dict(os.environ)
        if self.library_dirs:
            # a driver-root nvidia-smi must load the driver root's NVML, not whatever the image has
            env["LD_LIBRARY_PATH"] = ":".join(str(d) for d in self.library_dirs)
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=self.timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise TimeSliceError(f"{' '.join(cmd)}: {exc}") from exc
        if done.returncode != 0:
            raise TimeSliceError(
                f"{' '.join(cmd)} exited with {done.returncode}: {(done.stderr or done.stdout).strip()}"
            )
        log.info("time-slice interval set", gpu_uuid=gpu_uuid, interval=interval)


class SimulatedTimeSlicer:
    """For simulated GPUs: the interval of each GPU is kept in `<state>/fake-timeslice.json`."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "fake-timeslice.json"  # name kept from before "Simulated" (rolling updates)
        self._lock = SharedFileLock(self.path)

    def intervals(self) -> dict[str, str]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def set_interval(self, gpu_uuid: str, interval: str) -> None:
        _value(interval)
        with self._lock:
            data = self.intervals()
            if interval == "Default":
                data.pop(gpu_uuid, None)
            else:
                data[gpu_uuid] = interval
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps(data, sort_keys=True).encode(), 0o600)
