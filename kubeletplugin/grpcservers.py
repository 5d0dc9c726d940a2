"""gRPC servers on unix sockets where kubelet looks for them: socket paths, permissions, start and stop.

Kubelet finds a DRA driver through a registration socket under `<kubelet-dir>/plugins_registry` and
then talks to the service socket the driver names in GetInfo. Both are plain unix sockets with no
authentication: whoever can connect can ask the plugin to hand GPUs to containers (an unprepare
needs only a claim UID, which the world-readable CDI directory lists). So the socket files are 0660
(owner and group may connect, nobody else) and the directories tessera creates are 0750.

A socket bound in place would carry the process umask until the chmod (0777 under umask 000, which
some runtimes hand a container), and others could connect in that gap. So each socket is bound in
a fresh private directory (0700, next to its final path), chmod'ed there while nobody else can reach
it, and only then renamed into place: it appears with its final mode. The process umask is not
touched: it is process-wide, and the plugin's other threads write files meanwhile.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import stat
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import structlog

from driver import DRIVER_NAME
from driver.errors import TesseraError

log = structlog.get_logger(__name__)

SOCKET_MODE = 0o660
DIR_MODE = 0o750
# sun_path is 108 bytes including the terminating NUL.
UNIX_PATH_MAX = 107
# the private directory a socket is bound in before it is renamed into place: "." and 6 hex digits,
# socket name "s"; as long as "dra.sock", so the bind path is never longer than the final one
_PRIVATE_DIR_HEX = 3
_PRIVATE_SOCKET_NAME = "s"

ServicerRegistrar = Callable[[grpc.Server], None]


class SocketError(TesseraError):
    """A socket path that cannot be served: too long, not absolute, occupied by a non-socket, or bind failed."""

    reason = "socket"


INSTANCE_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")


def check_instance_id(instance_id: str) -> None:
    """Raise SocketError unless `instance_id` can be part of a socket file name (a pod UID can)."""
    if instance_id and not INSTANCE_ID_PATTERN.fullmatch(instance_id):
        raise SocketError(
            f"--instance-id {instance_id!r} must be 1-63 letters, digits, '-' or '_', starting with a letter or "
            "digit (a pod UID from the downward API's metadata.uid fits)"
        )


@dataclass(frozen=True)
class SocketPaths:
    """Where kubelet expects a DRA driver's sockets under a kubelet root directory.

    With an instance id both names carry it, so two plugin processes of one driver (the old and
    the new pod of a surge rolling update) each have their own registration socket and endpoint:
    kubelet (1.33+) keeps both registrations and routes calls to the newest connected one, and
    when the old pod removes its sockets, only the old registration goes away.
    """

    kubelet_dir: Path
    instance_id: str = ""

    @property
    def registry_dir(self) -> Path:
        return self.kubelet_dir / "plugins_registry"

    @property
    def plugin_dir(self) -> Path:
        return self.kubelet_dir / "plugins" / DRIVER_NAME

    @property
    def registration_socket(self) -> Path:
        if self.instance_id:
            return self.registry_dir / f"{DRIVER_NAME}-{self.instance_id}-reg.sock"
        return self.registry_dir / f"{DRIVER_NAME}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        if self.instance_id:
            return self.plugin_dir / f"dra-{self.instance_id}.sock"
        return self.plugin_dir / "dra.sock"

    def validate(self) -> None:
        """Raise SocketError when kubelet could not use these paths."""
        if not self.kubelet_dir.is_absolute():
            # kubelet resolves the GetInfo endpoint in its own working directory; only absolute paths are safe.
            raise SocketError(f"--kubelet-dir must be an absolute path, got {str(self.kubelet_dir)!r}")
        check_instance_id(self.instance_id)
        for path in (self.registration_socket, self.dra_socket):
            longest = max(len(os.fsencode(path)), len(os.fsencode(_bind_path_example(path))))
            if longest > UNIX_PATH_MAX:
                raise SocketError(
                    f"socket path {path} needs {longest} bytes, over the {UNIX_PATH_MAX}-byte "
                    "limit of unix sockets: use a shorter --kubelet-dir (or --instance-id)"
                )


def prepare_socket_path(path: Path) -> None:
    """Create the socket's directory (0750 where tessera creates it) and remove a stale socket left by a previous run.

    Anything at the path that is not a socket is left alone and reported: it is not ours to delete.
    """
    try:
        _make_dirs(path.parent)
    except OSError as exc:
        raise SocketError(f"cannot create socket directory {path.parent}: {exc.strerror or exc}") from exc
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SocketError(f"{path} exists and is not a unix socket; remove it by hand if it is not needed")
    log.info("removing stale socket", path=str(path))
    path.unlink(missing_ok=True)


def _make_dirs(directory: Path) -> None:
    missing: list[Path] = []
    cur = directory
    while not cur.exists():
        missing.append(cur)
        cur = cur.parent
    directory.mkdir(parents=True, exist_ok=True)
    # Only directories created here get tessera's mode; existing ones (kubelet's plugins_registry) keep theirs.
    for created in missing:
        os.chmod(created, DIR_MODE)


def _bind_path_example(path: Path) -> Path:
    return path.parent / ("." + "0" * 2 * _PRIVATE_DIR_HEX) / _PRIVATE_SOCKET_NAME


def _private_dir(parent: Path) -> Path:
    """A new directory only this process's user can enter; mkdir fails rather than reuse one someone planted."""
    for _ in range(100):
        candidate = parent / ("." + secrets.token_hex(_PRIVATE_DIR_HEX))
        try:
            candidate.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(candidate, 0o700)  # mkdir's mode is cut by the umask, never widened; make it exact
        return candidate
    raise SocketError(f"cannot create a private directory for binding a socket in {parent}")


