"""`tessera kubelet-plugin` as a real process: flags, start order, crash recovery, clean shutdown.

The plugin talks to a small HTTP apiserver stand-in (FakeKubeAPI objects behind the REST paths the
Kubernetes client uses) through an ordinary kubeconfig, and to this test through its real unix
sockets, driven by tests/fakes/kubeletclient.py the way kubelet drives it.
"""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest

from kubeletplugin.grpcservers import SocketPaths
from kubeletplugin.types import ClaimRef
from tests.builders.plugin import DRIVER, NODE, PluginProcess, add_share_claim, http_get, make_config, mps_records, uid
from tests.fakes.apiserver import FakeApiServer, FakeKubeAPI
from tests.fakes.kubeletclient import KubeletClient, registration_sockets

# -- an apiserver stand-in over HTTP --------------------------------------------------------------


# -- the plugin process ---------------------------------------------------------------------------


# -- tests ----------------------------------------------------------------------------------------


def crash_during_prepare(root: Path, kubeconfig: Path, ref: ClaimRef, crash_at: str) -> None:
    """Start a plugin that SIGKILLs itself at `crash_at` and let kubelet's prepare call hit it."""
    plugin = PluginProcess(root, kubeconfig, env={"TESSERA_CRASH_AT": crash_at})
    try:
        plugin.start()
        conn = KubeletClient(plugin.paths.kubelet_dir).register()
        with pytest.raises(grpc.RpcError) as err:
            conn.prepare([ref])
        assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL)
        conn.close()
        assert plugin.wait() == -signal.SIGKILL
    finally:
        plugin.kill()
    # a SIGKILL leaves the sockets behind; the next start must replace them
    assert plugin.paths.registration_socket.exists()


@pytest.mark.slow
def test_sigkill_mid_prepare_then_restart_converges_and_sigterm_exits_cleanly(
    apiserver: FakeApiServer, root: Path
) -> None:
    kubeconfig = apiserver.write_kubeconfig(root / "kubeconfig")
    ref = add_share_claim(apiserver.fake, "share", uid(2))
    # killed right after the checkpoint says "started", then (next start) after its MPS daemon is up
    crash_during_prepare(root, kubeconfig, ref, "after-checkpoint-started")
    crash_during_prepare(root, kubeconfig, ref, "after-mps-start")

    plugin = PluginProcess(root, kubeconfig, "--cleanup-on-exit")
    try:
        running = plugin.start()
        assert registration_sockets(plugin.paths.kubelet_dir) == [plugin.paths.registration_socket]
        conn = KubeletClient(plugin.paths.kubelet_dir).register()
        assert (conn.version, conn.endpoint) == ("v1.DRAPlugin", str(plugin.paths.dra_socket))

        first = conn.prepare([ref])[uid(2)]
        assert first.error == ""
        assert first.devices[0]["cdi_device_ids"] == [f"gpu.tessera.dev/claim={uid(2)}-gpu-2"]
        assert sorted(p.name for p in plugin.cdi_dir.glob("*.json")) == [f"gpu.tessera.dev-claim_{uid(2)}.json"]
        assert list(mps_records(plugin.state_dir)) == [uid(2)]  # the crashed attempts' daemon did not leak
        # kubelet asks again (it does not persist "prepared"): same answer, nothing new on disk
        assert conn.prepare([ref])[uid(2)] == first
        assert list(mps_records(plugin.state_dir)) == [uid(2)]

        # this node's slices reached the apiserver through the kubeconfig, and /healthz, /metrics agree
        port = int(running["metrics_port"])
        status, body = _wait_healthy(port)
        assert status == 200, body
        assert {s["spec"]["pool"]["name"] for s in apiserver.fake.slices.values()} == {NODE}
        metrics = http_get(port, "/metrics")[1]
        assert 'tessera_plugin_claim_operations_total{operation="prepare",result="success"} 2.0' in metrics
        assert "tessera_plugin_prepared_devices 1.0" in metrics
        assert "tessera_plugin_kubelet_registered 1.0" in metrics

        assert conn.unprepare([ref]) == {uid(2): ""}
        assert list(plugin.cdi_dir.glob("*.json")) == []
        assert mps_records(plugin.state_dir) == {}
        conn.close()

        # SIGTERM: exit 0, both sockets gone, slices deleted because of --cleanup-on-exit
        plugin.signal(signal.SIGTERM)
        assert plugin.wait() == 0
        assert not plugin.paths.registration_socket.exists()
        assert not plugin.paths.dra_socket.exists()
        assert apiserver.fake.slices == {}
    finally:
        plugin.kill()


