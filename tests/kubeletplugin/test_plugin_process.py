"""`tessera kubelet-plugin` as a real process: flags, start order, crash recovery, clean shutdown.

The plugin talks to a small HTTP apiserver stand-in (FakeKubeAPI objects behind the REST paths the
Kubernetes client uses) through an ordinary kubeconfig, and to this test through its real unix
sockets, driven by tests/fakes/kubeletclient.py the way kubelet drives it.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest

from kubeletplugin.grpcservers import SocketPaths
from kubeletplugin.kubeletclaims import ClaimRef
from tests.builders.plugin import NODE, PluginProcess, add_share_claim, http_get, make_config, mps_records, uid
from tests.fakes.apiserver import FakeApiServer, FakeKubeAPI
from tests.fakes.kubeletclient import KubeletClient, registration_sockets


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


# -- the same plugin in-process: start order, error exits -------------------------------------------


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
    from kubeletplugin.pluginconfig import PluginConfigError

    with pytest.raises(PluginConfigError, match="--node-name is required"):
        make_config(root, node_name="")
    with pytest.raises(PluginConfigError, match="exclude each other"):
        make_config(root, nvml=True)
    with pytest.raises(PluginConfigError, match="--mig-strategy must be one of none, static, dynamic"):
        make_config(root, mig_strategy="auto")
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
    assert state.steps.driver_root is not None
    sources = [m.host_path for m in state.steps.driver_root.container_edits().mounts]
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15" in sources
