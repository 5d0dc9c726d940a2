"""Memory shares of one GPU (consumable capacity): booked by the scheduler, enforced by tessera's MPS daemon."""

from __future__ import annotations

import json

from e2e.cluster import DRIVER, NodeAgent
from e2e.kube import Kube
from e2e.workloads import (
    GiB,
    claim_spec,
    claim_template,
    consumed_memory,
    parse_quantity,
    pod,
    request,
    slices_of,
    wait_running,
    wait_unschedulable,
)

MiB = 1024**2


def gpu_memory(kube: Kube, node: str, device: str) -> int:
    for s in slices_of(kube, node):
        for d in s["spec"].get("devices", []):
            if d["name"] == device:
                return parse_quantity(d["capacity"]["memory"]["value"])
    raise AssertionError(f"{device} not published on {node}")


def test_memory_shares_fill_a_card_then_spill_and_block_whole_gpus(kube: Kube, dgx: NodeAgent, namespace: str) -> None:
    kube.create(claim_template("share", namespace, claim_spec(request(memory="10Gi"))))
    card_bytes = gpu_memory(kube, dgx.name, "gpu-0")
    fit = card_bytes // (10 * GiB)  # 81559Mi holds seven 10Gi shares, not eight
    shares = []
    for i in range(fit + 1):
        kube.create(pod(f"share-{i}", namespace, template="share", node=dgx.name))
        shares.append(wait_running(kube, namespace, f"share-{i}"))

    per_card: dict[str, int] = {}
    for running in shares:
        (result,) = running.results
        assert result.get("shareID"), "a memory request must be allocated as a share"
        assert consumed_memory(result) == 10 * GiB
        per_card[result["device"]] = per_card.get(result["device"], 0) + consumed_memory(result)
    for device, used in per_card.items():
        assert used <= gpu_memory(kube, dgx.name, device), f"{device} overbooked: {used}"
    first_card = shares[0].results[0]["device"]
    assert per_card[first_card] == fit * 10 * GiB, f"shares did not fill {first_card} first: {per_card}"
    assert shares[-1].results[0]["device"] != first_card, "the share that did not fit must go to another card"

    # Each prepared share: its own CDI spec resolvable by id, and an MPS limit equal to what it consumed.
    fake_mps = json.loads((dgx.state_dir / "fake-mps.json").read_text())
    for running in shares:
        uid = running.claim["metadata"]["uid"]
        (dev,) = [d for c in running.prepared for d in c["devices"]]
        assert dev["shareID"] == running.results[0]["shareID"]
        assert (dgx.cdi_dir / f"{DRIVER}-claim_{uid}.json").is_file()
        assert fake_mps[uid]["limitsMiB"] == [consumed_memory(running.results[0]) // MiB]

    # A whole GPU cannot take a card that holds a share ...
    kube.create(claim_template("whole-on-shared", namespace, claim_spec(request(selectors=[
        f'device.attributes["{DRIVER}"].uuid == "{gpu_uuid(kube, dgx.name, first_card)}"']))))
    kube.create(pod("whole-on-shared", namespace, template="whole-on-shared", node=dgx.name))
    wait_unschedulable(kube, namespace, "whole-on-shared")
    # ... but gets any card without one.
    kube.create(claim_template("whole", namespace, claim_spec(request())))
    kube.create(pod("whole", namespace, template="whole", node=dgx.name))
    whole = wait_running(kube, namespace, "whole")
    assert whole.devices[0] not in per_card


def gpu_uuid(kube: Kube, node: str, device: str) -> str:
    for s in slices_of(kube, node):
        for d in s["spec"].get("devices", []):
            if d["name"] == device:
                uuid: str = d["attributes"]["uuid"]["string"]
                return uuid
    raise AssertionError(f"{device} not published on {node}")
