"""CPU exhaustion (issue 12, item 1): selectors that exceed cel-cpp's iteration budget and the per-review
deadline. The server's bounds on concurrent reviews are in test_webhook_overload.py.

Performance itself is measured in benchmarks/webhook_load_bench.py; these tests pin the behaviour."""

from __future__ import annotations

import http.client
import json
import time
from typing import Any

import pytest

from controller.admission import AdmissionHandler
from controller.checks.inputs import CheckContext
from controller.cluster.inventory import DeviceIndex
from controller.cluster.matching import Evaluator
from controller.cluster.sampledevices import sample_index
from controller.cluster.schema import published_schema
from controller.webhook import CertificateStore, WebhookServer
from driver.cel import CelBudgetExceeded, compile_selector, device_view
from driver.cel.limits import MAX_COST
from driver.discovery import load_inventory
from driver.slices import build_slices
from tests.builders.admission import claim, review
from tests.builders.webhook import CA, connect, post
from tests.fakes.cluster import device_class

D = 'device.attributes["gpu.tessera.dev"]'
HUNDRED = "[" + ", ".join(str(i) for i in range(100)) + "]"
# Both pass the cost estimate (Kubernetes admits them and its scheduler runs them in milliseconds), and
# both need more than cel-cpp's 10,000 iterations: they used to be re-run on cel-python for 4-11 s.
NESTED = f"{HUNDRED}.all(a, {HUNDRED}.all(b, a + b >= 0))"
RANGE = "lists.range(20000).all(a, a >= 0)"
INDEX = DeviceIndex.from_slices(build_slices(load_inventory("node-a", simulate="dgx-h100-8"), mig_strategy="static"))
GPU = device_view("gpu.tessera.dev", {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}},
                                      "capacity": {"memory": {"value": "80Gi"}}})


