"""hack/image/build.py and build.sh: the stage cache, the command line and its errors (nothing here
runs mmdebstrap or pip; tests/hack/image/test_image.py builds the real image)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from hack.image import build, check, chroot, recipe
from tests.paths import REPO


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TESSERA_CACHE", str(tmp_path))
    return tmp_path / "image"


def test_a_stage_is_built_once_and_then_served_from_the_cache(cache):
    calls = []

    def make(out: Path) -> None:
        calls.append(out)
        (out / "result").write_text("x")

    first = build.ensure("wheels", "k1", make, rebuild=False)
    second = build.ensure("wheels", "k1", make, rebuild=False)
    assert first == second == cache / "wheels" / "k1"
    assert len(calls) == 1 and (first / "result").read_text() == "x"


def test_rebuild_builds_again_in_place(cache):
    calls = []

    def make(out: Path) -> None:
        calls.append(out)
        (out / "n").write_text(str(len(calls)))

    build.ensure("deps", "k", make, rebuild=False)
    again = build.ensure("deps", "k", make, rebuild=True)
    assert len(calls) == 2 and (again / "n").read_text() == "2"
    assert sorted(p.name for p in (cache / "deps").iterdir()) == ["k", "k.lock"]


def test_a_failed_stage_leaves_no_finished_directory_and_no_scratch(cache):
    def fail(out: Path) -> None:
        (out / "half").write_text("x")
        raise chroot.BuildError("boom")

    with pytest.raises(chroot.BuildError, match="boom"):
        build.ensure("rootfs", "k", fail, rebuild=False)
    assert sorted(p.name for p in (cache / "rootfs").iterdir()) == ["k.lock"]


def test_old_application_stages_are_pruned_least_recently_used_first(cache):
    apps = cache / "app"
    for i in range(build.KEEP_APPS + 3):
        d = apps / f"a{i}"
        d.mkdir(parents=True)
        (d / ".done").write_text("")
        (d / ".used").touch()
        os.utime(d / ".used", (1000 + i, 1000 + i))
    (apps / "building").mkdir()  # no .done: a build in progress is never pruned
    build.prune_apps(keep="a0")
    left = sorted(p.name for p in apps.iterdir() if p.is_dir())
    newest = [f"a{i}" for i in range(build.KEEP_APPS + 3)][-(build.KEEP_APPS - 1):]
    assert left == sorted(["a0", "building", *newest])


def test_the_plan_names_the_image_after_the_chart_and_the_key():
    plan = build.make_plan(None)
    assert plan.tag == f"{recipe.chart_app_version()}-{plan.app[:12]}"
    assert plan.reference == f"tessera.local/tessera:{plan.tag}"
    assert build.make_plan("upgrade-b").reference == "tessera.local/tessera:upgrade-b"
    assert build.make_plan("upgrade-b").app == plan.app  # the tag names the image; it is not part of it


def test_a_bad_tag_is_refused_before_anything_is_built(cache, capsys):
    assert build.main(["--tag", "a:b"]) == 1
    assert "--tag 'a:b'" in capsys.readouterr().err
    assert not cache.exists()


def test_running_the_build_outside_its_mount_namespace_is_refused(cache, capsys, monkeypatch):
    monkeypatch.delenv(chroot.PRIVATE_ENV, raising=False)
    assert build.main([]) == 1
    err = capsys.readouterr().err
    assert "private mount namespace" in err and "hack/image/build.sh" in err


def test_an_unknown_rebuild_stage_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        build.main(["--rebuild", "everything"])
    assert exc.value.code == 2
    assert "--rebuild: invalid choice" in capsys.readouterr().err


def test_build_sh_refuses_to_run_without_root(tmp_path):
    # The unprivileged user must be able to reach the script: a checkout (or pytest's tmp_path) under a
    # 0700 directory would stop it at "Permission denied" before the check this test is about.
    reachable = Path(tempfile.mkdtemp(prefix="tessera-image-sh-", dir="/tmp"))
    try:
        reachable.chmod(0o755)
        script = reachable / "hack" / "image" / "build.sh"
        script.parent.mkdir(parents=True)
        script.parent.parent.chmod(0o755)
        script.parent.chmod(0o755)
        shutil.copy(REPO / "hack" / "image" / "build.sh", script)
        script.chmod(0o755)
        cmd = ["bash", str(script)]
        if os.geteuid() == 0:
            if shutil.which("setpriv") is None:
                pytest.skip("setpriv is needed to drop root")
            cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, cwd="/",
                              env={"PATH": os.environ["PATH"], "HOME": str(reachable),
                                   "TESSERA_CACHE": str(reachable / "cache")})
    finally:
        shutil.rmtree(reachable, ignore_errors=True)
    assert proc.returncode == 1, proc.stderr
    assert "needs root" in proc.stderr


def test_uncompiled_lists_sources_without_byte_code(tmp_path):
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("")
    (tmp_path / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"")
    (tmp_path / "pkg" / "b.py").write_text("")
    (tmp_path / "pkg" / "__pycache__" / "b.cpython-312.pyc").write_bytes(b"")
    assert check.uncompiled(tmp_path) == ["pkg/b.py"]


def test_the_check_environment_is_the_images():
    env = check.image_env()
    assert env["PATH"].startswith("/opt/tessera/bin:")
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"


def test_a_failed_command_is_named_with_its_inline_script_cut_short():
    with pytest.raises(chroot.BuildError) as err:
        chroot.run(["sh", "-c", "\nexit 3\n# " + "x" * 300, "arg"], what="the step")
    message = str(err.value)
    assert message.startswith("the step failed (exit 3): `sh -c exit 3 ... arg`")
    assert "x" * 100 not in message
