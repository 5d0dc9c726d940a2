"""Dynamic MIG: partitions of one H100 handed out by the scheduler through shared counters, created at prepare."""

from __future__ import annotations

from typing import Any

from e2e.cluster import DRIVER, NodeAgent
from e2e.kube import Kube
from e2e.workloads import claim_spec, claim_template, pod, request, wait_running, wait_unschedulable

MIG_CLASS = f"mig.{DRIVER}"


def mig_request(profile: str) -> dict[str, Any]:
    return request("mig", device_class=MIG_CLASS,
                   selectors=[f'device.attributes["{DRIVER}"].profile == "{profile}"'])


def test_mig_partitions_share_one_gpu_until_its_slices_run_out(kube: Kube, mig_node: NodeAgent, namespace: str) -> None:
    # H100 80GB: 8 memory slices, 7 compute slices. 3g.40gb takes 4 memory slices, 2g.20gb 2 and
    # 1g.10gb 1, so 3g + 2g + 1g fit together (7 memory, 6 compute) and a second 3g no longer does.
    # (Two 3g.40gb alone would already use all eight memory slices.)
    placed = []
    for name, profile in (("mig-3g", "3g.40gb"), ("mig-2g", "2g.20gb"), ("mig-1g", "1g.10gb")):
        kube.create(claim_template(name, namespace, claim_spec(mig_request(profile))))
        kube.create(pod(name, namespace, template=name, node=mig_node.name))
        placed.append(wait_running(kube, namespace, name))

    devices = [r.results[0]["device"] for r in placed]
    assert [d.split("-mig-")[0] for d in devices] == ["gpu-0"] * 3, devices
    assert [d.split("-mig-")[1].rsplit("-", 1)[0] for d in devices] == ["3g40gb", "2g20gb", "1g10gb"]
    for running in placed:
        (dev,) = [d for c in running.prepared for d in c["devices"]]
        assert dev["deviceName"] == running.results[0]["device"]
        assert dev["cdiDeviceIDs"]

    kube.create(claim_template("mig-3g-more", namespace, claim_spec(mig_request("3g.40gb"))))
    kube.create(pod("mig-3g-more", namespace, template="mig-3g-more", node=mig_node.name))
    wait_unschedulable(kube, namespace, "mig-3g-more")
