"""The controller's inventory: devices from slices (pool generations), memory usage, and the
list+watch cache kept current against the in-memory apiserver."""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

import pytest

from controller.cluster.devicegroups import group
from controller.cluster.informer import ClusterCache, Reflector
from controller.cluster.inventory import DeviceIndex
from controller.cluster.memoryusage import memory_usage
from driver.discovery import load_inventory
from driver.kubeapi import ApiError, WatchEvent
from driver.slices import build_slices
from tests.fakes.cluster import FakeCluster, device_class


def gpu(name: str, memory: str = "80Gi", **attrs) -> dict:
    attributes = {"type": {"string": "gpu"}, "productName": {"string": "NVIDIA H100 80GB HBM3"}}
    attributes.update({k: {"string": v} for k, v in attrs.items()})
    return {"name": name, "allowMultipleAllocations": True, "attributes": attributes,
            "capacity": {"memory": {"value": memory}}}


def slice_(node: str, devices: list[dict], generation: int = 0, count: int = 1, name: str | None = None,
           driver: str = "gpu.tessera.dev") -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-{generation}"},
        "spec": {"driver": driver, "nodeName": node,
                 "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
                 "devices": devices},
    }


# -- DeviceIndex ------------------------------------------------------------------------------


def test_index_keeps_only_the_newest_generation_of_a_pool():
    old = slice_("node-a", [gpu("gpu-0"), gpu("gpu-1")], generation=1)
    new = slice_("node-a", [gpu("gpu-0")], generation=2)
    index = DeviceIndex.from_slices([old, new])
    assert [d.ref for d in index.devices] == ["node-a/gpu-0"]


def test_index_reports_pools_whose_slice_count_does_not_match_yet():
    partial = slice_("node-a", [gpu("gpu-0")], count=2)
    index = DeviceIndex.from_slices([partial, slice_("node-b", [gpu("gpu-0")])])
    assert index.incomplete_pools == ("node-a",)
    assert len(index) == 2  # still counted: a warning during a republish would be noise


def test_index_ignores_other_drivers_unless_asked():
    nic = slice_("node-a", [{"name": "nic-0"}], driver="nic.example.com", name="nic")
    assert len(DeviceIndex.from_slices([nic])) == 0
    assert len(DeviceIndex.from_slices([nic], driver=None)) == 1


def test_device_lookup_of_bare_and_qualified_attributes():
    dev = gpu("gpu-0")
    dev["attributes"]["resource.kubernetes.io/pcieRoot"] = {"string": "pci0000:17"}
    [device] = DeviceIndex.from_slices([slice_("node-a", [dev])]).devices
    assert device.attribute("gpu.tessera.dev", "type") == {"string": "gpu"}
    assert device.attribute("gpu.tessera.dev", "pcieRoot") is None
    assert device.attribute("resource.kubernetes.io", "pcieRoot") == {"string": "pci0000:17"}
    assert device.memory == 80 << 30
    assert device.describe() == "node-a/gpu-0 (gpu, NVIDIA H100 80GB HBM3)"


def test_largest_memory_names_the_device():
    index = DeviceIndex.from_slices([slice_("a", [gpu("gpu-0", "16Gi")]), slice_("b", [gpu("gpu-0", "80Gi")])])
    size, device = index.largest_memory()
    assert size == 80 << 30 and device.ref == "b/gpu-0"


def test_index_from_real_slices_of_a_simulated_node():
    slices = build_slices(load_inventory("node-a", simulate="dgx-h100-8"), mig_strategy="static")
    index = DeviceIndex.from_slices(slices)
    assert len(index.of_type("gpu")) == 8
    assert index.nodes == ("node-a",)


# -- memory usage -------------------------------------------------------------------------------


def allocated_claim(*results: dict) -> dict:
    return {"metadata": {"name": "c", "namespace": "default"},
            "status": {"allocation": {"devices": {"results": list(results)}}}}


def test_devices_with_the_same_keys_share_one_key_set():
    # 1,000 nodes publish ~93,000 devices of a handful of kinds: one set per kind, not two per device
    index = DeviceIndex.from_slices([slice_(f"node-{n}", [gpu("gpu-0"), gpu("gpu-1")]) for n in range(3)])
    first, *others = index.devices
    assert all(d.key_names[0] is first.key_names[0] and d.key_names[1] is first.key_names[1] for d in others)
    assert first.key_names == (frozenset({"type", "productName"}), frozenset({"memory"}))


