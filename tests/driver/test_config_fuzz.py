"""Structure-aware fuzzing of the opaque GpuConfig decoder.

Hypothesis builds valid configs field by field (every strategy, with and without its settings,
quantities in every form), and then the same configs with exactly one field wrong: a value of the
wrong type or out of range, a required field missing, an unknown or misspelled key at any level,
settings of another strategy. A valid config must decode to exactly what was written; a config
with one wrong field must raise ConfigError whose field path is that field, with a message that
says what is allowed. Random JSON (tests/system/test_fuzz_inputs.py) rarely gets past `apiVersion`; every
case here does.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from driver.config import (
    API_VERSION,
    KIND,
    TIME_SLICE_INTERVALS,
    ConfigError,
    GpuConfig,
    MpsSettings,
    SharingConfig,
    Strategy,
    TimeSlicingSettings,
    decode_gpu_config,
)

PATH = "spec.devices.config[0].opaque.parameters"
FUZZ = settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

quantities = st.sampled_from(["8Gi", "1", "1.5Gi", "500M", "1e3", "4096Mi", 1, 17179869184, "0.5Ki"])


@st.composite
def valid_configs(draw: st.DrawFn, strategy: Any = None) -> tuple[dict[str, Any], GpuConfig]:
    """A valid raw config and the GpuConfig it must decode to; `strategy` pins sharing.strategy."""
    raw: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND}
    if strategy is None and not draw(st.booleans()):
        return raw, GpuConfig()
    sharing: dict[str, Any] = {}
    chosen = strategy if strategy is not None else draw(st.sampled_from([None, *Strategy]))
    if chosen == "absent":
        chosen = None
    if chosen is not None:
        sharing["strategy"] = chosen.value
    mps = ts = None
    settings_kind = draw(st.sampled_from(["none", "mps", "timeSlicing"]))
    if settings_kind == "mps" and chosen in (None, Strategy.MPS):
        percentage = draw(st.none() | st.integers(1, 100))
        sharing["mps"] = {} if percentage is None else {"activeThreadPercentage": percentage}
        mps = MpsSettings(percentage)
    if settings_kind == "timeSlicing" and chosen in (None, Strategy.TIME_SLICING):
        interval = draw(st.none() | st.sampled_from(TIME_SLICE_INTERVALS))
        sharing["timeSlicing"] = {} if interval is None else {"interval": interval}
        ts = TimeSlicingSettings(interval)
    total = draw(st.none() | quantities)
    if total is not None:
        sharing["totalMemory"] = total
    island = draw(st.none() | st.booleans())
    if island is not None:
        sharing["sameNVLinkIsland"] = island
    raw["sharing"] = sharing
    expected = SharingConfig(chosen, mps, ts, None if total is None else str(total), island)
    return raw, GpuConfig(expected)


@FUZZ
@given(case=valid_configs())
def test_valid_configs_decode_to_exactly_what_was_written(case: tuple[dict[str, Any], GpuConfig]) -> None:
    raw, expected = case
    assert decode_gpu_config(raw, PATH) == expected


def _set(raw: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    target = raw
    for key in path[:-1]:
        target = target.setdefault(key, {})
    if value is _MISSING:
        target.pop(path[-1], None)
    else:
        target[path[-1]] = value


_MISSING = object()


def _get(raw: dict[str, Any], path: list[str]) -> Any:
    target: Any = raw
    for key in path:
        if not isinstance(target, dict) or key not in target:
            return _MISSING
        target = target[key]
    return target
_NOT_OBJECTS = [[], "x", 3, True]
# (field, the strategy its context needs, wrong values, words the message must contain one of)
WRONG: list[tuple[tuple[str, ...], Any, list[Any], tuple[str, ...]]] = [
    (("apiVersion",), None, ["gpu.tessera.dev/v1", "v1alpha1", 1, None, _MISSING], (API_VERSION,)),
    (("kind",), None, ["GPUConfig", "gpuconfig", "", 0, _MISSING], (KIND,)),
    (("sharing",), None, _NOT_OBJECTS, ("must be an object",)),
    (("sharing", "strategy"), "absent", ["mps", "Shared", "", 1, False, ["MPS"]], ("must be one of Exclusive, MPS",)),
    (("sharing", "mps"), Strategy.MPS, _NOT_OBJECTS, ("must be an object",)),
    (("sharing", "mps"), Strategy.TIME_SLICING, [{}, {"activeThreadPercentage": 50}],
     ("only applies to strategy MPS",)),
    (("sharing", "mps"), Strategy.EXCLUSIVE, [{}], ("only applies to strategy MPS",)),
    (("sharing", "mps", "activeThreadPercentage"), Strategy.MPS, [0, 101, -5, 50.5, "50", True, []],
     ("integer from 1 to 100",)),
    (("sharing", "timeSlicing"), Strategy.TIME_SLICING, _NOT_OBJECTS, ("must be an object",)),
    (("sharing", "timeSlicing"), Strategy.MPS, [{}, {"interval": "Short"}], ("only applies to strategy TimeSlicing",)),
    (("sharing", "timeSlicing", "interval"), Strategy.TIME_SLICING, ["short", "Fast", "", 5, True],
     ("must be one of Default, Short, Medium, Long",)),
    (("sharing", "totalMemory"), None, ["8GB", "abc", "-1Gi", "0", 0, -3, True, [], {"memory": "8Gi"}],
     ("a Kubernetes quantity such as 16Gi", "larger than zero")),
    (("sharing", "sameNVLinkIsland"), None, ["true", 1, 0, "yes", []], ("must be true or false",)),
]  # fmt: skip
# misspellings a user coming from NVIDIA's driver or a typo would write, per object
UNKNOWN: list[tuple[tuple[str, ...], Any, str, str]] = [
    ((), None, "apiversion", "apiVersion"),
    ((), None, "spec", ""),
    (("sharing",), None, "mpsConfig", "mps"),
    (("sharing",), None, "timeSlicingConfig", "timeSlicing"),
    (("sharing",), None, "totalmemory", "totalMemory"),
    (("sharing",), None, "sameNvlinkIsland", "sameNVLinkIsland"),
    (("sharing", "mps"), Strategy.MPS, "activeThreadPercent", "activeThreadPercentage"),
    (("sharing", "timeSlicing"), Strategy.TIME_SLICING, "intervall", "interval"),
]


def _only_settings_of(raw: dict[str, Any], field: tuple[str, ...]) -> None:
    """Drop the strategy settings the case is not about: a second settings object would be a second error."""
    sharing = raw.get("sharing")
    if isinstance(sharing, dict):
        for settings_key in ("mps", "timeSlicing"):
            if field[1:2] != (settings_key,):
                sharing.pop(settings_key, None)


@st.composite
def one_wrong_value(draw: st.DrawFn) -> tuple[dict[str, Any], str, tuple[str, ...]]:
    field, context, values, words = draw(st.sampled_from(WRONG))
    raw, _ = draw(valid_configs(strategy=context or draw(st.sampled_from(["absent", *Strategy]))))
    if len(field) > 1:
        raw.setdefault("sharing", {})
        _only_settings_of(raw, field)
    _set(raw, field, draw(st.sampled_from(values)))
    return raw, ".".join((PATH, *field)), words


@FUZZ
@given(case=one_wrong_value())
def test_one_wrong_field_is_named_by_the_error(case: tuple[dict[str, Any], str, tuple[str, ...]]) -> None:
    raw, field_path, words = case
    try:
        decode_gpu_config(raw, PATH)
    except ConfigError as exc:
        assert exc.field_path == field_path, f"{raw}: error names {exc.field_path}, the wrong field is {field_path}"
        assert any(w in exc.message for w in words), exc.message
        value = _get(raw, field_path.removeprefix(PATH + ".").split("."))
        if value is not _MISSING and "only applies" not in exc.message:  # the error quotes what was written
            assert f"got {json.dumps(value)}" in exc.message, exc.message
    else:
        raise AssertionError(f"{raw}: {field_path} is wrong but the config was accepted")


@st.composite
def one_unknown_key(draw: st.DrawFn) -> tuple[dict[str, Any], str, str]:
    where, context, key, hint = draw(st.sampled_from(UNKNOWN))
    raw, _ = draw(valid_configs(strategy=context or draw(st.sampled_from(["absent", *Strategy]))))
    target: dict[str, Any] = raw
    for part in where:
        target = target.setdefault(part, {})
    if where == ("sharing", "mps"):
        raw["sharing"].pop("timeSlicing", None)
    if where == ("sharing", "timeSlicing"):
        raw["sharing"].pop("mps", None)
    target[key] = draw(st.sampled_from([1, "x", True, {}]))
    return raw, ".".join((PATH, *where, key)), hint


@FUZZ
@given(case=one_unknown_key())
def test_one_unknown_key_is_named_with_a_suggestion(case: tuple[dict[str, Any], str, str]) -> None:
    raw, field_path, hint = case
    try:
        decode_gpu_config(raw, PATH)
    except ConfigError as exc:
        assert exc.field_path == field_path, f"{raw}: error names {exc.field_path}, the unknown key is {field_path}"
        assert "unknown field (allowed here:" in exc.message
        if hint:
            assert f"did you mean {hint!r}?" in exc.message, exc.message
    else:
        raise AssertionError(f"{raw}: unknown key {field_path} was accepted")


def _merge_oracle(a: GpuConfig, b: GpuConfig) -> GpuConfig:
    """GpuConfig.merged_with as documented: b wins per field; switching strategy drops the other one's settings."""
    x, y = a.sharing, b.sharing
    switched = y.strategy is not None and y.strategy != x.strategy
    mps = None if switched and y.strategy != Strategy.MPS else x.mps
    ts = None if switched and y.strategy != Strategy.TIME_SLICING else x.time_slicing
    if y.mps is not None:
        mps = MpsSettings(y.mps.active_thread_percentage if y.mps.active_thread_percentage is not None
                          else mps.active_thread_percentage if mps else None)  # fmt: skip
    if y.time_slicing is not None:
        ts = TimeSlicingSettings(y.time_slicing.interval if y.time_slicing.interval is not None
                                 else ts.interval if ts else None)  # fmt: skip
    def pick(later: Any, earlier: Any) -> Any:
        return later if later is not None else earlier

    return GpuConfig(SharingConfig(pick(y.strategy, x.strategy), mps, ts, pick(y.total_memory, x.total_memory),
                                   pick(y.same_nvlink_island, x.same_nvlink_island)))  # fmt: skip


