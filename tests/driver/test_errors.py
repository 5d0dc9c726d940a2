"""The error family: every class tessera raises on purpose has its own `reason`, and the tree drawn in
driver/errors.py names every one of them."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import driver.errors
from driver.errors import DeviceError, InvalidInputError, NodeStateError, TesseraError

PACKAGES = ("driver", "kubeletplugin", "controller", "tessera")


def _all_subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_all_subclasses(sub)]
    return out


@pytest.fixture(scope="module")
def family() -> list[type[TesseraError]]:
    for package in PACKAGES:
        module = importlib.import_module(package)
        for info in pkgutil.walk_packages(module.__path__, f"{package}."):
            if info.name.endswith("__main__"):
                continue
            try:
                importlib.import_module(info.name)
            except ImportError:  # an optional engine that is not installed
                continue
    return [c for c in _all_subclasses(TesseraError) if c.__module__.split(".")[0] in PACKAGES]


def test_every_error_class_has_a_reason_of_its_own(family: list[type[TesseraError]]) -> None:
    reasons: dict[str, str] = {"error": "TesseraError"}
    for cls in family:
        assert cls.reason not in reasons, f"{cls.__qualname__} and {reasons.get(cls.reason)} share {cls.reason!r}"
        reasons[cls.reason] = cls.__qualname__


def test_the_tree_in_the_docstring_names_every_class(family: list[type[TesseraError]]) -> None:
    doc = driver.errors.__doc__ or ""
    missing = sorted(cls.__qualname__ for cls in family if cls.__qualname__ not in doc)
    assert not missing, f"add to the tree in driver/errors.py: {missing}"


def test_a_class_without_its_own_reason_gets_one_from_its_name() -> None:
    class GpuMeltedError(DeviceError):
        pass

    assert GpuMeltedError.reason == "gpu_melted"
    assert (InvalidInputError.reason, DeviceError.reason, NodeStateError.reason) == ("invalid_input", "device",
                                                                                     "node_state")


def test_the_cli_has_no_input_error_of_its_own() -> None:
    import tessera.cmd_check

    assert not hasattr(tessera.cmd_check, "InputError")
