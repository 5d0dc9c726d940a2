"""Crash consistency: the node agent killed at random points of prepare, unprepare and recovery.

Two kinds of kill, counted separately (docs/reliability.md reports both):

- in-process kill points: DeviceState's crash hook raises a BaseException at the n-th step it
  reaches, which nothing in DeviceState catches, so the step is abandoned like a SIGKILL would
  abandon it. A fresh DeviceState over the same directories then runs recover(), kubelet's calls
  are replayed, and the node must match a run that never crashed. A restarted agent may be killed
  again (during recovery or the replay), so chains of crashes are covered too, and a quarter of the
  restarts follow a simulated reboot (CDI tmpfs wiped, MPS daemons and MIG instances gone).
- real SIGKILLs: `tessera kubelet-plugin` as a process, started with TESSERA_CRASH_AT, driven over
  its real gRPC socket by the kubelet stand-in, killed, restarted, until kubelet's wishes are met.

After every scenario: no orphaned CDI spec, no orphaned MPS daemon record or directory, no MIG
instance nobody owns, no temporary file, every prepared claim answers the CDI ids it answered
before, and every unprepared claim is gone.
"""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from driver.cdi import claim_spec_uids
from kubeletplugin.checkpoint import ClaimState
from kubeletplugin.faults import PREPARE_STEPS, UNPREPARE_STEPS
from kubeletplugin.kubeletclaims import ClaimRef, PrepareResult
from kubeletplugin.mps import SimulatedMpsControl
from kubeletplugin.state import DeviceState
from kubeletplugin.timeslicing import SimulatedTimeSlicer
from tests.builders.claims import gpu_config, make_claim, result, share
from tests.builders.plugin import NODE, PluginProcess, mps_records
from tests.builders.state import make_steps
from tests.fakes.apiserver import FakeApiServer
from tests.fakes.kubeletclient import KubeletClient, short_tmpdir

PROFILE = "h100-16-mig"
ALL_STEPS = PREPARE_STEPS + UNPREPARE_STEPS
IN_PROCESS_SCENARIOS = 144  # 16 per step, each scenario at least one kill point
SEED = 20261122


class Killed(BaseException):
    """The process died at a step; BaseException, so no `except Exception` in DeviceState sees it."""


# -- claim mixes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimPlan:
    uid: str
    name: str
    results: list[dict[str, Any]]
    configs: list[dict[str, Any]] | None = None
    uses_mps: bool = False
    mig_count: int = 0

    @property
    def ref(self) -> ClaimRef:
        return ClaimRef("team-a", self.name, self.uid)

    def claim(self) -> dict[str, Any]:
        return make_claim(self.results, self.configs, uid=self.uid, name=self.name)


def random_claims(rng: random.Random) -> list[ClaimPlan]:
    """3-5 claims that can all be prepared together: distinct cards for exclusive uses, shared cards for shares."""
    gpus = list(range(16))
    rng.shuffle(gpus)
    share_cards = gpus[:2]  # memory shares of different claims may land on the same card
    free = gpus[2:]
    plans: list[ClaimPlan] = []
    for n in range(rng.randint(3, 5)):
        uid = f"00000000-0000-4000-8000-{rng.getrandbits(40):012x}"
        name = f"c{n}"
        kind = rng.choice(["whole", "share", "multishare", "timeslice", "mig", "mig-share-mps"])
        if kind == "whole":
            plans.append(ClaimPlan(uid, name, [result(f"gpu-{free.pop()}")]))
        elif kind == "share":
            card = rng.choice(share_cards)
            sid = f"00000000-0000-4000-9000-{n:012d}"
            plans.append(ClaimPlan(uid, name, [share(f"gpu-{card}", f"{rng.randint(1, 20)}Gi", "gpu", sid)],
                                   [gpu_config(mps={"activeThreadPercentage": rng.choice([10, 50, 100])})],
                                   uses_mps=True))
        elif kind == "multishare":
            sids = [f"00000000-0000-4000-a000-{n:06d}{k:06d}" for k in range(2)]
            shares = [share(f"gpu-{c}", "2Gi", "gpu", s) for c, s in zip(share_cards, sids, strict=True)]
            plans.append(ClaimPlan(uid, name, shares, uses_mps=True))
        elif kind == "timeslice":
            interval = rng.choice(["Short", "Medium", "Long"])
            plans.append(ClaimPlan(uid, name, [result(f"gpu-{free.pop()}")],
                                   [gpu_config(strategy="TimeSlicing", timeSlicing={"interval": interval})]))
        elif kind == "mig":
            card = free.pop()
            placement = rng.choice([0, 1, 2, 3, 4, 5, 6])
            plans.append(ClaimPlan(uid, name, [result(f"gpu-{card}-mig-1g10gb-{placement}", "mig")], mig_count=1))
        else:
            card = free.pop()
            plans.append(ClaimPlan(uid, name, [result(f"gpu-{card}-mig-3g40gb-0", "mig"),
                                               result(f"gpu-{card}-mig-3g40gb-4", "mig")],
                                   [gpu_config(strategy="MPS")], uses_mps=True, mig_count=2))
    return plans


