"""Driver root discovery against a fake driver installation built under tmp_path."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema  # type: ignore[import-untyped]
import pytest

from driver.cdi import ContainerEdits, DeviceNode, SpecDevice, build_claim_spec
from driver.driverroot import DriverRootError, discover_driver_root
from tests.paths import CDI_SCHEMA

VERSION = "550.54.15"
SCHEMA = json.loads(CDI_SCHEMA.read_text())


def lib(root: Path, rel_dir: str, real: str, *links: str) -> None:
    d = root / rel_dir
    d.mkdir(parents=True, exist_ok=True)
    (d / real).write_bytes(b"\x7fELF")
    for link in links:
        (d / link).symlink_to(real)


def tool(root: Path, rel_dir: str, name: str) -> None:
    d = root / rel_dir
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text("#!/bin/sh\n")
    (d / name).chmod(0o755)


@pytest.fixture
def driver_root(tmp_path: Path) -> Path:
    root = tmp_path / "driver-root"
    libdir = "usr/lib/x86_64-linux-gnu"
    lib(root, libdir, f"libcuda.so.{VERSION}", "libcuda.so.1", "libcuda.so")
    lib(root, libdir, f"libnvidia-ml.so.{VERSION}", "libnvidia-ml.so.1")
    lib(root, libdir, f"libnvidia-ptxjitcompiler.so.{VERSION}", "libnvidia-ptxjitcompiler.so.1")
    lib(root, libdir, f"libnvidia-nvvm.so.{VERSION}", "libnvidia-nvvm.so.4")
    lib(root, libdir, f"libcudadebugger.so.{VERSION}", "libcudadebugger.so.1")
    lib(root, libdir, "libunrelated.so.1")
    lib(root, "usr/lib/i386-linux-gnu", f"libcuda.so.{VERSION}")  # 32-bit copy: never mounted
    for name in ("nvidia-smi", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "nvidia-persistenced"):
        tool(root, "usr/bin", name)
    fw = root / "lib" / "firmware" / "nvidia" / VERSION
    fw.mkdir(parents=True)
    (fw / "gsp_ga10x.bin").write_bytes(b"fw")
    (fw / "gsp_tu10x.bin").write_bytes(b"fw")
    return root


def test_libraries_are_found_under_every_name_pointing_at_the_real_file(driver_root):
    found = discover_driver_root(driver_root)
    by_target = {f.container_path: f.source for f in found.libraries}
    real = f"usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}"
    assert by_target["/usr/local/nvidia/lib64/libcuda.so"] == real
    assert by_target["/usr/local/nvidia/lib64/libcuda.so.1"] == real
    assert by_target[f"/usr/local/nvidia/lib64/libcuda.so.{VERSION}"] == real
    assert "/usr/local/nvidia/lib64/libnvidia-ml.so.1" in by_target
    assert "/usr/local/nvidia/lib64/libnvidia-nvvm.so.4" in by_target
    assert not any("unrelated" in p for p in by_target)
    assert not any("i386" in src for src in by_target.values())


def test_driver_version_comes_from_libcuda(driver_root):
    assert discover_driver_root(driver_root).driver_version == VERSION


def test_binaries_and_firmware_are_found(driver_root):
    found = discover_driver_root(driver_root)
    assert {b.container_path for b in found.binaries} == {
        "/usr/bin/nvidia-smi",
        "/usr/bin/nvidia-cuda-mps-control",
        "/usr/bin/nvidia-cuda-mps-server",
        "/usr/bin/nvidia-persistenced",
    }
    assert [f.container_path for f in found.firmware] == [
        f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin",
        f"/lib/firmware/nvidia/{VERSION}/gsp_tu10x.bin",
    ]
    assert found.binary("nvidia-cuda-mps-control") == driver_root / "usr/bin/nvidia-cuda-mps-control"
    assert found.binary("nvidia-imex") is None


def test_library_dirs_are_where_the_plugin_finds_the_libraries(driver_root):
    assert discover_driver_root(driver_root).library_dirs() == (driver_root / "usr/lib/x86_64-linux-gnu",)


def test_non_executable_binary_is_skipped(driver_root):
    (driver_root / "usr/bin/nvidia-smi").chmod(0o644)
    found = discover_driver_root(driver_root)
    assert "/usr/bin/nvidia-smi" not in {b.container_path for b in found.binaries}


def test_mounts_use_host_paths_read_only(driver_root):
    found = discover_driver_root(driver_root, host_root="/run/nvidia/driver")
    edits = found.container_edits()
    libcuda = next(m for m in edits.mounts if m.container_path == "/usr/local/nvidia/lib64/libcuda.so.1")
    assert libcuda.host_path == f"/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}"
    assert libcuda.options == ("ro", "nosuid", "nodev", "bind")
    assert all(m.host_path.startswith("/run/nvidia/driver/") for m in edits.mounts)
    assert edits.env == ("LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64",)


def test_host_root_defaults_to_the_root_itself(driver_root):
    found = discover_driver_root(driver_root)
    assert all(m.host_path.startswith(str(driver_root)) for m in found.container_edits().mounts)


def test_spec_with_driver_mounts_is_valid_cdi(driver_root):
    edits = discover_driver_root(driver_root, host_root="/").container_edits()
    spec = build_claim_spec(
        "abc", [SpecDevice("abc-gpu-0", ContainerEdits(device_nodes=(DeviceNode("/dev/nvidia0"),)))], edits
    )
    jsonschema.Draft202012Validator(SCHEMA).validate(spec)
    assert spec["cdiVersion"] == "0.3.0"


def test_absolute_symlinks_resolve_inside_the_root(tmp_path):
    root = tmp_path / "root"
    lib(root, "usr/lib64", f"libcuda.so.{VERSION}")
    (root / "usr/lib64/libcuda.so.1").symlink_to(f"/usr/lib64/libcuda.so.{VERSION}")
    found = discover_driver_root(root)
    assert {f.source for f in found.libraries} == {f"usr/lib64/libcuda.so.{VERSION}"}


def test_dangling_and_escaping_symlinks_are_skipped(tmp_path):
    root = tmp_path / "root"
    lib(root, "usr/lib64", f"libcuda.so.{VERSION}")
    (root / "usr/lib64/libcuda.so.2").symlink_to("missing.so")
    outside = tmp_path / "outside.so"
    outside.write_bytes(b"x")
    (root / "usr/lib64/libcuda.so.3").symlink_to(os.path.relpath(outside, root / "usr/lib64"))
    found = discover_driver_root(root)
    assert [f.container_path for f in found.libraries] == [f"/usr/local/nvidia/lib64/libcuda.so.{VERSION}"]


def test_missing_root_is_an_error(tmp_path):
    with pytest.raises(DriverRootError, match="no such directory"):
        discover_driver_root(tmp_path / "nope")


def test_root_without_libcuda_is_an_error(tmp_path):
    lib(tmp_path, "usr/lib64", f"libnvidia-ml.so.{VERSION}")
    with pytest.raises(DriverRootError, match=r"no libcuda\.so found"):
        discover_driver_root(tmp_path)
