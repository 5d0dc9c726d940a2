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
    ({"taints": {"gpu-lost": {"clearsOnReset": True}}},
     r"health\.taints\.gpu-lost\.clearsOnReset: .*not cleared by a reset report alone; it clears on recovery"),
    ({"taints": {"gpu-lost": {"clearAfterSeconds": 60}}},
     r"health\.taints\.gpu-lost\.clearAfterSeconds: a lost GPU sends no more events"),
    ({"taints": {"xid": {"clearAfterSeconds": -1}}}, r"health\.taints\.xid\.clearAfterSeconds: must be whole seconds"),
    ({"taints": {"xid": {"clearAfterSeconds": 1.5}}}, r"health\.taints\.xid\.clearAfterSeconds: must be whole seconds"),
    ({"taints": {"xid": {"clearAfterSeconds": "10m"}}}, r"health\.taints\.xid\.clearAfterSeconds: must be whole"),
    ({"taints": {"xid": {"clearAfterSeconds": 10**9}}}, r"clearAfterSeconds: .* to 2592000 \(30 days\)"),
    ({"taints": {"ecc-double-bit": {"clearsOnRecovery": 1}}},
     r"health\.taints\.ecc-double-bit\.clearsOnRecovery: must be true or false"),
    ({"taints": {"xid": {"quietPeriod": 60}}}, r"health\.taints\.xid: must be a mapping with only effect, "
                                                r"clearsOnReset, clearsOnRecovery, clearAfterSeconds"),
    ({"taints": {"recovered": {}}}, r"health\.taints\.recovered: a recovered clears taints"),
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


# -- time checks: a number the API cannot store never becomes a condition (issue 24) ------------------