@dataclass(frozen=True)
class Op:
    kind: str  # "prepare" | "unprepare"
    plan: ClaimPlan


def random_ops(rng: random.Random, plans: list[ClaimPlan]) -> list[Op]:
    """Kubelet's calls: every claim prepared, some released, one of those prepared again."""
    ops = [Op("prepare", p) for p in plans]
    released = rng.sample(plans, rng.randint(1, len(plans) - 1))
    ops += [Op("unprepare", p) for p in released]
    if rng.random() < 0.5:
        again = rng.choice(released)
        ops += [Op("prepare", again)]
    rng.shuffle(ops[len(plans):])
    return ops


# -- the node under test ---------------------------------------------------------------------------


@dataclass
class CountingHook:
    """Counts the steps reached; raises Killed at the `kill_at`-th (1-based), or never when it is 0."""

    kill_at: int = 0
    reached: list[str] = field(default_factory=list)

    def __call__(self, step: str) -> None:
        self.reached.append(step)
        if len(self.reached) == self.kill_at:
            raise Killed(step)


def node(root: Path, hook: Callable[[str], None]) -> DeviceState:
    state_dir = root / "state"
    return DeviceState(make_steps(root, PROFILE, hook, timeslicer=SimulatedTimeSlicer(state_dir)), "node-a")


def run_op(state: DeviceState, op: Op) -> PrepareResult | str:
    if op.kind == "prepare":
        return state.prepare(op.plan.ref, op.plan.claim())
    state.unprepare(op.plan.ref)
    return ""


def reference_run(root: Path, ops: list[Op]) -> tuple[list[PrepareResult | str], list[str]]:
    """Kubelet's calls on a node that never crashes: the answers, and every step reached in order."""
    hook = CountingHook()
    state = node(root, hook)
    answers = [run_op(state, op) for op in ops]
    return answers, hook.reached


def assert_consistent(state: DeviceState, prepared: dict[str, ClaimPlan]) -> None:
    """The node holds exactly the prepared claims and nothing else, on disk and in its fakes."""
    entries = state.store.load()
    assert sorted(entries) == sorted(prepared)
    assert {e.state for e in entries.values()} <= {ClaimState.PREPARE_COMPLETED}
    assert sorted(claim_spec_uids(state.cdi_dir)) == sorted(prepared), "orphaned or missing CDI spec"
    mps_uids = sorted(u for u, p in prepared.items() if p.uses_mps)
    assert isinstance(state.mps, SimulatedMpsControl)
    assert sorted(state.mps.daemons()) == mps_uids, "orphaned or missing MPS daemon record"
    mps_dir = state.state_dir / "mps"
    assert (sorted(p.name for p in mps_dir.iterdir()) if mps_dir.exists() else []) == mps_uids, "orphaned MPS dir"
    owned = sorted(m.uuid for e in entries.values() for m in e.migs)
    assert sorted(m.uuid for m in state.mig.created()) == owned, "MIG instance that no claim owns"
    assert len(owned) == sum(p.mig_count for p in prepared.values())
    assert isinstance(state.steps.timeslicer, SimulatedTimeSlicer)
    sliced = {u for e in entries.values() for u, _ in e.time_slices}
    assert set(state.steps.timeslicer.intervals()) <= sliced, "time-slice interval left on a released card"
    for d in (state.cdi_dir, state.state_dir):
        leftovers = [p.name for p in d.rglob(".*.tmp")] if d.exists() else []
        assert leftovers == [], f"temporary files left in {d}"