@pytest.fixture
def no_celpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything compiles a selector on cel-python."""
    from driver.cel import engine_celpy

    def refuse(*_: Any) -> Any:
        raise AssertionError("a selector was handed to cel-python")

    monkeypatch.setattr(engine_celpy.CelPyEngine, "compile", refuse)


# -- the engine --------------------------------------------------------------------------------------


@pytest.mark.parametrize("expression", [NESTED, RANGE])
def test_selector_over_the_iteration_budget_is_not_rerun_on_celpy(no_celpy: None, expression: str) -> None:
    selector = compile_selector(expression, engine="celexpr")
    assert selector.estimated_cost <= MAX_COST
    with pytest.raises(CelBudgetExceeded) as info:
        selector.evaluate(GPU)
    message = info.value.message
    assert "10,000 or more comprehension iterations" in message
    assert f"estimated cost {selector.estimated_cost:,}" in message


def test_selector_within_the_budget_is_evaluated(no_celpy: None) -> None:
    just_under = f"{HUNDRED[:-1]}].all(a, lists.range(98).all(b, a + b >= 0))"
    assert compile_selector(just_under, engine="celexpr").evaluate(GPU) is True


def test_celpy_still_evaluates_when_chosen_by_name() -> None:
    assert compile_selector("lists.range(200).all(a, a >= 0)", engine="celpy").evaluate(GPU) is True


# -- the checks ----------------------------------------------------------------------------------------


def context(**overrides: Any) -> CheckContext:
    fields: dict[str, Any] = {"schema": published_schema(), "samples": sample_index(), "inventory": INDEX,
                              "classes": {}, "classes_complete": True}
    return CheckContext(**{**fields, **overrides})


@pytest.mark.parametrize("expression", [NESTED, RANGE, f'{D}.type == "gpu" && {RANGE}'])
def test_class_over_the_budget_is_admitted_with_a_warning_naming_the_cost(no_celpy: None, expression: str) -> None:
    handler = AdmissionHandler(context)
    _, verdict = handler.review("/validate-deviceclass", review(device_class("x.gpu.tessera.dev", expression)))
    assert verdict.allowed, verdict.message
    (warning,) = verdict.warnings
    assert warning.startswith("spec.selectors[0].cel.expression: tessera did not evaluate")
    assert "estimated cost" in warning and "The scheduler evaluates it in full" in warning


def test_claim_over_the_budget_is_admitted_with_one_warning(no_celpy: None) -> None:
    spec = {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.tessera.dev",
                                                               "selectors": [{"cel": {"expression": RANGE}}]}}]}}
    classes = {"gpu.tessera.dev": device_class("gpu.tessera.dev", f'{D}.type == "gpu"')}
    handler = AdmissionHandler(lambda: context(classes=classes))
    _, verdict = handler.review("/validate-resourceclaim", review(claim(spec)))
    assert verdict.allowed
    paths = [w.split(":")[0] for w in verdict.warnings]
    assert paths == ["spec.devices.requests[0].exactly.selectors[0].cel.expression"]


# -- the deadline -----------------------------------------------------------------------------------------


class Recorder:
    """A context factory that keeps the contexts it made, to count the evaluations each review ran."""

    def __init__(self) -> None:
        self.made: list[CheckContext] = []

    def __call__(self) -> CheckContext:
        ctx = context()
        self.made.append(ctx)
        return ctx


MANY = [f'{D}.productName.contains("H{i}")' for i in range(8)]  # eight selectors, evaluated one by one


@pytest.mark.parametrize(("on_deadline", "allowed"), [("deny", False), ("allow", True)])
def test_review_past_its_deadline_is_answered_cut_short_and_stops_evaluating(on_deadline, allowed) -> None:
    contexts = Recorder()
    handler = AdmissionHandler(contexts, on_deadline=on_deadline)
    obj = device_class("slow.gpu.tessera.dev", *MANY)
    _, verdict = handler.review("/validate-deviceclass", review(obj), deadline=time.monotonic() - 0.001)
    assert verdict.allowed is allowed
    assert verdict.outcome == "cut-short"
    text = verdict.message if not allowed else verdict.warnings[0]
    assert 'DeviceClass "slow.gpu.tessera.dev"' in text and "deadline passed after 0 selector evaluations" in text
    assert ("failurePolicy Fail" if not allowed else "failurePolicy Ignore") in text
    assert contexts.made[-1].evaluator.evaluations == 0
    # the same review without a deadline runs them all
    _, full = handler.review("/validate-deviceclass", review(obj))
    assert full.outcome != "cut-short" and contexts.made[-1].evaluator.evaluations >= 1


def test_evaluator_checks_the_deadline_before_each_evaluation() -> None:
    from controller.cluster.matching import Condition, ReviewDeadlineExceeded

    evaluator = Evaluator(deadline=time.monotonic() + 3600)
    device = INDEX.devices[0]
    condition = Condition("test", "p", "true", compile_selector("true"))
    assert evaluator.outcome(condition, device) is True
    evaluator.deadline = time.monotonic() - 1
    assert evaluator.outcome(condition, device) is True  # memoised: no new work
    other = Condition("test", "p", "false", compile_selector("false"))
    with pytest.raises(ReviewDeadlineExceeded, match="after 1 selector evaluations"):
        evaluator.outcome(other, device)


# -- the server ---------------------------------------------------------------------------------------------


def test_hostile_selectors_over_https_answer_with_a_warning(tmp_path, no_celpy: None) -> None:
    ca = CA()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    ca.issue(cert, key)
    srv = WebhookServer(AdmissionHandler(context), CertificateStore(str(cert), str(key)), "127.0.0.1", 0)
    srv.start()
    try:
        conn: http.client.HTTPSConnection = connect(srv, ca)
        for expression in (NESTED, RANGE):
            obj = device_class("x.gpu.tessera.dev", expression)
            status, body = post(conn, "/validate-deviceclass", json.dumps(review(obj)).encode())
            response = json.loads(body)["response"]
            assert status == 200 and response["allowed"] is True
            assert "cel-cpp's fixed budget per device" in response["warnings"][0]
    finally:
        srv.stop()
