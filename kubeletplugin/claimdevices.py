"""The devices of one claim on this node: MIG instances, CDI spec, time slices, MPS daemon.

ClaimDevices holds what DeviceState works with (inventory, directories, checkpoint, the MIG, MPS
and time-slice backends) and the steps both prepare and recovery take: create or reuse a claim's
MIG instances, build its CDI spec, start or adopt its MPS daemon, tear all of it down again. The
order of the steps, the checkpoint writes around them and the rollback are DeviceState's
(kubeletplugin/state.py); bringing the node back in line after a start is NodeRecovery's
(kubeletplugin/recovery.py). Each layer builds on the one below, never the other way round.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from driver import DRIVER_NAME
from driver.allocation import AllocatedDevice, ClaimAllocation
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
)
from driver.driverroot import DriverRoot
from driver.model import Inventory
from kubeletplugin.checkpoint import CheckpointStore, ClaimEntry
from kubeletplugin.faults import FaultHook, crash_from_env
from kubeletplugin.fsguard import require_private_dir
from kubeletplugin.kubeletclaims import PreparedDevice
from kubeletplugin.migmanager import CreatedMig, MigManager
from kubeletplugin.mps import MpsControl, MpsDaemon, limit_mib, mps_paths
from kubeletplugin.nodelocks import ClaimLocks
from kubeletplugin.timeslicing import TimeSliceError, TimeSlicer

log = structlog.get_logger(__name__)


@dataclass
class PrepareAttempt:
    """A prepare's entry as its steps advance between the two checkpoint writes (mutable on purpose)."""

    entry: ClaimEntry
    resumed: bool = False  # a PrepareStarted entry of an earlier attempt was found


@dataclass
class _LockSlot:
    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0  # threads holding or waiting for the lock; guarded by ClaimDevices._locks_guard


