"""The host's NVIDIA user-space driver (libraries, tools, firmware) as CDI mounts.

tessera does not depend on the NVIDIA container toolkit, so nothing on the node can run an
`ldconfig` hook for us that is known to exist on the host. Instead every library is bind-mounted
read-only into one fixed directory, `/usr/local/nvidia/lib64` (the directory CUDA base images
already list in LD_LIBRARY_PATH), under each name the host has for it (libcuda.so,
libcuda.so.1, libcuda.so.<version>), so no symlinks have to be created in the container.
LD_LIBRARY_PATH is set to the value CUDA images use; an image that relies on its own value of
that variable has to add it back (documented in docs/sharing.md).

`root` is the driver root as the plugin sees it (e.g. `/driver-root`); `host_root` is the same
directory as the host sees it (e.g. `/`), because CDI mounts are resolved by the runtime on the host.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import structlog

from driver.cdi import ContainerEdits, Mount
from driver.errors import InvalidInputError

log = structlog.get_logger(__name__)

CONTAINER_LIB_DIR = "/usr/local/nvidia/lib64"
CONTAINER_BIN_DIR = "/usr/bin"
LD_LIBRARY_PATH = "/usr/local/nvidia/lib:/usr/local/nvidia/lib64"
MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")

LIBRARY_PATTERNS = (
    "libcuda.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libcudadebugger.so",
    "libnvidia-gpucomp.so",
    "libnvidia-allocator.so",
    "libnvidia-cfg.so",
    "libnvidia-opencl.so",
)
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
# Searched in this order; the first directory holding a library wins, so 64-bit directories come first.
LIBRARY_DIRS = (
    "usr/lib/x86_64-linux-gnu",
    "lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/lib64",
    "lib64",
    "usr/lib",
    "lib",
)
BINARY_DIRS = ("usr/bin", "bin", "usr/sbin", "sbin", "usr/local/bin")
FIRMWARE_DIRS = ("lib/firmware/nvidia", "usr/lib/firmware/nvidia")

_VERSION_SUFFIX = re.compile(r"^libcuda\.so\.(\d+\.\d+(?:\.\d+)?)\Z")


class DriverRootError(InvalidInputError):
    """The driver root does not look like an NVIDIA driver installation."""


@dataclass(frozen=True)
class DriverFile:
    source: str  # the real file, relative to the driver root
    container_path: str


@dataclass(frozen=True)
class DriverRoot:
    root: Path
    host_root: str
    driver_version: str
    libraries: tuple[DriverFile, ...]
    binaries: tuple[DriverFile, ...]
    firmware: tuple[DriverFile, ...]

    def host_path(self, file: DriverFile) -> str:
        return str(PurePosixPath(self.host_root) / file.source)

    def binary(self, name: str) -> Path | None:
        """Where the plugin itself finds a driver binary (e.g. nvidia-cuda-mps-control), if present."""
        for b in self.binaries:
            if PurePosixPath(b.container_path).name == name:
                return self.root / b.source
        return None

    def library_dirs(self) -> tuple[Path, ...]:
        """Directories holding the driver libraries, as the plugin sees them (for running driver tools)."""
        return tuple(dict.fromkeys((self.root / lib.source).parent for lib in self.libraries))

    def container_edits(self) -> ContainerEdits:
        files = self.libraries + self.binaries + self.firmware
        mounts = tuple(Mount(self.host_path(f), f.container_path, MOUNT_OPTIONS) for f in files)
        env = (f"LD_LIBRARY_PATH={LD_LIBRARY_PATH}",) if self.libraries else ()
        return ContainerEdits(env=env, mounts=mounts)


def _resolve_inside(root: Path, path: Path) -> Path | None:
    """Follow symlinks of `path` as if `root` were `/`; None if dangling, looping or escaping the root."""
    current = path
    for _ in range(40):
        if not current.is_symlink():
            return current if current.is_file() else None
        target = Path(os.readlink(current))
        current = root / target.relative_to("/") if target.is_absolute() else current.parent / target
        current = Path(os.path.normpath(current))
        if current != root and root not in current.parents:
            return None
    return None


def _libraries(root: Path) -> list[DriverFile]:
    found: list[DriverFile] = []
    for pattern in LIBRARY_PATTERNS:
        for rel_dir in LIBRARY_DIRS:
            directory = root / rel_dir
            if not directory.is_dir():
                continue
            names = sorted(p.name for p in directory.iterdir() if p.name == pattern or p.name.startswith(pattern + "."))
            hits = []
            for name in names:
                real = _resolve_inside(root, directory / name)
                if real is None:
                    log.warning("skipping unresolvable driver library", path=str(directory / name))
                    continue
                hits.append(DriverFile(str(real.relative_to(root)), f"{CONTAINER_LIB_DIR}/{name}"))
            if hits:
                found.extend(hits)
                break
    return found


def _binaries(root: Path) -> list[DriverFile]:
    found = []
    for name in BINARIES:
        for rel_dir in BINARY_DIRS:
            real = _resolve_inside(root, root / rel_dir / name)
            if real is not None and os.access(real, os.X_OK):
                found.append(DriverFile(str(real.relative_to(root)), f"{CONTAINER_BIN_DIR}/{name}"))
                break
    return found


def _firmware(root: Path, version: str) -> list[DriverFile]:
    for rel_dir in FIRMWARE_DIRS:
        directory = root / rel_dir / version
        if directory.is_dir():
            return [
                DriverFile(str(p.relative_to(root)), f"/lib/firmware/nvidia/{version}/{p.name}")
                for p in sorted(directory.iterdir())
                if p.is_file()
            ]
    return []


def discover_driver_root(root: Path, *, host_root: str | None = None) -> DriverRoot:
    """Find the driver files under `root`; DriverRootError when it is missing or holds no libcuda."""
    root = Path(os.path.normpath(root.absolute()))
    if not root.is_dir():
        raise DriverRootError(f"--cdi-driver-root {root}: no such directory")
    libraries = _libraries(root)
    versions = {
        m.group(1) for lib in libraries if (m := _VERSION_SUFFIX.match(PurePosixPath(lib.source).name)) is not None
    }
    if not any(PurePosixPath(lib.container_path).name.startswith("libcuda.so") for lib in libraries):
        searched = ", ".join(LIBRARY_DIRS)
        raise DriverRootError(
            f"--cdi-driver-root {root}: no libcuda.so found (searched {searched}); "
            "point it at the directory the NVIDIA driver is installed under (usually / or /run/nvidia/driver)"
        )
    version = sorted(versions)[-1] if versions else ""
    driver_root = DriverRoot(
        root=root,
        host_root=host_root if host_root is not None else str(root),
        driver_version=version,
        libraries=tuple(libraries),
        binaries=tuple(_binaries(root)),
        firmware=tuple(_firmware(root, version)) if version else (),
    )
    log.info(
        "driver root discovered",
        root=str(root),
        driver_version=version,
        libraries=len(driver_root.libraries),
        binaries=len(driver_root.binaries),
        firmware=len(driver_root.firmware),
    )
    return driver_root
