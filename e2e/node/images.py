"""The two container images a real e2e node needs, built from local files and never pulled.

No registry can be reached here, so the pod sandbox's pause image is the static `pause` binary that
e2e/node/build.sh compiles, and the workload image is Debian's statically linked busybox with its
applets linked in /bin. Each is written as an OCI image layout tarball, which `ctr images import`
unpacks into the node's containerd. The tarballs are cached next to the binaries by content hash.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

PAUSE_IMAGE = "tessera.local/pause:e2e"
WORKLOAD_IMAGE = "tessera.local/workload:e2e"
BUSYBOX = Path("/bin/busybox")
# The commands a workload container's scripts use; each becomes a link to busybox in /bin.
_APPLETS = ("sh", "ls", "cat", "env", "echo", "sleep", "grep", "sort", "head", "tr", "mkdir", "stat", "date",
            "true", "false", "test", "[", "wc", "sed", "cut", "readlink", "id", "ps", "kill", "seq", "printf")


@dataclass(frozen=True)
class ImageFile:
    path: str  # inside the image, no leading slash
    data: bytes = b""
    mode: int = 0o755
    link: str = ""  # a symlink's target when set
    directory: bool = False


def _layer(files: list[ImageFile]) -> bytes:
    """A deterministic uncompressed tar layer (fixed mtimes and owners), so its digest is stable."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for f in sorted(files, key=lambda f: f.path):
            info = tarfile.TarInfo(f.path)
            info.mtime, info.uid, info.gid, info.mode = 0, 0, 0, f.mode
            if f.directory:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif f.link:
                info.type, info.linkname = tarfile.SYMTYPE, f.link
                tar.addfile(info)
            else:
                info.size = len(f.data)
                tar.addfile(info, io.BytesIO(f.data))
    return buf.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def write_oci_archive(dest: Path, name: str, files: list[ImageFile], cmd: list[str]) -> Path:
    """Write an OCI image layout tarball for linux/amd64 holding one layer made of `files`."""
    layer = _layer(files)
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Cmd": cmd, "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
        "history": [{"created_by": "tessera e2e/node/images.py"}],
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": _digest(config),
                   "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": _digest(layer),
                    "size": len(layer)}],
    }, sort_keys=True).encode()
    index = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": _digest(manifest),
                       "size": len(manifest), "platform": {"architecture": "amd64", "os": "linux"},
                       "annotations": {"io.containerd.image.name": name,
                                       "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1]}}],
    }, sort_keys=True).encode()
    blobs = [ImageFile(f"blobs/sha256/{_digest(b)[7:]}", b, 0o644) for b in (layer, config, manifest)]
    archive = [ImageFile("oci-layout", b'{"imageLayoutVersion":"1.0.0"}', 0o644),
               ImageFile("index.json", index, 0o644), ImageFile("blobs", directory=True),
               ImageFile("blobs/sha256", directory=True), *blobs]
    tmp = dest.with_suffix(".tmp")
    tmp.write_bytes(_layer(archive))
    tmp.replace(dest)
    return dest


def pause_files(pause_binary: Path) -> list[ImageFile]:
    return [ImageFile("pause", pause_binary.read_bytes())]


def workload_files(busybox: Path = BUSYBOX) -> list[ImageFile]:
    if not busybox.is_file():
        raise FileNotFoundError(f"{busybox} is missing: install Debian's busybox-static (e2e/node/build.sh does)")
    dirs = [ImageFile(d, directory=True) for d in ("bin", "dev", "proc", "sys", "tmp", "etc", "var", "run")]
    links = [ImageFile(f"bin/{applet}", link="busybox") for applet in _APPLETS]
    etc = [ImageFile("etc/passwd", b"root:x:0:0:root:/:/bin/sh\n", 0o644),
           ImageFile("etc/group", b"root:x:0:\n", 0o644)]
    return [*dirs, ImageFile("bin/busybox", busybox.read_bytes()), *links, *etc]


def build_images(bin_dir: Path) -> dict[str, Path]:
    """The pause and workload image archives, built once per binary directory (content-hashed)."""
    out = {PAUSE_IMAGE: bin_dir / "pause-image.tar", WORKLOAD_IMAGE: bin_dir / "workload-image.tar"}
    if not out[PAUSE_IMAGE].exists():
        write_oci_archive(out[PAUSE_IMAGE], PAUSE_IMAGE, pause_files(bin_dir / "pause"), ["/pause"])
    if not out[WORKLOAD_IMAGE].exists():
        write_oci_archive(out[WORKLOAD_IMAGE], WORKLOAD_IMAGE, workload_files(), ["/bin/sh"])
    return out


def import_images(ctr: list[str], archives: dict[str, Path]) -> None:
    """Import each archive into containerd's k8s.io namespace (the one the CRI plugin uses)."""
    for name, archive in archives.items():
        proc = subprocess.run([*ctr, "-n", "k8s.io", "images", "import", "--local", str(archive)],
                              capture_output=True, text=True, check=False, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"importing {name} from {archive} failed: {proc.stderr.strip() or proc.stdout.strip()}")

