"""GPU health events in the node agent: event log -> conditions -> taints on published slices and kubelet health."""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.discovery import load_inventory
from driver.health import EventClass, HealthEvent, taint_time
from kubeletplugin.health import Health
from kubeletplugin.healthlog import EVENT_LOG_FILE, EventLogSource, append_event, write_gpu_indexes
from kubeletplugin.healthmonitor import HealthMonitor
from tests.builders.health import NODE, T0, Harness, taints_of
from tests.fakes.apiserver import FakeKubeAPI
from tests.fakes.kubeletclient import KubeletClient, short_tmpdir

# the mixed profile: gpu-1 is in MIG mode (published as three MIG devices), the others are whole GPUs
GPU1_MIGS = ["gpu-1-mig-1g10gb-6", "gpu-1-mig-2g20gb-4", "gpu-1-mig-3g40gb-0"]


def test_gpu_lost_taints_every_mig_device_of_the_gpu_and_marks_them_unhealthy() -> None:
    h = Harness()
    assert h.monitor.handle(HealthEvent(1, EventClass.GPU_LOST, "fallen-off-bus", "GPU has fallen off the bus", T0))
    taints = taints_of(h.published[-1])
    assert sorted(taints) == GPU1_MIGS
    assert {t["key"] for ts in taints.values() for t in ts} == {"gpu.tessera.dev/gpu-lost"}
    assert {t["effect"] for ts in taints.values() for t in ts} == {"NoExecute"}
    health = h.health()
    assert health["gpu-1-mig-3g40gb-0"] == (Health.UNHEALTHY, "gpu-1: tessera: gpu-lost: GPU has fallen off the bus")
    assert health["gpu-0"] == (Health.HEALTHY, "")
    assert h.metrics.tainted_devices.labels(effect="NoExecute")._value.get() == 3
    assert h.metrics.health_events.labels(event_class="gpu-lost")._value.get() == 1


def test_reset_clears_ecc_taint_and_health_but_not_gpu_lost() -> None:
    h = Harness()
    h.monitor.handle(HealthEvent(0, EventClass.ECC_DOUBLE_BIT, "double-bit", "double-bit ECC error", T0))
    h.monitor.handle(HealthEvent(2, EventClass.GPU_LOST, "fallen-off-bus", "lost", T0))
    assert sorted(taints_of(h.published[-1])) == ["gpu-0", "gpu-2"]
    h.monitor.handle(HealthEvent(0, EventClass.RESET, "", "GPU reset", T0 + 5))
    assert not h.monitor.handle(HealthEvent(2, EventClass.RESET, "", "GPU reset", T0 + 5))
    assert sorted(taints_of(h.published[-1])) == ["gpu-2"]
    assert h.health()["gpu-0"] == (Health.HEALTHY, "")
    assert h.health()["gpu-2"][0] is Health.UNHEALTHY


def test_another_health_source_reporting_healthy_does_not_hide_an_event() -> None:
    h = Harness()
    h.monitor.handle(HealthEvent(0, EventClass.ECC_DOUBLE_BIT, "double-bit", "double-bit ECC error", T0))
    h.board.set_health("gpu-0", Health.HEALTHY, source="file")
    assert h.health()["gpu-0"] == (Health.UNHEALTHY, "tessera: ecc-double-bit: double-bit ECC error")
    h.board.set_health("gpu-0", Health.UNHEALTHY, "overridden", source="file")
    h.monitor.handle(HealthEvent(0, EventClass.RESET, "", "reset", T0))
    assert h.health()["gpu-0"] == (Health.UNHEALTHY, "overridden")


