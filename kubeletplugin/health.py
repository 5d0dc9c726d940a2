"""Device health for kubelet (DRAResourceHealth v1alpha1, KEP-4680).

kubelet opens NodeWatchResources once per plugin connection and expects every message to be the
complete list of the driver's devices. A device it has not heard about for
`health_check_timeout_seconds` turns Unknown, and when the stream ends kubelet forgets all health
data of the driver. So the stream sends the full list at once, again on every change, and again
every `resend_interval` seconds (well inside the timeout) while nothing changes.

Where health comes from: the HealthBoard holds the current state; sources write into it, each into its
own layer, and a device's health is the worst of its layers. GPU health events (kubeletplugin/
healthmonitor.py, the same conditions that become device taints) are one source; the simulated backend
also reads a JSON file of overrides (FileHealthSource) that a demo can edit. Tests flip it directly.
"""

from __future__ import annotations

import enum
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import structlog

from proto.drahealth.v1alpha1 import api_pb2 as pb
from proto.drahealth.v1alpha1 import api_pb2_grpc as pb_grpc

log = structlog.get_logger(__name__)

RESEND_INTERVAL_S = 10.0
HEALTH_TIMEOUT_S = 30
MESSAGE_MAX = 1024  # kubelet truncates longer messages


class Health(enum.Enum):
    UNKNOWN = pb.UNKNOWN
    HEALTHY = pb.HEALTHY
    UNHEALTHY = pb.UNHEALTHY

    @classmethod
    def parse(cls, text: str, path: str) -> Health:
        """"Healthy" / "Unhealthy" / "Unknown" (any case) -> Health; ValueError naming `path` otherwise."""
        for member in cls:
            if member.name.lower() == text.strip().lower():
                return member
        raise ValueError(f"{path}: health must be one of Healthy, Unhealthy, Unknown; got {text!r}")


@dataclass(frozen=True)
class DeviceHealth:
    """One device's health as kubelet gets it."""

    device_name: str
    health: Health
    message: str
    updated_at: float  # unix seconds when tessera determined it


_SEVERITY = {Health.HEALTHY: 0, Health.UNKNOWN: 1, Health.UNHEALTHY: 2}


def device_names_from_slices(slices: Iterable[Mapping[str, Any]]) -> list[str]:
    """Names of every device published in these ResourceSlices, in publishing order."""
    names: list[str] = []
    for s in slices:
        for device in s.get("spec", {}).get("devices", []) or []:
            if device["name"] not in names:
                names.append(device["name"])
    return names


def _parent_gpu(device_name: str) -> str:
    # MIG devices are named gpu-<index>-mig-<profile>-<placement>; their GPU is the gpu-<index> prefix.
    head, sep, _ = device_name.partition("-mig-")
    return head if sep else device_name


