"""Summaries of timing samples and the plain-text tables every benchmark prints."""

from __future__ import annotations

import math
import os
import platform
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Summary:
    """Latency samples in milliseconds, reduced to what the reports quote."""

    n: int
    p50: float
    p99: float
    mean: float
    max: float

    def row(self) -> list[str]:
        return [f"{self.p50:.2f}", f"{self.p99:.2f}", f"{self.mean:.2f}", f"{self.max:.2f}", str(self.n)]


SUMMARY_HEADERS = ["p50 ms", "p99 ms", "mean ms", "max ms", "n"]


def percentile(sorted_samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): with few samples p99 is the maximum, never an interpolation."""
    if not sorted_samples:
        raise ValueError("percentile of no samples: the benchmark ran zero iterations; raise its count")
    rank = max(1, math.ceil(q / 100 * len(sorted_samples)))
    return sorted_samples[rank - 1]


def summarize(samples_ms: Sequence[float]) -> Summary:
    ordered = sorted(samples_ms)
    return Summary(
        n=len(ordered),
        p50=percentile(ordered, 50),
        p99=percentile(ordered, 99),
        mean=statistics.fmean(ordered),
        max=ordered[-1],
    )


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (readable as plain text too), columns padded to their widest cell."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def machine() -> dict[str, str]:
    """What BENCHMARKS.md states about the machine a figure came from."""
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = "unknown"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                    break
    except OSError:
        pass
    return {
        "cpus (nproc)": str(len(os.sched_getaffinity(0))),
        "cpu model": cpu,
        "memory": mem,
        "python": platform.python_version(),
        "kernel": platform.release(),
    }
