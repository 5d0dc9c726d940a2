"""The steps that make a claim's devices on this node, and undo them: MIG instances, CDI spec, time
slices, MPS daemon.

DeviceSteps acts on a ClaimPlan (driver/allocation.py) and returns what it made; it keeps no state
about claims and never touches the checkpoint. The order of the steps, the checkpoint writes around
them and the rollback are DeviceState's (kubeletplugin/state.py); bringing the node back in line
after a start is Recovery's (kubeletplugin/recovery.py). Both call the same steps, so a claim
prepared and a claim restored are made by the same code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from driver.allocation import AllocatedDevice, ClaimPlan, MigKey, MpsGroup
from driver.cdi import (
    SIMULATED_DEVICE_NUMBERS,
    ContainerEdits,
    DeviceNode,
    SpecDevice,
    build_claim_spec,
    device_name,
    gpu_device_nodes,
    mig_device_nodes,
    qualified_id,
    remove_spec,
    request_devices_env,
)
from driver.driverroot import DriverRoot
from driver.mig import layout_for
from driver.model import Inventory
from kubeletplugin.checkpoint import ClaimEntry
from kubeletplugin.faults import FaultHook, crash_from_env
from kubeletplugin.fsguard import require_private_dir
from kubeletplugin.kubeletclaims import PreparedDevice
from kubeletplugin.migmanager import CreatedMig, MigError, MigManager
from kubeletplugin.mps import MpsControl, MpsDaemon, limit_mib, mps_paths
from kubeletplugin.timeslicing import TimeSliceError, TimeSlicer

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ClaimSpec:
    """A claim's CDI spec and the devices kubelet is answered with."""

    spec: dict[str, Any]
    devices: tuple[PreparedDevice, ...]


@dataclass(frozen=True)
class RestoredMigs:
    """A completed claim's MIG instances after a restart: all of them, by device name, and whether any was
    made again."""

    instances: tuple[CreatedMig, ...]
    by_device: dict[str, CreatedMig]
    recreated: bool


