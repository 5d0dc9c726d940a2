"""Replacing a file so that readers see the old content or the new, never a torn one, even after a crash.

Every file the node agent owns (CDI specs, the checkpoint, the MPS, MIG, time-slicing and health state)
is written this way.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink in directory `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int, *, durable: bool = True) -> None:
    """Replace `path` with `data`: temp file in the same dir (not named *.json), fsync, rename, fsync the dir.

    `durable=False` skips both fsyncs: the rename still outlives a killed process, only not a power loss.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:
            # write/fsync errors (a full or read-only disk) name no file; say which one could not be written
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise
    if durable:
        fsync_dir(path.parent)
