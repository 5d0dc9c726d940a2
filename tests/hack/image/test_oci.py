"""hack/image/oci.py: reproducible layers, the image configuration, manifest, index and archive."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tarfile
from pathlib import Path

import pytest

from hack.image import oci, recipe

EPOCH = 1_700_000_000


def make_tree(root: Path, mtime: float) -> Path:
    (root / "opt" / "tessera" / "bin").mkdir(parents=True)
    (root / "opt" / "tessera" / "bin" / "tessera").write_text("#!/opt/tessera/bin/python\n")
    (root / "opt" / "tessera" / "bin" / "tessera").chmod(0o755)
    (root / "opt" / "tessera" / "bin" / "python").symlink_to("/usr/bin/python3")
    (root / "opt" / "tessera" / "data").write_text("x" * 5000)
    os.link(root / "opt" / "tessera" / "data", root / "opt" / "tessera" / "data-link")
    for path in sorted(root.rglob("*"), reverse=True):
        os.utime(path, (mtime, mtime), follow_symlinks=False)
    return root


def members(layer: oci.Layer) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(layer.blob.path, "r:gz") as tar:
        return {m.name: m for m in tar.getmembers()}


def everything(rel: str, st: os.stat_result) -> bool:
    return True


def test_a_layer_is_the_same_bytes_whatever_the_build_time(tmp_path):
    a = oci.write_layer(make_tree(tmp_path / "a", EPOCH + 100), tmp_path / "a.tgz", EPOCH, everything, "x")
    b = oci.write_layer(make_tree(tmp_path / "b", EPOCH + 999_999), tmp_path / "b.tgz", EPOCH, everything, "x")
    assert a.blob.path.read_bytes() == b.blob.path.read_bytes()
    assert (a.blob.digest, a.diff_id) == (b.blob.digest, b.diff_id)


def test_digests_and_size_describe_the_written_blob(tmp_path):
    layer = oci.write_layer(make_tree(tmp_path / "t", EPOCH), tmp_path / "l.tgz", EPOCH, everything, "x")
    data = layer.blob.path.read_bytes()
    assert layer.blob.digest == "sha256:" + hashlib.sha256(data).hexdigest()
    assert layer.blob.size == len(data)
    assert layer.diff_id == "sha256:" + hashlib.sha256(gzip.decompress(data)).hexdigest()


def test_the_gzip_header_carries_no_name_and_no_time(tmp_path):
    layer = oci.write_layer(make_tree(tmp_path / "t", EPOCH), tmp_path / "l.tgz", EPOCH, everything, "x")
    header = layer.blob.path.read_bytes()[:10]
    assert header[3] & 0x08 == 0  # FNAME flag
    assert header[4:8] == b"\0\0\0\0"  # MTIME


def test_times_after_the_epoch_are_clamped_and_earlier_ones_kept(tmp_path):
    tree = make_tree(tmp_path / "t", EPOCH + 50)
    os.utime(tree / "opt" / "tessera" / "data", (EPOCH - 10, EPOCH - 10))
    got = members(oci.write_layer(tree, tmp_path / "l.tgz", EPOCH, everything, "x"))
    assert got["opt/tessera/bin/tessera"].mtime == EPOCH
    assert got["opt/tessera/data"].mtime == EPOCH - 10


def test_entries_are_sorted_parents_first_with_numeric_owners_only(tmp_path):
    got = members(oci.write_layer(make_tree(tmp_path / "t", EPOCH), tmp_path / "l.tgz", EPOCH, everything, "x"))
    names = list(got)
    assert names == ["opt", "opt/tessera", "opt/tessera/bin", "opt/tessera/bin/python", "opt/tessera/bin/tessera",
                     "opt/tessera/data", "opt/tessera/data-link"]
    assert all(m.uname == "" and m.gname == "" for m in got.values())
    assert got["opt/tessera/bin/tessera"].mode == 0o755


def test_symlinks_and_hard_links_are_kept_as_links(tmp_path):
    got = members(oci.write_layer(make_tree(tmp_path / "t", EPOCH), tmp_path / "l.tgz", EPOCH, everything, "x"))
    assert got["opt/tessera/bin/python"].issym() and got["opt/tessera/bin/python"].linkname == "/usr/bin/python3"
    assert got["opt/tessera/data-link"].islnk() and got["opt/tessera/data-link"].linkname == "opt/tessera/data"


def test_base_selector_empties_mount_points_and_drops_the_hosts_files(tmp_path):
    root = tmp_path / "t"
    for d in ("dev/pts", "proc/x", "sys/y", "tmp/z", "etc", "run/lock", "usr/bin", "var/lib/apt/lists/partial",
              "var/cache/apt/archives", "var/lib/dpkg", "usr/share/info"):
        (root / d).mkdir(parents=True)
    for f in ("etc/hostname", "etc/resolv.conf", "etc/passwd", "usr/bin/python3", "usr/share/info/dir"):
        (root / f).write_text("x")
    got = members(oci.write_layer(root, tmp_path / "l.tgz", EPOCH, oci.base_selector, "x"))
    assert {"dev", "proc", "sys", "tmp", "run/lock", "etc/passwd", "usr/bin/python3", "var/lib/dpkg"} <= set(got)
    assert not {"dev/pts", "proc/x", "sys/y", "tmp/z", "etc/hostname", "etc/resolv.conf", "var/lib/apt",
                "var/lib/apt/lists/partial", "var/cache/apt", "usr/share/info/dir"} & set(got)


def test_upper_selector_keeps_the_allowed_path_and_its_parents_and_skips_tmp(tmp_path):
    tree = make_tree(tmp_path / "t", EPOCH)
    (tree / "tmp").mkdir()
    got = members(oci.write_layer(tree, tmp_path / "l.tgz", EPOCH, oci.upper_selector("opt/tessera"), "x"))
    assert "opt" in got and "opt/tessera/bin/tessera" in got and "tmp" not in got


def test_upper_selector_refuses_a_change_elsewhere(tmp_path):
    tree = make_tree(tmp_path / "t", EPOCH)
    (tree / "etc").mkdir()
    (tree / "etc" / "passwd").write_text("x")
    with pytest.raises(oci.LayerError, match=r"/etc: the build changed a file outside /opt/tessera"):
        oci.write_layer(tree, tmp_path / "l.tgz", EPOCH, oci.upper_selector("opt/tessera"), "x")


def test_a_whiteout_is_refused(tmp_path):
    tree = make_tree(tmp_path / "t", EPOCH)
    os.mknod(tree / "opt" / "tessera" / "gone", 0o600 | 0o020000, os.makedev(0, 0))
    with pytest.raises(oci.LayerError, match="deleted a file of the layer below"):
        oci.write_layer(tree, tmp_path / "l.tgz", EPOCH, oci.upper_selector("opt/tessera"), "x")


def test_a_device_is_refused(tmp_path):
    tree = make_tree(tmp_path / "t", EPOCH)
    os.mknod(tree / "opt" / "null", 0o666 | 0o020000, os.makedev(1, 3))
    with pytest.raises(oci.LayerError, match="/opt/null: a device"):
        oci.write_layer(tree, tmp_path / "l.tgz", EPOCH, everything, "x")


def test_an_opaque_directory_is_refused(tmp_path):
    tree = make_tree(tmp_path / "t", EPOCH)
    os.setxattr(tree / "opt" / "tessera" / "bin", "trusted.overlay.opaque", b"y")
    with pytest.raises(oci.LayerError, match="opaque directory"):
        oci.write_layer(tree, tmp_path / "l.tgz", EPOCH, everything, "x")


def layer_stub(n: int) -> oci.Layer:
    return oci.Layer(oci.Blob(f"sha256:{n:064x}", 100 + n, Path(f"/l{n}")), f"sha256:{n + 10:064x}", f"step {n}")


def test_config_json_is_the_dockerfile_runtime_config():
    cfg = json.loads(oci.config_json(recipe.image_config("0.1.0"), [layer_stub(1), layer_stub(2)], EPOCH))
    assert cfg["architecture"] == "amd64" and cfg["os"] == "linux"
    assert cfg["created"] == "2023-11-14T22:13:20Z"
    assert cfg["config"]["Entrypoint"] == ["tessera"]
    assert cfg["config"]["Cmd"] == ["--help"]
    assert cfg["config"]["User"] == "65532:65532"
    assert "PATH=/opt/tessera/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" in cfg["config"]["Env"]
    assert {"PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"} <= set(cfg["config"]["Env"])
    assert cfg["config"]["Labels"]["org.opencontainers.image.title"] == "tessera"
    assert cfg["config"]["Labels"]["org.opencontainers.image.version"] == "0.1.0"
    assert cfg["rootfs"] == {"type": "layers", "diff_ids": [layer_stub(1).diff_id, layer_stub(2).diff_id]}
    assert [h["created_by"] for h in cfg["history"]] == ["step 1", "step 2"]


def test_config_json_is_canonical():
    one = oci.config_json(recipe.image_config("0.1.0"), [layer_stub(1)], EPOCH)
    assert one == oci.config_json(recipe.image_config("0.1.0"), [layer_stub(1)], EPOCH)
    assert one == json.dumps(json.loads(one), sort_keys=True, separators=(",", ":")).encode()


def test_manifest_points_at_the_config_and_layers_in_order():
    config = b'{"x":1}'
    manifest = json.loads(oci.manifest_json(config, [layer_stub(1), layer_stub(2)]))
    assert manifest["config"] == {"mediaType": oci.MEDIA_CONFIG, "size": len(config),
                                  "digest": "sha256:" + hashlib.sha256(config).hexdigest()}
    assert [la["digest"] for la in manifest["layers"]] == [layer_stub(1).blob.digest, layer_stub(2).blob.digest]
    assert {la["mediaType"] for la in manifest["layers"]} == {"application/vnd.oci.image.layer.v1.tar+gzip"}


def test_index_names_the_image_for_containerd_and_for_oci():
    index = json.loads(oci.index_json(b"{}", "tessera.local/tessera:0.1.0-dev"))
    (entry,) = index["manifests"]
    assert entry["annotations"] == {"io.containerd.image.name": "tessera.local/tessera:0.1.0-dev",
                                    "org.opencontainers.image.ref.name": "0.1.0-dev"}
    assert entry["platform"] == {"architecture": "amd64", "os": "linux"}


def test_the_archive_is_an_image_layout_whose_blobs_match_their_digests(tmp_path):
    layer = oci.write_layer(make_tree(tmp_path / "t", EPOCH), tmp_path / "l.tgz", EPOCH, everything, "x")
    config = oci.config_json(recipe.image_config("0.1.0"), [layer], EPOCH)
    digest = oci.write_archive(tmp_path / "a.tar", [layer], config, "tessera.local/tessera:t1")
    with tarfile.open(tmp_path / "a.tar") as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(files["index.json"])
    assert index["manifests"][0]["digest"] == digest
    manifest = json.loads(files["blobs/sha256/" + digest.removeprefix("sha256:")])
    assert files["blobs/sha256/" + manifest["config"]["digest"].removeprefix("sha256:")] == config


def test_two_tags_of_one_image_share_the_manifest_and_two_writes_are_identical(tmp_path):
    layer = oci.write_layer(make_tree(tmp_path / "t", EPOCH), tmp_path / "l.tgz", EPOCH, everything, "x")
    config = oci.config_json(recipe.image_config("0.1.0"), [layer], EPOCH)
    a = oci.write_archive(tmp_path / "a.tar", [layer], config, "tessera.local/tessera:a")
    b = oci.write_archive(tmp_path / "b.tar", [layer], config, "tessera.local/tessera:b")
    again = oci.write_archive(tmp_path / "a2.tar", [layer], config, "tessera.local/tessera:a")
    assert a == b == again
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "a2.tar").read_bytes()
    assert (tmp_path / "a.tar").read_bytes() != (tmp_path / "b.tar").read_bytes()


def test_layer_descriptions_round_trip_relative_to_their_directory(tmp_path):
    layer = layer_stub(3)
    described = {**layer.to_json(), "path": "layer.tar.gz"}
    back = oci.Layer.from_json(json.loads(json.dumps(described)), tmp_path)
    assert back.blob.path == tmp_path / "layer.tar.gz" and back.diff_id == layer.diff_id
    assert oci.Layer.from_json(layer.to_json(), tmp_path).blob.path == Path("/l3")


def test_overlay_bookkeeping_on_a_copied_up_directory_is_not_a_deletion(tmp_path):
    # overlayfs marks directories it copied up (origin, impure); only `opaque` hides the layer below
    tree = make_tree(tmp_path / "t", EPOCH)
    os.setxattr(tree / "opt", "trusted.overlay.origin", b"\0\xfb")
    os.setxattr(tree / "opt" / "tessera", "trusted.overlay.impure", b"y")
    got = members(oci.write_layer(tree, tmp_path / "l.tgz", EPOCH, oci.upper_selector("opt/tessera"), "x"))
    assert "opt" in got and "opt/tessera/bin/tessera" in got
