"""Time-slice intervals: the nvidia-smi call (against a stand-in binary) and the simulated recorder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kubeletplugin.timeslicing import NvidiaSmiTimeSlicer, SimulatedTimeSlicer, TimeSliceError

FAKE_SMI = """#!{python}
import os, sys
with open(os.environ["FAKE_SMI_LOG"], "a") as f:
    f.write(" ".join(sys.argv[1:]) + "|" + os.environ.get("LD_LIBRARY_PATH", "") + "\\n")
if os.environ.get("FAKE_SMI_FAIL"):
    print("Insufficient Permissions", file=sys.stderr)
    sys.exit(4)
"""


@pytest.fixture
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    binary = tmp_path / "nvidia-smi"
    binary.write_text(FAKE_SMI.format(python=sys.executable))
    binary.chmod(0o755)
    monkeypatch.setenv("FAKE_SMI_LOG", str(tmp_path / "smi.log"))
    return binary


def calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "smi.log").read_text().splitlines()


@pytest.mark.parametrize(("interval", "value"), [("Default", 0), ("Short", 1), ("Medium", 2), ("Long", 3)])
def test_interval_is_passed_as_nvidia_smi_number(tmp_path, smi, interval, value):
    NvidiaSmiTimeSlicer(smi).set_interval("GPU-a", interval)
    assert calls(tmp_path) == [f"compute-policy -i GPU-a --set-timeslice {value}|"]


def test_driver_root_libraries_are_put_on_the_library_path(tmp_path, smi):
    NvidiaSmiTimeSlicer(smi, library_dirs=[Path("/driver-root/usr/lib64"), Path("/driver-root/lib")]).set_interval(
        "GPU-a", "Long"
    )
    assert calls(tmp_path)[0].endswith("|/driver-root/usr/lib64:/driver-root/lib")


def test_nvidia_smi_failure_is_reported(tmp_path, smi, monkeypatch):
    monkeypatch.setenv("FAKE_SMI_FAIL", "1")
    with pytest.raises(TimeSliceError, match="exited with 4: Insufficient Permissions"):
        NvidiaSmiTimeSlicer(smi).set_interval("GPU-a", "Short")


def test_missing_binary_is_reported(tmp_path):
    with pytest.raises(TimeSliceError, match="no-smi"):
        NvidiaSmiTimeSlicer(tmp_path / "no-smi").set_interval("GPU-a", "Short")


def test_unknown_interval_is_refused_before_running_anything(tmp_path, smi):
    with pytest.raises(TimeSliceError, match="unknown time-slice interval 'Forever'"):
        NvidiaSmiTimeSlicer(smi).set_interval("GPU-a", "Forever")
    assert not (tmp_path / "smi.log").exists()


def test_recorder_keeps_non_default_intervals_across_instances(tmp_path):
    SimulatedTimeSlicer(tmp_path).set_interval("GPU-a", "Long")
    SimulatedTimeSlicer(tmp_path).set_interval("GPU-b", "Short")
    assert SimulatedTimeSlicer(tmp_path).intervals() == {"GPU-a": "Long", "GPU-b": "Short"}
    SimulatedTimeSlicer(tmp_path).set_interval("GPU-a", "Default")
    assert SimulatedTimeSlicer(tmp_path).intervals() == {"GPU-b": "Short"}


def test_recorder_refuses_unknown_interval(tmp_path):
    with pytest.raises(TimeSliceError):
        SimulatedTimeSlicer(tmp_path).set_interval("GPU-a", "Sometimes")