def reboot(base: Path) -> None:
    """The node rebooted while the agent was down: /var/run/cdi is a tmpfs, MPS daemons and dynamic
    MIG instances are gone and time-slice intervals are back to the default; the state dir stays."""
    for spec in (base / "cdi").glob("*"):
        spec.unlink()
    for record in ("fake-mps.json", "mig-instances.json", "fake-timeslice.json"):
        (base / "state" / record).unlink(missing_ok=True)


@dataclass
class Tally:
    kill_points: int = 0
    chains: int = 0
    reboots: int = 0
    by_step: dict[str, int] = field(default_factory=dict)


def crash_scenario(root: Path, seed: int, target_step: str, tally: Tally) -> None:
    rng = random.Random(seed)
    plans = random_claims(rng)
    ops = random_ops(rng, plans)
    answers, steps = reference_run(root / "reference", ops)
    assert not [a for a in answers if isinstance(a, PrepareResult) and a.error], "the mix itself must prepare"
    expected = {op.plan.uid: a for op, a in zip(ops, answers, strict=True) if isinstance(a, PrepareResult)}
    candidates = [i + 1 for i, s in enumerate(steps) if s == target_step]
    if not candidates:  # e.g. no unprepare in the rollback path of this mix: kill at any step of that phase
        candidates = list(range(1, len(steps) + 1))

    base = root / "node"
    hook = CountingHook(rng.choice(candidates))
    state = node(base, hook)
    prepared: dict[str, ClaimPlan] = {}
    pending = list(ops)
    while pending:
        op = pending[0]
        try:
            answer = run_op(state, op)
        except Killed as killed:
            tally.kill_points += 1
            tally.by_step[str(killed)] = tally.by_step.get(str(killed), 0) + 1
            if rng.random() < 0.25:
                reboot(base)
                tally.reboots += 1
            # restarted agent: maybe killed again (during recovery or the replay), half of the time
            again = CountingHook(rng.randint(1, 12) if rng.random() < 0.5 else 0)
            tally.chains += again.kill_at > 0
            state = node(base, again)
            try:
                state.recover()
                # kubelet asks again for every claim it believes prepared: same answers as before
                for uid, plan in prepared.items():
                    if not (op.kind == "unprepare" and uid == op.plan.uid):
                        assert state.prepare(plan.ref, plan.claim()) == expected[uid]
            except Killed as twice:
                tally.kill_points += 1
                tally.by_step[str(twice)] = tally.by_step.get(str(twice), 0) + 1
                state = node(base, CountingHook())
                state.recover()
            continue  # the interrupted call is retried
        if op.kind == "prepare":
            assert answer == expected[op.plan.uid]
            prepared[op.plan.uid] = op.plan
        else:
            assert answer == ""
            prepared.pop(op.plan.uid, None)
        pending.pop(0)

    final = node(base, CountingHook())
    final.recover()
    assert_consistent(final, prepared)
    for uid, plan in prepared.items():
        assert final.prepare(plan.ref, plan.claim()) == expected[uid]
    assert_consistent(final, prepared)


