"""GPU health events -> device taints in the node's ResourceSlices and health on kubelet's stream.

`HealthMonitor` owns the conditions of every GPU (driver.health.GpuConditions). Each event that changes
them rebuilds the slices with the new taints and hands them to the publisher, whose sync thread writes
them at once (well inside the 2 s the issue asks for), and sets the same state on the HealthBoard, so
kubelet's stream and the pods' `allocatedResourcesStatus` say what the taints say.

Sources feed it events:
- `EventLogSource` (simulated profiles, demos, e2e): an append-only JSON-lines file in the state dir,
  one event per line (`tessera inject-health-event` writes it). It is replayed from the start when the
  agent starts, so conditions survive a restart of the agent; a file that shrinks (deleted or rewritten)
  starts the book over.
- driver.nvmlevents (a real node): NVML's event set.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from driver.atomicfile import write_atomic
from driver.health import GpuConditions, HealthEvent, HealthPolicy, parse_event
from driver.model import Inventory
from driver.slices import build_slices
from kubeletplugin.health import Health, HealthBoard
from kubeletplugin.metrics import PluginMetrics

log = structlog.get_logger(__name__)

EVENT_LOG_FILE = "health-events.jsonl"
HEALTH_SOURCE = "gpu-events"

Obj = dict[str, Any]


class HealthMonitor:
    """Folds events into GPU conditions and pushes every change to the slices and the health board."""

    def __init__(
        self,
        inventory: Inventory,
        mig_strategy: str,
        board: HealthBoard,
        publish: Callable[[list[Obj]], None],
        *,
        policy: HealthPolicy | None = None,
        metrics: PluginMetrics | None = None,
        state_file: Path | None = None,
    ) -> None:
        self.inventory = inventory
        self.policy = policy or HealthPolicy()
        self._mig_strategy = mig_strategy
        self._board = board
        self._publish = publish
        self._metrics = metrics
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._conditions = GpuConditions(self.policy)
        # NVML reports an event once: its conditions are kept here so an agent restart (a rolling
        # upgrade) does not drop a NoExecute taint the GPU still deserves.
        self._state_file = state_file
        if state_file is not None:
            self._load()

    def _load(self) -> None:
        assert self._state_file is not None
        try:
            raw = json.loads(self._state_file.read_text())
            self._conditions.load_json(raw, str(self._state_file))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:  # JSONDecodeError is a ValueError
            log.error("cannot read the saved GPU health conditions; starting without them", error=str(exc))
            return
        known = set(self.gpu_indexes)
        for index in self._conditions.affected():
            if index not in known:
                log.warning("saved GPU health conditions name a GPU this node no longer has", gpu=index)
        log.info("GPU health conditions restored", gpus=self._conditions.affected())

    def _save(self) -> None:
        if self._state_file is None:
            return
        try:
            write_atomic(self._state_file, (json.dumps(self._conditions.to_json(), sort_keys=True) + "\n").encode(),
                         0o600)
        except OSError as exc:  # the taints are published anyway; only a restart would forget them
            log.error("cannot save GPU health conditions", path=str(self._state_file), error=str(exc))

    @property
    def gpu_indexes(self) -> list[int]:
        return [g.index for g in self.inventory.gpus]

    def slices(self) -> list[Obj]:
        """The node's slices with the current taints."""
        with self._lock:
            return build_slices(self.inventory, mig_strategy=self._mig_strategy,
                                taints=self._conditions.taints_by_gpu())

    def handle(self, event: HealthEvent | None) -> bool:
        """Apply one event (None: an ignored XID, counted only); True when anything changed."""
        if self._metrics is not None:
            self._metrics.health_events.labels(event_class=event.event.value if event else "ignored").inc()
        if event is None:
            return False
        with self._lock:
            changed = self._conditions.apply(event)
            if changed:
                self._save()
        log.info("GPU health event", gpu=event.gpu_index, event_class=event.event.value, value=event.value,
                 message=event.message, changed=changed)
        if changed:
            self.refresh()
        return changed

    def reset_all(self) -> None:
        """Forget every condition (the event log was rewritten from scratch)."""
        with self._lock:
            self._conditions = GpuConditions(self.policy)
            self._save()
        self.refresh()

    def refresh(self) -> None:
        """Publish the current taints and health, whether or not they changed."""
        # Sources run in their own threads: one refresh at a time, so an older state never lands last.
        with self._refresh_lock:
            self._refresh()

    def _refresh(self) -> None:
        slices = self.slices()
        self._publish(slices)
        with self._lock:
            per_gpu = {g.index: self._conditions.message(g.index) for g in self.inventory.gpus}
        for gpu in self.inventory.gpus:
            message = per_gpu[gpu.index]
            # a GPU that is not published (MIG mode under mig-strategy none) has no health to report
            with contextlib.suppress(KeyError):
                self._board.set_health(gpu.device_name, Health.UNHEALTHY if message else Health.HEALTHY, message,
                                       source=HEALTH_SOURCE)
        if self._metrics is not None:
            effects: dict[str, int] = {"None": 0, "NoSchedule": 0, "NoExecute": 0}
            for s in slices:
                for device in s["spec"].get("devices") or []:
                    for effect in {t["effect"] for t in device.get("taints") or []}:
                        effects[effect] += 1
            for effect, count in effects.items():
                self._metrics.tainted_devices.labels(effect=effect).set(count)


