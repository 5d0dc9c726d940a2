"""`tessera explain` searches each node shape once and stops at one overall deadline (issue 24): a claim that
makes the scheduler's search backtrack (8 requests, matchAttribute on uuid between the first and the last)
costs one search however many identical nodes there are, and an answer the deadline cut short says so.
Counted and clocked, never timed."""

from __future__ import annotations

import pytest

import controller.explain.search as search_module
from controller.explain.explain import Budget, ClusterView, Explanation, explain_pod
from controller.explain.render import render_json, render_text
from tests.fakes.cluster import FakeCluster, exactly

UUID = "gpu.tessera.dev/uuid"


def backtracking(c: FakeCluster) -> None:
    """8 whole GPUs in 8 requests, the first and the last on the same card: never possible."""
    c.claim("want", *(exactly(f"r{i}") for i in range(8)),
            constraints=[{"requests": ["r0", "r7"], "matchAttribute": UUID}])
    c.pod("p", "want")


def view(c: FakeCluster) -> ClusterView:
    r = c.reader()
    return ClusterView(r.resource_slices(), r.device_classes(), r.resource_claims(), r.pods("default") or [],
                       r.nodes())


@pytest.fixture
def searches_run(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many searches ran (each one is one allocator run, search._Search), with their step counts."""
    runs: list[int] = []
    original = search_module._Search

    class Counted(original):  # type: ignore[misc,valid-type]
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            runs.append(0)

    monkeypatch.setattr(search_module, "_Search", Counted)
    return runs


def dgx_cluster(nodes: int) -> FakeCluster:
    c = FakeCluster()
    for n in range(nodes):
        c.publish(f"dgx-{n}", "dgx-h100-8")
    c.shipped_classes()
    return c


def test_identical_nodes_are_searched_once(searches_run: list[int]) -> None:
    c = dgx_cluster(4)
    backtracking(c)
    e = explain_pod(view(c), "default", "p", Budget(3600.0))  # counted, not timed: the deadline never comes
    assert e.verdict.step == "constraints" and UUID in e.verdict.reason
    # the claim on the first node (the others have its shape), then once without the constraint (attribution)
    assert len(searches_run) == 2
    assert (e.search.runs, e.search.reused) == (2, 3)
    assert not e.search.cut_short and e.note == ""


def test_nodes_whose_allocations_differ_are_searched_each(searches_run: list[int]) -> None:
    c = dgx_cluster(3)
    c.run_pod("held", "held", ("dgx-1", "gpu-0"), memory="10Gi")  # dgx-1 now has a shape of its own
    c.claim("want", exactly(count=9))  # more than any node has: no search at all
    c.claim("two", exactly(count=2), constraints=[{"matchAttribute": UUID}])  # two devices, one card: never
    c.pod("p", "two")
    e = explain_pod(view(c), "default", "p", Budget(3600.0))
    assert not e.verdict.ok
    assert e.search.runs >= 2 and e.search.reused >= 1


class Clock:
    """A clock that moves `tick` seconds each time it is read."""

    def __init__(self, tick: float = 1.0) -> None:
        self.now = 0.0
        self.tick = tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def distinct_nodes(count: int) -> FakeCluster:
    """DGX nodes that each hold a share of a different size on gpu-0: no two have the same shape."""
    c = dgx_cluster(count)
    for n in range(count):
        c.run_pod(f"h{n}", f"h{n}", (f"dgx-{n}", "gpu-0"), memory=f"{n + 1}Gi")
    return c


def test_the_deadline_stops_the_searches_and_the_answer_says_so(searches_run: list[int]) -> None:
    c = distinct_nodes(6)
    backtracking(c)
    e: Explanation = explain_pod(view(c), "default", "p", Budget(3.0, Clock()))
    assert len(searches_run) < 6  # not every node was searched
    assert e.search.cut_short
    assert "the search budget of 3 s ran out" in e.note and "--search-budget" in e.note
    assert not e.verdict.ok and e.verdict.step == "search-limit"
    assert "--search-budget" in e.verdict.fix
    text = render_text(e)
    assert "Note: the search budget of 3 s ran out" in text
    doc = render_json(e)
    assert doc["search"]["cutShort"] is True and doc["search"]["note"] == e.note


def test_a_budget_that_suffices_is_not_mentioned() -> None:
    c = dgx_cluster(2)
    c.claim("want", exactly(count=2))
    c.pod("p", "want")
    e = explain_pod(view(c), "default", "p", Budget(3.0, Clock(0.01)))
    assert e.verdict.ok and not e.search.cut_short
    assert "Note:" not in render_text(e)
    assert render_json(e)["search"]["cutShort"] is False
