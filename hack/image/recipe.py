"""What goes into tessera's image, as data: the Debian base, the Python platform the wheels target,
and the image configuration. The build (hack/image/build.py) and its cache keys read only this, so a
change here changes the key of exactly the stages it affects.

The layout matches the repository's Dockerfile (tests/hack/image/test_dockerfile.py compares them):
a virtual environment at /opt/tessera, `tessera` as the entrypoint, uid/gid 65532.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent

# The image's name on a node; the tag is chosen per build (see tags.py).
REPOSITORY = "tessera.local/tessera"

# Debian 12 ships CPython 3.11 and glibc 2.36: the wheels are cp311 manylinux wheels for that glibc.
SUITE = "bookworm"
MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
# `essential` plus these: no apt (nothing installs packages in a running image). grpcio, google-re2 and
# cel-expr-python are C++ extensions, so libstdc++6 is named even though python3 would not pull it.
PACKAGES = ("python3", "libstdc++6", "ca-certificates")
# Documentation, manuals and translations are never read in a container; licences stay.
DPKG_PATH_EXCLUDES = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/lintian/*",
)
# Files the packages and maintainer scripts write get this time (2025-01-01T00:00:00Z), so the base
# does not change with the day it is built. The application layer uses its own commit's time.
BASE_EPOCH = 1735689600
PYTHON_VERSION = "3.11"
GLIBC = (2, 36)
ARCH = "x86_64"
OCI_ARCH = "amd64"

VENV = "/opt/tessera"
SITE_PACKAGES = f"{VENV}/lib/python{PYTHON_VERSION}/site-packages"
# The project's top-level packages (pyproject's [tool.setuptools.packages.find] include), compiled
# and checked in the application layer.
APP_PACKAGES = ("driver", "kubeletplugin", "controller", "proto", "tessera")
# What the key of the application layer covers and what is copied into the build: the pip install
# of the checkout needs exactly these.
SOURCE_FILES = ("pyproject.toml", "README.md")
SOURCE_DIRS = APP_PACKAGES

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
USER = "65532:65532"
ENTRYPOINT = ("tessera",)
CMD = ("--help",)
LABELS = {
    "org.opencontainers.image.title": "tessera",
    "org.opencontainers.image.description":
        "Kubernetes DRA driver for NVIDIA GPUs (kubelet plugin and admission webhook)",
    "org.opencontainers.image.licenses": "Apache-2.0",
}

# What the build check imports inside the finished root filesystem (no network, uid 65532): the native
# extensions first, because `tessera --help` passes even when libstdc++ is missing.
CHECK_IMPORTS = ("grpc", "re2", "cel_expr_python", "cryptography.hazmat.bindings._rust", "cryptography.x509",
                 "kubernetes", "yaml", "structlog", "google.protobuf", "prometheus_client", "pynvml")
CHECK_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("tessera", "--help"),
    ("tessera", "kubelet-plugin", "--help"),
    ("tessera", "controller", "--help"),
)
CHECK_INVENTORY = ("tessera", "inventory", "--simulate", "a100-pcie-4")


@dataclass(frozen=True)
class ImageConfig:
    """The runtime part of the OCI image configuration (Docker's ENV, USER, ENTRYPOINT, CMD, LABEL)."""

    env: tuple[str, ...]
    user: str = USER
    entrypoint: tuple[str, ...] = ENTRYPOINT
    cmd: tuple[str, ...] = CMD
    labels: dict[str, str] = field(default_factory=lambda: dict(LABELS))


def image_config(version: str) -> ImageConfig:
    env = (f"PATH={VENV}/bin:{BASE_PATH}", "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1", "LANG=C.UTF-8")
    return ImageConfig(env=env, labels={**LABELS, "org.opencontainers.image.version": version})


def mmdebstrap_args(dest: Path) -> list[str]:
    """The mmdebstrap command that writes the Debian base into the directory `dest`."""
    args = ["mmdebstrap", "--mode=root", "--variant=essential", "--format=directory",
            # merged /usr set up by the hook, so that the usrmerge package (and with it perl) stays out
            "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
            "--include=" + ",".join(PACKAGES)]
    args += [f"--dpkgopt={opt}" for opt in DPKG_PATH_EXCLUDES]
    return [*args, SUITE, str(dest), *MIRRORS]


def wheel_platforms(glibc: tuple[int, int] = GLIBC, arch: str = ARCH) -> list[str]:
    """Every manylinux platform tag a wheel may carry and still run on this glibc, newest first.

    pip expands these for its own interpreter only; for `--platform` it takes the list as given."""
    major, minor = glibc
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 4, -1)]
    legacy = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}
    return tags + [f"{name}_{arch}" for name, needs in legacy.items() if major == 2 and minor >= needs]


def pip_target_args(platforms: Sequence[str] | None = None) -> list[str]:
    """pip options that select wheels for the image's interpreter instead of the one running pip."""
    out = ["--only-binary=:all:", "--implementation", "cp", "--python-version", PYTHON_VERSION,
           "--abi", "cp" + PYTHON_VERSION.replace(".", "")]
    for tag in platforms if platforms is not None else wheel_platforms():
        out += ["--platform", tag]
    return out


def chart_app_version(chart: Path = REPO / "helm" / "tessera" / "Chart.yaml") -> str:
    m = re.search(r'^appVersion:\s*"?([^"\s]+)"?\s*$', chart.read_text(), re.MULTILINE)
    if m is None:
        raise ValueError(f"{chart}: no appVersion; the image's default tag starts with it")
    return m.group(1)
