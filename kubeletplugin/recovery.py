"""Bringing the node in line with the checkpoint after the node agent starts.

A completed claim gets back its MIG instances, CDI spec, time slices and MPS daemon, rebuilt from
the recorded allocation through the same plan and steps prepare uses; a half-done prepare is rolled
back (kubelet never got an answer for it and prepares it again); what no entry owns (CDI specs, MIG
instances, MPS directories, temp files of interrupted writes) is removed. Recovery works over the
checkpoint store and the device steps (kubeletplugin/devicesteps.py); DeviceState owns one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import structlog

from driver.allocation import plan_allocation
from driver.cdi import SPEC_PREFIX, CdiError, claim_spec_uids, read_spec, remove_spec, write_spec
from kubeletplugin.checkpoint import ClaimEntry, ClaimState
from kubeletplugin.checkpointstore import CheckpointStore
from kubeletplugin.devicesteps import DeviceSteps
from kubeletplugin.nodelocks import ClaimLockTable

log = structlog.get_logger(__name__)


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


class Recovery:
    """recover() and recover_claims(): the checkpoint's claims restored or rolled back, orphans removed."""

    def __init__(
        self, store: CheckpointStore, steps: DeviceSteps, locks: ClaimLockTable, pool: str, *, started: float
    ) -> None:
        self.store = store
        self.steps = steps
        self.locks = locks
        self.pool = pool
        # temp files older than this agent were left by a killed one (a write of its own is younger)
        self.started = started

    def recover(self) -> RecoveryReport:
        """Bring the node in line with the checkpoint after a start; see the module docstring.

        It holds the node-wide claim lock: the other instance of a rolling update may be serving
        calls, and a PrepareStarted entry or a spec without an entry is only abandoned when no
        prepare is under way anywhere on the node; meanwhile, that instance's calls wait.
        """
        with self.locks.node():
            report = RecoveryReport()
            # After a reboot no daemon tessera started is alive, and a recorded pid may now be anyone's:
            # every MPS daemon is started again rather than adopted. A format-1 file records no boot, so
            # its daemons are adopted when they answer, as format 1 did (an upgrade must not restart them).
            checkpoint = self.store.read()
            written_in = checkpoint.boot_id
            report.rebooted = bool(checkpoint.entries) and bool(written_in) and written_in != self.store.boot_id
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
            with self.locks.hold(uid, across_instances=across_instances):
                # read again under the lock: a call may have changed or dropped it meanwhile
                entry = self.store.get(uid)
                if entry is None:
                    continue
                try:
                    if entry.state == ClaimState.PREPARE_COMPLETED:
                        self._restore(replace(entry, mps_daemons=()) if report.rebooted else entry, report)
                    else:
                        # nobody is preparing it (we hold its lock): an abandoned attempt
                        self.steps.teardown(entry)
                        self.store.drop(uid)
                        report.rolled_back.append(uid)
                except Exception as exc:
                    log.exception("recovery of a claim failed", claim_uid=uid)
                    report.failed[uid] = str(exc)

    def _restore(self, entry: ClaimEntry, report: RecoveryReport) -> None:
        """A completed claim's MIG instances, CDI spec, time slices and MPS daemon, as prepare made them.

        The spec is rebuilt from the recorded allocation by the plan and steps prepare uses, never
        copied from the checkpoint: a forged entry can at most name devices of this node, not
        arbitrary mounts.
        """
        if entry.allocation is None:
            raise CdiError(
                f"checkpoint entry of claim {entry.namespace}/{entry.name} records no allocation (written by an "
                "older tessera), so its CDI spec cannot be rebuilt; if the spec is gone, delete the pod so that "
                "kubelet prepares the claim again"
            )
        plan = plan_allocation(entry.allocation, uid=entry.uid, namespace=entry.namespace, name=entry.name,
                               inventory=self.steps.inventory, pool=self.pool)  # fmt: skip
        migs = self.steps.restore_migs(plan, entry.migs)
        if migs.recreated:
            report.migs_recreated.append(entry.uid)
        spec = self.steps.claim_spec(plan, migs.by_device)
        if read_spec(self.steps.cdi_dir, entry.uid) != spec.spec:
            write_spec(self.steps.cdi_dir, entry.uid, spec.spec)
            report.specs_rewritten.append(entry.uid)
        # a reboot or GPU reset puts the interval back to the default
        if self.steps.timeslicer is not None:
            self.steps.set_time_slices(entry.uid, entry.time_slices)
        daemons = self.steps.start_mps(plan, migs.by_device, entry.mps_daemons)
        # a daemon adopted is the recorded object itself; any other one was started again
        if any(all(d is not r for r in entry.mps_daemons) for d in daemons):
            report.mps_restarted.append(entry.uid)
        updated = replace(entry, migs=migs.instances, mps_daemons=daemons)
        if updated != entry:
            self.store.put(updated)

    def _remove_orphans(self, report: RecoveryReport) -> None:
        entries = self.store.load()
        cdi_dir, state_dir, mig, mps = self.steps.cdi_dir, self.steps.state_dir, self.steps.mig, self.steps.mps
        for uid in claim_spec_uids(cdi_dir):
            if uid not in entries:
                self._cleanup(report, f"cdi:{uid}", functools.partial(remove_spec, cdi_dir, uid))
                report.orphan_specs_removed.append(uid)
        known = {m for e in entries.values() for m in e.migs}
        for m in mig.created():
            if m not in known:
                self._cleanup(report, f"mig:{m.uuid}", functools.partial(mig.destroy, m))
                report.orphan_migs_destroyed.append(m.uuid)
        known_daemons = set(entries) | {m.claim_uid for e in entries.values() for m in e.mps_daemons}
        mps_root = state_dir / "mps"
        if mps_root.is_dir():
            for d in sorted(mps_root.iterdir()):
                if d.name not in known_daemons:
                    self._cleanup(report, f"mps:{d.name}", functools.partial(mps.stop, d.name))
                    report.orphan_mps_stopped.append(d.name)
        self._remove_stale_temp_files(report)

    def _remove_stale_temp_files(self, report: RecoveryReport) -> None:
        """Temp files of atomic writes a SIGKILL interrupted (another claim's thread was mid-write).

        CDI loaders ignore them, but each one would stay forever. In the shared CDI dir only
        tessera's own spec temp files are touched; files younger than this agent may belong to a
        write in progress (the old pod of a rolling update), so they are left alone.
        """
        candidates = [*self.steps.cdi_dir.glob(f".{SPEC_PREFIX}*.tmp"), *self.steps.state_dir.glob(".*.tmp")]
        for path in sorted(candidates):
            try:
                if path.stat().st_mtime >= self.started:
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