def _wait_healthy(port: int) -> tuple[int, str]:
    # The publisher's first sync races the start; poll /healthz a bounded number of times.
    status, body = 0, ""
    for _ in range(200):
        status, body = http_get(port, "/healthz")
        if status == 200:
            break
        threading.Event().wait(0.05)
    return status, body


# -- the same plugin in-process: start order, health stream, healthz, metrics, error exits ----------


def test_registration_socket_appears_only_once_the_dra_socket_serves(in_process: Any) -> None:
    from proto.dra.v1 import api_pb2, api_pb2_grpc

    seen: list[str] = []
    original = in_process.registration_server.start

    def start_registration() -> None:
        assert not in_process.config.socket_paths.registration_socket.exists()
        with grpc.insecure_channel(f"unix:{in_process.config.socket_paths.dra_socket}") as channel:
            reply = api_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
                api_pb2.NodePrepareResourcesRequest(), timeout=10
            )
        seen.append(f"dra answered {len(reply.claims)} claims")
        original()

    in_process.registration_server.start = start_registration
    in_process.start()
    assert seen == ["dra answered 0 claims"]
    assert in_process.config.socket_paths.registration_socket.exists()


def test_health_stream_sends_every_device_then_changes_and_ends_at_shutdown(in_process: Any) -> None:
    from kubeletplugin.health import Health

    in_process.start()
    conn = KubeletClient(in_process.config.socket_paths.kubelet_dir).register()
    stream = conn.watch_health(timeout=60)
    first = next(stream)
    published = [d["name"] for s in in_process.slices for d in s["spec"].get("devices", [])]
    assert [d["device"] for d in first] == published
    assert {(d["pool"], d["health"]) for d in first} == {(NODE, "HEALTHY")}
    assert {d["timeout_seconds"] for d in first} == {30}

    in_process.health.set_health("gpu-1", Health.UNHEALTHY, "XID 79: GPU has fallen off the bus")
    second = {d["device"]: d for d in next(stream)}
    # gpu-1 is in MIG mode: it is published as its MIG devices, which all go down with it
    migs = ["gpu-1-mig-1g10gb-6", "gpu-1-mig-2g20gb-4", "gpu-1-mig-3g40gb-0"]
    assert {second[m]["health"] for m in migs} == {"UNHEALTHY"}
    assert second["gpu-1-mig-1g10gb-6"]["message"] == "gpu-1: XID 79: GPU has fallen off the bus"
    assert {second[d]["health"] for d in ("gpu-0", "gpu-2", "gpu-3")} == {"HEALTHY"}
    port = in_process.metrics_server.port
    assert "tessera_plugin_unhealthy_devices 3.0" in http_get(port, "/metrics")[1]

    in_process.stop()
    assert list(stream) == []  # the stream ends cleanly (no gRPC error) when the plugin stops
    conn.close()


def test_simulated_health_file_drives_the_board(in_process: Any, root: Path) -> None:
    from kubeletplugin.health import Health

    source = in_process.health_source
    assert source is not None and source.path == root / "state" / "simulated-health.json"
    source.path.parent.mkdir(parents=True, exist_ok=True)
    source.path.write_text(json.dumps({"gpu-2": {"health": "unhealthy", "message": "ECC errors"}}))
    source.apply()
    states = {s.device_name: s for s in in_process.health.snapshot()[1]}
    assert (states["gpu-2"].health, states["gpu-2"].message) == (Health.UNHEALTHY, "ECC errors")
    source.path.unlink()
    source.apply()
    assert all(s.health is Health.HEALTHY for s in in_process.health.snapshot()[1])
    source.path.write_text(json.dumps({"gpu-2": {"health": "sick"}}))
    with pytest.raises(ValueError, match=r"gpu-2\.health: health must be one of Healthy, Unhealthy, Unknown"):
        source.apply()


def test_healthz_waits_for_the_first_publisher_attempt_and_accepts_retrying(in_process: Any) -> None:
    assert in_process.healthz() == (False, "gRPC servers not running")
    in_process.fake.fail_next(10_000)  # the apiserver is down from the start
    in_process.start()
    for _ in range(400):
        if in_process.publisher.errors:
            break
        threading.Event().wait(0.02)
    ok, reason = in_process.healthz()
    assert ok and reason == "ok (publisher retrying)"
    status, body = http_get(in_process.metrics_server.port, "/healthz")
    assert (status, body) == (200, "ok (publisher retrying)\n")
    metrics = http_get(in_process.metrics_server.port, "/metrics")[1]
    assert 'tessera_plugin_publisher_state{state="retrying"} 1.0' in metrics


