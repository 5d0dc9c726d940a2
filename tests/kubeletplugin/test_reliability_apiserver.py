"""apiserver faults: a 30 s outage while the plugin publishes and kubelet prepares; writers that fight it.

The plugin is the real `tessera kubelet-plugin` process with an ordinary kubeconfig; the apiserver
is test_plugin_process's HTTP stand-in, bound to a fixed port that nothing listens on for the
length of the outage (connection refused, as when the apiserver process is down or restarting).
The plugin is started inside the outage, so its first publish and kubelet's first prepare both
meet a dead apiserver.
"""

from __future__ import annotations

import functools
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.builders.plugin import NODE, PluginProcess, add_share_claim, http_get, uid
from tests.fakes.apiserver import FakeApiServer, FakeKubeAPI, http_handler
from tests.fakes.kubeletclient import KubeletClient, short_tmpdir

OUTAGE_S = 30.0
CONVERGE_TIMEOUT_S = 90.0  # the publisher's backoff is capped at 30 s; this bounds a hang, it times nothing


class OutageApiServer(FakeApiServer):
    """The HTTP stand-in on a fixed port, which can go away and come back."""

    def __init__(self, fake: FakeKubeAPI) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.fake = fake
        self._httpd: ThreadingHTTPServer | None = None  # type: ignore[assignment]  # None while down

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), _chunked_handler(self.fake))
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.fake.close_watches()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None


def _chunked_handler(fake: FakeKubeAPI) -> type[BaseHTTPRequestHandler]:
    """The stand-in's handler with watches sent as HTTP/1.1 chunks, as the apiserver sends them: a
    client reading a plain HTTP/1.0 stream may wait for a full buffer before it sees an event."""
    base = http_handler(fake)

    class Chunked(base):  # type: ignore[misc,valid-type]
        protocol_version = "HTTP/1.1"

        def _watch(self, query: dict[str, str]) -> None:
            events = fake.watch_resource_slices(
                query.get("resourceVersion", ""), query.get("fieldSelector", ""),
                int(query.get("timeoutSeconds", "60")),
            )
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for event in events:
                    line = json.dumps({"type": event.type, "object": event.object}).encode() + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                events.close()  # type: ignore[attr-defined]
            self.close_connection = True

    return Chunked


@pytest.fixture
def down() -> Iterator[OutageApiServer]:
    fake = FakeKubeAPI()
    fake.add_node(NODE)
    server = OutageApiServer(fake)  # not started: the outage is on
    yield server
    server.stop()


def wait_until(check: Any, what: str, timeout: float = CONVERGE_TIMEOUT_S) -> float:
    """Poll `check` until true; returns the seconds it took (reported, never asserted)."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(0.1)
    return time.monotonic() - start


def pool_devices(fake: FakeKubeAPI) -> list[str]:
    return sorted(d["name"] for s in list(fake.slices.values()) if s["spec"]["pool"]["name"] == NODE
                  for d in s["spec"].get("devices", []))  # fmt: skip


@pytest.mark.slow
def test_outage_of_30s_while_publishing_and_preparing_then_convergence(down: OutageApiServer) -> None:
    with short_tmpdir() as root:
        outage(down, root)


def outage(server: OutageApiServer, root: Path) -> None:
    ref = add_share_claim(server.fake, "share", uid(9))
    plugin = PluginProcess(root, server.write_kubeconfig(root / "kubeconfig"))
    try:
        outage_started = time.monotonic()
        running = plugin.start()  # comes up and serves kubelet although its apiserver is gone
        port = int(running["metrics_port"])
        conn = KubeletClient(plugin.paths.kubelet_dir).register()
        attempts = 0
        while time.monotonic() - outage_started < OUTAGE_S:
            answer = conn.prepare([ref])[ref.uid]
            attempts += 1
            # per claim, retryable, and the reason is named; not a gRPC error that fails the whole call
            assert "apiserver unreachable" in answer.error and "kubelet will retry" in answer.error, answer
            assert answer.devices == []
            assert conn.unprepare([ref]) == {ref.uid: ""}  # needs no apiserver
            status, body = http_get(port, "/healthz")
            assert (status, body) == (200, "ok (publisher retrying)\n") or attempts < 5, (status, body)
            assert plugin.proc is not None and plugin.proc.poll() is None, "".join(plugin.lines)
            time.sleep(1.0)
        assert list(plugin.cdi_dir.glob("*.json")) == [], "nothing was prepared for a claim it could not read"
        assert "publisher retrying" in http_get(port, "/healthz")[1]
        # it backs off: a 30 s outage costs a handful of attempts (0.5 s doubling), not one per retry tick
        failed_syncs = metric(http_get(port, "/metrics")[1], 'tessera_plugin_publisher_syncs_total{result="error"}')
        assert 2 <= failed_syncs <= 15, failed_syncs

        server.start()
        expected = sorted(d["name"] for s in plugin_slices() for d in s["spec"].get("devices", []))
        converged = wait_until(lambda: pool_devices(server.fake) == expected, "publishing after the outage")
        answer = conn.prepare([ref])[ref.uid]
        assert answer.error == ""
        assert answer.devices[0]["cdi_device_ids"] == [f"gpu.tessera.dev/claim={uid(9)}-gpu-2"]
        wait_until(lambda: http_get(port, "/healthz")[1] == "ok (publisher synced)\n", "healthz to say synced")
        print(f"outage {OUTAGE_S:.0f} s survived: {attempts} prepare attempts answered with a retryable error, "
              f"{failed_syncs:.0f} publish attempts (backoff); slices published {converged:.1f} s after the "
              "apiserver returned")

        # conflicting writers: another client edits and deletes tessera's slices, again and again
        restores = fight(server.fake)
        print(f"conflicting writes repaired: {restores}")
        assert conn.unprepare([ref]) == {ref.uid: ""}
        conn.close()
    finally:
        plugin.kill()


def metric(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} not in /metrics:\n{text}")


def plugin_slices() -> list[dict[str, Any]]:
    from driver.discovery import load_inventory
    from driver.slices import build_slices

    return build_slices(load_inventory(NODE, simulate="mixed"), mig_strategy="static")


def vandalize(obj: dict[str, Any], mark: str) -> None:
    obj["spec"]["devices"] = obj["spec"]["devices"][:1]
    obj["spec"]["devices"][0]["attributes"] = {"vandal": {"string": mark}}


def fight(fake: FakeKubeAPI, rounds: int = 10) -> int:
    expected = pool_devices(fake)
    (name,) = [n for n, s in fake.slices.items() if s["spec"]["pool"]["name"] == NODE]
    for n in range(rounds):
        if n % 2 == 0:
            fake.external_edit_slice(name, functools.partial(vandalize, mark=f"round-{n}"))
        else:
            fake.external_delete_slice(name)

        def restored() -> bool:
            mine = [s for s in list(fake.slices.values()) if s["spec"]["pool"]["name"] == NODE]
            return pool_devices(fake) == expected and not any(
                "vandal" in d.get("attributes", {}) for s in mine for d in s["spec"].get("devices", []))

        wait_until(restored, f"tessera to restore its slice (round {n})")
        (name,) = [n for n, s in fake.slices.items() if s["spec"]["pool"]["name"] == NODE]
    return rounds
