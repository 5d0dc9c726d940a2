"""driver.health: event classes, the XID ignore list, policy from chart values, conditions -> taints."""

from __future__ import annotations

from typing import Any

import pytest

from driver.health import (
    EventClass,
    GpuConditions,
    HealthEvent,
    HealthPolicy,
    parse_event,
    taint_time,
)

T0 = 1_790_000_000.0


def ev(gpu: int, cls: EventClass, value: str = "", t: float = T0) -> HealthEvent:
    return HealthEvent(gpu, cls, value, f"{cls.value} happened", t)


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68])
def test_application_caused_xids_are_ignored_by_default(xid: int) -> None:
    assert HealthPolicy().classify_xid(0, xid, time=T0) is None


def test_xid_79_is_gpu_lost_48_is_double_bit_ecc_and_others_are_critical_xids() -> None:
    policy = HealthPolicy()
    lost = policy.classify_xid(1, 79, time=T0)
    assert lost is not None and (lost.event, lost.value) == (EventClass.GPU_LOST, "fallen-off-bus")
    dbe = policy.classify_xid(1, 48, time=T0)
    assert dbe is not None and dbe.event is EventClass.ECC_DOUBLE_BIT
    other = policy.classify_xid(1, 94, time=T0)
    assert other is not None and (other.event, other.value) == (EventClass.XID, "94")


def test_the_ignore_list_is_configurable() -> None:
    policy = HealthPolicy.from_mapping({"ignoredXids": [94]})
    assert policy.classify_xid(0, 94, time=T0) is None
    assert policy.classify_xid(0, 13, time=T0) is not None


def test_default_policy_maps_each_class_to_its_taint() -> None:
    book = GpuConditions()
    for cls, value in ((EventClass.XID, "94"), (EventClass.ECC_DOUBLE_BIT, "double-bit"),
                       (EventClass.GPU_LOST, "fallen-off-bus"), (EventClass.NVLINK_DOWN, "link-3")):
        assert book.apply(ev(0, cls, value))
    assert book.taints(0) == [
        {"key": "gpu.tessera.dev/ecc-double-bit", "value": "double-bit", "effect": "NoExecute",
         "timeAdded": taint_time(T0)},
        {"key": "gpu.tessera.dev/gpu-lost", "value": "fallen-off-bus", "effect": "NoExecute",
         "timeAdded": taint_time(T0)},
        {"key": "gpu.tessera.dev/nvlink-down", "value": "link-3", "effect": "NoSchedule",
         "timeAdded": taint_time(T0)},
        {"key": "gpu.tessera.dev/xid", "value": "94", "effect": "NoSchedule", "timeAdded": taint_time(T0)},
    ]
    assert book.taints(1) == [] and book.affected() == [0]


def test_a_repeated_condition_keeps_its_first_time_and_reports_no_change() -> None:
    book = GpuConditions()
    assert book.apply(ev(0, EventClass.ECC_DOUBLE_BIT, "double-bit", T0))
    assert not book.apply(ev(0, EventClass.ECC_DOUBLE_BIT, "double-bit", T0 + 50))
    assert book.taints(0)[0]["timeAdded"] == taint_time(T0)


def test_reset_clears_what_clears_on_reset_but_never_gpu_lost() -> None:
    book = GpuConditions()
    book.apply(ev(0, EventClass.ECC_DOUBLE_BIT, "double-bit"))
    book.apply(ev(1, EventClass.GPU_LOST, "fallen-off-bus"))
    assert book.apply(ev(0, EventClass.RESET))
    assert book.taints(0) == [] and book.message(0) == ""
    assert not book.apply(ev(1, EventClass.RESET))
    assert [t["key"] for t in book.taints(1)] == ["gpu.tessera.dev/gpu-lost"]


def test_policy_can_change_effect_and_keep_a_condition_across_resets() -> None:
    policy = HealthPolicy.from_mapping({"taints": {"ecc-double-bit": {"effect": "NoSchedule", "clearsOnReset": False}}})
    book = GpuConditions(policy)
    book.apply(ev(0, EventClass.ECC_DOUBLE_BIT, "double-bit"))
    book.apply(ev(0, EventClass.RESET))
    assert [t["effect"] for t in book.taints(0)] == ["NoSchedule"]


def test_message_names_tessera_and_every_condition() -> None:
    book = GpuConditions()
    book.apply(HealthEvent(0, EventClass.GPU_LOST, "fallen-off-bus", "GPU has fallen off the bus", T0))
    assert book.message(0) == "tessera: gpu-lost: GPU has fallen off the bus"


@pytest.mark.parametrize(("raw", "message"), [
    ([], r"health: must be a mapping"),
    ({"taints": {"ecc": {}}}, r"health\.taints\.ecc: unknown health event 'ecc'"),
    ({"taints": {"xid": {"effect": "Evict"}}}, r"health\.taints\.xid\.effect: must be one of None, NoSchedule"),
    ({"taints": {"gpu-lost": {"clearsOnReset": True}}}, r"health\.taints\.gpu-lost\.clearsOnReset: .*never"),
    ({"taints": {"xid": {"clearsOnReset": "yes"}}}, r"clearsOnReset: must be true or false"),
    ({"taints": {"reset": {}}}, r"health\.taints\.reset: a reset clears taints"),
    ({"ignoredXids": ["13"]}, r"health\.ignoredXids: must be a list of positive XID numbers"),
    ({"ignoreXids": [13]}, r"unknown field\(s\) ignoreXids"),
])
def test_bad_policy_values_name_the_field(raw: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HealthPolicy.from_mapping(raw)


def test_parse_event_accepts_each_class() -> None:
    policy = HealthPolicy()
    parse = lambda raw: parse_event(raw, "line 1", gpu_indexes=[0, 1], default_time=T0, policy=policy)  # noqa: E731
    assert parse({"gpu": 1, "event": "xid", "xid": 13}) is None
    lost = parse({"gpu": 1, "event": "xid", "xid": 79, "time": T0 + 1})
    assert lost == HealthEvent(1, EventClass.GPU_LOST, "fallen-off-bus", "GPU has fallen off the bus (XID 79)",
                               T0 + 1)
    assert parse({"gpu": 0, "event": "nvlink-down", "link": 2}) == HealthEvent(
        0, EventClass.NVLINK_DOWN, "link-2", "NVLink 2 is down", T0)
    reset = parse({"gpu": 0, "event": "reset"})
    assert reset is not None and reset.event is EventClass.RESET


@pytest.mark.parametrize(("raw", "message"), [
    ("x", r"line 1: must be an object"),
    ({"gpu": 5, "event": "gpu-lost"}, r"line 1\.gpu: must be the index of a GPU on this node \(\[0, 1\]\)"),
    ({"gpu": 0, "event": "melted"}, r"line 1\.event: unknown health event 'melted'"),
    ({"gpu": 0, "event": "xid"}, r"line 1\.xid: an xid event needs the XID number"),
    ({"gpu": 0, "event": "nvlink-down"}, r"line 1\.link: .* needs the link number"),
    ({"gpu": 0, "event": "reset", "time": "now"}, r"line 1\.time: must be unix seconds"),
])
def test_bad_events_name_the_field(raw: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_event(raw, "line 1", gpu_indexes=[0, 1], default_time=T0, policy=HealthPolicy())
