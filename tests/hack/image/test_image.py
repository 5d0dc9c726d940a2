"""The real image, built by hack/image/build.sh (with the shared cache under $TESSERA_CACHE: warm,
this takes seconds; cold, a few minutes and the Debian and PyPI mirrors), read back from its OCI
archive the way containerd would, and run from the unpacked layers.

The hermetic check below rebuilds only the application stage. To check a cold build the same way
(mmdebstrap included), run this file with an empty cache:
    TESSERA_CACHE=$(mktemp -d) .venv/bin/python -m pytest -q tests/hack/image/test_image.py
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from hack.image import check, recipe
from hack.image.chroot import BuildError
from tests.paths import REPO

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(os.geteuid() != 0, reason="the image build needs root (mmdebstrap, chroot, mounts)"),
]
BUILD_SH = REPO / "hack" / "image" / "build.sh"
WATCHED = ("/", "/run", "/var/lib")


def build(*args: str) -> tuple[list[str], str]:
    proc = subprocess.run(["bash", str(BUILD_SH), *args], capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout.splitlines(), proc.stderr


def machine_snapshot() -> dict[str, list[str]]:
    """What the build could leave behind: top-level entries, mounts, and libmount's record of them."""
    snap = {f"ls {d}": sorted(os.listdir(d)) for d in WATCHED}
    with open("/proc/self/mountinfo") as f:
        snap["mounts"] = sorted(line.split()[4] for line in f)
    utab = Path("/run/mount/utab")
    snap["/run/mount/utab"] = utab.read_text().splitlines() if utab.exists() else ["<absent>"]
    return snap


@dataclass(frozen=True)
class Archive:
    path: Path
    reference: str
    files: dict[str, bytes]

    def blob(self, digest: str) -> bytes:
        return self.files["blobs/sha256/" + digest.removeprefix("sha256:")]

    @property
    def index(self) -> dict:
        return json.loads(self.files["index.json"])

    @property
    def manifest_digest(self) -> str:
        return self.index["manifests"][0]["digest"]

    @property
    def manifest(self) -> dict:
        return json.loads(self.blob(self.manifest_digest))

    @property
    def config(self) -> dict:
        return json.loads(self.blob(self.manifest["config"]["digest"]))

    def layer_members(self, n: int) -> dict[str, tarfile.TarInfo]:
        with tarfile.open(fileobj=io.BytesIO(self.blob(self.manifest["layers"][n]["digest"])), mode="r:gz") as tar:
            return {m.name: m for m in tar.getmembers()}


def read_archive(path: Path, reference: str) -> Archive:
    with tarfile.open(path) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    return Archive(path, reference, files)


@dataclass
class Session:
    """The image as first built by this module, and the machine's state around each build."""

    image: Archive
    snapshots: list[tuple[str, dict[str, list[str]]]]


@pytest.fixture(scope="module")
def session() -> Session:
    before = machine_snapshot()
    (path, reference), _ = build("--print-path", "--print-ref")
    return Session(read_archive(Path(path), reference), [("before", before), ("after the build", machine_snapshot())])


@pytest.fixture(scope="module")
def image(session: Session) -> Archive:
    return session.image


@pytest.fixture(scope="module")
def rebuilt(session: Session) -> Archive:
    """The application stage built again from scratch."""
    (path, reference), _ = build("--rebuild", "app", "--print-path", "--print-ref")
    session.snapshots.append(("after rebuilding the application stage", machine_snapshot()))
    return read_archive(Path(path), reference)


def unpack(image: Archive, root: Path) -> Path:
    """The layers applied in order, as containerd would."""
    root.mkdir()
    for n in range(len(image.manifest["layers"])):
        layer = root.parent / f"layer{n}.tar.gz"
        layer.write_bytes(image.blob(image.manifest["layers"][n]["digest"]))
        subprocess.run(["tar", "-xzf", str(layer), "-C", str(root), "--numeric-owner"], check=True)
        layer.unlink()
    return root


