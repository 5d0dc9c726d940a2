"""The GPU health event log, `<state dir>/health-events.jsonl`: one JSON event per line.

`tessera inject-health-event` appends to it (`append_event`), people may too; `EventLogSource` tails it
for the node agent and hands each event to the HealthMonitor. On a simulated node the log is the whole
truth and is replayed at every start; on an NVML node it is an operator's channel (a `reset`, a
`recovered`) and only lines written while the agent runs count.

Nothing in the file can stop the agent, and only a file the agent can trust is read:
- Trust: a regular file owned by the agent's user (root on a node) that nobody else may write, as the
  checkpoint must be. Anything else is refused, with the reason in the log, and rechecked at every poll.
  When a file that was being read turns unsafe and then safe again, reading goes on from where the file
  ends by then: lines written meanwhile could be anyone's.
- Identity: the reader keeps the file open and follows its device and inode (an open file's inode cannot
  be reused), so a log that is deleted, replaced or truncated is read again from its start. A simulated
  node starts its conditions over; an NVML node applies the new file's lines on top, after reading what
  was still unread in the old one.
- Lines: each bad line (not JSON, wrong types, numbers the API cannot store, binary, over 64 KiB) is
  logged with the file and line number and skipped. A last line without its newline is given
  `partial_wait` seconds to be finished, then reported as incomplete (and applied if it is a whole
  event), so the next line written starts on its own instead of being glued to it.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import structlog

from driver.atomicfile import write_atomic
from driver.health import HealthEvent, HealthPolicy, parse_event

log = structlog.get_logger(__name__)

EVENT_LOG_FILE = "health-events.jsonl"
# The GPU indexes the agent accepts events for, so that `inject-health-event` can check --gpu.
GPUS_FILE = "health-gpus.json"
MAX_LINE = 64 * 1024  # an event is a few hundred bytes
_READ_CHUNK = 256 * 1024
_READ_BUDGET = 4 * 1024 * 1024  # per poll, so a huge file cannot hold the thread for long
_ERROR_MAX = 300  # characters of a parse error kept in the log


class EventSink(Protocol):
    """What the reader hands events to (kubeletplugin.healthmonitor.HealthMonitor)."""

    policy: HealthPolicy

    @property
    def gpu_indexes(self) -> list[int]: ...

    def handle(self, event: HealthEvent | None) -> bool: ...

    def reset_all(self) -> None: ...


def untrusted(st: os.stat_result) -> str:
    """Why a health file with this type, owner and mode must not be believed, or "" when it may be."""
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by this agent's uid {os.geteuid()}: someone else wrote it"
    if st.st_mode & 0o022:
        return f"mode {stat.S_IMODE(st.st_mode):04o} lets others write it"
    return ""


class EventLogSource:
    """Tails the event log and hands each good line's event to the monitor (see the module docstring)."""

    def __init__(self, path: Path, monitor: EventSink, *, interval: float = 0.2, replay: bool = True,
                 clock: Callable[[], float] = time.time, partial_wait: float = 2.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        """`replay` False (NVML nodes, where the conditions are saved elsewhere): the lines already in the
        file at start are skipped, and a replaced file adds to the conditions instead of starting them over."""
        self.path = path
        self._replay = replay
        self._monitor = monitor
        self._interval = interval
        self._clock = clock
        self._partial_wait = partial_wait
        self._monotonic = monotonic
        self._fd = -1
        self._ident: tuple[int, int] | None = None
        self._offset = 0  # bytes of the open file consumed (the unfinished tail included)
        self._tail = bytearray()  # the last line so far, still without its newline
        self._tail_since = 0.0  # when the tail last grew
        self._skipping = False  # inside a line over MAX_LINE: dropping bytes up to its newline
        self._line = 0
        self._skip_existing = not replay
        self._refused = ""  # why the current file is refused, logged once per reason
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- polling --------------------------------------------------------------------------------

    def poll(self) -> int:
        """Apply what was appended since the last poll; returns how many events were applied."""
        with self._lock:
            self._follow()
            if self._fd < 0:
                return 0
            st = os.fstat(self._fd)
            problem = untrusted(st)
            if problem:
                self._refuse(problem)
                return 0
            if self._refused:
                log.warning("the health event log is safe again; lines written while it was not are skipped",
                            path=str(self.path))
                self._refused = ""
                self._rewind(st.st_size)
                return 0
            if st.st_size < self._offset:
                self._start_over("was truncated")
            return self._read(st.st_size)

    def _follow(self) -> None:
        """Point the open descriptor at the file now at `path` (a new file is read from its start)."""
        try:
            st: os.stat_result | None = os.lstat(self.path)
        except FileNotFoundError:
            st = None
        if self._fd >= 0:
            if st is not None and (st.st_dev, st.st_ino) == self._ident:
                return
            if not self._replay and not self._refused:
                self._read(os.fstat(self._fd).st_size)  # what was appended before the rotation still counts
            self._close()
            self._start_over("was replaced" if st is not None else "was removed")
        if st is None:
            self._skip_existing = False  # a log created later is new: read it whole
            return
        if (st.st_dev, st.st_ino) == self._ident:
            return  # the same file, refused before (e.g. a symbolic link)
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            self._ident = (st.st_dev, st.st_ino)
            self._refuse("a symbolic link" if stat.S_ISLNK(st.st_mode) else f"cannot be opened: {exc.strerror}")
            return
        opened = os.fstat(fd)
        self._fd, self._ident = fd, (opened.st_dev, opened.st_ino)
        self._refused = ""
        self._rewind(opened.st_size if self._skip_existing else 0)
        self._skip_existing = False
        self._line = 0

    def _refuse(self, problem: str) -> None:
        if problem != self._refused:
            log.error("refusing the health event log: its events could be forged", path=str(self.path),
                      reason=problem, fix=f"check its content, then `chown {os.geteuid()} {self.path} && "
                      f"chmod 0600 {self.path}` (tessera inject-health-event creates it so)")
            self._refused = problem

    def _rewind(self, offset: int) -> None:
        self._offset = offset
        self._tail.clear()
        self._skipping = False

    def _start_over(self, what: str) -> None:
        self._rewind(0)
        self._line = 0
        self._refused = ""
        if self._replay:
            log.info(f"health event log {what}; starting the GPU conditions over", path=str(self.path))
            self._monitor.reset_all()
        else:
            log.info(f"health event log {what}; a new one is read from its start", path=str(self.path))

    def _close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._ident = -1, None

    def _read(self, size: int) -> int:
        applied = 0
        budget = _READ_BUDGET
        while self._offset < size and budget > 0:
            chunk = os.pread(self._fd, min(_READ_CHUNK, size - self._offset, budget), self._offset)
            if not chunk:
                break
            self._offset += len(chunk)
            budget -= len(chunk)
            applied += self._feed(chunk)
        return applied + self._finish_stale_tail()

    def _feed(self, chunk: bytes) -> int:
        applied = 0
        start = 0
        while (newline := chunk.find(b"\n", start)) >= 0:
            piece, start = chunk[start:newline], newline + 1
            if self._skipping:
                self._skipping = False  # the over-long line ends here; it was reported when it began
                continue
            self._tail += piece
            line = bytes(self._tail)
            self._tail.clear()
            self._line += 1
            applied += self._apply(line, self._line)
        rest = chunk[start:]
        if rest:
            self._tail_since = self._monotonic()
        if rest and not self._skipping:
            self._tail += rest
            if len(self._tail) > MAX_LINE:
                self._line += 1
                self._too_long(self._line)
                self._tail.clear()
                self._skipping = True
        return applied

    def _finish_stale_tail(self) -> int:
        if self._monotonic() - self._tail_since < self._partial_wait:
            return 0
        if self._skipping:  # an over-long last line (reported when it began) that never got its newline
            self._skipping = False
            return 0
        if not self._tail:
            return 0
        line = bytes(self._tail)
        self._tail.clear()
        self._line += 1
        log.warning("health event log line has no newline; taken as written", path=str(self.path),
                    line=self._line, waited_s=self._partial_wait,
                    hint="end every line with a newline; a line still being written would be cut here")
        return self._apply(line, self._line)

    def _too_long(self, number: int) -> None:
        log.warning("ignoring a bad line in the health event log", path=str(self.path), line=number,
                    error=f"longer than {MAX_LINE} bytes")

    def _apply(self, line: bytes, number: int) -> int:
        if len(line) > MAX_LINE:
            self._too_long(number)
            return 0
        if not line.strip():
            return 0
        where = f"{self.path}: line {number}"
        try:
            event = parse_event(json.loads(line), where, gpu_indexes=self._monitor.gpu_indexes,
                                default_time=self._clock(), policy=self._monitor.policy)
        except (ValueError, RecursionError) as exc:  # JSON and UTF-8 errors are ValueErrors; deep nesting recurses
            log.warning("ignoring a bad line in the health event log", path=str(self.path), line=number,
                        error=str(exc)[:_ERROR_MAX] or type(exc).__name__)
            return 0
        try:
            self._monitor.handle(event)  # None: an XID the policy ignores
        except Exception:  # a checked event should never fail here; if one does, it costs only itself
            log.exception("cannot apply a health event", path=str(self.path), line=number)
            return 0
        return 1

    # -- thread ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Say which GPUs count, replay the log (simulated) or skip what is there (NVML), then tail it."""
        write_gpu_indexes(self.path.parent, self._monitor.gpu_indexes)
        try:
            self.poll()  # replay what is there before kubelet can ask for anything
        except Exception:  # an unreadable log (EIO) must not stop the agent from starting
            log.exception("cannot read the health event log", path=str(self.path))
        self._skip_existing = False  # only what was there at start predates this agent
        self._thread = threading.Thread(target=self._run, name="health-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            self._close()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.poll()
            except Exception:  # never let a source take the agent down; the next poll tries again
                log.exception("cannot read the health event log", path=str(self.path))


def write_gpu_indexes(state_dir: Path, indexes: Iterable[int]) -> None:
    """Record the GPU indexes this node's agent accepts events for (read by `inject-health-event`)."""
    try:
        write_atomic(state_dir / GPUS_FILE, (json.dumps({"gpus": sorted(indexes)}) + "\n").encode(), 0o600,
                     durable=False)
    except OSError as exc:  # only the injection command's check needs it
        log.warning("cannot record the node's GPU indexes", path=str(state_dir / GPUS_FILE), error=str(exc))


def read_gpu_indexes(state_dir: Path) -> list[int]:
    """The GPU indexes the node agent recorded; ValueError saying what is wrong otherwise."""
    path = state_dir / GPUS_FILE
    try:
        raw = json.loads(path.read_bytes()[:MAX_LINE])
    except FileNotFoundError:
        raise ValueError(f"{path} is missing: the node agent writes it when it starts; is it running with "
                         f"--state-dir {state_dir}?") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot be read ({exc})") from None
    gpus = raw.get("gpus") if isinstance(raw, dict) else None
    if not isinstance(gpus, list) or not all(isinstance(g, int) and not isinstance(g, bool) for g in gpus):
        raise ValueError(f"{path}: not the list of GPU indexes the node agent writes")
    return gpus


def append_event(path: Path, event: dict[str, Any]) -> None:
    """Append one event line (what `tessera inject-health-event` does); one write, so readers see it whole.

    The log is created 0600 whatever the umask, and an existing log the agent would refuse is not
    written: OSError with the reason.
    """
    line = (json.dumps(event, sort_keys=True, allow_nan=False) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        os.fchmod(fd, 0o600)  # the umask may have taken bits off (0o277 would leave 0400)
    except FileExistsError:
        fd = os.open(path, flags)
        problem = untrusted(os.fstat(fd))
        if problem:
            os.close(fd)
            raise OSError(f"{path} is {problem}; the node agent refuses it. Check its content, then "
                          f"`chown {os.geteuid()} {path} && chmod 0600 {path}`") from None
    with os.fdopen(fd, "wb") as f:
        f.write(line)