def test_event_log_applies_complete_lines_skips_bad_ones_and_counts_ignored_xids(tmp_path: Path) -> None:
    h = Harness()
    path = tmp_path / EVENT_LOG_FILE
    source = EventLogSource(path, h.monitor, clock=lambda: T0)
    assert source.poll() == 0  # no file: nothing happens
    append_event(path, {"gpu": 0, "event": "xid", "xid": 13})
    with path.open("a") as f:
        f.write("{not json\n")
        f.write(json.dumps({"gpu": 9, "event": "gpu-lost"}) + "\n")
        f.write(json.dumps({"gpu": 3, "event": "xid", "xid": 94}))  # no newline yet: still being written
    assert source.poll() == 1
    assert h.published == [] and h.metrics.health_events.labels(event_class="ignored")._value.get() == 1
    with path.open("a") as f:
        f.write("\n")
    assert source.poll() == 1
    assert taints_of(h.published[-1])["gpu-3"][0]["value"] == "94"


def test_event_log_that_shrinks_starts_over(tmp_path: Path) -> None:
    h = Harness()
    path = tmp_path / EVENT_LOG_FILE
    source = EventLogSource(path, h.monitor, clock=lambda: T0)
    append_event(path, {"gpu": 0, "event": "gpu-lost"})
    source.poll()
    assert "gpu-0" in taints_of(h.published[-1])
    path.unlink()
    source.poll()
    assert taints_of(h.published[-1]) == {}
    assert h.health()["gpu-0"] == (Health.HEALTHY, "")


@pytest.fixture
def plugin() -> Iterator[Any]:
    from kubeletplugin.plugin import KubeletPlugin, PluginConfig, build_device_state

    with short_tmpdir() as root:
        config = PluginConfig(node_name=NODE, kubelet_dir=root / "kubelet", cdi_dir=root / "cdi",
                              state_dir=root / "state", simulate="mixed", metrics_addr="127.0.0.1:0", stop_grace=2.0)
        inventory = load_inventory(NODE, simulate="mixed")
        fake = FakeKubeAPI()
        fake.add_node(NODE)
        p = KubeletPlugin(config, fake, inventory, build_device_state(config, inventory), health_resend_interval=30)
        p.fake = fake  # type: ignore[attr-defined]
        yield p
        fake.close_watches()
        p.stop()


def _stored_taints(fake: FakeKubeAPI) -> dict[str, list[dict[str, str]]]:
    return taints_of(fake.list_resource_slices()["items"])


def test_injected_event_reaches_the_stored_slices_and_kubelets_health_stream(plugin: Any) -> None:
    plugin.start()
    assert plugin.publisher.wait_synced(30)
    conn = KubeletClient(plugin.config.socket_paths.kubelet_dir).register()
    stream = plugin_stream = conn.watch_health(timeout=60)
    assert {d["health"] for d in next(stream)} == {"HEALTHY"}

    append_event(plugin.config.state_dir / EVENT_LOG_FILE, {"gpu": 2, "event": "ecc-double-bit", "time": T0})
    update = {d["device"]: d for d in next(stream)}
    assert update["gpu-2"]["health"] == "UNHEALTHY"
    assert update["gpu-2"]["message"] == "tessera: ecc-double-bit: double-bit ECC error"
    deadline = time.monotonic() + 10
    while "gpu-2" not in _stored_taints(plugin.fake) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _stored_taints(plugin.fake) == {"gpu-2": [{"key": "gpu.tessera.dev/ecc-double-bit", "value": "double-bit",
                                                      "effect": "NoExecute", "timeAdded": taint_time(T0)}]}
    plugin_stream.close()
    conn.close()


def test_conditions_in_the_event_log_are_published_again_after_a_restart(plugin: Any) -> None:
    append_event(plugin.config.state_dir / EVENT_LOG_FILE, {"gpu": 0, "event": "gpu-lost", "time": T0})
    plugin.start()
    assert plugin.publisher.wait_synced(30)
    assert list(_stored_taints(plugin.fake)) == ["gpu-0"]


def test_the_first_slices_after_a_restart_already_carry_the_taints(plugin: Any) -> None:
    append_event(plugin.config.state_dir / EVENT_LOG_FILE, {"gpu": 0, "event": "gpu-lost", "time": T0})
    written: list[dict[str, Any]] = []
    create = plugin.fake.create_resource_slice

    def recording(body: dict[str, Any]) -> Any:
        written.append(copy.deepcopy(body))
        return create(body)

    plugin.fake.create_resource_slice = recording
    recover = plugin.state.recover

    def slow_recover() -> Any:
        time.sleep(0.5)  # MPS daemons restarted after a reboot take this long and more
        return recover()

    plugin.state.recover = slow_recover
    plugin.start()
    assert plugin.publisher.wait_synced(30)
    first_with_gpu0 = next(s for s in written if "gpu-0" in {d["name"] for d in s["spec"]["devices"]})
    assert "gpu-0" in taints_of([first_with_gpu0])


