"""hack/image/recipe.py: the Debian base and the wheel platform, as the build hands them to tools."""

from __future__ import annotations

from pathlib import Path

from hack.image import recipe


def test_wheel_platforms_cover_every_older_glibc_newest_first():
    tags = recipe.wheel_platforms((2, 36), "x86_64")
    assert tags[0] == "manylinux_2_36_x86_64"
    assert "manylinux_2_17_x86_64" in tags and "manylinux_2_5_x86_64" in tags
    assert tags.index("manylinux_2_28_x86_64") < tags.index("manylinux_2_27_x86_64")
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert not any(t.startswith("manylinux_2_37") or t == "linux_x86_64" for t in tags)


def test_legacy_aliases_need_their_glibc():
    assert "manylinux2014_x86_64" not in recipe.wheel_platforms((2, 12), "x86_64")
    assert "manylinux2010_x86_64" in recipe.wheel_platforms((2, 12), "x86_64")


def test_pip_target_args_select_the_images_interpreter_not_pips():
    args = recipe.pip_target_args(["manylinux_2_36_x86_64"])
    assert args == ["--only-binary=:all:", "--implementation", "cp", "--python-version", "3.11", "--abi", "cp311",
                    "--platform", "manylinux_2_36_x86_64"]


def test_mmdebstrap_builds_an_essential_root_without_docs_and_with_libstdcxx():
    args = recipe.mmdebstrap_args(Path("/x/tree"))
    assert args[:4] == ["mmdebstrap", "--mode=root", "--variant=essential", "--format=directory"]
    include = next(a for a in args if a.startswith("--include="))
    assert {"python3", "libstdc++6", "ca-certificates"} <= set(include.removeprefix("--include=").split(","))
    assert "--dpkgopt=path-exclude=/usr/share/man/*" in args
    assert "--dpkgopt=path-exclude=/usr/share/locale/*" in args
    assert "--dpkgopt=path-include=/usr/share/doc/*/copyright" in args
    assert args.index("bookworm") == args.index("/x/tree") - 1
    assert any("bookworm-security" in a for a in args)


def test_the_image_environment_runs_the_venv_first():
    env = dict(e.split("=", 1) for e in recipe.image_config("1.0").env)
    assert env["PATH"].split(":")[0] == "/opt/tessera/bin"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"


def test_by_default_pip_is_offered_every_platform_the_locked_wheels_carry():
    # grpcio ships manylinux_2_17, cel-expr-python manylinux_2_27: pip takes --platform literally
    args = recipe.pip_target_args()
    offered = {args[i + 1] for i, a in enumerate(args) if a == "--platform"}
    wanted = {"manylinux_2_17_x86_64", "manylinux_2_27_x86_64", "manylinux2014_x86_64", "manylinux_2_36_x86_64"}
    assert wanted <= offered
