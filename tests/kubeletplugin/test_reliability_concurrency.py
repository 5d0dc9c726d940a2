"""64 concurrent kubelet calls over the real gRPC socket: overlapping claims, shares of the same cards.

The plugin runs in-process (real unix sockets, real CDI and state dirs, the simulated node's
file-backed MPS fake) behind the kubelet stand-in; 64 client threads, each on its own connection,
prepare and unprepare claims that overlap: the same claim from several threads at once, sixteen
memory shares on two L4 cards, exclusive claims racing for one H100 that shares also want.
A sampler thread reads the MPS daemon records throughout and checks no share's limit ever
exceeds what the claim was allocated; it only records what it sees, and the test thread fails on
any violation it recorded, and checks the limits itself after each wave while claims are held
(a failed assert inside a thread is only a warning to pytest).
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from driver.cdi import claim_spec_uids
from kubeletplugin.checkpoint import ClaimState
from kubeletplugin.checkpointstore import CheckpointStore
from kubeletplugin.kubeletclaims import ClaimRef
from tests.builders.plugin import NODE, make_config
from tests.fakes.apiserver import FakeKubeAPI
from tests.fakes.kubeletclient import ClaimAnswer, KubeletClient, short_tmpdir

CALLS = 64
MIB = 1024 * 1024


@dataclass(frozen=True)
class Claim:
    ref: ClaimRef
    gpus: tuple[str, ...]
    memory: dict[str, int]  # allocated bytes per device of a share claim; empty when exclusive
    exclusive: bool


def _result(device: str, request: str, **extra: Any) -> dict[str, Any]:
    return {"request": request, "driver": "gpu.tessera.dev", "pool": NODE, "device": device, **extra}


def make_claims(fake: FakeKubeAPI) -> list[Claim]:
    claims: list[Claim] = []

    def add(name: str, results: list[dict[str, Any]], exclusive: bool) -> None:
        uid = f"00000000-0000-4000-c000-{len(claims):012d}"
        fake.add_claim({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default", "uid": uid},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev"}}]}},
            "status": {"allocation": {"devices": {"results": results, "config": []}}},
        })  # fmt: skip
        units = {"Mi": MIB, "Gi": 1024 * MIB}
        memory = {r["device"]: int(r["consumedCapacity"]["memory"][:-2]) * units[r["consumedCapacity"]["memory"][-2:]]
                  for r in results if "consumedCapacity" in r}  # fmt: skip
        gpus = tuple(dict.fromkeys(r["device"] for r in results))
        claims.append(Claim(ClaimRef("default", name, uid), gpus, memory, exclusive))

    rng = random.Random(7)
    for n in range(16):  # memory shares of the two L4s, some claims on both
        cards = ["gpu-2", "gpu-3"] if n % 4 == 0 else [rng.choice(["gpu-2", "gpu-3"])]
        add(f"share-{n}", [_result(c, "gpu", shareID=f"00000000-0000-4000-d000-{n:06d}{k:06d}",
                                   consumedCapacity={"memory": f"{rng.randint(256, 1300)}Mi"})
                           for k, c in enumerate(cards)], exclusive=False)  # fmt: skip
    for n in range(4):  # whole H100 wanted by four claims: at most one holds it
        add(f"whole-{n}", [_result("gpu-0", "gpu")], exclusive=True)
    for n in range(2):  # and two shares of it, which rule out the whole-card claims while held
        add(f"h100-share-{n}", [_result("gpu-0", "gpu", shareID=f"00000000-0000-4000-e000-{n:012d}",
                                        consumedCapacity={"memory": "10Gi"})], exclusive=False)  # fmt: skip
    add("mig-a", [_result("gpu-1-mig-1g10gb-6", "mig")], exclusive=True)
    add("mig-b", [_result("gpu-1-mig-3g40gb-0", "mig")], exclusive=True)
    return claims


@pytest.fixture
def plugin() -> Iterator[Any]:
    from driver.discovery import load_inventory
    from kubeletplugin.plugin import KubeletPlugin, build_device_state

    with short_tmpdir() as root:
        config = make_config(root)
        inventory = load_inventory(NODE, simulate="mixed")
        fake = FakeKubeAPI()
        fake.add_node(NODE)
        p = KubeletPlugin(config, fake, inventory, build_device_state(config, inventory))
        p.fake = fake  # type: ignore[attr-defined]
        p.start()
        yield p
        fake.close_watches()
        p.stop()


def mps_limits(state_dir: Path) -> dict[str, dict[str, Any]]:
    path = state_dir / "fake-mps.json"
    try:
        data: dict[str, dict[str, Any]] = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return data


def check_limits(state_dir: Path, by_uid: dict[str, Claim], inventory: Any) -> None:
    """Every running daemon's per-card limit is within the claim's allocation on that card."""
    for uid, record in mps_limits(state_dir).items():
        claim = by_uid[uid]
        for gpu_uuid, limit in zip(record["gpuUUIDs"], record["limitsMiB"], strict=True):
            device = inventory.gpu_by_uuid(gpu_uuid).device_name
            allocated = claim.memory.get(device, inventory.gpu_by_uuid(gpu_uuid).memory_bytes)
            assert limit * MIB <= allocated, f"{claim.ref.name}: limit {limit} MiB on {device} over {allocated} bytes"


def check_consistent(plugin: Any, claims: list[Claim]) -> set[str]:
    """Checkpoint, CDI dir and MPS records agree, and no card is held in two ways that cannot coexist."""
    entries = CheckpointStore(plugin.config.state_dir).load()
    assert {e.state for e in entries.values()} <= {ClaimState.PREPARE_COMPLETED}
    prepared = set(entries)
    assert set(claim_spec_uids(plugin.config.cdi_dir)) == prepared
    shares = {c.ref.uid for c in claims if c.memory}
    assert set(mps_limits(plugin.config.state_dir)) == prepared & shares
    holders = [c for c in claims if c.ref.uid in prepared and "gpu-0" in c.gpus]
    assert not any(c.exclusive for c in holders) or len(holders) == 1, [c.ref.name for c in holders]
    assert [p.name for p in plugin.config.cdi_dir.glob(".*.tmp")] == []
    return prepared


def test_64_concurrent_calls_keep_checkpoint_cdi_and_limits_consistent(plugin: Any) -> None:
    claims = make_claims(plugin.fake)
    by_uid = {c.ref.uid: c for c in claims}
    kubelet = KubeletClient(plugin.config.socket_paths.kubelet_dir)
    registered = kubelet.register()
    registered.close()
    rng = random.Random(64)
    answers: dict[str, list[ClaimAnswer]] = {}
    lock = threading.Lock()
    stop_sampling = threading.Event()
    samples = [0, 0]  # all samples, samples that saw at least one running daemon
    violations: list[str] = []

    def sampler() -> None:
        while not stop_sampling.is_set():
            try:
                check_limits(plugin.config.state_dir, by_uid, plugin.inventory)
            except AssertionError as exc:
                violations.append(str(exc))
            except ValueError:  # the record was being replaced as it was read: read it again
                continue
            samples[0] += 1
            samples[1] += bool(mps_limits(plugin.config.state_dir))
            stop_sampling.wait(0.002)

    def no_violations() -> None:
        assert violations == [], f"{len(violations)} limit samples over the allocation: {violations[:3]}"
        check_limits(plugin.config.state_dir, by_uid, plugin.inventory)  # here, with the claims held

    def call(op: str, batch: list[Claim]) -> None:
        conn = kubelet.register()
        try:
            if op == "prepare":
                for uid, answer in conn.prepare([c.ref for c in batch]).items():
                    if answer.error:  # the only refusal expected: a card held in a way that cannot coexist
                        assert "cannot coexist" in answer.error, answer.error
                    with lock:
                        answers.setdefault(uid, []).append(answer)
            else:
                errors = conn.unprepare([c.ref for c in batch])
                assert set(errors.values()) == {""}, errors
        finally:
            conn.close()

    def wave(ops: list[tuple[str, list[Claim]]]) -> None:
        barrier = threading.Barrier(len(ops))

        def run(item: tuple[str, list[Claim]]) -> None:
            barrier.wait()  # all 64 calls in flight together
            call(*item)

        with ThreadPoolExecutor(len(ops)) as pool:
            list(pool.map(run, ops))

    sampling = threading.Thread(target=sampler, daemon=True)
    sampling.start()
    try:
        # wave 1: 64 prepares, each claim asked for by several calls at once, batches of one to three
        wave([("prepare", rng.sample(claims, rng.randint(1, 3))) for _ in range(CALLS)])
        prepared = check_consistent(plugin, claims)
        assert mps_limits(plugin.config.state_dir), "wave 1 left shares with running daemons to check"
        no_violations()
        assert {c.ref.uid for c in claims if not c.exclusive} <= prepared | {
            c.ref.uid for c in claims if "gpu-0" in c.gpus}, "every share of the L4s prepares"
        for uid, got in answers.items():
            ok = [a for a in got if not a.error]
            assert all(a == ok[0] for a in ok), f"{by_uid[uid].ref.name} answered differently to concurrent calls"
            assert bool(ok) == (uid in prepared)

        # wave 2: 64 calls mixing prepares and unprepares of the same claims
        wave([(rng.choice(["prepare", "unprepare"]), rng.sample(claims, rng.randint(1, 3))) for _ in range(CALLS)])
        check_consistent(plugin, claims)
        no_violations()

        # everything released: nothing left anywhere
        wave([("unprepare", claims[i::CALLS]) for i in range(min(CALLS, len(claims)))])
        assert check_consistent(plugin, claims) == set()
        assert mps_limits(plugin.config.state_dir) == {}
    finally:
        stop_sampling.set()
        sampling.join()
    assert violations == [], f"{len(violations)} limit samples over the allocation: {violations[:3]}"
    print(f"concurrent calls: {3 * CALLS - (CALLS - len(claims))} in three waves of up to {CALLS}; "
          f"limit samples: {samples[0]}, {samples[1]} of them with daemons running")
    assert samples[1] > 0, "the sampler never saw a running daemon: it checked nothing"
