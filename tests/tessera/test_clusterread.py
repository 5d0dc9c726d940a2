"""tessera.clusterread over tessera's one client (driver.kubeapi.RealKubeAPI), against a small HTTP apiserver:
the kubeconfig found as kubectl finds it, objects read as the apiserver's JSON (no field a generated model
does not know is lost), optional reads that may be refused, and DeviceTaintRules from whichever version the
cluster serves."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from driver.kubeapi import ApiError, KubeConfigError, RealKubeAPI, load_client
from tessera import clusterread as read

REPO = Path(__file__).resolve().parents[2]

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml", "uid": "u1"},
       "spec": {"containers": [{"name": "c", "image": "x"}]},
       "status": {"phase": "Pending", "extendedResourceClaimStatus": {"resourceClaimName": "p-extended-resources-x"},
                  "aFieldFromTheFuture": {"kept": True}}}
EVENT = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "p.1", "namespace": "ml"},
         "involvedObject": {"kind": "Pod", "name": "p", "uid": "u1"}, "reason": "FailedPrepareDynamicResources",
         "message": "Failed to prepare dynamic resources: ..."}
RULE = {"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule", "metadata": {"name": "maintenance"},
        "spec": {"deviceSelector": {"driver": "gpu.tessera.dev", "pool": "node-a"},
                 "taint": {"key": "example.com/maintenance", "effect": "NoSchedule"}}}


class Api:
    """Answers by path; records the queries it got."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, Any]] = {}
        self.queries: dict[str, dict[str, str]] = {}
        self.headers: dict[str, dict[str, str]] = {}  # extra response headers by path
        self.hits: Counter[str] = Counter()  # requests by path
        self.cut: dict[str, int] = {}  # path -> bytes sent before the connection is dropped mid-answer

    def handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                del format, args

            def do_GET(self) -> None:
                url = urlparse(self.path)
                api.queries[url.path] = {k: v[0] for k, v in parse_qs(url.query).items()}
                api.hits[url.path] += 1
                code, body = api.routes.get(url.path, (404, {"kind": "Status", "code": 404, "reason": "NotFound"}))
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in api.headers.get(url.path, {}).items():
                    self.send_header(key, value)
                self.end_headers()
                if url.path in api.cut:
                    self.wfile.write(data[:api.cut[url.path]])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(data)

        return Handler


def kubeconfig(path: Path, server: str, namespace: str = "") -> Path:
    context: dict[str, str] = {"cluster": "c", "user": "u"}
    if namespace:
        context["namespace"] = namespace
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": context}]}))
    return path


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Api, RealKubeAPI]]:
    api = Api()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), api.handler())
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    config = kubeconfig(tmp_path / "config", f"http://127.0.0.1:{httpd.server_address[1]}", "ml")
    try:
        yield api, read.connect(str(config), timeout=5)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_pods_are_read_as_the_apiservers_json(served: tuple[Api, RealKubeAPI]) -> None:
    api, client = served
    api.routes["/api/v1/namespaces/ml/pods"] = (200, {"kind": "PodList", "items": [POD]})
    assert read.pods(client, "ml") == [POD]  # extendedResourceClaimStatus and unknown fields included


def test_prepare_events_are_asked_for_by_pod_and_reason(served: tuple[Api, RealKubeAPI]) -> None:
    api, client = served
    api.routes["/api/v1/namespaces/ml/events"] = (200, {"kind": "EventList", "items": [EVENT]})
    assert read.prepare_events(client, "ml", "p") == [EVENT]
    assert api.queries["/api/v1/namespaces/ml/events"]["fieldSelector"] == (
        "involvedObject.kind=Pod,involvedObject.name=p,reason=FailedPrepareDynamicResources")


def test_an_answer_that_is_not_a_json_object_names_the_read(served: tuple[Api, RealKubeAPI]) -> None:
    api, client = served
    path = "/apis/resource.k8s.io/v1/resourceslices"
    api.routes[path] = (200, b'{"items": [{"spec": {}}, <html>')
    with pytest.raises(read.ReadError, match="cannot read resourceslices: the apiserver's answer is not JSON"):
        read.resource_slices(client)
    api.routes[path] = (200, b"[1, 2]")
    with pytest.raises(read.ReadError, match=r"cannot read resourceslices: .* not an object but list"):
        read.resource_slices(client)
    api.routes[path] = (200, b'{"items": ["\xff"]}')
    with pytest.raises(read.ReadError, match=r"not JSON: .*utf-8"):
        read.resource_slices(client)


