"""Component processes of the e2e cluster and bounded waits on them.

Every component runs in its own process group with its output in a log file, so a test can show
the tail of each log when it fails and a session can make sure nothing outlives it.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parent.parent
T = TypeVar("T")


class ClusterError(RuntimeError):
    """A component failed to start or a wait ran out; the message says which and where its log is."""


# ---------------------------------------------------------------------------------------------
# waiting


def wait_for(check: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll `check` until it returns something truthy; raise ClusterError naming `what` after `timeout`.

    Exceptions from `check` count as "not yet" (the apiserver may still be starting), and the
    last one is reported if the wait runs out; but a failed assertion or a dead component
    (ClusterError) ends the wait at once.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            result = check()
            if result:
                return result
            last = result
        except (AssertionError, ClusterError):
            raise
        except Exception as exc:  # reported below if the wait runs out
            last = exc
        if time.monotonic() >= deadline:
            raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}; last result: {last!r}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# ---------------------------------------------------------------------------------------------
# processes

# Every process started in this interpreter, so a test session can make sure none outlives it.
_STARTED: list[ManagedProcess] = []


def stop_leftovers() -> list[str]:
    """Stop every process this interpreter started that is still running; returns their names."""
    left = [p.name for p in _STARTED if p.alive()]
    for proc in reversed(_STARTED):
        proc.stop()  # also removes the scratch dirs of processes that already exited
    return left


@dataclass
class ManagedProcess:
    """One component: started in its own process group, output captured in `log_path`."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    popen: subprocess.Popen[bytes] | None = None
    # Throw-away directories of this process (etcd's data), removed once it has exited.
    scratch: list[Path] = field(default_factory=list)
    # Where it runs (default: the repository, so `python -m tessera` is this checkout's tessera).
    cwd: Path | None = None
    # Descriptors the process inherits under the same numbers (a listening socket made by the caller).
    pass_fds: tuple[int, ...] = ()

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            stamp = datetime.datetime.now(datetime.UTC).isoformat()
            log.write(f"\n=== {stamp} start: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **(self.env or {})}, start_new_session=True, cwd=self.cwd or REPO,
                pass_fds=self.pass_fds,
            )
        _STARTED.append(self)
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} was never started"
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            rc = self.popen.returncode if self.popen else None
            raise ClusterError(f"{self.name} exited (rc={rc}); log {self.log_path}:\n{self.tail()}")

    def alive_and(self, condition: Callable[[], bool]) -> bool:
        """For waits: the condition, but fail at once (with the log tail) if the process died."""
        self.check_alive()
        return condition()

    def signal(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it if it has not exited within `timeout`."""
        if self.popen is None:
            return
        if self.alive():
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.popen.wait(10)
        # Children that outlived the leader (none expected) must not outlive the session.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        if not self.alive():
            for path in self.scratch:
                shutil.rmtree(path, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill would."""
        if self.popen is not None and self.alive():
            self.signal(signal.SIGKILL)
            self.popen.wait(10)

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])
