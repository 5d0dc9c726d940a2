"""Prometheus metrics of the node agent and the HTTP endpoint that serves them with /healthz.

Metrics live on their own CollectorRegistry (not the process-global one), so two plugins in one test
process never share counters and nothing else in the process leaks into tessera's /metrics.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

log = structlog.get_logger(__name__)

# Prepare covers an apiserver GET, a checkpoint write, a CDI file and maybe an MPS daemon start,
# so the buckets stretch to kubelet's 45 s deadline.
_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 45.0)

# standby: another plugin instance on the node (a rolling update's other pod) publishes
PUBLISHER_STATES = ("starting", "synced", "retrying", "standby", "stopped")

HealthCheck = Callable[[], tuple[bool, str]]


@dataclass(frozen=True)
class PublisherStatus:
    """What the metrics need to know about the ResourceSlice publisher."""

    state: str  # one of PUBLISHER_STATES
    syncs: int  # successful syncs so far
    errors: int  # failed syncs so far
    last_sync_time: float | None  # unix seconds of the last successful sync

    def __post_init__(self) -> None:
        if self.state not in PUBLISHER_STATES:
            raise ValueError(f"publisher state must be one of {PUBLISHER_STATES}, got {self.state!r}")


PublisherStatusFn = Callable[[], PublisherStatus]


class PluginMetrics:
    """Every metric the kubelet plugin exports, on one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.claim_operations = Counter(
            "tessera_plugin_claim_operations",
            "Claims prepared or unprepared, by operation (prepare|unprepare) and result (success|error).",
            ["operation", "result"],
            registry=r,
        )
        self.claim_errors = Counter(
            "tessera_plugin_claim_errors",
            "Per-claim failures returned to kubelet, by operation and reason.",
            ["operation", "reason"],
            registry=r,
        )
        self.claim_duration = Histogram(
            "tessera_plugin_claim_operation_duration_seconds",
            "Time to prepare or unprepare one claim, apiserver GET included.",
            ["operation"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.rpc_duration = Histogram(
            "tessera_plugin_grpc_request_duration_seconds",
            "Time to answer one kubelet DRA call (a batch of claims), by method and API version.",
            ["method", "api_version"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.prepared_devices = Gauge(
            "tessera_plugin_prepared_devices",
            "Devices currently prepared for claims on this node.",
            registry=r,
        )
        self.registered = Gauge(
            "tessera_plugin_kubelet_registered",
            "1 when kubelet's last NotifyRegistrationStatus accepted the plugin, else 0.",
            registry=r,
        )
        self.unhealthy_devices = Gauge(
            "tessera_plugin_unhealthy_devices",
            "Devices currently reported to kubelet as not healthy.",
            registry=r,
        )
        self.health_events = Counter(
            "tessera_plugin_health_events",
            "GPU health events received, by class (xid, ecc-double-bit, gpu-lost, nvlink-down, reset, recovered, "
            "ignored).",
            ["event_class"],
            registry=r,
        )
        self.tainted_devices = Gauge(
            "tessera_plugin_tainted_devices",
            "Published devices that currently carry a health taint, by effect.",
            ["effect"],
            registry=r,
        )
        self._publisher: PublisherStatusFn | None = None
        r.register(_PublisherCollector(self))

    def watch_publisher(self, status: PublisherStatusFn) -> None:
        """Report the ResourceSlice publisher through `status()`, read at every scrape."""
        self._publisher = status

    def publisher_status(self) -> PublisherStatus | None:
        return None if self._publisher is None else self._publisher()

    def observe_claim(self, operation: str, seconds: float, error_reason: str = "") -> None:
        """Record one claim's outcome; `error_reason` empty means success."""
        self.claim_duration.labels(operation=operation).observe(seconds)
        self.claim_operations.labels(operation=operation, result="error" if error_reason else "success").inc()
        if error_reason:
            self.claim_errors.labels(operation=operation, reason=error_reason).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _PublisherCollector(Collector):
    """Reads the publisher's own counters at scrape time, so they can never drift from it."""

    def __init__(self, metrics: PluginMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        status = self._metrics.publisher_status()
        if status is None:
            return
        state = GaugeMetricFamily(
            "tessera_plugin_publisher_state",
            "ResourceSlice publisher state: 1 for the current one (starting|synced|retrying|standby|stopped).",
            labels=["state"],
        )
        for name in PUBLISHER_STATES:
            state.add_metric([name], 1.0 if name == status.state else 0.0)
        yield state
        syncs = CounterMetricFamily(
            "tessera_plugin_publisher_syncs", "ResourceSlice sync attempts, by result.", labels=["result"]
        )
        syncs.add_metric(["success"], float(status.syncs))
        syncs.add_metric(["error"], float(status.errors))
        yield syncs
        if status.last_sync_time is not None:
            yield GaugeMetricFamily(
                "tessera_plugin_publisher_last_sync_timestamp_seconds",
                "When the ResourceSlices were last confirmed in sync with the apiserver.",
                value=status.last_sync_time,
            )


def parse_listen_address(addr: str) -> tuple[str, int]:
    """"HOST:PORT" -> (host, port); an empty host (":9400") means every interface. Raises ValueError."""
    host, sep, port_text = addr.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(f"--metrics-addr must be HOST:PORT or :PORT, got {addr!r}")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"--metrics-addr port must be 0..65535, got {port}")
    host = host.strip("[]")  # "[::1]:9400"
    return host or "0.0.0.0", port


class MetricsServer:
    """HTTP server for /metrics (Prometheus text format) and /healthz (200 ok / 503 with the reason)."""

    def __init__(self, addr: str, metrics: PluginMetrics, health_check: HealthCheck) -> None:
        self._host, self._port = parse_listen_address(addr)
        self._metrics = metrics
        self._health_check = health_check
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        if self._httpd is None:
            return self._port
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        handler = _make_handler(self._metrics, self._health_check)
        try:
            self._httpd = ThreadingHTTPServer((self._host, self._port), handler)
        except OSError as exc:
            raise OSError(f"cannot serve metrics on {self._host}:{self._port}: {exc.strerror or exc}") from exc
        self._httpd.daemon_threads = True
        # A short poll interval keeps shutdown() quick; the loop is idle otherwise.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="metrics-http", daemon=True
        )
        self._thread.start()
        log.info("metrics endpoint listening", host=self._host, port=self.port)

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join()


def _make_handler(metrics: PluginMetrics, health_check: HealthCheck) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._reply(200, CONTENT_TYPE_LATEST, metrics.exposition())
            elif path == "/healthz":
                ok, reason = health_check()
                self._reply(200 if ok else 503, "text/plain; charset=utf-8", (reason or "ok").encode() + b"\n")
            else:
                self._reply(404, "text/plain; charset=utf-8", b"not found: try /metrics or /healthz\n")

        def _reply(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            # Prometheus scrapes every few seconds; an access line per scrape would drown the useful logs.
            del format, args

    return Handler