def run_as_image(image: Archive, root: Path, *cmd: str) -> subprocess.CompletedProcess[str]:
    env = {**dict(e.split("=", 1) for e in image.config["config"]["Env"]), "HOME": "/"}
    user = image.config["config"]["User"]
    return subprocess.run(["unshare", "--net", "chroot", f"--userspec={user}", str(root), *cmd], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_archive_and_reference_are_named_after_the_tag(image):
    tag = image.reference.removeprefix("tessera.local/tessera:")
    assert re.fullmatch(re.escape(recipe.chart_app_version()) + r"-[0-9a-f]{12}", tag)
    assert image.path.name == f"tessera-{tag}.tar"


def test_the_index_names_the_image_for_ctr_import(image):
    (entry,) = image.index["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == image.reference
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == image.reference.rsplit(":", 1)[1]
    assert json.loads(image.files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}


def test_every_blob_matches_its_digest_and_size(image):
    for desc in [image.manifest["config"], *image.manifest["layers"]]:
        data = image.blob(desc["digest"])
        assert (len(data), "sha256:" + hashlib.sha256(data).hexdigest()) == (desc["size"], desc["digest"])


def test_the_runtime_config_is_the_dockerfiles(image):
    cfg = image.config["config"]
    assert cfg["Entrypoint"] == ["tessera"] and cfg["Cmd"] == ["--help"]
    assert cfg["User"] == "65532:65532"
    env = dict(e.split("=", 1) for e in cfg["Env"])
    assert env["PATH"].startswith("/opt/tessera/bin:")
    assert env["PYTHONDONTWRITEBYTECODE"] == env["PYTHONUNBUFFERED"] == "1"
    assert cfg["Labels"]["org.opencontainers.image.title"] == "tessera"
    assert cfg["Labels"]["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert image.config["architecture"] == "amd64" and image.config["os"] == "linux"


def test_three_layers_debian_dependencies_tessera(image):
    assert len(image.manifest["layers"]) == 3
    base, deps, app = (image.layer_members(n) for n in range(3))
    assert "usr/bin/python3.11" in base and "usr/lib/x86_64-linux-gnu/libstdc++.so.6" in base
    assert all(n == "opt" or n.startswith("opt/tessera") for n in [*deps, *app])
    site = recipe.SITE_PACKAGES.lstrip("/")
    assert f"{site}/grpc/__init__.py" in deps and f"{site}/tessera/cli.py" not in deps
    assert f"{site}/tessera/cli.py" in app and "opt/tessera/bin/tessera" in app
    assert app["opt/tessera/bin/tessera"].mode & 0o111


def test_the_venv_holds_no_pip_or_setuptools(image):
    names = set(image.layer_members(1)) | set(image.layer_members(2))
    site = recipe.SITE_PACKAGES.lstrip("/")
    assert not [n for n in names if re.match(rf"{site}/(pip|setuptools|_distutils_hack)(/|-)", n)]
    assert "opt/tessera/bin/pip" not in names


def test_the_base_has_no_docs_manuals_translations_devices_or_host_files(image):
    base = image.layer_members(0)
    assert not [n for n in base if n.startswith(("usr/share/man/", "usr/share/locale/", "usr/share/info/"))]
    docs = [n for n in base if n.startswith("usr/share/doc/") and base[n].isfile()]
    assert docs and all(n.endswith("/copyright") for n in docs)
    assert not [n for n in base if n.startswith(("dev/", "proc/", "sys/", "tmp/"))]
    assert not {"etc/hostname", "etc/resolv.conf"} & set(base)
    assert not [m for m in base.values() if m.ischr() or m.isblk() or m.isfifo()]


def test_every_python_file_is_byte_compiled(image):
    names = set(image.layer_members(1)) | set(image.layer_members(2))
    tag = "cpython-" + recipe.PYTHON_VERSION.replace(".", "")
    site = recipe.SITE_PACKAGES.lstrip("/") + "/"
    # (scripts in bin/, such as jmespath's jp.py, are run, never imported)
    missing = [n for n in names if n.startswith(site) and n.endswith(".py")
               and f"{n.rsplit('/', 1)[0]}/__pycache__/{Path(n).stem}.{tag}.pyc" not in names]
    assert not missing[:10]


def test_the_unpacked_archive_runs_tessera_as_its_user_without_network(image, tmp_path):
    """The layers as containerd would apply them, not the build's own tree: modes, links and owners
    survived packing."""
    root = unpack(image, tmp_path / "rootfs")
    proc = run_as_image(image, root, *image.config["config"]["Entrypoint"], "inventory", "--simulate", "a100-pcie-4")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("NVIDIA A100-PCIE-40GB") == 4
    imports = run_as_image(image, root, "python", "-c", "import " + ", ".join(recipe.CHECK_IMPORTS))
    assert imports.returncode == 0, imports.stderr
    assert not check.uncompiled(root / recipe.SITE_PACKAGES.lstrip("/"))
    check.check_root(root)


def test_the_build_check_fails_without_libstdcxx_where_help_still_passes(image, tmp_path):
    """The trap docs/deploy-probe.md fell into: with libstdc++ missing, `tessera --help` works and
    grpc cannot even be imported."""
    root = unpack(image, tmp_path / "rootfs")
    for lib in (root / "usr" / "lib" / "x86_64-linux-gnu").glob("libstdc++.so.6*"):
        lib.unlink()
    assert run_as_image(image, root, "tessera", "--help").returncode == 0
    with pytest.raises(BuildError, match=r"(?s)build check: imports failed.*libstdc\+\+\.so\.6: cannot open"):
        check.check_root(root)


def test_an_explicit_tag_names_the_same_image(image):
    (path, reference), _ = build("--tag", "image-test-b", "--print-path", "--print-ref")
    other = read_archive(Path(path), reference)
    assert reference == "tessera.local/tessera:image-test-b"
    assert other.index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == "image-test-b"
    assert other.manifest_digest == image.manifest_digest


def test_rebuilding_gives_the_same_image(image, rebuilt):
    assert rebuilt.manifest_digest == image.manifest_digest
    assert rebuilt.files == image.files


def test_building_leaves_the_machine_as_it_was(session, rebuilt):
    (_, first), *later = session.snapshots
    for when, snap in later:
        changed = {k: (sorted(set(snap[k]) - set(first[k])), sorted(set(first[k]) - set(snap[k])))
                   for k in first if first[k] != snap[k]}
        assert not changed, f"{when}, the machine changed (added, removed): {changed}"


@pytest.mark.skipif(shutil.which("skopeo") is None, reason="skopeo is not installed (apt-get install skopeo)")
def test_skopeo_reads_the_archive(image):
    """An independent OCI reader agrees on the manifest and the configuration. (Only `inspect`:
    `skopeo copy` keeps a blob cache in the machine's /var/lib/containers.)"""
    inspect = subprocess.run(["skopeo", "inspect", f"oci-archive:{image.path}"], capture_output=True, text=True,
                             timeout=120, check=True)
    assert json.loads(inspect.stdout)["Digest"] == image.manifest_digest
    config = subprocess.run(["skopeo", "inspect", "--config", f"oci-archive:{image.path}"], capture_output=True,
                            text=True, timeout=120, check=True)
    assert json.loads(config.stdout) == image.config
