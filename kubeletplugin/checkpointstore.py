"""Read-modify-write access to the node agent's checkpoint file, safe across threads and processes.

`<state dir>/checkpoint.json`, mode 0600, always replaced atomically; its bytes are
kubeletplugin/checkpoint.py's business (formats, conversions, checksum), this module only decides
when to read and write them and who may.

A file that fails to decode, nests too deeply, or is not owned by this process's user or is
writable by others is moved aside (`checkpoint.json.corrupt-<timestamp>`) and tessera starts empty:
a loud error beats a crash loop, and kubelet re-prepares what it still needs. A file from a newer
build that this one cannot read is left in place and stops the agent (CheckpointFromNewerBuild).

The checksum catches damage (truncation, bit rot), not forgery: anyone who can write the file can
recompute it, and a key kept next to the file would be exactly as writable as the file. What keeps
a forged checkpoint out is the state directory's ownership and mode (see kubeletplugin.fsguard) and
the file's own owner and mode, checked on every read. And what a checkpoint can make tessera do is
bounded: it records each claim's allocation, never a CDI spec, and recovery rebuilds specs from the
allocation with the same code prepare uses, so a container can only get what tessera itself makes.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import os
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

import structlog

from driver.atomicfile import write_atomic
from kubeletplugin.checkpoint import Checkpoint, CheckpointError, CheckpointFromNewerBuild, ClaimEntry, decode, encode

log = structlog.get_logger(__name__)

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
# how much older than the cache a file's mtime must be before its identity alone proves it
# unchanged: well above any file system's timestamp granularity
_RACY_NS = 1_000_000_000
FILE_NAME = "checkpoint.json"


def current_boot_id(path: Path = BOOT_ID_PATH) -> str:
    """The kernel's id of this boot ("" where the kernel does not say)."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _untrusted(st: os.stat_result) -> str:
    """Why a checkpoint with this owner and mode cannot be trusted, or "" when it can."""
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by this agent's uid {os.geteuid()}: someone else wrote it"
    if st.st_mode & 0o022:
        return f"mode {stat.S_IMODE(st.st_mode):04o} lets others rewrite it"
    return ""


