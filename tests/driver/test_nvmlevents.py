"""NVML health events (driver.nvmlevents) against the NVML stand-in: XIDs, ECC, lost GPUs, NVLinks, errors."""

from __future__ import annotations

import pynvml
import pytest

from driver.health import EventClass, HealthEvent
from driver.nvmlevents import NvmlEventSource
from tests.fakes.nvml import FakeNvml, dgx_h100_node

T0 = 1_790_000_000.0


def source(nvml: FakeNvml) -> tuple[NvmlEventSource, list[HealthEvent | None]]:
    got: list[HealthEvent | None] = []
    src = NvmlEventSource(nvml, range(len(nvml.gpus)), got.append, clock=lambda: T0)
    nvml.nvmlInit()
    src.setup()
    return src, got


def test_critical_xids_and_double_bit_ecc_become_events_and_application_xids_are_ignored() -> None:
    nvml = dgx_h100_node().nvml
    src, got = source(nvml)
    assert set(nvml.registered) == set(range(8))
    nvml.pending_events += [(2, pynvml.nvmlEventTypeXidCriticalError, 79),
                            (3, pynvml.nvmlEventTypeXidCriticalError, 13),
                            (4, pynvml.nvmlEventTypeDoubleBitEccError, 0),
                            (5, pynvml.nvmlEventTypeXidCriticalError, 94)]
    assert [src.wait_once(0) for _ in range(5)] == [1, 1, 1, 1, 0]  # the last wait times out
    assert got[0] == HealthEvent(2, EventClass.GPU_LOST, "fallen-off-bus", "GPU has fallen off the bus (XID 79)", T0)
    assert got[1] is None
    assert got[2] is not None and (got[2].gpu_index, got[2].event) == (4, EventClass.ECC_DOUBLE_BIT)
    assert got[3] is not None and (got[3].event, got[3].value) == (EventClass.XID, "94")


def test_a_gpu_that_falls_off_the_bus_is_reported_once_and_the_others_are_still_watched() -> None:
    nvml = dgx_h100_node().nvml
    src, got = source(nvml)
    nvml.gpus[1].failures["nvmlDeviceGetUUID"] = pynvml.NVMLError_GpuIsLost
    src.check_devices()
    src.check_devices()
    assert [(e.gpu_index, e.event) for e in got if e] == [(1, EventClass.GPU_LOST)]
    nvml.pending_events.append((6, pynvml.nvmlEventTypeDoubleBitEccError, 0))
    assert src.wait_once(0) == 1


def test_an_nvlink_that_goes_inactive_is_reported_once() -> None:
    nvml = dgx_h100_node().nvml
    src, got = source(nvml)
    nvml.gpus[0].links[3].active = False  # type: ignore[index]
    src.check_devices()
    src.check_devices()
    assert [(e.gpu_index, e.event, e.value) for e in got if e] == [(0, EventClass.NVLINK_DOWN, "link-3")]


def test_nvml_errors_are_survived() -> None:
    nvml = dgx_h100_node().nvml
    nvml.gpus[5].failures["nvmlDeviceRegisterEvents"] = pynvml.NVMLError_Unknown
    src, got = source(nvml)
    assert 5 not in nvml.registered and 4 in nvml.registered
    nvml.failures["nvmlEventSetWait_v2"] = pynvml.NVMLError_Unknown
    with pytest.raises(pynvml.NVMLError_Unknown):
        src.wait_once(0)  # surfaced to the loop, which logs and retries (below)
    del nvml.failures["nvmlEventSetWait_v2"]
    nvml.gpus[2].failures["nvmlDeviceGetUUID"] = pynvml.NVMLError_Unknown
    src.check_devices()  # a failing query on one GPU: logged, no event, no crash
    assert got == []


def test_the_thread_keeps_running_through_errors_and_stops() -> None:
    nvml = dgx_h100_node().nvml
    got: list[HealthEvent | None] = []
    nvml.nvmlInit()
    nvml.failures["nvmlEventSetWait_v2"] = pynvml.NVMLError_Unknown
    src = NvmlEventSource(nvml, range(8), got.append, wait_ms=10, check_interval=0.01)
    src.start()
    import time

    time.sleep(0.1)
    del nvml.failures["nvmlEventSetWait_v2"]
    nvml.pending_events.append((7, pynvml.nvmlEventTypeXidCriticalError, 48))
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        time.sleep(0.02)
    src.stop()
    assert got and got[0] is not None and got[0].event is EventClass.ECC_DOUBLE_BIT
    assert nvml.event_sets == 0