@pytest.mark.slow
def test_random_kill_points_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A killed process loses nothing the kernel already holds; fsync only matters for power loss,
    # which this test does not model, and thousands of them would dominate its run time.
    monkeypatch.setattr("os.fsync", lambda fd: None)
    tally = Tally()
    for n in range(IN_PROCESS_SCENARIOS):
        step = ALL_STEPS[n % len(ALL_STEPS)]
        crash_scenario(tmp_path / f"s{n}", SEED + n, step, tally)
    print(f"in-process kill points survived: {tally.kill_points} in {IN_PROCESS_SCENARIOS} scenarios "
          f"({tally.chains} restarts killed again, {tally.reboots} restarts after a reboot); "
          f"by step: {dict(sorted(tally.by_step.items()))}")
    assert tally.kill_points >= 200
    assert set(tally.by_step) >= set(ALL_STEPS), "every crash step is exercised"


# -- real SIGKILLs of the plugin process -------------------------------------------------------------

SUBPROCESS_KILLS = 18  # two per step; each costs a plugin start (~2 s of CPU)
MIXED_CLAIMS: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]]]] = [
    # (name, results, configs) on the "mixed" profile the plugin process simulates
    ("whole", [result("gpu-0")], []),
    ("mig", [result("gpu-1-mig-1g10gb-6", "mig")], []),
    ("mig-mps", [result("gpu-1-mig-3g40gb-0", "mig")], [gpu_config(strategy="MPS")]),
    ("share-a", [share("gpu-2", "4Gi", "gpu", "00000000-0000-4000-9000-00000000000a")], []),
    ("share-b", [share("gpu-2", "2Gi", "gpu", "00000000-0000-4000-9000-00000000000b")], []),
    ("share-c", [share("gpu-3", "1Gi", "gpu", "00000000-0000-4000-9000-00000000000c")], []),
]
MPS_NAMES = {"mig-mps", "share-a", "share-b", "share-c"}


def _cluster_claim(name: str, uid: str, results: list[dict[str, Any]], configs: list[dict[str, Any]]) -> dict[str, Any]:
    claim = make_claim([{**r, "pool": NODE} for r in results], configs, uid=uid, name=name)
    claim["metadata"]["namespace"] = "default"
    return claim


@dataclass
class Kubelet:
    """What kubelet wants prepared, what it has seen answered, and how many kills it sat through."""

    refs: dict[str, ClaimRef]
    wanted: set[str] = field(default_factory=set)
    maybe_prepared: set[str] = field(default_factory=set)
    first_answers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def sync(self, plugin: PluginProcess) -> None:
        """One pass of kubelet's reconciler; raises grpc.RpcError when the plugin dies under it."""
        conn = KubeletClient(plugin.paths.kubelet_dir).register()
        try:
            todo = [self.refs[n] for n in sorted(self.wanted)]
            if todo:
                self.maybe_prepared |= self.wanted
                for uid, answer in conn.prepare(todo).items():
                    assert answer.error == "", answer.error
                    name = next(n for n, r in self.refs.items() if r.uid == uid)
                    assert self.first_answers.setdefault(name, answer.devices) == answer.devices
            gone = [self.refs[n] for n in sorted(self.maybe_prepared - self.wanted)]
            if gone:
                assert set(conn.unprepare(gone).values()) == {""}
                self.maybe_prepared -= {r.name for r in gone}
        finally:
            conn.close()


@pytest.mark.slow
def test_sigkill_at_random_steps_then_restart_replays_kubelet(apiserver: FakeApiServer) -> None:
    with short_tmpdir() as root:
        sigkill_rounds(apiserver, root)


