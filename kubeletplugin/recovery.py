"""Bringing the node in line with the checkpoint after the node agent starts.

A completed claim gets back its MIG instances, CDI spec, time slices and MPS daemon, rebuilt from
the recorded allocation; a half-done prepare is rolled back (kubelet never got an answer for it and
prepares it again); what no entry owns (CDI specs, MIG instances, MPS directories, temp files of
interrupted writes) is removed. The steps themselves are ClaimDevices'; DeviceState adds prepare
and unprepare on top.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import structlog

from driver.allocation import parse_claim_allocation
from driver.cdi import SPEC_PREFIX, CdiError, claim_spec_uids, read_spec, remove_spec, write_spec
from driver.config import Strategy
from driver.mig import layout_for
from kubeletplugin.checkpoint import ClaimEntry, ClaimState
from kubeletplugin.claimdevices import ClaimDevices
from kubeletplugin.migmanager import CreatedMig, MigError

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


class NodeRecovery(ClaimDevices):
    """recover() and recover_claims(): the checkpoint's claims restored or rolled back, orphans removed."""

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
        migs = self._recreate_migs(entry, report)
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

    def _recreate_migs(self, entry: ClaimEntry, report: RecoveryReport) -> list[CreatedMig]:
        """The entry's MIG instances, each one that vanished created again at its placement."""
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
        return migs

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