class CheckpointStore:
    """Read-modify-write access to the checkpoint, serialized across threads and processes.

    Two plugin pods overlap during a rolling update, so besides an in-process lock every
    transaction holds an flock on `checkpoint.lock`. Under that flock the file is decoded again
    only when its identity changed since this store last read or wrote it: every writer replaces
    it by rename, so a write by anyone gives a new inode (and a new ctime), and comparing
    (inode, size, mtime_ns, ctime_ns) of the open file catches it without parsing the JSON.
    """

    def __init__(self, state_dir: Path, boot_id: str | None = None) -> None:
        self.state_dir = state_dir
        self.path = state_dir / FILE_NAME
        self.boot_id = current_boot_id() if boot_id is None else boot_id
        self._lock = threading.RLock()
        self._depth = 0
        self._lock_file: IO[str] | None = None
        # what the file held when this store last read or wrote it (decoded and as bytes), the
        # identity it had then, and when (wall clock, ns) the bytes were last known to match;
        # None means "unknown": read and decode it on the next load
        self._cache: Checkpoint | None = None
        self._cache_bytes = b""
        self._cache_key: tuple[int, int, int, int] | None = None
        self._cache_at = 0
        self._queue: list[_Change] = []
        self._queue_guard = threading.Lock()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            if self._depth == 0:
                self.state_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
                fd = os.open(self.state_dir / "checkpoint.lock", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                lock_file = os.fdopen(fd, "a")
                fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
                self._lock_file = lock_file
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._lock_file is not None:
                    fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
                    self._lock_file.close()
                    self._lock_file = None

    @staticmethod
    def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def _remember(self, checkpoint: Checkpoint, data: bytes, key: tuple[int, int, int, int]) -> None:
        self._cache, self._cache_bytes, self._cache_key = checkpoint, data, key
        self._cache_at = time.time_ns()

    def _forget(self) -> None:
        self._cache, self._cache_bytes, self._cache_key = None, b"", None

    def _read(self) -> Checkpoint:
        """The checkpoint on disk, decoded only when the file changed since last seen; the caller holds the lock.

        The identity alone is trusted only for a file last modified well before the cache was
        taken: file times have the kernel's coarse resolution, so an in-place rewrite of the same
        size within the same tick (by hand, or an older agent) would keep (inode, size, mtime,
        ctime). Younger files are compared byte for byte, still far cheaper than decoding them.
        """
        try:
            f = self.path.open("rb")
        except FileNotFoundError:
            empty = Checkpoint({})
            self._forget()
            self._cache = empty
            return empty
        with f:
            # fstat of the open file: the identity and the bytes read below belong to the same inode
            st = os.fstat(f.fileno())
            untrusted = _untrusted(st)
            if untrusted:
                self._forget()
                self._move_aside(untrusted)
                return Checkpoint({})
            key = self._identity(st)
            settled = st.st_mtime_ns < self._cache_at - _RACY_NS
            if self._cache is not None and key == self._cache_key and settled:
                return self._cache
            data = f.read()
        if self._cache is not None and data == self._cache_bytes:
            self._remember(self._cache, data, key)
            return self._cache
        self._forget()
        try:
            decoded = decode(data)
        except CheckpointFromNewerBuild as exc:
            raise CheckpointFromNewerBuild(f"{self.path}: {exc}") from None
        except CheckpointError as exc:
            self._move_aside(str(exc))
            return Checkpoint({})
        self._remember(decoded, data, key)
        return decoded

    def _move_aside(self, reason: str) -> None:
        aside = self.path.with_name(f"{FILE_NAME}.corrupt-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S.%fZ')}")
        self.path.rename(aside)
        log.error(
            "checkpoint unusable; moved aside and starting with no prepared claims",
            path=str(self.path),
            moved_to=str(aside),
            reason=reason,
        )

    def read(self) -> Checkpoint:
        """The checkpoint as the file holds it now (its entries a copy the caller may edit)."""
        with self._locked():
            # a copy: callers edit it, and the cache must keep saying what the file says
            current = self._read()
            return Checkpoint(dict(current.entries), current.format, current.boot_id)

    def load(self) -> dict[str, ClaimEntry]:
        """The entries as the file holds them now (a copy the caller may edit)."""
        return self.read().entries

    def save(self, entries: dict[str, ClaimEntry]) -> None:
        with self._locked():
            # forget the cache first: if the write fails after its rename, the next read must look
            self._forget()
            data = encode(entries, self.boot_id)
            write_atomic(self.path, data, 0o600)
            self._remember(Checkpoint(dict(entries), boot_id=self.boot_id), data, self._identity(os.stat(self.path)))

    def stamp_boot(self) -> None:
        """Record this boot in the file (recovery calls it once it has acted on a reboot)."""
        with self._locked():
            current = self._read()
            if current.boot_id != self.boot_id and self.path.exists():
                self.save(dict(current.entries))

    @contextlib.contextmanager
    def transaction(self) -> Iterator[dict[str, ClaimEntry]]:
        """Yield the current entries for editing; saved when the block ends without an exception."""
        with self._locked():
            entries = self.load()
            before = dict(entries)
            yield entries
            if entries != before:
                self.save(entries)

    def get(self, uid: str) -> ClaimEntry | None:
        return self.load().get(uid)

    def put(self, entry: ClaimEntry) -> None:
        self._commit(_Change(entry.uid, entry))

    def drop(self, uid: str) -> None:
        self._commit(_Change(uid, None))

    def _commit(self, change: _Change) -> None:
        """Apply one claim's change and return once a durable write holds it.

        Group commit: changes queued by other threads while one write was under way go out together
        in the next write, one fsync for all of them, instead of one write after another behind the
        lock. Nobody returns before the write holding their change succeeded; when it fails, every
        change in it fails with the same error (and the cache is re-read from the file).
        """
        with self._queue_guard:
            self._queue.append(change)
        with self._locked():
            if change.done:
                return self._outcome(change)
            with self._queue_guard:
                batch, self._queue = self._queue, []
            error: BaseException | None = None
            try:
                with self.transaction() as entries:
                    for c in batch:
                        if c.entry is None:
                            entries.pop(c.uid, None)
                        else:
                            entries[c.uid] = c.entry
            except BaseException as exc:
                error = exc
                raise
            finally:
                for c in batch:
                    c.error, c.done = error, True
        return None

    @staticmethod
    def _outcome(change: _Change) -> None:
        if change.error is not None:
            # a copy: the leader's thread raises the original, and one exception object must not
            # collect two threads' tracebacks
            raise copy.copy(change.error) from change.error


@dataclass
class _Change:
    """A queued put (entry) or drop (entry None) of one claim, and what became of it."""

    uid: str
    entry: ClaimEntry | None
    done: bool = False
    error: BaseException | None = None
