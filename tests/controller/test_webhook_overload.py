"""Overload is never a denial (issue 24, item 5): a review the server has no place for, or cannot finish
before its deadline, is an HTTP 429 or 503 that the apiserver retries or hands to failurePolicy; one
client cannot take every place; free slots go to clients in turn; probes answer while every slot is
taken. Reviews are held in their slots by a context factory that blocks until released."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from controller.admission import AdmissionHandler
from controller.checks.inputs import CheckContext
from controller.cluster.inventory import DeviceIndex
from controller.cluster.sampledevices import sample_index
from controller.cluster.schema import published_schema
from controller.reviewqueue import Overloaded, ReviewQueue
from controller.webhook import CertificateStore, WebhookServer
from driver.discovery import load_inventory
from driver.slices import build_slices
from tests.builders.admission import review
from tests.builders.webhook import CA, client_context, connect, post
from tests.fakes.cluster import device_class

D = 'device.attributes["gpu.tessera.dev"]'
CLASS = json.dumps(review(device_class("gpu.tessera.dev", "true"))).encode()


def context() -> CheckContext:
    return CheckContext(schema=published_schema(), samples=sample_index())


class Gate:
    """A context factory that blocks every review until released, counting those inside."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.inside = 0
        self.lock = threading.Lock()

    def __call__(self) -> CheckContext:
        with self.lock:
            self.inside += 1
        self.release.wait(20)
        return context()


def serve(tmp_path, handler: AdmissionHandler, **options: Any) -> tuple[WebhookServer, CA]:
    ca = CA()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    ca.issue(cert, key)
    srv = WebhookServer(handler, CertificateStore(str(cert), str(key)), "127.0.0.1", 0,
                        probe=("127.0.0.1", 0), **options)
    srv.start()
    return srv, ca


@pytest.fixture
def gated(tmp_path) -> Iterator[tuple[WebhookServer, CA, Gate]]:
    gate = Gate()
    srv, ca = serve(tmp_path, AdmissionHandler(gate), max_reviews=2, max_waiting_reviews=1,
                    max_reviews_per_client=3, review_deadline_s=30)
    try:
        yield srv, ca, gate
    finally:
        gate.release.set()
        srv.stop()


