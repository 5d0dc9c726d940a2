"""NVLink-constrained multi-GPU claims (matchAttribute gpu.tessera.dev/nvlinkIsland), placed by the real scheduler."""

from __future__ import annotations

from e2e.cluster import DRIVER, NodeAgent
from e2e.kube import Kube
from e2e.workloads import claim_spec, claim_template, pod, request, slices_of, wait_running, wait_unschedulable


def islands(kube: Kube, node: str) -> dict[str, str]:
    out = {}
    for s in slices_of(kube, node):
        for d in s["spec"].get("devices", []):
            attr = d.get("attributes", {}).get("nvlinkIsland")
            if attr and "-mig-" not in d["name"]:
                out[d["name"]] = attr["string"]
    return out


def test_two_gpus_on_one_island_get_a_bridged_pair(kube: Kube, a100: NodeAgent, namespace: str) -> None:
    kube.create(claim_template("pair", namespace, claim_spec(request(count=2), same_island=True)))
    kube.create(pod("pair", namespace, template="pair", node=a100.name))
    running = wait_running(kube, namespace, "pair")
    devices = sorted(running.devices)
    # a100-pcie-4 bridges 0-1 and 2-3: the only pairs that share an island.
    assert devices in (["gpu-0", "gpu-1"], ["gpu-2", "gpu-3"]), devices
    isl = islands(kube, a100.name)
    assert isl[devices[0]] == isl[devices[1]]
    assert sorted(d["deviceName"] for c in running.prepared for d in c["devices"]) == devices


def test_four_gpus_on_one_island_land_on_the_dgx_then_pend_when_it_is_full(
    kube: Kube, dgx: NodeAgent, a100: NodeAgent, namespace: str
) -> None:
    del a100  # present so the scheduler has to rule out a node whose islands hold only two GPUs
    kube.create(claim_template("quad", namespace, claim_spec(request(count=4), same_island=True)))
    first = []
    for name in ("quad-a", "quad-b"):
        kube.create(pod(name, namespace, template="quad"))
        first.append(wait_running(kube, namespace, name))
    for running in first:
        assert running.node == dgx.name, "only the DGX has an NVLink island of four or more GPUs"
        assert len(set(running.devices)) == 4
        assert all(r["driver"] == DRIVER for r in running.results)
    assert not set(first[0].devices) & set(first[1].devices)

    kube.create(pod("quad-c", namespace, template="quad"))
    message = wait_unschedulable(kube, namespace, "quad-c")
    assert "claim" in message.lower(), message
