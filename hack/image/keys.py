"""Cache keys of the image build's stages: content hashes of exactly what each stage is made from.

  rootfs  the Debian base: suite, mirrors, packages, path excludes, epoch (recipe.py)
  wheels  the locked wheels: the two lock files and the target platform
  deps    the virtual environment with the dependencies: rootfs + wheels + how they are installed
  app     the image: deps + tessera's sources + the build's own code + the application epoch

A source-only change therefore rebuilds only `app`, and a new dependency only `wheels` onwards.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from hack.image import recipe

HERE = Path(__file__).resolve().parent
LOCK = HERE / "requirements.lock"
BUILD_TOOLS_LOCK = HERE / "build-tools.lock"
# Files that never change what is built: byte-code caches and packaging leftovers.
_IGNORED_DIRS = {"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
_IGNORED_SUFFIXES = (".pyc", ".pyo")


def _digest(parts: Iterable[tuple[str, bytes]]) -> str:
    h = hashlib.sha256()
    for name, data in parts:
        # length-prefixed, so that moving bytes from one part's name into its data changes the key
        for chunk in (name.encode(), data):
            h.update(len(chunk).to_bytes(8, "big"))
            h.update(chunk)
    return h.hexdigest()


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _ignored(rel: Path) -> bool:
    return (any(part in _IGNORED_DIRS or part.endswith(".egg-info") for part in rel.parts)
            or rel.name.endswith(_IGNORED_SUFFIXES))


def tree_files(root: Path, top: str) -> Iterator[Path]:
    """Every file under root/top that a build would copy, as paths relative to root, sorted."""
    base = root / top
    if not base.is_dir():
        raise FileNotFoundError(f"{base} is missing: the image is built from a full checkout")
    for path in sorted(base.rglob("*")):
        rel = path.relative_to(root)
        if (path.is_file() or path.is_symlink()) and not _ignored(rel):
            yield rel


def source_files(root: Path = recipe.REPO) -> list[Path]:
    """What the application layer is built from, relative to the checkout."""
    files = [Path(f) for f in recipe.SOURCE_FILES]
    for top in recipe.SOURCE_DIRS:
        files += tree_files(root, top)
    return files


def build_files(here: Path = HERE) -> list[Path]:
    """The build's own code and data (this directory), relative to `here`."""
    return sorted(p.relative_to(here) for p in here.rglob("*")
                  if p.is_file() and not _ignored(p.relative_to(here)))


def rootfs_key() -> str:
    spec = {"suite": recipe.SUITE, "mirrors": recipe.MIRRORS, "packages": recipe.PACKAGES,
            "excludes": recipe.DPKG_PATH_EXCLUDES, "epoch": recipe.BASE_EPOCH,
            "mmdebstrap": recipe.mmdebstrap_args(Path("/dest"))}
    return _digest([("rootfs", _json(spec))])


def wheels_key(lock: bytes, build_tools_lock: bytes) -> str:
    return _digest([("lock", lock), ("build-tools", build_tools_lock),
                    ("target", _json(recipe.pip_target_args()))])


def deps_key(rootfs: str, wheels: str, steps: object) -> str:
    """`steps` is the data that says how the environment is made (build.py's DEPS_STEPS)."""
    return _digest([("rootfs", rootfs.encode()), ("wheels", wheels.encode()), ("steps", _json(steps))])


@dataclass(frozen=True)
class AppInputs:
    deps: str
    epoch: int
    sources: list[tuple[str, bytes]]  # (path relative to the checkout, content)
    build: list[tuple[str, bytes]]  # (path relative to hack/image, content)


def read_app_inputs(deps: str, epoch: int, root: Path = recipe.REPO, here: Path = HERE) -> AppInputs:
    return AppInputs(deps=deps, epoch=epoch,
                     sources=[(str(p), (root / p).read_bytes()) for p in source_files(root)],
                     build=[(str(p), (here / p).read_bytes()) for p in build_files(here)])


def app_key(inputs: AppInputs) -> str:
    parts = [("deps", inputs.deps.encode()), ("epoch", str(inputs.epoch).encode())]
    parts += [("src:" + name, data) for name, data in inputs.sources]
    parts += [("build:" + name, data) for name, data in inputs.build]
    return _digest(parts)


def source_epoch(root: Path = recipe.REPO) -> int:
    """SOURCE_DATE_EPOCH of the application layer: the time of the last commit that touched what it is
    built from (so two builds of one tree agree), or the base's epoch outside a git checkout."""
    paths = [*recipe.SOURCE_FILES, *recipe.SOURCE_DIRS, "hack/image"]
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%ct", "--", *paths], cwd=root, capture_output=True,
                             text=True, check=True, timeout=60).stdout.strip()
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return recipe.BASE_EPOCH
    return int(out) if out.isdigit() else recipe.BASE_EPOCH
