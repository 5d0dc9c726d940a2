"""OCI image pieces written byte-for-byte reproducibly: gzip'd tar layers from a directory tree, the
image configuration, the manifest, the index and the image-layout archive that `ctr images import`
and `skopeo` read.

A layer is a function of the tree's names, contents, modes, owners and (clamped) times only: entries
are sorted, times later than the epoch become the epoch, user and group names are left out, and the
gzip header carries no name and no time.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from hack.image.recipe import OCI_ARCH, ImageConfig

MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
# containerd names the imported image after this annotation; the OCI one is the tag alone.
ANNOTATION_CONTAINERD_NAME = "io.containerd.image.name"
ANNOTATION_REF_NAME = "org.opencontainers.image.ref.name"
GZIP_LEVEL = 6


class LayerError(ValueError):
    """The tree holds something a layer must not carry (a deletion, a device, a path out of place)."""


@dataclass(frozen=True)
class Blob:
    digest: str  # "sha256:<hex>" of the bytes as stored
    size: int
    path: Path


@dataclass(frozen=True)
class Layer:
    blob: Blob
    diff_id: str  # "sha256:<hex>" of the uncompressed tar
    created_by: str

    def to_json(self) -> dict[str, object]:
        return {"digest": self.blob.digest, "size": self.blob.size, "path": str(self.blob.path),
                "diff_id": self.diff_id, "created_by": self.created_by}

    @classmethod
    def from_json(cls, data: dict[str, object], base: Path) -> Layer:
        """`base` is the directory a relative path is relative to."""
        return cls(Blob(str(data["digest"]), int(str(data["size"])), base / str(data["path"])),
                   str(data["diff_id"]), str(data["created_by"]))


# Decides, for a path relative to the tree's root, whether it goes into the layer: True keeps it,
# False leaves it out; raising LayerError stops the build.
Selector = Callable[[str, os.stat_result], bool]


def base_selector(rel: str, st: os.stat_result) -> bool:
    """The Debian root: mount points stay as empty directories (the runtime fills /dev, /proc, /sys,
    /tmp); the host's name and resolver, which mmdebstrap copies in, are left out, and so is apt's
    state (apt is not installed; the owner of its partial directories differed between two builds)."""
    if rel in ("etc/hostname", "etc/resolv.conf"):
        return False
    if rel.startswith(("var/lib/apt/", "var/cache/apt/")) or rel in ("var/lib/apt", "var/cache/apt"):
        return False
    if rel.startswith("usr/share/info/"):  # the info index a maintainer script writes; the manuals are excluded
        return False
    top, _, rest = rel.partition("/")
    return not (top in ("dev", "proc", "sys", "tmp") and rest)


def upper_selector(allowed: str) -> Selector:
    """A layer made of an overlay's upper directory: only `allowed` (and its parents) may have changed;
    the build's scratch space under /tmp is left out."""
    parents = {str(Path(allowed).parents[i]) for i in range(len(Path(allowed).parents) - 1)}

    def select(rel: str, st: os.stat_result) -> bool:
        if rel == "tmp" or rel.startswith("tmp/"):
            if stat.S_ISCHR(st.st_mode):
                raise LayerError(f"/{rel}: the build deleted a file of the layer below")
            return False
        if rel in parents or rel == allowed or rel.startswith(allowed + "/"):
            return True
        raise LayerError(f"/{rel}: the build changed a file outside {'/' + allowed}; a layer of this stage "
                         "holds nothing else (was something installed or compiled there?)")

    return select


def _walk(root: Path, rel: str = "") -> Iterator[tuple[str, os.stat_result]]:
    with os.scandir(root / rel if rel else root) as it:
        entries = sorted(it, key=lambda e: e.name.encode("utf-8", "surrogateescape"))
    for entry in entries:
        path = f"{rel}/{entry.name}" if rel else entry.name
        st = entry.stat(follow_symlinks=False)
        yield path, st
        if stat.S_ISDIR(st.st_mode):
            yield from _walk(root, path)


class _Sink(Protocol):
    def write(self, data: bytes, /) -> int: ...


class _HashingWriter(io.RawIOBase):
    """Counts and hashes what passes through on its way to `sink`."""

    def __init__(self, sink: _Sink) -> None:
        self.sink, self.sha, self.size = sink, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, b: object) -> int:
        data = bytes(b)  # type: ignore[call-overload]
        self.sha.update(data)
        self.size += len(data)
        self.sink.write(data)
        return len(data)


def _opaque(path: Path) -> bool:
    """An overlay upper directory that hides everything below it (the build replaced a directory)."""
    try:
        return os.getxattr(path, "trusted.overlay.opaque", follow_symlinks=False) == b"y"
    except OSError:
        return False