@FUZZ
@given(first=valid_configs(), later=valid_configs())
def test_class_then_claim_configs_merge_field_by_field(
    first: tuple[dict[str, Any], GpuConfig], later: tuple[dict[str, Any], GpuConfig]
) -> None:
    a, b = first[1], later[1]
    assert a.merged_with(b) == _merge_oracle(a, b)
    assert a.merged_with(GpuConfig()) == a


_SHAPES = [
    {},
    {"strategy": "MPS"},
    {"mps": {}},
    {"mps": {"activeThreadPercentage": 50}},
    {"strategy": "MPS", "mps": {"activeThreadPercentage": 30}},
    {"strategy": "MPS", "mps": {}},
    {"timeSlicing": {}},
    {"timeSlicing": {"interval": "Long"}},
    {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}},
    {"strategy": "TimeSlicing", "timeSlicing": {}},
    {"strategy": "Exclusive", "totalMemory": "8Gi", "sameNVLinkIsland": False},
    {"totalMemory": "16Gi", "sameNVLinkIsland": True},
]


def test_every_pair_of_config_shapes_merges_as_documented() -> None:
    """All pairs of the shapes that matter (a setting kept, overridden, or dropped by a strategy switch)."""
    configs = [decode_gpu_config({"apiVersion": API_VERSION, "kind": KIND, "sharing": s}, PATH) for s in _SHAPES]
    for a in configs:
        for b in configs:
            assert a.merged_with(b) == _merge_oracle(a, b), (a, b)
    # the cases spelled out: a claim's empty settings keep the class's values of the same strategy
    assert configs[3].merged_with(configs[2]).sharing.mps == MpsSettings(50)
    assert configs[7].merged_with(configs[6]).sharing.time_slicing == TimeSlicingSettings("Long")
    assert configs[7].merged_with(configs[1]).sharing.time_slicing is None  # switched to MPS: dropped


def test_time_slicing_without_an_interval_resolves_to_the_default_interval() -> None:
    from driver.config import resolve_sharing

    for sharing in ({"strategy": "TimeSlicing", "timeSlicing": {}}, {"strategy": "TimeSlicing"}):
        config = decode_gpu_config({"apiVersion": API_VERSION, "kind": KIND, "sharing": sharing}, PATH)
        got = resolve_sharing(config, memory_share=False, mig=False, where="here")
        assert (got.strategy, got.time_slice_interval) == (Strategy.TIME_SLICING, "Default"), sharing
