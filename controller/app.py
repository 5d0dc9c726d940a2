"""The controller process: inventory cache + admission webhook + metrics, wired together."""

from __future__ import annotations

import sys
from typing import Any

import structlog

from controller.admission import AdmissionHandler, OnDeadline
from controller.checks.inputs import CheckContext
from controller.cluster.informer import ClusterCache, ClusterReader
from controller.cluster.sampledevices import sample_index
from controller.cluster.schema import published_schema
from controller.metrics import ControllerMetrics
from controller.tlsfiles import CertificateStore
from controller.webhook import MAX_REVIEWS, REVIEW_DEADLINE_S, WebhookServer
from driver.cel.environment import NEW, CelEnvironment

log = structlog.get_logger(__name__)

# How long a thread may keep the GIL while another waits for it (CPython's default is 5 ms). A review crosses
# threads a dozen times (event loop, review thread, back); while the snapshot warmer or a reflector decoding
# changed slices is busy, each crossing waited out the whole interval: with slices changing ten times a
# second at 1,000 nodes, reviews through the apiserver took p99 57-99 ms; at 0.5 ms 14-33 ms, and a snapshot
# build about 23% longer (benchmarks/review_contention_bench).
REVIEW_SWITCH_INTERVAL_S = 0.0005


def parse_address(text: str, default_port: int) -> tuple[str, int]:
    """`:8443` -> ("", 8443); `127.0.0.1:0`; `[::1]:8443`. Raises ValueError with the expected form."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = text, str(default_port)
    host = host.strip("[]")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. :8443 or 127.0.0.1:8443)")
    return host, int(port)


class ControllerApp:
    def __init__(
        self,
        api: ClusterReader,
        *,
        tls_cert: str,
        tls_key: str,
        listen: tuple[str, int],
        metrics_addr: tuple[str, int] | None,
        probe_addr: tuple[str, int] | None = None,
        client_ca: str | None = None,
        on_deadline: OnDeadline = "deny",
        max_reviews: int = MAX_REVIEWS,
        max_reviews_per_client: int | None = None,
        review_deadline_s: float = REVIEW_DEADLINE_S,
        cel_environment: CelEnvironment = NEW,
        switch_interval_s: float = REVIEW_SWITCH_INTERVAL_S,
        **cache_options: Any,
    ) -> None:
        self.cel_environment = cel_environment.new_expressions()
        self.metrics = ControllerMetrics(lambda: (self.cache.index(), self.cache.resource_claims()))
        self.cache = ClusterCache(api, **{"warm": True, "on_build": self.metrics.observe_build, **cache_options})
        self.handler = AdmissionHandler(self.context, on_deadline=on_deadline)
        self.webhook = WebhookServer(
            self.handler,
            CertificateStore(tls_cert, tls_key, client_ca),
            listen[0],
            listen[1],
            observe=self.metrics.observe,
            ready=self.cache.synced,
            max_reviews=max_reviews,
            max_reviews_per_client=max_reviews_per_client,
            review_deadline_s=review_deadline_s,
            probe=probe_addr,
        )
        self._metrics_addr = metrics_addr
        self._metrics_server: Any = None
        self._switch_interval_s = switch_interval_s
        self._previous_switch_interval_s: float | None = None

    def context(self) -> CheckContext:
        synced = self.cache.synced()
        return CheckContext(
            schema=published_schema(),
            samples=sample_index(),
            inventory=self.cache.index() if synced else None,
            classes=self.cache.device_classes() if synced else {},
            classes_complete=synced,
            cel_environment=self.cel_environment,
        )

    def start(self) -> None:
        self._previous_switch_interval_s = sys.getswitchinterval()
        sys.setswitchinterval(self._switch_interval_s)
        sample_index()  # build the sample devices before the first review, not during it
        self.cache.start()
        if self._metrics_addr is not None:
            self._metrics_server = self.metrics.serve(*self._metrics_addr)
        self.webhook.start()

    def stop(self) -> None:
        self.webhook.stop()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        self.cache.stop()
        if self._previous_switch_interval_s is not None:
            sys.setswitchinterval(self._previous_switch_interval_s)
        log.info("controller stopped")
