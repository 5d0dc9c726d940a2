"""The node agent's metrics server: /healthz as the liveness probe reads it, /metrics, and its listen address."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.builders.plugin import http_get


def test_healthz_waits_for_the_first_publisher_attempt_and_accepts_retrying(in_process: Any) -> None:
    assert in_process.healthz() == (False, "gRPC servers not running")
    in_process.fake.fail_next(10_000)  # the apiserver is down from the start
    in_process.start()
    for _ in range(400):
        if in_process.publisher.errors:
            break
        threading.Event().wait(0.02)
    ok, reason = in_process.healthz()
    assert ok and reason == "ok (publisher retrying)"
    status, body = http_get(in_process.metrics_server.port, "/healthz")
    assert (status, body) == (200, "ok (publisher retrying)\n")
    metrics = http_get(in_process.metrics_server.port, "/metrics")[1]
    assert 'tessera_plugin_publisher_state{state="retrying"} 1.0' in metrics


def test_healthz_reports_synced_publisher(in_process: Any) -> None:
    in_process.start()
    assert in_process.publisher.wait_synced(30)
    assert in_process.healthz() == (True, "ok (publisher synced)")
    assert http_get(in_process.metrics_server.port, "/nope")[0] == 404


def test_unhealthy_when_a_socket_is_down(in_process: Any) -> None:
    in_process.start()
    in_process.registration_server.stop(0)
    status, body = http_get(in_process.metrics_server.port, "/healthz")
    assert (status, body) == (503, "gRPC servers not running\n")


@pytest.mark.parametrize(
    ("addr", "expected"),
    [(":9400", ("0.0.0.0", 9400)), ("127.0.0.1:0", ("127.0.0.1", 0)), ("[::1]:9400", ("::1", 9400))],
)
def test_metrics_addresses(addr: str, expected: tuple[str, int]) -> None:
    from kubeletplugin.metrics import parse_listen_address

    assert parse_listen_address(addr) == expected


@pytest.mark.parametrize(
    ("addr", "message"), [("9400", "HOST:PORT"), ("host:http", "HOST:PORT"), (":70000", "0..65535")]
)
def test_bad_metrics_addresses_are_refused(addr: str, message: str) -> None:
    from kubeletplugin.metrics import parse_listen_address

    with pytest.raises(ValueError, match=message):
        parse_listen_address(addr)


def test_metrics_server_that_cannot_bind_says_where() -> None:
    import socket as socketlib

    from kubeletplugin.metrics import MetricsServer, PluginMetrics

    with socketlib.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = MetricsServer(f"127.0.0.1:{port}", PluginMetrics(), lambda: (True, ""))
        with pytest.raises(OSError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            server.start()


def test_publisher_state_must_be_a_known_one() -> None:
    from kubeletplugin.metrics import PublisherStatus

    with pytest.raises(ValueError, match="publisher state must be one of"):
        PublisherStatus(state="happy", syncs=0, errors=0, last_sync_time=None)
