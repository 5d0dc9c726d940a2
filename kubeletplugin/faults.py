"""Fault injection, for tests only: every switch that makes the node agent fail on purpose is here.

Nothing in it is armed in a normal run. Production code reaches a named step and calls a
`FaultHook` with the step's name; the default hook, `crash_from_env`, does nothing unless the
environment asks for a crash at exactly that step. The switches, and how a test arms each one:

- `TESSERA_CRASH_AT=<step>` in the environment of `tessera kubelet-plugin`: the process SIGKILLs
  itself when a prepare or unprepare reaches `<step>` (one of PREPARE_STEPS or UNPREPARE_STEPS).
  DeviceState calls its `fault_hook` at each step; the crash tests start the plugin as a child
  process with the variable set, unit tests hand DeviceState a hook of their own that raises.
- `fail_at(MPS_START, error)` as the `fault_hook` of SimulatedMpsControl: its `start` raises
  `error`, as a real `nvidia-cuda-mps-control -d` that exits 1 makes NvidiaMpsControl do.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import structlog

log = structlog.get_logger(__name__)

# A named step reached; the hook may kill the process or raise there.
FaultHook = Callable[[str], None]

CRASH_ENV = "TESSERA_CRASH_AT"
PREPARE_STEPS = (
    "after-checkpoint-started",
    "after-mig-create",
    "after-cdi-write",
    "after-mps-start",
    "before-checkpoint-completed",
)
UNPREPARE_STEPS = (
    "unprepare-after-checkpoint-started",
    "unprepare-after-mps-stop",
    "unprepare-after-mig-destroy",
    "unprepare-after-cdi-delete",
)
# SimulatedMpsControl.start, before it records a daemon
MPS_START = "mps-start"


def crash_from_env(step: str) -> None:
    """Kill this process at `step` when TESSERA_CRASH_AT names it: for crash-recovery tests only."""
    if os.environ.get(CRASH_ENV) == step:
        log.warning("crash injected", step=step)
        os.kill(os.getpid(), signal.SIGKILL)


def fail_at(step: str, error: Exception) -> FaultHook:
    """A hook that raises `error` at `step` (and elsewhere behaves like `crash_from_env`)."""

    def hook(current: str) -> None:
        if current == step:
            raise error
        crash_from_env(current)

    return hook
