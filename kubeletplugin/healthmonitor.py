"""GPU health events -> device taints in the node's ResourceSlices and health on kubelet's stream.

`HealthMonitor` owns the conditions of every GPU (driver.health.GpuConditions). Each event that changes
them rebuilds the slices with the new taints and hands them to the publisher, whose sync thread writes
them at once, and sets the same state on the HealthBoard, so kubelet's stream and the pods'
`allocatedResourcesStatus` say what the taints say. A thread clears the conditions whose quiet period
has passed (a transient XID), unless NVML says the GPU still needs a reset (`hold`).

Sources feed it events: kubeletplugin/healthlog.py (the event log: simulated nodes, an operator's
`reset` or `recovered`) and driver.nvmlevents (a real node).

On an NVML node, where NVML reports an event once, the conditions are saved in
`<state dir>/health-conditions.json`. During a surge rollout two instances run on the node and only
the one that publishes writes that file: the other keeps its conditions in memory, and when it takes
over it first adds the ones the old instance saved, so no taint is lost between them. A saved file
that cannot be trusted or read is moved aside (`.corrupt-<time>`), its good entries kept.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from driver.atomicfile import write_atomic
from driver.health import EventClass, GpuConditions, HealthEvent, HealthPolicy
from driver.model import Inventory
from driver.slices import build_slices
from kubeletplugin.health import Health, HealthBoard
from kubeletplugin.healthlog import untrusted
from kubeletplugin.metrics import PluginMetrics

log = structlog.get_logger(__name__)

HEALTH_SOURCE = "gpu-events"
MAX_SAVED_BYTES = 1024 * 1024  # tessera writes a few KiB at most

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
        saving: bool = True,
        clock: Callable[[], float] = time.time,
        tick_interval: float = 1.0,
    ) -> None:
        """`saving` False: keep `state_file` as it is until `take_over()` (a standby instance of a rollout)."""
        self.inventory = inventory
        self.policy = policy or HealthPolicy()
        self._mig_strategy = mig_strategy
        self._board = board
        self._publish = publish
        self._metrics = metrics
        self._clock = clock
        self._tick_interval = tick_interval
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._conditions = GpuConditions(self.policy)
        self._dirty = False  # a quiet period restarted since the last save
        # GPUs whose conditions must outlast their quiet period (NVML says a reset is still needed)
        self.hold: Callable[[int], bool] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # NVML reports an event once: its conditions are kept here so an agent restart (a rolling
        # upgrade) does not drop a NoExecute taint the GPU still deserves.
        self._state_file = state_file
        self._saving = saving and state_file is not None
        if state_file is not None:
            saved = self._read_saved()
            if saved is not None:
                self._conditions = saved
                log.info("GPU health conditions restored", path=str(state_file), gpus=saved.affected())

    # -- the saved conditions ---------------------------------------------------------------------

    def _read_saved(self) -> GpuConditions | None:
        """The conditions in the state file; a file that cannot be trusted or read is moved aside."""
        path = self._state_file
        assert path is not None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:  # a symbolic link (ELOOP), no permission, EIO
            self._move_aside(f"cannot be opened: {exc.strerror}")
            return None
        with os.fdopen(fd, "rb") as f:
            problem = untrusted(os.fstat(f.fileno()))
            data = b"" if problem else f.read(MAX_SAVED_BYTES + 1)
        if problem or len(data) > MAX_SAVED_BYTES:
            self._move_aside(problem or f"larger than {MAX_SAVED_BYTES} bytes")
            return None
        book = GpuConditions(self.policy)
        try:
            problems = book.load_json(json.loads(data), str(path))
        except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deep, not an object
            self._move_aside(str(exc)[:300] or type(exc).__name__)
            return None
        if problems:
            for problem in problems:
                log.warning("skipping a bad entry of the saved GPU health conditions", path=str(path),
                            error=problem[:300])
            self._move_aside(f"{len(problems)} bad entr{'y' if len(problems) == 1 else 'ies'}; the good ones are kept")
        known = set(self.gpu_indexes)
        for index in book.affected():
            if index not in known:
                log.warning("saved GPU health conditions name a GPU this node no longer has", gpu=index)
        return book

    def _move_aside(self, reason: str) -> None:
        assert self._state_file is not None
        aside = self._state_file.with_name(
            f"{self._state_file.name}.corrupt-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S.%fZ')}")
        try:
            os.rename(self._state_file, aside)
        except OSError as exc:
            log.error("saved GPU health conditions unusable and cannot be moved aside; ignoring them",
                      path=str(self._state_file), reason=reason, error=str(exc))
            return
        log.error("saved GPU health conditions unusable; moved aside", path=str(self._state_file),
                  moved_to=str(aside), reason=reason)

    def _save(self) -> None:
        # called with self._lock held
        self._dirty = False
        if not self._saving:
            return
        assert self._state_file is not None
        try:
            write_atomic(self._state_file, (json.dumps(self._conditions.to_json(), sort_keys=True) + "\n").encode(),
                         0o600)
        except OSError as exc:  # the taints are published anyway; only a restart would forget them
            log.error("cannot save GPU health conditions", path=str(self._state_file), error=str(exc))

    def take_over(self) -> None:
        """This instance publishes from now on: add what the previous publisher saved, save, publish."""
        if self._state_file is None:
            return
        saved = self._read_saved()
        with self._lock:
            added = saved is not None and self._conditions.merge(saved)
            self._saving = True
            self._save()
        if added:
            log.info("GPU health conditions taken over from the saved file", path=str(self._state_file),
                     gpus=self._conditions.affected())
        self.refresh()

    # -- events -----------------------------------------------------------------------------------

    @property
    def gpu_indexes(self) -> list[int]:
        return [g.index for g in self.inventory.gpus]

    def active_conditions(self, gpu_index: int) -> dict[EventClass, str]:
        """The classes this GPU is in now, with their values (a source checks them for recovery)."""
        with self._lock:
            return self._conditions.active(gpu_index)

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
            else:
                self._dirty = True
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

    def expire(self) -> bool:
        """Clear the conditions whose quiet period has passed; True when any was cleared."""
        with self._lock:
            gone = self._conditions.expire(self._clock(), hold=self.hold)
            if gone or self._dirty:
                self._save()
        for index, cond in gone:
            log.info("GPU health condition cleared: no new event in its quiet period", gpu=index,
                     event_class=cond.event.value, value=cond.value,
                     quiet_s=self.policy.rules[cond.event].clear_after)
        if gone:
            self.refresh()
        return bool(gone)

    def start(self) -> None:
        """Clear what has already expired (a replayed log's old XIDs), then keep doing so."""
        self.expire()
        self._thread = threading.Thread(target=self._run, name="health-quiet-periods", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._tick_interval):
            try:
                self.expire()
            except Exception:  # the next tick tries again; publishing must not stop over one bad tick
                log.exception("cannot clear expired GPU health conditions")

    # -- publishing -------------------------------------------------------------------------------

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
