"""What ran during a slow moment: every benchmark process's CPU time sampled through a phase, and the Go
runtime's GC cycles (GODEBUG=gctrace=1) placed on the same clock.

A round trip through the apiserver and the webhook that takes 300 ms instead of 5 ms on a two-core machine
was either waiting for a core (someone else's CPU in that window says who) or waiting on something idle
(a timer, a lock, a GC cycle's assists). Both clocks here are CLOCK_BOOTTIME seconds, the clock
/proc/<pid>/stat's start time counts in.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def now() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _stat_fields(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses


def cpu_ticks(pid: int) -> int:
    """User + system time of `pid` (all its threads) in clock ticks."""
    fields = _stat_fields(pid)
    return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)


def started_at(pid: int) -> float:
    """When `pid` started, in CLOCK_BOOTTIME seconds."""
    return int(_stat_fields(pid)[19]) * TICK_S  # starttime: field 22 of proc(5)


@dataclass
class CpuSampler:
    """Samples each named process's CPU ticks every `interval` s from start() until stop()."""

    pids: dict[str, int]
    interval: float = 0.02
    samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> CpuSampler:
        self._sample()  # before returning: any window that starts inside the block has a sample before it
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()
        self._sample()  # the last one after stop(), so a window that ends just before is covered

    def _sample(self) -> None:
        ticks = {}
        for name, pid in self.pids.items():
            try:
                ticks[name] = cpu_ticks(pid)
            except (OSError, ValueError, IndexError):  # exited meanwhile
                continue
        self.samples.append((now(), ticks))

    def used(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds each process used from the last sample at or before `start` to the first at or after
        `end` (the window widened to whole samples), largest first."""
        before = next((s for s in reversed(self.samples) if s[0] <= start), None)
        after = next((s for s in self.samples if s[0] >= end), None)
        if before is None or after is None:
            return {}
        used = {name: (after[1][name] - ticks) * TICK_S for name, ticks in before[1].items() if name in after[1]}
        return dict(sorted(used.items(), key=lambda kv: -kv[1]))

    def cores(self) -> float:
        """Cores the processes used together from the first sample to the last (0 with fewer than two)."""
        if len(self.samples) < 2:
            return 0.0
        (t0, first), (t1, last) = self.samples[0], self.samples[-1]
        ticks = sum(last[name] - first[name] for name in first if name in last)
        return ticks * TICK_S / (t1 - t0) if t1 > t0 else 0.0


@dataclass(frozen=True)
class GcCycle:
    process: str
    number: int
    start: float  # CLOCK_BOOTTIME s
    wall_ms: float  # sweep termination + concurrent mark + mark termination
    heap: str  # live heap at start -> at end -> marked, as gctrace prints it ("1234->1300->700 MB")

    @property
    def end(self) -> float:
        return self.start + self.wall_ms / 1000


# gc 12 @34.567s 3%: 0.018+250+0.031 ms clock, 0.07+1.2/120/30+0.12 ms cpu, 1234->1300->700 MB, ...
_GCTRACE = re.compile(r"^gc (\d+) @([\d.]+)s \d+%: ([\d.]+)\+([\d.]+)\+([\d.]+) ms clock, \S+ ms cpu, "
                      r"(\d+->\d+->\d+ MB)")


def gc_cycles(process: str, log_text: str, process_start: float) -> list[GcCycle]:
    """The GC cycles a Go process logged with GODEBUG=gctrace=1, on the CLOCK_BOOTTIME clock (its @ times
    count from the runtime's start, a few milliseconds after the process's)."""
    cycles = []
    for line in log_text.splitlines():
        found = _GCTRACE.match(line)
        if found is None:
            continue
        number, at, sweep, mark, term, heap = found.groups()
        cycles.append(GcCycle(process, int(number), process_start + float(at),
                              float(sweep) + float(mark) + float(term), heap))
    # a log appended across restarts: keep only the last life (its cycle numbers start again at 1)
    last_life = max((i for i, c in enumerate(cycles) if c.number == 1), default=0)
    return cycles[last_life:]


def overlapping(cycles: list[GcCycle], start: float, end: float) -> list[GcCycle]:
    return [c for c in cycles if c.start < end and c.end > start]
