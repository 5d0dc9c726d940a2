"""DeviceState: what it means to prepare and unprepare a claim on this node.

The gRPC layer hands over a claim (already fetched from the apiserver) and gets back CDI device ids,
or an exception (it writes the claim's error text and the log line); everything in between happens
here, in this order, and a crash at any point is
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

from dataclasses import replace
from typing import Any

import structlog

from driver.allocation import AllocatedDevice, ClaimAllocation, parse_claim_allocation
from driver.cdi import check_claim_uid, remove_spec, write_spec
from driver.config import ConfigError, Strategy
from driver.errors import TesseraError
from kubeletplugin.checkpoint import ClaimEntry, ClaimState, GpuUse
from kubeletplugin.claimdevices import PrepareAttempt
from kubeletplugin.kubeletclaims import ClaimRef, PrepareResult
from kubeletplugin.recovery import NodeRecovery, RecoveryReport

__all__ = ["ConflictError", "DeviceState", "RecoveryReport"]

log = structlog.get_logger(__name__)


class ConflictError(TesseraError, ValueError):
    """The claim needs a GPU in a way another prepared claim rules out."""


def _use_kind(device: AllocatedDevice) -> str:
    if device.target.is_mig:
        return "mig"
    return "share" if device.memory_share else "exclusive"


class DeviceState(NodeRecovery):
    """Prepared claims of one node; thread-safe (a lock per claim plus the checkpoint's lock).

    Construction, the device steps and the locks are ClaimDevices' (kubeletplugin/claimdevices.py),
    recover() and recover_claims() NodeRecovery's (kubeletplugin/recovery.py).
    """

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
        attempt = PrepareAttempt(entry, resumed=resumed)
        try:
            return self._prepare_started(alloc, attempt, bool(mps_devices), percentages, slices)
        except Exception:
            # a failed prepare must not hold GPUs; kubelet retries from scratch
            self._roll_back(attempt.entry)
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
        attempt: PrepareAttempt,
        use_mps: bool,
        percentages: set[int | None],
        slices: tuple[tuple[str, str], ...],
    ) -> PrepareResult:
        # Between the PrepareStarted and PrepareCompleted writes, progress is kept in memory only
        # (for the rollback of a failure). A crash in between needs no record of it: recover() rolls
        # the PrepareStarted entry back, and its orphan scans remove the MIG instances, CDI spec and
        # MPS daemon that no completed entry owns; the time-slice cards are in the started entry.
        migs = self._create_migs(alloc, attempt)
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
            daemon = self._start_mps(alloc, migs, attempt.entry.mps, next(iter(percentages)))
            attempt.entry = replace(attempt.entry, mps=daemon)
        self.fault_hook("after-mps-start")

        self.fault_hook("before-checkpoint-completed")
        entry = replace(attempt.entry, state=ClaimState.PREPARE_COMPLETED, devices=devices)
        self.store.put(entry)
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
