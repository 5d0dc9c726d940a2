"""Registration socket and unix-socket servers, exercised the way kubelet's plugin watcher uses them."""

from __future__ import annotations

import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kubeletplugin.grpcservers import SocketError, SocketPaths, UnixSocketServer, prepare_socket_path
from kubeletplugin.registration import SUPPORTED_VERSIONS, RegistrationServicer, RegistrationStatus
from proto.pluginregistration.v1.api_pb2 import InfoRequest
from proto.pluginregistration.v1.api_pb2_grpc import RegistrationStub
from tests.fakes.kubeletclient import KubeletClient, KubeletProtocolError, registration_sockets, short_tmpdir


@pytest.fixture
def kubelet_dir() -> Iterator[Path]:
    with short_tmpdir() as d:
        yield d


@pytest.fixture
def paths(kubelet_dir: Path) -> SocketPaths:
    return SocketPaths(kubelet_dir)


@pytest.fixture
def registration(
    paths: SocketPaths,
) -> Iterator[tuple[RegistrationServicer, UnixSocketServer, list[RegistrationStatus]]]:
    seen: list[RegistrationStatus] = []
    servicer = RegistrationServicer(paths.dra_socket, on_status=seen.append)
    server = UnixSocketServer("registration", paths.registration_socket, [servicer.add_to], max_workers=2)
    server.start()
    yield servicer, server, seen
    server.stop(0)


def test_socket_paths_follow_kubelet_layout() -> None:
    paths = SocketPaths(Path("/var/lib/kubelet"))
    assert paths.registration_socket == Path("/var/lib/kubelet/plugins_registry/gpu.tessera.dev-reg.sock")
    assert paths.dra_socket == Path("/var/lib/kubelet/plugins/gpu.tessera.dev/dra.sock")
    paths.validate()


def test_socket_path_over_unix_limit_is_rejected_with_a_fix() -> None:
    with pytest.raises(SocketError, match=r"107-byte limit.*shorter --kubelet-dir"):
        SocketPaths(Path("/" + "k" * 90)).validate()


def test_relative_kubelet_dir_is_rejected() -> None:
    with pytest.raises(SocketError, match="absolute"):
        SocketPaths(Path("var/lib/kubelet")).validate()


def test_get_info_describes_a_dra_plugin_with_a_bare_endpoint_path(registration, paths: SocketPaths) -> None:
    info = KubeletClient(paths.kubelet_dir).get_info(paths.registration_socket)
    assert info.type == "DRAPlugin"
    assert info.name == "gpu.tessera.dev"
    assert info.endpoint == str(paths.dra_socket)
    assert not info.endpoint.startswith("unix:")
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"]


def test_kubelet_finds_exactly_the_registration_socket(registration, paths: SocketPaths) -> None:
    (paths.registry_dir / ".hidden").write_text("kubelet ignores dot files")
    (paths.registry_dir / "notes.txt").write_text("and anything that is not a socket")
    assert registration_sockets(paths.kubelet_dir) == [paths.registration_socket]


def test_current_kubelet_picks_v1_and_reports_success(registration, paths: SocketPaths) -> None:
    servicer, _, seen = registration
    conn = KubeletClient(paths.kubelet_dir).register()
    conn.close()
    assert conn.version == "v1.DRAPlugin"
    assert conn.endpoint == str(paths.dra_socket)
    status = servicer.wait_for_status(5)
    assert status is not None and status.registered and status.error == ""
    assert seen == [status]


def test_older_kubelet_picks_v1beta1(registration, paths: SocketPaths) -> None:
    conn = KubeletClient(paths.kubelet_dir, versions=["v1beta1.DRAPlugin"]).register()
    conn.close()
    assert conn.version == "v1beta1.DRAPlugin"