def test_a_new_snapshot_reuses_the_devices_of_unchanged_slices():
    # what a device cached (memory, key sets, its CEL view) survives another node's republish
    a, b = slice_("node-a", [gpu("gpu-0")]), slice_("node-b", [gpu("gpu-0")])
    first = DeviceIndex.from_slices([a, b])
    b_again = slice_("node-b", [gpu("gpu-0", memory="40Gi")])
    second = DeviceIndex.from_slices([a, b_again], previous=first)
    assert second.devices[0] is first.devices[0]
    assert second.devices[1] is not first.devices[1] and second.devices[1].memory == 40 * 2**30


def test_memory_usage_counts_shares_and_whole_devices():
    index = DeviceIndex.from_slices([slice_("node-a", [gpu("gpu-0"), gpu("gpu-1")])])
    claims = [
        allocated_claim({"request": "r", "driver": "gpu.tessera.dev", "pool": "node-a", "device": "gpu-0",
                         "shareID": "x", "consumedCapacity": {"memory": "4Gi"}}),
        allocated_claim({"request": "r", "driver": "gpu.tessera.dev", "pool": "node-a", "device": "gpu-1"}),
        allocated_claim({"request": "r", "driver": "nic.example.com", "pool": "node-a", "device": "nic-0"}),
        {"metadata": {"name": "pending"}},
    ]
    usage = memory_usage(index, claims)["node-a"]
    assert usage.total == 160 << 30
    assert usage.allocated == (4 << 30) + (80 << 30)
    assert usage.free == 76 << 30


def test_memory_usage_does_not_count_dynamic_mig_placements_twice():
    slices = build_slices(load_inventory("node-a", simulate="dgx-h100-8"), mig_strategy="dynamic")
    index = DeviceIndex.from_slices(slices)
    usage = memory_usage(index, [])["node-a"]
    whole = sum(d.memory for d in index.of_type("gpu"))
    assert usage.total == whole
    assert usage.allocated == 0


# -- Reflector / ClusterCache -------------------------------------------------------------------


def wait_for(predicate, timeout: float = 5.0) -> bool:
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return True
        done.wait(0.01)
    return predicate()


@pytest.fixture
def cluster():
    api = FakeCluster()
    yield api
    api.close_watches()


@pytest.fixture
def cache(cluster):
    c = ClusterCache(cluster, watch_timeout=1, backoff_initial=0.01, backoff_max=0.05)
    yield c
    cluster.close_watches()
    c.stop()


def test_cache_lists_then_follows_slice_events(cluster, cache):
    cluster.create_resource_slice(slice_("node-a", [gpu("gpu-0")], name="s-a"))
    cache.start()
    assert cache.wait_synced(5)
    assert [d.ref for d in cache.index().devices] == ["node-a/gpu-0"]
    assert wait_for(cluster.watching)

    cluster.create_resource_slice(slice_("node-b", [gpu("gpu-0")], name="s-b"))
    assert wait_for(lambda: len(cache.index()) == 2)
    cluster.delete_resource_slice("s-a")
    assert wait_for(lambda: [d.ref for d in cache.index().devices] == ["node-b/gpu-0"])


def test_cache_watches_only_tessera_slices(cluster, cache):
    cache.start()
    assert cache.wait_synced(5)
    assert wait_for(cluster.watching)
    cluster.create_resource_slice(slice_("node-a", [{"name": "nic-0"}], driver="nic.example.com", name="nic"))
    cluster.create_resource_slice(slice_("node-a", [gpu("gpu-0")], name="s-a"))
    assert wait_for(lambda: len(cache.index()) == 1)
    assert cache.index().devices[0].name == "gpu-0"


def test_cache_follows_device_classes_and_claims(cluster, cache):
    cluster.add_device_class(device_class("gpu.tessera.dev", 'device.driver == "gpu.tessera.dev"'))
    cache.start()
    assert cache.wait_synced(5)
    assert set(cache.device_classes()) == {"gpu.tessera.dev"}
    assert wait_for(cluster.watching)
    cluster.add_device_class(device_class("mig.gpu.tessera.dev", "true"))
    cluster.add_claim_watched({"metadata": {"name": "c1", "namespace": "ns"}, "spec": {}})
    assert wait_for(lambda: set(cache.device_classes()) == {"gpu.tessera.dev", "mig.gpu.tessera.dev"})
    assert wait_for(lambda: [c["metadata"]["name"] for c in cache.resource_claims()] == ["c1"])
    cluster.delete_device_class("gpu.tessera.dev")
    assert wait_for(lambda: set(cache.device_classes()) == {"mig.gpu.tessera.dev"})


