"""Malformed requests and hostile clients against the real HTTPS server (controller/webhook.py): each
gets a 4xx or an AdmissionReview that names the field, never a 500; idle and slow connections are cut
off at their deadlines, cost no thread, and cannot keep reviews or probes out. Timeouts are shortened
per test."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator

import pytest

from controller import webhook
from controller.admission import AdmissionHandler
from controller.checks.inputs import CheckContext
from controller.cluster.sampledevices import sample_index
from controller.cluster.schema import published_schema
from controller.webhook import CertificateStore, WebhookServer
from tests.builders.admission import claim as admission_claim
from tests.builders.admission import multicard_spec
from tests.builders.webhook import CA, admission_review, client_context, connect, post
from tests.fakes.cluster import device_class


@pytest.fixture
def ca() -> CA:
    return CA()


@pytest.fixture
def tls_server(tmp_path, ca) -> Iterator[WebhookServer]:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    ca.issue(cert, key)

    def context() -> CheckContext:
        return CheckContext(schema=published_schema(), samples=sample_index())

    srv = WebhookServer(AdmissionHandler(context), CertificateStore(str(cert), str(key)), "127.0.0.1", 0)
    srv.start()
    yield srv
    srv.stop()


def tls_socket(server: WebhookServer, ca: CA) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return client_context(ca).wrap_socket(raw, server_hostname="127.0.0.1")


def read_until_closed(sock: socket.socket, limit_s: float) -> bytes:
    """Everything the server sends until it closes the connection (or `limit_s` passes: then raise)."""
    sock.settimeout(limit_s)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, ssl.SSLEOFError):
            return data
        if not chunk:
            return data
        data += chunk


# -- Content-Length ----------------------------------------------------------------------------------


@pytest.mark.parametrize("length", ["²", "٣", "1_0", "-5", "+5", "0x10", "1e3", "99999999999999999999"])
def test_content_length_that_is_not_ascii_digits_is_a_400(tls_server, ca, length):
    sock = tls_socket(tls_server, ca)
    sock.sendall(f"POST /validate-deviceclass HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode())
    answer = read_until_closed(sock, 5)
    status_line = answer.split(b"\r\n", 1)[0]
    assert b" 400 " in status_line, answer[:200]
    assert b"Content-Length" in answer


# -- nesting -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [150, 900, 5000])
def test_deeply_nested_admission_review_is_a_400_naming_the_depth(tls_server, ca, depth):
    review = admission_review(device_class("gpu.tessera.dev", "true"))
    review["request"]["object"]["metadata"]["labels"] = "@"
    text = json.dumps(review).replace('"@"', "[" * depth + "]" * depth)
    status, body = post(connect(tls_server, ca), "/validate-deviceclass", text.encode())
    assert status == 400, body
    assert b"nested" in body and b"100" in body


def test_nesting_within_the_limit_is_reviewed(tls_server, ca):
    claim = admission_claim(multicard_spec())
    params = claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    params["sharing"]["extra"] = json.loads("[" * 80 + "]" * 80)
    review = json.dumps(admission_review(claim)).encode()
    status, body = post(connect(tls_server, ca), "/validate-resourceclaim", review)
    assert status == 200
    response = json.loads(body)["response"]
    assert response["allowed"] is False  # an unknown field, named by the strict decoder
    assert "sharing.extra" in response["status"]["message"]


@pytest.mark.parametrize("selector", [
    "(" * 900 + "true" + ")" * 900,
    "[" * 900 + "true" + "]" * 900 + " == []",
    "!" * 900 + "true",
    " && ".join(["true"] * 900),
    "1 + " * 900 + "1 > 0",
    # each of these was a RecursionError (HTTP 500) somewhere between the parser and cel-cpp
    "!" * 249 + "true",
    "-" * 250 + "1 == 1",
    " && ".join(["true"] * 300),
    "1 + " * 300 + "1 > 0",
    "device.attributes" + ".x" * 400 + " == 1",
])  # fmt: skip
def test_deep_selector_is_a_denial_naming_the_nesting(tls_server, ca, selector):
    review = admission_review(device_class("gpu.tessera.dev", selector))
    status, body = post(connect(tls_server, ca), "/validate-deviceclass", json.dumps(review).encode())
    assert status == 200, body
    response = json.loads(body)["response"]
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert "spec.selectors[0].cel.expression" in message
    assert "nested" in message and ("levels" in message or "deep" in message), message


# -- multi-card count ---------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [0, -1, True, "2", 1.5])
@pytest.mark.parametrize("endpoint", ["/mutate-resourceclaim", "/validate-resourceclaim"])
def test_multicard_count_that_is_not_a_positive_number_is_a_denial_naming_the_field(tls_server, ca, count, endpoint):
    claim = admission_claim(multicard_spec(count=count))
    status, body = post(connect(tls_server, ca), endpoint, json.dumps(admission_review(claim)).encode())
    assert status == 200, body
    response = json.loads(body)["response"]
    assert response["allowed"] is False
    assert "spec.devices.requests[0].exactly.count" in response["status"]["message"]
    assert "at least 1" in response["status"]["message"]


# -- slow and idle clients -------------------------------------------------------------------------------


@pytest.fixture
def short_timeouts(tmp_path, ca, monkeypatch) -> Iterator[WebhookServer]:
    """A server whose handshake, header and body deadlines are 1 s (they are read when it starts)."""
    monkeypatch.setattr(webhook, "HANDSHAKE_TIMEOUT_S", 1.0)
    monkeypatch.setattr(webhook, "HEADER_TIMEOUT_S", 1.0)
    monkeypatch.setattr(webhook, "BODY_TIMEOUT_S", 1.0)
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    ca.issue(cert, key)
    srv = WebhookServer(AdmissionHandler(lambda: CheckContext(schema=published_schema(), samples=sample_index())),
                        CertificateStore(str(cert), str(key)), "127.0.0.1", 0)
    srv.start()
    yield srv
    srv.stop()


def test_headers_sent_a_byte_at_a_time_are_cut_off_at_the_header_deadline(short_timeouts, ca):
    sock = tls_socket(short_timeouts, ca)
    started = time.monotonic()
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"
    closed = False
    for byte in request:  # one byte every 0.1 s: well inside any per-recv timeout
        try:
            sock.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            closed = True
            break
        time.sleep(0.1)
        if time.monotonic() - started > 6:
            break
    if not closed:
        assert read_until_closed(sock, 2) == b""
    assert time.monotonic() - started < 4, "a slow client kept its connection past the header deadline"


def test_body_sent_too_slowly_gets_408(short_timeouts, ca):
    sock = tls_socket(short_timeouts, ca)
    sock.sendall(b"POST /validate-deviceclass HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
    started = time.monotonic()
    answer = read_until_closed(sock, 5)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"request body of 1000 bytes not received in time" in answer
    assert time.monotonic() - started < 3


def test_a_tls_handshake_that_never_finishes_is_abandoned(short_timeouts):
    raw = socket.create_connection(("127.0.0.1", short_timeouts.port), timeout=10)
    raw.sendall(b"\x16\x03\x01")  # the start of a ClientHello, then nothing
    started = time.monotonic()
    assert read_until_closed(raw, 5) == b""
    assert time.monotonic() - started < 3


def idle_sockets(port: int, count: int, *, half_handshake: int = 0) -> list[socket.socket]:
    """`count` connections that never speak, and `half_handshake` more that send a ClientHello's first bytes."""
    sockets = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(count + half_handshake)]
    for s in sockets[count:]:
        s.sendall(b"\x16\x03\x01")
    return sockets