def test_healthz_reports_synced_publisher(in_process: Any) -> None:
    in_process.start()
    assert in_process.publisher.wait_synced(30)
    assert in_process.healthz() == (True, "ok (publisher synced)")
    assert http_get(in_process.metrics_server.port, "/nope")[0] == 404


def test_unhealthy_when_a_socket_is_down(in_process: Any) -> None:
    in_process.start()
    in_process.registration_server.stop(0)
    status, body = http_get(in_process.metrics_server.port, "/healthz")
    assert (status, body) == (503, "gRPC servers not running\n")


def test_run_plugin_serves_until_stopped_and_returns_zero(root: Path) -> None:
    from kubeletplugin.plugin import run_plugin

    fake = FakeKubeAPI()
    fake.add_node(NODE)
    stop = threading.Event()
    seen: list[Path] = []

    def started(plugin: Any) -> None:
        seen.extend(registration_sockets(plugin.config.socket_paths.kubelet_dir))
        stop.set()

    assert run_plugin(make_config(root), api=fake, stop_event=stop, on_started=started) == 0
    assert seen == [SocketPaths(root / "kubelet").registration_socket]
    assert registration_sockets(root / "kubelet") == []
    assert fake.slices  # without --cleanup-on-exit the slices stay for the next start


def test_unknown_simulated_profile_exits_1(root: Path) -> None:
    from kubeletplugin.plugin import run_plugin

    assert run_plugin(make_config(root, simulate="no-such-profile"), api=FakeKubeAPI()) == 1


def test_unreadable_kubeconfig_exits_1(root: Path) -> None:
    from kubeletplugin.plugin import run_plugin

    assert run_plugin(make_config(root, kubeconfig=str(root / "missing-kubeconfig"))) == 1


def test_metrics_port_in_use_exits_1_and_leaves_no_sockets(root: Path) -> None:
    import socket as socketlib

    from kubeletplugin.plugin import run_plugin

    with socketlib.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = make_config(root, metrics_addr=f"127.0.0.1:{taken.getsockname()[1]}")
        fake = FakeKubeAPI()
        fake.add_node(NODE)
        assert run_plugin(config, api=fake) == 1
    assert registration_sockets(root / "kubelet") == []
    assert not SocketPaths(root / "kubelet").dra_socket.exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--metrics-addr", "nowhere"], "--metrics-addr must be HOST:PORT"),
        (["--kubelet-dir", "/" + "k" * 100], "shorter --kubelet-dir"),
        (["--instance-id", "../pod"], "--instance-id '../pod' must be 1-63 letters"),
    ],
)
def test_invalid_flags_exit_2_with_the_reason(root: Path, capsys: pytest.CaptureFixture[str], flags: list[str],
                                              message: str) -> None:
    import structlog

    from tessera.cli import main

    # main() points structlog at this test's captured stderr; put the previous setup back afterwards.
    saved = structlog.get_config()
    try:
        rc = main(["--log-format", "json", "kubelet-plugin", "--node-name", NODE, "--state-dir", str(root), *flags])
    finally:
        structlog.configure(**saved)
    assert rc == 2
    assert message in capsys.readouterr().err


def test_config_rejects_what_cannot_work(root: Path) -> None:
    from kubeletplugin.plugin import PluginConfigError

    with pytest.raises(PluginConfigError, match="--node-name is required"):
        make_config(root, node_name="")
    with pytest.raises(PluginConfigError, match="exclude each other"):
        make_config(root, nvml=True)
    with pytest.raises(PluginConfigError, match="--mig-strategy must be one of none, static, dynamic"):
        make_config(root, mig_strategy="auto")
    with pytest.raises(PluginConfigError, match="--cdi-dir must be an absolute path"):
        make_config(root, cdi_dir=Path("cdi"))
    with pytest.raises(PluginConfigError, match="--cdi-host-driver-root needs --cdi-driver-root"):
        make_config(root, cdi_host_driver_root="/")
    with pytest.raises(PluginConfigError, match="--cdi-host-driver-root must be an absolute host path"):
        make_config(root, cdi_driver_root=root, cdi_host_driver_root="usr")


def test_cdi_specs_name_the_host_path_of_a_driver_root_mounted_elsewhere(root: Path) -> None:
    from kubeletplugin.plugin import build_device_state

    driver_root = root / "driver-root"
    lib = driver_root / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libcuda.so.550.54.15").write_bytes(b"")
    config = make_config(root, cdi_driver_root=driver_root, cdi_host_driver_root="/")
    from driver.discovery import load_inventory

    state = build_device_state(config, load_inventory("node-a", simulate="t4-4"))
    assert state.driver_root is not None
    sources = [m.host_path for m in state.driver_root.container_edits().mounts]
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15" in sources