class ClaimDevices:
    """What a node's claims are made of, and the per-claim locks; DeviceState builds on it."""

    def __init__(  # noqa: PLR0917 (the fixed interface passes these positionally)
        self,
        inventory: Inventory,
        cdi_dir: Path,
        state_dir: Path,
        node_name: str,
        mps: MpsControl,
        mig: MigManager,
        driver_root: DriverRoot | None = None,
        *,
        proc_root: Path | None = None,
        driver_name: str = DRIVER_NAME,
        timeslicer: TimeSlicer | None = None,
        fault_hook: FaultHook = crash_from_env,
    ) -> None:
        self.inventory = inventory
        self.cdi_dir = cdi_dir
        self.state_dir = state_dir
        self.pool = node_name  # this node's devices are published in a pool named after it
        self.mps = mps
        self.mig = mig
        self.driver_root = driver_root
        self.proc_root = proc_root
        self.driver_name = driver_name
        self.timeslicer = timeslicer
        self.fault_hook = fault_hook
        # a simulated node has no /dev/nvidia* for the runtime to copy, so its specs carry the numbers
        self.device_numbers = SIMULATED_DEVICE_NUMBERS if inventory.source.startswith("simulated") else None
        self.store = CheckpointStore(state_dir)
        # the other instance of a rolling update prepares on the same node from the same checkpoint
        self.claim_locks = ClaimLocks(state_dir)
        self._locks: dict[str, _LockSlot] = {}
        self._locks_guard = threading.Lock()
        # temp files older than this agent were left by a killed one (a write of its own is younger)
        self._started = time.time()
        # a checkpoint or spec someone else can replace would decide what containers mount: both
        # directories must be ours and writable by us alone (created 0755 whatever the umask)
        require_private_dir(state_dir, "--state-dir")
        require_private_dir(cdi_dir, "--cdi-dir")

    @contextlib.contextmanager
    def _claim_lock(self, uid: str, *, across_instances: bool = True) -> Iterator[None]:
        """Hold the claim's lock, in this process and (unless the caller holds the node lock) on the node.

        Threads queue on the in-process lock first, so each process holds at most one file lock per
        claim. Whoever holds it reads the claim's checkpoint entry afresh, so a claim the other
        instance prepared meanwhile is answered from its entry, never prepared twice.
        A claim's in-process lock lives only while someone holds or waits for it, so the table stays
        as small as the number of claims in flight (kubelet may name any number of UIDs)."""
        with self._locks_guard:
            slot = self._locks.get(uid)
            if slot is None:
                slot = self._locks[uid] = _LockSlot()
            slot.users += 1
        try:
            with slot.lock, self.claim_locks.claim(uid) if across_instances else contextlib.nullcontext():
                yield
        finally:
            with self._locks_guard:
                slot.users -= 1
                if slot.users == 0:
                    del self._locks[uid]

    def _create_migs(self, alloc: ClaimAllocation, attempt: PrepareAttempt) -> dict[str, CreatedMig]:
        """Dynamic MIG instances by device name, reusing the ones the entry already records."""
        entry = attempt.entry
        out: dict[str, CreatedMig] = {}
        gone: list[CreatedMig] = []
        for d in alloc.devices:
            t = d.target
            if not t.is_dynamic_mig or d.device in out or t.mig_profile is None or t.placement is None:
                continue
            known = next(
                (
                    m
                    for m in entry.migs
                    if m.gpu_uuid == t.gpu.uuid and m.profile == t.mig_profile.name and m.placement == t.placement
                ),
                None,
            )
            if known is not None and self.mig.exists(known):
                out[d.device] = known
                continue
            if known is not None:
                gone.append(known)
            left = self._unowned_mig(t.gpu.uuid, t.mig_profile.name, t.placement) if attempt.resumed else None
            if left is not None:
                out[d.device] = left
                continue
            out[d.device] = self.mig.create(t.gpu, t.mig_profile, t.placement)
            # at once: if the next create fails, the rollback must destroy this one
            kept = tuple(m for m in entry.migs if m not in out.values() and m not in gone)
            attempt.entry = replace(entry, migs=(*kept, *out.values()))
        attempt.entry = replace(entry, migs=tuple(out.values()))
        return out

    def _unowned_mig(self, gpu_uuid: str, profile: str, placement: int) -> CreatedMig | None:
        """An instance at this claim's placement that no checkpoint entry owns: an earlier attempt of
        this claim created it and crashed before PrepareCompleted (the scheduler gave the placement
        to this claim, and no container ever ran on an instance of a prepare that never completed)."""
        owned = {m for e in self.store.load().values() for m in e.migs}
        for m in self.mig.created():
            wanted = (m.gpu_uuid, m.profile, m.placement) == (gpu_uuid, profile, placement)
            if wanted and m not in owned and self.mig.exists(m):
                return m
        return None

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

    def _build_spec(
        self, alloc: ClaimAllocation, migs: dict[str, CreatedMig], use_mps: bool
    ) -> tuple[dict[str, Any], tuple[PreparedDevice, ...]]:
        repeated = {d.device for d in alloc.devices if sum(o.device == d.device for o in alloc.devices) > 1}
        spec_devices: list[SpecDevice] = []
        prepared: list[PreparedDevice] = []
        for d in alloc.devices:
            suffix = (d.share_id or str(d.result_index)) if d.device in repeated else ""
            name = device_name(alloc.uid, d.device, suffix)
            visible, nodes = self._visible(d, migs)
            spec_devices.append(SpecDevice(name, visible, ContainerEdits(device_nodes=nodes)))
            prepared.append(PreparedDevice((d.base_request,), d.pool, d.device, (qualified_id(name),), d.share_id))
        common = self.driver_root.container_edits() if self.driver_root else ContainerEdits()
        if use_mps:
            common = common + mps_paths(self.state_dir, alloc.uid).container_edits()
        return build_claim_spec(alloc.uid, spec_devices, common, self.device_numbers), tuple(prepared)

    def _start_mps(
        self,
        alloc: ClaimAllocation,
        migs: dict[str, CreatedMig],
        recorded: MpsDaemon | None,
        thread_percentage: int | None,
    ) -> MpsDaemon:
        # per visible device, in CDI order: the claim's total on that card, never above the card
        order: list[str] = []
        limits: dict[str, int] = {}
        capacity: dict[str, int] = {}
        for d in alloc.devices:
            visible, _ = self._visible(d, migs)
            if visible not in limits:
                order.append(visible)
                limits[visible] = 0
            limits[visible] += d.memory_limit_bytes
            capacity[visible] = d.target.memory_bytes
        limits_mib = [limit_mib(min(limits[v], capacity[v])) for v in order]
        # the recorded daemon is adopted only if it serves the same cards with the same limits and share
        if (
            recorded is not None
            and recorded.gpu_uuids == tuple(order)
            and recorded.limits_mib == tuple(limits_mib)
            and recorded.active_thread_percentage == thread_percentage
            and self.mps.adopt(recorded)
        ):
            return recorded
        return self.mps.start(alloc.uid, order, limits_mib, thread_percentage)

    def _teardown(self, entry: ClaimEntry) -> None:
        """Stop MPS, destroy MIG instances, delete the CDI spec; each step is a no-op when already done."""
        if entry.mps is not None or self.mps.is_running(entry.uid):
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