def test_idle_connections_do_not_starve_reviews_or_probes(tls_server, ca):
    """Issue 24: 300 idle connections left 3 of 40 reviews answered and every probe failing, because each
    held a worker thread of the old server until its handshake deadline."""
    sockets = idle_sockets(tls_server.port, 300, half_handshake=50)
    try:
        review = json.dumps(admission_review(device_class("gpu.tessera.dev", "true"))).encode()
        for _ in range(3):
            conn = http.client.HTTPSConnection("127.0.0.1", tls_server.port, context=client_context(ca), timeout=3)
            status, _ = post(conn, "/validate-deviceclass", review)
            assert status == 200
            probe = http.client.HTTPSConnection("127.0.0.1", tls_server.port, context=client_context(ca), timeout=1)
            probe.request("GET", "/readyz")
            assert probe.getresponse().status == 200
    finally:
        for s in sockets:
            s.close()


def test_idle_connections_cost_no_threads(tls_server):
    before = threading.active_count()
    sockets = idle_sockets(tls_server.port, 300)
    try:
        deadline = time.monotonic() + 5
        while len(tls_server.listeners[0].connections) < 300 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(tls_server.listeners[0].connections) == 300
        assert threading.active_count() == before
    finally:
        for s in sockets:
            s.close()


def test_over_the_connection_cap_the_least_proven_connection_is_closed(tmp_path, ca, monkeypatch):
    monkeypatch.setattr(webhook, "MAX_CONNECTIONS", 8)
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    ca.issue(cert, key)
    srv = WebhookServer(AdmissionHandler(lambda: CheckContext(schema=published_schema(), samples=sample_index())),
                        CertificateStore(str(cert), str(key)), "127.0.0.1", 0)
    srv.start()
    sockets: list[socket.socket] = []
    try:
        review = json.dumps(admission_review(device_class("gpu.tessera.dev", "true"))).encode()
        served = connect(srv, ca)  # the apiserver's keep-alive connection: it has had an answer
        assert post(served, "/validate-deviceclass", review)[0] == 200
        sockets = idle_sockets(srv.port, 30)
        listener = srv.listeners[0]
        deadline = time.monotonic() + 5
        while listener.evicted < 23 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert listener.evicted >= 23 and len(listener.connections) <= 8
        assert listener.refused == 0
        assert post(served, "/validate-deviceclass", review)[0] == 200  # still the same connection
        fresh = connect(srv, ca)  # and a new one gets in, closing an idle one
        assert post(fresh, "/validate-deviceclass", review)[0] == 200
    finally:
        for s in sockets:
            s.close()
        srv.stop()
