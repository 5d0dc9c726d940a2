""""N across M" against the real kube-scheduler: the webhook's rewrite, and the evidence behind its shape.

The webhook keeps the user's request (`count: M`), asks for N/M of memory on each of its devices and
adds `distinctAttribute: gpu.tessera.dev/uuid` over it. These tests record what the scheduler does
with that: M = 3, 4 and 8 shares land on M different cards (M = 2 in test_webhook); with one card
free a single request of two shares stays Pending instead of doubling up on it, with or without the
constraint; two SEPARATE requests do share the free card, which is what the constraint is there to
rule out should the allocator ever treat the slots of one request like separate requests.
"""

from __future__ import annotations

from typing import Any

import pytest

from e2e.cluster import DRIVER, Cluster, NodeAgent
from e2e.kube import Kube, KubeError
from e2e.workloads import (
    GiB,
    RunningPod,
    claim,
    claim_spec,
    consumed_memory,
    parse_quantity,
    pod,
    request,
    slices_of,
    spread_config,
    wait_running,
    wait_unschedulable,
)

UUID_CONSTRAINT = f"{DRIVER}/uuid"


def uuids_by_device(cluster: Cluster, node: str) -> dict[str, str]:
    return {d["name"]: d["attributes"]["uuid"]["string"]
            for s in slices_of(cluster.kube, node) for d in s["spec"].get("devices", [])
            if "uuid" in d.get("attributes", {})}


def card_memory(kube: Kube, node: str) -> dict[str, int]:
    """Bytes of memory per whole-GPU device of the node."""
    return {d["name"]: parse_quantity(d["capacity"]["memory"]["value"])
            for s in slices_of(kube, node) for d in s["spec"].get("devices", [])
            if d.get("attributes", {}).get("type", {}).get("string") == "gpu"}


def take_all_cards_but_one(kube: Kube, node: NodeAgent, namespace: str) -> str:
    """Run a pod holding every whole GPU of the node but one; return the free card's device name."""
    memory = card_memory(kube, node.name)
    kube.create(claim("most", namespace, claim_spec(request("whole", count=len(memory) - 1))))
    kube.create(pod("most", namespace, claim_name="most", node=node.name))
    held = wait_running(kube, namespace, "most")
    # A request that names no memory consumes all of it: those cards can take no share.
    assert all(consumed_memory(r) == memory[r["device"]] for r in held.results), held.results
    (free,) = set(memory) - set(held.devices)
    return free


def assert_on_distinct_cards(cluster: Cluster, node: str, running: RunningPod, cards: int, per_card: int) -> None:
    uuids = uuids_by_device(cluster, node)
    assert len(running.results) == cards
    on = {uuids[d] for d in running.devices}
    assert len(on) == cards, f"{cards} shares must be on {cards} GPUs: {running.devices}"
    for r in running.results:
        assert r.get("shareID") and consumed_memory(r) == per_card, r
    # Every share is one prepared device with its own CDI id.
    assert len(running.cdi_ids) == cards


@pytest.mark.parametrize(("total", "cards"), [("12Gi", 3), ("16Gi", 4), ("16Gi", 8)])
def test_a_total_across_m_cards_lands_on_m_distinct_gpus(
    controller: Cluster, dgx: NodeAgent, namespace: str, total: str, cards: int
) -> None:
    kube = controller.kube
    spec = claim_spec(request("gpus", count=cards), config=spread_config(total, same_island=True))
    stored = kube.create(claim("spread", namespace, spec))
    per_card = parse_quantity(total) // cards
    devices = stored["spec"]["devices"]
    [gpus] = devices["requests"]
    assert gpus["name"] == "gpus" and gpus["exactly"]["count"] == cards
    assert parse_quantity(gpus["exactly"]["capacity"]["requests"]["memory"]) == per_card
    assert {"requests": ["gpus"], "distinctAttribute": UUID_CONSTRAINT} in devices["constraints"]
    assert {"requests": ["gpus"], "matchAttribute": f"{DRIVER}/nvlinkIsland"} in devices["constraints"]

    kube.create(pod("spread", namespace, claim_name="spread", node=dgx.name))
    running = wait_running(kube, namespace, "spread")
    assert_on_distinct_cards(controller, dgx.name, running, cards, per_card)
    # The results carry the request name the user wrote, which is what a container's
    # resources.claims[].request is matched against.
    assert {r["request"] for r in running.results} == {"gpus"}


