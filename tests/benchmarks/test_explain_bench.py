"""benchmarks/explain_bench.py runs: one node of each fleet, with the answer and the search it ran."""

from __future__ import annotations

from benchmarks.explain_bench import classes, report, run_one


def test_the_explain_benchmark_runs_and_reports_the_search() -> None:
    result = run_one("same", 1, classes())
    assert result.step == "constraints" and result.runs >= 1 and result.steps > 0
    assert "gpu.tessera.dev/uuid" in result.reason
    assert "| same " in report([result])
