"""Build tessera's OCI image (`make image`, or hack/image/build.sh, which starts this in a private
mount namespace; running it directly is refused).

    build.sh                    build what is missing, report the archive and the image reference
    build.sh --print-path       the same; stdout carries only the archive's path
    build.sh --print-ref        stdout carries only the reference (tessera.local/tessera:<tag>)
    build.sh --tag 0.1.0-dev    name the image with this tag instead of <appVersion>-<key>
    build.sh --rebuild app      rebuild this stage and those after it even when cached

With both --print-path and --print-ref, stdout has the path on the first line and the reference on
the second. The archive is $TESSERA_CACHE/image/app/<key>/tessera-<tag>.tar; containerd imports it
as tessera.local/tessera:<tag> (`ctr -n k8s.io images import --local <archive>`).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from hack.image import keys, oci, recipe, stages, tags
from hack.image.chroot import BuildError
from hack.image.lock import LockError

STAGES = ("rootfs", "wheels", "deps", "app")
# Finished application stages kept in the cache (each holds its archives, ~130 MB apiece); the
# oldest by last use go first. The Debian base, wheels and dependency stages are kept.
KEEP_APPS = 6
HERE = Path(__file__).resolve().parent


def log(message: str) -> None:
    sys.stderr.write(f"image: {message}\n")
    sys.stderr.flush()


def cache_root() -> Path:
    base = os.environ.get("TESSERA_CACHE") or str(Path.home() / ".cache" / "tessera")
    return Path(base) / "image"


def code_digest(*names: str) -> str:
    return hashlib.sha256(b"".join((HERE / n).read_bytes() for n in names)).hexdigest()


def project_version(root: Path = recipe.REPO) -> str:
    return str(tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"])


@dataclass(frozen=True)
class Plan:
    rootfs: str
    wheels: str
    deps: str
    app: str
    epoch: int
    tag: str

    @property
    def reference(self) -> str:
        return tags.reference(self.tag)


def make_plan(tag: str | None, root: Path = recipe.REPO) -> Plan:
    """Every stage's key and the image's name, from the checkout alone (nothing is built)."""
    rootfs = keys.rootfs_key()
    wheels = keys.wheels_key(keys.LOCK.read_bytes(), keys.BUILD_TOOLS_LOCK.read_bytes())
    deps = keys.deps_key(rootfs, wheels, code_digest("stages.py", "chroot.py"))
    epoch = keys.source_epoch(root)
    app = keys.app_key(keys.read_app_inputs(deps, epoch, root))
    chosen = tags.check_tag(tag) if tag is not None else tags.default_tag(recipe.chart_app_version(), app)
    return Plan(rootfs, wheels, deps, app, epoch, chosen)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    # Two builds at once (two worktrees, make image in two shells) must not both run mmdebstrap.
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def ensure(kind: str, key: str, build: Callable[[Path], None], rebuild: bool) -> Path:
    """The stage's directory in the cache, built (into a temporary directory, then renamed) if missing."""
    final = cache_root() / kind / key
    if (final / ".done").exists() and not rebuild:
        log(f"{kind} {key[:12]} up to date")
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _locked(final.parent / f"{key}.lock"):
        if (final / ".done").exists() and not rebuild:
            log(f"{kind} {key[:12]} up to date (built meanwhile)")
            return final
        tmp = final.with_name(key + ".tmp")
        _remove(tmp)
        tmp.mkdir()
        log(f"building {kind} {key[:12]} ...")
        start = time.monotonic()
        try:
            build(tmp)
        except BaseException:
            _remove(tmp)
            raise
        seconds = time.monotonic() - start
        (tmp / ".done").write_text(f"{seconds:.1f}\n")
        if final.exists():
            old = final.with_name(key + ".old")
            _remove(old)
            final.rename(old)
            tmp.rename(final)
            _remove(old)
        else:
            tmp.rename(final)
        log(f"built {kind} {key[:12]} in {seconds:.1f}s")
    return final


def ensure_layer(stage_dir: Path, source: str, select: oci.Selector, epoch: int, created_by: str) -> oci.Layer:
    """The stage's tree packed as a layer, once per version of the packer (oci.py)."""
    name = "layer-" + code_digest("oci.py")[:12]
    meta = stage_dir / f"{name}.json"
    with _locked(stage_dir.parent / f"{stage_dir.name}.lock"):
        if not meta.exists():
            start = time.monotonic()
            layer = oci.write_layer(stage_dir / source, stage_dir / f"{name}.tar.gz", epoch, select, created_by)
            meta.write_text(json.dumps(layer.to_json(), indent=1))
            log(f"packed {stage_dir.parent.name} layer in {time.monotonic() - start:.1f}s "
                f"({layer.blob.size / 1e6:.1f} MB)")
    return oci.Layer.from_json(json.loads(meta.read_text()), stage_dir)


