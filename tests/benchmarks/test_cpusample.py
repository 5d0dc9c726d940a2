"""The admission report's attribution of slow round trips: CPU sampled per process, Go GC cycles placed on
the same clock."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from benchmarks.scale import cpusample, measure
from benchmarks.scale.cpusample import CpuSampler, GcCycle
from benchmarks.stats import summarize

APISERVER_LOG = """\
I1128 14:17:01.000000   12 server.go:100] Serving securely
gc 1 @0.120s 1%: 0.010+2.5+0.020 ms clock, 0.04+0.1/2.0/0.5+0.08 ms cpu, 4->4->1 MB, 4 MB goal
gc 2 @34.500s 3%: 0.018+250+0.031 ms clock, 0.07+1.2/120/30+0.12 ms cpu, 1234->1300->700 MB, 1400 MB goal
W1128 14:17:40.000000   12 warnings.go:70] gc 3 @1.0s is not a trace line
gc 3 @61.000s 3%: 0.5+40+0.5 ms clock, 1+2/3/4+1 ms cpu, 900->950->600 MB, 1400 MB goal
"""


def test_gc_cycles_are_read_from_the_trace_lines_and_placed_after_the_process_start() -> None:
    cycles = cpusample.gc_cycles("apiserver", APISERVER_LOG, process_start=1000.0)
    assert [(c.number, round(c.start, 3), round(c.wall_ms, 3), c.heap) for c in cycles] == [
        (1, 1000.12, 2.53, "4->4->1 MB"),
        (2, 1034.5, 250.049, "1234->1300->700 MB"),
        (3, 1061.0, 41.0, "900->950->600 MB")]


def test_a_log_appended_across_restarts_keeps_only_the_last_life() -> None:
    restarted = APISERVER_LOG + "=== restart\ngc 1 @0.5s 0%: 1+2+3 ms clock, 1+1/1/1+1 ms cpu, 5->6->2 MB\n"
    assert [(c.number, c.start) for c in cpusample.gc_cycles("etcd", restarted, 50.0)] == [(1, 50.5)]


def test_only_the_cycles_that_overlap_a_window_are_named() -> None:
    cycles = cpusample.gc_cycles("apiserver", APISERVER_LOG, process_start=1000.0)
    assert [c.number for c in cpusample.overlapping(cycles, 1034.7, 1034.9)] == [2]
    assert cpusample.overlapping(cycles, 1034.76, 1035.0) == []  # cycle 2 ended at 1034.75
    assert [c.number for c in cpusample.overlapping(cycles, 1000.0, 1100.0)] == [1, 2, 3]


def test_the_sampler_sees_the_cpu_a_process_burns_and_not_one_that_sleeps() -> None:
    pid = os.getpid()
    with CpuSampler({"me": pid}, interval=0.01) as sampler:
        time.sleep(0.1)
        busy_from = cpusample.now()
        while cpusample.now() - busy_from < 0.3:
            pass
        busy_to = cpusample.now()
        time.sleep(0.1)
        idle_from = cpusample.now()
        time.sleep(0.3)
        idle_to = cpusample.now()
        time.sleep(0.05)
    assert sampler.used(busy_from, busy_to)["me"] >= 0.2
    assert sampler.used(idle_from, idle_to)["me"] <= 0.1


def test_a_window_inside_the_block_is_covered_however_soon_it_starts_and_ends() -> None:
    with CpuSampler({"me": os.getpid()}, interval=10.0) as sampler:  # no sample from the thread in between
        start = cpusample.now()
        time.sleep(0.05)
        end = cpusample.now()
    assert "me" in sampler.used(start, end)


def test_cores_is_the_cpu_of_all_processes_over_the_sampled_span() -> None:
    sampler = CpuSampler({})
    assert sampler.cores() == 0.0
    sampler.samples = [(10.0, {"a": 0, "b": 0}), (11.0, {"a": 50, "b": 30}), (12.0, {"a": 100, "b": 60})]
    assert sampler.cores() == pytest.approx(160 * cpusample.TICK_S / 2.0)


def test_a_window_outside_the_samples_uses_nothing_known() -> None:
    sampler = CpuSampler({"me": os.getpid()})
    sampler.samples = [(10.0, {"me": 100}), (11.0, {"me": 150})]
    assert sampler.used(9.0, 10.5) == {}
    assert sampler.used(10.5, 12.0) == {}
    assert sampler.used(10.0, 11.0) == {"me": pytest.approx(50 * cpusample.TICK_S)}


def test_a_process_that_exited_during_the_phase_is_left_out_of_the_window() -> None:
    sampler = CpuSampler({})
    sampler.samples = [(10.0, {"a": 100, "gone": 7}), (11.0, {"a": 300})]
    assert list(sampler.used(10.0, 11.0)) == ["a"]


def test_the_process_start_is_on_the_same_clock_as_now() -> None:
    assert 0 < cpusample.started_at(os.getpid()) <= cpusample.now()


def test_each_slow_round_trip_is_reported_with_the_busiest_process_first_and_its_gc() -> None:
    sampler = CpuSampler({})
    sampler.samples = [(1034.0, {"apiserver": 0, "controller": 0, "kwok": 0}),
                       (1035.0, {"apiserver": 45, "controller": 3, "kwok": 0})]
    cycles = [GcCycle("apiserver", 2, 1034.5, 250.0, "1234->1300->700 MB")]
    result = measure.AdmissionResult(summarize([5.0, 300.0]), 5.0, 0, "", slow=((1034.4, 300.0),))
    [line] = measure.slow_round_trips({"DeviceClass": result}, sampler, cycles, phase_start=1030.0)
    assert line.startswith("DeviceClass at +4.4 s: 300 ms; CPU ms meanwhile: apiserver 450, controller 30; ")
    assert "kwok" not in line
    assert line.endswith("Go GC cycles: apiserver GC #2 (250 ms, 1234->1300->700 MB)")


def test_no_slow_round_trip_no_line() -> None:
    result = measure.AdmissionResult(summarize([5.0, 6.0]), 5.0, 0, "")
    assert measure.slow_round_trips({"x": result}, CpuSampler({}), [], 0.0) == []


class _SlowEveryFifth:
    """A Kube whose dry-run create takes 60 ms every fifth call and no time otherwise."""

    def __init__(self) -> None:
        self.calls = 0

    def create(self, obj: dict[str, object], dry_run: bool = False) -> None:
        self.calls += 1
        if self.calls % 5 == 0:
            time.sleep(0.06)


def test_round_trips_keep_when_each_slow_one_started_leaving_out_the_first_three() -> None:
    kube = _SlowEveryFifth()
    before = cpusample.now()
    result = measure.round_trips(kube, lambda name: {"metadata": {"name": name}}, 10)  # type: ignore[arg-type]
    after = cpusample.now()
    assert kube.calls == 13
    assert [round(ms) >= measure.SLOW_MS for _, ms in result.slow] == [True, True]  # calls 5 and 10, not 15
    starts = [start for start, _ in result.slow]
    assert before < starts[0] < starts[1] < after
    assert starts[1] - starts[0] >= 0.06  # the first slow one lies between them


class _Cluster:
    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.pid = popen.pid

    def pids(self) -> dict[str, int]:
        return {"p": self.pid}


@pytest.mark.parametrize("busy", [False, True])
def test_settle_waits_while_the_cluster_burns_a_core_and_not_when_it_rests(busy: bool) -> None:
    code = "while True: pass" if busy else "import time; time.sleep(60)"
    popen = subprocess.Popen([sys.executable, "-c", code])
    try:
        waited = measure.settle(_Cluster(popen), window=0.4, timeout=2.0)  # type: ignore[arg-type]
    finally:
        popen.kill()
        popen.wait()
    assert (waited >= 2.0) if busy else (waited < 2.0)