class HealthBoard:
    """Current health of every published device of one pool, with change notification."""

    def __init__(
        self, pool_name: str, device_names: Iterable[str], *, clock: Callable[[], float] = time.time
    ) -> None:
        self.pool_name = pool_name
        self._clock = clock
        self._cond = threading.Condition()
        self._version = 0
        self._closed = False
        self._states: dict[str, DeviceHealth] = {}
        # source -> device -> (health, message); a device's state is the worst over the sources
        self._layers: dict[str, dict[str, tuple[Health, str]]] = {}
        self._listeners: list[Callable[[list[DeviceHealth]], None]] = []
        self.set_devices(device_names)

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed

    def add_listener(self, listener: Callable[[list[DeviceHealth]], None]) -> None:
        """Call `listener(states)` after every change (metrics)."""
        self._listeners.append(listener)
        listener(self.snapshot()[1])

    def set_devices(self, device_names: Iterable[str]) -> None:
        """Track exactly these devices: new ones start Healthy, vanished ones are dropped."""
        now = self._clock()
        with self._cond:
            wanted = list(dict.fromkeys(device_names))
            self._states = {
                name: self._states.get(name) or DeviceHealth(name, Health.HEALTHY, "", now) for name in wanted
            }
            for layer in self._layers.values():
                for gone in layer.keys() - self._states.keys():
                    del layer[gone]
            self._changed()

    def set_health(self, device_name: str, health: Health, message: str = "", *, source: str = "manual") -> None:
        """Set a device's health as `source` sees it; a GPU's health also applies to its MIG devices.

        Each source has its own layer, so one source reporting Healthy cannot hide another's Unhealthy.
        """
        now = self._clock()
        with self._cond:
            # A GPU in MIG mode is not published itself, only its MIG devices, which share its fate.
            targets = [n for n in self._states if n == device_name or _parent_gpu(n) == device_name]
            if not targets:
                raise KeyError(f"device {device_name!r} is not published by this node (pool {self.pool_name})")
            layer = self._layers.setdefault(source, {})
            changed = False
            for name in targets:
                text = message if name == device_name or not message else f"{device_name}: {message}"
                if health is Health.HEALTHY and not message:
                    layer.pop(name, None)
                else:
                    layer[name] = (health, text)
                worst = max(
                    (states[name] for states in self._layers.values() if name in states),
                    key=lambda hm: _SEVERITY[hm[0]],
                    default=(Health.HEALTHY, ""),
                )
                old = self._states[name]
                if (old.health, old.message) != worst:
                    self._states[name] = DeviceHealth(name, worst[0], worst[1], now)
                    changed = True
            if changed:
                self._changed()

    def snapshot(self) -> tuple[int, list[DeviceHealth]]:
        """(version, every device's state); the version grows with every change."""
        with self._cond:
            return self._version, list(self._states.values())

    def wait_for_change(self, seen_version: int, timeout: float) -> int:
        """Block until the version differs from `seen_version`, the board closes, or `timeout` passes."""
        with self._cond:
            self._cond.wait_for(lambda: self._version != seen_version or self._closed, timeout)
            return self._version

    def close(self) -> None:
        """End every watch stream (shutdown)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _changed(self) -> None:
        # called with the lock held
        self._version += 1
        self._cond.notify_all()
        states = list(self._states.values())
        for listener in self._listeners:
            listener(states)


class DRAResourceHealthServicer(pb_grpc.DRAResourceHealthServicer):
    """/v1alpha1.DRAResourceHealth/NodeWatchResources over a HealthBoard."""

    def __init__(
        self,
        board: HealthBoard,
        *,
        resend_interval: float = RESEND_INTERVAL_S,
        timeout_seconds: int = HEALTH_TIMEOUT_S,
        max_streams: int = 4,
    ) -> None:
        self._board = board
        self._resend = resend_interval
        self._timeout = timeout_seconds
        # Each open stream pins one server worker thread; kubelet opens one, so a few is plenty.
        self._streams = threading.BoundedSemaphore(max_streams)

    def add_to(self, server: grpc.Server) -> None:
        pb_grpc.add_DRAResourceHealthServicer_to_server(self, server)

    def response(self, states: Iterable[DeviceHealth]) -> pb.NodeWatchResourcesResponse:
        return pb.NodeWatchResourcesResponse(
            devices=[
                pb.DeviceHealth(
                    device=pb.DeviceIdentifier(pool_name=self._board.pool_name, device_name=s.device_name),
                    health=s.health.value,
                    last_updated_time=int(s.updated_at),
                    health_check_timeout_seconds=self._timeout,
                    message=s.message[:MESSAGE_MAX],
                )
                for s in states
            ]
        )

    def NodeWatchResources(
        self, request: pb.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.NodeWatchResourcesResponse]:
        if not self._streams.acquire(blocking=False):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many open health streams")
        try:
            log.info("kubelet opened the health stream")
            version = -1
            while context.is_active() and not self._board.closed:
                version, states = self._board.snapshot()
                yield self.response(states)
                version = self._board.wait_for_change(version, self._resend)
            log.info("health stream ended", shutdown=self._board.closed)
        finally:
            self._streams.release()


class FileHealthSource:
    """Simulated health: a JSON file {"<device>": {"health": "Unhealthy", "message": "..."}} applied to a board.

    Devices the file does not name are Healthy, and a missing file means all are, so deleting the file
    heals everything. A file that cannot be parsed is logged and ignored (the last good state stays).
    """

    def __init__(self, path: Path, board: HealthBoard, *, interval: float = 2.0) -> None:
        self.path = path
        self._board = board
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_mtime: float | None = -1.0

    def read(self) -> dict[str, tuple[Health, str]]:
        """The file's overrides; raises ValueError with the offending field path."""
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"{self.path}: not valid JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise ValueError(f"{self.path}: top level must be an object mapping device name to health")
        out: dict[str, tuple[Health, str]] = {}
        for name, entry in raw.items():
            if not isinstance(entry, dict):
                raise ValueError(f"{self.path}: {name}: must be an object with 'health' and optional 'message'")
            health = Health.parse(str(entry.get("health", "")), f"{self.path}: {name}.health")
            out[str(name)] = (health, str(entry.get("message", "")))
        return out

    def apply(self) -> None:
        """Read the file once and push its state onto the board."""
        overrides = self.read()
        _, states = self._board.snapshot()
        names = [s.device_name for s in states]
        # Whole GPUs first (their state spreads to their MIG devices), then MIG devices named on their own.
        gpus = [n for n in names if _parent_gpu(n) == n]
        migs = [n for n in names if _parent_gpu(n) != n and n in overrides]
        for name in gpus + migs:
            health, message = overrides.get(name, (Health.HEALTHY, ""))
            self._board.set_health(name, health, message, source="file")
        for name in overrides.keys() - set(names):
            log.warning("health file names an unknown device", path=str(self.path), device=name)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="health-file", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                mtime = self.path.stat().st_mtime if self.path.exists() else None
                if mtime != self._last_mtime:
                    self.apply()
                    self._last_mtime = mtime
            except (OSError, ValueError) as exc:
                log.warning("cannot apply simulated health file", error=str(exc))
            self._stop.wait(self._interval)
