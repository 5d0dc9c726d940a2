"""The node agent's wiring: inventory -> slices -> publisher, DeviceState, gRPC servers, health, metrics.

Start order matters to kubelet:
1. publish the node's ResourceSlices (in the background; apiserver trouble is retried, never fatal),
   or, while another instance of a rolling update publishes them, stand by to take over;
2. DeviceState.recover(): bring the node in line with the checkpoint before any call can arrive;
3. the DRA socket (v1, v1beta1, health) serves;
4. only then the registration socket appears: kubelet dials the endpoint right after GetInfo;
5. the metrics endpoint.
Stop order is the reverse where it counts: the registration socket goes first so kubelet stops routing
calls here, then the health streams end, then the DRA server drains its calls within a grace period.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import structlog

from driver import DRIVER_NAME
from driver.errors import TesseraError
from driver.kubeapi import ApiError, KubeAPI
from driver.model import Inventory
from driver.nvmlevents import NvmlEventSource
from driver.shutdown import restore_handlers, stop_on_signals, wait_for_stop
from kubeletplugin.draservice import DraService
from kubeletplugin.grpcservers import UnixSocketServer, remove_dead_sockets
from kubeletplugin.health import (
    DRAResourceHealthServicer,
    FileHealthSource,
    Health,
    HealthBoard,
    device_names_from_slices,
)
from kubeletplugin.healthlog import EVENT_LOG_FILE, EventLogSource
from kubeletplugin.healthmonitor import HealthMonitor
from kubeletplugin.instances import InstanceMembership, PublisherLeadership
from kubeletplugin.metrics import MetricsServer, PluginMetrics, PublisherStatus
from kubeletplugin.nodelabels import settings_from_labels
from kubeletplugin.pluginconfig import PluginConfig, PluginConfigError
from kubeletplugin.registration import RegistrationServicer, RegistrationStatus

if TYPE_CHECKING:
    from kubeletplugin.publisher import Publisher
    from kubeletplugin.state import DeviceState

log = structlog.get_logger(__name__)

SIMULATED_HEALTH_FILE = "simulated-health.json"
HEALTH_CONDITIONS_FILE = "health-conditions.json"


class KubeletPlugin:
    """One running node agent. `start()` brings it up in kubelet's order, `stop()` takes it down."""

    def __init__(
        self,
        config: PluginConfig,
        api: KubeAPI,
        inventory: Inventory,
        state: DeviceState,
        *,
        metrics: PluginMetrics | None = None,
        publisher: Publisher | None = None,
        health_resend_interval: float = 10.0,
        handover_grace: float = 2.0,
    ) -> None:
        from driver.slices import build_slices
        from kubeletplugin.publisher import Publisher

        self.config = config
        self.inventory = inventory
        self.state = state
        self.metrics = metrics or PluginMetrics()
        self.slices = build_slices(inventory, mig_strategy=config.mig_strategy)
        self.publisher = publisher or Publisher(api, config.node_name, self.slices)
        paths = config.socket_paths
        self.health = HealthBoard(config.node_name, device_names_from_slices(self.slices))
        self.health_source: FileHealthSource | None = (
            FileHealthSource(config.state_dir / SIMULATED_HEALTH_FILE, self.health) if config.simulated else None
        )
        # GPU health events become taints on the slices and health on kubelet's stream.
        # Simulated nodes rebuild their conditions by replaying the event log; NVML nodes save them
        # (NVML reports an event once) and read the log only as an operator's channel (a reset). Only
        # the publishing instance of a rollout writes them (`_start_publisher`).
        self.health_monitor = HealthMonitor(
            inventory, config.mig_strategy, self.health, self._publish_slices,
            policy=config.health_policy, metrics=self.metrics,
            state_file=None if config.simulated else config.state_dir / HEALTH_CONDITIONS_FILE, saving=False,
        )
        self.event_source: EventLogSource | None = EventLogSource(
            config.state_dir / EVENT_LOG_FILE, self.health_monitor, replay=config.simulated
        )
        self.nvml_events: NvmlEventSource | None = None
        self.service = DraService(api, state, metrics=self.metrics, pool=config.node_name)
        health_servicer = DRAResourceHealthServicer(self.health, resend_interval=health_resend_interval)
        self.registration = RegistrationServicer(paths.dra_socket, on_status=self._on_registration)
        # Workers: one per parallel kubelet call (kubelet prepares pods concurrently) plus the health streams.
        self.dra_server = UnixSocketServer(
            "dra", paths.dra_socket, [self.service.add_to, health_servicer.add_to], max_workers=16
        )
        self.registration_server = UnixSocketServer(
            "registration", paths.registration_socket, [self.registration.add_to], max_workers=2
        )
        self.metrics_server = MetricsServer(config.metrics_addr, self.metrics, self.healthz)
        self._publisher_started = False
        self._stopped = False
        self.membership = InstanceMembership(config.state_dir, config.instance_id)
        self.leadership = PublisherLeadership(config.state_dir, self._start_publisher, on_takeover=self._handover)
        self.handover_grace = handover_grace
        self.metrics.watch_publisher(self._publisher_status)
        self.metrics.prepared_devices.set_function(self._prepared_device_count)
        self.health.add_listener(
            lambda states: self.metrics.unhealthy_devices.set(sum(s.health is not Health.HEALTHY for s in states))
        )

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        """Publisher, recovery, DRA socket, registration socket, metrics; on failure, undoes what started."""
        try:
            self.membership.join()
            # Conditions known before this start (saved ones, or the event log replayed on a simulated
            # node) go into the desired slices before the publisher's first sync, so a restart never
            # publishes a tainted GPU without its taint while recovery runs.
            self.health_monitor.refresh()
            if self.event_source is not None:
                self.event_source.start()
            self.health_monitor.start()
            self.leadership.start()
            report = self.state.recover()
            if report.failed:
                log.error("some prepared claims could not be restored", failed=report.failed)
            if self.health_source is not None:
                self.health_source.start()
            remove_dead_sockets(self.config.socket_paths)
            if self.config.nvml:
                self._start_nvml_events()
            self.dra_server.start()
            self.registration_server.start()
            self.metrics_server.start()
        except BaseException:
            self.stop()
            raise
        log.info(
            "kubelet plugin running",
            driver=DRIVER_NAME,
            node=self.config.node_name,
            inventory=self.inventory.source,
            gpus=len(self.inventory.gpus),
            devices=len(device_names_from_slices(self.slices)),
            registration_socket=str(self.config.socket_paths.registration_socket),
            dra_socket=str(self.config.socket_paths.dra_socket),
            metrics_port=self.metrics_server.port,
        )

    def stop(self) -> None:
        """Registration first (kubelet stops routing here), then health streams, DRA calls, publisher."""
        if self._stopped:
            return
        self._stopped = True
        last = self.membership.leave()
        cleanup = self.config.cleanup_on_exit and last
        log.info("kubelet plugin stopping", cleanup_slices=cleanup, last_instance=last)
        self.leadership.stop()
        self.registration_server.stop(0)
        self.health.close()
        self.dra_server.stop(self.config.stop_grace)
        self.service.close()
        if self.health_source is not None:
            self.health_source.stop()
        if self.event_source is not None:
            self.event_source.stop()
        if self.nvml_events is not None:
            self.nvml_events.stop()
        self.health_monitor.stop()
        if self._publisher_started:
            try:
                # another instance still serving keeps the slices (and takes over publishing them)
                self.publisher.stop(cleanup=cleanup)
            except Exception as exc:
                # Slices left behind are wiped by kubelet 30 s after the driver disappears.
                log.error("cannot delete this node's ResourceSlices", error=str(exc))
        self.leadership.release()
        self.metrics_server.stop()
        log.info("kubelet plugin stopped")

    # -- status --------------------------------------------------------------------------------
    def healthz(self) -> tuple[bool, str]:
        """Healthy when both sockets serve and the publisher has synced once or is retrying."""
        if not (self.dra_server.running and self.registration_server.running):
            return False, "gRPC servers not running"
        status = self._publisher_status()
        if status.state == "starting":
            return False, "ResourceSlice publisher has not finished its first sync"
        if status.state == "stopped":
            return False, "ResourceSlice publisher stopped"
        if status.state == "standby":
            return True, "ok (publisher standby: another plugin instance on this node publishes)"
        return True, f"ok (publisher {status.state})"

    def _start_nvml_events(self, nvml: Any = None) -> None:
        """NVML health events; without them the node still serves, so a failure here is logged, not fatal."""
        from driver.nvml import _import_pynvml

        try:
            module = nvml or _import_pynvml()
            module.nvmlInit()
            source = NvmlEventSource(module, [g.index for g in self.inventory.gpus], self.health_monitor.handle,
                                     policy=self.config.health_policy, active=self.health_monitor.active_conditions,
                                     uuids={g.index: g.uuid for g in self.inventory.gpus})
            source.start()
            self.health_monitor.hold = source.needs_reset
        except Exception as exc:  # no library, no driver, no permission: health events are off
            log.error("NVML health events are off: cannot watch the GPUs", error=str(exc))
            return
        self.nvml_events = source

    def _publish_slices(self, slices: list[dict[str, Any]]) -> None:
        self.slices = slices
        self.publisher.update(slices)

    def _start_publisher(self) -> None:
        # the saved health conditions of an instance that published before go into the first sync
        self.health_monitor.take_over()
        self.publisher.start()
        self._publisher_started = True

    def _handover(self) -> None:
        """The other instance of a rolling update stopped publishing: once it is gone, recover again.

        Its MPS daemons ran in its container and die with it, after this instance adopted them at
        start; recovery restarts them (same pipe directory and limits) and rewrites any spec that
        went missing. The grace lets the old container's processes die first: the kernel drops an
        exiting process's locks before it kills the rest of its PID namespace.
        """

        def wait_then_recover() -> None:
            while not self._stopped and self.membership.others():
                time.sleep(0.2)
            if self._stopped:
                return
            time.sleep(self.handover_grace)
            if self._stopped:
                return
            report = self.state.recover_claims()
            log.info("checked the node again after the other plugin instance left",
                     mps_restarted=report.mps_restarted, specs_rewritten=report.specs_rewritten)  # fmt: skip

        threading.Thread(target=wait_then_recover, name="tessera-handover", daemon=True).start()

    def _publisher_status(self) -> PublisherStatus:
        p = self.publisher
        if self._stopped:
            state = "stopped"
        elif not self._publisher_started:
            state = "standby"
        elif p.last_sync_ok is None:
            state = "starting"
        else:
            state = "synced" if p.last_sync_ok else "retrying"
        return PublisherStatus(state=state, syncs=p.syncs, errors=p.errors, last_sync_time=p.last_sync_time)

    def _prepared_device_count(self) -> float:
        from kubeletplugin.checkpoint import ClaimState

        try:
            entries = self.state.prepared_claims()
        except Exception:  # a scrape must never fail because the checkpoint is being rewritten
            return float("nan")
        return float(sum(len(e.devices) for e in entries.values() if e.state == ClaimState.PREPARE_COMPLETED))

    def _on_registration(self, status: RegistrationStatus) -> None:
        self.metrics.registered.set(1 if status.registered else 0)


