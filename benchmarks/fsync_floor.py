"""The reference for node-side costs: one fsync'd atomic file replace on this machine's disk.

A prepare must survive a crash, so its floor is at least one durable write (temp file, fsync,
rename, fsync of the directory). This measures exactly that sequence with a CDI-spec-sized payload,
in the same kind of directory the prepare benchmark writes to, without any of tessera's code.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from benchmarks.stats import SUMMARY_HEADERS, Summary, summarize, table

PAYLOAD = b"x" * 2048  # about the size of one claim's CDI spec or checkpoint


def atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".floor.", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def measure(directory: Path, iterations: int) -> Summary:
    target = directory / "floor.json"
    atomic_write(target, PAYLOAD)  # first write creates the inode; not what a steady state pays
    samples = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        atomic_write(target, PAYLOAD)
        samples.append((time.perf_counter() - t0) * 1000)
    target.unlink()
    return summarize(samples)


def main(argv: list[str] | None = None) -> Summary:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--dir", type=Path, default=None, help="directory on the disk to measure (default: a temp dir)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tessera-floor-", dir=args.dir) as d:
        summary = measure(Path(d), args.iterations)
    print("fsync'd atomic file replace (2 KiB: write, fsync, rename, fsync dir)")
    print(table(SUMMARY_HEADERS, [summary.row()]))
    return summary


if __name__ == "__main__":
    main()
