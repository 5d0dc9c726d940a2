"""Another tessera build's source tree, taken from this checkout's git history, to run beside this one.

Upgrade and rollback tests run the previous build's `tessera kubelet-plugin` (`python -m tessera`
from the extracted tree, with the same virtualenv) against the same node state as this build's.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from e2e.processes import REPO


class NoPreviousBuild(RuntimeError):
    """The history needed is not in this checkout (a shallow clone, or no git)."""


def last_commit_without(path: str, marker: str) -> str:
    """The newest commit whose `path` does not contain `marker` (the build before a change)."""
    git = shutil.which("git")
    if git is None or not (REPO / ".git").exists():
        raise NoPreviousBuild("this checkout has no git history")
    log = subprocess.run([git, "-C", str(REPO), "log", "--format=%H", "--", path], capture_output=True, text=True,
                         check=True).stdout.split()
    for commit in log:
        source = subprocess.run([git, "-C", str(REPO), "show", f"{commit}:{path}"], capture_output=True, text=True,
                                check=False).stdout
        if source and marker not in source:
            return commit
    raise NoPreviousBuild(f"no commit in this checkout's history has a {path} without {marker!r}")


def extract(commit: str, dest: Path) -> Path:
    """The tree of `commit` under `dest` (git archive: no checkout, the repository is not touched)."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest
