"""Keeps this node's ResourceSlices in the apiserver equal to what the node's inventory says.

The publisher owns the slices of one pool (pool name = node name). Each sync lists what exists and
applies the difference, following the reference controller's rules (k8s.io/dynamic-resource-allocation
`resourceslice`): delete obsolete slices first, then update, then create; raise `pool.generation` when
the current generation's content changes in more than one slice, so the scheduler never combines old and
new slices; keep the generation for a single in-place update, which is atomic anyway, and when a pass that
broke off half-way is finished (the slices still missing or behind join the generation already written).

Slices get deterministic names (driver.names.slice_name), which is how a restarted publisher adopts the
slices its predecessor wrote. A watch brings the pool back within moments when kubelet (which wipes a
node's slices whenever it restarts) or anyone else deletes or edits them; a periodic resync is the safety
net for missed events. Apiserver errors never escape: the sync thread retries with capped, jittered
exponential backoff and logs once per change between healthy and failing. A 429 (the apiserver busy, the
request not carried out) is retried sooner: after its Retry-After, up to RETRY_AFTER_CAP.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from driver import DRIVER_NAME
from driver.backoff import Backoff
from driver.kubeapi import ApiError, KubeAPI, Obj, WatchEvent
from driver.names import slice_field_selector, slice_name

log = structlog.get_logger(__name__)

WaitFn = Callable[[threading.Event, float], bool]


def _event_wait(event: threading.Event, timeout: float) -> bool:
    return event.wait(timeout)


@dataclass(frozen=True)
class SyncPlan:
    """What one sync will do, computed from the desired and the existing slices."""

    generation: int
    delete: tuple[str, ...]
    update: tuple[Obj, ...]
    create: tuple[Obj, ...]

    @property
    def empty(self) -> bool:
        return not (self.delete or self.update or self.create)


def _copy_json(value: Any) -> Any:
    """A deep copy of JSON-shaped data; copy.deepcopy's memo made it most of a 300-device sync's time."""
    if isinstance(value, dict):
        return {k: _copy_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_json(v) for v in value]
    return value


def _without_generation(spec: Obj) -> Obj:
    # only compared and remembered, never changed: the devices can be shared with `spec`
    pool = spec.get("pool")
    if not isinstance(pool, dict):
        return dict(spec)
    return {**spec, "pool": {k: v for k, v in pool.items() if k != "generation"}}


def _generation(obj: Obj) -> int:
    value = obj.get("spec", {}).get("pool", {}).get("generation", 0)
    return value if isinstance(value, int) else 0


RETRY_AFTER_CAP = 8.0  # the longest Retry-After a node agent waits out (seconds); see Publisher._retry_delay


class Publisher:
    """Publishes `slices` (driver.slices.build_slices output) for `node_name` and keeps them published."""

    def __init__(
        self,
        api: KubeAPI,
        node_name: str,
        slices: list[Obj],
        *,
        resync_interval: float = 300.0,
        owner_retry_interval: float = 30.0,
        republish_delay: float = 0.2,
        watch_timeout: int = 300,
        watch: bool = True,
        backoff: Backoff | None = None,
        throttled_backoff: Backoff | None = None,
        wait: WaitFn = _event_wait,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._api = api
        self._node = node_name
        self._selector = slice_field_selector(node_name)
        self._resync_interval = resync_interval
        self._owner_retry_interval = owner_retry_interval
        self._republish_delay = republish_delay
        self._watch_timeout = watch_timeout
        self._watch_enabled = watch
        self._backoff = backoff or Backoff()
        self._watch_backoff = dataclasses.replace(self._backoff)  # same settings, its own attempt count
        # After a 429 the apiserver is up but busy, and says when to come back: a short capped backoff, never
        # shorter than its Retry-After. The long one would leave nodes idle for up to 30 s after the crowd thinned
        # (a 1,000-node upgrade storm: the last 25 s with no 429 left, only nodes still waiting out their backoff).
        self._throttled_backoff = throttled_backoff or Backoff(initial=1.0, maximum=4.0, factor=1.5, jitter=0.5)
        self._last_exc: ApiError | None = None
        self._wait = wait
        self._clock = clock

        self._lock = threading.Lock()  # guards the desired state and the bookkeeping below
        self._sync_lock = threading.Lock()  # one sync at a time, thread or caller
        self._desired: list[Obj] = _copy_json(slices)
        self._desired_version = 0
        self._synced_version = -1
        self._synced = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._kicked = threading.Event()  # set by the watch: someone else changed our slices
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

        self._owner: Obj | None = None
        self._owner_next_try = 0.0
        self._owner_warned = False
        # name -> (spec we sent, spec the apiserver stored) where they differ: the server dropped fields
        # (a feature gate is off); treating the stored form as in sync avoids an endless update loop.
        self._dropped: dict[str, tuple[Obj, Obj]] = {}
        # What this publisher last wrote per slice name, recorded before the call so the watch can tell
        # the echo of our own write from someone else's change, whichever arrives first.
        self._written: dict[str, Obj] = {}
        self._own_deletes: set[str] = set()
        # after a 429: this node's slices as the refused pass left them, for the retry to start from (no list)
        self._after_throttle: list[Obj] | None = None
        self._generation = 0
        self._failing = False
        # The resourceVersion of the sync's latest list and how many lists there were: the watch starts
        # from it instead of listing on its own, which halves the lists of 1,000 nodes that restart at once.
        self._listed = threading.Condition(threading.Lock())
        self._list_count = 0
        self._list_version = ""
        # The newest resourceVersion this publisher was answered with (a list's, or a slice it wrote): its next
        # list asks the apiserver's watch cache for data at least that new, so it sees its own writes without
        # a consistent read from etcd. "" after a failure: the next list takes whatever the cache has ("0").
        self._seen_version = ""

        # Counters for metrics.
        self.syncs = 0  # successful syncs, whether or not they had to write
        self.publishes = 0  # successful syncs that changed something in the apiserver
        self.errors = 0  # failed syncs
        self.last_sync_time: float | None = None  # clock() of the last successful sync
        self.last_error: str = ""
        self.last_sync_ok: bool | None = None  # outcome of the latest attempt; None before the first

    # -- public API -------------------------------------------------------------------------------------

    @property
    def generation(self) -> int:
        """The pool generation of the last successful sync."""
        return self._generation

    def start(self) -> None:
        """Start the sync and watch threads; the first sync happens right away."""
        if self._threads:
            raise RuntimeError("publisher already started")
        self._stop.clear()
        self._wake.set()
        targets = [(self._run_sync, "slice-sync")]
        if self._watch_enabled:
            targets.append((self._run_watch, "slice-watch"))
        for target, name in targets:
            thread = threading.Thread(target=target, name=f"tessera-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def update(self, slices: list[Obj]) -> None:
        """Replace the desired slices; the sync thread applies them at once."""
        with self._lock:
            self._desired = _copy_json(slices)
            self._desired_version += 1
        self._wake.set()

    def wait_synced(self, timeout: float) -> bool:
        """Block until the current desired slices have been published; False when `timeout` passed first."""
        deadline = time.monotonic() + timeout
        with self._synced:
            while self._synced_version != self._desired_version:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._synced.wait(remaining)
            return True

    def stop(self, cleanup: bool = False) -> None:
        """Stop the threads; with `cleanup`, also delete every slice of this node's pool."""
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            # The watch thread may sit in a long-poll; it is a daemon and exits on its next event.
            thread.join(timeout=5.0 if thread.name.endswith("sync") else 0.5)
        self._threads.clear()
        if cleanup:
            self.delete_all()

    def delete_all(self) -> int:
        """Delete every slice of this driver on this node; returns how many were deleted. Raises ApiError."""
        with self._sync_lock:
            deleted = 0
            for obj in self._list_own():
                name = obj["metadata"]["name"]
                try:
                    self._api.delete_resource_slice(name)
                    deleted += 1
                except ApiError as exc:
                    if not exc.not_found:
                        raise
            log.info("deleted this node's ResourceSlices", node=self._node, count=deleted)
            return deleted

    def sync_once(self) -> bool:
        """One reconcile pass; returns False (and counts an error) when the apiserver refused or failed."""
        with self._lock:
            # `update` replaces the list and nothing changes it in place (bodies are new dicts around its devices),
            # so the sync reads it without a copy: copying 50 KB slices over and over was most of a node agent's
            # CPU in a 1,000-node upgrade storm
            desired = self._desired
            version = self._desired_version
        with self._sync_lock:
            try:
                wrote = self._sync(desired)
            except ApiError as exc:
                self.errors += 1
                self.last_error = str(exc)
                self._last_exc = exc
                self._seen_version = ""  # e.g. a restored etcd whose versions are older than what we saw
                log.debug("ResourceSlice sync failed", node=self._node, error=str(exc))
                self.last_sync_ok = False
                return False
            except Exception as exc:  # e.g. a malformed object from the server: retried, never fatal
                self._seen_version = ""
                self._last_exc = None
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("ResourceSlice sync failed unexpectedly", node=self._node)
                self.last_sync_ok = False
                return False
        self.syncs += 1
        self.publishes += wrote
        self.last_sync_ok = True
        self.last_sync_time = self._clock()
        with self._synced:
            if version == self._desired_version:
                self._synced_version = version
            self._synced.notify_all()
        return True

    # -- reconcile ----------------------------------------------------------------------------------------

    def _list_own(self) -> list[Obj]:
        listed = self._api.list_resource_slices(field_selector=self._selector,
                                                not_older_than=self._seen_version or "0")
        with self._listed:
            self._list_count += 1
            self._list_version = str(listed.get("metadata", {}).get("resourceVersion", ""))
            self._seen_version = self._list_version
            self._listed.notify_all()
        return [
            obj for obj in listed.get("items", [])
            if obj.get("spec", {}).get("driver") == DRIVER_NAME and obj.get("spec", {}).get("nodeName") == self._node
        ]

    def _ensure_owner(self, *, refresh: bool = False) -> None:
        if not refresh and (self._owner is not None or self._clock() < self._owner_next_try):
            return
        try:
            node = self._api.get_node(self._node)
        except ApiError as exc:
            if exc.throttled and refresh:
                # Slices are about to be created and the apiserver asks us to come back later (it would most likely
                # refuse the creates too). Creating them without the owner meant writing every one a second time
                # once the Node could be read: in a 1,000-node first publish 457 nodes did so 30 s later. Slices
                # that exist keep their owner reference through every update (_body), so a pass that only
                # updates them goes ahead.
                raise
            if exc.not_found:
                # A Node that was deleted (and maybe registered again) must not stay our owner: the garbage
                # collector would delete every slice we create for its old uid, over and over.
                self._owner = None
            self._owner_next_try = self._clock() + self._owner_retry_interval
            if not self._owner_warned:
                log.warning("cannot read the Node object; publishing slices without an owner reference for now",
                            node=self._node, error=str(exc), retry_in_s=self._owner_retry_interval)
                self._owner_warned = True
            return
        self._owner = {
            "apiVersion": "v1",
            "kind": "Node",
            "name": self._node,
            "uid": node["metadata"]["uid"],
            "controller": True,
        }
        if self._owner_warned:
            log.info("found the Node object; slices get their owner reference", node=self._node)

    def _body(self, template: Obj, name: str, generation: int, count: int, existing: Obj | None) -> Obj:
        """What to write for slice `name`: the template with our metadata and pool. New dicts down to `spec`;
        the devices are the template's own (never changed), so no slice is copied whole."""
        meta = {k: _copy_json(v) for k, v in (template.get("metadata") or {}).items() if k != "generateName"}
        meta["name"] = name
        if self._owner is not None:
            meta["ownerReferences"] = [dict(self._owner)]
        elif existing is not None and existing.get("metadata", {}).get("ownerReferences"):
            meta["ownerReferences"] = _copy_json(existing["metadata"]["ownerReferences"])
        if existing is not None:
            meta["resourceVersion"] = existing["metadata"]["resourceVersion"]
        spec = dict(template.get("spec") or {})
        spec["pool"] = {"name": self._node, "generation": generation, "resourceSliceCount": count}
        return {**template, "metadata": meta, "spec": spec}

    def _same_content(self, name: str, want: Obj, have: Obj) -> bool:
        want_spec, have_spec = _without_generation(want["spec"]), _without_generation(have.get("spec", {}))
        if want_spec != have_spec and self._dropped.get(name) != (want_spec, have_spec):
            return False
        want_meta, have_meta = want.get("metadata", {}), have.get("metadata", {})
        have_labels = have_meta.get("labels") or {}
        if any(have_labels.get(k) != v for k, v in (want_meta.get("labels") or {}).items()):
            return False
        return (want_meta.get("ownerReferences") or []) == (have_meta.get("ownerReferences") or [])

    def plan(self, desired: list[Obj], existing: list[Obj]) -> SyncPlan:
        """The deletes, updates and creates that turn `existing` into `desired` (pure; used by `_sync`)."""
        names = [slice_name(self._node, i) for i in range(len(desired))]
        ours = [e for e in existing if e.get("spec", {}).get("pool", {}).get("name") == self._node]
        by_name = {e["metadata"]["name"]: e for e in ours}
        obsolete = sorted(
            e["metadata"]["name"] for e in existing if e["metadata"]["name"] not in names or e not in ours
        )
        current = max([self._generation, *(_generation(e) for e in ours)])

        count = len(desired)
        stale = behind = creates = 0
        bodies = [self._body(template, name, current, count, by_name.get(name))
                  for name, template in zip(names, desired, strict=True)]
        for name, want in zip(names, bodies, strict=True):
            have = by_name.get(name)
            if have is None:
                creates += 1
            elif _generation(have) != current:
                behind += 1
            elif not self._same_content(name, want, have):
                stale += 1
        # A new generation only when the current one holds content that is no longer wanted (more than one
        # slice of it, or one besides other writes). A pass that failed half-way (a timeout, a 429 in a storm)
        # left the current generation right but incomplete: finishing it writes only the slices still missing
        # or behind, where a new generation would rewrite every slice of the pool on every retry.
        generation = current + 1 if not ours or stale > 1 or (stale and (creates or behind)) else current

        updates: list[Obj] = []
        new: list[Obj] = []
        for name, want in zip(names, bodies, strict=True):
            have = by_name.get(name)
            want["spec"]["pool"]["generation"] = generation  # the bodies' own pool dicts; _same_content ignores it
            if have is None:
                new.append(want)
            elif not self._same_content(name, want, have) or _generation(have) != generation:
                updates.append(want)
        return SyncPlan(generation, tuple(obsolete), tuple(updates), tuple(new))

    def _sync(self, desired: list[Obj]) -> bool:
        reused, self._after_throttle = self._after_throttle, None
        existing = reused if reused is not None else self._list_own()
        known = {e["metadata"]["name"]: e for e in existing}  # kept current below, for a retry after a 429
        # Slices are about to be created (first publish, or someone deleted ours, possibly the garbage
        # collector after the Node was replaced): look the Node up again so the owner uid is current.
        missing = any(slice_name(self._node, i) not in known for i in range(len(desired)))
        try:
            self._ensure_owner(refresh=missing)
            plan = self.plan(desired, existing)
            for name in plan.delete:
                self._own_deletes.add(name)
                self._written.pop(name, None)
                try:
                    self._api.delete_resource_slice(name)
                except ApiError as exc:
                    if not exc.not_found:
                        raise
                known.pop(name, None)
            for body in plan.update:
                name = body["metadata"]["name"]
                self._written[name] = body
                known[name] = self._remember(body, self._api.replace_resource_slice(name, body))
            for body in plan.create:
                name = body["metadata"]["name"]
                create_body = {**body, "metadata": {k: v for k, v in body["metadata"].items()
                                                    if k != "resourceVersion"}}
                self._written[name] = create_body
                known[name] = self._remember(create_body, self._api.create_resource_slice(create_body))
        except ApiError as exc:
            if exc.throttled:
                # Refused before the apiserver did anything: what this pass listed and wrote is what is there, so
                # the retry starts from it. A list of resourceslices weighs 10 APF seats at 1,000 nodes, a write
                # one: relisting on every retry was most of what 1,000 node agents asked of a throttled apiserver.
                self._after_throttle = list(known.values())
            raise
        self._generation = plan.generation
        if not plan.empty:
            log.info("published ResourceSlices", node=self._node, generation=plan.generation,
                     slices=len(desired), deleted=len(plan.delete), updated=len(plan.update),
                     created=len(plan.create))
        return not plan.empty

    def _remember(self, sent: Obj, stored: Obj) -> Obj:
        self._seen_version = str(stored.get("metadata", {}).get("resourceVersion") or self._seen_version)
        name = sent["metadata"]["name"]
        sent_spec, stored_spec = _without_generation(sent["spec"]), _without_generation(stored.get("spec", {}))
        if sent_spec != stored_spec:
            if self._dropped.get(name) != (sent_spec, stored_spec):
                log.warning("the apiserver stored the slice differently from what was sent (a feature gate such "
                            "as DRAConsumableCapacity or DRAPartitionableDevices may be off); keeping its version",
                            slice=name)
            self._dropped[name] = (sent_spec, stored_spec)
        else:
            self._dropped.pop(name, None)
        return stored

    # -- threads ------------------------------------------------------------------------------------------

    def _run_sync(self) -> None:
        while not self._stop.is_set():
            if self._kicked.is_set():
                # Let a burst of changes (kubelet wiping the whole pool) settle, then repair it in one sync.
                self._stop.wait(self._republish_delay)
                self._kicked.clear()
                self._after_throttle = None  # someone else changed the slices: list them again
            self._wake.clear()
            if self.sync_once():
                self._backoff.reset()
                self._throttled_backoff.reset()
                if self._failing:
                    log.info("apiserver reachable again; ResourceSlices published", node=self._node)
                    self._failing = False
                delay = self._resync_interval
                if self._owner is None:
                    delay = min(delay, self._owner_retry_interval)
            else:
                delay = self._retry_delay()
                if not self._failing:
                    log.error("cannot publish ResourceSlices; retrying with backoff", node=self._node,
                              error=self.last_error, retry_in_s=round(delay, 2))
                    self._failing = True
            self._wait(self._wake, delay)

    def _retry_delay(self) -> float:
        exc = self._last_exc
        if exc is None or not exc.throttled:
            return self._backoff.next()
        # Retry-After is honoured up to RETRY_AFTER_CAP, spread over up to half as long again so the nodes refused
        # in one second do not all come back in the same one. API Priority and Fairness raises the value to 32 s
        # while it drops requests and lowers it only as later requests are dropped, so it still says 32 s to the
        # few nodes refused as the crowd thins: in a 1,000-node storm they idled 20 s after everyone else was done.
        # Being refused costs the apiserver next to nothing; it rejects before doing any work.
        backoff = self._throttled_backoff
        floor = min(exc.retry_after or 0.0, RETRY_AFTER_CAP) * (1.0 + 0.5 * backoff.rng())
        return max(floor, backoff.next())

    def _is_own_event(self, event: WatchEvent) -> bool:
        meta = event.object.get("metadata", {})
        if event.type == "DELETED":
            name = meta.get("name", "")
            if name in self._own_deletes:
                self._own_deletes.discard(name)
                return True
            return False
        written = self._written.get(meta.get("name", ""))
        return (
            written is not None
            and _generation(event.object) == _generation(written)
            and self._same_content(written["metadata"]["name"], written, event.object)
        )

    def _watch_start(self, used: int) -> tuple[str, int] | None:
        """Where the watch starts: (resourceVersion, number) of the sync's latest list once there was one after
        the `used`th; None once stopping. After a break (`used` > 0) the sync is asked for that list: changes
        made while the watch was down were never seen, and its list checks the pool."""
        if used:
            self._wake.set()
        with self._listed:
            while self._list_count <= used:
                if self._stop.is_set():
                    return None
                self._listed.wait(0.5)
            return self._list_version, self._list_count

    def _run_watch(self) -> None:
        resource_version = ""
        broken = False
        used = 0  # the sync's list the watch last started from: it needs a newer one after a break
        while not self._stop.is_set():
            try:
                if not resource_version:
                    listed = self._watch_start(used)
                    if listed is None:
                        return
                    resource_version, used = listed
                    if broken:
                        log.info("ResourceSlice watch restored", node=self._node)
                        broken = False
                for event in self._api.watch_resource_slices(resource_version, field_selector=self._selector,
                                                             timeout_seconds=self._watch_timeout):
                    if self._stop.is_set():
                        return
                    if event.type == "ERROR":
                        # Usually 410 Gone: our resourceVersion is too old. Start over from a fresh list.
                        resource_version = ""
                        break
                    resource_version = str(event.object.get("metadata", {}).get("resourceVersion", resource_version))
                    if event.type == "BOOKMARK" or self._is_own_event(event):
                        continue
                    log.info("ResourceSlice changed by someone else; republishing", node=self._node,
                             change=event.type, slice=event.object.get("metadata", {}).get("name"))
                    self._kicked.set()
                    self._wake.set()
                self._watch_backoff.reset()
            except Exception as exc:  # the watch must outlive any bad answer; the resync covers the gap
                resource_version = ""
                delay = self._watch_backoff.next()
                if not isinstance(exc, ApiError):
                    log.exception("ResourceSlice watch broke unexpectedly", node=self._node, retry_in_s=delay)
                elif not broken:
                    log.warning("ResourceSlice watch failed; changes by others are repaired at the next resync "
                                "until it is back", node=self._node, error=str(exc), retry_in_s=round(delay, 2))
                else:
                    log.debug("ResourceSlice watch still failing", node=self._node, error=str(exc), retry_in_s=delay)
                broken = True
                self._stop.wait(delay)
