"""GPU health events from NVML on a real node (driver.health's source for `--nvml`).

Two ways NVML reports trouble, both used:
- the event set: XID critical errors (`nvmlEventTypeXidCriticalError`, the XID in `eventData`) and
  double-bit ECC errors, waited for with `nvmlEventSetWait_v2`;
- queries that start failing or changing: `NVMLError_GpuIsLost` from any call on a GPU (it fell off
  the bus), and an NVLink that was active at start reading inactive. These are checked every
  `check_interval` seconds.

Any other NVML error is logged and the loop goes on: a source must never take the node agent down,
and one lost GPU must not stop the others from being watched.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from driver.health import EventClass, HealthEvent, HealthPolicy

log = structlog.get_logger(__name__)

Emit = Callable[[HealthEvent | None], object]


class NvmlEventSource:
    """Watches the GPUs with these NVML indexes and emits a HealthEvent (None: an ignored XID) per event."""

    def __init__(self, nvml: Any, gpu_indexes: Sequence[int], emit: Emit, *, policy: HealthPolicy | None = None,
                 wait_ms: int = 500, check_interval: float = 5.0, clock: Callable[[], float] = time.time) -> None:
        self._nvml = nvml
        self._indexes = list(gpu_indexes)
        self._emit = emit
        self.policy = policy or HealthPolicy()
        self._wait_ms = wait_ms
        self._check_interval = check_interval
        self._clock = clock
        self._event_set: Any = None
        self._handles: dict[int, Any] = {}
        self._by_uuid: dict[str, int] = {}
        self._active_links: dict[int, list[int]] = {}
        self._lost: set[int] = set()
        self._down: set[tuple[int, int]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- setup ----------------------------------------------------------------------------------

    def setup(self) -> None:
        """Register every GPU for the events it supports; a GPU that cannot be registered is still checked."""
        nvml = self._nvml
        self._event_set = nvml.nvmlEventSetCreate()
        wanted = nvml.nvmlEventTypeXidCriticalError | nvml.nvmlEventTypeDoubleBitEccError
        for index in self._indexes:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                self._handles[index] = handle
                self._by_uuid[_text(nvml.nvmlDeviceGetUUID(handle))] = index
                self._active_links[index] = self._links_up(handle)
                supported = nvml.nvmlDeviceGetSupportedEventTypes(handle) & wanted
                if supported:
                    nvml.nvmlDeviceRegisterEvents(handle, supported, self._event_set)
                else:
                    log.warning("GPU supports no health events; only lost-GPU and NVLink checks", gpu=index)
            except nvml.NVMLError_GpuIsLost:
                self._lost_gpu(index, "NVML reports the GPU lost at start")
            except nvml.NVMLError as exc:
                log.warning("cannot register GPU for NVML health events", gpu=index, error=str(exc))

    def _links_up(self, handle: Any) -> list[int]:
        nvml = self._nvml
        up = []
        for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if nvml.nvmlDeviceGetNvLinkState(handle, link):
                    up.append(link)
            except nvml.NVMLError_GpuIsLost:
                raise
            except nvml.NVMLError:
                break  # NotSupported / InvalidArgument: no (more) links
        return up

    # -- events ---------------------------------------------------------------------------------

    def wait_once(self, timeout_ms: int | None = None) -> int:
        """Wait for one event set entry; returns how many events were emitted (0 on timeout)."""
        nvml = self._nvml
        if self._event_set is None:
            return 0
        try:
            data = nvml.nvmlEventSetWait_v2(self._event_set, self._wait_ms if timeout_ms is None else timeout_ms)
        except nvml.NVMLError_Timeout:
            return 0
        except nvml.NVMLError_GpuIsLost:
            # The wait does not say which GPU; the next check finds it.
            self.check_devices()
            return 0
        try:
            index = self._by_uuid[_text(nvml.nvmlDeviceGetUUID(data.device))]
        except (nvml.NVMLError, KeyError) as exc:
            log.warning("NVML event for a GPU that cannot be identified", error=str(exc),
                        event_type=int(data.eventType), event_data=int(data.eventData))
            return 0
        now = self._clock()
        if data.eventType & nvml.nvmlEventTypeXidCriticalError:
            self._emit(self.policy.classify_xid(index, int(data.eventData), time=now))
        elif data.eventType & nvml.nvmlEventTypeDoubleBitEccError:
            self._emit(HealthEvent(index, EventClass.ECC_DOUBLE_BIT, "double-bit",
                                   "double-bit ECC error reported by NVML", now))
        else:
            return 0
        return 1

    def check_devices(self) -> None:
        """Lost GPUs and NVLinks that went down since start."""
        nvml = self._nvml
        for index, handle in self._handles.items():
            if index in self._lost:
                continue
            try:
                nvml.nvmlDeviceGetUUID(handle)
                for link in self._active_links.get(index, []):
                    if (index, link) in self._down:
                        continue
                    if not nvml.nvmlDeviceGetNvLinkState(handle, link):
                        self._down.add((index, link))
                        self._emit(HealthEvent(index, EventClass.NVLINK_DOWN, f"link-{link}",
                                               f"NVLink {link} is inactive", self._clock()))
            except nvml.NVMLError_GpuIsLost:
                self._lost_gpu(index, "NVML reports the GPU lost (fallen off the bus)")
            except nvml.NVMLError as exc:
                log.warning("NVML health check failed", gpu=index, error=str(exc))

    def _lost_gpu(self, index: int, message: str) -> None:
        self._lost.add(index)
        self._emit(HealthEvent(index, EventClass.GPU_LOST, "fallen-off-bus", message, self._clock()))

    # -- thread ---------------------------------------------------------------------------------

    def start(self) -> None:
        self.setup()
        self._thread = threading.Thread(target=self._run, name="nvml-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._wait_ms / 1000 + 2)
        if self._event_set is not None:
            try:
                self._nvml.nvmlEventSetFree(self._event_set)
            except Exception as exc:  # at shutdown nothing more can be done about it
                log.debug("cannot free the NVML event set", error=str(exc))

    def _run(self) -> None:
        next_check = 0.0
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_check:
                    self.check_devices()
                    next_check = time.monotonic() + self._check_interval
                self.wait_once()
            except Exception:  # never let the source take the agent down
                log.exception("NVML health source failed; retrying")
                self._stop.wait(1.0)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
