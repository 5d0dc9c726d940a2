"""The build check: the finished root filesystem, before it is packed, must run tessera as a pod would.

It runs with the image's own environment, as the image's user (65532), without network, and:
- imports every native extension tessera loads (grpc, re2, cel_expr_python, cryptography's Rust
  bindings, ...): a missing shared library (libstdc++) passes `tessera --help` but fails here;
- imports every module of tessera's own packages;
- runs `tessera --help`, both components' `--help` and `tessera inventory --simulate a100-pcie-4`;
- finds a byte-compiled file for every Python source in the environment, since the root filesystem
  is read-only in a pod and nothing can be compiled at run time.
"""

from __future__ import annotations

from pathlib import Path

from hack.image import recipe
from hack.image.chroot import BuildError, in_root

_IMPORT_ALL = """
import importlib, pkgutil, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
count = 0
for top in {packages!r}:
    pkg = importlib.import_module(top)
    for mod in pkgutil.walk_packages(pkg.__path__, top + "."):
        if mod.name.rsplit(".", 1)[-1] != "__main__":
            importlib.import_module(mod.name)
            count += 1
print(count)
"""


def image_env(version: str = "check") -> dict[str, str]:
    env = dict(item.split("=", 1) for item in recipe.image_config(version).env)
    return {**env, "HOME": "/"}


def uncompiled(site_packages: Path) -> list[str]:
    """Python sources under site_packages without their byte code for this interpreter."""
    tag = "cpython-" + recipe.PYTHON_VERSION.replace(".", "")
    return sorted(str(py.relative_to(site_packages)) for py in site_packages.rglob("*.py")
                  if not (py.parent / "__pycache__" / f"{py.stem}.{tag}.pyc").exists())


def check_root(root: Path) -> None:
    missing = uncompiled(root / recipe.SITE_PACKAGES.lstrip("/"))
    if missing:
        raise BuildError(f"{len(missing)} Python files have no byte code (first: {missing[:5]}); a read-only root "
                         "cannot compile them at run time")
    env = image_env()
    script = _IMPORT_ALL.format(packages=recipe.APP_PACKAGES)
    out = in_root(root, ["python", "-c", script, *recipe.CHECK_IMPORTS], env, user=recipe.USER,
                  what="build check: imports")
    if int(out.strip() or 0) < len(recipe.APP_PACKAGES):
        raise BuildError(f"build check: imported only {out.strip()} of tessera's modules")
    for cmd in recipe.CHECK_COMMANDS:
        text = in_root(root, list(cmd), env, user=recipe.USER, what="build check: " + " ".join(cmd))
        if not text.strip():
            raise BuildError(f"build check: `{' '.join(cmd)}` printed nothing")
    inventory = in_root(root, list(recipe.CHECK_INVENTORY), env, user=recipe.USER, what="build check: inventory")
    if inventory.count("A100") != 4:
        raise BuildError(f"build check: `{' '.join(recipe.CHECK_INVENTORY)}` did not list 4 A100s:\n{inventory}")
