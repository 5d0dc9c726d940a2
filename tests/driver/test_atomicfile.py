"""driver.atomicfile: the temp file name, the fsyncs, the mode."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from driver.atomicfile import write_atomic


def test_temp_file_name_is_ignored_by_cdi_loaders(tmp_path, monkeypatch):
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append(Path(src).name)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    write_atomic(tmp_path / "x.json", b"{}", 0o644)
    assert seen and not seen[0].endswith((".json", ".yaml")) and seen[0].startswith(".")


@pytest.mark.parametrize(("durable", "fsyncs"), [(True, 2), (False, 0)])
def test_atomic_write_fsyncs_file_and_directory_only_when_durable(tmp_path, monkeypatch, durable, fsyncs):
    calls = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real_fsync(fd)))
    write_atomic(tmp_path / "x.json", b"{}", 0o600, durable=durable)
    assert len(calls) == fsyncs
    assert (tmp_path / "x.json").read_bytes() == b"{}"
    assert (tmp_path / "x.json").stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]
