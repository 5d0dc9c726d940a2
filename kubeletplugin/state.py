"""DeviceState: what it means to prepare and unprepare a claim on this node.

The gRPC layer hands over a claim (already fetched from the apiserver) and gets back CDI device ids,
or an error text; everything in between happens here, in this order, and a crash at any point is
repaired (the two checkpoint writes of each side are the only durable records; what happens
between them is found again by recover()'s orphan scans):

prepare:   parse allocation + config (pure) -> checkpoint entry `PrepareStarted` -> create dynamic
           MIG instances -> write the CDI spec -> set time-slice intervals -> start the claim's MPS
           daemon -> `PrepareCompleted`.
unprepare: checkpoint entry `UnprepareStarted` -> stop MPS -> reset time-slice intervals -> destroy
           MIG instances -> delete the CDI spec -> drop the entry.

A prepare that finds its own `PrepareStarted` entry (kubelet retried after a timeout or a crash)
rolls forward, reusing what the entry says was already done and the unowned MIG instance at its
own placement that the earlier attempt created. A prepare that fails rolls back, so
a failed claim holds no GPU. `recover()` on start rolls *back* every half-done prepare: kubelet
never got an answer for it, so no container uses it, and kubelet's retry prepares it from the
claim again; completed claims get their CDI specs and MPS daemons back.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from driver.allocation import DRIVER_NAME, AllocatedDevice, ClaimAllocation, parse_claim_allocation
from driver.cdi import (
    SIMULATED_DEVICE_NUMBERS,
    SPEC_PREFIX,
    CdiError,
    ContainerEdits,
    DeviceNode,
    SpecDevice,
    build_claim_spec,
    check_claim_uid,
    claim_spec_uids,
    device_name,
    gpu_device_nodes,
    mig_device_nodes,
    qualified_id,
    read_spec,
    remove_spec,
    write_spec,
)
from driver.config import ConfigError, Strategy
from driver.driverroot import DriverRoot
from driver.errors import TesseraError
from driver.mig import layout_for
from driver.model import Inventory
from kubeletplugin.checkpoint import CheckpointStore, ClaimEntry, ClaimState, GpuUse
from kubeletplugin.faults import FaultHook, crash_from_env
from kubeletplugin.fsguard import require_private_dir
from kubeletplugin.migmanager import CreatedMig, MigError, MigManager
from kubeletplugin.mps import MpsControl, MpsDaemon, limit_mib, mps_paths
from kubeletplugin.nodelocks import ClaimLocks
from kubeletplugin.timeslicing import TimeSliceError, TimeSlicer
from kubeletplugin.types import ClaimRef, PreparedDevice, PrepareResult

log = structlog.get_logger(__name__)

class ConflictError(TesseraError, ValueError):
    """The claim needs a GPU in a way another prepared claim rules out."""


@dataclass
class RecoveryReport:
    rolled_back: list[str] = field(default_factory=list)
    specs_rewritten: list[str] = field(default_factory=list)
    mps_restarted: list[str] = field(default_factory=list)
    migs_recreated: list[str] = field(default_factory=list)
    orphan_specs_removed: list[str] = field(default_factory=list)
    orphan_migs_destroyed: list[str] = field(default_factory=list)
    orphan_mps_stopped: list[str] = field(default_factory=list)
    temp_files_removed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    # the checkpoint was written in another boot of this node
    rebooted: bool = False


@dataclass
class _Progress:
    """A prepare's entry as its steps advance between the two checkpoint writes (mutable on purpose)."""

    entry: ClaimEntry
    resumed: bool = False  # a PrepareStarted entry of an earlier attempt was found


@dataclass
class _LockSlot:
    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0  # threads holding or waiting for the lock; guarded by DeviceState._locks_guard


def _use_kind(device: AllocatedDevice) -> str:
    if device.target.is_mig:
        return "mig"
    return "share" if device.memory_share else "exclusive"


