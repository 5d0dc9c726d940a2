"""benchmarks/status_bench.py runs: a small fleet of issue 27's mix, with every GPU in the report."""

from __future__ import annotations

from benchmarks.status_bench import fleet, measure


def test_the_fleet_has_issue_27s_mix() -> None:
    slices = fleet(10)
    pools = {s["spec"]["pool"]["name"] for s in slices}
    assert len(pools) == 10
    devices = sum(len(s["spec"].get("devices") or []) for s in slices)
    assert devices == 6 * 152 + 3 * 4 + 4  # DGX with dynamic MIG, A100 x4, T4 x4


def test_the_status_benchmark_reports_every_gpu() -> None:
    nodes, _, devices, gpus, best, worst = measure(10, repeats=1)
    assert (nodes, devices, gpus) == ("10", f"{6 * 152 + 3 * 4 + 4:,}", str(6 * 8 + 4 * 4))
    assert float(best) <= float(worst)