def build_device_state(config: PluginConfig, inventory: Inventory) -> DeviceState:
    """DeviceState with the MPS, MIG and time-slice backends that match the discovery backend."""
    from driver.driverroot import discover_driver_root
    from kubeletplugin.devicesteps import DeviceSteps
    from kubeletplugin.migmanager import MigManager, NvmlMigManager, SimulatedMigManager
    from kubeletplugin.mps import MpsControl, NvidiaMpsControl, SimulatedMpsControl
    from kubeletplugin.state import DeviceState
    from kubeletplugin.timeslicing import NvidiaSmiTimeSlicer, SimulatedTimeSlicer, TimeSlicer

    driver_root = (
        discover_driver_root(config.cdi_driver_root, host_root=config.cdi_host_driver_root)
        if config.cdi_driver_root
        else None
    )
    mps: MpsControl
    mig: MigManager
    timeslicer: TimeSlicer
    if config.simulated:
        # Simulated GPUs cannot run MPS daemons, MIG instances or time slices; their stand-ins keep
        # the same records on disk, so restarts and crash recovery behave as on a real node.
        mps = SimulatedMpsControl(config.state_dir)
        mig = SimulatedMigManager(config.state_dir)
        timeslicer = SimulatedTimeSlicer(config.state_dir)
    else:
        if driver_root is None:
            log.warning(
                "no --cdi-driver-root: CDI specs will carry device nodes but no driver libraries, so containers "
                "need their own libcuda matching the host driver"
            )
        mps_binary = driver_root.binary("nvidia-cuda-mps-control") if driver_root else None
        smi_binary = driver_root.binary("nvidia-smi") if driver_root else None
        mps = NvidiaMpsControl(config.state_dir, mps_binary or "nvidia-cuda-mps-control")
        mig = NvmlMigManager(config.state_dir)
        timeslicer = NvidiaSmiTimeSlicer(
            smi_binary or "nvidia-smi", library_dirs=driver_root.library_dirs() if driver_root else ()
        )
    steps = DeviceSteps(
        inventory, config.cdi_dir, config.state_dir, mps, mig, timeslicer=timeslicer, driver_root=driver_root
    )
    return DeviceState(steps, config.node_name)


