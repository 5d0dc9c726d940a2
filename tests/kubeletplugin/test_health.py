"""Device health in the node agent: the health board, the simulated health file, and the
DRAResourceHealth stream kubelet watches (end to end on an in-process plugin)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from kubeletplugin.grpcservers import SocketPaths
from tests.builders.plugin import DRIVER, NODE, http_get
from tests.fakes.kubeletclient import KubeletClient


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
