"""DeviceState: what it means to prepare and unprepare a claim on this node.

The gRPC layer hands over a claim (already fetched from the apiserver) and gets back CDI device ids,
or an exception (it writes the claim's error text and the log line); everything in between happens
here, in this order, and a crash at any point is repaired (the two checkpoint writes of each side
are the only durable records; what happens between them is found again by recovery's orphan scans):

prepare:   plan the claim (driver/allocation.py, pure) -> checkpoint entry `PrepareStarted` -> create
           dynamic MIG instances -> write the CDI spec -> set time-slice intervals -> start an MPS
           daemon per MPS group of the plan -> `PrepareCompleted`.
unprepare: checkpoint entry `UnprepareStarted` -> stop MPS -> reset time-slice intervals -> destroy
           MIG instances -> delete the CDI spec -> drop the entry.

The steps are DeviceSteps' (kubeletplugin/devicesteps.py); this module orders them and keeps the
checkpoint. A prepare that finds its own `PrepareStarted` entry (kubelet retried after a timeout or
a crash) rolls forward, reusing what the entry says was already done and the unowned MIG instance at
its own placement that the earlier attempt created. A prepare that fails rolls back, so a failed
claim holds no GPU. Recovery (kubeletplugin/recovery.py) on start rolls *back* every half-done
prepare: kubelet never got an answer for it, so no container uses it, and kubelet's retry prepares
it from the claim again; completed claims get their CDI specs and MPS daemons back.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import structlog

from driver.allocation import ClaimPlan, GpuUse, plan_claim
from driver.cdi import check_claim_uid, remove_spec, write_spec
from driver.errors import TesseraError
from kubeletplugin.checkpoint import ClaimEntry, ClaimState
from kubeletplugin.checkpointstore import CheckpointStore
from kubeletplugin.devicesteps import DeviceSteps
from kubeletplugin.kubeletclaims import ClaimRef, PrepareResult
from kubeletplugin.nodelocks import ClaimLockTable
from kubeletplugin.recovery import Recovery, RecoveryReport

__all__ = ["ConflictError", "DeviceState", "RecoveryReport"]

log = structlog.get_logger(__name__)


class ConflictError(TesseraError, ValueError):
    """The claim needs a GPU in a way another prepared claim rules out."""

    reason = "conflict"


class DeviceState:
    """Prepared claims of one node; thread-safe (a lock per claim plus the checkpoint's lock)."""

    def __init__(self, steps: DeviceSteps, pool: str) -> None:
        self.steps = steps
        self.pool = pool  # this node's devices are published in a pool named after it
        self.inventory = steps.inventory
        self.cdi_dir = steps.cdi_dir
        self.state_dir = steps.state_dir
        self.mps = steps.mps
        self.mig = steps.mig
        self.store = CheckpointStore(steps.state_dir)
        self.locks = ClaimLockTable(steps.state_dir)
        # temp files older than this agent were left by a killed one (a write of its own is younger)
        self.recovery = Recovery(self.store, steps, self.locks, pool, started=time.time())

    def prepared_claims(self) -> dict[str, ClaimEntry]:
        return self.store.load()

    def recover(self) -> RecoveryReport:
        return self.recovery.recover()

    def recover_claims(self) -> RecoveryReport:
        return self.recovery.recover_claims()

    # -- prepare -----------------------------------------------------------------------------------
    def prepare(self, ref: ClaimRef, claim: dict[str, Any]) -> PrepareResult:
        """Prepare one claim; the same answer every time it is asked again.

        A failure raises (a TesseraError when the claim or the node is at fault) after rolling back;
        the gRPC layer turns it into the claim's error text and logs it.
        """
        check_claim_uid(ref.uid)
        with self.locks.hold(ref.uid):
            earlier = self.store.get(ref.uid)
            if earlier is not None and earlier.state == ClaimState.PREPARE_COMPLETED:
                return PrepareResult(earlier.devices)
            if earlier is not None and earlier.state == ClaimState.UNPREPARE_STARTED:
                self.steps.teardown(earlier)
                self.store.drop(ref.uid)
                earlier = None
            plan = plan_claim(claim, ref_uid=ref.uid, inventory=self.inventory, pool=self.pool)
            if not plan.devices:
                return PrepareResult()
            entry = self._record_started(plan, earlier)
            self.steps.fault_hook("after-checkpoint-started")
            # Between the PrepareStarted and PrepareCompleted writes, progress is kept in `entry` only
            # (for the rollback of a failure). A crash in between needs no record of it: recovery rolls
            # the PrepareStarted entry back, and its orphan scans remove the MIG instances, CDI spec and
            # MPS daemon that no completed entry owns; the time-slice cards are in the started entry.
            owned = {m for e in self.store.load().values() for m in e.migs} if earlier is not None else None
            try:
                migs = self.steps.create_migs(plan, entry.migs, owned=owned)
                entry = replace(entry, migs=tuple(migs.values()))
                self.steps.fault_hook("after-mig-create")

                spec = self.steps.claim_spec(plan, migs)
                write_spec(self.cdi_dir, plan.uid, spec.spec)
                self.steps.fault_hook("after-cdi-write")

                self.steps.set_time_slices(plan.uid, plan.time_slices)
                entry = replace(entry, mps_daemons=self.steps.start_mps(plan, migs, entry.mps_daemons))
                self.steps.fault_hook("after-mps-start")

                self.steps.fault_hook("before-checkpoint-completed")
                self.store.put(replace(entry, state=ClaimState.PREPARE_COMPLETED, devices=spec.devices))
            except Exception:
                # a failed prepare must not hold GPUs; kubelet retries from scratch
                self._roll_back(entry)
                raise
            return PrepareResult(spec.devices)

    def _record_started(self, plan: ClaimPlan, earlier: ClaimEntry | None) -> ClaimEntry:
        """Write the PrepareStarted entry, after checking the claim against the other prepared claims."""
        # intervals are recorded here, before they are applied, so a crash in between still gets the
        # cards reset; resetting a card this claim never got to touch is harmless (it is this claim's)
        applies_slices = bool(plan.time_slices) and self.steps.timeslicer is not None
        with self.store.transaction() as entries:
            self._check_conflicts(plan, entries)
            entry = ClaimEntry(
                uid=plan.uid,
                namespace=plan.namespace,
                name=plan.name,
                state=ClaimState.PREPARE_STARTED,
                gpu_uses=plan.gpu_uses,
                allocation=plan.allocation,
                mps_daemons=earlier.mps_daemons if earlier else (),
                migs=earlier.migs if earlier else (),
                time_slices=plan.time_slices if applies_slices else (earlier.time_slices if earlier else ()),
            )
            entries[plan.uid] = entry
        return entry

    def _roll_back(self, entry: ClaimEntry) -> None:
        try:
            self.steps.teardown(entry)
            self.store.drop(entry.uid)
        except Exception:
            log.exception("rollback of a failed prepare failed", claim_uid=entry.uid)
            # the steps between the two checkpoint writes live only in memory; record them now, so
            # kubelet's retry rolls forward with what exists instead of colliding with it
            try:
                self.store.put(entry)
            except Exception:
                log.exception("cannot record the failed prepare's progress", claim_uid=entry.uid)

    def _check_conflicts(self, plan: ClaimPlan, entries: dict[str, ClaimEntry]) -> None:
        for other in entries.values():
            if other.uid == plan.uid:
                continue
            for mine in plan.gpu_uses:
                for theirs in other.gpu_uses:
                    if _compatible(mine, theirs):
                        continue
                    gpu = next((g.device_name for g in self.inventory.gpus if g.uuid == mine.gpu_uuid), mine.gpu_uuid)
                    raise ConflictError(
                        f"{gpu} is already prepared for claim {other.namespace}/{other.name} ({theirs.kind} use); "
                        f"this claim needs it for {mine.kind} use, which cannot coexist; it can be prepared once "
                        "that claim is released"
                    )

    # -- unprepare ---------------------------------------------------------------------------------
    def unprepare(self, ref: ClaimRef) -> None:
        """Undo a prepare (also fine for claims never prepared); a failure raises, as for prepare."""
        with self.locks.hold(ref.uid):
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
            self.steps.fault_hook("unprepare-after-checkpoint-started")
            self.steps.teardown(entry)
            self.store.drop(ref.uid)


def _compatible(mine: GpuUse, theirs: GpuUse) -> bool:
    """Two claims' uses of GPUs: only the same card matters, and there only two non-exclusive uses of one kind."""
    return mine.gpu_uuid != theirs.gpu_uuid or mine.kind == theirs.kind != "exclusive"
