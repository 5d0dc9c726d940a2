"""hack/image/*.lock: the image's pinned wheels, and whether they still fit pyproject.toml."""

from __future__ import annotations

import hashlib

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from hack.image import keys, lock


def pins(path) -> dict[str, lock.Pin]:
    return {p.name: p for p in lock.parse(path.read_text(), path.name)}


def test_the_run_time_lock_satisfies_every_pyproject_dependency():
    runtime, _ = lock.project_requirements()
    pinned = pins(keys.LOCK)
    stale = []
    for text in runtime:
        req = Requirement(text)
        pin = pinned.get(lock.normalise(req.name))
        if pin is None or Version(pin.version) not in req.specifier:
            stale.append(f"{text} (locked: {pin.version if pin else 'absent'})")
    assert not stale, f"hack/image/requirements.lock is stale for {stale}: run `python -m hack.image.lock`"


def test_the_build_tools_lock_has_pip_and_satisfies_the_build_system():
    _, build = lock.project_requirements()
    pinned = pins(keys.BUILD_TOOLS_LOCK)
    assert "pip" in pinned
    for text in build:
        req = Requirement(text)
        assert Version(pinned[lock.normalise(req.name)].version) in req.specifier, text


def test_neither_lock_pins_a_name_twice():
    for path in (keys.LOCK, keys.BUILD_TOOLS_LOCK):
        names = [p.name for p in lock.parse(path.read_text())]
        assert len(names) == len(set(names)), path


def test_pip_and_setuptools_are_not_installed_into_the_image():
    assert not {"pip", "setuptools"} & set(pins(keys.LOCK))


def test_a_malformed_line_names_the_file_the_line_and_the_fix():
    with pytest.raises(lock.LockError, match=r"requirements\.lock:2: 'grpcio>=1' is not") as err:
        lock.parse("# c\ngrpcio>=1\n", "requirements.lock")
    assert "python -m hack.image.lock" in str(err.value)


def test_a_line_without_a_hash_is_refused():
    with pytest.raises(lock.LockError, match="--hash=sha256"):
        lock.parse("grpcio==1.85.3\n")


def test_render_then_parse_round_trips_sorted():
    original = [lock.Pin("b-pkg", "2", "b" * 64), lock.Pin("a", "1.0", "a" * 64)]
    text = lock.render(original, "what")
    assert text.startswith("# what\n")
    assert lock.parse(text) == sorted(original, key=lambda p: p.name)


@pytest.mark.parametrize(("filename", "name", "version"), [
    ("grpcio-1.85.3-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", "grpcio", "1.85.3"),
    ("google_re2-1.1.20251105-1-cp311-cp311-manylinux_2_28_x86_64.whl", "google-re2", "1.1.20251105"),
    ("PyYAML-6.0.4-cp311-cp311-manylinux2014_x86_64.whl", "pyyaml", "6.0.4"),
    ("kubernetes-37.0.2-py2.py3-none-any.whl", "kubernetes", "37.0.2"),
])
def test_pin_of_wheel_reads_name_and_version_and_hashes_the_file(tmp_path, filename, name, version):
    path = tmp_path / filename
    path.write_bytes(b"wheel")
    pin = lock.pin_of_wheel(path)
    assert (pin.name, pin.version) == (name, version)
    assert pin.sha256 == hashlib.sha256(b"wheel").hexdigest()


def test_a_source_archive_is_not_a_wheel(tmp_path):
    path = tmp_path / "grpcio-1.85.3.tar.gz"
    path.write_bytes(b"")
    with pytest.raises(lock.LockError, match="installs wheels only"):
        lock.pin_of_wheel(path)
