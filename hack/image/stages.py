"""The four stages of the image build. Each writes into a fresh directory that build.py then keeps
in the cache under the stage's key (keys.py), and packs into a layer (oci.py):

  rootfs  mmdebstrap's Debian tree (tree/) and the list of installed packages (packages.txt)
  wheels  the locked wheels, downloaded and hash-checked
  deps    /opt/tessera with the dependencies installed and byte-compiled: an overlay's upper
          directory over the rootfs (upper/)
  app     tessera itself installed over both (upper/), then checked as a pod would run it (check.py)
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from hack.image import check, keys, lock, recipe
from hack.image.chroot import BuildError, in_root, overlay, private_run, run

SCRATCH = "/tmp"  # inside the root: the build's wheels and sources live here, never in a layer


@dataclass(frozen=True)
class Stage:
    """A finished stage's directory in the cache."""

    dir: Path

    @property
    def tree(self) -> Path:
        return self.dir / "tree"

    @property
    def upper(self) -> Path:
        return self.dir / "upper"


def _build_env(epoch: int) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": f"{SCRATCH}/home", "LANG": "C.UTF-8",
            "SOURCE_DATE_EPOCH": str(epoch), "PYTHONDONTWRITEBYTECODE": "1", "PIP_NO_CACHE_DIR": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


def build_rootfs(out: Path) -> None:
    private_run()
    tree = out / "tree"
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(recipe.BASE_EPOCH), "TMPDIR": str(out)}
    run(recipe.mmdebstrap_args(tree), env=env, timeout=1800, what="mmdebstrap")
    python = tree / "usr" / "bin" / f"python{recipe.PYTHON_VERSION}"
    if not python.exists():
        raise BuildError(f"{recipe.SUITE}'s python3 is not {recipe.PYTHON_VERSION} (no {python}); the wheels in "
                         f"hack/image/*.lock are for CPython {recipe.PYTHON_VERSION}: change recipe.py and relock")
    packages = in_root(tree, ["dpkg-query", "-W", "-f", "${Package} ${Version}\n"], _build_env(recipe.BASE_EPOCH),
                       what="dpkg-query")
    (out / "packages.txt").write_text(packages)


def download_wheels(out: Path, python: str) -> None:
    """Download exactly the locked wheels; pip refuses any file whose sha256 is not the pinned one."""
    cmd = [python, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes", "--no-cache-dir",
           "--disable-pip-version-check", "-d", str(out), *recipe.pip_target_args(),
           "-r", str(keys.LOCK), "-r", str(keys.BUILD_TOOLS_LOCK)]
    run(cmd, timeout=1800, what="pip download")
    have = {lock.pin_of_wheel(p) for p in out.glob("*.whl")}
    want = set(lock.parse(keys.LOCK.read_text(), "requirements.lock"))
    want |= set(lock.parse(keys.BUILD_TOOLS_LOCK.read_text(), "build-tools.lock"))
    if have != want:
        raise BuildError(f"pip download left {sorted(p.line() for p in have ^ want)} out of step with the locks")


def _wheel(wheels: Path, name: str) -> Path:
    found = [p for p in wheels.glob("*.whl") if lock.pin_of_wheel(p).name == name]
    if len(found) != 1:
        raise BuildError(f"expected one {name} wheel in {wheels}, found {len(found)}; is {name} in build-tools.lock?")
    return found[0]


def _pip(wheels_in_root: str, pip_wheel: Path) -> list[str]:
    """pip run straight from its wheel, so that the image's environment never holds pip."""
    return [f"{recipe.VENV}/bin/python", f"{wheels_in_root}/{pip_wheel.name}/pip"]


def _clean_scratch(root: Path) -> None:
    for entry in (root / SCRATCH.lstrip("/")).iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _compile(root: Path, env: dict[str, str], targets: list[str]) -> None:
    # unchecked-hash: the byte code is valid whatever the files' times, and is never re-validated
    # against the source (the root filesystem is read-only and immutable in a pod)
    in_root(root, [f"{recipe.VENV}/bin/python", "-m", "compileall", "-q", "--invalidation-mode", "unchecked-hash",
                   *targets], env, what="compileall")


def build_deps(out: Path, rootfs: Stage, wheels: Path) -> None:
    private_run()
    env = _build_env(recipe.BASE_EPOCH)
    with overlay([rootfs.tree], out / "upper", out / "scratch") as root:
        scratch = root / SCRATCH.lstrip("/")
        shutil.copytree(wheels, scratch / "wheels")
        shutil.copy(keys.LOCK, scratch / "requirements.lock")
        in_root(root, ["python3", "-m", "venv", "--without-pip", recipe.VENV], env, what="python3 -m venv")
        in_root(root, [*_pip(f"{SCRATCH}/wheels", _wheel(wheels, "pip")), "install", "--no-index", "--find-links",
                       f"{SCRATCH}/wheels", "--no-compile", "--require-hashes", "-r", f"{SCRATCH}/requirements.lock"],
                env, what="pip install (dependencies)")
        _compile(root, env, [recipe.SITE_PACKAGES])
        _clean_scratch(root)
    (out / "scratch").rmdir()


def build_app(out: Path, rootfs: Stage, deps: Stage, wheels: Path, *, epoch: int, root_dir: Path = recipe.REPO) -> None:
    private_run()
    env = _build_env(epoch)
    with overlay([deps.upper, rootfs.tree], out / "upper", out / "scratch") as root:
        scratch = root / SCRATCH.lstrip("/")
        for rel in keys.source_files(root_dir):
            dest = scratch / "src" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root_dir / rel, dest, follow_symlinks=True)
        (scratch / "wheels").mkdir()
        pip_wheel = _wheel(wheels, "pip")
        for name in ("pip", "setuptools"):
            shutil.copy(_wheel(wheels, name), scratch / "wheels")
        pip = _pip(f"{SCRATCH}/wheels", pip_wheel)
        # --no-deps: the dependencies are the locked ones below; `pip check` then proves they satisfy
        # pyproject.toml (a dependency added there without relocking fails here)
        in_root(root, [*pip, "install", "--no-index", "--find-links", f"{SCRATCH}/wheels", "--no-deps", "--no-compile",
                       f"{SCRATCH}/src"], env, what="pip install (tessera)")
        try:
            in_root(root, [*pip, "check"], env, what="pip check")
        except BuildError as e:
            raise BuildError(f"{e}\nThe locked wheels do not satisfy pyproject.toml: run "
                             "`python -m hack.image.lock` and rebuild") from None
        _compile(root, env, [f"{recipe.SITE_PACKAGES}/{p}" for p in recipe.APP_PACKAGES])
        _clean_scratch(root)
        check.check_root(root)
    (out / "scratch").rmdir()
