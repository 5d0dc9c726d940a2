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


# -- recovery: NVML says the GPU is healthy again after a reset (issue 25 item 4) --------------------


class Book:
    """The monitor's side, reduced to what the source asks: which conditions each GPU is in."""

    def __init__(self) -> None:
        self.active: dict[int, dict[EventClass, str]] = {}
        self.events: list[HealthEvent] = []

    def emit(self, event: HealthEvent | None) -> None:
        if event is None:
            return
        self.events.append(event)
        conds = self.active.setdefault(event.gpu_index, {})
        if event.event is EventClass.RECOVERED:
            conds.pop(EventClass(event.value), None)
        else:
            conds[event.event] = event.value

    def recovered(self) -> list[tuple[int, str]]:
        return [(e.gpu_index, e.value) for e in self.events if e.event is EventClass.RECOVERED]


def watched(nvml: FakeNvml, **kwargs: object) -> tuple[NvmlEventSource, Book]:
    book = Book()
    uuids = {i: g.uuid for i, g in enumerate(nvml.gpus)}
    src = NvmlEventSource(nvml, range(len(nvml.gpus)), book.emit, clock=lambda: T0,
                          active=lambda i: dict(book.active.get(i, {})), uuids=uuids, **kwargs)  # type: ignore[arg-type]
    nvml.nvmlInit()
    src.setup()
    return src, book


def test_double_bit_ecc_clears_after_a_reset_once_nvml_reads_healthy_twice() -> None:
    nvml = dgx_h100_node().nvml
    src, book = watched(nvml)
    nvml.double_bit_ecc(3)
    assert src.wait_once(0) == 1 and book.active[3] == {EventClass.ECC_DOUBLE_BIT: "double-bit"}
    for _ in range(3):
        src.check_devices()  # no reset yet: NVML asks for one, the volatile count is 1, a row remap pending
    assert book.recovered() == [] and src.needs_reset(3)
    nvml.reset_gpu(3)
    src.check_devices()
    assert book.recovered() == [] and not src.needs_reset(3)  # one healthy reading is not enough
    src.check_devices()
    assert book.recovered() == [(3, "ecc-double-bit")] and book.active[3] == {}


@pytest.mark.parametrize("still_pending", ["recovery_action", "volatile_uncorrected", "retired_pages_pending",
                                           "row_remap_pending"])
def test_any_reading_that_still_wants_a_reset_keeps_the_ecc_condition(still_pending: str) -> None:
    nvml = dgx_h100_node().nvml
    src, book = watched(nvml)
    book.emit(HealthEvent(1, EventClass.ECC_DOUBLE_BIT, "double-bit", "saved before a restart", T0))
    setattr(nvml.gpus[1], still_pending, {"recovery_action": 1, "volatile_uncorrected": 2}.get(still_pending, True))
    for _ in range(4):
        src.check_devices()
    assert book.recovered() == []


@pytest.mark.parametrize("driver", ["field-unknown", "no-field-values"])
def test_a_driver_without_the_recovery_action_field_falls_back_to_the_ecc_counters(driver: str) -> None:
    nvml = dgx_h100_node().nvml
    for gpu in nvml.gpus:
        gpu.recovery_action = None
    if driver == "no-field-values":  # libnvidia-ml from before nvmlDeviceGetFieldValues
        nvml.failures["nvmlDeviceGetFieldValues"] = pynvml.NVMLError_FunctionNotFound
    src, book = watched(nvml)
    nvml.double_bit_ecc(0)
    src.wait_once(0)
    src.check_devices()
    src.check_devices()
    assert book.recovered() == []
    nvml.reset_gpu(0)
    src.check_devices()
    src.check_devices()
    assert book.recovered() == [(0, "ecc-double-bit")]


def test_no_readable_ecc_signal_or_a_failing_query_keeps_the_condition() -> None:
    nvml = dgx_h100_node().nvml
    gpu = nvml.gpus[2]
    gpu.recovery_action = gpu.volatile_uncorrected = gpu.retired_pages_pending = gpu.row_remap_pending = None
    src, book = watched(nvml)
    book.emit(HealthEvent(2, EventClass.ECC_DOUBLE_BIT, "double-bit", "m", T0))
    book.emit(HealthEvent(4, EventClass.ECC_DOUBLE_BIT, "double-bit", "m", T0))
    nvml.gpus[4].failures["nvmlDeviceGetTotalEccErrors"] = pynvml.NVMLError_Unknown
    for _ in range(4):
        src.check_devices()
    assert book.recovered() == []  # nothing says the reset happened on GPU 2; GPU 4 cannot be read


