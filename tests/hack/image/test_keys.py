"""hack/image/keys.py: each stage's cache key covers exactly what the stage is made from."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from hack.image import keys, recipe
from tests.paths import REPO


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A minimal copy of what the application layer is built from."""
    for name in recipe.SOURCE_FILES:
        shutil.copy(REPO / name, tmp_path / name)
    for top in recipe.SOURCE_DIRS:
        (tmp_path / top).mkdir()
        (tmp_path / top / "__init__.py").write_text(f"# {top}\n")
    return tmp_path


def app_key(root: Path, deps: str = "d" * 64, epoch: int = 1, here: Path | None = None) -> str:
    return keys.app_key(keys.read_app_inputs(deps, epoch, root, here or keys.HERE))


def test_app_key_is_stable_for_the_same_tree(checkout):
    assert app_key(checkout) == app_key(checkout)


def test_app_key_changes_with_a_source_file(checkout):
    before = app_key(checkout)
    (checkout / "driver" / "__init__.py").write_text("# changed\n")
    assert app_key(checkout) != before


def test_app_key_changes_with_a_new_source_file(checkout):
    before = app_key(checkout)
    (checkout / "controller" / "new.py").write_text("")
    assert app_key(checkout) != before


def test_app_key_ignores_byte_code_and_packaging_leftovers(checkout):
    before = app_key(checkout)
    (checkout / "driver" / "__pycache__").mkdir()
    (checkout / "driver" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (checkout / "driver" / "stray.pyc").write_bytes(b"\0")
    (checkout / "tessera.egg-info").mkdir()
    (checkout / "driver" / "tessera.egg-info").mkdir()
    (checkout / "driver" / "tessera.egg-info" / "PKG-INFO").write_text("x")
    assert app_key(checkout) == before


def test_app_key_covers_pyproject_and_readme(checkout):
    for name in recipe.SOURCE_FILES:
        before = app_key(checkout)
        (checkout / name).write_text((checkout / name).read_text() + "\n")
        assert app_key(checkout) != before, name


def test_files_outside_the_sources_do_not_change_the_app_key(checkout):
    before = app_key(checkout)
    (checkout / "docs").mkdir()
    (checkout / "docs" / "x.md").write_text("x")
    (checkout / "tests").mkdir()
    (checkout / "tests" / "test_x.py").write_text("x")
    assert app_key(checkout) == before


def test_app_key_changes_with_the_build_code_the_dependencies_and_the_epoch(checkout, tmp_path):
    here = tmp_path / "build-code"
    here.mkdir()
    (here / "build.py").write_text("a")
    before = app_key(checkout, here=here)
    (here / "build.py").write_text("b")
    assert app_key(checkout, here=here) != before
    assert app_key(checkout, deps="e" * 64, here=here) != app_key(checkout, here=here)
    assert app_key(checkout, epoch=2, here=here) != app_key(checkout, here=here)


def test_a_missing_source_directory_is_named(checkout):
    shutil.rmtree(checkout / "proto")
    with pytest.raises(FileNotFoundError, match="proto is missing"):
        keys.source_files(checkout)


def test_the_keys_of_the_base_stages_do_not_depend_on_the_sources():
    # rootfs_key takes no argument at all: only recipe.py's Debian data goes into it
    assert keys.rootfs_key() == keys.rootfs_key()
    wheels = keys.wheels_key(b"lock", b"tools")
    assert keys.deps_key(keys.rootfs_key(), wheels, "code") == keys.deps_key(keys.rootfs_key(), wheels, "code")


def test_rootfs_key_changes_with_the_package_list(monkeypatch):
    before = keys.rootfs_key()
    monkeypatch.setattr(recipe, "PACKAGES", (*recipe.PACKAGES, "curl"))
    assert keys.rootfs_key() != before


def test_rootfs_key_changes_with_the_suite_and_the_epoch(monkeypatch):
    before = keys.rootfs_key()
    monkeypatch.setattr(recipe, "SUITE", "trixie")
    assert keys.rootfs_key() != before
    monkeypatch.undo()
    monkeypatch.setattr(recipe, "BASE_EPOCH", recipe.BASE_EPOCH + 1)
    assert keys.rootfs_key() != before


def test_wheels_key_changes_with_either_lock():
    assert keys.wheels_key(b"a", b"t") != keys.wheels_key(b"b", b"t")
    assert keys.wheels_key(b"a", b"t") != keys.wheels_key(b"a", b"u")


def test_deps_key_changes_with_the_base_the_wheels_and_the_code():
    base = keys.deps_key("r", "w", "c")
    assert len({base, keys.deps_key("r2", "w", "c"), keys.deps_key("r", "w2", "c"), keys.deps_key("r", "w", "c2")}) == 4


def test_parts_are_length_prefixed():
    # moving a byte from a file's name into its content must not give the same key
    assert keys._digest([("ab", b"c")]) != keys._digest([("a", b"bc")])


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "GIT_AUTHOR_DATE": "@1700000000 +0000",
                        "GIT_COMMITTER_DATE": "@1700000000 +0000", "PATH": "/usr/bin:/bin"})


def test_source_epoch_is_the_last_commit_touching_the_sources(checkout):
    _git(checkout, "init", "-q")
    _git(checkout, "add", ".")
    _git(checkout, "commit", "-q", "-m", "sources")
    assert keys.source_epoch(checkout) == 1700000000


def test_source_epoch_outside_git_is_the_base_epoch(checkout):
    assert keys.source_epoch(checkout) == recipe.BASE_EPOCH
