"""MPS control: limit arithmetic, the fake used in tests, and the real driver of nvidia-cuda-mps-control.

The real `NvidiaMpsControl` runs here against a stand-in `nvidia-cuda-mps-control` script that
speaks the same command protocol (daemon with -d, commands on stdin, exit status 1 when no
daemon listens), so the subprocess handling, environment and command lines are exercised for real.
"""

from __future__ import annotations

import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kubeletplugin.faults import MPS_START, fail_at
from kubeletplugin.mps import (
    MIB,
    MpsDaemon,
    MpsError,
    NvidiaMpsControl,
    SimulatedMpsControl,
    control_commands,
    limit_mib,
    mps_paths,
)

UID = "7c1d0c4e-2f7e-4a55-9c8e-1f2a3b4c5d6e"

FAKE_CONTROL = """#!{python}
import os, sys
pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
logdir = os.environ["CUDA_MPS_LOG_DIRECTORY"]
control = os.path.join(pipe, "control")
if sys.argv[1:] == ["-d"]:
    if os.environ.get("FAKE_MPS_FAIL_START"):
        print("cannot start daemon", file=sys.stderr)
        sys.exit(1)
    with open(control, "w") as f:
        f.write(os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    with open(os.path.join(logdir, "daemon.env"), "w") as f:
        f.write(os.environ.get("LD_LIBRARY_PATH", ""))
    sys.exit(0)
if not os.path.exists(control):
    print("Cannot find MPS control daemon process", file=sys.stderr)
    sys.exit(1)
for line in sys.stdin:
    line = line.strip()
    if line == "quit":
        os.remove(control)
    elif line == "get_server_list":
        pass
    elif os.environ.get("FAKE_MPS_REFUSE"):
        print("refused: " + line, file=sys.stderr)
        sys.exit(1)
    else:
        with open(os.path.join(logdir, "commands.log"), "a") as f:
            f.write(line + "\\n")
"""


@pytest.fixture
def control_binary(tmp_path: Path) -> Path:
    path = tmp_path / "bin" / "nvidia-cuda-mps-control"
    path.parent.mkdir()
    path.write_text(FAKE_CONTROL.format(python=sys.executable))
    path.chmod(0o755)
    return path


@pytest.fixture
def real(tmp_path: Path, control_binary: Path) -> NvidiaMpsControl:
    return NvidiaMpsControl(tmp_path / "state", control_binary, isolate_shm=False, timeout_s=10)


def test_limit_is_whole_mib_rounded_down():
    assert limit_mib(4 * 1024 * MIB) == 4096
    assert limit_mib(4096 * MIB + MIB - 1) == 4096


def test_limit_below_one_mib_is_an_error():
    with pytest.raises(MpsError, match="below MPS's smallest limit of 1 MiB"):
        limit_mib(MIB - 1)


def test_control_commands_index_devices_by_position_with_m_suffix():
    assert control_commands([4096, 10240], 50) == [
        "set_default_active_thread_percentage 50",
        "set_default_device_pinned_mem_limit 0 4096M",
        "set_default_device_pinned_mem_limit 1 10240M",
    ]


def test_control_commands_without_thread_percentage():
    assert control_commands([100], None) == ["set_default_device_pinned_mem_limit 0 100M"]


def test_paths_are_per_claim_under_the_state_dir(tmp_path):
    paths = mps_paths(tmp_path, UID)
    assert paths.pipe_dir == tmp_path / "mps" / UID / "pipe"
    edits = paths.container_edits()
    assert edits.env == ("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",)
    assert [(m.host_path, m.container_path) for m in edits.mounts] == [
        (str(paths.pipe_dir), "/tmp/nvidia-mps"),
        (str(paths.shm_dir), "/dev/shm"),
    ]


def test_paths_refuse_unsafe_claim_uid(tmp_path):
    with pytest.raises(ValueError, match="not a plain token"):
        mps_paths(tmp_path, "../x")


# --- the fake -----------------------------------------------------------------------------------


def test_fake_records_daemon_across_instances(tmp_path):
    daemon = SimulatedMpsControl(tmp_path).start(UID, ["GPU-1", "GPU-0"], [4096, 2048], 30)
    again = SimulatedMpsControl(tmp_path)
    assert again.is_running(UID)
    assert again.adopt(daemon)
    assert again.daemons() == {UID: daemon}
    assert daemon.gpu_uuids == ("GPU-1", "GPU-0")
    log = (Path(daemon.log_dir) / "control.log").read_text().splitlines()
    assert log == [
        "set_default_active_thread_percentage 30",
        "set_default_device_pinned_mem_limit 0 4096M",
        "set_default_device_pinned_mem_limit 1 2048M",
    ]


def test_fake_stop_removes_record_and_dirs(tmp_path):
    fake = SimulatedMpsControl(tmp_path)
    daemon = fake.start(UID, ["GPU-0"], [1024], None)
    fake.stop(UID)
    fake.stop(UID)
    assert not fake.is_running(UID)
    assert not fake.adopt(daemon)
    assert not Path(daemon.pipe_dir).exists()


def test_fake_adopt_refuses_a_daemon_with_other_settings(tmp_path):
    fake = SimulatedMpsControl(tmp_path)
    daemon = fake.start(UID, ["GPU-0"], [1024], None)
    assert not fake.adopt(MpsDaemon(**{**daemon.__dict__, "limits_mib": (2048,)}))