def test_a_total_across_the_cards_of_a_first_available_alternative(
    controller: Cluster, dgx: NodeAgent, namespace: str
) -> None:
    """The rewrite inside firstAvailable: constraints naming `accel/big` are accepted and honoured."""
    kube = controller.kube
    accel = {"name": "accel", "firstAvailable": [
        {"name": "big", "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 2},
        {"name": "one", "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 1},
    ]}
    spec = claim_spec(accel, config=spread_config("8Gi", same_island=True, requests=("accel/big",)))
    stored = kube.create(claim("alt", namespace, spec))
    devices = stored["spec"]["devices"]
    big, one = devices["requests"][0]["firstAvailable"]
    assert parse_quantity(big["capacity"]["requests"]["memory"]) == 4 * GiB and big["count"] == 2
    assert "capacity" not in one
    assert {"requests": ["accel/big"], "distinctAttribute": UUID_CONSTRAINT} in devices["constraints"]

    kube.create(pod("alt", namespace, claim_name="alt", node=dgx.name))
    running = wait_running(kube, namespace, "alt")
    assert {r["request"] for r in running.results} == {"accel/big"}
    assert_on_distinct_cards(controller, dgx.name, running, 2, 4 * GiB)


def test_a_total_that_does_not_split_into_whole_gib_is_rejected_with_the_nearest_totals(
    controller: Cluster, namespace: str
) -> None:
    spec = claim_spec(request("gpus", count=3), config=spread_config("8Gi"))
    with pytest.raises(KubeError) as info:
        controller.kube.create(claim("uneven", namespace, spec), dry_run=True)
    message = info.value.message
    assert "6Gi" in message and "9Gi" in message, message


def hand_written_pair(namespace: str) -> dict[str, Any]:
    """Two 2 GiB shares in ONE request with no constraint at all: the allocator alone keeps them apart."""
    return claim("pair", namespace, claim_spec(request("gpus", count=2, memory="2Gi")))


def webhook_pair(namespace: str) -> dict[str, Any]:
    """"4Gi across 2", rewritten by the webhook into one request of 2 x 2Gi + distinctAttribute."""
    return claim("pair", namespace, claim_spec(request("gpus", count=2), config=spread_config("4Gi")))


@pytest.mark.parametrize("make_claim", [webhook_pair, hand_written_pair], ids=["webhook", "no-constraint"])
def test_two_shares_of_one_request_never_double_up_on_the_last_free_card(
    controller: Cluster, dgx: NodeAgent, namespace: str, make_claim: Any
) -> None:
    kube = controller.kube
    free = take_all_cards_but_one(kube, dgx, namespace)
    stored = kube.create(make_claim(namespace))
    [gpus] = stored["spec"]["devices"]["requests"]
    assert gpus["exactly"]["count"] == 2
    assert parse_quantity(gpus["exactly"]["capacity"]["requests"]["memory"]) == 2 * GiB
    kube.create(pod("pair", namespace, claim_name="pair", node=dgx.name))
    message = wait_unschedulable(kube, namespace, "pair")
    assert "cannot allocate all claims" in message, message
    claim_status = kube.get("ResourceClaim", "pair", namespace).get("status", {})
    assert not claim_status.get("allocation"), f"two shares of one request were allocated with {free} free: " \
                                               f"{claim_status}"


def test_two_separate_requests_do_share_the_last_free_card(
    controller: Cluster, dgx: NodeAgent, namespace: str
) -> None:
    """For contrast: nothing keeps two requests of one claim apart, hence the webhook's constraint."""
    kube = controller.kube
    free = take_all_cards_but_one(kube, dgx, namespace)
    kube.create(claim("two", namespace, claim_spec(request("a", memory="2Gi"), request("b", memory="2Gi"))))
    kube.create(pod("two", namespace, claim_name="two", node=dgx.name))
    running = wait_running(kube, namespace, "two")
    assert sorted(r["request"] for r in running.results) == ["a", "b"]
    assert running.devices == [free, free], running.devices
    assert len({r["shareID"] for r in running.results}) == 2
    assert all(consumed_memory(r) == 2 * GiB for r in running.results)