def _tarinfo(root: Path, rel: str, st: os.stat_result, epoch: int,
             links: dict[tuple[int, int], str]) -> tarfile.TarInfo:
    info = tarfile.TarInfo(rel)
    info.mode, info.uid, info.gid = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid
    info.uname = info.gname = ""
    info.mtime = min(int(st.st_mtime), epoch)
    path = root / rel
    if stat.S_ISDIR(st.st_mode):
        if _opaque(path):
            raise LayerError(f"/{rel}: an opaque directory (the build replaced a directory of the layer below)")
        info.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(st.st_mode):
        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
    elif stat.S_ISREG(st.st_mode):
        first = links.setdefault((st.st_dev, st.st_ino), rel) if st.st_nlink > 1 else rel
        if first != rel:
            info.type, info.linkname = tarfile.LNKTYPE, first
        else:
            info.type, info.size = tarfile.REGTYPE, st.st_size
    elif stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
        raise LayerError(f"/{rel}: the build deleted a file of the layer below (overlay whiteout)")
    else:
        raise LayerError(f"/{rel}: a device, pipe or socket cannot go into an image layer")
    return info


def write_layer(root: Path, dest: Path, epoch: int, select: Selector, created_by: str) -> Layer:
    """Write root's tree, filtered by `select`, as a gzip'd tar to `dest` (atomically)."""
    tmp = dest.with_name(dest.name + ".tmp")
    links: dict[tuple[int, int], str] = {}
    with tmp.open("wb") as raw:
        compressed = _HashingWriter(raw)
        with gzip.GzipFile(filename="", mode="wb", compresslevel=GZIP_LEVEL, fileobj=compressed, mtime=0) as gz:
            plain = _HashingWriter(gz)
            with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT,
                              encoding="utf-8", errors="surrogateescape") as tar:
                for rel, st in _walk(root):
                    if not select(rel, st):
                        continue
                    info = _tarinfo(root, rel, st, epoch, links)
                    if info.type == tarfile.REGTYPE:
                        with (root / rel).open("rb") as f:
                            tar.addfile(info, f)
                    else:
                        tar.addfile(info)
    tmp.replace(dest)
    return Layer(Blob("sha256:" + compressed.sha.hexdigest(), compressed.size, dest),
                 "sha256:" + plain.sha.hexdigest(), created_by)


def rfc3339(epoch: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _canonical(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def config_json(cfg: ImageConfig, layers: Sequence[Layer], epoch: int) -> bytes:
    """The image configuration (what Docker writes for ENV, USER, ENTRYPOINT, CMD and LABEL)."""
    created = rfc3339(epoch)
    return _canonical({
        "architecture": OCI_ARCH,
        "os": "linux",
        "created": created,
        "config": {"User": cfg.user, "Env": list(cfg.env), "Entrypoint": list(cfg.entrypoint),
                   "Cmd": list(cfg.cmd), "Labels": dict(cfg.labels)},
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [{"created": created, "created_by": layer.created_by} for layer in layers],
    })


def manifest_json(config: bytes, layers: Sequence[Layer]) -> bytes:
    return _canonical({
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": _digest(config), "size": len(config)},
        "layers": [{"mediaType": MEDIA_LAYER, "digest": layer.blob.digest, "size": layer.blob.size}
                   for layer in layers],
    })


def manifest_digest(config: bytes, layers: Sequence[Layer]) -> str:
    """The image's identity: the same whatever its tag."""
    return _digest(manifest_json(config, layers))


def index_json(manifest: bytes, reference: str) -> bytes:
    """The layout's index: one manifest, named for containerd (full reference) and OCI (tag alone)."""
    tag = reference.rsplit(":", 1)[1]
    return _canonical({
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [{"mediaType": MEDIA_MANIFEST, "digest": _digest(manifest), "size": len(manifest),
                       "platform": {"architecture": OCI_ARCH, "os": "linux"},
                       "annotations": {ANNOTATION_CONTAINERD_NAME: reference, ANNOTATION_REF_NAME: tag}}],
    })


def _add(tar: tarfile.TarFile, name: str, size: int, data: IO[bytes] | None, directory: bool = False) -> None:
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    if directory:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
    else:
        info.mode, info.size = 0o644, size
        tar.addfile(info, data)


def write_archive(dest: Path, layers: Sequence[Layer], config: bytes, reference: str) -> str:
    """Write the OCI image layout as one tar; returns the manifest's digest (the image's identity,
    the same whatever the tag)."""
    manifest = manifest_json(config, layers)
    index = index_json(manifest, reference)
    tmp = dest.with_name(dest.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        layout = b'{"imageLayoutVersion":"1.0.0"}'
        _add(tar, "oci-layout", len(layout), io.BytesIO(layout))
        _add(tar, "index.json", len(index), io.BytesIO(index))
        _add(tar, "blobs", 0, None, directory=True)
        _add(tar, "blobs/sha256", 0, None, directory=True)
        blobs: list[tuple[str, int, IO[bytes] | Path]] = [
            (_digest(config), len(config), io.BytesIO(config)),
            (_digest(manifest), len(manifest), io.BytesIO(manifest)),
            *((layer.blob.digest, layer.blob.size, layer.blob.path) for layer in layers),
        ]
        for digest, size, source in sorted(blobs, key=lambda b: b[0]):
            name = "blobs/sha256/" + digest.removeprefix("sha256:")
            if isinstance(source, Path):
                with source.open("rb") as f:
                    _add(tar, name, size, f)
            else:
                _add(tar, name, size, source)
    tmp.replace(dest)
    return _digest(manifest)