def _build_app(out: Path, plan: Plan, *, rootfs: Path, deps: Path, wheels: Path, below: list[oci.Layer]) -> None:
    stages.build_app(out, stages.Stage(rootfs), stages.Stage(deps), wheels, epoch=plan.epoch)
    version = project_version()
    top = oci.write_layer(out / "upper", out / "layer.tar.gz", plan.epoch, oci.upper_selector("opt/tessera"),
                          f"pip install tessera {version} (hack/image/build.py)")
    layers = [*below, top]
    config = oci.config_json(recipe.image_config(version), layers, plan.epoch)
    (out / "config.json").write_bytes(config)
    # the top layer by a path relative to the stage's directory: `out` is renamed once it is done
    described = [*(layer.to_json() for layer in below), {**top.to_json(), "path": top.blob.path.name}]
    (out / "layers.json").write_text(json.dumps(described, indent=1))


def ensure_archive(app: Path, plan: Plan) -> tuple[Path, str]:
    """The stage's image under this tag as an archive (one per tag, written once), and its manifest digest."""
    dest = app / f"tessera-{plan.tag}.tar"
    layers = [oci.Layer.from_json(d, app) for d in json.loads((app / "layers.json").read_text())]
    config = (app / "config.json").read_bytes()
    with _locked(app.parent / f"{app.name}.lock"):
        if not dest.exists():
            oci.write_archive(dest, layers, config, plan.reference)
        (app / ".used").touch()
    return dest, oci.manifest_digest(config, layers)


def prune_apps(keep: str) -> None:
    """Drop the least recently used application stages beyond KEEP_APPS (never one being built)."""
    apps = [d for d in (cache_root() / "app").iterdir() if (d / ".done").exists() and d.name != keep]
    apps.sort(key=lambda d: (d / ".used").stat().st_mtime if (d / ".used").exists() else 0, reverse=True)
    for old in apps[KEEP_APPS - 1:]:
        with (old.parent / f"{old.name}.lock").open("a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            _remove(old)


def build(plan: Plan, rebuild: str | None, python: str) -> tuple[Path, str]:
    first = STAGES.index(rebuild) if rebuild else len(STAGES)
    force = {name: i >= first for i, name in enumerate(STAGES)}
    rootfs = ensure("rootfs", plan.rootfs, stages.build_rootfs, force["rootfs"])
    wheels = ensure("wheels", plan.wheels, lambda out: stages.download_wheels(out, python), force["wheels"])
    deps = ensure("deps", plan.deps, lambda out: stages.build_deps(out, stages.Stage(rootfs), wheels), force["deps"])
    below = [
        ensure_layer(rootfs, "tree", oci.base_selector, recipe.BASE_EPOCH,
                     f"mmdebstrap --variant=essential --include={','.join(recipe.PACKAGES)} {recipe.SUITE}"),
        ensure_layer(deps, "upper", oci.upper_selector("opt/tessera"), recipe.BASE_EPOCH,
                     f"python3 -m venv {recipe.VENV}; pip install -r hack/image/requirements.lock"),
    ]
    app = ensure("app", plan.app,
                 lambda out: _build_app(out, plan, rootfs=rootfs, deps=deps, wheels=wheels, below=below), force["app"])
    archive, digest = ensure_archive(app, plan)
    prune_apps(keep=app.name)
    return archive, digest


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/image/build.sh", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tag", help="the image's tag (default: <chart appVersion>-<first 12 hex of the build key>)")
    parser.add_argument("--print-path", action="store_true", help="print the archive's path on stdout")
    parser.add_argument("--print-ref", action="store_true", help="print the image reference on stdout")
    parser.add_argument("--rebuild", choices=STAGES, help="rebuild this stage and the later ones even when cached")
    args = parser.parse_args(argv)
    try:
        plan = make_plan(args.tag)
        archive, digest = build(plan, args.rebuild, sys.executable)
    except (BuildError, tags.TagError, LockError, FileNotFoundError, ValueError) as e:
        log(f"error: {e}")
        return 1
    log(f"{plan.reference} (manifest {digest}, {archive.stat().st_size / 1e6:.1f} MB) -> {archive}")
    lines = ([str(archive)] if args.print_path else []) + ([plan.reference] if args.print_ref else [])
    sys.stdout.write("".join(line + "\n" for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