class EventLogSource:
    """Tails `<state dir>/health-events.jsonl` and hands each complete line's event to the monitor."""

    def __init__(self, path: Path, monitor: HealthMonitor, *, interval: float = 0.2, replay: bool = True,
                 clock: Callable[[], float] = time.time) -> None:
        """`replay` False (NVML nodes, where the log is only an operator's channel and the conditions are
        saved elsewhere): lines already in the file at start are skipped, and a shrinking file only moves
        the read position, it does not start the book over."""
        self.path = path
        self._replay = replay
        self._monitor = monitor
        self._interval = interval
        self._clock = clock
        self._offset = 0
        self._line = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> int:
        """Apply the lines appended since the last poll; returns how many events were read."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size < self._offset:
            self._offset = self._line = 0
            if not self._replay:
                log.info("health event log shrank; reading on from its new end", path=str(self.path))
                self._offset = size
                return 0
            log.info("health event log shrank; starting over", path=str(self.path))
            self._monitor.reset_all()
        if size == self._offset:
            return 0
        with self.path.open("rb") as f:
            f.seek(self._offset)
            chunk = f.read(size - self._offset)
        end = chunk.rfind(b"\n") + 1  # a line still being written waits for its newline
        read = 0
        for raw in chunk[:end].splitlines():
            self._line += 1
            if not raw.strip():
                continue
            where = f"{self.path}: line {self._line}"
            try:
                decoded = json.loads(raw)
                event = parse_event(decoded, where, gpu_indexes=self._monitor.gpu_indexes,
                                    default_time=self._clock(), policy=self._monitor.policy)
            except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
                log.warning("ignoring a bad line in the health event log", error=str(exc), path=str(self.path),
                            line=self._line)
                continue
            self._monitor.handle(event)  # None: an XID the policy ignores
            read += 1
        self._offset += end
        return read

    def start(self) -> None:
        if self._replay:
            self.poll()  # replay what is there before kubelet can ask for anything
        else:
            try:
                self._offset = self.path.stat().st_size
            except FileNotFoundError:
                self._offset = 0
        self._thread = threading.Thread(target=self._run, name="health-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.poll()
            except Exception:  # never let a source take the agent down; the next poll tries again
                log.exception("cannot read the health event log", path=str(self.path))


def append_event(path: Path, event: dict[str, Any]) -> None:
    """Append one event line (what `tessera inject-health-event` does); one write, so readers see it whole."""
    line = json.dumps(event, sort_keys=True) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(line)
