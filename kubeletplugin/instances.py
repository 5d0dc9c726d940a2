"""What the plugin instances on one node agree on: who publishes ResourceSlices, and who is the last.

During a surge rolling update the old and the new plugin pod run side by side on a node. Both
serve kubelet, but the node's slices must have one writer: two publishers would fight over the
pool generation and each undo the other's repairs. So publishing is a leadership held as an flock
on `<state dir>/publisher.lock`: the first instance takes it, a later one waits as a standby and
takes it over within a second of the holder's exit (the kernel drops an flock with its process,
so a SIGKILLed leader hands over too).

And `--cleanup-on-exit` deletes the slices only when no other instance is left: every live
instance holds a shared flock on `<state dir>/instances.lock`, and a leaving instance that can
then take it exclusively was the last one.
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
INSTANCES_LOCK = "instances.lock"


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

    def __init__(self, state_dir: Path, on_acquired: Callable[[], None], *, retry_interval: float = 1.0) -> None:
        self.path = state_dir / PUBLISHER_LOCK
        self._on_acquired = on_acquired
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
    """A shared flock held for this instance's life; `leave()` says whether it was the last one."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / INSTANCES_LOCK
        self._fd = -1

    def join(self) -> None:
        if self._fd < 0:
            fd = _open(self.path)
            fcntl.flock(fd, fcntl.LOCK_SH)
            self._fd = fd

    def leave(self) -> bool:
        """Drop out; True when no other instance holds on (this one was the last on the node)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        fd = _open(self.path)
        try:
            return _try_flock(fd, fcntl.LOCK_EX)
        finally:
            os.close(fd)
