"""No other user can connect to the plugin's sockets, not even while they come up.

Whoever connects to the DRA socket can prepare and unprepare claims (an unprepare needs only a
claim UID, which the world-readable CDI directory lists), so the socket must never be reachable by
others, including the moment between bind() and the chmod to 0660. Under umask 000 a socket bound
in place is 0777 for that moment. The test runs a connect loop as another user (uid 65534) in a
forked child while the servers start and stop over and over under umask 000, in directories that
user may traverse, so nothing but the socket's own mode keeps it out.
"""

from __future__ import annotations

import json
import os
import select
import socket
import stat
import time
from pathlib import Path

import pytest

from kubeletplugin.grpcservers import SOCKET_MODE, SocketPaths, UnixSocketServer
from tests.fakes.kubeletclient import short_tmpdir

OTHER_UID = 65534
ROUNDS = 40


def _connect_loop(paths: list[Path], stop_fd: int, out_fd: int) -> None:
    """In the forked child: as OTHER_UID, connect to every path until `stop_fd` becomes readable."""
    code = 1
    try:
        os.setgroups([])
        os.setgid(OTHER_UID)
        os.setuid(OTHER_UID)
        poller = select.poll()
        poller.register(stop_fd, select.POLLIN)
        attempts, successes = 0, []
        while not poller.poll(0):
            for path in paths:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect(str(path))
                    successes.append((time.monotonic(), str(path)))
                except OSError:
                    pass
                finally:
                    s.close()
                attempts += 1
        os.write(out_fd, json.dumps({"attempts": attempts, "successes": successes[:1000]}).encode())
        code = 0
    finally:
        os._exit(code)


@pytest.mark.skipif(os.geteuid() != 0, reason="running the connect loop as another user needs root")
def test_no_other_user_connects_while_the_sockets_come_up() -> None:
    previous = os.umask(0)
    try:
        with short_tmpdir() as root:
            os.chmod(root, 0o755)
            paths = SocketPaths(root / "kubelet")
            for d in (paths.kubelet_dir, paths.registry_dir, paths.plugin_dir.parent, paths.plugin_dir):
                d.mkdir(mode=0o755)
                os.chmod(d, 0o755)  # traversable by anyone: only the socket's own mode keeps others out
            sockets = [paths.dra_socket, paths.registration_socket]
            servers = [UnixSocketServer("dra", paths.dra_socket, [], max_workers=1),
                       UnixSocketServer("registration", paths.registration_socket, [], max_workers=1)]  # fmt: skip
            stop_r, stop_w = os.pipe()
            out_r, out_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(stop_w)  # or the stop pipe never reads EOF
                os.close(out_r)
                _connect_loop(sockets, stop_r, out_w)
            os.close(out_w)
            try:
                time.sleep(0.1)  # the loop is running
                started = time.monotonic()
                for _ in range(ROUNDS):
                    for server in servers:
                        server.start()
                        assert stat.S_IMODE(server.path.lstat().st_mode) == SOCKET_MODE
                    for server in servers:
                        server.stop(0)
                ended = time.monotonic()
                # the control: once the socket is opened to everyone the loop does get in
                servers[0].start()
                os.chmod(paths.dra_socket, 0o666)
                opened = time.monotonic()
                time.sleep(0.2)
                servers[0].stop(0)
            finally:
                os.close(stop_w)
                data = b""
                while chunk := os.read(out_r, 1 << 20):
                    data += chunk
                os.close(out_r)
                os.close(stop_r)
                _, status = os.waitpid(pid, 0)
    finally:
        os.umask(previous)
    assert os.waitstatus_to_exitcode(status) == 0
    report = json.loads(data)
    during = [(t, p) for t, p in report["successes"] if started <= t <= ended]
    after = [(t, p) for t, p in report["successes"] if t >= opened]
    print(f"connect attempts by uid {OTHER_UID}: {report['attempts']} over {ROUNDS} start-ups of both sockets; "
          f"connected during start-up: {len(during)}; after the control opened the socket: {len(after)}")
    assert during == [], f"uid {OTHER_UID} connected while the sockets came up: {during[:3]}"
    assert after, "the connect loop never got in even to a socket open to everyone: it tests nothing"
    assert report["attempts"] > ROUNDS


def test_binding_leaves_no_private_directory_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    with short_tmpdir() as root:
        paths = SocketPaths(root / "kubelet")
        server = UnixSocketServer("dra", paths.dra_socket, [], max_workers=1)
        server.start()
        try:
            assert [p.name for p in paths.plugin_dir.iterdir()] == ["dra.sock"]
        finally:
            server.stop(0)

        def refuse(src: object, dst: object) -> None:
            raise PermissionError(1, "Operation not permitted", str(dst))

        monkeypatch.setattr(os, "rename", refuse)
        with pytest.raises(PermissionError):
            server.start()
        assert not server.running
        assert list(paths.plugin_dir.iterdir()) == []  # neither the socket nor its private directory


def test_a_kubelet_dir_whose_bind_path_is_too_long_is_refused_up_front() -> None:
    from kubeletplugin.grpcservers import UNIX_PATH_MAX, SocketError

    # "dra.sock" and the private bind path ".xxxxxx/s" have the same length; the registration socket is longer
    base = "/" + "k" * (UNIX_PATH_MAX - len("/plugins_registry/gpu.tessera.dev-reg.sock") - 1)
    SocketPaths(Path(base)).validate()
    with pytest.raises(SocketError, match="shorter --kubelet-dir"):
        SocketPaths(Path(base + "kk")).validate()
