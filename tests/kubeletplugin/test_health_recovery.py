"""Taints that clear themselves (issue 25 item 4): NVML sees the GPU healthy again after a reset, a
transient XID's quiet period passes, or a recovery is injected on a simulated node."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.health import EventClass, HealthEvent, HealthPolicy
from kubeletplugin.healthlog import EVENT_LOG_FILE, append_event
from kubeletplugin.healthmonitor import HealthMonitor
from tests.builders.health import T0, Harness, nvml_plugin, stored_taints, taints_of, wait_until
from tests.builders.plugin import make_config
from tests.fakes.apiserver import FakeKubeAPI
from tests.fakes.kubeletclient import KubeletClient
from tests.fakes.nvml import dgx_h100_node

ECC = "gpu.tessera.dev/ecc-double-bit"
LOST = "gpu.tessera.dev/gpu-lost"
XID = "gpu.tessera.dev/xid"


@pytest.fixture(autouse=True)
def quick_nvml_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("driver.nvmlevents.CHECK_INTERVAL_S", 0.1)


@pytest.fixture
def fake() -> Iterator[FakeKubeAPI]:
    api = FakeKubeAPI()
    api.add_node("node-a")
    yield api
    api.close_watches()


def health_of(plugin: Any, device: str) -> str:
    return str(next(s.health.name for s in plugin.health.snapshot()[1] if s.device_name == device))


# -- NVML: the reset is seen, not told --------------------------------------------------------------


def test_an_ecc_taint_clears_once_nvml_reads_the_gpu_reset_and_pods_can_land_again(
        root: Path, fake: FakeKubeAPI) -> None:
    node = dgx_h100_node()
    plugin = nvml_plugin(root, fake, node)
    try:
        plugin.start()
        assert plugin.publisher.wait_synced(30)
        node.nvml.double_bit_ecc(2)
        wait_until(lambda: stored_taints(fake) == {"gpu-2": [ECC]}, what="the ECC taint")
        assert health_of(plugin, "gpu-2") == "UNHEALTHY"
        time.sleep(0.5)  # several checks: NVML still asks for a reset, the volatile count is 1
        assert stored_taints(fake) == {"gpu-2": [ECC]}
        node.nvml.reset_gpu(2)  # what `nvidia-smi -r -i 2` leaves behind
        wait_until(lambda: stored_taints(fake) == {}, what="the ECC taint to clear after the reset")
        assert health_of(plugin, "gpu-2") == "HEALTHY"
        assert plugin.metrics.health_events.labels(event_class="recovered")._value.get() == 1
    finally:
        plugin.stop()


def test_a_lost_gpu_that_comes_back_is_untainted_and_one_still_gone_is_not(root: Path, fake: FakeKubeAPI) -> None:
    node = dgx_h100_node()
    plugin = nvml_plugin(root, fake, node)
    try:
        plugin.start()
        node.nvml.gpus[1].lost = True
        node.nvml.gpus[6].lost = True
        wait_until(lambda: stored_taints(fake) == {"gpu-1": [LOST], "gpu-6": [LOST]}, what="two gpu-lost taints")
        node.nvml.reset_gpu(1)
        wait_until(lambda: stored_taints(fake) == {"gpu-6": [LOST]}, what="gpu-1's taint to clear")
        time.sleep(0.5)
        assert stored_taints(fake) == {"gpu-6": [LOST]}
    finally:
        plugin.stop()


def test_a_quiet_period_does_not_clear_an_xid_while_nvml_wants_the_gpu_reset(
        root: Path, fake: FakeKubeAPI) -> None:
    node = dgx_h100_node()
    plugin = nvml_plugin(root, fake, node,
                         health_policy=HealthPolicy.from_mapping({"taints": {"xid": {"clearAfterSeconds": 1}}}))
    try:
        plugin.start()
        node.nvml.gpus[4].recovery_action = 1  # GPU reset
        node.nvml.pending_events += [(4, node.nvml.nvmlEventTypeXidCriticalError, 119),
                                     (5, node.nvml.nvmlEventTypeXidCriticalError, 94)]
        wait_until(lambda: sorted(stored_taints(fake)) == ["gpu-4", "gpu-5"], what="two XID taints")
        wait_until(lambda: sorted(stored_taints(fake)) == ["gpu-4"], what="gpu-5's transient XID to clear")
        time.sleep(1.5)
        assert stored_taints(fake) == {"gpu-4": [XID]}, "held: NVML asks for a reset"
        node.nvml.reset_gpu(4)
        wait_until(lambda: stored_taints(fake) == {}, what="gpu-4's XID to clear once reset")
    finally:
        plugin.stop()


# -- quiet periods ---------------------------------------------------------------------------------


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_the_monitor_clears_an_expired_xid_and_publishes_at_once() -> None:
    h = Harness()
    clock = Clock(T0)
    policy = HealthPolicy.from_mapping({"taints": {"xid": {"clearAfterSeconds": 60}}})
    h.monitor = HealthMonitor(h.inventory, "static", h.board, h.published.append, policy=policy, clock=clock)
    h.monitor.handle(HealthEvent(0, EventClass.XID, "94", "critical XID 94", T0))
    h.monitor.handle(HealthEvent(2, EventClass.ECC_DOUBLE_BIT, "double-bit", "m", T0))
    clock.now = T0 + 59
    assert not h.monitor.expire()
    clock.now = T0 + 60
    assert h.monitor.expire()
    assert sorted(taints_of(h.published[-1])) == ["gpu-2"]
    assert h.health()["gpu-0"][0].name == "HEALTHY"


def test_a_simulated_node_replaying_an_old_xid_never_publishes_it(root: Path) -> None:
    from driver.discovery import load_inventory
    from kubeletplugin.plugin import KubeletPlugin, build_device_state

    append_event(root / "state" / EVENT_LOG_FILE, {"gpu": 0, "event": "xid", "xid": 94, "time": time.time() - 3600})
    append_event(root / "state" / EVENT_LOG_FILE, {"gpu": 2, "event": "xid", "xid": 94, "time": time.time()})
    config = make_config(root)
    inventory = load_inventory("node-a", simulate="mixed")
    api = FakeKubeAPI()
    api.add_node("node-a")
    written: list[dict[str, Any]] = []
    create = api.create_resource_slice

    def recording(body: dict[str, Any]) -> Any:
        written.append(copy.deepcopy(body))
        return create(body)

    api.create_resource_slice = recording  # type: ignore[method-assign]
    plugin = KubeletPlugin(config, api, inventory, build_device_state(config, inventory))
    try:
        plugin.start()
        assert plugin.publisher.wait_synced(30)
        assert sorted(taints_of(written)) == ["gpu-2"], "the hour-old XID was past its quiet period at start"
    finally:
        api.close_watches()
        plugin.stop()


# -- a simulated node: recoveries are injected -------------------------------------------------------


def test_an_injected_recovery_clears_the_taint_and_kubelets_health_stream(in_process: Any) -> None:
    plugin = in_process
    plugin.start()
    assert plugin.publisher.wait_synced(30)
    conn = KubeletClient(plugin.config.socket_paths.kubelet_dir).register()
    stream = conn.watch_health(timeout=60)
    next(stream)
    log_path = plugin.config.state_dir / EVENT_LOG_FILE
    append_event(log_path, {"gpu": 2, "event": "gpu-lost", "time": time.time()})
    assert {d["device"]: d["health"] for d in next(stream)}["gpu-2"] == "UNHEALTHY"
    wait_until(lambda: stored_taints(plugin.fake) == {"gpu-2": [LOST]}, what="the gpu-lost taint")
    append_event(log_path, {"gpu": 2, "event": "recovered", "condition": "gpu-lost", "time": time.time()})
    assert {d["device"]: d["health"] for d in next(stream)}["gpu-2"] == "HEALTHY"
    wait_until(lambda: stored_taints(plugin.fake) == {}, what="the taint to clear")
    stream.close()  # type: ignore[attr-defined]
    conn.close()
