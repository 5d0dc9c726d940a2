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
from dataclasses import dataclass, field
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


@dataclass
class _LockSlot:
    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0  # threads holding or waiting for the lock; guarded by ClaimLockTable._guard


class ClaimLockTable:
    """One lock per claim, in this process and (through ClaimLocks) on the node.

    Threads queue on the in-process lock first, so each process holds at most one file lock per
    claim. Whoever holds it reads the claim's checkpoint entry afresh, so a claim the other
    instance prepared meanwhile is answered from its entry, never prepared twice. A claim's
    in-process lock lives only while someone holds or waits for it, so the table stays as small as
    the number of claims in flight (kubelet may name any number of UIDs).
    """

    def __init__(self, state_dir: Path) -> None:
        # the other instance of a rolling update prepares on the same node from the same checkpoint
        self.node_locks = ClaimLocks(state_dir)
        self._slots: dict[str, _LockSlot] = {}
        self._guard = threading.Lock()

    @contextlib.contextmanager
    def hold(self, uid: str, *, across_instances: bool = True) -> Iterator[None]:
        """Hold the claim's lock; `across_instances=False` when the caller already holds the node lock."""
        with self._guard:
            slot = self._slots.get(uid)
            if slot is None:
                slot = self._slots[uid] = _LockSlot()
            slot.users += 1
        try:
            with slot.lock, self.node_locks.claim(uid) if across_instances else contextlib.nullcontext():
                yield
        finally:
            with self._guard:
                slot.users -= 1
                if slot.users == 0:
                    del self._slots[uid]

    def in_use(self) -> dict[str, int]:
        """Per claim whose lock is held or awaited in this process, how many threads hold or await it."""
        with self._guard:
            return {uid: slot.users for uid, slot in self._slots.items()}

    def node(self) -> AbstractContextManager[None]:
        """Every claim's lock on the node at once (recovery)."""
        return self.node_locks.node()


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
