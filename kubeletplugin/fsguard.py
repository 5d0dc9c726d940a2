"""Refuse to run on state and CDI directories that someone else controls.

The state directory holds the checkpoint that recovery acts on, and the CDI directory holds the
specs a container runtime applies as root: whoever can write either can decide what a container
mounts. A directory created by tessera gets a safe mode; one that already exists is checked, and a
directory not owned by this agent's user (root on a node) or writable by group or others stops the
agent with a message naming the path and the fix. Repairing it quietly would not help: files
planted while it was open would stay.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from driver.errors import NodeStateError


class UnsafeDirectoryError(NodeStateError):
    """A state or CDI directory others could write; the message names the path and the fix."""

    reason = "unsafe_directory"


def require_private_dir(path: Path, flag: str) -> None:
    """Create `path` (0755) when missing; raise UnsafeDirectoryError unless it is ours and only we may write it."""
    path.mkdir(mode=0o755, parents=True, exist_ok=True)
    st = path.stat()  # follows a symlink: what matters is the directory files land in
    uid = os.geteuid()
    problems = []
    if st.st_uid != uid:
        problems.append(f"owned by uid {st.st_uid}, not by this agent's uid {uid}")
    if st.st_mode & 0o022:
        problems.append(f"mode {stat.S_IMODE(st.st_mode):04o} lets group or others write it")
    if problems:
        raise UnsafeDirectoryError(
            f"{flag} {path} is {' and '.join(problems)}: whoever can write it decides what containers mount. "
            f"Check its content, then run `chown {uid} {path} && chmod go-w {path}` and restart"
        )
