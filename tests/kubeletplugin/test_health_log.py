"""The GPU health event log (kubeletplugin/healthlog.py): whom it trusts, how it follows rotation and
partial lines, and `tessera inject-health-event` (issue 24 items 2 and 3)."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from kubeletplugin.healthlog import (
    EVENT_LOG_FILE,
    GPUS_FILE,
    MAX_LINE,
    EventLogSource,
    append_event,
    write_gpu_indexes,
)
from tests.builders.health import T0, Harness, taints_of

ROOT = os.geteuid() == 0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def logs() -> Iterator[list[Any]]:
    with structlog.testing.capture_logs() as captured:
        yield captured


def line(event: dict[str, Any]) -> bytes:
    return (json.dumps(event) + "\n").encode()


def tainted(h: Harness) -> dict[str, list[str]]:
    if not h.published:
        return {}
    return {d: [t["key"].split("/")[1] for t in ts] for d, ts in taints_of(h.published[-1]).items()}


def source(h: Harness, path: Path, **kwargs: Any) -> EventLogSource:
    return EventLogSource(path, h.monitor, clock=lambda: T0, **kwargs)


def write_private(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


# -- trust ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o277], ids=["000", "022", "277"])
def test_inject_creates_the_log_0600_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        append_event(tmp_path / EVENT_LOG_FILE, {"gpu": 0, "event": "reset"})
    finally:
        os.umask(old)
    assert (tmp_path / EVENT_LOG_FILE).stat().st_mode & 0o777 == 0o600


def test_a_log_others_can_write_is_refused_with_the_reason_and_nothing_from_it_is_applied(
        tmp_path: Path, logs: list[Any]) -> None:
    h = Harness()
    path = tmp_path / EVENT_LOG_FILE
    path.write_bytes(line({"gpu": 0, "event": "gpu-lost"}))
    path.chmod(0o666)  # what `inject-health-event` under umask 000 used to create
    src = source(h, path)
    assert src.poll() == 0 and src.poll() == 0
    assert tainted(h) == {}
    refusals = [e for e in logs if e["event"].startswith("refusing the health event log")]
    assert len(refusals) == 1, "logged once, not at every poll"
    assert refusals[0]["reason"] == "mode 0666 lets others write it" and refusals[0]["path"] == str(path)
    assert "chmod 0600" in refusals[0]["fix"]
    with pytest.raises(OSError, match="mode 0666 lets others write it; the node agent refuses it"):
        append_event(path, {"gpu": 0, "event": "reset"})  # inject does not write into a log the agent refuses


@pytest.mark.skipif(not ROOT, reason="giving the file to another user needs root")
def test_a_log_owned_by_another_user_is_refused(tmp_path: Path, logs: list[Any]) -> None:
    h = Harness()
    path = tmp_path / EVENT_LOG_FILE
    write_private(path, line({"gpu": 0, "event": "gpu-lost"}))
    os.chown(path, 65534, 65534)
    assert source(h, path).poll() == 0 and tainted(h) == {}
    [refused] = [e for e in logs if e["event"].startswith("refusing")]
    assert refused["reason"].startswith("owned by uid 65534, not by this agent's uid 0")


def test_a_symbolic_link_or_a_fifo_is_refused_without_blocking(tmp_path: Path, logs: list[Any]) -> None:
    h = Harness()
    target = tmp_path / "elsewhere"
    write_private(target, line({"gpu": 0, "event": "gpu-lost"}))
    path = tmp_path / EVENT_LOG_FILE
    path.symlink_to(target)
    assert source(h, path).poll() == 0
    path.unlink()
    os.mkfifo(path, 0o600)
    assert source(h, path).poll() == 0  # O_NONBLOCK: a FIFO with no writer does not hang the reader
    assert tainted(h) == {}
    assert [e["reason"] for e in logs if e["event"].startswith("refusing")] == ["a symbolic link",
                                                                               "not a regular file"]


def test_a_log_that_turns_unsafe_is_read_on_only_from_where_it_is_once_safe_again(
        tmp_path: Path, logs: list[Any]) -> None:
    h = Harness()
    path = tmp_path / EVENT_LOG_FILE
    append_event(path, {"gpu": 0, "event": "xid", "xid": 94, "time": T0})
    src = source(h, path)
    assert src.poll() == 1
    path.chmod(0o666)
    with path.open("ab") as f:
        f.write(line({"gpu": 2, "event": "gpu-lost"}))  # anyone could have written this
    assert src.poll() == 0
    path.chmod(0o600)
    assert src.poll() == 0
    append_event(path, {"gpu": 3, "event": "xid", "xid": 94, "time": T0})
    assert src.poll() == 1
    assert tainted(h) == {"gpu-0": ["xid"], "gpu-3": ["xid"]}
    assert any(e["event"].startswith("the health event log is safe again") for e in logs)


# -- identity: rotation ------------------------------------------------------------------------------


def replace_file(path: Path, data: bytes) -> None:
    tmp = path.with_name(".new")
    write_private(tmp, data)
    os.replace(tmp, path)


@pytest.mark.parametrize("new_size", ["same", "larger", "smaller"])
def test_a_replaced_log_is_read_from_its_start_whatever_its_size(tmp_path: Path, new_size: str) -> None:
    h = Harness()
    path = tmp_path / EVENT_LOG_FILE
    first = line({"gpu": 0, "event": "xid", "xid": 94, "time": T0})
    write_private(path, first)
    src = source(h, path)
    src.poll()
    assert tainted(h) == {"gpu-0": ["xid"]}
    second = line({"gpu": 2, "event": "xid", "xid": 95, "time": T0})
    data = {"same": second, "larger": second + line({"gpu": 3, "event": "xid", "xid": 96, "time": T0}),
            "smaller": line({"gpu": 2, "event": "gpu-lost"})}[new_size]
    assert {"same": len(data) == len(first), "larger": len(data) > len(first),
            "smaller": len(data) < len(first)}[new_size]
    replace_file(path, data)
    src.poll()
    expected = {"same": {"gpu-2": ["xid"]}, "larger": {"gpu-2": ["xid"], "gpu-3": ["xid"]},
                "smaller": {"gpu-2": ["gpu-lost"]}}[new_size]
    assert tainted(h) == expected, "a simulated node starts over and replays the new file"


def test_a_log_truncated_in_place_is_read_again_from_its_start(tmp_path: Path) -> None:
    h = Harness()
    path = tmp_path / EVENT_LOG_FILE
    append_event(path, {"gpu": 0, "event": "gpu-lost", "time": T0})
    append_event(path, {"gpu": 3, "event": "gpu-lost", "time": T0})
    src = source(h, path)
    src.poll()
    with path.open("r+b") as f:
        f.truncate(0)
        f.write(line({"gpu": 2, "event": "ecc-double-bit", "time": T0}))
    src.poll()
    assert tainted(h) == {"gpu-2": ["ecc-double-bit"]}


def test_on_an_nvml_node_an_operators_reset_survives_a_rotation(tmp_path: Path) -> None:
    h = Harness()
    path = tmp_path / EVENT_LOG_FILE
    append_event(path, {"gpu": 0, "event": "reset", "time": T0})  # from before this start: skipped
    src = source(h, path, replay=False)
    src.start()
    try:
        from driver.health import EventClass, HealthEvent

        for gpu in (1, 2, 3):
            h.monitor.handle(HealthEvent(gpu, EventClass.ECC_DOUBLE_BIT, "double-bit", "from NVML", T0))
        with src._lock:  # hold the reader while the operator appends and rotates
            append_event(path, {"gpu": 1, "event": "reset", "time": T0})
            rotated = path.with_name("health-events.jsonl.1")
            os.rename(path, rotated)
            append_event(path, {"gpu": 2, "event": "reset", "time": T0})  # the new file: read from its start
        deadline = time.monotonic() + 10
        while sorted(tainted(h)) != ["gpu-3"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(tainted(h)) == ["gpu-3"]
    finally:
        src.stop()


# -- lines ----------------------------------------------------------------------------------------


def test_a_last_line_without_newline_is_reported_after_the_wait_and_the_next_line_stands_alone(
        tmp_path: Path, logs: list[Any]) -> None:
    h = Harness()
    clock = Clock()
    path = tmp_path / EVENT_LOG_FILE
    write_private(path, json.dumps({"gpu": 3, "event": "xid", "xid": 94, "time": T0}).encode())  # `echo -n`
    src = source(h, path, partial_wait=2.0, monotonic=clock)
    assert src.poll() == 0  # it may still be being written
    clock.now += 1
    assert src.poll() == 0
    clock.now += 1.5
    assert src.poll() == 1
    [warned] = [e for e in logs if e["event"].startswith("health event log line has no newline")]
    assert (warned["path"], warned["line"]) == (str(path), 1)
    with path.open("ab") as f:
        f.write(line({"gpu": 0, "event": "gpu-lost", "time": T0}))
    assert src.poll() == 1, "the next line is not glued to the unfinished one"
    assert tainted(h) == {"gpu-0": ["gpu-lost"], "gpu-3": ["xid"]}


def test_a_truncated_write_is_reported_incomplete_and_costs_only_itself(
        tmp_path: Path, logs: list[Any]) -> None:
    h = Harness()
    clock = Clock()
    path = tmp_path / EVENT_LOG_FILE
    write_private(path, b'{"gpu": 2, "event": "gpu-l')  # the writer died mid-line
    src = source(h, path, partial_wait=2.0, monotonic=clock)
    src.poll()
    clock.now += 3
    assert src.poll() == 0
    with path.open("ab") as f:
        f.write(line({"gpu": 0, "event": "gpu-lost", "time": T0}))
    assert src.poll() == 1
    assert tainted(h) == {"gpu-0": ["gpu-lost"]}
    [bad] = [e for e in logs if e["event"] == "ignoring a bad line in the health event log"]
    assert bad["line"] == 1 and bad["path"] == str(path)


def test_a_line_still_being_written_within_the_wait_is_applied_whole(tmp_path: Path) -> None:
    h = Harness()
    clock = Clock()
    path = tmp_path / EVENT_LOG_FILE
    whole = line({"gpu": 2, "event": "gpu-lost", "time": T0})
    write_private(path, whole[:10])
    src = source(h, path, partial_wait=2.0, monotonic=clock)
    src.poll()
    clock.now += 1.9
    with path.open("ab") as f:
        f.write(whole[10:])
    assert src.poll() == 1 and tainted(h) == {"gpu-2": ["gpu-lost"]}


@pytest.mark.parametrize(("garbage", "error"), [
    (b"x" * (MAX_LINE + 10), f"longer than {MAX_LINE} bytes"),
    (b"[" * 50_000, "maximum recursion depth|recursion"),
    (b"\xff\xfe\x00binary\x00\x80", "codec can't decode|Expecting value"),
    (b'{"gpu": 0, "event": "xid", "xid": 1' + b"0" * 5000 + b"}", "Exceeds the limit|1 to 4294967295"),
    (b'{"gpu": 0, "event": "gpu-lost", "time": NaN}', "finite number"),
    (b'{"gpu": 0, "event": "gpu-lost", "time": 1790000000000}', "looks like milliseconds"),
], ids=["huge", "deep", "binary", "long-int", "nan", "milliseconds"])
def test_every_bad_line_is_logged_with_file_and_line_and_skipped(
        tmp_path: Path, logs: list[Any], garbage: bytes, error: str) -> None:
    h = Harness()
    path = tmp_path / EVENT_LOG_FILE
    write_private(path, line({"gpu": 0, "event": "xid", "xid": 94, "time": T0}) + garbage + b"\n"
                  + line({"gpu": 2, "event": "gpu-lost", "time": T0}))
    assert source(h, path).poll() == 2
    assert tainted(h) == {"gpu-0": ["xid"], "gpu-2": ["gpu-lost"]}
    [bad] = [e for e in logs if e["event"] == "ignoring a bad line in the health event log"]
    assert (bad["path"], bad["line"]) == (str(path), 2)
    assert re.search(error, bad["error"]), bad["error"]


def test_a_huge_line_arriving_in_pieces_is_skipped_up_to_its_newline(tmp_path: Path) -> None:
    h = Harness()
    path = tmp_path / EVENT_LOG_FILE
    write_private(path, b"y" * (MAX_LINE + 1))
    src = source(h, path)
    src.poll()
    with path.open("ab") as f:
        f.write(b"y" * 1000 + b"\n" + line({"gpu": 2, "event": "gpu-lost", "time": T0}))
    assert src.poll() == 1 and tainted(h) == {"gpu-2": ["gpu-lost"]}


# -- tessera inject-health-event ---------------------------------------------------------------------


def inject(state: Path, *flags: str) -> int:
    from tessera.cli import main

    saved = structlog.get_config()
    try:
        return main(["--log-format", "json", "inject-health-event", "--state-dir", str(state), *flags])
    finally:
        structlog.configure(**saved)


@pytest.mark.parametrize(("flags", "message"), [
    (["--gpu", "99", "--event", "gpu-lost"], "--gpu 99: the node agent has no such GPU; its GPUs are [0, 1, 2, 3]"),
    (["--gpu", "0", "--event", "xid", "--xid", "-5"], "--xid -5: an XID is a number from 1 to 4294967295"),
    (["--gpu", "0", "--event", "xid", "--xid", "0"], "--xid 0: an XID is a number from 1"),
    (["--gpu", "0", "--event", "nvlink-down", "--link", "-1"], "--link -1: an NVLink number is from 0 to 1023"),
    (["--gpu", "0", "--event", "gpu-lost", "--xid", "79"], "--xid goes only with --event xid"),
    (["--gpu", "0", "--event", "reset", "--condition", "xid"], "--condition goes only with --event recovered"),
    (["--gpu", "0", "--event", "reset", "--message", "m" * 1025], "--message: at most 1024 characters"),
])
def test_inject_refuses_what_the_agent_would_refuse_and_appends_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str) -> None:
    write_gpu_indexes(tmp_path, [0, 1, 2, 3])
    assert inject(tmp_path, *flags) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / EVENT_LOG_FILE).exists()


def test_inject_says_when_it_cannot_tell_the_nodes_gpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert inject(tmp_path, "--gpu", "0", "--event", "reset") == 1
    assert f"{tmp_path / GPUS_FILE} is missing: the node agent writes it when it starts" in capsys.readouterr().err


def test_inject_writes_a_recovery_the_agent_applies(tmp_path: Path) -> None:
    h = Harness()
    write_gpu_indexes(tmp_path, h.monitor.gpu_indexes)
    assert inject(tmp_path, "--gpu", "2", "--event", "ecc-double-bit") == 0
    assert inject(tmp_path, "--gpu", "2", "--event", "gpu-lost") == 0
    src = source(h, tmp_path / EVENT_LOG_FILE)
    src.poll()
    assert tainted(h) == {"gpu-2": ["ecc-double-bit", "gpu-lost"]}
    assert inject(tmp_path, "--gpu", "2", "--event", "recovered", "--condition", "gpu-lost") == 0
    src.poll()
    assert tainted(h) == {"gpu-2": ["ecc-double-bit"]}
    assert inject(tmp_path, "--gpu", "2", "--event", "recovered") == 0
    src.poll()
    assert tainted(h) == {}


def test_the_agent_records_its_gpus_for_inject_when_the_log_source_starts(tmp_path: Path) -> None:
    h = Harness()
    src = source(h, tmp_path / EVENT_LOG_FILE)
    src.start()
    src.stop()
    assert json.loads((tmp_path / GPUS_FILE).read_text()) == {"gpus": [0, 1, 2, 3]}


def test_an_over_long_last_line_without_newline_does_not_swallow_the_next_event(tmp_path: Path) -> None:
    h = Harness()
    clock = Clock()
    path = tmp_path / EVENT_LOG_FILE
    write_private(path, b"z" * (MAX_LINE + 5))
    src = source(h, path, partial_wait=2.0, monotonic=clock)
    src.poll()
    clock.now += 3
    src.poll()
    append_event(path, {"gpu": 2, "event": "gpu-lost", "time": T0})
    assert src.poll() == 1 and tainted(h) == {"gpu-2": ["gpu-lost"]}