def test_an_answer_cut_off_half_way_is_a_failed_read_and_the_next_read_works(
        served: tuple[Api, RealKubeAPI]) -> None:
    """The list is decoded while it arrives: a connection dropped in the middle must still end as the read's
    error (not the HTTP library's, not a half list), and leave nothing broken for the next call."""
    api, client = served
    path = "/apis/resource.k8s.io/v1/resourceslices"
    slices = {"items": [{"metadata": {"name": f"s{i}"}, "spec": {"driver": "gpu.tessera.dev"}} for i in range(500)]}
    api.routes[path] = (200, slices)
    api.cut[path] = len(json.dumps(slices)) // 2
    with pytest.raises(read.ReadError, match=r"cannot read resourceslices: .*(IncompleteRead|Connection broken)"):
        read.resource_slices(client)
    del api.cut[path]
    assert read.resource_slices(client) == slices["items"]
    assert api.hits[path] == 2


def test_taint_rules_come_from_the_first_version_served(served: tuple[Api, RealKubeAPI]) -> None:
    api, client = served
    assert read.taint_rules(client) is None  # 1.36 by default: no version of DeviceTaintRule is served
    api.routes["/apis/resource.k8s.io/v1beta2/devicetaintrules"] = (200, {"items": [RULE]})
    assert read.taint_rules(client) == [RULE]
    assert "/apis/resource.k8s.io/v1/devicetaintrules" in api.queries  # v1 (1.37) was asked first


def test_optional_reads_refused_are_left_out_and_required_ones_name_the_read(
        served: tuple[Api, RealKubeAPI]) -> None:
    api, client = served
    forbidden = (403, {"kind": "Status", "code": 403, "reason": "Forbidden"})
    api.routes["/api/v1/nodes"] = forbidden
    api.routes["/apis/resource.k8s.io/v1/resourceclaims"] = forbidden
    assert read.nodes(client) is None
    with pytest.raises(read.ReadError, match="cannot read resourceclaims in all namespaces: 403"):
        read.resource_claims(client)


@pytest.mark.parametrize(("header", "expected"), [
    ("32", 32.0), ("Wed, 21 Oct 2026 07:28:00 GMT", None), ("", None), ("nan", None), ("-5", None), ("99999", None),
    ("1" * 400, None)])
def test_a_throttled_answer_carries_its_retry_after(served: tuple[Api, RealKubeAPI], header: str,
                                                    expected: float | None) -> None:
    # API Priority and Fairness answers 429 with Retry-After; the node agent waits at least that long
    api, client = served
    path = "/apis/resource.k8s.io/v1/resourceslices"
    api.routes[path] = (429, {"kind": "Status", "code": 429, "reason": "TooManyRequests"})
    if header:
        api.headers[path] = {"Retry-After": header}
    with pytest.raises(ApiError) as caught:
        client.list_resource_slices(field_selector="spec.nodeName=n")
    assert caught.value.throttled and caught.value.status == 429
    assert caught.value.retry_after == expected
    # the 429 reached the caller at once: urllib3's default would have slept out Retry-After three times over
    assert api.hits[path] == 1


def test_the_context_namespace_and_a_merged_kubeconfig_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = kubeconfig(tmp_path / "a", "https://127.0.0.1:1", "ml")
    other = tmp_path / "b"
    other.write_text(json.dumps({"apiVersion": "v1", "kind": "Config", "clusters": [], "contexts": [], "users": []}))
    monkeypatch.setenv("KUBECONFIG", f"{other}:{first}")
    loaded = load_client(None)
    assert (loaded.namespace, loaded.source) == ("ml", f"{other}:{first}")


def test_no_configuration_at_all_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeConfigError, match="from the in-cluster service account"):
        RealKubeAPI()
    with pytest.raises(read.ReadError, match="cannot load the cluster configuration"):
        read.connect()