class DeviceState:
    """Prepared claims of one node; thread-safe (a lock per claim plus the checkpoint's lock)."""

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
        self.node_name = node_name
        self.pool = node_name
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

    # --- prepare ----------------------------------------------------------------------------

    def prepare(self, ref: ClaimRef, claim: dict[str, Any]) -> PrepareResult:
        """Prepare one claim; the same answer every time it is asked again.

        A failure raises (a TesseraError when the claim or the node is at fault) after rolling back;
        the gRPC layer turns it into the claim's error text and logs it.
        """
        with self._claim_lock(ref.uid):
            return self._prepare(ref, claim)

    def _prepare(self, ref: ClaimRef, claim: dict[str, Any]) -> PrepareResult:
        check_claim_uid(ref.uid)
        entry = self.store.get(ref.uid)
        if entry is not None and entry.state == ClaimState.PREPARE_COMPLETED:
            return PrepareResult(entry.devices)
        if entry is not None and entry.state == ClaimState.UNPREPARE_STARTED:
            self._teardown(entry)
            self.store.drop(ref.uid)
            entry = None
        alloc = parse_claim_allocation(claim, ref_uid=ref.uid, inventory=self.inventory, pool=self.pool,
                                       driver=self.driver_name)  # fmt: skip
        if not alloc.devices:
            return PrepareResult()
        mps_devices = [d for d in alloc.devices if d.sharing.strategy == Strategy.MPS]
        if mps_devices and len(mps_devices) != len(alloc.devices):
            raise ConfigError(
                f"ResourceClaim {alloc.namespace}/{alloc.name}",
                "one MPS daemon serves the whole claim, so either all of its devices use strategy MPS "
                "(memory shares always do) or none; put the other devices in a separate claim",
            )
        percentages = {d.sharing.active_thread_percentage for d in mps_devices}
        if len(percentages) > 1:
            raise ConfigError(
                f"ResourceClaim {alloc.namespace}/{alloc.name}",
                f"one MPS daemon serves the whole claim, so sharing.mps.activeThreadPercentage must be the same "
                f"for all its devices, got {sorted(percentages, key=str)}",
            )

        uses = tuple(
            dict.fromkeys(GpuUse(d.target.gpu.uuid, _use_kind(d)) for d in alloc.devices if not d.admin_access)
        )
        slices = tuple(
            dict.fromkeys(
                (d.target.gpu.uuid, d.sharing.time_slice_interval)
                for d in alloc.devices
                if d.sharing.strategy == Strategy.TIME_SLICING
            )
        )
        # intervals are recorded here, before they are applied, so a crash in between still gets the
        # cards reset; resetting a card this claim never got to touch is harmless (it is this claim's)
        time_slices = slices if slices and self.timeslicer is not None else (entry.time_slices if entry else ())
        resumed = entry is not None
        with self.store.transaction() as entries:
            self._check_conflicts(alloc, uses, entries)
            entry = ClaimEntry(
                uid=ref.uid,
                namespace=alloc.namespace,
                name=alloc.name,
                state=ClaimState.PREPARE_STARTED,
                gpu_uses=uses,
                allocation=_allocation_record(claim, self.driver_name, self.pool),
                mps=entry.mps if entry else None,
                migs=entry.migs if entry else (),
                time_slices=time_slices,
            )
            entries[ref.uid] = entry
        self.fault_hook("after-checkpoint-started")
        progress = _Progress(entry, resumed=resumed)
        try:
            return self._prepare_started(alloc, progress, bool(mps_devices), percentages, slices)
        except Exception:
            # a failed prepare must not hold GPUs; kubelet retries from scratch
            self._roll_back(progress.entry)
            raise

    def _roll_back(self, entry: ClaimEntry) -> None:
        try:
            self._teardown(entry)
            self.store.drop(entry.uid)
        except Exception:
            log.exception("rollback of a failed prepare failed", claim_uid=entry.uid)
            # the steps between the two checkpoint writes live only in memory; record them now, so
            # kubelet's retry rolls forward with what exists instead of colliding with it
            try:
                self.store.put(entry)
            except Exception:
                log.exception("cannot record the failed prepare's progress", claim_uid=entry.uid)

    def _prepare_started(
        self,
        alloc: ClaimAllocation,
        progress: _Progress,
        use_mps: bool,
        percentages: set[int | None],
        slices: tuple[tuple[str, str], ...],
    ) -> PrepareResult:
        # Between the PrepareStarted and PrepareCompleted writes, progress is kept in memory only
        # (for the rollback of a failure). A crash in between needs no record of it: recover() rolls
        # the PrepareStarted entry back, and its orphan scans remove the MIG instances, CDI spec and
        # MPS daemon that no completed entry owns; the time-slice cards are in the started entry.
        migs = self._create_migs(alloc, progress)
        self.fault_hook("after-mig-create")

        spec, devices = self._build_spec(alloc, migs, use_mps)
        write_spec(self.cdi_dir, alloc.uid, spec)
        self.fault_hook("after-cdi-write")

        if slices and self.timeslicer is not None:
            for gpu_uuid, interval in slices:
                self.timeslicer.set_interval(gpu_uuid, interval)
        elif any(interval != "Default" for _, interval in slices):
            log.warning("time-slice interval not applied: no time slicer configured", claim_uid=alloc.uid)

        if use_mps:
            daemon = self._start_mps(alloc, migs, progress.entry.mps, next(iter(percentages)))
            progress.entry = replace(progress.entry, mps=daemon)
        self.fault_hook("after-mps-start")

        self.fault_hook("before-checkpoint-completed")
        entry = replace(progress.entry, state=ClaimState.PREPARE_COMPLETED, devices=devices)
        self.store.put(entry)
        progress.entry = entry
        return PrepareResult(devices)

    def _check_conflicts(
        self, alloc: ClaimAllocation, uses: tuple[GpuUse, ...], entries: dict[str, ClaimEntry]
    ) -> None:
        for other in entries.values():
            if other.uid == alloc.uid:
                continue
            for mine in uses:
                for theirs in other.gpu_uses:
                    if mine.gpu_uuid != theirs.gpu_uuid or mine.kind == theirs.kind != "exclusive":
                        continue
                    gpu = next((g.device_name for g in self.inventory.gpus if g.uuid == mine.gpu_uuid), mine.gpu_uuid)
                    raise ConflictError(
                        f"{gpu} is already prepared for claim {other.namespace}/{other.name} ({theirs.kind} use); "
                        f"this claim needs it for {mine.kind} use, which cannot coexist; it can be prepared once "
                        "that claim is released"
                    )

    def _create_migs(self, alloc: ClaimAllocation, progress: _Progress) -> dict[str, CreatedMig]:
        """Dynamic MIG instances by device name, reusing the ones the entry already records."""
        entry = progress.entry
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
            left = self._unowned_mig(t.gpu.uuid, t.mig_profile.name, t.placement) if progress.resumed else None
            if left is not None:
                out[d.device] = left
                continue
            out[d.device] = self.mig.create(t.gpu, t.mig_profile, t.placement)
            # at once: if the next create fails, the rollback must destroy this one
            kept = tuple(m for m in entry.migs if m not in out.values() and m not in gone)
            progress.entry = replace(entry, migs=(*kept, *out.values()))
        progress.entry = replace(entry, migs=tuple(out.values()))
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
        self, alloc: ClaimAllocation, migs: dict[str, CreatedMig], recorded: MpsDaemon | None, atp: int | None
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
        wanted = MpsDaemon(alloc.uid, "", "", "", tuple(order), tuple(limits_mib), atp)
        if recorded is not None and (recorded.gpu_uuids, recorded.limits_mib, recorded.active_thread_percentage) == (
            wanted.gpu_uuids, wanted.limits_mib, wanted.active_thread_percentage,
        ) and self.mps.adopt(recorded):  # fmt: skip
            return recorded
        return self.mps.start(alloc.uid, order, limits_mib, atp)

    # --- unprepare --------------------------------------------------------------------------

    def unprepare(self, ref: ClaimRef) -> None:
        """Undo a prepare (also fine for claims never prepared); a failure raises, as for prepare."""
        with self._claim_lock(ref.uid):
            check_claim_uid(ref.uid)
            entry = self.store.get(ref.uid)
            if entry is None:
                if remove_spec(self.cdi_dir, ref.uid):
                    log.info("removed a CDI spec of a claim not in the checkpoint", claim_uid=ref.uid,
                             claim=f"{ref.namespace}/{ref.name}")  # fmt: skip
                return
            if entry.state != ClaimState.UNPREPARE_STARTED:
                entry = replace(entry, state=ClaimState.UNPREPARE_STARTED)
                self.store.put(entry)
            self.fault_hook("unprepare-after-checkpoint-started")
            self._teardown(entry)
            self.store.drop(ref.uid)

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

    # --- recovery ---------------------------------------------------------------------------

    def prepared_claims(self) -> dict[str, ClaimEntry]:
        return self.store.load()

    def recover(self) -> RecoveryReport:
        """Bring the node in line with the checkpoint after a start; see the module docstring.

        It holds the node-wide claim lock: the other instance of a rolling update may be serving
        calls, and a PrepareStarted entry or a spec without an entry is only abandoned when no
        prepare is under way anywhere on the node; meanwhile, that instance's calls wait.
        """
        with self.claim_locks.node():
            return self._recover()

    def _recover(self) -> RecoveryReport:
        report = RecoveryReport()
        # After a reboot no daemon tessera started is alive, and a recorded pid may now be anyone's:
        # every MPS daemon is started again rather than adopted. A format-1 file records no boot, so
        # its daemons are adopted when they answer, as format 1 did (an upgrade must not restart them).
        entries = self.store.load()
        written_in = self.store.written_in_boot
        report.rebooted = bool(entries) and bool(written_in) and written_in != self.store.boot_id
        self._recover_claims(report, across_instances=False)
        self._remove_orphans(report)
        self.store.stamp_boot()
        log.info("recovery done", **{k: v for k, v in report.__dict__.items() if v})
        return report

    def recover_claims(self) -> RecoveryReport:
        """recover() for the checkpoint's claims only, each under its own node-wide claim lock.

        For a running instance (the other one of a rolling update just left): calls for other
        claims go on meanwhile, which the node lock of a full recover() would hold up while MPS
        daemons restart. Orphans (files no entry owns) wait for the next start.
        """
        report = RecoveryReport()
        self._recover_claims(report, across_instances=True)
        log.info("claims recovered", **{k: v for k, v in report.__dict__.items() if v})
        return report

    def _recover_claims(self, report: RecoveryReport, *, across_instances: bool) -> None:
        for uid in self.store.load():
            with self._claim_lock(uid, across_instances=across_instances):
                # read again under the lock: a call may have changed or dropped it meanwhile
                entry = self.store.get(uid)
                if entry is None:
                    continue
                try:
                    if entry.state == ClaimState.PREPARE_COMPLETED:
                        self._restore(replace(entry, mps=None) if report.rebooted else entry, report)
                    else:
                        # nobody is preparing it (we hold its lock): an abandoned attempt
                        self._teardown(entry)
                        self.store.drop(uid)
                        report.rolled_back.append(uid)
                except Exception as exc:
                    log.exception("recovery of a claim failed", claim_uid=uid)
                    report.failed[uid] = str(exc)

    def _restore(self, entry: ClaimEntry, report: RecoveryReport) -> None:
        """A completed claim's MIG instances, CDI spec, time slices and MPS daemon, as prepare made them.

        The spec is rebuilt from the recorded allocation by the code prepare uses, never copied from
        the checkpoint: a forged entry can at most name devices of this node, not arbitrary mounts.
        """
        if entry.allocation is None:
            raise CdiError(
                f"checkpoint entry of claim {entry.namespace}/{entry.name} records no allocation (written by an "
                "older tessera), so its CDI spec cannot be rebuilt; if the spec is gone, delete the pod so that "
                "kubelet prepares the claim again"
            )
        migs = list(entry.migs)
        for i, m in enumerate(migs):
            if self.mig.exists(m):
                continue
            # the instance vanished (GPU reset or reboot): same placement again, new UUID and caps
            gpu = self.inventory.gpu_by_uuid(m.gpu_uuid)
            layout = layout_for(gpu.product_name)
            if layout is None:
                raise MigError(f"{gpu.device_name}: no MIG table for {gpu.product_name}")
            migs[i] = self.mig.create(gpu, layout.profile(m.profile), m.placement)
            report.migs_recreated.append(entry.uid)
        claim = {
            "metadata": {"uid": entry.uid, "namespace": entry.namespace, "name": entry.name},
            "status": {"allocation": entry.allocation},
        }
        alloc = parse_claim_allocation(claim, ref_uid=entry.uid, inventory=self.inventory, pool=self.pool,
                                       driver=self.driver_name)  # fmt: skip
        by_placement = {(m.gpu_uuid, m.profile, m.placement): m for m in migs}
        mig_of: dict[str, CreatedMig] = {}
        for d in alloc.devices:
            t = d.target
            if t.is_dynamic_mig and t.mig_profile is not None and t.placement is not None:
                found = by_placement.get((t.gpu.uuid, t.mig_profile.name, t.placement))
                if found is None:
                    raise MigError(f"claim {entry.namespace}/{entry.name}: no MIG instance recorded for {d.device}")
                mig_of[d.device] = found
        mps_devices = [d for d in alloc.devices if d.sharing.strategy == Strategy.MPS]
        spec, _ = self._build_spec(alloc, mig_of, bool(mps_devices))
        if read_spec(self.cdi_dir, entry.uid) != spec:
            write_spec(self.cdi_dir, entry.uid, spec)
            report.specs_rewritten.append(entry.uid)
        if self.timeslicer is not None:
            # a reboot or GPU reset puts the interval back to the default
            for gpu_uuid, interval in entry.time_slices:
                self.timeslicer.set_interval(gpu_uuid, interval)
        mps = entry.mps
        if mps_devices:
            mps = self._start_mps(alloc, mig_of, entry.mps, mps_devices[0].sharing.active_thread_percentage)
            if mps is not entry.mps:
                report.mps_restarted.append(entry.uid)
        updated = replace(entry, migs=tuple(migs), mps=mps)
        if updated != entry:
            self.store.put(updated)

    def _remove_orphans(self, report: RecoveryReport) -> None:
        entries = self.store.load()
        for uid in claim_spec_uids(self.cdi_dir):
            if uid not in entries:
                self._cleanup(report, f"cdi:{uid}", functools.partial(remove_spec, self.cdi_dir, uid))
                report.orphan_specs_removed.append(uid)
        known = {m for e in entries.values() for m in e.migs}
        for m in self.mig.created():
            if m not in known:
                self._cleanup(report, f"mig:{m.uuid}", functools.partial(self.mig.destroy, m))
                report.orphan_migs_destroyed.append(m.uuid)
        mps_root = self.state_dir / "mps"
        if mps_root.is_dir():
            for d in sorted(mps_root.iterdir()):
                if d.name not in entries:
                    self._cleanup(report, f"mps:{d.name}", functools.partial(self.mps.stop, d.name))
                    report.orphan_mps_stopped.append(d.name)
        self._remove_stale_temp_files(report)

    def _remove_stale_temp_files(self, report: RecoveryReport) -> None:
        """Temp files of atomic writes a SIGKILL interrupted (another claim's thread was mid-write).

        CDI loaders ignore them, but each one would stay forever. In the shared CDI dir only
        tessera's own spec temp files are touched; files younger than this agent may belong to a
        write in progress (the old pod of a rolling update), so they are left alone.
        """
        candidates = [*self.cdi_dir.glob(f".{SPEC_PREFIX}*.tmp"), *self.state_dir.glob(".*.tmp")]
        for path in sorted(candidates):
            try:
                if path.stat().st_mtime >= self._started:
                    continue
            except FileNotFoundError:
                continue
            self._cleanup(report, f"tmp:{path}", functools.partial(path.unlink, missing_ok=True))
            report.temp_files_removed.append(str(path))

    @staticmethod
    def _cleanup(report: RecoveryReport, what: str, action: Callable[[], object]) -> None:
        """One orphan's cleanup; a failure is reported, it must not keep the plugin from starting."""
        try:
            action()
        except Exception as exc:
            log.exception("orphan cleanup failed", orphan=what)
            report.failed[what] = str(exc)


def _allocation_record(claim: dict[str, Any], driver: str, pool: str) -> dict[str, Any]:
    """The part of status.allocation that prepares this node's devices; others' entries become null so
    result indices (which name repeated devices) stay as they are."""
    devices = claim["status"]["allocation"].get("devices") or {}

    def ours(result: Any) -> bool:
        return isinstance(result, dict) and result.get("driver") == driver and result.get("pool") == pool

    def our_config(entry: Any) -> bool:
        opaque = entry.get("opaque") if isinstance(entry, dict) else None
        return isinstance(opaque, dict) and opaque.get("driver") == driver

    return {
        "devices": {
            "results": [r if ours(r) else None for r in devices.get("results") or []],
            "config": [c if our_config(c) else None for c in devices.get("config") or []],
        }
    }