def bind_private(server: grpc.Server, path: Path) -> None:
    """Listen on `path` with mode SOCKET_MODE from the moment the socket appears there.

    grpc binds inside `add_insecure_port`; the socket is bound in a private directory, chmod'ed,
    and renamed over `path` (atomic), so no one else can reach it before its mode is final.
    """
    if len(os.fsencode(path)) > UNIX_PATH_MAX:
        # the rename would succeed, but nobody could connect to a path longer than sun_path
        raise SocketError(f"cannot listen on {path}: {len(os.fsencode(path))} bytes, over the {UNIX_PATH_MAX}-byte "
                          "limit of unix sockets")  # fmt: skip
    private = _private_dir(path.parent)
    bound = private / _PRIVATE_SOCKET_NAME
    try:
        try:
            server.add_insecure_port(f"unix:{bound}")
        except RuntimeError as exc:
            raise SocketError(f"cannot listen on {path}: {exc}") from exc
        os.chmod(bound, SOCKET_MODE)
        os.rename(bound, path)
    finally:
        bound.unlink(missing_ok=True)
        private.rmdir()


class UnixSocketServer:
    """One grpc.server with a thread pool, serving the given servicers on one unix socket."""

    def __init__(
        self,
        name: str,
        path: Path,
        registrars: Sequence[ServicerRegistrar],
        *,
        max_workers: int = 8,
    ) -> None:
        self.name = name
        self.path = path
        self._registrars = tuple(registrars)
        self._max_workers = max_workers
        self._server: grpc.Server | None = None
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        with self._lock:
            return self._server is not None

    def start(self) -> None:
        """Bind and start serving; returns once the socket accepts connections."""
        with self._lock:
            if self._server is not None:
                return
            prepare_socket_path(self.path)
            server = grpc.server(
                ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix=f"grpc-{self.name}"),
            )
            for register in self._registrars:
                register(server)
            try:
                bind_private(server, self.path)
            except BaseException:
                server.stop(None)  # closes a listener bound before the rename failed
                raise
            server.start()
            self._server = server
        log.info("grpc server listening", server=self.name, socket=str(self.path))

    def stop(self, grace: float | None = None) -> None:
        """Stop accepting calls, give running ones `grace` seconds, and remove the socket file."""
        with self._lock:
            server, self._server = self._server, None
        if server is None:
            return
        server.stop(grace).wait()
        # grpc unlinks the socket on shutdown; make sure, so kubelet sees the plugin go away.
        try:
            if stat.S_ISSOCK(self.path.lstat().st_mode):
                self.path.unlink()
        except FileNotFoundError:
            pass
        log.info("grpc server stopped", server=self.name, socket=str(self.path))


def remove_dead_sockets(paths: SocketPaths) -> list[Path]:
    """Remove this driver's sockets that nobody listens on any more; returns what was removed.

    With per-instance names, an instance that was killed (no SIGTERM, so no clean-up of its own)
    leaves its two sockets behind for good: a new pod has a new UID. kubelet would keep retrying
    the registration socket, at every kubelet restart too. Only sockets named like this driver's
    (any instance id, or none) that refuse a connection are removed: a live instance accepts one,
    from the moment its socket is renamed into place, since it listens before the rename.
    """
    candidates = [
        *paths.registry_dir.glob(f"{DRIVER_NAME}-reg.sock"),
        *paths.registry_dir.glob(f"{DRIVER_NAME}-*-reg.sock"),
        *paths.plugin_dir.glob("dra.sock"),
        *paths.plugin_dir.glob("dra-*.sock"),
    ]
    removed = []
    for path in candidates:
        if path in (paths.registration_socket, paths.dra_socket):
            continue
        try:
            if not stat.S_ISSOCK(path.lstat().st_mode):
                continue
        except FileNotFoundError:
            continue
        if len(os.fsencode(path)) > UNIX_PATH_MAX or _accepts(path):
            continue
        path.unlink(missing_ok=True)
        log.info("removed the socket of a plugin instance that is gone", path=str(path))
        removed.append(path)
    return removed


def _accepts(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            return False
        except OSError:
            return True  # anything else (a full backlog, a timeout): assume alive
        return True
