"""The Dockerfile (how users with Docker build the image) and `make image` give the same layout:
entrypoint, command, user, environment, labels, the virtual environment's path, the Python and
Debian release, and the files the image is built from."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from hack.image import recipe
from tests.paths import REPO


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        word, _, rest = pending.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    return out


def pairs(arguments: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in shlex.split(arguments))


@pytest.fixture(scope="module")
def stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's build stages, each a list of instructions starting at its FROM."""
    out: list[list[tuple[str, str]]] = []
    for word, rest in instructions((REPO / "Dockerfile").read_text()):
        if word == "FROM":
            out.append([])
        if out:
            out[-1].append((word, rest))
    return out


def final(stages, word):
    return [rest for w, rest in stages[-1] if w == word]


def test_entrypoint_and_command_agree(stages):
    assert json.loads(final(stages, "ENTRYPOINT")[-1]) == list(recipe.ENTRYPOINT)
    assert json.loads(final(stages, "CMD")[-1]) == list(recipe.CMD)


def test_user_agrees(stages):
    assert final(stages, "USER")[-1] == recipe.USER


def test_environment_agrees(stages):
    docker = {k: v for rest in final(stages, "ENV") for k, v in pairs(rest).items()}
    ours = dict(item.split("=", 1) for item in recipe.image_config("x").env)
    assert docker.pop("PATH") == f"{recipe.VENV}/bin:$PATH"
    assert ours["PATH"].startswith(f"{recipe.VENV}/bin:")
    assert docker.items() <= ours.items()


def test_labels_agree(stages):
    docker = {k: v for rest in final(stages, "LABEL") for k, v in pairs(rest).items()}
    assert docker.items() <= recipe.image_config("x").labels.items()


def test_the_virtual_environment_lives_at_the_same_path(stages):
    (copy,) = [rest for rest in final(stages, "COPY") if "--from=" in rest]
    assert copy.split()[1:] == [recipe.VENV, recipe.VENV]
    runs = " ".join(rest for w, rest in stages[0] if w == "RUN")
    assert f"-m venv {recipe.VENV}" in runs


def test_python_minor_and_debian_release_agree():
    (arg,) = [rest for w, rest in instructions((REPO / "Dockerfile").read_text()) if w == "ARG"]
    m = re.fullmatch(r"PYTHON_IMAGE=python:(\d+\.\d+)-slim-(\w+)", arg)
    assert m is not None, arg
    assert (m[1], m[2]) == (recipe.PYTHON_VERSION, recipe.SUITE)


def test_both_build_from_the_same_files(stages):
    copied = set()
    for word, rest in stages[0]:
        if word == "COPY":
            copied |= {src.rstrip("/") for src in rest.split()[:-1]}
    assert copied == {*recipe.SOURCE_FILES, *recipe.SOURCE_DIRS}


def test_the_project_packages_are_the_ones_the_build_compiles_and_checks():
    import tomllib

    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {p.rstrip("*") for p in include} == set(recipe.APP_PACKAGES)
