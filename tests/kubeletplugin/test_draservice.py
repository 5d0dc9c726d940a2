"""NodePrepareResources / NodeUnprepareResources over real unix sockets, as kubelet calls them.

The first part drives the wire layer with a small scripted DeviceState, to pin what kubelet sees for
every per-claim failure; the second part (further down) runs against the real DeviceState.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from driver.errors import TesseraError
from driver.kubeapi import KubeAPI
from kubeletplugin.draservice import DraService, base_request_names
from kubeletplugin.grpcservers import SocketPaths, UnixSocketServer
from kubeletplugin.kubeletclaims import ClaimRef, PreparedDevice, PrepareResult
from kubeletplugin.metrics import PluginMetrics
from tests.fakes.apiserver import FakeKubeAPI
from tests.fakes.kubeletclient import PluginConnection, short_tmpdir

NODE = "node-a"
DRIVER = "gpu.tessera.dev"


def make_claim(
    name: str,
    results: list[dict[str, Any]] | None = None,
    *,
    namespace: str = "default",
    uid: str | None = None,
    allocated: bool = True,
) -> dict[str, Any]:
    """A ResourceClaim as the apiserver returns it after the scheduler allocated it."""
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev"}}]}},
        "status": {},
    }
    if allocated:
        claim["status"]["allocation"] = {
            "devices": {
                "results": results
                if results is not None
                else [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}],
                "config": [],
            },
            "nodeSelector": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}]
            },
        }
    return claim


def ref_of(claim: dict[str, Any]) -> ClaimRef:
    meta = claim["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


@dataclass
class ScriptedState:
    """Answers prepare from the allocation like DeviceState would, with hooks to misbehave."""

    prepared: dict[str, PrepareResult] = field(default_factory=dict)
    prepare_calls: list[str] = field(default_factory=list)
    unprepare_calls: list[str] = field(default_factory=list)
    on_prepare: Callable[[ClaimRef], None] | None = None
    fail_with: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def prepare(self, ref: ClaimRef, claim: dict[str, Any]) -> PrepareResult:
        with self.lock:
            self.prepare_calls.append(ref.uid)
        if self.on_prepare is not None:
            self.on_prepare(ref)
        if ref.uid in self.fail_with:
            raise TesseraError(self.fail_with[ref.uid])
        devices = tuple(
            PreparedDevice(
                request_names=(r["request"],),
                pool_name=r["pool"],
                device_name=r["device"],
                cdi_device_ids=(f"gpu.tessera.dev/claim={ref.uid}-{r['device']}",),
                share_id=r.get("shareID", ""),
            )
            for r in claim["status"]["allocation"]["devices"]["results"]
        )
        result = PrepareResult(devices=devices)
        with self.lock:
            self.prepared[ref.uid] = result
        return result

    def unprepare(self, ref: ClaimRef) -> None:
        with self.lock:
            self.unprepare_calls.append(ref.uid)
            self.prepared.pop(ref.uid, None)
        if ref.uid in self.fail_with:
            raise TesseraError(self.fail_with[ref.uid])


@dataclass
class Rig:
    api: FakeKubeAPI
    state: ScriptedState
    metrics: PluginMetrics
    conn: PluginConnection
    paths: SocketPaths


def start_dra(
    api: KubeAPI, state: Any, paths: SocketPaths, metrics: PluginMetrics, **kwargs: Any
) -> tuple[DraService, UnixSocketServer]:
    service = DraService(api, state, metrics=metrics, **kwargs)
    server = UnixSocketServer("dra", paths.dra_socket, [service.add_to], max_workers=8)
    server.start()
    return service, server


@pytest.fixture
def rig() -> Iterator[Rig]:
    with short_tmpdir() as kubelet_dir:
        api = FakeKubeAPI()
        state = ScriptedState()
        metrics = PluginMetrics()
        paths = SocketPaths(kubelet_dir)
        service, server = start_dra(api, state, paths, metrics, deadline_margin=0.5, pool=NODE)
        conn = PluginConnection(str(paths.dra_socket), "v1.DRAPlugin", DRIVER, ())
        try:
            yield Rig(api, state, metrics, conn, paths)
        finally:
            conn.close()
            server.stop(0)
            service.close()


def counter(metrics: PluginMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


# -- answers kubelet gets -----------------------------------------------------------------------


def test_prepare_returns_the_devices_of_each_claim_keyed_by_uid(rig: Rig) -> None:
    claim = rig.api.add_claim(make_claim("c1"))
    answer = rig.conn.prepare([ref_of(claim)])
    assert set(answer) == {"uid-c1"}
    entry = answer["uid-c1"]
    assert entry.error == ""
    assert entry.devices == [
        {
            "request_names": ["gpu"],
            "pool_name": NODE,
            "device_name": "gpu-0",
            "cdi_device_ids": ["gpu.tessera.dev/claim=uid-c1-gpu-0"],
            "share_id": None,
        }
    ]


@pytest.mark.parametrize("version", ["v1.DRAPlugin", "v1beta1.DRAPlugin"])
def test_both_api_versions_prepare_and_unprepare(rig: Rig, version: str) -> None:
    claim = rig.api.add_claim(make_claim("c1"))
    answer = rig.conn.prepare([ref_of(claim)], version=version)
    assert [d["device_name"] for d in answer["uid-c1"].devices] == ["gpu-0"]
    assert rig.conn.unprepare([ref_of(claim)], version=version) == {"uid-c1": ""}
    assert rig.state.unprepare_calls == ["uid-c1"]


def test_v1_carries_share_id_and_v1beta1_has_no_such_field(rig: Rig) -> None:
    share = "3f2c8a9e-5d41-4b7a-9e2f-6c0d1a2b3c4d"
    claim = rig.api.add_claim(
        make_claim("s1", [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-1", "shareID": share}])
    )
    v1_dev = rig.conn.prepare([ref_of(claim)], version="v1.DRAPlugin")["uid-s1"].devices[0]
    beta_dev = rig.conn.prepare([ref_of(claim)], version="v1beta1.DRAPlugin")["uid-s1"].devices[0]
    assert v1_dev["share_id"] == share
    assert "share_id" not in beta_dev
    assert {k: v for k, v in v1_dev.items() if k != "share_id"} == beta_dev


def test_subrequest_names_are_returned_as_their_main_request() -> None:
    assert base_request_names(["accel/full", "accel/mig", "other"]) == ["accel", "other"]


def test_subrequest_results_reach_kubelet_as_base_request_names(rig: Rig) -> None:
    claim = rig.api.add_claim(
        make_claim("p1", [{"request": "accel/mig", "driver": DRIVER, "pool": NODE, "device": "gpu-0-mig-1g10gb-0"}])
    )
    assert rig.conn.prepare([ref_of(claim)])["uid-p1"].devices[0]["request_names"] == ["accel"]


def test_empty_request_gets_empty_answer(rig: Rig) -> None:
    assert rig.conn.prepare([]) == {}
    assert rig.conn.unprepare([]) == {}


# -- per-claim failures --------------------------------------------------------------------------


def test_unknown_claim_fails_alone_and_the_rest_of_the_batch_succeeds(rig: Rig) -> None:
    good = rig.api.add_claim(make_claim("good"))
    missing = ClaimRef("default", "gone", "uid-gone")
    answer = rig.conn.prepare([ref_of(good), missing])
    assert answer["uid-good"].error == "" and answer["uid-good"].devices
    assert answer["uid-gone"].devices == []
    assert "cannot read ResourceClaim default/gone: it does not exist" in answer["uid-gone"].error
    assert rig.state.prepare_calls == ["uid-good"]


def test_replaced_claim_is_refused_without_preparing(rig: Rig) -> None:
    rig.api.add_claim(make_claim("c1", uid="uid-new"))
    answer = rig.conn.prepare([ClaimRef("default", "c1", "uid-old")])
    assert "has uid uid-new but kubelet asked for uid uid-old" in answer["uid-old"].error
    assert "deleted and re-created" in answer["uid-old"].error
    assert rig.state.prepare_calls == []


def test_unallocated_claim_is_refused(rig: Rig) -> None:
    claim = rig.api.add_claim(make_claim("c1", allocated=False))
    answer = rig.conn.prepare([ref_of(claim)])
    assert "is not allocated (status.allocation is empty)" in answer["uid-c1"].error
    assert rig.state.prepare_calls == []


def test_claim_with_only_another_drivers_devices_is_refused(rig: Rig) -> None:
    claim = rig.api.add_claim(
        make_claim("nic", [{"request": "nic", "driver": "net.example.com", "pool": NODE, "device": "eth1"}])
    )
    error = rig.conn.prepare([ref_of(claim)])["uid-nic"].error
    assert "has no device allocated by gpu.tessera.dev (its devices come from: net.example.com)" in error
    assert rig.state.prepare_calls == []


def test_claim_allocated_on_another_node_is_refused(rig: Rig) -> None:
    claim = rig.api.add_claim(
        make_claim("elsewhere", [{"request": "gpu", "driver": DRIVER, "pool": "node-b", "device": "gpu-0"}])
    )
    error = rig.conn.prepare([ref_of(claim)])["uid-elsewhere"].error
    assert "only in pool(s) node-b, none on this node (pool node-a)" in error
    assert rig.state.prepare_calls == []


def test_mixed_driver_claim_is_prepared_for_this_driver(rig: Rig) -> None:
    claim = rig.api.add_claim(
        make_claim(
            "mixed",
            [
                {"request": "nic", "driver": "net.example.com", "pool": NODE, "device": "eth1"},
                {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-3"},
            ],
        )
    )
    assert rig.conn.prepare([ref_of(claim)])["uid-mixed"].error == ""
    assert rig.state.prepare_calls == ["uid-mixed"]


def test_apiserver_down_is_a_retryable_per_claim_error(rig: Rig) -> None:
    claim = rig.api.add_claim(make_claim("c1"))
    rig.api.fail_next(1)
    answer = rig.conn.prepare([ref_of(claim)])
    assert answer["uid-c1"].error.startswith("cannot read ResourceClaim default/c1: apiserver unreachable")
    assert answer["uid-c1"].error.endswith("kubelet will retry")
    # kubelet's retry succeeds once the apiserver is back
    assert rig.conn.prepare([ref_of(claim)])["uid-c1"].error == ""


@pytest.mark.parametrize(
    ("status", "reason", "expected"),
    [
        (503, "ServiceUnavailable", "apiserver answered 503 ServiceUnavailable, kubelet will retry"),
        (429, "TooManyRequests", "apiserver answered 429 TooManyRequests, kubelet will retry"),
        (403, "Forbidden", "needs 'get' on resourceclaims.resource.k8s.io"),
        (400, "BadRequest", "apiserver answered 400 BadRequest"),
    ],
)
def test_apiserver_errors_become_clear_claim_errors(rig: Rig, status: int, reason: str, expected: str) -> None:
    claim = rig.api.add_claim(make_claim("c1"))
    rig.api.fail_next(1, status=status, reason=reason)
    assert expected in rig.conn.prepare([ref_of(claim)])["uid-c1"].error


def test_device_state_error_is_passed_to_kubelet(rig: Rig) -> None:
    claim = rig.api.add_claim(make_claim("c1"))
    rig.state.fail_with["uid-c1"] = "GPU gpu-0 is not on this node"
    assert rig.conn.prepare([ref_of(claim)])["uid-c1"].error == "GPU gpu-0 is not on this node"


def test_device_state_crash_is_a_claim_error_not_a_grpc_error(rig: Rig) -> None:
    good = rig.api.add_claim(make_claim("good"))
    bad = rig.api.add_claim(make_claim("bad"))

    def explode(ref: ClaimRef) -> None:
        if ref.name == "bad":
            raise RuntimeError("checkpoint disk full")

    rig.state.on_prepare = explode
    answer = rig.conn.prepare([ref_of(good), ref_of(bad)])
    assert answer["uid-good"].error == ""
    assert answer["uid-bad"].error == "internal error preparing ResourceClaim default/bad: checkpoint disk full"


def test_unprepare_needs_no_apiserver_and_accepts_unknown_claims(rig: Rig) -> None:
    rig.api.fail_next(5)  # the claim may be long gone from the apiserver
    answer = rig.conn.unprepare([ClaimRef("default", "never-prepared", "uid-x")])
    assert answer == {"uid-x": ""}
    assert not [c for c in rig.api.calls if c.startswith("get_claim")]


def test_unprepare_failure_is_reported_per_claim(rig: Rig) -> None:
    rig.state.fail_with["uid-b"] = "cannot stop MPS daemon"
    answer = rig.conn.unprepare([ClaimRef("default", "a", "uid-a"), ClaimRef("default", "b", "uid-b")])
    assert answer == {"uid-a": "", "uid-b": "cannot stop MPS daemon"}


def test_unprepare_crash_is_a_claim_error(rig: Rig) -> None:
    def boom(ref: ClaimRef) -> None:
        raise KeyError("mig")

    rig.state.unprepare = boom  # type: ignore[method-assign]
    answer = rig.conn.unprepare([ClaimRef("default", "a", "uid-a")])
    assert answer["uid-a"] == "internal error unpreparing ResourceClaim default/a: 'mig'"


def test_a_failing_disk_fails_the_claim_alone_with_a_retryable_error(rig: Rig) -> None:
    claim = rig.api.add_claim(make_claim("full"))

    def disk_full(ref: ClaimRef, *args: Any) -> None:
        raise OSError(28, "No space left on device", "/var/lib/tessera/checkpoint.json")

    rig.state.on_prepare = disk_full
    rig.state.unprepare = disk_full  # type: ignore[method-assign]
    answer = rig.conn.prepare([ref_of(claim)])
    assert answer["uid-full"].error == (
        "cannot prepare claim default/full: No space left on device (/var/lib/tessera/checkpoint.json); "
        "kubelet will retry"
    )
    unprepared = rig.conn.unprepare([ref_of(claim)])
    assert unprepared["uid-full"] == "[Errno 28] No space left on device: '/var/lib/tessera/checkpoint.json'"


def test_each_failure_is_logged_once_by_the_grpc_layer(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    import kubeletplugin.draservice

    events: list[tuple[str, dict[str, Any]]] = []

    class Recorder:
        def __init__(self, **context: Any) -> None:
            self.context = context

        def bind(self, **kw: Any) -> Recorder:
            return Recorder(**self.context, **kw)

        def __getattr__(self, level: str) -> Callable[..., None]:
            def record(event: str, **kw: Any) -> None:
                events.append((event, {**self.context, **kw, "level": level}))

            return record

    monkeypatch.setattr(kubeletplugin.draservice, "log", Recorder())
    good, bad = rig.api.add_claim(make_claim("good")), rig.api.add_claim(make_claim("bad"))
    buggy = rig.api.add_claim(make_claim("buggy"))
    rig.state.fail_with["uid-bad"] = "GPU gpu-0 is not on this node"

    def explode(ref: ClaimRef) -> None:
        if ref.name == "buggy":
            raise ZeroDivisionError("oops")

    rig.state.on_prepare = explode
    rig.conn.prepare([ref_of(good), ref_of(bad), ref_of(buggy)])
    by_claim = sorted((e[1]["claim"], e[0], e[1]["level"]) for e in events)
    assert by_claim == [
        ("default/bad", "claim not prepared", "warning"),
        ("default/buggy", "prepare failed unexpectedly", "exception"),  # exception: with the traceback
        ("default/good", "claim prepared", "info"),
    ]
    assert all(e[1]["claim_uid"] == f"uid-{e[1]['claim'].split('/')[1]}" for e in events)


# -- concurrency and deadlines -----------------------------------------------------------------


def test_claims_of_one_batch_are_prepared_concurrently(rig: Rig) -> None:
    claims = [rig.api.add_claim(make_claim(f"c{i}")) for i in range(3)]
    # Each prepare waits until all three are inside prepare at once; run one after another, they would
    # break the barrier and fail.
    barrier = threading.Barrier(3, timeout=10)

    def meet(ref: ClaimRef) -> None:
        barrier.wait()

    rig.state.on_prepare = meet
    answer = rig.conn.prepare([ref_of(c) for c in claims])
    assert all(a.error == "" for a in answer.values()), answer


def test_get_that_outlives_kubelets_deadline_is_a_retryable_error(rig: Rig) -> None:
    fast = rig.api.add_claim(make_claim("fast"))
    slow = rig.api.add_claim(make_claim("slow"))
    release = threading.Event()

    def hang(call: str) -> None:
        if call == "get_claim default/slow":
            release.wait(30)

    rig.api.on_call = hang
    try:
        answer = rig.conn.prepare([ref_of(fast), ref_of(slow)], timeout=2.0)
    finally:
        release.set()
    assert answer["uid-fast"].error == ""
    assert "did not finish before kubelet's deadline" in answer["uid-slow"].error
    assert "kubelet will retry" in answer["uid-slow"].error
    assert counter(rig.metrics, "tessera_plugin_claim_errors_total", operation="prepare", reason="deadline") == 1


def test_claim_fetched_after_the_answer_is_not_prepared_behind_kubelets_back() -> None:
    with short_tmpdir() as kubelet_dir:
        api, state, metrics = FakeKubeAPI(), ScriptedState(), PluginMetrics()
        paths = SocketPaths(kubelet_dir)
        service, server = start_dra(api, state, paths, metrics, deadline_margin=0.5)
        slow = api.add_claim(make_claim("slow"))
        release, fetched = threading.Event(), threading.Event()

        def hang(call: str) -> None:
            release.wait(30)
            fetched.set()

        api.on_call = hang
        with PluginConnection(str(paths.dra_socket), "v1.DRAPlugin", DRIVER, ()) as conn:
            answer = conn.prepare([ref_of(slow)], timeout=1.5)
        release.set()
        server.stop(0)
        service.close()  # waits for the late GET to finish
        assert fetched.is_set()
        assert answer["uid-slow"].error
        assert state.prepare_calls == []


# -- metrics -------------------------------------------------------------------------------------


def test_outcomes_are_counted_per_operation_and_reason(rig: Rig) -> None:
    good = rig.api.add_claim(make_claim("good"))
    rig.conn.prepare([ref_of(good), ClaimRef("default", "gone", "uid-gone")])
    rig.conn.unprepare([ref_of(good)])
    m = rig.metrics
    assert counter(m, "tessera_plugin_claim_operations_total", operation="prepare", result="success") == 1
    assert counter(m, "tessera_plugin_claim_operations_total", operation="prepare", result="error") == 1
    assert counter(m, "tessera_plugin_claim_errors_total", operation="prepare", reason="not_found") == 1
    assert counter(m, "tessera_plugin_claim_operations_total", operation="unprepare", result="success") == 1
    assert counter(m, "tessera_plugin_claim_operation_duration_seconds_count", operation="prepare") == 2
    rpc = "tessera_plugin_grpc_request_duration_seconds_count"
    assert counter(m, rpc, method="NodePrepareResources", api_version="v1") == 1


# -- against the real DeviceState -----------------------------------------------------------------
# A simulated "mixed" node: gpu-0 H100, gpu-1 H100 in MIG mode with static instances, gpu-2/gpu-3 L4.

SHARE_A = "3f2c8a9e-5d41-4b7a-9e2f-6c0d1a2b3c4d"
SHARE_B = "9b1d4e77-0c2a-4f3e-8d6b-5a4c3b2a1f0e"


def uid(n: int) -> str:
    return f"7c1d0c4e-2f7e-4a55-9c8e-{n:012d}"


@dataclass
class RealRig:
    api: FakeKubeAPI
    state: Any
    conn: PluginConnection
    cdi_dir: Path
    state_dir: Path


@pytest.fixture
def real() -> Iterator[RealRig]:
    from driver.discovery import load_inventory
    from kubeletplugin.plugin import PluginConfig, build_device_state

    with short_tmpdir() as root:
        config = PluginConfig(
            node_name=NODE, kubelet_dir=root / "k", cdi_dir=root / "cdi", state_dir=root / "state", simulate="mixed"
        )
        state = build_device_state(config, load_inventory(NODE, simulate="mixed"))
        api = FakeKubeAPI()
        service, server = start_dra(api, state, config.socket_paths, PluginMetrics(), pool=NODE)
        conn = PluginConnection(str(config.socket_paths.dra_socket), "v1.DRAPlugin", DRIVER, ())
        try:
            yield RealRig(api, state, conn, config.cdi_dir, config.state_dir)
        finally:
            conn.close()
            server.stop(0)
            service.close()


def result(device: str, request: str = "gpu", share: str = "", memory: str = "") -> dict[str, Any]:
    r: dict[str, Any] = {"request": request, "driver": DRIVER, "pool": NODE, "device": device}
    if share:
        r["shareID"] = share
        r["consumedCapacity"] = {"memory": memory, "multiprocessors": "8"}
    return r


def spec_files(cdi_dir: Path) -> list[str]:
    return sorted(p.name for p in cdi_dir.glob("*.json")) if cdi_dir.exists() else []


def test_whole_gpu_claim_gets_its_cdi_device(real: RealRig) -> None:
    claim = real.api.add_claim(make_claim("whole", [result("gpu-0")], uid=uid(1)))
    entry = real.conn.prepare([ref_of(claim)])[uid(1)]
    assert entry.error == ""
    assert entry.devices == [
        {
            "request_names": ["gpu"],
            "pool_name": NODE,
            "device_name": "gpu-0",
            "cdi_device_ids": [f"gpu.tessera.dev/claim={uid(1)}-gpu-0"],
            "share_id": None,
        }
    ]
    assert spec_files(real.cdi_dir) == [f"gpu.tessera.dev-claim_{uid(1)}.json"]


def test_static_mig_device_is_prepared(real: RealRig) -> None:
    claim = real.api.add_claim(make_claim("mig", [result("gpu-1-mig-1g10gb-6", request="slice")], uid=uid(2)))
    entry = real.conn.prepare([ref_of(claim)])[uid(2)]
    assert entry.error == ""
    assert [(d["device_name"], d["request_names"]) for d in entry.devices] == [("gpu-1-mig-1g10gb-6", ["slice"])]
    assert entry.devices[0]["cdi_device_ids"] == [f"gpu.tessera.dev/claim={uid(2)}-gpu-1-mig-1g10gb-6"]


def test_memory_share_returns_its_share_id(real: RealRig) -> None:
    claim = real.api.add_claim(make_claim("share", [result("gpu-2", share=SHARE_A, memory="4Gi")], uid=uid(3)))
    v1_entry = real.conn.prepare([ref_of(claim)])[uid(3)]
    beta_entry = real.conn.prepare([ref_of(claim)], version="v1beta1.DRAPlugin")[uid(3)]
    assert v1_entry.error == "" and v1_entry.devices[0]["share_id"] == SHARE_A
    assert "share_id" not in beta_entry.devices[0]
    assert beta_entry.devices[0]["cdi_device_ids"] == v1_entry.devices[0]["cdi_device_ids"]


def test_multi_card_share_prepares_every_card_with_its_share(real: RealRig) -> None:
    claim = real.api.add_claim(
        make_claim(
            "spread",
            [result("gpu-2", share=SHARE_A, memory="4Gi"), result("gpu-3", share=SHARE_B, memory="4Gi")],
            uid=uid(4),
        )
    )
    entry = real.conn.prepare([ref_of(claim)])[uid(4)]
    assert entry.error == ""
    assert [(d["device_name"], d["share_id"]) for d in entry.devices] == [("gpu-2", SHARE_A), ("gpu-3", SHARE_B)]
    assert spec_files(real.cdi_dir) == [f"gpu.tessera.dev-claim_{uid(4)}.json"]


def test_two_shares_of_one_card_from_different_claims_coexist(real: RealRig) -> None:
    a = real.api.add_claim(make_claim("a", [result("gpu-2", share=SHARE_A, memory="4Gi")], uid=uid(5)))
    b = real.api.add_claim(make_claim("b", [result("gpu-2", share=SHARE_B, memory="8Gi")], uid=uid(6)))
    answer = real.conn.prepare([ref_of(a), ref_of(b)])
    assert answer[uid(5)].error == "" and answer[uid(6)].error == ""


def test_exclusive_gpu_already_prepared_for_another_claim_is_a_claim_error(real: RealRig) -> None:
    first = real.api.add_claim(make_claim("first", [result("gpu-0")], uid=uid(7)))
    second = real.api.add_claim(make_claim("second", [result("gpu-0")], uid=uid(8)))
    assert real.conn.prepare([ref_of(first)])[uid(7)].error == ""
    error = real.conn.prepare([ref_of(second)])[uid(8)].error
    assert "gpu-0 is already prepared for claim default/first" in error


def test_repeated_prepare_and_unprepare_are_idempotent(real: RealRig) -> None:
    claim = real.api.add_claim(make_claim("again", [result("gpu-3", share=SHARE_A, memory="2Gi")], uid=uid(9)))
    first = real.conn.prepare([ref_of(claim)])
    assert real.conn.prepare([ref_of(claim)]) == first
    assert real.conn.prepare([ref_of(claim)], version="v1beta1.DRAPlugin")[uid(9)].error == ""
    assert real.conn.unprepare([ref_of(claim)]) == {uid(9): ""}
    assert spec_files(real.cdi_dir) == []
    assert real.conn.unprepare([ref_of(claim)]) == {uid(9): ""}


def test_device_not_on_this_node_is_a_claim_error(real: RealRig) -> None:
    claim = real.api.add_claim(make_claim("ghost", [result("gpu-9")], uid=uid(10)))
    error = real.conn.prepare([ref_of(claim)])[uid(10)].error
    assert "gpu-9" in error and "not on node node-a" in error
    assert spec_files(real.cdi_dir) == []


def test_time_slicing_config_reaches_the_gpu_and_is_reset_at_unprepare(real: RealRig) -> None:
    config = {
        "source": "FromClaim",
        "requests": ["gpu"],
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": "gpu.tessera.dev/v1alpha1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}},
            },
        },
    }
    claim = make_claim("sliced", [result("gpu-0")], uid=uid(11))
    claim["status"]["allocation"]["devices"]["config"] = [config]
    real.api.add_claim(claim)
    assert real.conn.prepare([ref_of(claim)])[uid(11)].error == ""
    recorded = real.state_dir / "fake-timeslice.json"
    assert list(json.loads(recorded.read_text()).values()) == ["Long"]
    assert real.conn.unprepare([ref_of(claim)]) == {uid(11): ""}
    assert json.loads(recorded.read_text()) == {}


def test_a_failure_from_device_state_is_counted_under_its_error_class_reason(rig: Rig) -> None:
    from driver.allocation import AllocationError
    from kubeletplugin.migmanager import MigError

    good, bad = rig.api.add_claim(make_claim("a")), rig.api.add_claim(make_claim("b"))
    errors = {"a": AllocationError("device 'gpu-9' is not on node node-a"), "b": MigError("no MIG table")}

    def fail(ref: ClaimRef) -> None:
        raise errors[ref.name]

    rig.state.on_prepare = fail
    answer = rig.conn.prepare([ref_of(good), ref_of(bad)])
    assert answer["uid-a"].error == "device 'gpu-9' is not on node node-a"
    m = rig.metrics
    assert counter(m, "tessera_plugin_claim_errors_total", operation="prepare", reason="allocation") == 1
    assert counter(m, "tessera_plugin_claim_errors_total", operation="prepare", reason="mig") == 1
    assert counter(m, "tessera_plugin_claim_errors_total", operation="prepare", reason="prepare") == 0


def test_a_claim_failure_is_a_plain_value_not_an_exception() -> None:
    from kubeletplugin.draservice import ClaimFailure, check_claim

    assert not issubclass(ClaimFailure, BaseException)
    failure = check_claim(ClaimRef("default", "c", "uid-c"), {"metadata": {"uid": "uid-other"}})
    assert failure == ClaimFailure(
        "ResourceClaim default/c has uid uid-other but kubelet asked for uid uid-c: the claim was deleted and "
        "re-created; nothing was prepared",
        "claim_replaced",
    )
    assert check_claim(ref_of(make_claim("c")), make_claim("c"), pool=NODE) is None