def with_node_labels(config: PluginConfig, api: KubeAPI) -> PluginConfig:
    """`config` with the simulated profile and MIG strategy its Node's labels choose, where it names labels."""
    if not (config.simulate_label or config.mig_strategy_label):
        return config
    try:
        node = api.get_node(config.node_name)
    except ApiError as exc:
        raise PluginConfigError(
            f"cannot read Node {config.node_name} for its labels (--simulate-from-node-label/"
            f"--mig-strategy-from-node-label): {exc}; the plugin exits and is restarted") from exc
    settings = settings_from_labels(node, simulate_label=config.simulate_label,
                                    mig_strategy_label=config.mig_strategy_label, simulate=config.simulate,
                                    mig_strategy=config.mig_strategy)
    if (settings.simulate, settings.mig_strategy) != (config.simulate, config.mig_strategy):
        log.info("settings from node labels", simulate=settings.simulate, mig_strategy=settings.mig_strategy)
    return replace(config, simulate=settings.simulate, mig_strategy=settings.mig_strategy)


def run_plugin(
    config: PluginConfig,
    *,
    api: KubeAPI | None = None,
    stop_event: threading.Event | None = None,
    on_started: Callable[[KubeletPlugin], None] | None = None,
) -> int:
    """Run until SIGTERM/SIGINT (or `stop_event`); 0 on a clean stop, 1 when the plugin cannot start."""
    from driver.discovery import load_inventory
    from driver.kubeapi import RealKubeAPI

    stop = stop_event or threading.Event()
    if api is None:
        try:
            api = RealKubeAPI(config.kubeconfig)
        except Exception as exc:  # the client raises ConfigException, OSError, yaml errors alike
            where = config.kubeconfig or "in-cluster config or ~/.kube/config"
            log.error("cannot load Kubernetes client configuration", source=where, error=str(exc))
            return 1
    try:
        config = with_node_labels(config, api)
        inventory = load_inventory(config.node_name, simulate=config.simulate, nvml=config.nvml)
        state = build_device_state(config, inventory)
    except TesseraError as exc:  # discovery, driver root, unsafe directories: the text says what to fix
        log.error("cannot start the kubelet plugin", error=str(exc))
        return 1
    plugin = KubeletPlugin(config, api, inventory, state)
    # Run in-process off the main thread (tests), the plugin stops through `stop_event` alone.
    previous = stop_on_signals(stop) if threading.current_thread() is threading.main_thread() else {}
    try:
        try:
            plugin.start()
        except (TesseraError, OSError) as exc:  # sockets, a checkpoint of a newer build, the disk
            log.error("cannot start the kubelet plugin", error=str(exc))
            return 1
        if on_started is not None:
            on_started(plugin)
        wait_for_stop(stop)
        plugin.stop()
        return 0
    finally:
        restore_handlers(previous)
