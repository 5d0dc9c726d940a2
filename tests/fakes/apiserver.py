"""One in-memory apiserver for the tests and the benchmarks, and an HTTP front for it.

FakeKubeAPI answers the calls of driver.kubeapi.KubeAPI (Nodes, ResourceClaims, ResourceSlices and a
slice watch) from dicts, so a prepare or a publish runs with no network, TLS, etcd or admission in
the way: the benchmarks that isolate tessera's own cost use it for that, the unit tests for its test
controls (`fail_next`, `on_call`, `calls`, out-of-band edits). Objects are copied in and out, as an
apiserver decodes and encodes them, so the code under test cannot keep references into the store.
FakeApiServer serves the same store over HTTP for a real `tessera kubelet-plugin` process.
"""

from __future__ import annotations

import copy
import json
import queue
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from driver.kubeapi import ApiError, Obj, WatchEvent


def _field(obj: Obj, path: str) -> str:
    cur: object = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)  # a missing field compares as empty, as the apiserver's does


def _matches(obj: Obj, field_selector: str = "", label_selector: str = "") -> bool:
    fields = (term.partition("=") for term in filter(None, field_selector.split(",")))
    labels = (term.partition("=") for term in filter(None, label_selector.split(",")))
    have = obj.get("metadata", {}).get("labels") or {}
    return all(_field(obj, key) == want for key, _, want in fields) and all(
        have.get(key) == want for key, _, want in labels
    )


class FakeKubeAPI:
    """Keeps objects in dicts, assigns resourceVersions and uids, and streams watch events.

    `fail_next(n, status)` makes the next n calls fail as an unreachable or erroring apiserver would.
    `calls` lists every call made, unless `record_calls` is off (a long benchmark need not keep them).
    """

    def __init__(self, *, record_calls: bool = True) -> None:
        self._lock = threading.Lock()
        self._rv = 0
        self.nodes: dict[str, Obj] = {}
        self.claims: dict[tuple[str, str], Obj] = {}
        self.slices: dict[str, Obj] = {}
        self.calls: list[str] = []
        self.list_versions: list[str] = []  # not_older_than of every slice list, in order
        self._record_calls = record_calls
        self._failures: list[ApiError] = []
        self._watchers: list[queue.Queue[WatchEvent | None]] = []
        self.on_call: Callable[[str], None] | None = None

    # -- test controls -------------------------------------------------------------------
    def fail_next(self, count: int, status: int = 0, reason: str = "Unreachable",
                  retry_after: float | None = None) -> None:
        with self._lock:
            self._failures.extend(ApiError(status, reason, "injected", retry_after=retry_after) for _ in range(count))

    def add_node(self, name: str) -> Obj:
        node: Obj = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": str(uuid.uuid4())}}
        self.nodes[name] = node
        return node

    def add_claim(self, claim: Obj) -> Obj:
        claim = copy.deepcopy(claim)
        meta = claim.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("namespace", "default")
        self.claims[(meta["namespace"], meta["name"])] = claim
        return claim

    def close_watches(self) -> None:
        with self._lock:
            for q in self._watchers:
                q.put(None)

    # -- internals -----------------------------------------------------------------------
    def _enter(self, call: str) -> None:
        if self._record_calls:
            self.calls.append(call)
        if self.on_call:
            self.on_call(call)
        with self._lock:
            if self._failures:
                raise self._failures.pop(0)

    def _bump(self, obj: Obj) -> Obj:
        self._rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
        return obj

    def _emit(self, type_: str, obj: Obj) -> None:
        # called with the lock held, so watchers see events in resourceVersion order
        for q in self._watchers:
            q.put(WatchEvent(type_, copy.deepcopy(obj)))

    # -- KubeAPI -------------------------------------------------------------------------
    def get_node(self, name: str) -> Obj:
        self._enter(f"get_node {name}")
        if name not in self.nodes:
            raise ApiError(404, "NotFound", f"nodes {name!r} not found")
        return copy.deepcopy(self.nodes[name])

    def get_resource_claim(self, namespace: str, name: str) -> Obj:
        self._enter(f"get_claim {namespace}/{name}")
        with self._lock:
            if (namespace, name) not in self.claims:
                raise ApiError(404, "NotFound", f"resourceclaims {name!r} not found")
            return copy.deepcopy(self.claims[(namespace, name)])

    def list_resource_slices(self, field_selector: str = "", label_selector: str = "",
                             not_older_than: str = "") -> Obj:
        self.list_versions.append(not_older_than)
        self._enter("list_slices")
        with self._lock:
            items = [copy.deepcopy(s) for s in self.slices.values() if _matches(s, field_selector, label_selector)]
            return {"kind": "ResourceSliceList", "metadata": {"resourceVersion": str(self._rv)}, "items": items}

    def create_resource_slice(self, body: Obj) -> Obj:
        self._enter("create_slice")
        with self._lock:
            body = copy.deepcopy(body)
            meta = body.setdefault("metadata", {})
            if not meta.get("name"):
                meta["name"] = meta.get("generateName", "slice-") + uuid.uuid4().hex[:5]
            name = meta["name"]
            if name in self.slices:
                raise ApiError(409, "AlreadyExists", f"resourceslices {name!r} already exists")
            meta["uid"] = str(uuid.uuid4())
            self.slices[name] = self._bump(body)
            self._emit("ADDED", body)
            return copy.deepcopy(body)

    def replace_resource_slice(self, name: str, body: Obj) -> Obj:
        self._enter("replace_slice")
        with self._lock:
            if name not in self.slices:
                raise ApiError(404, "NotFound", f"resourceslices {name!r} not found")
            cur = self.slices[name]
            want_rv = body.get("metadata", {}).get("resourceVersion")
            if want_rv and want_rv != cur["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", "the object has been modified")
            body = copy.deepcopy(body)
            body.setdefault("metadata", {})["uid"] = cur["metadata"]["uid"]
            self.slices[name] = self._bump(body)
            self._emit("MODIFIED", body)
            return copy.deepcopy(body)

    def delete_resource_slice(self, name: str) -> None:
        self._enter("delete_slice")
        with self._lock:
            if name not in self.slices:
                raise ApiError(404, "NotFound", f"resourceslices {name!r} not found")
            obj = self.slices.pop(name)
            self._rv += 1
            self._emit("DELETED", obj)

    def watch_resource_slices(
        self, resource_version: str, field_selector: str = "", timeout_seconds: int = 60
    ) -> Iterator[WatchEvent]:
        # Registered at the call, not at the first next(): changes made in between are not lost, as
        # they are not from a real watch started at a resourceVersion. Injected failures still come at
        # the first next(), where the real client's generator raises them.
        q: queue.Queue[WatchEvent | None] = queue.Queue()
        with self._lock:
            self._watchers.append(q)
        return self._stream(q, field_selector, timeout_seconds)

    def _stream(
        self, q: queue.Queue[WatchEvent | None], field_selector: str, timeout_seconds: int
    ) -> Iterator[WatchEvent]:
        try:
            self._enter("watch_slices")
            while True:
                try:
                    event = q.get(timeout=timeout_seconds)
                except queue.Empty:
                    return
                if event is None:
                    return
                if _matches(event.object, field_selector):
                    yield event
        finally:
            with self._lock:
                self._watchers.remove(q)

    # -- out-of-band edits (another client, kubelet wiping slices) -------------------------
    def external_delete_slice(self, name: str) -> None:
        with self._lock:
            obj = self.slices.pop(name)
            self._rv += 1
            self._emit("DELETED", obj)

    def external_edit_slice(self, name: str, mutate: Callable[[Obj], None]) -> None:
        with self._lock:
            obj = self.slices[name]
            mutate(obj)
            self._bump(obj)
            self._emit("MODIFIED", obj)

    def wipe_node(self, node_name: str) -> int:
        """What kubelet does at start: delete every slice of the node, whoever wrote it."""
        with self._lock:
            names = [n for n, s in self.slices.items() if s.get("spec", {}).get("nodeName") == node_name]
            for name in names:
                obj = self.slices.pop(name)
                self._rv += 1
                self._emit("DELETED", obj)
            return len(names)


