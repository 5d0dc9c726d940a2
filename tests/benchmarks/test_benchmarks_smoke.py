"""The benchmarks' in-process parts run end to end with tiny counts, so they cannot rot.

Nothing here asserts on timings (those are the benchmarks' output, recorded in BENCHMARKS.md);
the assertions are on what was measured and that the failure paths say what went wrong.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from benchmarks import (
    admission_bench,
    cel_compare,
    footprint,
    fsync_floor,
    prepare_bench,
    publish_bench,
    review_contention_bench,
    webhook_load_bench,
)
from benchmarks import run as bench_run
from benchmarks.stats import percentile, summarize, table
from driver.kubeapi import ApiError
from kubeletplugin.checkpointstore import CheckpointStore
from tests.fakes.apiserver import FakeKubeAPI


def test_summary_uses_nearest_rank_percentiles() -> None:
    s = summarize([float(v) for v in range(1, 101)])
    assert (s.n, s.p50, s.p99, s.max, s.mean) == (100, 50.0, 99.0, 100.0, 50.5)
    assert summarize([3.0, 1.0]).p99 == 3.0


def test_percentile_of_nothing_says_to_raise_the_count() -> None:
    with pytest.raises(ValueError, match="zero iterations"):
        percentile([], 50)


def test_table_pads_columns() -> None:
    text = table(["a", "long header"], [["xxxxx", 1]])
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1
    assert lines[2].startswith("| xxxxx |")


def test_fsync_floor_measures_each_write(tmp_path: Path) -> None:
    s = fsync_floor.measure(tmp_path, 3)
    assert s.n == 3
    assert list(tmp_path.iterdir()) == []


def test_in_memory_api_behaves_like_an_apiserver_on_errors_and_watch() -> None:
    api = FakeKubeAPI()
    with pytest.raises(ApiError) as missing:
        api.get_resource_claim("ns", "nope")
    assert missing.value.not_found
    created = api.create_resource_slice({"metadata": {"generateName": "n-"}, "spec": {"nodeName": "n"}})
    name = created["metadata"]["name"]
    with pytest.raises(ApiError) as stale:
        api.replace_resource_slice(name, {"metadata": {"resourceVersion": "0"}, "spec": {}})
    assert stale.value.conflict
    events = api.watch_resource_slices("0", "spec.nodeName=n", timeout_seconds=1)
    assert api.wipe_node("n") == 1
    assert next(events).type == "DELETED"
    with pytest.raises(ApiError):
        api.delete_resource_slice(name)


def test_prepare_benchmark_covers_every_shape_and_restores_the_patched_steps() -> None:
    original_save = CheckpointStore.save
    report = prepare_bench.run_in_memory(claims=2, concurrency=(1, 2), burst=2)
    assert [r.shape for r in report.shapes] == list(prepare_bench.SHAPES)
    for r in report.shapes:
        assert r.prepare.n == 2
        assert r.steps_ms["checkpoint write (fsync)"] > 0
        assert r.steps_ms["apiserver GET claim"] > 0
    mig = next(r for r in report.shapes if "MIG" in r.shape)
    assert mig.steps_ms["MIG create (simulated)"] > 0
    share = next(r for r in report.shapes if r.shape == "10Gi share (MPS)")
    assert share.steps_ms["MPS daemon start (fake)"] > 0
    assert [t.concurrency for t in report.throughput] == [1, 2]
    assert CheckpointStore.save is original_save
    text = prepare_bench.render(report, summarize([1.0]))
    assert "own / fsync floor" in text and "with no claims" in text
    assert report.empty_call is not None and report.empty_call.n >= 2


def test_a_failed_prepare_stops_the_benchmark_with_the_plugins_error() -> None:
    api = FakeKubeAPI()
    plugin = prepare_bench.NodePlugin(api, "n", "dgx-h100-8", "static")
    try:
        with pytest.raises(prepare_bench.BenchmarkError, match="does not exist"):
            plugin.prepare("missing", "00000000-0000-4000-8000-000000000001")
    finally:
        plugin.close()


@pytest.mark.slow
def test_publish_benchmark_sees_every_slice_come_back() -> None:
    results = publish_bench.run(publish_bench.memory_backend(), wipes=1)
    assert [r.case for r in results] == [c[0] for c in publish_bench.CASES]
    assert all(r.republish.n == 1 and r.slices >= 1 for r in results)
    assert results[-1].devices > results[0].devices


def test_admission_benchmark_builds_a_fleet_with_distinct_nodes() -> None:
    slices, gpus = admission_bench.fleet(1_000)
    assert gpus >= 1_000
    assert {s["spec"]["nodeName"].split("-")[0] for s in slices} >= {"dgx", "a100"}
    (result,) = admission_bench.run(repeat=2, sizes=(10,))
    assert set(result.reviews) == set(admission_bench.CASES)
    assert "p99 / 20 ms target" in admission_bench.render([result])


@pytest.mark.slow
def test_cel_comparison_runs_both_python_engines_on_the_same_cases() -> None:
    results = cel_compare.run(None, 0.01, 2, include_heavy=False)
    assert [r.cases > 0 for r in results] == [True, True]
    assert all(set(r.rates) == set(cel_compare.ENGINES) for r in results)
    assert "n/a" in cel_compare.render(results)


@pytest.mark.skipif(not os.environ.get("TESSERA_HARNESS"), reason="needs the e2e harness (TESSERA_HARNESS)")
def test_go_oracle_rate_from_two_batches() -> None:
    # the heavy case: each copy costs Go milliseconds, well above process-start noise
    cases = [c for c in cel_compare.corpus_cases() if c.name in cel_compare.HEAVY]
    raw, net = cel_compare.go_rate(Path(os.environ["TESSERA_HARNESS"]), cases, copies=6, tries=1)
    assert raw > 0 and net > 0


def test_go_oracle_failure_is_reported(tmp_path: Path) -> None:
    fake = tmp_path / "harness"
    fake.write_text("#!/bin/sh\necho broken >&2\nexit 2\n")
    fake.chmod(0o755)
    with pytest.raises(RuntimeError, match=r"rc=2.*broken"):
        cel_compare.go_rate(fake, cel_compare.corpus_cases()[:1], copies=2, tries=1)


def test_footprint_reads_rss_and_cpu_from_proc() -> None:
    assert footprint.rss_mib(os.getpid()) > 1
    before = footprint.cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    assert footprint.cpu_seconds(os.getpid()) >= before


@pytest.mark.slow
def test_quick_run_without_a_cluster_writes_every_section(tmp_path: Path) -> None:
    tiny = bench_run.Params(
        floor_iterations=2, claims=1, burst=1, concurrency=(1, 2), wipes=1, admission_sizes=(10,), admission_repeat=1,
        cel_seconds=0.01, cel_copies=2, cel_heavy=False, cluster=False, cluster_claims=1, scheduling_pods=1,
        podstart_rounds=1, podstart_burst=1, warmup_s=0.0, window_s=0.1, round_trips=1, hostile_clients=2,
        load_samples=2,
    )
    report = bench_run.Report()
    bench_run.run(tiny, report, None)
    assert len(report.sections) == 6
    text = report.markdown(bench_run.header(tiny, ["--quick"]))
    assert "cpus (nproc)" in text and "### Admission review latency by inventory size" in text


def test_cluster_parts_without_a_harness_are_refused() -> None:
    params = bench_run.Params(
        floor_iterations=1, claims=1, burst=1, concurrency=(1,), wipes=1, admission_sizes=(10,), admission_repeat=1,
        cel_seconds=0.01, cel_copies=2, cel_heavy=False, cluster=True, cluster_claims=1, scheduling_pods=1,
        podstart_rounds=1, podstart_burst=1, warmup_s=0.0, window_s=0.1, round_trips=1,
    )
    with pytest.raises(SystemExit, match="TESSERA_HARNESS"):
        bench_run.run(params, bench_run.Report(), None)


def test_pod_startup_report_gives_each_kind_against_the_no_claim_reference() -> None:
    from benchmarks import podstart_bench

    singles = {kind: summarize([100.0 * (i + 1)] * 3) for i, kind in enumerate(podstart_bench.KINDS)}
    bursts = [podstart_bench.BurstResult("10 pods, no claim", 2000.0, summarize([900.0])),
              podstart_bench.BurstResult("10 pods, a 1Gi share each", 3000.0, summarize([1500.0]))]
    text = podstart_bench.render(singles, bursts)
    assert "| whole GPU " in text and "2.00x" in text and "4.00x" in text  # 200/100 and 400/100
    assert "| 10 pods, a 1Gi share each | 3000 " in text and "1.50x" in text


@pytest.mark.slow
def test_webhook_load_bench_measures_benign_reviews_with_and_without_hostile_ones() -> None:
    result = webhook_load_bench.run(hostile_clients=2, samples=3, nodes=2)
    assert [name for name, _ in result.rows] == [
        "benign claim review, no load", "benign claim review, 2 hostile clients",
        "/readyz on a new connection, no load", "/readyz on a new connection, 2 hostile clients"]
    assert all(summary.n == 3 for _, summary in result.rows)
    assert result.hostile_outcomes["(benign, no load): allowed"] == 3
    assert result.hostile_outcomes["(benign, no load): /readyz HTTP 200"] == 3
    assert sum(n for outcome, n in result.hostile_outcomes.items() if not outcome.startswith("(")) > 0
    assert "Server: max_reviews=4" in webhook_load_bench.render(result)


def test_review_contention_bench_measures_both_intervals_quiet_and_rebuilding() -> None:
    import sys

    before = sys.getswitchinterval()
    rows = review_contention_bench.run(samples=3, nodes=1, rounds=1)
    assert [row.interval_s for row in rows] == [0.005, 0.0005]
    assert all(row.quiet.n == row.rebuilding.n == 3 and row.rebuilds_per_s > 0 for row in rows)
    assert sys.getswitchinterval() == before  # the process's setting is given back
    text = review_contention_bench.render(rows, 1)
    assert "5 ms (CPython default)" in text and "0.5 ms (controller)" in text and "rebuilding 1 nodes'" in text


def test_health_benchmark_renders_every_stage() -> None:
    from benchmarks import health_bench

    results = {stage: summarize([float(i + 1) * 100 for i in range(3)]) for stage in health_bench.STAGES}
    rendered = health_bench.render(results)
    assert all(stage in rendered for stage in health_bench.STAGES)


def test_prepare_path_follows_a_claim_from_the_grpc_entry_to_the_cdi_write() -> None:
    from benchmarks import prepare_path

    trace = prepare_path.run()
    chain = trace.handler + trace.worker
    assert chain[0] == "kubeletplugin/draservice.py:DRAPluginV1.NodePrepareResources"
    assert chain[-1] == "driver/cdi.py:write_spec"
    assert "kubeletplugin/state.py:DeviceState.prepare" in chain
    assert {"driver/allocation.py", "kubeletplugin/devicesteps.py"} <= trace.touched
