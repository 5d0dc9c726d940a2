"""What the GPU health tests share: a monitor on the `mixed` profile that records what it publishes, and
an NVML node's agent built on the NVML stand-in (discovery and health events through it, everything
else real)."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from driver.discovery import load_inventory
from driver.health import HealthPolicy
from kubeletplugin.health import Health, HealthBoard, device_names_from_slices
from kubeletplugin.healthmonitor import HealthMonitor
from kubeletplugin.metrics import PluginMetrics
from kubeletplugin.plugin import HEALTH_CONDITIONS_FILE, KubeletPlugin
from tests.fakes.apiserver import FakeKubeAPI
from tests.fakes.nvml import FakeNode, FakeNvml, sysfs_for

NODE = "node-a"
T0 = 1_790_000_000.0


def taints_of(slices: list[dict[str, Any]]) -> dict[str, list[dict[str, str]]]:
    """Device -> its taints, for the devices that have any."""
    return {d["name"]: d["taints"] for s in slices for d in s["spec"].get("devices") or [] if d.get("taints")}


class Harness:
    """A HealthMonitor of the `mixed` profile whose published slices land in `published`."""

    def __init__(self, policy: HealthPolicy | None = None) -> None:
        from driver.slices import build_slices

        self.inventory = load_inventory(NODE, simulate="mixed")
        self.board = HealthBoard(NODE, device_names_from_slices(build_slices(self.inventory)))
        self.published: list[list[dict[str, Any]]] = []
        self.metrics = PluginMetrics()
        self.monitor = HealthMonitor(self.inventory, "static", self.board, self.published.append, policy=policy,
                                     metrics=self.metrics)

    def health(self) -> dict[str, tuple[Health, str]]:
        return {s.device_name: (s.health, s.message) for s in self.board.snapshot()[1]}


def wait_until(check: Callable[[], Any], timeout: float = 15.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def nvml_plugin(root: Path, fake: FakeKubeAPI, node: FakeNode, instance_id: str = "", **settings: Any) -> KubeletPlugin:
    """An NVML node's agent: discovery and health events through the NVML stand-in."""
    from driver.nvml import load_nvml_inventory
    from kubeletplugin.plugin import PluginConfig, build_device_state

    sysfs = root / "sys"
    if not sysfs.exists():
        sysfs_for(sysfs, node)
    inventory = load_nvml_inventory(NODE, nvml_module=node.nvml, sysfs_root=sysfs)
    dirs: dict[str, Any] = {"node_name": NODE, "kubelet_dir": root / "kubelet", "cdi_dir": root / "cdi",
                            "state_dir": root / "state", "metrics_addr": "127.0.0.1:0", "stop_grace": 2.0,
                            "instance_id": instance_id}
    config = PluginConfig(nvml=True, **dirs, **settings)
    # MPS, MIG and time slices need a GPU: their simulated stand-ins keep the same records on disk
    state = build_device_state(PluginConfig(simulate="dgx-h100-8", **dirs), inventory)
    plugin = KubeletPlugin(config, fake, inventory, state, health_resend_interval=30, handover_grace=0.2)
    plugin._start_nvml_events = functools.partial(  # type: ignore[method-assign]
        KubeletPlugin._start_nvml_events, plugin, node.nvml)
    return plugin


def stored_taints(fake: FakeKubeAPI) -> dict[str, list[str]]:
    """Device -> the keys of its taints, as the apiserver stand-in stores them."""
    return {d: [t["key"] for t in ts] for d, ts in taints_of(fake.list_resource_slices()["items"]).items()}


def saved(root: Path) -> dict[str, list[str]]:
    """GPU -> the classes of the saved health conditions under `root`/state."""
    path = root / "state" / HEALTH_CONDITIONS_FILE
    raw = json.loads(path.read_text()) if path.exists() else {}
    return {gpu: [c["event"] for c in conds] for gpu, conds in raw.items()}


def reset_pending(nvml: FakeNvml, index: int) -> None:
    """The state a double-bit ECC error leaves a GPU in, as every NVML client reads it."""
    gpu = nvml.gpus[index]
    gpu.volatile_uncorrected, gpu.row_remap_pending, gpu.recovery_action = 1, True, 1