def test_inject_cli_appends_events_the_log_source_reads(tmp_path: Path) -> None:
    from tessera.cli import main

    h = Harness()
    write_gpu_indexes(tmp_path, h.monitor.gpu_indexes)  # what the running agent records
    assert main(["inject-health-event", "--state-dir", str(tmp_path), "--gpu", "0", "--event", "xid", "--xid", "79",
                 "--message", "fell off"]) == 0
    assert main(["inject-health-event", "--state-dir", str(tmp_path), "--gpu", "0", "--event", "xid"]) == 2
    assert main(["inject-health-event", "--state-dir", str(tmp_path), "--gpu", "3", "--event", "nvlink-down",
                 "--link", "2"]) == 0
    EventLogSource(tmp_path / EVENT_LOG_FILE, h.monitor).poll()
    taints = taints_of(h.published[-1])
    assert taints["gpu-3"][0]["value"] == "link-2"
    assert [t["key"] for t in taints["gpu-0"]] == ["gpu.tessera.dev/gpu-lost"]  # XID 79 is "fell off the bus"
    assert h.health()["gpu-0"] == (Health.UNHEALTHY, "tessera: gpu-lost: fell off")


@pytest.mark.parametrize(("policy", "message"), [
    ("{", r"--health-policy: not valid JSON|--health-policy: Expecting"),
    ('{"taints": {"gpu-lost": {"clearsOnReset": true}}}', r"--health-policy\.taints\.gpu-lost\.clearsOnReset"),
])
def test_bad_health_policy_flag_exits_2_naming_the_flag(policy: str, message: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from tessera.cli import main

    assert main(["--log-format", "console", "kubelet-plugin", "--node-name", "n", "--health-policy", policy]) == 2
    out = capsys.readouterr()
    assert re.search(message, out.out + out.err)


def test_an_nvml_node_feeds_nvml_events_into_the_taints(tmp_path: Path) -> None:
    from kubeletplugin.plugin import KubeletPlugin, PluginConfig, build_device_state
    from tests.fakes.nvml import dgx_h100_node

    with short_tmpdir() as root:
        config = PluginConfig(node_name=NODE, kubelet_dir=root / "kubelet", cdi_dir=root / "cdi",
                              state_dir=root / "state", simulate="dgx-h100-8", metrics_addr="127.0.0.1:0")
        inventory = load_inventory(NODE, simulate="dgx-h100-8")
        fake = FakeKubeAPI()
        fake.add_node(NODE)
        p = KubeletPlugin(config, fake, inventory, build_device_state(config, inventory))
        nvml = dgx_h100_node().nvml
        p._start_nvml_events(nvml)
        assert p.nvml_events is not None
        try:
            import pynvml

            nvml.pending_events.append((4, pynvml.nvmlEventTypeXidCriticalError, 79))
            deadline = time.monotonic() + 10
            while "gpu-4" not in taints_of(p.slices) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert taints_of(p.slices)["gpu-4"][0]["key"] == "gpu.tessera.dev/gpu-lost"
        finally:
            p.nvml_events.stop()


def test_nvml_events_that_cannot_start_leave_the_plugin_serving(tmp_path: Path) -> None:
    import pynvml

    from kubeletplugin.plugin import KubeletPlugin, PluginConfig, build_device_state
    from tests.fakes.nvml import dgx_h100_node

    with short_tmpdir() as root:
        config = PluginConfig(node_name=NODE, kubelet_dir=root / "kubelet", cdi_dir=root / "cdi",
                              state_dir=root / "state", simulate="dgx-h100-8", metrics_addr="127.0.0.1:0")
        inventory = load_inventory(NODE, simulate="dgx-h100-8")
        p = KubeletPlugin(config, FakeKubeAPI(), inventory, build_device_state(config, inventory))
        nvml = dgx_h100_node().nvml
        nvml.failures["nvmlInit"] = pynvml.NVMLError_DriverNotLoaded
        p._start_nvml_events(nvml)
        assert p.nvml_events is None


def test_saved_conditions_survive_a_restart_of_the_monitor(tmp_path: Path) -> None:
    state = tmp_path / "health-conditions.json"
    first = Harness()
    first.monitor = HealthMonitor(first.inventory, "static", first.board, first.published.append, state_file=state)
    first.monitor.handle(HealthEvent(2, EventClass.ECC_DOUBLE_BIT, "double-bit", "double-bit ECC error", T0))

    again = Harness()
    again.monitor = HealthMonitor(again.inventory, "static", again.board, again.published.append, state_file=state)
    again.monitor.refresh()
    assert taints_of(again.published[-1]) == taints_of(first.published[-1])
    assert again.health()["gpu-2"] == (Health.UNHEALTHY, "tessera: ecc-double-bit: double-bit ECC error")
    again.monitor.handle(HealthEvent(2, EventClass.RESET, "", "reset", T0 + 1))
    third = Harness()
    third.monitor = HealthMonitor(third.inventory, "static", third.board, third.published.append, state_file=state)
    third.monitor.refresh()
    assert taints_of(third.published[-1]) == {}


@pytest.mark.parametrize("content", ["{not json", '{"2": [{"event": "melted", "since": 1}]}', "[]"])
def test_unreadable_saved_conditions_start_clean(tmp_path: Path, content: str) -> None:
    state = tmp_path / "health-conditions.json"
    state.write_text(content)
    h = Harness()
    h.monitor = HealthMonitor(h.inventory, "static", h.board, h.published.append, state_file=state)
    h.monitor.refresh()
    assert taints_of(h.published[-1]) == {}


def test_an_operator_log_on_an_nvml_node_skips_old_lines_and_never_starts_over(tmp_path: Path) -> None:
    h = Harness()
    path = tmp_path / EVENT_LOG_FILE
    append_event(path, {"gpu": 0, "event": "gpu-lost"})  # from before this start: not applied again
    source = EventLogSource(path, h.monitor, replay=False, clock=lambda: T0)
    source.start()
    try:
        assert h.published == []
        h.monitor.handle(HealthEvent(2, EventClass.ECC_DOUBLE_BIT, "double-bit", "from NVML", T0))
        append_event(path, {"gpu": 2, "event": "reset"})
        deadline = time.monotonic() + 10
        while taints_of(h.published[-1]) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert taints_of(h.published[-1]) == {}
        h.monitor.handle(HealthEvent(3, EventClass.ECC_DOUBLE_BIT, "double-bit", "from NVML", T0))
        path.unlink()
        time.sleep(0.5)  # a shrinking log would start the book over on a simulated node; not here
        assert "gpu-3" in taints_of(h.published[-1])
    finally:
        source.stop()


def test_concurrent_sources_never_publish_an_older_state_last() -> None:
    import threading

    h = Harness()
    published = h.published
    gate = threading.Event()
    first = True

    def slow_publish(slices: list[dict[str, Any]]) -> None:
        nonlocal first
        if first:  # the first refresh is slow to hand its slices over; the second must wait for it
            first = False
            gate.wait(0.5)
        published.append(slices)

    h.monitor = HealthMonitor(h.inventory, "static", h.board, slow_publish)
    a = threading.Thread(target=h.monitor.handle,
                         args=(HealthEvent(0, EventClass.ECC_DOUBLE_BIT, "double-bit", "m", T0),))
    a.start()
    time.sleep(0.1)
    h.monitor.handle(HealthEvent(2, EventClass.ECC_DOUBLE_BIT, "double-bit", "m", T0))
    gate.set()
    a.join()
    assert sorted(taints_of(published[-1])) == ["gpu-0", "gpu-2"]