def test_a_lost_gpu_recovers_once_nvml_reaches_it_again_under_its_uuid() -> None:
    nvml = dgx_h100_node().nvml
    src, book = watched(nvml)
    nvml.gpus[5].lost = True
    src.check_devices()
    assert book.active[5] == {EventClass.GPU_LOST: "fallen-off-bus"} and src.needs_reset(5)
    src.check_devices()
    assert [e.event for e in book.events] == [EventClass.GPU_LOST]  # reported once
    nvml.reset_gpu(5)
    src.check_devices()
    src.check_devices()
    assert book.recovered() == [(5, "gpu-lost")] and not src.needs_reset(5)
    nvml.pending_events.append((5, pynvml.nvmlEventTypeXidCriticalError, 94))
    assert src.wait_once(0) == 1, "events are registered again for the GPU that came back"


def test_a_gpu_lost_at_start_is_found_again_by_the_uuid_discovery_gave() -> None:
    nvml = dgx_h100_node().nvml
    nvml.gpus[6].lost = True
    src, book = watched(nvml)
    assert book.active[6] == {EventClass.GPU_LOST: "fallen-off-bus"}
    nvml.gpus[6].uuid = "GPU-another-card-in-the-slot"
    nvml.reset_gpu(6)
    for _ in range(3):
        src.check_devices()
    assert book.recovered() == []  # a different card is not the lost one coming back
    nvml.gpus[6].uuid = "GPU-a1b2c3d4-0000-1111-2222-000000000006"
    src.check_devices()
    src.check_devices()
    assert book.recovered() == [(6, "gpu-lost")]


def test_a_recovery_action_keeps_a_lost_gpu_that_answers_again() -> None:
    nvml = dgx_h100_node().nvml
    src, book = watched(nvml)
    book.emit(HealthEvent(7, EventClass.GPU_LOST, "fallen-off-bus", "saved", T0))
    nvml.gpus[7].recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
    for _ in range(3):
        src.check_devices()
    assert book.recovered() == [] and src.needs_reset(7)


def test_an_nvlink_that_is_active_again_recovers_including_one_saved_before_a_restart() -> None:
    nvml = dgx_h100_node().nvml
    nvml.gpus[1].links[9].active = False  # type: ignore[index]
    src, book = watched(nvml)
    book.emit(HealthEvent(1, EventClass.NVLINK_DOWN, "link-9", "saved before this start", T0))
    nvml.gpus[0].links[3].active = False  # type: ignore[index]
    src.check_devices()
    assert book.active[0] == {EventClass.NVLINK_DOWN: "link-3"}
    src.check_devices()
    assert book.recovered() == []
    nvml.gpus[0].links[3].active = True  # type: ignore[index]
    nvml.gpus[1].links[9].active = True  # type: ignore[index]
    src.check_devices()
    src.check_devices()
    assert sorted(book.recovered()) == [(0, "nvlink-down"), (1, "nvlink-down")]
    nvml.gpus[0].links[3].active = False  # type: ignore[index]
    src.check_devices()
    assert book.active[0] == {EventClass.NVLINK_DOWN: "link-3"}, "a link that goes down again is reported again"


def test_xid_conditions_are_left_to_their_quiet_period_but_held_while_nvml_wants_a_reset() -> None:
    nvml = dgx_h100_node().nvml
    src, book = watched(nvml)
    nvml.pending_events.append((2, pynvml.nvmlEventTypeXidCriticalError, 94))
    src.wait_once(0)
    nvml.gpus[2].recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    src.check_devices()
    src.check_devices()
    assert book.recovered() == [] and src.needs_reset(2)
    nvml.reset_gpu(2)
    src.check_devices()
    assert book.recovered() == [] and not src.needs_reset(2)


def test_a_gpu_that_comes_back_but_cannot_be_registered_for_events_still_recovers() -> None:
    nvml = dgx_h100_node().nvml
    src, book = watched(nvml)
    nvml.gpus[3].lost = True
    src.check_devices()
    nvml.reset_gpu(3)
    nvml.gpus[3].failures["nvmlDeviceRegisterEvents"] = pynvml.NVMLError_Unknown
    src.check_devices()
    src.check_devices()
    assert book.recovered() == [(3, "gpu-lost")]
