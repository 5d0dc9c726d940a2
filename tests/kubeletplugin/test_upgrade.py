"""Two plugin instances on one node, as a surge rolling update runs them: the old pod and the new one.

Each instance gets its own sockets (kubelet keeps both registrations and routes to the newest), the
two share one checkpoint, one CDI directory and one state directory, and neither undoes what the
other prepared; exactly one publishes ResourceSlices at a time, and only the last one to stop may
clean up.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.cdi import read_spec
from kubeletplugin.checkpoint import ClaimState
from kubeletplugin.grpcservers import SocketPaths
from kubeletplugin.kubeletclaims import ClaimRef
from kubeletplugin.mps import SimulatedMpsControl
from kubeletplugin.state import DeviceState
from tests.builders.claims import make_claim, share
from tests.builders.state import make_steps
from tests.fakes.apiserver import FakeKubeAPI
from tests.fakes.kubeletclient import KubeletClient, registration_sockets, short_tmpdir
from tests.paths import REPO

NODE = "node-a"
UID_A = "0a1b2c3d-0000-4000-8000-00000000000a"
UID_B = "0a1b2c3d-0000-4000-8000-00000000000b"


@pytest.fixture
def root() -> Iterator[Path]:
    with short_tmpdir() as d:
        yield d


def make_plugin(root: Path, fake: FakeKubeAPI, instance_id: str, profile: str = "mixed", **overrides: Any) -> Any:
    from driver.discovery import load_inventory
    from kubeletplugin.plugin import KubeletPlugin, PluginConfig, build_device_state

    kwargs: dict[str, Any] = {
        "node_name": NODE, "kubelet_dir": root / "kubelet", "cdi_dir": root / "cdi", "state_dir": root / "state",
        "simulate": profile, "metrics_addr": "127.0.0.1:0", "stop_grace": 2.0, "instance_id": instance_id,
    }  # fmt: skip
    kwargs.update(overrides)
    config = PluginConfig(**kwargs)
    inventory = load_inventory(NODE, simulate=profile)
    return KubeletPlugin(config, fake, inventory, build_device_state(config, inventory), health_resend_interval=30,
                         handover_grace=0.2)


@pytest.fixture
def fake() -> Iterator[FakeKubeAPI]:
    api = FakeKubeAPI()
    api.add_node(NODE)
    yield api
    api.close_watches()


# -- sockets -------------------------------------------------------------------------------------


def test_instance_id_names_both_sockets() -> None:
    paths = SocketPaths(Path("/var/lib/kubelet"), instance_id=UID_A)
    assert paths.registration_socket == Path(f"/var/lib/kubelet/plugins_registry/gpu.tessera.dev-{UID_A}-reg.sock")
    assert paths.dra_socket == Path(f"/var/lib/kubelet/plugins/gpu.tessera.dev/dra-{UID_A}.sock")
    plain = SocketPaths(Path("/var/lib/kubelet"))
    assert (plain.registration_socket.name, plain.dra_socket.name) == ("gpu.tessera.dev-reg.sock", "dra.sock")


@pytest.mark.parametrize("bad", ["../x", "a/b", ".hidden", "a b", "x" * 64])
def test_instance_id_that_cannot_name_a_socket_is_refused(root: Path, bad: str) -> None:
    from kubeletplugin.pluginconfig import PluginConfig, PluginConfigError

    with pytest.raises(PluginConfigError, match="--instance-id"):
        PluginConfig(node_name=NODE, kubelet_dir=root / "kubelet", instance_id=bad)


def test_two_instances_register_separately_and_the_old_one_leaves_only_its_own_sockets(
    root: Path, fake: FakeKubeAPI
) -> None:
    old, new = make_plugin(root, fake, UID_A), make_plugin(root, fake, UID_B)
    try:
        old.start()
        new.start()
        kubelet = KubeletClient(root / "kubelet")
        sockets = registration_sockets(root / "kubelet")
        assert sockets == sorted([old.config.socket_paths.registration_socket,
                                  new.config.socket_paths.registration_socket])  # fmt: skip
        endpoints = {kubelet.get_info(s).endpoint for s in sockets}
        assert endpoints == {str(old.config.socket_paths.dra_socket), str(new.config.socket_paths.dra_socket)}
        old.stop()
        assert registration_sockets(root / "kubelet") == [new.config.socket_paths.registration_socket]
        assert new.config.socket_paths.dra_socket.exists()
        with kubelet.register() as conn:
            assert conn.endpoint == str(new.config.socket_paths.dra_socket)
            assert conn.prepare([]) == {}
    finally:
        fake.close_watches()
        old.stop()
        new.stop()


# -- one checkpoint, two instances ---------------------------------------------------------------

CLAIM = "7c1d0c4e-2f7e-4a55-9c8e-1f2a3b4c5d6e"


class CountingMps(SimulatedMpsControl):
    started: list[str] = []

    def start(self, claim_uid: str, *args: Any, **kwargs: Any) -> Any:
        CountingMps.started.append(claim_uid)
        return super().start(claim_uid, *args, **kwargs)


def pause_at(step: str, reached: threading.Event, release: threading.Event) -> Callable[[str], None]:
    def hook(current: str) -> None:
        if current == step:
            reached.set()
            assert release.wait(20), "the test never released the paused prepare"
    return hook


def instance_state(tmp_path: Path, hook: Callable[[str], None] = lambda _: None) -> DeviceState:
    """One instance's DeviceState: its own objects, the node's shared directories."""
    state_dir = tmp_path / "state"
    return DeviceState(make_steps(tmp_path, "dgx-h100-8", hook, mps=CountingMps(state_dir)), "node-a")


def share_claim() -> dict[str, Any]:
    return make_claim([share("gpu-1", "12Gi")], uid=CLAIM)


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def test_a_starting_instance_does_not_roll_back_the_other_instances_prepare_in_flight(tmp_path: Path) -> None:
    reached, release = threading.Event(), threading.Event()
    old = instance_state(tmp_path, pause_at("after-mps-start", reached, release))
    preparing, answer = in_thread(lambda: old.prepare(ClaimRef("team-a", "claim", CLAIM), share_claim()))
    assert reached.wait(20)
    new = instance_state(tmp_path)
    recovering, report = in_thread(new.recover)
    recovering.join(0.5)
    assert recovering.is_alive(), "recovery ran while the other instance was half-way through a prepare"
    release.set()
    preparing.join(20)
    recovering.join(20)
    assert not answer[0].error and not report[0].rolled_back and not report[0].orphan_specs_removed
    assert new.prepared_claims()[CLAIM].state == ClaimState.PREPARE_COMPLETED
    assert read_spec(tmp_path / "cdi", CLAIM) is not None
    assert new.mps.is_running(CLAIM)


def test_a_claim_sent_to_both_instances_is_prepared_once(tmp_path: Path) -> None:
    CountingMps.started.clear()
    reached, release = threading.Event(), threading.Event()
    old = instance_state(tmp_path, pause_at("after-cdi-write", reached, release))
    new = instance_state(tmp_path)
    ref = ClaimRef("team-a", "claim", CLAIM)
    first, first_answer = in_thread(lambda: old.prepare(ref, share_claim()))
    assert reached.wait(20)
    second, second_answer = in_thread(lambda: new.prepare(ref, share_claim()))
    second.join(0.5)
    assert second.is_alive(), "the second instance prepared a claim the first one was preparing"
    release.set()
    first.join(20)
    second.join(20)
    assert first_answer[0] == second_answer[0] and not first_answer[0].error
    assert CountingMps.started == [CLAIM]
    # and the new instance unprepares what the old one prepared
    new.unprepare(ref)
    assert read_spec(tmp_path / "cdi", CLAIM) is None and not old.mps.is_running(CLAIM)


def test_recovering_claims_while_serving_holds_up_no_other_claim(tmp_path: Path) -> None:
    first = instance_state(tmp_path)
    assert not first.prepare(ClaimRef("team-a", "claim", CLAIM), share_claim()).error
    SimulatedMpsControl(tmp_path / "state").stop(CLAIM)  # its daemon died with the old pod's container

    in_restart, release = threading.Event(), threading.Event()

    class SlowMps(SimulatedMpsControl):
        def start(self, claim_uid: str, *args: Any, **kwargs: Any) -> Any:
            if claim_uid == CLAIM:
                in_restart.set()
                assert release.wait(20)
            return super().start(claim_uid, *args, **kwargs)

    state_dir = tmp_path / "state"
    recovering_state = DeviceState(make_steps(tmp_path, mps=SlowMps(state_dir)), "node-a")
    recovering, report = in_thread(recovering_state.recover_claims)
    assert in_restart.wait(20)
    other_uid = "0a9b8c7d-0000-4000-8000-000000000002"
    other = make_claim([share("gpu-2", "12Gi")], uid=other_uid)
    serving, answer = in_thread(lambda: instance_state(tmp_path).prepare(ClaimRef("team-a", "b", other_uid), other))
    serving.join(10)
    alive = serving.is_alive()
    release.set()
    recovering.join(20)
    serving.join(20)
    assert not alive, "a prepare of another claim waited for the restart of an MPS daemon"
    assert not answer[0].error and report[0].mps_restarted == [CLAIM]
    assert first.mps.is_running(CLAIM) and first.mps.is_running(other_uid)


def test_record_files_written_by_both_instances_lose_no_update(tmp_path: Path) -> None:
    # two objects, as in two processes: only the file lock orders their read-modify-writes
    controls = [SimulatedMpsControl(tmp_path), SimulatedMpsControl(tmp_path)]
    uids = [f"0a1b2c3d-0000-4000-8000-{n:012d}" for n in range(64)]

    def start(n: int) -> None:
        controls[n % 2].start(uids[n], ["GPU-x"], [1024], None)

    threads = [threading.Thread(target=start, args=(n,)) for n in range(len(uids))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(controls[0].daemons()) == sorted(uids)


# -- one publisher at a time; cleanup only by the last instance ----------------------------------


@pytest.mark.slow
def test_one_instance_publishes_the_other_stands_by_and_takes_over(root: Path, fake: FakeKubeAPI) -> None:
    old = make_plugin(root, fake, UID_A, cleanup_on_exit=True)
    new = make_plugin(root, fake, UID_B, cleanup_on_exit=True)
    try:
        old.start()
        assert old.publisher.wait_synced(10) and fake.slices
        new.start()
        assert old.leadership.leader and not new.leadership.leader
        assert new.healthz() == (True, "ok (publisher standby: another plugin instance on this node publishes)")
        time.sleep(1.5)  # a standby that published anyway would have synced by now
        assert new.publisher.syncs == 0
        names = set(fake.slices)
        deletes_before = sum(c.startswith("delete") for c in fake.calls)

        old.stop()
        # the new instance still serves: the old one's --cleanup-on-exit must not delete the slices
        assert sum(c.startswith("delete") for c in fake.calls) == deletes_before
        assert set(fake.slices) == names
        wait_until(lambda: new.leadership.leader and new.publisher.syncs > 0, "the standby to take over")
        fake.external_delete_slice(sorted(names)[0])
        wait_until(lambda: set(fake.slices) == names, "the new leader to republish a deleted slice")

        fake.close_watches()
        new.stop()  # the last instance: now --cleanup-on-exit deletes them
        assert fake.slices == {}
    finally:
        fake.close_watches()
        old.stop()
        new.stop()


def test_the_last_instance_is_known_even_when_the_other_was_killed(root: Path) -> None:
    from kubeletplugin.instances import InstanceMembership

    (root / "state").mkdir()
    other = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from kubeletplugin.instances import "
         "InstanceMembership as M; M(Path(sys.argv[1]), 'other').join(); print('joined', flush=True); input()",
         str(root / "state")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "joined"
        me = InstanceMembership(root / "state", "me")
        me.join()
        assert me.others() == ["other"]
        assert me.leave() is False  # the other process still holds on
        other.kill()
        other.wait(10)
        me.join()
        assert me.others() == []
        assert me.leave() is True
        assert list((root / "state" / "instances").iterdir()) == []  # the dead one's file is gone too
    finally:
        other.kill()
        other.wait(10)


def test_the_new_instance_restarts_mps_daemons_that_died_with_the_old_one(root: Path, fake: FakeKubeAPI) -> None:
    old = make_plugin(root, fake, UID_A, "dgx-h100-8")
    new = make_plugin(root, fake, UID_B, "dgx-h100-8")
    ref = ClaimRef("team-a", "claim", CLAIM)
    try:
        old.start()
        assert not old.state.prepare(ref, share_claim()).error
        new.start()  # adopts the old instance's daemon: it is still running
        assert new.state.mps.is_running(CLAIM)
        old.stop()
        # the old pod's container goes, and the MPS daemon it started goes with it
        SimulatedMpsControl(root / "state").stop(CLAIM)
        wait_until(lambda: new.state.mps.is_running(CLAIM), "the new instance to restart the claim's MPS daemon")
        assert read_spec(root / "cdi", CLAIM) is not None
        assert new.state.prepared_claims()[CLAIM].state == ClaimState.PREPARE_COMPLETED
    finally:
        fake.close_watches()
        old.stop()
        new.stop()


def wait_until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_sockets_of_a_killed_instance_are_removed_and_live_ones_kept(root: Path, fake: FakeKubeAPI) -> None:
    import socket

    paths = SocketPaths(root / "kubelet", instance_id="dead0001")
    for path in (paths.registration_socket, paths.dra_socket):
        path.parent.mkdir(parents=True, exist_ok=True)
        with socket.socket(socket.AF_UNIX) as s:  # bound, never listening, closed: what SIGKILL leaves
            s.bind(str(path))
    legacy = SocketPaths(root / "kubelet").registration_socket
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(legacy))
    unrelated = paths.registry_dir / "other.vendor.com-reg.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(unrelated))
    running = make_plugin(root, fake, UID_A)
    starting = make_plugin(root, fake, UID_B)
    try:
        running.start()
        starting.start()
        assert not paths.registration_socket.exists() and not paths.dra_socket.exists() and not legacy.exists()
        assert unrelated.exists(), "another driver's socket is not ours to remove"
        assert sorted(registration_sockets(root / "kubelet")) == sorted(
            [running.config.socket_paths.registration_socket, starting.config.socket_paths.registration_socket,
             unrelated])  # fmt: skip
        assert running.config.socket_paths.dra_socket.exists()
    finally:
        fake.close_watches()
        running.stop()
        starting.stop()