def test_fake_injected_start_failure(tmp_path):
    with pytest.raises(MpsError, match="injected failure"):
        failing = fail_at(MPS_START, MpsError("nvidia-cuda-mps-control -d exited with 1: (injected failure)"))
        SimulatedMpsControl(tmp_path, fault_hook=failing).start(UID, ["GPU-0"], [1], None)


@pytest.mark.parametrize(
    ("uuids", "limits", "thread_percentage", "message"),
    [
        ([], [], None, "at least one GPU"),
        (["GPU-0"], [1, 2], None, "1 GPUs but 2 memory limits"),
        (["GPU-0", "GPU-0"], [1, 1], None, "appears twice"),
        (["GPU-0"], [0], None, "at least 1 MiB"),
        (["GPU-0"], [1], 0, "1..100"),
    ],
)
def test_bad_requests_are_refused(tmp_path, uuids, limits, thread_percentage, message):
    with pytest.raises(MpsError, match=message):
        SimulatedMpsControl(tmp_path).start(UID, uuids, limits, thread_percentage)


def test_daemon_record_round_trip(tmp_path):
    daemon = SimulatedMpsControl(tmp_path).start(UID, ["GPU-0"], [1024], 20)
    assert MpsDaemon.from_dict(daemon.to_dict()) == daemon


# --- the real control, against the stand-in binary ----------------------------------------------


def test_real_start_runs_daemon_with_claim_gpus_and_feeds_limits(real):
    daemon = real.start(UID, ["GPU-b", "GPU-a"], [4096, 8192], 40)
    paths = mps_paths(real.state_dir, UID)
    assert (paths.pipe_dir / "control").read_text() == "GPU-b,GPU-a"
    assert (paths.log_dir / "commands.log").read_text().splitlines() == [
        "set_default_active_thread_percentage 40",
        "set_default_device_pinned_mem_limit 0 4096M",
        "set_default_device_pinned_mem_limit 1 8192M",
    ]
    assert real.is_running(UID)
    assert real.adopt(daemon)
    # containers of any user must be able to create client pipes and shm segments
    assert stat.S_IMODE(paths.pipe_dir.stat().st_mode) == 0o1777
    assert stat.S_IMODE(paths.shm_dir.stat().st_mode) == 0o1777


def test_real_daemon_gets_driver_root_libraries(tmp_path, control_binary):
    control = NvidiaMpsControl(
        tmp_path / "state", control_binary, isolate_shm=False, library_dirs=[Path("/driver-root/usr/lib64")]
    )
    control.start(UID, ["GPU-a"], [4096], None)
    assert (mps_paths(control.state_dir, UID).log_dir / "daemon.env").read_text() == "/driver-root/usr/lib64"


def test_real_stop_quits_the_daemon_and_removes_its_dirs(real):
    real.start(UID, ["GPU-a"], [4096], None)
    real.stop(UID)
    assert not real.is_running(UID)
    assert not mps_paths(real.state_dir, UID).root.exists()
    real.stop(UID)  # idempotent


def test_real_stop_kills_leftover_mps_processes_of_this_claim_only(tmp_path, real):
    # stand-ins named like MPS servers: argv[0] is what tessera recognises them by
    server = tmp_path / "bin" / "nvidia-cuda-mps-server"
    server.symlink_to(shutil.which("sleep") or "/bin/sleep")
    paths = mps_paths(real.state_dir, UID)
    other = mps_paths(real.state_dir, "other-claim")
    mine = subprocess.Popen([str(server), "60"], env={"CUDA_MPS_PIPE_DIRECTORY": str(paths.pipe_dir)})
    theirs = subprocess.Popen([str(server), "60"], env={"CUDA_MPS_PIPE_DIRECTORY": str(other.pipe_dir)})
    try:
        real.stop(UID)
        assert mine.wait(timeout=10) == -signal.SIGKILL
        assert theirs.poll() is None
    finally:
        for proc in (mine, theirs):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_real_start_clears_a_dead_daemons_pipe_dir(real):
    paths = mps_paths(real.state_dir, UID)
    paths.pipe_dir.mkdir(parents=True)
    (paths.pipe_dir / "control_lock").write_text("stale")
    real.start(UID, ["GPU-a"], [4096], None)
    assert not (paths.pipe_dir / "control_lock").exists()
    assert real.is_running(UID)


def test_real_is_running_is_false_without_a_daemon(real):
    assert not real.is_running(UID)


def test_real_start_failure_is_reported(real, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_FAIL_START", "1")
    with pytest.raises(MpsError, match=r"-d exited with 1: cannot start daemon"):
        real.start(UID, ["GPU-a"], [4096], None)


def test_real_refused_limits_stop_the_daemon(real, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_REFUSE", "1")
    with pytest.raises(MpsError, match="the MPS daemon refused its limits"):
        real.start(UID, ["GPU-a"], [4096], None)
    assert not real.is_running(UID)


def test_real_missing_binary_is_reported(tmp_path):
    control = NvidiaMpsControl(tmp_path, tmp_path / "no-such-binary", isolate_shm=False)
    with pytest.raises(MpsError, match="cannot start"):
        control.start(UID, ["GPU-a"], [4096], None)


def test_real_start_replaces_a_running_daemon(real):
    real.start(UID, ["GPU-a"], [4096], None)
    real.start(UID, ["GPU-a"], [2048], None)
    lines = (mps_paths(real.state_dir, UID).log_dir / "commands.log").read_text().splitlines()
    assert lines == ["set_default_device_pinned_mem_limit 0 2048M"]
