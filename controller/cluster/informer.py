"""The controller's view of the cluster, kept current with list + watch (an informer, in client-go
terms): tessera's ResourceSlices, all DeviceClasses, all ResourceClaims.

Each resource has a Reflector thread: list, then watch from the list's resourceVersion; a watch that
ends is resumed from the last version seen; an expired version (410 Gone) or any error leads to a
fresh list after a capped exponential backoff. The webhook never waits for the apiserver: it reads
whatever snapshot is there and skips inventory checks until the first list has arrived.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import structlog

from controller.cluster.devicegroups import group, prepare_kinds, signatures
from controller.cluster.inventory import DeviceIndex
from controller.cluster.objects import by_name, object_ref
from driver import DRIVER_NAME
from driver.backoff import Backoff
from driver.gcpause import collector_paused, keep_for_good
from driver.kubeapi import ApiError, Obj, WatchEvent

log = structlog.get_logger(__name__)


class ClusterReader(Protocol):
    """The list/watch calls the controller needs (driver.kubeapi.RealKubeAPI provides them)."""

    def list_resource_slices(self, field_selector: str = "", label_selector: str = "") -> Obj: ...
    def watch_resource_slices(
        self, resource_version: str, field_selector: str = "", timeout_seconds: int = 60
    ) -> Iterator[WatchEvent]: ...
    def list_device_classes(self) -> Obj: ...
    def watch_device_classes(self, resource_version: str, timeout_seconds: int = 60) -> Iterator[WatchEvent]: ...
    def list_resource_claims(self) -> Obj: ...
    def watch_resource_claims(self, resource_version: str, timeout_seconds: int = 60) -> Iterator[WatchEvent]: ...


def _version(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


class Reflector:
    """Keeps `objects` equal to one resource in the apiserver."""

    def __init__(
        self,
        resource: str,
        list_fn: Callable[[], Obj],
        watch_fn: Callable[[str], Iterator[WatchEvent]],
        *,
        on_change: Callable[[], None] = lambda: None,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
    ) -> None:
        self.resource = resource
        self._list = list_fn
        self._watch = watch_fn
        self._on_change = on_change
        self._backoff = Backoff(initial=backoff_initial, maximum=backoff_max)
        self._lock = threading.Lock()
        self._objects: dict[str, Obj] = {}
        self._stop = threading.Event()
        self.synced = threading.Event()
        self.version = 0  # bumped on every change of `objects`
        self.errors = 0
        self._thread: threading.Thread | None = None

    def objects(self) -> list[Obj]:
        with self._lock:
            return list(self._objects.values())

    def get(self, key: str) -> Obj | None:
        with self._lock:
            return self._objects.get(key)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"reflector-{self.resource}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout)

    def _changed(self) -> None:
        self.version += 1
        self._on_change()

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                resource_version = self._relist()
                if failing:
                    log.info("apiserver reachable again", resource=self.resource)
                    failing = False
                self._backoff.reset()
                self._watch_from(resource_version)
            except ApiError as exc:
                if exc.status == 410:
                    log.info("watch expired; listing again", resource=self.resource)
                    continue
                self.errors += 1
                if not failing:
                    log.warning("list/watch failed; retrying with backoff", resource=self.resource, error=str(exc))
                    failing = True
            except Exception as exc:  # a bug or a malformed object must not kill the cache
                self.errors += 1
                log.exception("reflector error; retrying with backoff", resource=self.resource, error=str(exc))
                failing = True
            if self._stop.wait(self._backoff.next()):
                return

    def _relist(self) -> str:
        with collector_paused():
            listing = self._list()
            if not self.synced.is_set():
                # What the first list decoded (1.7 million objects for 1,000 DGX nodes' slices) stays in this
                # cache. Left to the collector, the first collections after the list walked all of it: 0.3,
                # 0.6, 0.7 and 0.7 s with every thread stopped, before the controller was ready. Frozen while
                # the collector is still off, no pass ever walks it.
                keep_for_good()
        items = {object_ref(item): item for item in listing.get("items") or [] if isinstance(item, dict)}
        with self._lock:
            self._objects = items
        self.synced.set()
        self._changed()
        return str((listing.get("metadata") or {}).get("resourceVersion", ""))

    def _watch_from(self, resource_version: str) -> None:
        while not self._stop.is_set():
            for event in self._watch(resource_version):
                if self._stop.is_set():
                    return
                obj = event.object
                if event.type == "ERROR":
                    code = int(obj.get("code", 0) or 0) if isinstance(obj, dict) else 0
                    raise ApiError(code, str(obj.get("reason", "")) if isinstance(obj, dict) else "", "watch error")
                if not isinstance(obj, dict):
                    continue
                resource_version = _version(obj) or resource_version
                if event.type == "BOOKMARK":
                    continue
                with self._lock:
                    if event.type == "DELETED":
                        self._objects.pop(object_ref(obj), None)
                    else:
                        self._objects[object_ref(obj)] = obj
                self._changed()


class ClusterCache:
    """ResourceSlices (tessera's driver only), DeviceClasses and ResourceClaims, watched.

    With `warm`, a thread builds the device snapshot after the slices change (once a burst of changes
    settled for `warm_delay` s) and groups it the way reviews grouped the previous one, so no review pays
    for a new snapshot: at 1,000 nodes (93,000 devices) that first grouping takes seconds, longer than a
    review's deadline, and during a rollout every node's slices change. Between two builds it rests
    `warm_pace` times as long as the last build took. Reviews then see the slices as they were up to a
    second or two ago; the scheduler, not the webhook, is the authority on them.
    """

    def __init__(self, api: ClusterReader, *, driver: str = DRIVER_NAME, watch_timeout: int = 300,
                 warm: bool = False, warm_delay: float = 0.2, warm_pace: float = 2.0,
                 on_build: Callable[[float], None] | None = None, **backoff: Any) -> None:
        selector = f"spec.driver={driver}"
        self._driver = driver
        self._index_lock = threading.Lock()
        self._index: DeviceIndex | None = None
        self._warm = warm
        self._warm_delay = warm_delay
        self._warm_pace = warm_pace
        self.warm_builds = 0  # snapshots the warmer built (read by tests)
        self._on_build = on_build  # told each warm build's seconds (the controller's metrics)
        self._slices_changed = threading.Event()
        self._stopping = threading.Event()
        self._warmer: threading.Thread | None = None
        self.slices = Reflector(
            "resourceslices",
            lambda: api.list_resource_slices(field_selector=selector),
            lambda rv: api.watch_resource_slices(rv, field_selector=selector, timeout_seconds=watch_timeout),
            on_change=self._slices_changed.set,
            **backoff,
        )
        self.classes = Reflector(
            "deviceclasses",
            api.list_device_classes,
            lambda rv: api.watch_device_classes(rv, timeout_seconds=watch_timeout),
            **backoff,
        )
        self.claims = Reflector(
            "resourceclaims",
            api.list_resource_claims,
            lambda rv: api.watch_resource_claims(rv, timeout_seconds=watch_timeout),
            **backoff,
        )
        self._reflectors = (self.slices, self.classes, self.claims)

    def start(self) -> None:
        for reflector in self._reflectors:
            reflector.start()
        if self._warm:
            self._warmer = threading.Thread(target=self._run_warmer, name="inventory-warmer", daemon=True)
            self._warmer.start()

    def stop(self) -> None:
        self._stopping.set()
        for reflector in self._reflectors:
            reflector._stop.set()
        for reflector in self._reflectors:
            reflector.stop(timeout=1.0)
        if self._warmer is not None:
            self._warmer.join(timeout=1.0)

    def _run_warmer(self) -> None:
        while not self._stopping.is_set():
            if not self._slices_changed.wait(0.5):
                continue
            self._stopping.wait(self._warm_delay)  # let a burst of slice events (one node's pool) settle
            self._slices_changed.clear()
            started = time.monotonic()
            try:
                self._warm_index()
            except Exception:  # a malformed slice must not stop the warming; reviews build their own meanwhile
                log.exception("building the device snapshot failed")
            self.warm_builds += 1
            took = time.monotonic() - started
            if self._on_build is not None:
                self._on_build(took)
            # While slices keep changing (every node republishing at once) back-to-back rebuilds would take a
            # whole core from the webhook's reviews and the apiserver: at most one build per `warm_pace` times
            # its own duration. At 1,000 DGX nodes a build takes about 0.5 s, so reviews then see slices up
            # to about 2 s old.
            self._stopping.wait(self._warm_pace * took)

    def _warm_index(self) -> None:
        version = self.slices.version
        previous = self._index
        index = DeviceIndex.from_slices(self.slices.objects(), driver=self._driver, version=version,
                                        previous=previous)
        prepare_kinds(index)
        for signature in signatures(previous) if previous is not None else ():
            group(index, signature)
        index.largest_memory()
        with self._index_lock:
            first = self._index is None
            if self._index is None or self._index.version < version:
                self._index = index
        if first:
            # The first lists and snapshot are most of what the controller will ever hold (690,000 tracked
            # objects at 1,000 DGX nodes): a full collection walking them stopped every thread, reviews
            # included, for 0.5 s. Frozen, later passes walk only what changed since.
            keep_for_good()

    def synced(self) -> bool:
        """The first lists are in (and, when warming, the first snapshot is built and grouped by kind)."""
        listed = self.slices.synced.is_set() and self.classes.synced.is_set()
        return listed and (not self._warm or self._index is not None)

    def wait_synced(self, timeout: float) -> bool:
        """Block until `synced()` (with warming, until the first snapshot is built too); False after `timeout`."""
        deadline = time.monotonic() + timeout
        if not (self.slices.synced.wait(timeout) and self.classes.synced.wait(max(0.0, deadline - time.monotonic()))):
            return False
        while not self.synced():
            if time.monotonic() > deadline:
                return False
            self._stopping.wait(0.02)
        return True

    def index(self) -> DeviceIndex | None:
        """The device snapshot, rebuilt only when the slices changed; None before the first list."""
        if not self.slices.synced.is_set():
            return None
        if self._warm and self._index is not None:
            return self._index  # the warmer's latest; it follows the slices by about a second
        version = self.slices.version
        with self._index_lock:
            if self._index is None or self._index.version != version:
                self._index = DeviceIndex.from_slices(self.slices.objects(), driver=self._driver, version=version)
            return self._index

    def device_classes(self) -> dict[str, Obj]:
        return by_name(self.classes.objects())

    def resource_claims(self) -> list[Obj]:
        return self.claims.objects()
