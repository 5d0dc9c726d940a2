"""What the plugin instances on one node agree on: who publishes ResourceSlices, and who is the last.

During a surge rolling update the old and the new plugin pod run side by side on a node. Both
serve kubelet, but the node's slices must have one writer: two publishers would fight over the
pool generation and each undo the other's repairs. So publishing is a leadership held as an flock
on `<state dir>/publisher.lock`: the first instance takes it, a later one waits as a standby and
takes it over within a second of the holder's exit (the kernel drops an flock with its process,
so a SIGKILLed leader hands over too).

And `--cleanup-on-exit` deletes the slices only when no other instance is left: every live
instance holds an flock on its own file under `<state dir>/instances/`, so each can tell whether
another one is still running.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

PUBLISHER_LOCK = "publisher.lock"
INSTANCES_DIR = "instances"


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _try_flock(fd: int, mode: int) -> bool:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class PublisherLeadership:
    """Runs `on_acquired` once this instance holds the node's publisher lock; `release()` gives it back."""

    def __init__(
        self,
        state_dir: Path,
        on_acquired: Callable[[], None],
        *,
        on_takeover: Callable[[], None] | None = None,
        retry_interval: float = 1.0,
    ) -> None:
        self.path = state_dir / PUBLISHER_LOCK
        self._on_acquired = on_acquired
        self._on_takeover = on_takeover  # after `on_acquired`, when the lock came from another instance
        self._retry_interval = retry_interval
        self._fd = -1
        self._stop = threading.Event()
        self._guard = threading.Lock()  # orders a takeover against stop()
        self._thread: threading.Thread | None = None

    @property
    def leader(self) -> bool:
        with self._guard:
            return self._fd >= 0

    def start(self) -> bool:
        """Take the lock now if it is free (then `on_acquired` has run); else wait for it in the background."""
        if self._try_acquire():
            return True
        log.info("another plugin instance publishes this node's ResourceSlices; standing by", lock=str(self.path))
        self._thread = threading.Thread(target=self._wait, name="tessera-publisher-standby", daemon=True)
        self._thread.start()
        return False

    def _try_acquire(self) -> bool:
        with self._guard:
            if self._stop.is_set() or self._fd >= 0:
                return False
            fd = _open(self.path)
            if not _try_flock(fd, fcntl.LOCK_EX):
                os.close(fd)
                return False
            self._fd = fd
            # under the guard: stop() waits for a takeover that has begun
            self._on_acquired()
        return True

    def _wait(self) -> None:
        while not self._stop.wait(self._retry_interval):
            try:
                if self._try_acquire():
                    log.info("took over publishing this node's ResourceSlices")
                    if self._on_takeover is not None:
                        self._on_takeover()
                    return
            except Exception:
                log.exception("taking over the ResourceSlice publisher failed; retrying")

    def stop(self) -> None:
        """No takeover from now on (the lock, if held, is kept until `release()`)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        # a takeover in progress finishes before this returns
        with self._guard:
            pass

    def release(self) -> None:
        with self._guard:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


class InstanceMembership:
    """Each live instance holds an exclusive flock on `<state dir>/instances/<instance id>.lock`.

    A file whose lock can be taken belongs to an instance that is gone (the kernel dropped its
    lock when the process died) and is removed by whoever finds it.
    """

    def __init__(self, state_dir: Path, instance_id: str) -> None:
        self.dir = state_dir / INSTANCES_DIR
        self.name = instance_id or f"pid-{os.getpid()}"
        self._fd = -1

    @property
    def _path(self) -> Path:
        return self.dir / f"{self.name}.lock"

    def join(self) -> None:
        if self._fd >= 0:
            return
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        while True:
            fd = _open(self._path)
            if not _try_flock(fd, fcntl.LOCK_EX):
                os.close(fd)
                # the same id still held: a previous container of this pod that has not quite exited
                self.name = f"{self.name}-{os.getpid()}"
                continue
            try:
                same = os.fstat(fd).st_ino == self._path.stat().st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
                return
            os.close(fd)  # someone removed the file as stale between our open and our lock: again

    def others(self) -> list[str]:
        """The other live instances on this node, by instance id."""
        alive = []
        try:
            paths = sorted(self.dir.glob("*.lock"))
        except FileNotFoundError:
            return []
        for path in paths:
            if path == self._path and self._fd >= 0:
                continue
            try:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                if _try_flock(fd, fcntl.LOCK_SH):
                    path.unlink(missing_ok=True)  # its instance is gone
                else:
                    alive.append(path.name.removesuffix(".lock"))
            finally:
                os.close(fd)
        return alive

    def leave(self) -> bool:
        """Drop out; True when no other instance is left (this one was the last on the node)."""
        if self._fd >= 0:
            self._path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = -1
        return not self.others()
