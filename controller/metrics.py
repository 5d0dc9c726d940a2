"""Prometheus metrics of the controller: admission counts and latency, and GPU memory per node
(allocated and free, from the watched claims and slices, computed at scrape time)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controller.cluster.inventory import DeviceIndex
from controller.cluster.memoryusage import memory_usage

Source = Callable[[], tuple[DeviceIndex | None, Iterable[dict[str, Any]]]]


class _MemoryCollector(Collector):
    def __init__(self, source: Source) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        index, claims = self._source()
        total = GaugeMetricFamily(
            "tessera_controller_gpu_memory_total_bytes", "GPU memory tessera publishes per node", labels=["node"]
        )
        allocated = GaugeMetricFamily(
            "tessera_controller_gpu_memory_allocated_bytes",
            "GPU memory held by allocated ResourceClaims per node",
            labels=["node"],
        )
        free = GaugeMetricFamily(
            "tessera_controller_gpu_memory_free_bytes", "GPU memory not allocated per node", labels=["node"]
        )
        devices = GaugeMetricFamily("tessera_controller_devices", "tessera devices published per node", labels=["node"])
        if index is not None:
            for node, usage in memory_usage(index, claims).items():
                total.add_metric([node], usage.total)
                allocated.add_metric([node], usage.allocated)
                free.add_metric([node], usage.free)
            per_node: dict[str, int] = {}
            for device in index.devices:
                per_node[device.node] = per_node.get(device.node, 0) + 1
            for node, count in sorted(per_node.items()):
                devices.add_metric([node], count)
        yield from (total, allocated, free, devices)


class ControllerMetrics:
    """Owns a registry of its own, so tests and several instances never collide."""

    def __init__(self, source: Source | None = None) -> None:
        self.registry = CollectorRegistry()
        self.admissions = Counter(
            "tessera_controller_admission_requests",
            "AdmissionReviews answered, by endpoint, object kind and outcome "
            "(allowed, warned, mutated, denied, cut-short, bad-request, too-large, error; overloaded: a 503 "
            "with no place left, throttled: a 429 to a client over its share)",
            ["endpoint", "kind", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "tessera_controller_admission_duration_seconds",
            "Time to answer one AdmissionReview",
            ["endpoint"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=self.registry,
        )
        self.snapshot_builds = Histogram(
            "tessera_controller_snapshot_build_seconds",
            "Time to rebuild the device snapshot reviews read, after ResourceSlices changed (reviews keep "
            "using the previous snapshot meanwhile); its count is the number of rebuilds",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=self.registry,
        )
        if source is not None:
            self.registry.register(_MemoryCollector(source))

    def observe(self, endpoint: str, kind: str, outcome: str, seconds: float) -> None:
        self.admissions.labels(endpoint, kind, outcome).inc()
        self.latency.labels(endpoint).observe(seconds)

    def observe_build(self, seconds: float) -> None:
        self.snapshot_builds.observe(seconds)

    def serve(self, host: str, port: int) -> Any:
        """Start the /metrics HTTP server; returns the server (call shutdown() on it to stop)."""
        server, _thread = start_http_server(port, addr=host or "0.0.0.0", registry=self.registry)
        return server