@pytest.mark.parametrize(("when", "message"), [
    (1_790_000_000_000, r"line 1\.time: unix seconds between 0 and 253402300799 \(year 9999\), got "
                        r"1790000000000; it looks like milliseconds: divide by 1000"),
    (float("nan"), r"line 1\.time: must be a finite number of unix seconds, got nan"),
    (float("inf"), r"line 1\.time: must be a finite number"),
    (-1, r"line 1\.time: unix seconds between 0"),
    (10**400, r"line 1\.time: unix seconds between 0 .*\.\.\."),  # the value is shortened in the message
    (True, r"line 1\.time: must be unix seconds \(a number\), got True"),
], ids=["milliseconds", "nan", "infinity", "negative", "huge-int", "bool"])
def test_event_times_the_api_cannot_store_are_refused_by_field(when: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_event({"gpu": 0, "event": "gpu-lost", "time": when}, "line 1", gpu_indexes=[0], default_time=T0,
                    policy=HealthPolicy())


def test_no_event_or_condition_can_hold_a_time_the_publisher_cannot_write() -> None:
    with pytest.raises(ValueError, match="time: unix seconds between"):
        HealthEvent(0, EventClass.XID, "94", "m", 1e15)
    book = GpuConditions()
    book.apply(HealthEvent(0, EventClass.XID, "94", "m", 253_402_300_799))  # the last second of year 9999
    assert book.taints(0)[0]["timeAdded"] == "9999-12-31T23:59:59Z"


@pytest.mark.parametrize(("raw", "message"), [
    ({"gpu": True, "event": "gpu-lost"}, r"line 1\.gpu: must be the index of a GPU .* got True"),
    ({"gpu": 0, "event": ["gpu-lost"]}, r"line 1\.event: must be a string, got \['gpu-lost'\]"),
    ({"gpu": 0, "event": "xid", "xid": 2**40}, r"line 1\.xid: .*1 to 4294967295"),
    ({"gpu": 0, "event": "xid", "xid": -5}, r"line 1\.xid: .*got -5"),
    ({"gpu": 0, "event": "nvlink-down", "link": 10**6}, r"line 1\.link: .*0 to 1023"),
    ({"gpu": 0, "event": "gpu-lost", "message": 5}, r"line 1\.message: must be a string, got 5"),
    ({"gpu": 0, "event": "gpu-lost", "message": "m" * 1025}, r"line 1\.message: at most 1024 characters, got 1025"),
    ({"gpu": 0, "event": "gpu-lost", "reason": {"a": 1}}, r"line 1\.reason: must be a string"),
    ({"gpu": 0, "event": "recovered", "condition": "melted"}, r"line 1\.condition: one of xid, ecc-double-bit"),
])
def test_wrong_types_and_sizes_are_refused_by_field(raw: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_event(raw, "line 1", gpu_indexes=[0, 1], default_time=T0, policy=HealthPolicy())


# -- recovery rules (issue 25 item 4) -----------------------------------------------------------------


def test_default_recovery_rules() -> None:
    rules = HealthPolicy().rules
    assert {c.value: (r.clears_on_reset, r.clears_on_recovery, r.clear_after) for c, r in rules.items()} == {
        "xid": (True, True, 600), "ecc-double-bit": (True, True, 0), "gpu-lost": (False, True, 0),
        "nvlink-down": (True, True, 0)}


def test_recovered_clears_the_named_condition_or_every_one_that_clears_on_recovery() -> None:
    policy = HealthPolicy.from_mapping({"taints": {"nvlink-down": {"clearsOnRecovery": False}}})
    book = GpuConditions(policy)
    for cls, value in ((EventClass.GPU_LOST, "fallen-off-bus"), (EventClass.ECC_DOUBLE_BIT, "double-bit"),
                       (EventClass.NVLINK_DOWN, "link-1")):
        book.apply(ev(0, cls, value))
    assert book.apply(HealthEvent(0, EventClass.RECOVERED, "gpu-lost", "back", T0))
    assert set(book.active(0)) == {EventClass.ECC_DOUBLE_BIT, EventClass.NVLINK_DOWN}
    assert not book.apply(HealthEvent(0, EventClass.RECOVERED, "gpu-lost", "back", T0))  # nothing left to clear
    assert book.apply(HealthEvent(0, EventClass.RECOVERED, "", "healthy", T0))
    assert book.active(0) == {EventClass.NVLINK_DOWN: "link-1"}  # its rule says recovery does not clear it


def test_a_quiet_period_counts_from_the_latest_event_of_the_class() -> None:
    book = GpuConditions(HealthPolicy.from_mapping({"taints": {"xid": {"clearAfterSeconds": 60}}}))
    book.apply(ev(0, EventClass.XID, "94", T0))
    book.apply(ev(1, EventClass.ECC_DOUBLE_BIT, "double-bit", T0))
    assert not book.apply(ev(0, EventClass.XID, "94", T0 + 50))  # the same XID again: not a change
    assert book.expire(T0 + 100) == []  # 50 s after the repeat
    assert book.taints(0)[0]["timeAdded"] == taint_time(T0)  # the first time stays
    assert book.expire(T0 + 111, hold=lambda gpu: gpu == 0) == []  # NVML still wants GPU 0 reset
    [(gpu, cond)] = book.expire(T0 + 111)
    assert (gpu, cond.event, cond.last_seen) == (0, EventClass.XID, T0 + 50)
    assert book.affected() == [1]  # no quiet period for ECC


def test_saved_conditions_keep_the_quiet_period_and_older_files_load() -> None:
    book = GpuConditions()
    book.apply(ev(2, EventClass.XID, "94", T0))
    book.apply(ev(2, EventClass.XID, "94", T0 + 9))
    again = GpuConditions()
    assert again.load_json(book.to_json(), "saved") == []
    assert again.conditions(2) == book.conditions(2) and again.conditions(2)[0].last_seen == T0 + 9
    assert again.load_json({"2": [{"event": "xid", "value": "94", "since": T0}]}, "saved") == []  # no lastSeen
    assert again.conditions(2)[0].last_seen == T0


def test_a_damaged_saved_file_keeps_its_good_entries_and_names_each_bad_one() -> None:
    book = GpuConditions()
    problems = book.load_json({
        "0": [{"event": "gpu-lost", "value": "fallen-off-bus", "message": "m", "since": T0},
              {"event": "xid", "value": "94", "since": 1.79e12},
              {"event": "reset", "since": T0}],
        "1": [{"event": "ecc-double-bit", "value": ["x"], "since": T0}, "nope"],
        "²": [], "9999999": [], "3": {"event": "xid"},
        "2": [{"event": "nvlink-down", "value": "link-1", "since": float("nan")},
              {"event": "xid", "value": "31", "since": T0, "lastSeen": "later"},
              {"event": 5, "since": T0}],
    }, "f")
    assert [t["key"] for t in book.taints(0)] == ["gpu.tessera.dev/gpu-lost"]
    assert book.affected() == [0]
    assert [p.split(":")[0] for p in problems] == [
        "f.0[1].since", "f.0[2].event", "f.1[0].value", "f.1[1]", "f.'²'", "f.'9999999'", "f.'3'",
        "f.2[0].since", "f.2[1].lastSeen", "f.2[2].event"]
    with pytest.raises(ValueError, match="f: must be an object mapping GPU index to conditions, got list"):
        book.load_json([], "f")


def test_merge_adds_only_what_the_book_lacks() -> None:
    mine, saved = GpuConditions(), GpuConditions()
    mine.apply(ev(0, EventClass.XID, "94", T0 + 5))
    saved.apply(ev(0, EventClass.XID, "31", T0))
    saved.apply(ev(3, EventClass.ECC_DOUBLE_BIT, "double-bit", T0))
    assert mine.merge(saved)
    assert mine.active(0) == {EventClass.XID: "94"} and mine.active(3) == {EventClass.ECC_DOUBLE_BIT: "double-bit"}
    assert not mine.merge(saved)