def send(srv: WebhookServer, ca: CA, path: str = "/validate-deviceclass", *,
         source: str = "127.0.0.1") -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPSConnection("127.0.0.1", srv.port, context=client_context(ca), timeout=10,
                                       source_address=(source, 0))
    conn.request("POST", path, body=CLASS, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, dict(response.getheaders()), response.read()


def in_background(srv: WebhookServer, ca: CA, results: list[Any], count: int, **kwargs: Any) -> list[threading.Thread]:
    threads = [threading.Thread(target=lambda: results.append(send(srv, ca, **kwargs))) for _ in range(count)]
    for t in threads:
        t.start()
    return threads


def wait_until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert predicate()


def probe(srv: WebhookServer, path: str, *, port: int | None = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port or srv.probe_port, timeout=1)
    conn.request("GET", path)
    return conn.getresponse().status


def test_a_review_with_no_place_left_is_a_503_to_retry_not_a_denial(gated) -> None:
    srv, ca, gate = gated
    results: list[Any] = []
    threads = in_background(srv, ca, results, 3)
    wait_until(lambda: gate.inside == 2 and srv.queue.queued == 1)
    status, headers, body = send(srv, ca)
    assert status == 503, body
    assert headers["Retry-After"] == "1"
    answer = json.loads(body)
    assert (answer["kind"], answer["code"], answer["reason"]) == ("Status", 503, "ServiceUnavailable")
    assert "2 reviews running and 1 admitted behind them" in answer["message"]
    assert "not reviewed" in answer["message"]
    # probes answer at once while every place is taken: on their port, and on the review port
    assert probe(srv, "/healthz") == 200 and probe(srv, "/readyz") == 200
    review_port = connect(srv, ca)
    review_port.request("GET", "/readyz")
    assert review_port.getresponse().status == 200
    gate.release.set()
    for t in threads:
        t.join(10)
    assert [json.loads(b)["response"]["allowed"] for _, _, b in results] == [True, True, True]


def test_one_client_over_its_share_gets_429_and_another_client_still_gets_in(tmp_path) -> None:
    gate = Gate()
    srv, ca = serve(tmp_path, AdmissionHandler(gate), max_reviews=1, max_waiting_reviews=4, max_reviews_per_client=2,
                    review_deadline_s=30)
    try:
        results: list[Any] = []
        threads = in_background(srv, ca, results, 2)  # the hostile client's share: one runs, one waits
        wait_until(lambda: gate.inside == 1 and srv.queue.queued == 1)
        status, headers, body = send(srv, ca)
        assert status == 429, body
        assert headers["Retry-After"] == "1"
        assert "this client already has 2 reviews in flight" in json.loads(body)["message"]
        # another address (the apiserver, another pod) still has its places
        threads += in_background(srv, ca, results, 1, source="127.0.0.2")
        wait_until(lambda: srv.queue.queued == 2)
        gate.release.set()
        for t in threads:
            t.join(10)
        assert sorted(s for s, _, _ in results) == [200, 200, 200]
    finally:
        gate.release.set()
        srv.stop()


def test_a_review_still_waiting_at_its_deadline_is_a_503_not_a_denial(gated) -> None:
    srv, ca, gate = gated
    results: list[Any] = []
    threads = in_background(srv, ca, results, 2)
    wait_until(lambda: gate.inside == 2)
    started = time.monotonic()
    status, headers, body = send(srv, ca, "/validate-deviceclass?timeout=2s")  # 0.5 s to find a slot
    assert status == 503, body
    assert "no review slot came free before its deadline" in json.loads(body)["message"]
    assert "Retry-After" not in headers  # the apiserver's own deadline is as near: a retry comes too late
    assert time.monotonic() - started < 3
    gate.release.set()
    for t in threads:
        t.join(10)


MANY = [f'{D}.productName.contains("H{i}")' for i in range(8)]  # eight selectors, evaluated one by one


def with_inventory() -> CheckContext:
    index = DeviceIndex.from_slices(build_slices(load_inventory("node-a", simulate="dgx-h100-8"),
                                                 mig_strategy="static"))
    return CheckContext(schema=published_schema(), samples=sample_index(), inventory=index, classes={},
                        classes_complete=True)


@pytest.mark.parametrize("on_deadline", ["deny", "allow"])
def test_a_review_cut_short_is_a_503_under_deny_and_a_warning_under_allow(tmp_path, on_deadline) -> None:
    srv, ca = serve(tmp_path, AdmissionHandler(with_inventory, on_deadline=on_deadline))
    try:
        srv.review_deadline_s = 1e-9  # passed before the first selector is evaluated
        body = json.dumps(review(device_class("slow.gpu.tessera.dev", *MANY))).encode()
        status, answer = post(connect(srv, ca), "/validate-deviceclass", body)
    finally:
        srv.stop()
    if on_deadline == "deny":
        assert status == 503, answer
        status_obj = json.loads(answer)
        assert status_obj["kind"] == "Status" and "could not finish checking" in status_obj["message"]
    else:
        assert status == 200
        response = json.loads(answer)["response"]
        assert response["allowed"] is True and "admitted unchecked" in response["warnings"][0]


def test_deadline_follows_the_apiservers_timeout_parameter(gated) -> None:
    srv, _, _ = gated
    srv.review_deadline_s = 3.0
    assert srv.deadline_for("/validate-deviceclass") == 3.0
    assert srv.deadline_for("/validate-deviceclass?timeout=10s") == 3.0
    assert srv.deadline_for("timeout=4s") == 2.5
    assert srv.deadline_for("/validate-deviceclass?timeout=1s") == 0.5


# -- the queue on its own -----------------------------------------------------------------------------------


def test_free_slots_go_to_clients_in_turn() -> None:
    async def scenario() -> list[str]:
        queue = ReviewQueue(running=1, waiting=10, per_client=10)
        holder = queue.admit("a")
        await queue.start(holder, deadline=asyncio.get_running_loop().time() + 10)
        order: list[str] = []

        async def one(client: str, label: str) -> None:
            ticket = queue.admit(client)
            await queue.start(ticket, deadline=asyncio.get_running_loop().time() + 10)
            order.append(label)
            await asyncio.sleep(0)
            queue.release(ticket)

        tasks = [asyncio.create_task(one("a", f"a{n}")) for n in range(1, 4)]
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(one("b", "b1")))  # queued last, behind three of a's
        await asyncio.sleep(0)
        queue.release(holder)
        await asyncio.gather(*tasks)
        assert queue.admitted == 0 and queue.queued == 0
        return order

    assert asyncio.run(scenario()) == ["a1", "b1", "a2", "a3"]


def test_a_waiter_that_gives_up_leaves_no_trace() -> None:
    async def scenario() -> None:
        queue = ReviewQueue(running=1, waiting=2)
        holder = queue.admit("a")
        await queue.start(holder, deadline=asyncio.get_running_loop().time() + 10)
        late = queue.admit("b")
        with pytest.raises(Overloaded) as info:
            await queue.start(late, deadline=asyncio.get_running_loop().time() + 0.01)
        assert info.value.status == 503 and info.value.retry_after_s is None
        queue.release(late)
        queue.release(holder)
        assert queue.admitted == 0 and queue.queued == 0
        fresh = queue.admit("c")
        await queue.start(fresh, deadline=asyncio.get_running_loop().time() + 1)  # the slot is free again
        queue.release(fresh)

    asyncio.run(scenario())


@pytest.mark.parametrize(("args", "message"), [
    ((0, 4), "at least 1 running review"),
    ((1, -1), "no negative queue"),
    ((1, 4, 0), "at least 1 review in flight"),
])  # fmt: skip
def test_review_queue_rejects_nonsense(args, message) -> None:
    with pytest.raises(ValueError, match=message):
        ReviewQueue(*args)
