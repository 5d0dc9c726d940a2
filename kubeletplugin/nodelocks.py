"""Locks that hold across the plugin processes of one node (the old and new pod of an upgrade).

During a surge rolling update kubelet may send a claim's prepare to one instance and, after a
timeout or a switch to the newer registration, the same claim to the other. Both read and write
one checkpoint, one CDI directory and one set of MPS records, so a claim's prepare and unprepare
must exclude each other across processes, and a starting instance's recovery (which rolls back
half-done prepares and removes what no checkpoint entry owns) must not run while the other
instance is in the middle of one.

One lock file, `<state dir>/claims.lock`, with Linux open-file-description locks (F_OFD_SETLKW):
a claim locks one byte chosen by a hash of its UID, recovery locks the whole file. OFD locks
belong to an open file, not to a process, so every holder opens the file itself: two threads of
one process exclude each other like two processes do, and closing one holder's file never drops
another's lock (as closing any descriptor does with classic POSIX locks). Two UIDs that hash to
the same byte merely wait for each other.

The small record files next to the checkpoint (the MIG journal, the simulated MPS and time-slice
records) are read, changed and replaced by both instances too: `SharedFileLock` guards each with an
flock on a `.lock` file beside it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import struct
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType

FILE_NAME = "claims.lock"
# bytes a claim's lock may land on; collisions only serialize two claims
_SLOTS = 1 << 30


def _flock_struct(lock_type: int, start: int, length: int) -> bytes:
    # struct flock: l_type, l_whence (short), l_start, l_len (off_t), l_pid (pid_t, 0 for OFD locks), padding
    return struct.pack("hhqqixxxx", lock_type, os.SEEK_SET, start, length, 0)


def claim_slot(uid: str) -> int:
    return int.from_bytes(hashlib.sha256(uid.encode()).digest()[:8], "big") % _SLOTS + 1


class ClaimLocks:
    """Per-claim and node-wide locks on `<state dir>/claims.lock`, shared by every instance on the node."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / FILE_NAME

    @contextlib.contextmanager
    def _hold(self, start: int, length: int) -> Iterator[None]:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, _flock_struct(fcntl.F_WRLCK, start, length))
            yield
        finally:
            os.close(fd)  # closing the description releases its OFD lock

    def claim(self, uid: str) -> AbstractContextManager[None]:
        """Exclusive use of one claim on this node, against every other thread and instance."""
        return self._hold(claim_slot(uid), 1)

    def node(self) -> AbstractContextManager[None]:
        """Exclusive use of every claim on this node: no prepare or unprepare runs anywhere meanwhile."""
        return self._hold(0, 0)  # length 0: from byte 0 to the end of any file


class SharedFileLock:
    """A reentrant lock for one record file, held across threads and across the node's plugin processes.

    Use as `with lock:`; the flock on `<file>.lock` is taken by the outermost holder in this process.
    """

    def __init__(self, guarded: Path) -> None:
        self.path = guarded.with_name(guarded.name + ".lock")
        self._lock = threading.RLock()
        self._depth = 0
        self._fd = -1

    def __enter__(self) -> None:
        self._lock.acquire()
        try:
            if self._depth == 0:
                self.path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                except BaseException:
                    os.close(fd)
                    raise
                self._fd = fd
            self._depth += 1
        except BaseException:
            self._lock.release()
            raise

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._depth -= 1
        if self._depth == 0:
            fd, self._fd = self._fd, -1
            os.close(fd)  # releases the flock
        self._lock.release()
