"""The ResourceSlice publisher against the in-memory apiserver: diff, generations, republish, backoff, cleanup."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from driver.backoff import Backoff
from driver.kubeapi import Obj
from driver.names import slice_name
from driver.slices import build_slices
from kubeletplugin.publisher import Publisher
from tests.builders.inventory import make_gpu, make_inventory
from tests.fakes.apiserver import FakeKubeAPI

NODE = "node-a"


def one_slice(gpus: int = 2) -> list[Obj]:
    return build_slices(make_inventory(*(make_gpu(i, mig_capable=False) for i in range(gpus)), node=NODE))


def two_slices() -> list[Obj]:
    slices = build_slices(make_inventory(make_gpu(0), node=NODE), mig_strategy="dynamic")
    assert len(slices) == 2
    return slices


def three_slices() -> list[Obj]:
    slices = build_slices(make_inventory(*(make_gpu(i, mig_capable=False) for i in range(257)), node=NODE))
    assert len(slices) == 3
    return slices


def stored(fake: FakeKubeAPI) -> dict[str, Obj]:
    return {name: obj for name, obj in fake.slices.items() if obj["spec"]["nodeName"] == NODE}


def generations(fake: FakeKubeAPI) -> set[int]:
    return {obj["spec"]["pool"]["generation"] for obj in stored(fake).values()}


def writes(fake: FakeKubeAPI, since: int = 0) -> list[str]:
    return [c for c in fake.calls[since:] if c.split()[0] in {"create_slice", "replace_slice", "delete_slice"}]


def eventually(condition: Callable[[], Any], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


@pytest.fixture
def fake() -> FakeKubeAPI:
    api = FakeKubeAPI()
    api.add_node(NODE)
    return api


@pytest.fixture
def running(fake: FakeKubeAPI) -> Iterator[Callable[..., Publisher]]:
    started: list[Publisher] = []

    def start(slices: list[Obj], **kwargs: Any) -> Publisher:
        kwargs.setdefault("republish_delay", 0)
        kwargs.setdefault("watch_timeout", 1)
        kwargs.setdefault("resync_interval", 3600)
        pub = Publisher(fake, NODE, slices, **kwargs)
        pub.start()
        started.append(pub)
        return pub

    yield start
    for pub in started:
        pub.stop()
    fake.close_watches()


# -- the diff and generation rules ------------------------------------------------------------------------


def test_first_sync_creates_named_slices_owned_by_the_node(fake: FakeKubeAPI) -> None:
    pub = Publisher(fake, NODE, two_slices())
    assert pub.sync_once()
    objs = stored(fake)
    assert sorted(objs) == [slice_name(NODE, 0), slice_name(NODE, 1)]
    node_uid = fake.nodes[NODE]["metadata"]["uid"]
    for obj in objs.values():
        assert obj["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid, "controller": True}
        ]
        assert obj["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 2}
    assert pub.generation == 1
    assert (pub.syncs, pub.publishes, pub.errors, pub.last_sync_ok) == (1, 1, 0, True)
    assert pub.last_sync_time is not None


def test_a_sync_without_changes_writes_nothing(fake: FakeKubeAPI) -> None:
    pub = Publisher(fake, NODE, two_slices())
    pub.sync_once()
    mark = len(fake.calls)
    assert pub.sync_once()
    assert writes(fake, mark) == []
    assert (pub.syncs, pub.publishes) == (2, 1)


def test_syncs_never_change_the_desired_slices_they_write_from(fake: FakeKubeAPI) -> None:
    # the bodies written share their devices with the desired slices (no copy of 50 KB slices per pass): a write
    # path that changed one in place would corrupt what every later pass publishes
    pub = Publisher(fake, NODE, two_slices())
    desired = copy.deepcopy(pub._desired)
    assert pub.sync_once()
    with_devices = next(i for i, s in enumerate(desired) if s["spec"].get("devices"))
    fake.external_edit_slice(slice_name(NODE, with_devices), lambda o: o["spec"]["devices"].pop())
    fake.external_delete_slice(slice_name(NODE, 1 - with_devices))
    assert pub.sync_once()  # an update and a create, in a new generation
    assert pub._desired == desired
    published = [stored(fake)[slice_name(NODE, i)]["spec"] for i in range(2)]
    assert [{k: v for k, v in spec.items() if k != "pool"} for spec in published] == \
        [{k: v for k, v in s["spec"].items() if k != "pool"} for s in desired]


def test_a_single_slice_change_is_updated_in_place_without_a_generation_bump(fake: FakeKubeAPI) -> None:
    pub = Publisher(fake, NODE, one_slice(2))
    pub.sync_once()
    mark = len(fake.calls)
    pub.update(one_slice(3))
    assert pub.sync_once()
    assert writes(fake, mark) == ["replace_slice"]
    assert generations(fake) == {1}
    assert len(stored(fake)[slice_name(NODE, 0)]["spec"]["devices"]) == 3


def test_changing_two_slices_bumps_the_generation_of_all(fake: FakeKubeAPI) -> None:
    pub = Publisher(fake, NODE, two_slices())
    pub.sync_once()
    changed = two_slices()
    for obj in changed:
        obj["metadata"]["labels"]["extra"] = "yes"
    mark = len(fake.calls)
    pub.update(changed)
    pub.sync_once()
    assert writes(fake, mark) == ["replace_slice", "replace_slice"]
    assert generations(fake) == {2}


def test_growing_the_pool_bumps_the_generation_and_the_slice_count(fake: FakeKubeAPI) -> None:
    pub = Publisher(fake, NODE, one_slice())
    pub.sync_once()
    mark = len(fake.calls)
    pub.update(two_slices())
    pub.sync_once()
    assert writes(fake, mark) == ["replace_slice", "create_slice"]
    assert generations(fake) == {2}
    assert {o["spec"]["pool"]["resourceSliceCount"] for o in stored(fake).values()} == {2}


def test_shrinking_the_pool_deletes_obsolete_slices_before_updating(fake: FakeKubeAPI) -> None:
    pub = Publisher(fake, NODE, three_slices())
    pub.sync_once()
    mark = len(fake.calls)
    pub.update(one_slice())
    pub.sync_once()
    # Two deletions, then the one remaining slice is rewritten in place (count 3 -> 1): no bump needed.
    assert writes(fake, mark) == ["delete_slice", "delete_slice", "replace_slice"]
    assert sorted(stored(fake)) == [slice_name(NODE, 0)]
    assert stored(fake)[slice_name(NODE, 0)]["spec"]["pool"] == {"name": NODE, "generation": 1,
                                                                 "resourceSliceCount": 1}


def test_plan_orders_deletes_updates_creates_and_names_the_generation(fake: FakeKubeAPI) -> None:
    pub = Publisher(fake, NODE, three_slices())
    pub.sync_once()
    existing = list(stored(fake).values())
    plan = pub.plan(two_slices(), existing)
    assert plan.delete == (slice_name(NODE, 2),)
    assert [b["metadata"]["name"] for b in plan.update] == [slice_name(NODE, 0), slice_name(NODE, 1)]
    assert plan.create == ()
    assert plan.generation == 2
    assert pub.plan(three_slices(), existing).empty


# -- adoption after a restart --------------------------------------------------------------------------------


def test_a_restarted_publisher_adopts_identical_slices_without_writing(fake: FakeKubeAPI) -> None:
    first = Publisher(fake, NODE, two_slices())
    first.sync_once()
    first.update(one_slice(1))
    first.sync_once()
    first.update(two_slices())
    first.sync_once()
    assert generations(fake) == {2}
    mark = len(fake.calls)
    second = Publisher(fake, NODE, two_slices())
    assert second.sync_once()
    assert writes(fake, mark) == []
    assert second.generation == 2


def test_a_restarted_publisher_continues_from_the_highest_generation(fake: FakeKubeAPI) -> None:
    first = Publisher(fake, NODE, two_slices())
    first.sync_once()
    for name in stored(fake):
        fake.external_edit_slice(name, lambda o: o["spec"]["pool"].update(generation=7))
    second = Publisher(fake, NODE, three_slices())
    second.sync_once()
    assert generations(fake) == {8}


def test_slices_of_this_node_under_other_names_are_replaced_and_other_nodes_untouched(fake: FakeKubeAPI) -> None:
    stray = copy.deepcopy(one_slice()[0])
    stray["metadata"]["name"] = "0-gpu.tessera.dev-node-a-x7k2p"
    fake.create_resource_slice(stray)
    other = build_slices(make_inventory(make_gpu(0), node="node-b"))[0]
    other["metadata"]["name"] = slice_name("node-b", 0)
    fake.create_resource_slice(other)
    Publisher(fake, NODE, one_slice()).sync_once()
    assert sorted(stored(fake)) == [slice_name(NODE, 0)]
    assert slice_name("node-b", 0) in fake.slices


# -- the Node owner --------------------------------------------------------------------------------------------


def test_without_a_node_object_slices_are_published_unowned_and_owned_later() -> None:
    api = FakeKubeAPI()
    now = [1000.0]
    pub = Publisher(api, NODE, one_slice(), owner_retry_interval=30, clock=lambda: now[0])
    assert pub.sync_once()
    assert "ownerReferences" not in stored(api)[slice_name(NODE, 0)]["metadata"]
    api.add_node(NODE)
    pub.sync_once()
    assert "ownerReferences" not in stored(api)[slice_name(NODE, 0)]["metadata"]  # not retried yet
    now[0] += 31
    pub.sync_once()
    owners = stored(api)[slice_name(NODE, 0)]["metadata"]["ownerReferences"]
    assert owners[0]["uid"] == api.nodes[NODE]["metadata"]["uid"]


def test_a_throttled_node_read_holds_the_publish_until_the_node_is_read(fake: FakeKubeAPI) -> None:
    # Publishing unowned after a 429 meant writing every slice again once the Node could be read: in a 1,000-node
    # storm 457 nodes rewrote theirs 30 s later, while the apiserver was still catching up
    now = [1000.0]
    pub = Publisher(fake, NODE, two_slices(), owner_retry_interval=30, clock=lambda: now[0])

    def throttle_node_read(call: str) -> None:
        if call.startswith("get_node"):
            fake.on_call = None
            fake.fail_next(1, 429, "TooManyRequests", retry_after=2.0)

    fake.on_call = throttle_node_read
    assert not pub.sync_once()
    assert stored(fake) == {}  # nothing written without its owner
    assert "429" in pub.last_error
    mark = len(fake.calls)
    assert pub.sync_once()
    # retried from the slices the refused pass listed, the Node read first
    assert [c.split()[0] for c in fake.calls[mark:]] == ["get_node", "create_slice", "create_slice"]
    uid = fake.nodes[NODE]["metadata"]["uid"]
    assert all(o["metadata"]["ownerReferences"][0]["uid"] == uid for o in stored(fake).values())
    now[0] += 31
    mark = len(fake.calls)
    assert pub.sync_once()
    assert writes(fake, mark) == []  # nothing to write a second time


def test_a_restarted_agent_whose_node_read_is_throttled_still_updates_its_owned_slices(fake: FakeKubeAPI) -> None:
    # a rollout storm: the slices exist with their owner, the new agent's Node read gets a 429; the update keeps
    # the owner reference the slices carry, so nothing has to be written again once the Node is read
    now = [1000.0]
    Publisher(fake, NODE, two_slices()).sync_once()
    pub = Publisher(fake, NODE, labelled(two_slices(), "v2"), owner_retry_interval=30, clock=lambda: now[0])

    def throttle_node_read(call: str) -> None:
        if call.startswith("get_node"):
            fake.on_call = None
            fake.fail_next(1, 429, "TooManyRequests")

    fake.on_call = throttle_node_read
    mark = len(fake.calls)
    assert pub.sync_once()
    assert writes(fake, mark) == ["replace_slice", "replace_slice"]
    uid = fake.nodes[NODE]["metadata"]["uid"]
    assert all(o["metadata"]["labels"]["extra"] == "v2" for o in stored(fake).values())
    assert all(o["metadata"]["ownerReferences"][0]["uid"] == uid for o in stored(fake).values())
    now[0] += 31
    mark = len(fake.calls)
    assert pub.sync_once()
    assert [c.split()[0] for c in fake.calls[mark:]] == ["list_slices", "get_node"]  # the Node read, no write


@pytest.mark.parametrize("status", [403, 500, 0])
def test_a_node_that_cannot_be_read_otherwise_does_not_hold_the_publish(fake: FakeKubeAPI, status: int) -> None:
    pub = Publisher(fake, NODE, one_slice(), owner_retry_interval=30)

    def refuse_node_read(call: str) -> None:
        if call.startswith("get_node"):
            fake.on_call = None
            fake.fail_next(1, status, "refused")

    fake.on_call = refuse_node_read
    assert pub.sync_once()
    assert "ownerReferences" not in stored(fake)[slice_name(NODE, 0)]["metadata"]


# -- failures and backoff ---------------------------------------------------------------------------------------


def test_an_unreachable_apiserver_is_an_error_count_not_an_exception(fake: FakeKubeAPI) -> None:
    pub = Publisher(fake, NODE, one_slice())
    assert pub.last_sync_ok is None
    fake.fail_next(10)
    assert not pub.sync_once()
    assert pub.last_sync_ok is False
    assert pub.errors == 1
    assert "Unreachable" in pub.last_error
    assert stored(fake) == {}


def refuse_write(fake: FakeKubeAPI, call: str, nth: int) -> None:
    """The apiserver answers the `nth` `call` (create_slice, replace_slice) with 429, as in a rollout storm."""
    seen = 0

    def hook(name: str) -> None:
        nonlocal seen
        if name == call:
            seen += 1
            if seen == nth:
                fake.on_call = None
                fake.fail_next(1, 429, "TooManyRequests")

    fake.on_call = hook


def labelled(slices: list[Obj], value: str) -> list[Obj]:
    for obj in slices:
        obj["metadata"]["labels"]["extra"] = value
    return slices


def test_a_first_publish_that_broke_off_is_finished_without_rewriting_what_was_written(fake: FakeKubeAPI) -> None:
    pub = Publisher(fake, NODE, three_slices())
    refuse_write(fake, "create_slice", 2)
    assert not pub.sync_once()
    assert sorted(stored(fake)) == [slice_name(NODE, 0)]
    mark = len(fake.calls)
    assert pub.sync_once()
    # the slice already written is the current generation's and right: only the two missing ones are created
    assert writes(fake, mark) == ["create_slice", "create_slice"]
    assert generations(fake) == {1}
    assert {o["spec"]["pool"]["resourceSliceCount"] for o in stored(fake).values()} == {3}


def test_an_upgrade_that_broke_off_is_finished_in_the_generation_it_started(fake: FakeKubeAPI) -> None:
    pub = Publisher(fake, NODE, three_slices())
    pub.sync_once()
    pub.update(labelled(three_slices(), "v2"))
    refuse_write(fake, "replace_slice", 2)
    assert not pub.sync_once()
    assert sorted(o["spec"]["pool"]["generation"] for o in stored(fake).values()) == [1, 1, 2]
    mark = len(fake.calls)
    assert pub.sync_once()
    assert writes(fake, mark) == ["replace_slice", "replace_slice"]
    assert generations(fake) == {2}
    assert {o["metadata"]["labels"]["extra"] for o in stored(fake).values()} == {"v2"}


def test_a_new_change_after_a_broken_off_upgrade_starts_a_new_generation(fake: FakeKubeAPI) -> None:
    pub = Publisher(fake, NODE, three_slices())
    pub.sync_once()
    pub.update(labelled(three_slices(), "v2"))
    refuse_write(fake, "replace_slice", 2)
    assert not pub.sync_once()
    # generation 2 now holds one slice of v2 content, which v3 replaces: finishing generation 2 would mix them
    pub.update(labelled(three_slices(), "v3"))
    mark = len(fake.calls)
    assert pub.sync_once()
    assert writes(fake, mark) == ["replace_slice"] * 3
    assert generations(fake) == {3}
    assert {o["metadata"]["labels"]["extra"] for o in stored(fake).values()} == {"v3"}


def test_lists_come_from_the_watch_cache_no_older_than_the_last_answer(fake: FakeKubeAPI) -> None:
    # a consistent list (no resourceVersion) was a range over every slice in etcd; 1,000 of them at once took
    # etcd to 14 GiB
    pub = Publisher(fake, NODE, two_slices())
    assert pub.sync_once()
    last_write = max(int(o["metadata"]["resourceVersion"]) for o in stored(fake).values())
    assert pub.sync_once()
    fake.fail_next(1, 429, "TooManyRequests")
    assert not pub.sync_once()
    assert pub.sync_once()
    # first anything the cache has; then at least its own last write; after a failure anything again
    assert fake.list_versions == ["0", str(last_write), str(last_write), "0"]


def test_a_conflicting_write_fails_the_sync_and_the_next_sync_recovers(fake: FakeKubeAPI) -> None:
    pub = Publisher(fake, NODE, one_slice(2))
    pub.sync_once()
    pub.update(one_slice(3))

    def edit_between_list_and_replace(call: str) -> None:
        if call == "replace_slice":
            fake.on_call = None
            fake.external_edit_slice(slice_name(NODE, 0), lambda o: o["metadata"].setdefault("labels", {}))

    fake.on_call = edit_between_list_and_replace
    assert not pub.sync_once()
    assert pub.sync_once()
    assert len(stored(fake)[slice_name(NODE, 0)]["spec"]["devices"]) == 3


def _sync_delays(fake: FakeKubeAPI, count: int, **publisher: Any) -> tuple[list[float], Publisher]:
    """The waits of the sync thread until it published (after `count` + 1 waits)."""
    delays: list[float] = []
    done = threading.Event()

    def record(event: threading.Event, timeout: float) -> bool:
        delays.append(timeout)
        if len(delays) > count:
            done.set()
            return event.wait(timeout)
        return True

    pub = Publisher(fake, NODE, one_slice(), watch=False, resync_interval=3600, wait=record, **publisher)
    pub.start()
    try:
        assert done.wait(10)
        assert pub.wait_synced(10)
    finally:
        pub.stop()
    return delays, pub


def test_the_sync_thread_backs_off_while_failing_and_publishes_once_reachable(fake: FakeKubeAPI) -> None:
    fake.fail_next(4)
    delays, pub = _sync_delays(fake, 4, backoff=Backoff(initial=0.5, maximum=3.0, jitter=0.0))
    # Four failed lists back off up to the cap; after the publish the next pass is the periodic resync.
    assert delays[:5] == [0.5, 1.0, 2.0, 3.0, 3600]
    assert pub.errors == 4
    assert slice_name(NODE, 0) in stored(fake)


def test_a_throttled_apiserver_is_retried_soon_not_after_the_long_backoff(fake: FakeKubeAPI) -> None:
    # 429s from API Priority and Fairness: the apiserver is busy, not gone. Growing the wait to the 30 s cap
    # left nodes idle long after the crowd had thinned in a 1,000-node storm.
    fake.fail_next(6, 429, "Too Many Requests")
    delays, pub = _sync_delays(
        fake, 6, backoff=Backoff(initial=0.5, maximum=30.0, jitter=0.0),
        throttled_backoff=Backoff(initial=1.0, maximum=4.0, factor=1.5, jitter=0.0))
    assert delays == [1.0, 1.5, 2.25, 3.375, 4.0, 4.0, 3600]  # no Retry-After: the short backoff alone
    assert pub.errors == 6


@pytest.mark.parametrize(("rng", "expected"), [(0.0, [7.0, 7.0, 8.0]), (1.0, [10.5, 10.5, 12.0])])
def test_a_throttled_retry_waits_what_retry_after_asks_up_to_a_cap(fake: FakeKubeAPI, rng: float,
                                                                    expected: list[float]) -> None:
    # never earlier than Retry-After, spread over up to half as long again; APF's 32 s is waited out as 8 s
    fake.fail_next(2, 429, "Too Many Requests", retry_after=7.0)
    fake.fail_next(1, 429, "Too Many Requests", retry_after=32.0)
    delays, _ = _sync_delays(fake, 3, throttled_backoff=Backoff(initial=1.0, maximum=4.0, jitter=0.0,
                                                                rng=lambda: rng))
    assert delays == [*expected, 3600]


def test_an_unreachable_apiserver_still_gets_the_long_backoff_after_throttling(fake: FakeKubeAPI) -> None:
    # a 429 then the apiserver going away: back to the exponential backoff, whose count the 429s did not touch
    fake.fail_next(1, 429, "Too Many Requests")
    fake.fail_next(3, 0)
    delays, _ = _sync_delays(fake, 4, backoff=Backoff(initial=0.5, maximum=30.0, jitter=0.0),
                             throttled_backoff=Backoff(initial=1.0, maximum=4.0, jitter=0.0))
    assert delays == [1.0, 0.5, 1.0, 2.0, 3600]


def _refuse_second(fake: FakeKubeAPI, call: str, status: int) -> None:
    seen: list[str] = []

    def hook(name: str) -> None:
        seen.append(name)
        if name == call and seen.count(call) == 2:
            fake.fail_next(1, status, "refused")

    fake.on_call = hook


def test_a_pass_refused_with_429_is_retried_from_what_it_knew_without_a_list(fake: FakeKubeAPI) -> None:
    # a list of resourceslices weighs 10 APF seats in a large cluster, a write one
    pub = Publisher(fake, NODE, two_slices())
    _refuse_second(fake, "create_slice", 429)
    assert not pub.sync_once()
    fake.on_call = None
    mark = len(fake.calls)
    assert pub.sync_once()
    assert [c.split()[0] for c in fake.calls[mark:]] == ["get_node", "create_slice"]  # the refused create only
    assert len(stored(fake)) == 2 and generations(fake) == {1}
    mark = len(fake.calls)
    assert pub.sync_once()
    assert [c.split()[0] for c in fake.calls[mark:]] == ["list_slices"]  # the pass after a success lists again


@pytest.mark.parametrize("status", [409, 500, 0])
def test_a_pass_that_failed_otherwise_lists_again(fake: FakeKubeAPI, status: int) -> None:
    pub = Publisher(fake, NODE, two_slices())
    _refuse_second(fake, "create_slice", status)
    assert not pub.sync_once()
    fake.on_call = None
    mark = len(fake.calls)
    assert pub.sync_once()
    assert fake.calls[mark].split()[0] == "list_slices"
    assert len(stored(fake)) == 2


def test_wait_synced_reports_false_while_the_apiserver_stays_down(fake: FakeKubeAPI) -> None:
    fake.fail_next(1000)
    pub = Publisher(fake, NODE, one_slice(), watch=False, backoff=Backoff(initial=0.01, maximum=0.02))
    pub.start()
    try:
        assert not pub.wait_synced(0.2)
    finally:
        pub.stop()
    assert pub.errors >= 1


# -- republishing ---------------------------------------------------------------------------------------------


def test_update_while_running_is_published(fake: FakeKubeAPI, running: Callable[..., Publisher]) -> None:
    pub = running(one_slice(1))
    assert pub.wait_synced(10)
    pub.update(two_slices())
    assert pub.wait_synced(10)
    assert len(stored(fake)) == 2


def test_slices_deleted_by_someone_else_are_republished(fake: FakeKubeAPI, running: Callable[..., Publisher]) -> None:
    pub = running(two_slices())
    assert pub.wait_synced(10)
    eventually(lambda: fake._watchers)
    for name in list(stored(fake)):
        fake.external_delete_slice(name)
    eventually(lambda: len(stored(fake)) == 2)
    eventually(lambda: generations(fake) == {pub.generation} and pub.generation >= 2)


def test_a_slice_edited_by_someone_else_is_restored(fake: FakeKubeAPI, running: Callable[..., Publisher]) -> None:
    pub = running(one_slice(2))
    assert pub.wait_synced(10)
    eventually(lambda: fake._watchers)
    name = slice_name(NODE, 0)
    fake.external_edit_slice(name, lambda o: o["spec"].update(devices=[]))
    eventually(lambda: len(stored(fake)[name]["spec"]["devices"]) == 2)
    assert generations(fake) == {1}


# -- fields the apiserver drops ---------------------------------------------------------------------------------


class DroppingKubeAPI(FakeKubeAPI):
    """An apiserver with DRAConsumableCapacity off: it silently drops the consumable-capacity fields."""

    @staticmethod
    def _drop(body: Obj) -> Obj:
        body = copy.deepcopy(body)
        for device in body["spec"].get("devices") or []:
            device.pop("allowMultipleAllocations", None)
            for capacity in device.get("capacity", {}).values():
                capacity.pop("requestPolicy", None)
        return body

    def create_resource_slice(self, body: Obj) -> Obj:
        return super().create_resource_slice(self._drop(body))

    def replace_resource_slice(self, name: str, body: Obj) -> Obj:
        return super().replace_resource_slice(name, self._drop(body))


def test_fields_dropped_by_the_apiserver_do_not_cause_an_update_loop() -> None:
    api = DroppingKubeAPI()
    api.add_node(NODE)
    pub = Publisher(api, NODE, one_slice())
    pub.sync_once()
    assert "allowMultipleAllocations" not in stored(api)[slice_name(NODE, 0)]["spec"]["devices"][0]
    mark = len(api.calls)
    pub.sync_once()
    assert writes(api, mark) == []


# -- cleanup -------------------------------------------------------------------------------------------------------


def test_stop_with_cleanup_deletes_the_pool(fake: FakeKubeAPI, running: Callable[..., Publisher]) -> None:
    pub = running(two_slices())
    assert pub.wait_synced(10)
    pub.stop(cleanup=True)
    assert stored(fake) == {}


def test_stop_without_cleanup_leaves_the_pool(fake: FakeKubeAPI, running: Callable[..., Publisher]) -> None:
    pub = running(two_slices())
    assert pub.wait_synced(10)
    pub.stop()
    assert len(stored(fake)) == 2


def test_start_twice_is_refused(fake: FakeKubeAPI, running: Callable[..., Publisher]) -> None:
    pub = running(one_slice())
    with pytest.raises(RuntimeError, match="already started"):
        pub.start()


def test_slices_recreated_after_the_node_was_replaced_get_the_new_node_uid(fake: FakeKubeAPI) -> None:
    pub = Publisher(fake, NODE, one_slice())
    pub.sync_once()
    new_uid = fake.add_node(NODE)["metadata"]["uid"]  # the Node was deleted and registered again
    fake.external_delete_slice(slice_name(NODE, 0))  # what the garbage collector does with orphans
    pub.sync_once()
    assert stored(fake)[slice_name(NODE, 0)]["metadata"]["ownerReferences"][0]["uid"] == new_uid


def test_a_deleted_node_is_no_longer_the_owner_of_recreated_slices(fake: FakeKubeAPI) -> None:
    pub = Publisher(fake, NODE, one_slice())
    pub.sync_once()
    del fake.nodes[NODE]
    fake.external_delete_slice(slice_name(NODE, 0))
    pub.sync_once()
    assert "ownerReferences" not in stored(fake)[slice_name(NODE, 0)]["metadata"]


def test_the_echo_of_its_own_writes_does_not_make_the_publisher_sync_again(
    fake: FakeKubeAPI, running: Callable[..., Publisher]
) -> None:
    pub = running(one_slice(2))
    assert pub.wait_synced(10)
    eventually(lambda: fake._watchers)
    name = slice_name(NODE, 0)
    fake.external_edit_slice(name, lambda o: o["spec"].update(devices=[]))
    eventually(lambda: pub.syncs >= 2 and len(stored(fake)[name]["spec"]["devices"]) == 2)
    # Watch events arrive in order: by the time this deletion has been repaired, the echo of the
    # previous repair has been seen too, and it must not have caused a sync of its own.
    fake.external_delete_slice(name)
    eventually(lambda: pub.syncs >= 3 and name in stored(fake))
    assert pub.syncs == 3


class WatchlessKubeAPI(FakeKubeAPI):
    """An apiserver whose watch keeps failing until `watch_ok` is set (e.g. RBAC fixed, proxy back)."""

    def __init__(self) -> None:
        super().__init__()
        self.watch_ok = threading.Event()
        self.watch_failures = 0

    def watch_resource_slices(self, resource_version: str, field_selector: str = "", timeout_seconds: int = 60):
        if not self.watch_ok.is_set():
            from driver.kubeapi import ApiError

            self.watch_failures += 1
            raise ApiError(403, "Forbidden", "cannot watch resourceslices")
        return super().watch_resource_slices(resource_version, field_selector, timeout_seconds)


def test_a_start_lists_the_pool_once_and_the_watch_starts_from_that_list(fake: FakeKubeAPI) -> None:
    # 1,000 publishers that restart at once: a second list per node only adds to the apiserver's queue
    pub = Publisher(fake, NODE, one_slice(), watch_timeout=1, resync_interval=3600)
    pub.start()
    try:
        assert pub.wait_synced(5)
        eventually(lambda: fake._watchers)
        assert fake.calls.count("list_slices") == 1
        fake.external_delete_slice(slice_name(NODE, 0))  # the watch (from the list's version) sees it
        eventually(lambda: slice_name(NODE, 0) in fake.slices)
    finally:
        pub.stop()
        fake.close_watches()


def test_changes_made_while_the_watch_was_down_are_repaired_once_it_is_back() -> None:
    api = WatchlessKubeAPI()
    api.add_node(NODE)
    pub = Publisher(api, NODE, one_slice(), republish_delay=0, watch_timeout=1, resync_interval=3600,
                    backoff=Backoff(initial=0.01, maximum=0.05))
    pub.start()
    try:
        assert pub.wait_synced(10)
        eventually(lambda: api.watch_failures >= 1)
        api.external_delete_slice(slice_name(NODE, 0))
        api.watch_ok.set()
        eventually(lambda: slice_name(NODE, 0) in stored(api))
    finally:
        pub.stop()
        api.close_watches()


def test_the_watch_retries_with_the_same_backoff_settings_but_its_own_count(fake: FakeKubeAPI) -> None:
    backoff = Backoff(initial=1.0, maximum=100.0, factor=3.0, jitter=0.0, rng=lambda: 0.5)
    pub = Publisher(fake, NODE, two_slices(), backoff=backoff)
    watch = pub._watch_backoff
    assert watch is not backoff
    assert [watch.next(), watch.next(), watch.next()] == [1.0, 3.0, 9.0]
    assert backoff.attempts == 0
