"""What the node agent has prepared, persisted so a restart (or a SIGKILL) loses nothing.

One JSON file, `<state dir>/checkpoint.json`, mode 0600:
`{"version": 1, "format": 2, "bootID": "<kernel boot id>", "checksum": "sha256:<hex>", "claims": {<uid>: {...}}}`
where the checksum covers the canonical JSON of `claims`. It is always replaced atomically.

Versions, so that neither an upgrade nor a rollback of the DaemonSet forgets a prepared claim:
`format` is the format the writer speaks, and `version` is the oldest format that can read the file
(the field every tessera build checks, which is why it keeps that name). A build reads every file
whose `version` is at most its own format, so format 2 reads what format 1 wrote, and it writes
`version: 1` as long as its claims stay readable by format 1 (new fields are added beside the old
ones; format 1 ignores fields it does not know, and the checksum covers them either way). A file
from a newer build that format 1 cannot read (`version` above this build's format) is not moved
aside, which would forget its claims: the agent refuses to start and says which build wrote it.
`bootID` recognises a node reboot: MPS daemons recorded in another boot are never adopted.

A file that fails to parse, fails its checksum, nests deeper than MAX_DEPTH, or is not owned by
this process's user or is writable by others is moved aside (`checkpoint.json.corrupt-<timestamp>`)
and tessera starts empty: a loud error beats a crash loop, and kubelet re-prepares what it still needs.

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
import hashlib
import json
import os
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

import structlog

from driver.atomicfile import write_atomic
from driver.errors import NodeStateError
from kubeletplugin.kubeletclaims import PreparedDevice
from kubeletplugin.migmanager import CreatedMig
from kubeletplugin.mps import MpsDaemon

log = structlog.get_logger(__name__)

# the format this build writes and the oldest format that can read it (see the module docstring)
FORMAT = 2
READABLE_SINCE = 1
CHECKPOINT_VERSION = READABLE_SINCE
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
# how much older than the cache a file's mtime must be before its identity alone proves it
# unchanged: well above any file system's timestamp granularity
_RACY_NS = 1_000_000_000
FILE_NAME = "checkpoint.json"
# tessera's own entries nest about ten levels (an allocation's opaque config included)
MAX_DEPTH = 64


class ClaimState(StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"
    UNPREPARE_STARTED = "UnprepareStarted"


@dataclass(frozen=True)
class GpuUse:
    """How a claim uses one physical GPU; used to refuse an exclusive claim on a card holding shares."""

    gpu_uuid: str
    kind: str  # "exclusive" (whole card), "share" (memory share), "mig" (a MIG instance on it)


@dataclass(frozen=True)
class ClaimEntry:
    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: tuple[PreparedDevice, ...] = ()
    gpu_uses: tuple[GpuUse, ...] = ()
    # this node's part of the claim's status.allocation (other drivers' results and configs nulled, so
    # result indices stay): recovery rebuilds the CDI spec from it after a reboot wiped /var/run/cdi
    allocation: dict[str, Any] | None = None
    mps: MpsDaemon | None = None
    migs: tuple[CreatedMig, ...] = field(default=())
    time_slices: tuple[tuple[str, str], ...] = ()  # (GPU UUID, interval) set for this claim

    def to_dict(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "state": self.state.value,
            "devices": [d.to_dict() for d in self.devices],
            "gpuUses": [{"gpuUUID": u.gpu_uuid, "kind": u.kind} for u in self.gpu_uses],
            "allocation": self.allocation,
            "mps": self.mps.to_dict() if self.mps else None,
            "migs": [m.to_dict() for m in self.migs],
            "timeSlices": [{"gpuUUID": u, "interval": i} for u, i in self.time_slices],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClaimEntry:
        return cls(
            uid=str(data["uid"]),
            namespace=str(data["namespace"]),
            name=str(data["name"]),
            state=ClaimState(data["state"]),
            devices=tuple(PreparedDevice.from_dict(d) for d in data.get("devices", [])),
            gpu_uses=tuple(GpuUse(str(u["gpuUUID"]), str(u["kind"])) for u in data.get("gpuUses", [])),
            # an older build's "cdiSpec" is ignored on purpose: a stored spec is never written back
            allocation=_object_or_none(data.get("allocation"), "allocation"),
            mps=MpsDaemon.from_dict(data["mps"]) if data.get("mps") else None,
            migs=tuple(CreatedMig.from_dict(m) for m in data.get("migs", [])),
            time_slices=tuple((str(t["gpuUUID"]), str(t["interval"])) for t in data.get("timeSlices", [])),
        )


class CheckpointError(NodeStateError):
    """The checkpoint file cannot be trusted."""


class CheckpointFromNewerBuild(CheckpointError):
    """The checkpoint was written by a newer tessera whose format this build cannot read; kept as is."""


def current_boot_id(path: Path = BOOT_ID_PATH) -> str:
    """The kernel's id of this boot ("" where the kernel does not say)."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _object_or_none(value: Any, what: str) -> dict[str, Any] | None:
    if value is None or isinstance(value, dict):
        return value
    raise TypeError(f"{what} must be an object, got {type(value).__name__}")