def test_refused_registration_is_recorded_with_kubelets_reason(registration, paths: SocketPaths) -> None:
    servicer, _, _ = registration
    with pytest.raises(KubeletProtocolError):
        KubeletClient(paths.kubelet_dir, versions=["v1alpha3.NodeService"]).register()
    status = servicer.status
    assert status is not None and not status.registered
    assert "none of the versions" in status.error


def test_status_is_none_before_kubelet_answers(registration) -> None:
    servicer, _, _ = registration
    assert servicer.status is None
    assert servicer.wait_for_status(0) is None


def test_sockets_and_created_dirs_are_private_to_owner_and_group(registration, paths: SocketPaths) -> None:
    assert stat.S_IMODE(paths.registration_socket.stat().st_mode) == 0o660
    assert stat.S_IMODE(paths.registry_dir.stat().st_mode) == 0o750


def test_existing_registry_dir_keeps_kubelets_mode(kubelet_dir: Path) -> None:
    paths = SocketPaths(kubelet_dir)
    paths.registry_dir.mkdir(mode=0o755)
    paths.registry_dir.chmod(0o755)
    server = UnixSocketServer("registration", paths.registration_socket, [])
    server.start()
    try:
        assert stat.S_IMODE(paths.registry_dir.stat().st_mode) == 0o755
    finally:
        server.stop(0)


def test_stale_socket_from_a_previous_run_is_replaced(paths: SocketPaths) -> None:
    paths.registry_dir.mkdir(parents=True)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(paths.registration_socket))
    stale.close()  # the file stays behind, as after a crash
    servicer = RegistrationServicer(paths.dra_socket)
    server = UnixSocketServer("registration", paths.registration_socket, [servicer.add_to])
    server.start()
    try:
        assert KubeletClient(paths.kubelet_dir).get_info(paths.registration_socket).name == "gpu.tessera.dev"
    finally:
        server.stop(0)


def test_a_regular_file_at_the_socket_path_is_not_deleted(paths: SocketPaths) -> None:
    paths.registry_dir.mkdir(parents=True)
    paths.registration_socket.write_text("someone else's file")
    with pytest.raises(SocketError, match="not a unix socket"):
        prepare_socket_path(paths.registration_socket)
    assert paths.registration_socket.read_text() == "someone else's file"


def test_bind_failure_is_reported_as_socket_error(kubelet_dir: Path) -> None:
    # grpc cannot bind a path longer than sun_path; SocketPaths.validate normally catches it first.
    server = UnixSocketServer("x", kubelet_dir / ("s" * 120), [])
    with pytest.raises(SocketError, match="cannot listen"):
        server.start()
    assert not server.running


def test_socket_dir_that_cannot_be_created_is_reported(kubelet_dir: Path) -> None:
    (kubelet_dir / "plugins").write_text("a file where kubelet's plugins dir should be")
    server = UnixSocketServer("dra", SocketPaths(kubelet_dir).dra_socket, [])
    with pytest.raises(SocketError, match="cannot create socket directory"):
        server.start()


def test_stop_removes_the_socket_so_kubelet_deregisters(registration, paths: SocketPaths) -> None:
    _, server, _ = registration
    server.stop(0)
    assert not server.running
    assert not paths.registration_socket.exists()
    assert registration_sockets(paths.kubelet_dir) == []
    with pytest.raises(grpc.RpcError) as err, grpc.insecure_channel(f"unix:{paths.registration_socket}") as ch:
        RegistrationStub(ch).GetInfo(InfoRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_servicer_refuses_relative_endpoint_and_empty_versions() -> None:
    with pytest.raises(ValueError, match="absolute"):
        RegistrationServicer(Path("dra.sock"))
    with pytest.raises(ValueError, match="must not be empty"):
        RegistrationServicer(Path("/x/dra.sock"), supported_versions=())


def test_advertised_versions_put_v1_first() -> None:
    assert SUPPORTED_VERSIONS[0] == "v1.DRAPlugin"
    assert SUPPORTED_VERSIONS.index("v1.DRAPlugin") < SUPPORTED_VERSIONS.index("v1beta1.DRAPlugin")