def test_answers_are_decoded_with_the_collector_paused(served: tuple[Api, RealKubeAPI],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole cluster's slices are millions of objects: the collector's walks over them were two thirds of
    the decode (driver.gcpause). Both the resource.k8s.io and the core API's answers are checked."""
    import gc

    from driver import jsonstream

    api, client = served
    api.routes["/apis/resource.k8s.io/v1/resourceslices"] = (200, {"items": [{"spec": {"driver": "gpu.tessera.dev"}}]})
    api.routes["/api/v1/namespaces/ml/pods"] = (200, {"kind": "PodList", "items": [POD]})
    seen: list[bool] = []
    decode = jsonstream.load

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(gc.isenabled())
        return decode(*args, **kwargs)

    monkeypatch.setattr(jsonstream, "load", spy)
    gc.enable()
    assert read.resource_slices(client) and read.pods(client, "ml") == [POD]
    assert len(seen) == 2 and not any(seen)
    assert gc.isenabled()


def test_a_slice_list_asks_the_watch_cache_only_when_given_a_version(served: tuple[Api, RealKubeAPI]) -> None:
    api, client = served
    path = "/apis/resource.k8s.io/v1/resourceslices"
    api.routes[path] = (200, {"items": []})
    client.list_resource_slices(field_selector="spec.nodeName=n", not_older_than="42")
    assert api.queries[path] == {"fieldSelector": "spec.nodeName=n", "resourceVersion": "42",
                                 "resourceVersionMatch": "NotOlderThan"}
    client.list_resource_slices(field_selector="spec.driver=gpu.tessera.dev")
    assert api.queries[path] == {"fieldSelector": "spec.driver=gpu.tessera.dev"}  # a consistent read


def test_reads_run_together_and_the_first_failure_in_order_is_raised() -> None:
    both = threading.Barrier(2, timeout=5)  # passes only when the two reads are in flight at once

    def meet() -> str:
        both.wait()
        return "ok"

    assert read.read_together({"a": meet, "b": meet}) == {"a": "ok", "b": "ok"}

    def fail(what: str) -> Any:
        raise read.ReadError(f"cannot read {what}")

    with pytest.raises(read.ReadError, match="cannot read slices"):
        read.read_together({"pods": lambda: [], "slices": lambda: fail("slices"), "claims": lambda: fail("claims")})


def _tessera(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tessera", "--log-level", "error", *argv], capture_output=True,
                          text=True, cwd=REPO, timeout=120, check=False)


def test_status_and_explain_as_processes_flush_everything_and_keep_their_exit_code(
        served: tuple[Api, RealKubeAPI], tmp_path: Path) -> None:
    # both leave through os._exit (tessera.cli.entry) without freeing what they read: nothing written may be lost
    api, _ = served
    config = str(tmp_path / "config")
    slices = [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"node-{i}-gpu"},
               "spec": {"driver": "gpu.tessera.dev", "nodeName": f"node-{i}",
                        "pool": {"name": f"node-{i}", "generation": 1, "resourceSliceCount": 1},
                        "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}},
                                     "capacity": {"memory": {"value": "80Gi"}}}]}} for i in range(400)]
    api.routes["/apis/resource.k8s.io/v1/resourceslices"] = (200, {"items": slices})
    api.routes["/apis/resource.k8s.io/v1/resourceclaims"] = (200, {"items": []})
    api.routes["/api/v1/pods"] = (200, {"items": []})
    status = _tessera("status", f"--kubeconfig={config}", "-o", "json")
    assert status.returncode == 0, status.stderr
    assert len(json.loads(status.stdout)["nodes"]) == 400  # the whole document, well past a pipe's buffer
    explain = _tessera("explain", "pod/missing", "-n", "ml", f"--kubeconfig={config}")
    assert (explain.returncode, explain.stderr) == (2, "tessera explain: cannot read deviceclasses: 404 Not Found\n")
    api.routes["/apis/resource.k8s.io/v1/deviceclasses"] = (200, {"items": []})
    explain = _tessera("explain", "pod/missing", "-n", "ml", f"--kubeconfig={config}")
    assert explain.returncode == 2 and "missing" in explain.stderr and "not found" in explain.stderr, explain.stderr