def _depth_over(doc: Any, limit: int) -> bool:
    """Whether `doc` nests deeper than `limit` containers (iterative: a deep document must not recurse here)."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


def _canonical(claims: dict[str, Any]) -> bytes:
    return json.dumps(claims, sort_keys=True, separators=(",", ":")).encode()


def encode(entries: dict[str, ClaimEntry], boot_id: str = "") -> bytes:
    # the claims are written in their canonical form, the bytes the checksum covers: one dump, and
    # json's C encoder (an indented dump runs the pure-Python one, a third of a prepare's CPU)
    claims = _canonical({uid: e.to_dict() for uid, e in sorted(entries.items())})
    checksum = "sha256:" + hashlib.sha256(claims).hexdigest()
    head = json.dumps({"version": READABLE_SINCE, "format": FORMAT, "bootID": boot_id, "checksum": checksum},
                      indent=1)
    return head[:-2].encode() + b',\n "claims": ' + claims + b"\n}\n"


@dataclass(frozen=True)
class Decoded:
    entries: dict[str, ClaimEntry]
    format: int
    boot_id: str  # "" when the writer did not record one (format 1)


def decode(data: bytes) -> dict[str, ClaimEntry]:
    """Parse and verify a checkpoint; CheckpointError says what is wrong with it."""
    return decode_document(data).entries


def decode_document(data: bytes) -> Decoded:
    """A checkpoint's entries and what its writer recorded about itself."""
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise CheckpointError(f"not valid JSON (truncated?): {exc}") from None
    except RecursionError:
        raise CheckpointError("nested too deeply to parse") from None
    if not isinstance(doc, dict):
        raise CheckpointError("not a JSON object")
    # what the entries are later compared, copied and re-encoded with recurses too
    if _depth_over(doc, MAX_DEPTH):
        raise CheckpointError(f"nested deeper than {MAX_DEPTH} levels, far more than any checkpoint tessera writes")
    version, written_as = doc.get("version"), doc.get("format", 1)
    if type(version) is not int or type(written_as) is not int or not 1 <= version <= written_as:
        raise CheckpointError(f"version {version!r} / format {written_as!r} are not a checkpoint's")
    if version > FORMAT:
        raise CheckpointFromNewerBuild(
            f"written by a newer tessera (format {written_as}, readable from format {version} on); this build "
            f"reads formats up to {FORMAT}: roll the DaemonSet forward again, or move the file aside to start "
            "empty (kubelet then prepares running pods' claims again)"
        )
    boot_id = doc.get("bootID", "")
    if not isinstance(boot_id, str):
        raise CheckpointError(f"bootID must be a string, got {type(boot_id).__name__}")
    claims = doc.get("claims")
    if not isinstance(claims, dict):
        raise CheckpointError("no claims object")
    expected = "sha256:" + hashlib.sha256(_canonical(claims)).hexdigest()
    if doc.get("checksum") != expected:
        raise CheckpointError(f"checksum mismatch (file says {doc.get('checksum')!r}, content is {expected})")
    try:
        entries = {uid: ClaimEntry.from_dict(entry) for uid, entry in claims.items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"malformed claim entry: {exc!r}") from None
    return Decoded(entries, written_as, boot_id)


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
        # the boot the file on disk was last written in, as of the last read ("" = not recorded)
        self.written_in_boot = ""
        self._lock = threading.RLock()
        self._depth = 0
        self._lock_file: IO[str] | None = None
        # what the file held when this store last read or wrote it (decoded and as bytes), the
        # identity it had then, and when (wall clock, ns) the bytes were last known to match;
        # None means "unknown": read and decode it on the next load
        self._cache: dict[str, ClaimEntry] | None = None
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

    def _remember(self, entries: dict[str, ClaimEntry], data: bytes, key: tuple[int, int, int, int]) -> None:
        self._cache, self._cache_bytes, self._cache_key = entries, data, key
        self._cache_at = time.time_ns()

    def _forget(self) -> None:
        self._cache, self._cache_bytes, self._cache_key = None, b"", None

    def _read(self) -> dict[str, ClaimEntry]:
        """The entries on disk, decoded only when the file changed since last seen; the caller holds the lock.

        The identity alone is trusted only for a file last modified well before the cache was
        taken: file times have the kernel's coarse resolution, so an in-place rewrite of the same
        size within the same tick (by hand, or an older agent) would keep (inode, size, mtime,
        ctime). Younger files are compared byte for byte, still far cheaper than decoding them.
        """
        try:
            f = self.path.open("rb")
        except FileNotFoundError:
            empty: dict[str, ClaimEntry] = {}
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
                return {}
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
            decoded = decode_document(data)
        except CheckpointFromNewerBuild as exc:
            raise CheckpointFromNewerBuild(f"{self.path}: {exc}") from None
        except CheckpointError as exc:
            self._move_aside(str(exc))
            return {}
        self.written_in_boot = decoded.boot_id
        self._remember(decoded.entries, data, key)
        return decoded.entries

    def _move_aside(self, reason: str) -> None:
        aside = self.path.with_name(f"{FILE_NAME}.corrupt-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S.%fZ')}")
        self.path.rename(aside)
        log.error(
            "checkpoint unusable; moved aside and starting with no prepared claims",
            path=str(self.path),
            moved_to=str(aside),
            reason=reason,
        )

    def load(self) -> dict[str, ClaimEntry]:
        with self._locked():
            # a copy: callers edit it, and the cache must keep saying what the file says
            return dict(self._read())

    def save(self, entries: dict[str, ClaimEntry]) -> None:
        with self._locked():
            # forget the cache first: if the write fails after its rename, the next read must look
            self._forget()
            data = encode(entries, self.boot_id)
            write_atomic(self.path, data, 0o600)
            self.written_in_boot = self.boot_id
            self._remember(dict(entries), data, self._identity(os.stat(self.path)))

    def stamp_boot(self) -> None:
        """Record this boot in the file (recovery calls it once it has acted on a reboot)."""
        with self._locked():
            entries = self._read()
            if self.written_in_boot != self.boot_id and self.path.exists():
                self.save(dict(entries))
                self.written_in_boot = self.boot_id

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
