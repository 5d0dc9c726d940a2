"""An in-memory apiserver for the benchmarks that isolate tessera's own cost.

It answers the calls of driver.kubeapi.KubeAPI from dicts, so a prepare or a publish measured
against it shows what tessera spends, with no network, TLS, etcd or apiserver admission in the way.
Objects are copied in and out, as an apiserver decodes and encodes them, so tessera cannot keep
references into the store.
"""

from __future__ import annotations

import copy
import queue
import threading
import uuid
from collections.abc import Iterator

from driver.kubeapi import ApiError, Obj, WatchEvent


def _field(obj: Obj, path: str) -> str:
    cur: object = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)


def _matches(obj: Obj, field_selector: str) -> bool:
    for term in filter(None, field_selector.split(",")):
        key, _, want = term.partition("=")
        if _field(obj, key) != want:
            return False
    return True


class MemoryKubeAPI:
    """Nodes, ResourceClaims and ResourceSlices in memory, with resourceVersions and a slice watch."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rv = 0
        self.nodes: dict[str, Obj] = {}
        self.claims: dict[tuple[str, str], Obj] = {}
        self.slices: dict[str, Obj] = {}
        self._watchers: list[queue.Queue[WatchEvent]] = []

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    # -- objects the benchmarks put in place ----------------------------------------------------
    def add_node(self, name: str) -> Obj:
        with self._lock:
            node: Obj = {"apiVersion": "v1", "kind": "Node",
                         "metadata": {"name": name, "uid": str(uuid.uuid4()), "resourceVersion": self._next_rv()}}
            self.nodes[name] = node
            return copy.deepcopy(node)

    def add_claim(self, claim: Obj) -> None:
        meta = claim["metadata"]
        with self._lock:
            self.claims[(meta["namespace"], meta["name"])] = copy.deepcopy(claim)

    # -- KubeAPI --------------------------------------------------------------------------------
    def get_node(self, name: str) -> Obj:
        with self._lock:
            if name not in self.nodes:
                raise ApiError(404, "NotFound", f'nodes "{name}" not found')
            return copy.deepcopy(self.nodes[name])

    def get_resource_claim(self, namespace: str, name: str) -> Obj:
        with self._lock:
            claim = self.claims.get((namespace, name))
            if claim is None:
                raise ApiError(404, "NotFound", f'resourceclaims "{name}" not found')
            return copy.deepcopy(claim)

    def list_resource_slices(self, field_selector: str = "", label_selector: str = "") -> Obj:
        wanted = dict(t.partition("=")[::2] for t in filter(None, label_selector.split(",")))
        with self._lock:
            items = [copy.deepcopy(s) for s in self.slices.values() if _matches(s, field_selector)
                     and all(s["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())]
            return {"kind": "ResourceSliceList", "metadata": {"resourceVersion": str(self._rv)}, "items": items}

    def create_resource_slice(self, body: Obj) -> Obj:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        with self._lock:
            if not meta.get("name"):
                meta["name"] = f"{meta.get('generateName', 'slice-')}{uuid.uuid4().hex[:5]}"
            if meta["name"] in self.slices:
                raise ApiError(409, "AlreadyExists", f'resourceslices "{meta["name"]}" already exists')
            meta.update(uid=str(uuid.uuid4()), resourceVersion=self._next_rv())
            self.slices[meta["name"]] = obj
            self._notify("ADDED", obj)
            return copy.deepcopy(obj)

    def replace_resource_slice(self, name: str, body: Obj) -> Obj:
        obj = copy.deepcopy(body)
        with self._lock:
            current = self.slices.get(name)
            if current is None:
                raise ApiError(404, "NotFound", f'resourceslices "{name}" not found')
            sent_rv = obj.get("metadata", {}).get("resourceVersion")
            if sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", "the object has been modified")
            obj["metadata"] = {**current["metadata"], **obj.get("metadata", {}), "resourceVersion": self._next_rv()}
            self.slices[name] = obj
            self._notify("MODIFIED", obj)
            return copy.deepcopy(obj)

    def delete_resource_slice(self, name: str) -> None:
        with self._lock:
            obj = self.slices.pop(name, None)
            if obj is None:
                raise ApiError(404, "NotFound", f'resourceslices "{name}" not found')
            self._next_rv()
            self._notify("DELETED", obj)

    def wipe_node(self, node_name: str) -> int:
        """What kubelet does at start: delete every slice of the node, whoever wrote it."""
        with self._lock:
            names = [n for n, s in self.slices.items() if s.get("spec", {}).get("nodeName") == node_name]
            for name in names:
                obj = self.slices.pop(name)
                self._next_rv()
                self._notify("DELETED", obj)
            return len(names)

    def watch_resource_slices(
        self, resource_version: str, field_selector: str = "", timeout_seconds: int = 60
    ) -> Iterator[WatchEvent]:
        # registered at the call, not at the first next(): changes made in between are not lost
        events: queue.Queue[WatchEvent] = queue.Queue()
        with self._lock:
            self._watchers.append(events)
        return self._stream(events, field_selector, timeout_seconds)

    def _stream(
        self, events: queue.Queue[WatchEvent], field_selector: str, timeout_seconds: int
    ) -> Iterator[WatchEvent]:
        try:
            while True:
                try:
                    event = events.get(timeout=timeout_seconds)
                except queue.Empty:
                    return
                if _matches(event.object, field_selector):
                    yield event
        finally:
            with self._lock:
                self._watchers.remove(events)

    def _notify(self, kind: str, obj: Obj) -> None:
        # called with the lock held, so watchers see events in resourceVersion order
        for watcher in self._watchers:
            watcher.put(WatchEvent(kind, copy.deepcopy(obj)))
