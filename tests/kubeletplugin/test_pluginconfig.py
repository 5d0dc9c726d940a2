"""`tessera kubelet-plugin`'s flags come from PluginConfig: one default per setting, and no GPU backend by default."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from kubeletplugin.pluginconfig import PluginConfig, PluginConfigError, add_arguments, config_from_args
from tests.paths import REPO


def parse(*argv: str) -> PluginConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)))


def test_without_a_backend_the_command_exits_non_zero_naming_both() -> None:
    proc = subprocess.run([sys.executable, "-m", "tessera", "kubelet-plugin", "--node-name", "node-a"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 2
    out = proc.stdout + proc.stderr
    assert "no GPU backend" in out and "--nvml" in out and "--simulate PROFILE" in out


def test_a_config_without_a_backend_is_refused() -> None:
    with pytest.raises(PluginConfigError, match=r"no GPU backend: pass --nvml .* or --simulate PROFILE"):
        PluginConfig(node_name="node-a")


def test_a_flag_left_out_takes_the_dataclass_default() -> None:
    config = parse("--node-name", "node-a", "--simulate", "mixed")
    assert config == PluginConfig(node_name="node-a", simulate="mixed")
    for f in dataclasses.fields(PluginConfig):
        if "flag" in f.metadata and f.default is not dataclasses.MISSING and f.name not in ("node_name", "simulate"):
            assert getattr(config, f.name) == f.default, f.name


def test_the_help_shows_the_dataclass_defaults() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    text = parser.format_help()
    for f in dataclasses.fields(PluginConfig):
        if "flag" in f.metadata and f.default not in (dataclasses.MISSING, None, "", False):
            assert f"(default: {f.default})" in " ".join(text.split()), f.name


def test_paths_on_the_command_line_become_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = parse("--node-name", "n", "--nvml", "--state-dir", "state", "--cdi-dir", "cdi")
    assert (config.state_dir, config.cdi_dir) == (tmp_path / "state", tmp_path / "cdi")


def test_both_backends_at_once_are_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--node-name", "n", "--nvml", "--simulate", "mixed")
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_health_policy_that_is_not_json_names_the_flag() -> None:
    with pytest.raises(PluginConfigError, match=r"^--health-policy: "):
        parse("--node-name", "n", "--nvml", "--health-policy", "{not json")