def test_a_warmed_snapshot_is_already_grouped_the_way_reviews_grouped_the_last_one(cluster):
    # at 1,000 nodes grouping a new snapshot takes seconds: a review must not be the one that pays for it
    signature = (False, (("attribute", "gpu.tessera.dev", "type"),), ())
    cluster.create_resource_slice(slice_("node-a", [gpu("gpu-0")], name="s-a"))
    c = ClusterCache(cluster, watch_timeout=1, backoff_initial=0.01, backoff_max=0.05, warm=True, warm_delay=0)
    c.start()
    try:
        assert c.wait_synced(5) and wait_for(cluster.watching)
        assert wait_for(lambda: c.index() is not None)
        group(c.index(), signature)  # what a review against this snapshot does
        cluster.create_resource_slice(slice_("node-b", [gpu("gpu-0")], name="s-b"))
        assert wait_for(lambda: len(c.index()) == 2)
        assert signature in c.index().shape_cache
    finally:
        cluster.close_watches()
        c.stop()


def test_the_warmer_rests_between_builds_while_slices_keep_changing(cluster):
    # in a 1,000-node storm the slices change for a minute on end: back-to-back rebuilds took most of a core
    # from the apiserver on the same machine. Each build here takes >= 0.05 s, so a pace of 10 means >= 0.55 s
    # a cycle: at most 3 builds in the 1.2 s of churn, where an unpaced warmer builds about 20 times.
    cluster.create_resource_slice(slice_("node-0", [gpu("gpu-0")], name="s-0"))
    c = ClusterCache(cluster, watch_timeout=1, backoff_initial=0.01, backoff_max=0.05, warm=True, warm_delay=0,
                     warm_pace=10.0)
    build = c._warm_index

    def slow_build() -> None:
        time.sleep(0.05)
        build()

    c._warm_index = slow_build  # type: ignore[method-assign]
    c.start()
    try:
        assert c.wait_synced(5) and wait_for(cluster.watching)
        first = c.warm_builds
        deadline = time.monotonic() + 1.2
        nodes = 1
        while time.monotonic() < deadline:
            cluster.create_resource_slice(slice_(f"node-{nodes}", [gpu("gpu-0")], name=f"s-{nodes}"))
            nodes += 1
            time.sleep(0.01)
        assert c.warm_builds - first <= 3
        assert wait_for(lambda: len(c.index()) == nodes, timeout=10)  # and the last change is still built
    finally:
        cluster.close_watches()
        c.stop()


def test_the_first_warmed_snapshot_is_kept_out_of_the_collector_s_walks(cluster):
    # a full collection over a 1,000-node snapshot stopped every thread, reviews included, for 0.5 s
    gc.unfreeze()
    cluster.create_resource_slice(slice_("node-a", [gpu("gpu-0")], name="s-a"))
    c = ClusterCache(cluster, watch_timeout=1, backoff_initial=0.01, backoff_max=0.05, warm=True, warm_delay=0)
    c.start()
    try:
        assert c.wait_synced(5)
        snapshot = c.index()
        assert snapshot is not None
        assert wait_for(lambda: gc.get_freeze_count() > 0)
        assert not gc.is_tracked(snapshot) or snapshot not in gc.get_objects()
    finally:
        cluster.close_watches()
        c.stop()
        gc.unfreeze()


def test_without_warming_a_review_builds_the_new_snapshot_itself(cluster, cache):
    cluster.create_resource_slice(slice_("node-a", [gpu("gpu-0")], name="s-a"))
    cache.start()
    assert cache.wait_synced(5) and wait_for(cluster.watching)
    cluster.create_resource_slice(slice_("node-b", [gpu("gpu-0")], name="s-b"))
    assert wait_for(lambda: len(cache.index()) == 2)
    assert cache.index().shape_cache == {}


def test_index_is_none_before_the_first_list(cluster):
    cluster.fail_next(1000, status=503, reason="ServiceUnavailable")
    c = ClusterCache(cluster, watch_timeout=1, backoff_initial=0.01, backoff_max=0.02)
    c.start()
    try:
        assert wait_for(lambda: c.slices.errors >= 2)
        assert c.index() is None
        assert not c.synced()
    finally:
        c.stop()


def test_cache_recovers_after_the_apiserver_comes_back(cluster, cache):
    cluster.create_resource_slice(slice_("node-a", [gpu("gpu-0")], name="s-a"))
    cluster.fail_next(3, status=0)
    cache.start()
    assert cache.wait_synced(5)
    assert len(cache.index()) == 1
    assert cache.slices.errors + cache.classes.errors + cache.claims.errors >= 1


def expiring_reflector(items_of: Any) -> tuple[Reflector, threading.Event, threading.Event]:
    """A Reflector whose first watch expires at once (410), so it lists again; `items_of(n)` are the items of
    the n-th list. Returns it unstarted, with the event set once the second watch runs and the event that
    ends that watch."""
    lists = []
    relisted = threading.Event()
    release = threading.Event()

    def list_fn():
        lists.append(1)
        return {"metadata": {"resourceVersion": str(len(lists))}, "items": items_of(len(lists))}

    def watch_fn(rv):
        if len(lists) == 1:
            yield WatchEvent("ERROR", {"code": 410, "reason": "Expired"})
            return
        relisted.set()
        release.wait(5)

    return Reflector("things", list_fn, watch_fn, backoff_initial=0.01, backoff_max=0.01), relisted, release


