"""FakeKubeAPI plus the DeviceClass and ResourceClaim list/watch the controller needs (test helper;
holds no tests)."""

from __future__ import annotations

import copy
import queue
from collections.abc import Iterator

from driver.kubeapi import Obj, WatchEvent
from tests.fakes.apiserver import FakeKubeAPI


def device_class(name: str, *expressions: str, config: list | None = None) -> Obj:
    spec: Obj = {"selectors": [{"cel": {"expression": e}} for e in expressions]}
    if config is not None:
        spec["config"] = config
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


class FakeCluster(FakeKubeAPI):
    def __init__(self) -> None:
        super().__init__()
        self.device_classes: dict[str, Obj] = {}
        self._other_watchers: dict[str, list[queue.Queue[WatchEvent | None]]] = {"classes": [], "claims": []}

    def watching(self) -> bool:
        """Whether a slice, a class and a claim watch are open (the fake does not replay missed events)."""
        with self._lock:
            return bool(self._watchers) and all(self._other_watchers.values())

    def close_watches(self) -> None:
        super().close_watches()
        with self._lock:
            for watchers in self._other_watchers.values():
                for q in watchers:
                    q.put(None)

    def _emit_to(self, what: str, type_: str, obj: Obj) -> None:
        for q in self._other_watchers[what]:
            q.put(WatchEvent(type_, copy.deepcopy(obj)))

    def add_device_class(self, obj: Obj) -> Obj:
        with self._lock:
            obj = copy.deepcopy(obj)
            existed = obj["metadata"]["name"] in self.device_classes
            self.device_classes[obj["metadata"]["name"]] = self._bump(obj)
            self._emit_to("classes", "MODIFIED" if existed else "ADDED", obj)
            return obj

    def delete_device_class(self, name: str) -> None:
        with self._lock:
            obj = self.device_classes.pop(name)
            self._rv += 1
            self._emit_to("classes", "DELETED", obj)

    def add_claim_watched(self, claim: Obj) -> Obj:
        with self._lock:
            claim = copy.deepcopy(claim)
            claim["metadata"].setdefault("namespace", "default")
            self.claims[(claim["metadata"]["namespace"], claim["metadata"]["name"])] = self._bump(claim)
            self._emit_to("claims", "ADDED", claim)
            return claim

    def list_device_classes(self) -> Obj:
        self._enter("list_classes")
        with self._lock:
            items = [copy.deepcopy(c) for c in self.device_classes.values()]
            return {"kind": "DeviceClassList", "metadata": {"resourceVersion": str(self._rv)}, "items": items}

    def list_resource_claims(self) -> Obj:
        self._enter("list_claims")
        with self._lock:
            items = [copy.deepcopy(c) for c in self.claims.values()]
            return {"kind": "ResourceClaimList", "metadata": {"resourceVersion": str(self._rv)}, "items": items}

    def _watch(self, what: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        self._enter(f"watch_{what}")
        q: queue.Queue[WatchEvent | None] = queue.Queue()
        with self._lock:
            self._other_watchers[what].append(q)
        try:
            while True:
                try:
                    event = q.get(timeout=timeout_seconds)
                except queue.Empty:
                    return
                if event is None:
                    return
                yield event
        finally:
            with self._lock:
                self._other_watchers[what].remove(q)

    def watch_device_classes(self, resource_version: str, timeout_seconds: int = 60) -> Iterator[WatchEvent]:
        return self._watch("classes", timeout_seconds)

    def watch_resource_claims(self, resource_version: str, timeout_seconds: int = 60) -> Iterator[WatchEvent]:
        return self._watch("claims", timeout_seconds)