class DeviceSteps:
    """The device work of one node; each method is one step and returns what it made."""

    def __init__(
        self,
        inventory: Inventory,
        cdi_dir: Path,
        state_dir: Path,
        mps: MpsControl,
        mig: MigManager,
        *,
        timeslicer: TimeSlicer | None = None,
        driver_root: DriverRoot | None = None,
        proc_root: Path | None = None,
        fault_hook: FaultHook = crash_from_env,
    ) -> None:
        self.inventory = inventory
        self.cdi_dir = cdi_dir
        self.state_dir = state_dir
        self.mps = mps
        self.mig = mig
        self.timeslicer = timeslicer
        self.driver_root = driver_root
        self.proc_root = proc_root
        self.fault_hook = fault_hook
        # a simulated node has no /dev/nvidia* for the runtime to copy, so its specs carry the numbers
        self.device_numbers = SIMULATED_DEVICE_NUMBERS if inventory.source.startswith("simulated") else None
        # a checkpoint or spec someone else can replace would decide what containers mount: both
        # directories must be ours and writable by us alone (created 0755 whatever the umask)
        require_private_dir(state_dir, "--state-dir")
        require_private_dir(cdi_dir, "--cdi-dir")

    # -- MIG ---------------------------------------------------------------------------------------
    def create_migs(
        self, plan: ClaimPlan, recorded: tuple[CreatedMig, ...], *, owned: Collection[CreatedMig] | None = None
    ) -> dict[str, CreatedMig]:
        """The plan's dynamic MIG instances by device name: recorded ones that still exist, else new ones.

        `owned` (every checkpoint entry's instances) is given when an earlier attempt of this claim
        crashed before PrepareCompleted: an instance at one of the plan's placements that no entry
        owns is then that attempt's and is taken over. If a create fails, the instances this call
        created or took over are destroyed again before the error propagates.
        """
        recorded_at = {m.key: m for m in recorded}
        out: dict[str, CreatedMig] = {}
        made: list[CreatedMig] = []
        try:
            for device, key in plan.migs:
                known = recorded_at.get(key)
                if known is not None and self.mig.exists(known):
                    out[device] = known
                    continue
                left = self._unowned_mig(key, owned) if owned is not None else None
                if left is None:
                    target = next(d.target for d in plan.devices if d.device == device)
                    assert target.mig_profile is not None and target.placement is not None
                    left = self.mig.create(target.gpu, target.mig_profile, target.placement)
                made.append(left)
                out[device] = left
        except Exception:
            for m in made:
                with contextlib.suppress(Exception):
                    self.mig.destroy(m)
            raise
        return out

    def _unowned_mig(self, key: MigKey, owned: Collection[CreatedMig]) -> CreatedMig | None:
        """An instance at this placement that no checkpoint entry owns: an earlier attempt of this claim
        created it and crashed before PrepareCompleted (the scheduler gave the placement to this claim,
        and no container ever ran on an instance of a prepare that never completed)."""
        for m in self.mig.created():
            if m.key == key and m not in owned and self.mig.exists(m):
                return m
        return None

    def restore_migs(self, plan: ClaimPlan, recorded: tuple[CreatedMig, ...]) -> RestoredMigs:
        """A completed claim's instances, each one that vanished (GPU reset, reboot) created again at its
        placement (a new UUID and new capability minors)."""
        present: dict[MigKey, CreatedMig] = {}
        recreated = False
        for m in recorded:
            if self.mig.exists(m):
                present[m.key] = m
                continue
            gpu = self.inventory.gpu_by_uuid(m.gpu_uuid)
            layout = layout_for(gpu.product_name)
            if layout is None:
                raise MigError(f"{gpu.device_name}: no MIG table for {gpu.product_name}")
            present[m.key] = self.mig.create(gpu, layout.profile(m.profile), m.placement)
            recreated = True
        out: dict[str, CreatedMig] = {}
        for device, key in plan.migs:
            if key not in present:
                raise MigError(f"claim {plan.namespace}/{plan.name}: no MIG instance recorded for {device}")
            out[device] = present[key]
        return RestoredMigs(tuple(present.values()), out, recreated)

    # -- CDI ---------------------------------------------------------------------------------------
    def _visible(self, d: AllocatedDevice, migs: dict[str, CreatedMig]) -> tuple[str, tuple[DeviceNode, ...]]:
        """The UUID CUDA sees for a device, and its device nodes."""
        t = d.target
        if t.static_instance is not None:
            inst = t.static_instance
            nodes = mig_device_nodes(
                t.gpu.minor, inst.gpu_instance_id, inst.compute_instance_id, self.proc_root, self.device_numbers
            )
            return inst.uuid, nodes
        if t.is_mig:
            m = migs[d.device]
            nodes = mig_device_nodes(
                m.gpu_minor, m.gpu_instance_id, m.compute_instance_id, self.proc_root, self.device_numbers
            )
            return m.uuid, nodes
        return t.gpu.uuid, gpu_device_nodes(t.gpu.minor, self.device_numbers)

    def claim_spec(self, plan: ClaimPlan, migs: dict[str, CreatedMig]) -> ClaimSpec:
        """The claim's CDI spec, built from the plan and the MIG instances it got; nothing is written.

        Everything a device brings goes into that device's own edits (its nodes, its request's device
        list, its MPS group's pipe), so a container that names one request gets that request alone.
        """
        repeated = {d.device for d in plan.devices if sum(o.device == d.device for o in plan.devices) > 1}
        visible = {d.device: self._visible(d, migs) for d in plan.devices}
        by_request: dict[str, list[str]] = {}
        for d in plan.devices:
            ids = by_request.setdefault(d.base_request, [])
            if visible[d.device][0] not in ids:
                ids.append(visible[d.device][0])
        mps_edits = {d.result_index: mps_paths(self.state_dir, g.daemon_id).container_edits()
                     for g in plan.mps_groups for d in g.devices}  # fmt: skip
        spec_devices: list[SpecDevice] = []
        prepared: list[PreparedDevice] = []
        for d in plan.devices:
            suffix = (d.share_id or str(d.result_index)) if d.device in repeated else ""
            name = device_name(plan.uid, d.device, suffix)
            edits = ContainerEdits(
                env=(request_devices_env(plan.uid, d.base_request, by_request[d.base_request]),),
                device_nodes=visible[d.device][1],
            ) + mps_edits.get(d.result_index, ContainerEdits())
            spec_devices.append(SpecDevice(name, edits))
            prepared.append(PreparedDevice((d.base_request,), d.pool, d.device, (qualified_id(name),), d.share_id))
        common = self.driver_root.container_edits() if self.driver_root else ContainerEdits()
        spec = build_claim_spec(plan.uid, spec_devices, common, self.device_numbers)
        return ClaimSpec(spec, tuple(prepared))

    # -- time slices -------------------------------------------------------------------------------
    def set_time_slices(self, uid: str, time_slices: tuple[tuple[str, str], ...]) -> None:
        if self.timeslicer is not None:
            for gpu_uuid, interval in time_slices:
                self.timeslicer.set_interval(gpu_uuid, interval)
        elif any(interval != "Default" for _, interval in time_slices):
            log.warning("time-slice interval not applied: no time slicer configured", claim_uid=uid)

    # -- MPS ---------------------------------------------------------------------------------------
    def start_mps(
        self, plan: ClaimPlan, migs: dict[str, CreatedMig], recorded: tuple[MpsDaemon, ...]
    ) -> tuple[MpsDaemon, ...]:
        """One daemon per MPS group of the plan: the recorded one where it still serves the same cards
        with the same limits and share, else a new one."""
        known = {m.claim_uid: m for m in recorded}
        return tuple(self._group_daemon(g, migs, known.get(g.daemon_id)) for g in plan.mps_groups)

    def _group_daemon(self, group: MpsGroup, migs: dict[str, CreatedMig], recorded: MpsDaemon | None) -> MpsDaemon:
        order, limits_mib = self._mps_limits(group, migs)
        thread_percentage = group.active_thread_percentage
        if (
            recorded is not None
            and recorded.gpu_uuids == order
            and recorded.limits_mib == limits_mib
            and recorded.active_thread_percentage == thread_percentage
            and self.mps.adopt(recorded)
        ):
            return recorded
        return self.mps.start(group.daemon_id, order, limits_mib, thread_percentage)

    def _mps_limits(self, group: MpsGroup, migs: dict[str, CreatedMig]) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """Per visible device, in allocation order: the group's total on that card, never above the card
        nor above the group's configured pinnedDeviceMemoryLimit."""
        order: list[str] = []
        limits: dict[str, int] = {}
        capacity: dict[str, int] = {}
        for d in group.devices:
            visible, _ = self._visible(d, migs)
            if visible not in limits:
                order.append(visible)
                limits[visible] = 0
            limits[visible] += d.memory_limit_bytes
            capacity[visible] = d.target.memory_bytes
        cap = group.pinned_memory_limit
        return tuple(order), tuple(limit_mib(min(limits[v], capacity[v], cap or capacity[v])) for v in order)

    # -- undo --------------------------------------------------------------------------------------
    def teardown(self, entry: ClaimEntry) -> None:
        """Stop MPS, reset time slices, destroy MIG instances, delete the CDI spec; each a no-op when done."""
        recorded = [m.claim_uid for m in entry.mps_daemons]
        for daemon_id in recorded:
            self.mps.stop(daemon_id)
        # a daemon started after the PrepareStarted write is not recorded yet; the claim's first one
        # is found by its name here, later ones by recovery's orphan scan
        if entry.uid not in recorded and self.mps.is_running(entry.uid):
            self.mps.stop(entry.uid)
        self.fault_hook("unprepare-after-mps-stop")
        if self.timeslicer is not None:
            for gpu_uuid, _ in entry.time_slices:
                # best effort: a card left with a longer slice still works, a stuck unprepare blocks the pod
                try:
                    self.timeslicer.set_interval(gpu_uuid, "Default")
                except TimeSliceError as exc:
                    log.error(
                        "cannot reset the time-slice interval", claim_uid=entry.uid, gpu_uuid=gpu_uuid, error=str(exc)
                    )
        for m in entry.migs:
            self.mig.destroy(m)
        self.fault_hook("unprepare-after-mig-destroy")
        remove_spec(self.cdi_dir, entry.uid)
        self.fault_hook("unprepare-after-cdi-delete")