_SLICES = re.compile(r"^/apis/resource\.k8s\.io/v1/resourceslices(?:/(?P<name>[^/]+))?$")
_CLAIM = re.compile(r"^/apis/resource\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/resourceclaims/(?P<name>[^/]+)$")
_NODE = re.compile(r"^/api/v1/nodes/(?P<name>[^/]+)$")


class FakeApiServer:
    """Serves a FakeKubeAPI on 127.0.0.1 for the REST calls driver.kubeapi.RealKubeAPI makes."""

    def __init__(self, fake: FakeKubeAPI) -> None:
        self.fake = fake
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), http_handler(fake))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.fake.close_watches()
        self._httpd.shutdown()
        self._httpd.server_close()

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "plugin", "user": {"token": "test"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "plugin"}}],
                    "current-context": "fake",
                }
            )
        )
        return path


def http_handler(fake: FakeKubeAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            del format, args

        def _send(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, exc: ApiError) -> None:
            self._send(
                exc.status or 500,
                {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": exc.message or str(exc),
                 "reason": exc.reason, "code": exc.status},
            )

        def _body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length)) if length else {}

        def _route(self, method: str) -> None:
            url = urlparse(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            try:
                if m := _NODE.match(url.path):
                    if method == "GET":
                        return self._send(200, fake.get_node(m["name"]))
                elif m := _CLAIM.match(url.path):
                    if method == "GET":
                        return self._send(200, fake.get_resource_claim(m["ns"], m["name"]))
                elif m := _SLICES.match(url.path):
                    name = m["name"]
                    if method == "GET" and name is None and query.get("watch", "").lower() in ("true", "1"):
                        return self._watch(query)
                    if method == "GET" and name is None:
                        selectors = (query.get("fieldSelector", ""), query.get("labelSelector", ""))
                        return self._send(200, fake.list_resource_slices(*selectors))
                    if method == "POST" and name is None:
                        return self._send(201, fake.create_resource_slice(self._body()))
                    if method == "PUT" and name:
                        return self._send(200, fake.replace_resource_slice(name, self._body()))
                    if method == "DELETE" and name:
                        fake.delete_resource_slice(name)
                        return self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
                return self._send(404, {"kind": "Status", "code": 404, "reason": "NotFound", "message": url.path})
            except ApiError as exc:
                return self._error(exc)

        def _watch(self, query: dict[str, str]) -> None:
            events = fake.watch_resource_slices(
                query.get("resourceVersion", ""), query.get("fieldSelector", ""),
                int(query.get("timeoutSeconds", "60")),
            )
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()  # HTTP/1.0 without a length: the stream ends when the connection closes
            try:
                for event in events:
                    self.wfile.write(json.dumps({"type": event.type, "object": event.object}).encode() + b"\n")
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                events.close()  # type: ignore[attr-defined]  # a generator: closing unregisters the watcher

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

        def do_PUT(self) -> None:
            self._route("PUT")

        def do_DELETE(self) -> None:
            self._route("DELETE")

    return Handler