def test_reflector_relists_when_the_watch_expires():
    r, relisted, release = expiring_reflector(lambda n: [{"metadata": {"name": f"o{n}", "resourceVersion": str(n)}}])
    r.start()
    try:
        assert relisted.wait(5)
        assert [o["metadata"]["name"] for o in r.objects()] == ["o2"]
        assert r.errors == 0  # an expired watch is routine, not an error
    finally:
        release.set()
        r.stop()


def test_the_first_list_is_frozen_before_the_collector_can_walk_it(monkeypatch):
    """At 1,000 DGX nodes the first collections after the slice list walked 1.7 million decoded objects, 2.4 s
    with every thread stopped: the first list is frozen while the collector is still off, a relist is not."""
    import controller.cluster.informer as informer

    freezes: list[bool] = []
    real_freeze = informer.keep_for_good

    def spy() -> None:
        freezes.append(gc.isenabled())
        real_freeze()

    monkeypatch.setattr(informer, "keep_for_good", spy)
    first: list[dict] = []

    def items_of(n: int) -> list[dict]:
        items = [{"metadata": {"name": f"o{n}-{i}", "resourceVersion": "1"}, "spec": {"devices": [{}]}}
                 for i in range(100)]
        if n == 1:
            first.extend(items)
        return items

    gc.unfreeze()
    gc.enable()
    r, relisted, release = expiring_reflector(items_of)
    r.start()
    try:
        assert relisted.wait(5)
        assert freezes == [False]  # once, and with the collector off
        tracked = {id(o) for o in gc.get_objects()}
        assert first and not any(id(o) in tracked for o in first)  # frozen: out of every generation
        assert gc.isenabled()
    finally:
        release.set()
        r.stop()
        gc.unfreeze()


def test_reflector_applies_bookmarks_without_changing_objects():
    versions = []

    def watch_fn(rv):
        versions.append(rv)
        if len(versions) == 1:
            yield WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": "42"}})
            return
        raise ApiError(0, "Unreachable", "stop")

    r = Reflector("things", lambda: {"metadata": {"resourceVersion": "7"}, "items": []}, watch_fn,
                  backoff_initial=0.01, backoff_max=0.01)
    r.start()
    try:
        assert wait_for(lambda: len(versions) >= 2)
        assert versions[:2] == ["7", "42"]
        assert r.objects() == []
    finally:
        r.stop()


def test_reflector_survives_an_unexpected_exception():
    calls = []

    def list_fn():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("malformed answer")
        return {"metadata": {"resourceVersion": "1"}, "items": [{"metadata": {"name": "a"}}]}

    release = threading.Event()

    def watch_fn(rv):
        release.wait(5)
        return iter(())

    r = Reflector("things", list_fn, watch_fn, backoff_initial=0.01, backoff_max=0.01)
    r.start()
    try:
        assert r.synced.wait(5)
        assert [o["metadata"]["name"] for o in r.objects()] == ["a"]
        assert r.errors == 1
    finally:
        release.set()
        r.stop()


class _RecordingStop:
    """Stands in for a reflector's stop event: records each backoff wait instead of sleeping."""

    def __init__(self, waits_until_stop: int) -> None:
        self.waits: list[float] = []
        self._limit = waits_until_stop

    def is_set(self) -> bool:
        return len(self.waits) >= self._limit

    def wait(self, timeout: float) -> bool:
        self.waits.append(timeout)
        return self.is_set()


def test_reflector_backs_off_exponentially_up_to_its_cap_and_starts_over_after_a_list(monkeypatch):
    lists = []

    def list_fn():
        lists.append(1)
        if len(lists) <= 4:
            raise ApiError(503, "ServiceUnavailable")
        return {"metadata": {"resourceVersion": "1"}, "items": []}

    def watch_fn(rv):
        raise ApiError(0, "Unreachable", "connection refused")

    r = Reflector("things", list_fn, watch_fn, backoff_initial=1.0, backoff_max=4.0)
    stop = _RecordingStop(waits_until_stop=5)
    monkeypatch.setattr(r, "_stop", stop)
    r._run()
    # four failed lists, then a good list whose watch fails: the delay starts over
    for waited, base in zip(stop.waits, [1.0, 2.0, 4.0, 4.0, 1.0], strict=True):
        assert 0.8 * base <= waited <= min(1.2 * base, 4.0), stop.waits
    assert r.errors == 5