def sigkill_rounds(apiserver: FakeApiServer, root: Path) -> None:
    rng = random.Random(SEED)
    kubeconfig = apiserver.write_kubeconfig(root / "kubeconfig")
    refs = {}
    for n, (name, results, configs) in enumerate(MIXED_CLAIMS):
        uid = f"00000000-0000-4000-b000-{n:012d}"
        apiserver.fake.add_claim(_cluster_claim(name, uid, results, configs))
        refs[name] = ClaimRef("default", name, uid)
    kubelet = Kubelet(refs)
    kills: dict[str, int] = {}
    plugin: PluginProcess | None = None
    try:
        for k in range(SUBPROCESS_KILLS):
            step = ALL_STEPS[k % len(ALL_STEPS)]
            plugin = PluginProcess(root, kubeconfig, env={"TESSERA_CRASH_AT": step})
            try:
                plugin.start()
            except AssertionError:  # killed in recover() at start, before it served
                assert plugin.wait() == -signal.SIGKILL, "".join(plugin.lines)
                kills[step] = kills.get(step, 0) + 1
                continue
            for _ in range(20):  # kubelet's pods come and go until the step is reached
                if step in UNPREPARE_STEPS and not kubelet.maybe_prepared - kubelet.wanted:
                    kubelet.wanted = set(rng.sample(sorted(kubelet.wanted), len(kubelet.wanted) // 2))
                elif step in PREPARE_STEPS:
                    kubelet.wanted |= {rng.choice(sorted(set(refs) - kubelet.wanted or set(refs)))}
                try:
                    kubelet.sync(plugin)
                except grpc.RpcError as err:
                    assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL)
                    break
                if step in PREPARE_STEPS and kubelet.wanted == set(refs):
                    kubelet.wanted = set()
            assert plugin.wait() == -signal.SIGKILL, f"the plugin was to die at {step}"
            kills[step] = kills.get(step, 0) + 1

        plugin = PluginProcess(root, kubeconfig)
        plugin.start()
        kubelet.wanted = set(rng.sample(sorted(refs), 3))
        kubelet.sync(plugin)
        kubelet.sync(plugin)  # and once more: same answers, nothing new on disk
        wanted_uids = sorted(refs[n].uid for n in kubelet.wanted)
        assert sorted(claim_spec_uids(plugin.cdi_dir)) == wanted_uids
        assert sorted(mps_records(plugin.state_dir)) == sorted(refs[n].uid for n in kubelet.wanted & MPS_NAMES)
        mps_dir = plugin.state_dir / "mps"
        assert sorted(p.name for p in mps_dir.iterdir()) == sorted(mps_records(plugin.state_dir))
        assert [p.name for p in root.rglob(".*.tmp")] == []
        kubelet.wanted = set()
        kubelet.sync(plugin)
        assert claim_spec_uids(plugin.cdi_dir) == []
        assert mps_records(plugin.state_dir) == {}
        plugin.signal(signal.SIGTERM)
        assert plugin.wait() == 0
    finally:
        if plugin is not None:
            plugin.kill()
    print(f"subprocess SIGKILLs survived: {sum(kills.values())}; by step: {dict(sorted(kills.items()))}")
    assert sum(kills.values()) == SUBPROCESS_KILLS
    assert set(kills) == set(ALL_STEPS)


def test_recover_removes_temp_files_a_kill_left_and_nothing_else(tmp_path: Path) -> None:
    state = node(tmp_path, CountingHook())
    state.cdi_dir.mkdir(parents=True, exist_ok=True)
    stale_spec = state.cdi_dir / ".gpu.tessera.dev-claim_00000000-0000-4000-8000-000000000001.json.ab12.tmp"
    stale_state = state.state_dir / ".checkpoint.json.cd34.tmp"
    foreign = state.cdi_dir / ".vendor.example-gpu.json.ef56.tmp"  # another driver's file in the shared dir
    for path in (stale_spec, stale_state, foreign):
        path.write_text("{")
        os.utime(path, (state.recovery.started - 60, state.recovery.started - 60))
    restarted = node(tmp_path, CountingHook())
    young = restarted.state_dir / ".fake-mps.json.gh78.tmp"  # a write that started after this agent did
    young.write_text("{")
    os.utime(young, (restarted.recovery.started + 1, restarted.recovery.started + 1))
    report = restarted.recover()
    assert sorted(report.temp_files_removed) == sorted([str(stale_spec), str(stale_state)])
    assert not stale_spec.exists() and not stale_state.exists()
    assert foreign.exists() and young.exists()
