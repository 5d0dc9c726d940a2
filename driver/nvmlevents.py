"""GPU health events from NVML on a real node (driver.health's source for `--nvml`).

Two ways NVML reports trouble, both used:
- the event set: XID critical errors (`nvmlEventTypeXidCriticalError`, the XID in `eventData`) and
  double-bit ECC errors, waited for with `nvmlEventSetWait_v2`;
- queries that start failing or changing: `NVMLError_GpuIsLost` from any call on a GPU (it fell off
  the bus), and an NVLink that was active at start reading inactive. These are checked every
  `check_interval` seconds.

The same check notices recovery, for the conditions the GPU is in (`active`, the monitor's book):
- every class: NVML must reach the GPU under its UUID and, where the driver reports it
  (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`), ask for no recovery action; anything else keeps the taint;
- gpu-lost: that alone (the card answers again, after a reset or a re-scan brought it back);
- ecc-double-bit: also nothing pending that only a reset applies (retired pages, remapped rows) and
  the volatile uncorrectable ECC count back at 0, which only a GPU reset or driver reload does: the
  evidence that the reset happened;
- nvlink-down: also every link that was down reads active again.
A GPU must look healthy at `recovery_checks` checks in a row before a `recovered` event goes out, and a
query that fails counts as not healthy. `needs_reset()` tells the monitor which GPUs NVML still wants
reset, so a quiet period does not clear an XID that left the GPU needing one.

Any other NVML error is logged and the loop goes on: a source must never take the node agent down,
and one lost GPU must not stop the others from being watched.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog

from driver.health import EventClass, HealthEvent, HealthPolicy

log = structlog.get_logger(__name__)

Emit = Callable[[HealthEvent | None], object]
CHECK_INTERVAL_S = 5.0
Active = Callable[[int], Mapping[EventClass, str]]

# NVML's field id and values for the recovery action (nvml.h; pynvml names them the same)
FI_GPU_RECOVERY_ACTION = 230
RECOVERY_ACTION_NONE = 0
_RECOVERY_ACTIONS = {1: "GPU reset", 2: "node reboot", 3: "drain P2P", 4: "drain P2P and GPU reset",
                     5: "IMEX domain recovery", 6: "PCIe bus reset", 7: "system reboot"}
_LINK_VALUE = re.compile(r"link-([0-9]{1,4})\Z")


class NvmlEventSource:
    """Watches the GPUs with these NVML indexes and emits a HealthEvent (None: an ignored XID) per event."""

    def __init__(self, nvml: Any, gpu_indexes: Sequence[int], emit: Emit, *, policy: HealthPolicy | None = None,
                 wait_ms: int = 500, check_interval: float | None = None, clock: Callable[[], float] = time.time,
                 active: Active | None = None, uuids: Mapping[int, str] | None = None,
                 recovery_checks: int = 2) -> None:
        """`active(index)`: the conditions the GPU is in now (checked for recovery); `uuids`: the GPUs'
        UUIDs from discovery, to find a GPU that was lost at start again."""
        self._nvml = nvml
        self._indexes = list(gpu_indexes)
        self._emit = emit
        self.policy = policy or HealthPolicy()
        self._wait_ms = wait_ms
        self._check_interval = CHECK_INTERVAL_S if check_interval is None else check_interval
        self._clock = clock
        self._active = active
        self._uuids: dict[int, str] = dict(uuids or {})
        self._recovery_checks = max(1, recovery_checks)
        self._event_set: Any = None
        self._handles: dict[int, Any] = {}
        self._by_uuid: dict[str, int] = {}
        self._active_links: dict[int, list[int]] = {}
        self._lost: set[int] = set()
        self._down: set[tuple[int, int]] = set()
        self._healthy_streak: dict[tuple[int, EventClass], int] = {}
        self._wants_reset: set[int] = set()
        self._lock = threading.Lock()  # the thread and `needs_reset()` callers
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- setup ----------------------------------------------------------------------------------

    def setup(self) -> None:
        """Register every GPU for the events it supports; a GPU that cannot be registered is still checked."""
        nvml = self._nvml
        self._event_set = nvml.nvmlEventSetCreate()
        for index in self._indexes:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                self._adopt(index, handle)
                self._active_links[index] = self._links_up(handle)
            except nvml.NVMLError_GpuIsLost:
                self._lost_gpu(index, "NVML reports the GPU lost at start")
            except nvml.NVMLError as exc:
                log.warning("cannot register GPU for NVML health events", gpu=index, error=str(exc))

    def _adopt(self, index: int, handle: Any) -> None:
        """Watch this handle for `index`: its UUID, then its events where it supports them."""
        uuid = _text(self._nvml.nvmlDeviceGetUUID(handle))
        self._handles[index] = handle
        self._by_uuid[uuid] = index
        self._uuids.setdefault(index, uuid)
        self._register(index, handle)

    def _register(self, index: int, handle: Any) -> None:
        nvml = self._nvml
        wanted = nvml.nvmlEventTypeXidCriticalError | nvml.nvmlEventTypeDoubleBitEccError
        supported = nvml.nvmlDeviceGetSupportedEventTypes(handle) & wanted
        if supported:
            nvml.nvmlDeviceRegisterEvents(handle, supported, self._event_set)
        else:
            log.warning("GPU supports no health events; only lost-GPU and NVLink checks", gpu=index)

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
        """Lost GPUs, NVLinks that went down since start, and GPUs healthy again."""
        nvml = self._nvml
        for index in self._indexes:
            try:
                self._check(index)
            except nvml.NVMLError_GpuIsLost:
                self._lost_gpu(index, "NVML reports the GPU lost (fallen off the bus)")
            except nvml.NVMLError as exc:
                log.warning("NVML health check failed", gpu=index, error=str(exc))
                self._not_healthy(index)

    def needs_reset(self, gpu_index: int) -> bool:
        """Whether the last check found this GPU lost or NVML asking for a recovery action on it."""
        with self._lock:
            return gpu_index in self._lost or gpu_index in self._wants_reset

    def _check(self, index: int) -> None:
        nvml = self._nvml
        handle = self._handles.get(index)
        if index in self._lost or handle is None:
            handle = self._find_again(index)
            if handle is None:
                return
        nvml.nvmlDeviceGetUUID(handle)  # raises GpuIsLost for a card that left the bus
        for link in self._active_links.get(index, []):
            if (index, link) not in self._down and not nvml.nvmlDeviceGetNvLinkState(handle, link):
                self._down.add((index, link))
                self._emit(HealthEvent(index, EventClass.NVLINK_DOWN, f"link-{link}",
                                       f"NVLink {link} is inactive", self._clock()))
        action = self._recovery_action(handle)
        with self._lock:
            self._wants_reset.discard(index)
            if action not in (None, RECOVERY_ACTION_NONE):
                self._wants_reset.add(index)
        active = dict(self._active(index)) if self._active is not None else {}
        for cls_, value in active.items():
            if action not in (None, RECOVERY_ACTION_NONE):
                healthy = False
            elif cls_ is EventClass.GPU_LOST:
                healthy = True
            elif cls_ is EventClass.ECC_DOUBLE_BIT:
                healthy = self._ecc_reset_done(index, handle)
            elif cls_ is EventClass.NVLINK_DOWN:
                healthy = self._links_active_again(index, handle, value)
            else:
                continue  # an XID clears by its quiet period; NVML has no "healthy" for it beyond the action
            self._count_healthy(index, cls_, healthy)

    def _find_again(self, index: int) -> Any:
        """The handle of a GPU that was lost, if NVML reaches it again under its UUID; None otherwise."""
        nvml = self._nvml
        uuid = self._uuids.get(index)
        if uuid is None:
            return None  # lost before its UUID was ever read: nothing to match a card against
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            if _text(nvml.nvmlDeviceGetUUID(handle)) != uuid:
                return None
        except nvml.NVMLError:
            return None  # still gone (GpuIsLost, NotFound, ...): it stays lost
        self._handles[index] = handle
        self._by_uuid[uuid] = index
        try:
            self._register(index, handle)
        except nvml.NVMLError as exc:  # reachable all the same; the 5 s checks still watch it
            log.warning("cannot register the GPU that came back for NVML health events", gpu=index, error=str(exc))
        self._active_links.setdefault(index, [])
        if index in self._lost:
            log.info("NVML reaches the lost GPU again", gpu=index, uuid=uuid)
        with self._lock:
            self._lost.discard(index)
        return handle

    def _recovery_action(self, handle: Any) -> int | None:
        """NVML's recovery action for the GPU; None where the driver does not report one."""
        nvml = self._nvml
        fetch = getattr(nvml, "nvmlDeviceGetFieldValues", None)
        if fetch is None:
            return None
        try:
            [value] = fetch(handle, [FI_GPU_RECOVERY_ACTION])
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            return None  # a driver from before field values
        if value.nvmlReturn != 0:
            return None  # the field is unknown to this driver (NVML_ERROR_NOT_SUPPORTED and the like)
        action = int(value.value.uiVal)
        if action != RECOVERY_ACTION_NONE:
            log.debug("NVML asks for a recovery action", action=_RECOVERY_ACTIONS.get(action, action))
        return action

    def _ecc_reset_done(self, index: int, handle: Any) -> bool:
        """No reset still pending for the GPU's memory, and the volatile uncorrectable count is back at 0."""
        nvml = self._nvml
        readings: list[bool] = []  # True: this reading says the reset is done
        for name, query in (
            ("volatile uncorrectable ECC count", lambda: nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC) == 0),
            ("retired pages pending", lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)
                != nvml.NVML_FEATURE_ENABLED),
            ("row remapping pending", lambda: not nvml.nvmlDeviceGetRemappedRows(handle)[2]),
        ):
            try:
                readings.append(bool(query()))
            except nvml.NVMLError_NotSupported:
                continue
            except (nvml.NVMLError_FunctionNotFound, AttributeError):
                continue  # an older driver or pynvml without the query
            if not readings[-1]:
                log.debug("GPU memory still needs a reset", gpu=index, reading=name)
        return bool(readings) and all(readings)

    def _links_active_again(self, index: int, handle: Any, value: str) -> bool:
        nvml = self._nvml
        links = {link for (gpu, link) in self._down if gpu == index}
        if match := _LINK_VALUE.match(value):  # the link of a condition saved before this start
            links.add(int(match.group(1)))
        if not all(nvml.nvmlDeviceGetNvLinkState(handle, link) for link in links):
            return False
        self._down -= {(index, link) for link in links}
        return True

    def _count_healthy(self, index: int, cls_: EventClass, healthy: bool) -> None:
        key = (index, cls_)
        if not healthy:
            self._healthy_streak.pop(key, None)
            return
        streak = self._healthy_streak.get(key, 0) + 1
        if streak < self._recovery_checks:
            self._healthy_streak[key] = streak
            return
        self._healthy_streak.pop(key, None)
        self._emit(HealthEvent(index, EventClass.RECOVERED, cls_.value,
                               f"NVML reports the GPU healthy again ({cls_.value})", self._clock()))

    def _not_healthy(self, index: int) -> None:
        for key in [k for k in self._healthy_streak if k[0] == index]:
            del self._healthy_streak[key]

    def _lost_gpu(self, index: int, message: str) -> None:
        self._not_healthy(index)
        with self._lock:
            if index in self._lost:
                return
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
