"""GpuConfig: strict decoding with field paths, merge order, and which sharing a device ends up with."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from driver.config import (
    API_VERSION,
    ConfigError,
    EffectiveSharing,
    GpuConfig,
    MpsSettings,
    SharingConfig,
    Strategy,
    TimeSlicingSettings,
    config_applies,
    decode_gpu_config,
    merge_configs,
    resolve_sharing,
)

P = "spec.devices.config[1].opaque.parameters"


def cfg(**sharing):
    return {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": sharing}


def error_of(raw) -> str:
    with pytest.raises(ConfigError) as info:
        decode_gpu_config(raw, P)
    return str(info.value)


def test_full_config_decodes_every_field():
    got = decode_gpu_config(
        cfg(strategy="MPS", mps={"activeThreadPercentage": 50}, totalMemory="16Gi", sameNVLinkIsland=True), P
    )
    assert got == GpuConfig(SharingConfig(Strategy.MPS, MpsSettings(50), None, "16Gi", True))


def test_config_without_sharing_is_empty():
    assert decode_gpu_config({"apiVersion": API_VERSION, "kind": "GpuConfig"}, P) == GpuConfig()


def test_time_slicing_interval_decodes():
    got = decode_gpu_config(cfg(strategy="TimeSlicing", timeSlicing={"interval": "Long"}), P)
    assert got.sharing.time_slicing == TimeSlicingSettings("Long")


def test_total_memory_accepts_integer_bytes():
    assert decode_gpu_config(cfg(totalMemory=1073741824), P).sharing.total_memory == "1073741824"


def test_active_thread_percentage_out_of_range_names_the_field():
    assert error_of(cfg(strategy="MPS", mps={"activeThreadPercentage": 150})) == (
        f"{P}.sharing.mps.activeThreadPercentage: must be an integer from 1 to 100, got 150"
    )


@pytest.mark.parametrize("value", [0, "50", 50.5, True])
def test_active_thread_percentage_rejects_non_integers_and_zero(value):
    assert "sharing.mps.activeThreadPercentage: must be an integer from 1 to 100" in error_of(
        cfg(mps={"activeThreadPercentage": value})
    )


def test_wrong_api_version_is_rejected():
    raw = {"apiVersion": "gpu.tessera.dev/v1", "kind": "GpuConfig"}
    assert error_of(raw) == f'{P}.apiVersion: must be gpu.tessera.dev/v1alpha1, got "gpu.tessera.dev/v1"'


def test_missing_api_version_says_what_to_set():
    assert error_of({"kind": "GpuConfig"}) == f"{P}.apiVersion: is required; set it to gpu.tessera.dev/v1alpha1"


def test_wrong_kind_is_rejected():
    assert error_of({"apiVersion": API_VERSION, "kind": "MigConfig"}) == f'{P}.kind: must be GpuConfig, got "MigConfig"'


def test_missing_kind_says_what_to_set():
    assert error_of({"apiVersion": API_VERSION}) == f"{P}.kind: is required; set it to GpuConfig"


def test_parameters_must_be_an_object():
    assert error_of(["MPS"]) == f'{P}: must be an object, got ["MPS"]'


def test_sharing_must_be_an_object():
    assert error_of({"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": "MPS"}) == (
        f'{P}.sharing: must be an object, got "MPS"'
    )


def test_unknown_top_level_field_is_rejected_with_suggestion():
    raw = {"apiVersion": API_VERSION, "kind": "GpuConfig", "shareing": {}}
    assert error_of(raw) == (
        f"{P}.shareing: unknown field (allowed here: apiVersion, kind, sharing); did you mean 'sharing'?"
    )


def test_unknown_sharing_field_is_rejected():
    msg = error_of(cfg(strategy="MPS", mpsConfig={}))
    assert msg.startswith(f"{P}.sharing.mpsConfig: unknown field (allowed here: mps, sameNVLinkIsland, strategy")
    assert "did you mean 'mps'?" in msg


def test_unknown_mps_field_is_rejected():
    assert error_of(cfg(mps={"pinnedMemoryLimit": "4Gi"})) == (
        f"{P}.sharing.mps.pinnedMemoryLimit: unknown field (allowed here: activeThreadPercentage, "
        "pinnedDeviceMemoryLimit); did you mean 'pinnedDeviceMemoryLimit'?"
    )


def test_unknown_time_slicing_field_is_rejected():
    assert error_of(cfg(timeSlicing={"intervall": "Long"})).startswith(
        f"{P}.sharing.timeSlicing.intervall: unknown field (allowed here: interval); did you mean 'interval'?"
    )


def test_unknown_strategy_is_rejected():
    assert error_of(cfg(strategy="MemoryLimited")) == (
        f'{P}.sharing.strategy: must be one of Exclusive, MPS, TimeSlicing, got "MemoryLimited"'
    )


def test_unknown_interval_is_rejected():
    assert error_of(cfg(timeSlicing={"interval": "VeryLong"})) == (
        f'{P}.sharing.timeSlicing.interval: must be one of Default, Short, Medium, Long, got "VeryLong"'
    )


def test_mps_settings_with_other_strategy_are_rejected():
    assert error_of(cfg(strategy="Exclusive", mps={"activeThreadPercentage": 20})) == (
        f"{P}.sharing.mps: only applies to strategy MPS, but strategy is Exclusive"
    )


def test_time_slicing_settings_with_other_strategy_are_rejected():
    assert error_of(cfg(strategy="MPS", timeSlicing={"interval": "Short"})) == (
        f"{P}.sharing.timeSlicing: only applies to strategy TimeSlicing, but strategy is MPS"
    )


def test_mps_and_time_slicing_together_without_strategy_are_rejected():
    assert error_of(cfg(mps={}, timeSlicing={})) == (
        f"{P}.sharing: mps and timeSlicing exclude each other; keep the one matching sharing.strategy"
    )


def test_mps_settings_must_be_an_object():
    assert error_of(cfg(mps=50)) == f"{P}.sharing.mps: must be an object, got 50"


@pytest.mark.parametrize("value", ["16GB", "lots", [1]])
def test_total_memory_must_be_a_quantity(value):
    assert "sharing.totalMemory: must be a Kubernetes quantity such as 16Gi" in error_of(cfg(totalMemory=value))


def test_total_memory_must_be_positive():
    assert error_of(cfg(totalMemory="0")) == f'{P}.sharing.totalMemory: must be larger than zero, got "0"'


def test_same_nvlink_island_must_be_bool():
    assert error_of(cfg(sameNVLinkIsland="yes")) == f'{P}.sharing.sameNVLinkIsland: must be true or false, got "yes"'


# --- applying and merging ---------------------------------------------------------------------


def test_config_without_requests_applies_to_every_request():
    assert config_applies((), "gpu")
    assert config_applies((), "gpu/shared")


def test_config_naming_main_request_applies_to_its_subrequests():
    assert config_applies(("gpu",), "gpu/shared")
    assert config_applies(("gpu",), "gpu")
    assert not config_applies(("other",), "gpu/shared")


def test_config_naming_a_subrequest_applies_only_to_it():
    assert config_applies(("gpu/shared",), "gpu/shared")
    assert not config_applies(("gpu/shared",), "gpu/full")
    assert not config_applies(("gpu/shared",), "gpu")


def test_later_config_wins_per_field():
    class_cfg = decode_gpu_config(cfg(strategy="MPS", mps={"activeThreadPercentage": 30}, sameNVLinkIsland=True), P)
    claim_cfg = decode_gpu_config(cfg(mps={"activeThreadPercentage": 60}), P)
    merged = merge_configs([class_cfg, claim_cfg])
    assert merged.sharing == SharingConfig(Strategy.MPS, MpsSettings(60), None, None, True)


def test_fields_the_later_config_leaves_out_are_kept():
    class_cfg = decode_gpu_config(cfg(strategy="MPS", mps={"activeThreadPercentage": 30}), P)
    claim_cfg = decode_gpu_config(cfg(totalMemory="8Gi"), P)
    merged = merge_configs([class_cfg, claim_cfg])
    assert merged.sharing == SharingConfig(Strategy.MPS, MpsSettings(30), None, "8Gi", None)


def test_switching_strategy_drops_the_earlier_strategy_settings():
    class_cfg = decode_gpu_config(cfg(strategy="MPS", mps={"activeThreadPercentage": 30}), P)
    claim_cfg = decode_gpu_config(cfg(strategy="TimeSlicing", timeSlicing={"interval": "Short"}), P)
    merged = merge_configs([class_cfg, claim_cfg])
    assert merged.sharing == SharingConfig(Strategy.TIME_SLICING, None, TimeSlicingSettings("Short"), None, None)


def test_merging_nothing_gives_the_empty_config():
    assert merge_configs([]) == GpuConfig()


# --- resolving the sharing of one device ------------------------------------------------------

W = "status.allocation.devices.results[0]"


def test_whole_gpu_defaults_to_exclusive():
    assert resolve_sharing(GpuConfig(), memory_share=False, mig=False, where=W) == EffectiveSharing(Strategy.EXCLUSIVE)


def test_memory_share_defaults_to_mps():
    assert resolve_sharing(GpuConfig(), memory_share=True, mig=False, where=W) == EffectiveSharing(Strategy.MPS)


def test_mps_thread_percentage_is_carried():
    config = GpuConfig(SharingConfig(Strategy.MPS, MpsSettings(25)))
    assert resolve_sharing(config, memory_share=True, mig=False, where=W).active_thread_percentage == 25


def test_time_slicing_interval_defaults_to_default():
    config = GpuConfig(SharingConfig(Strategy.TIME_SLICING))
    got = resolve_sharing(config, memory_share=False, mig=False, where=W)
    assert got == EffectiveSharing(Strategy.TIME_SLICING, None, "Default")


def test_time_slicing_on_a_memory_share_is_an_error():
    config = GpuConfig(SharingConfig(Strategy.TIME_SLICING))
    with pytest.raises(ConfigError) as info:
        resolve_sharing(config, memory_share=True, mig=False, where=W)
    assert str(info.value) == (
        f"{W}: a memory share is enforced by an MPS daemon, so sharing.strategy must be MPS (or left out), "
        "got TimeSlicing; request the whole device to use TimeSlicing"
    )


def test_exclusive_on_a_memory_share_is_an_error():
    with pytest.raises(ConfigError, match="strategy must be MPS"):
        resolve_sharing(GpuConfig(SharingConfig(Strategy.EXCLUSIVE)), memory_share=True, mig=False, where=W)


def test_time_slicing_on_mig_is_an_error():
    with pytest.raises(ConfigError) as info:
        resolve_sharing(GpuConfig(SharingConfig(Strategy.TIME_SLICING)), memory_share=False, mig=True, where=W)
    assert str(info.value) == f"{W}: MIG devices cannot be time-sliced; use Exclusive or MPS for MIG devices"


def test_mps_settings_without_mps_strategy_after_defaults_is_an_error():
    config = GpuConfig(SharingConfig(None, MpsSettings(40)))
    with pytest.raises(ConfigError) as info:
        resolve_sharing(config, memory_share=False, mig=False, where=W)
    assert str(info.value) == f"{W}: sharing.mps is set but the strategy is Exclusive; set strategy MPS"


def test_time_slicing_settings_on_memory_share_default_is_an_error():
    config = GpuConfig(SharingConfig(None, None, TimeSlicingSettings("Long")))
    with pytest.raises(ConfigError) as info:
        resolve_sharing(config, memory_share=True, mig=False, where=W)
    assert str(info.value) == f"{W}: sharing.timeSlicing is set but the strategy is MPS; set strategy TimeSlicing"


# --- arbitrary input --------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=12), children, max_size=3),
    max_leaves=12,
)
sharing_like = st.fixed_dictionaries(
    {},
    optional={
        "strategy": st.sampled_from(["Exclusive", "MPS", "TimeSlicing", "mps", 3]),
        "mps": st.fixed_dictionaries({}, optional={"activeThreadPercentage": st.integers(-5, 105) | json_values}),
        "timeSlicing": st.fixed_dictionaries({}, optional={"interval": st.sampled_from(["Default", "Long", "x"])}),
        "totalMemory": st.sampled_from(["8Gi", "0", "-1Gi", "1.5", "lots", 4096]),
        "sameNVLinkIsland": st.booleans() | json_values,
        "extra": json_values,
    },
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(json_values, sharing_like.map(lambda sh: cfg(**sh))))
def test_any_input_decodes_or_fails_with_a_field_path(raw):
    try:
        got = decode_gpu_config(raw, P)
    except ConfigError as exc:
        assert str(exc).startswith(P)
        assert exc.field_path.startswith(P)
    else:
        assert isinstance(got, GpuConfig)


def test_a_pinned_device_memory_limit_is_decoded_merged_and_resolved_to_bytes():
    config = decode_gpu_config(cfg(strategy="MPS", mps={"pinnedDeviceMemoryLimit": "10Gi"}), P)
    assert config.sharing.mps == MpsSettings(None, "10Gi")
    merged = config.merged_with(decode_gpu_config(cfg(mps={"activeThreadPercentage": 50}), P))
    assert merged.sharing.mps == MpsSettings(50, "10Gi"), "a later config that sets the other field keeps this one"
    got = resolve_sharing(merged, memory_share=False, mig=False, where=W)
    assert (got.active_thread_percentage, got.pinned_memory_limit) == (50, 10 * 1024**3)


@pytest.mark.parametrize(("value", "message"), [
    ("lots", "must be a Kubernetes quantity such as 10Gi, got \"lots\""),
    ("512Ki", "must be at least 1Mi (MPS's smallest limit), got \"512Ki\""),
    ("-1Gi", "must be at least 1Mi (MPS's smallest limit), got \"-1Gi\""),
])  # fmt: skip
def test_a_pinned_device_memory_limit_that_cannot_work_is_refused_by_name(value: str, message: str):
    assert error_of(cfg(strategy="MPS", mps={"pinnedDeviceMemoryLimit": value})) == (
        f"{P}.sharing.mps.pinnedDeviceMemoryLimit: {message}"
    )