# -- health board, health file and metrics endpoint edge cases ---------------------------------------


def test_health_of_an_unknown_device_is_refused() -> None:
    from kubeletplugin.health import Health, HealthBoard

    board = HealthBoard(NODE, ["gpu-0", "gpu-1-mig-1g10gb-6"])
    with pytest.raises(KeyError, match="'gpu-7' is not published by this node"):
        board.set_health("gpu-7", Health.UNHEALTHY)


def test_unchanged_health_does_not_wake_the_streams() -> None:
    from kubeletplugin.health import Health, HealthBoard

    board = HealthBoard(NODE, ["gpu-0"])
    version, _ = board.snapshot()
    board.set_health("gpu-0", Health.HEALTHY)
    assert board.snapshot()[0] == version
    board.set_health("gpu-0", Health.UNHEALTHY, "XID 48")
    assert board.wait_for_change(version, 0) == version + 1


def test_set_devices_keeps_known_states_and_drops_vanished_devices() -> None:
    from kubeletplugin.health import Health, HealthBoard

    board = HealthBoard(NODE, ["gpu-0", "gpu-1"])
    board.set_health("gpu-0", Health.UNHEALTHY, "XID 79")
    board.set_devices(["gpu-0", "gpu-2"])
    states = {s.device_name: s.health for s in board.snapshot()[1]}
    assert states == {"gpu-0": Health.UNHEALTHY, "gpu-2": Health.HEALTHY}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "top level must be an object"),
        ('{"gpu-0": "Unhealthy"}', "gpu-0: must be an object"),
    ],
)
def test_malformed_health_file_is_reported_with_its_path(root: Path, content: str, message: str) -> None:
    from kubeletplugin.health import FileHealthSource, HealthBoard

    path = root / "health.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as err:
        FileHealthSource(path, HealthBoard(NODE, ["gpu-0"])).read()
    assert str(path) in str(err.value)


def test_extra_health_streams_beyond_the_cap_are_refused(root: Path) -> None:
    from kubeletplugin.grpcservers import UnixSocketServer
    from kubeletplugin.health import DRAResourceHealthServicer, HealthBoard
    from tests.fakes.kubeletclient import PluginConnection

    board = HealthBoard(NODE, ["gpu-0"])
    servicer = DRAResourceHealthServicer(board, max_streams=1)
    paths = SocketPaths(root / "kubelet")
    server = UnixSocketServer("dra", paths.dra_socket, [servicer.add_to], max_workers=4)
    server.start()
    try:
        with PluginConnection(str(paths.dra_socket), "v1.DRAPlugin", DRIVER, ()) as first, \
                PluginConnection(str(paths.dra_socket), "v1.DRAPlugin", DRIVER, ()) as second:
            held = first.watch_health()
            assert [d["device"] for d in next(held)] == ["gpu-0"]
            with pytest.raises(grpc.RpcError) as err:
                next(second.watch_health())
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            board.close()
            assert list(held) == []
    finally:
        server.stop(0)


@pytest.mark.parametrize(
    ("addr", "expected"),
    [(":9400", ("0.0.0.0", 9400)), ("127.0.0.1:0", ("127.0.0.1", 0)), ("[::1]:9400", ("::1", 9400))],
)
def test_metrics_addresses(addr: str, expected: tuple[str, int]) -> None:
    from kubeletplugin.metrics import parse_listen_address

    assert parse_listen_address(addr) == expected


@pytest.mark.parametrize(
    ("addr", "message"), [("9400", "HOST:PORT"), ("host:http", "HOST:PORT"), (":70000", "0..65535")]
)
def test_bad_metrics_addresses_are_refused(addr: str, message: str) -> None:
    from kubeletplugin.metrics import parse_listen_address

    with pytest.raises(ValueError, match=message):
        parse_listen_address(addr)


def test_metrics_server_that_cannot_bind_says_where() -> None:
    import socket as socketlib

    from kubeletplugin.metrics import MetricsServer, PluginMetrics

    with socketlib.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = MetricsServer(f"127.0.0.1:{port}", PluginMetrics(), lambda: (True, ""))
        with pytest.raises(OSError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            server.start()


def test_publisher_state_must_be_a_known_one() -> None:
    from kubeletplugin.metrics import PublisherStatus

    with pytest.raises(ValueError, match="publisher state must be one of"):
        PublisherStatus(state="happy", syncs=0, errors=0, last_sync_time=None)
