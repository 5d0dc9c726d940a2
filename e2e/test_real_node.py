"""tessera on real nodes: kubelet v1.36.3 + containerd 2 + runc, containers that print what they got.

Every assertion is on what a user can look at: the container's own output (its environment, its
`/dev/nvidia*`, the MPS pipe directory it was given), kubelet's PodResources API, kubelet's events
and the apiserver. The CDI specs and MPS records under the node's own directories are read only to
check that a deleted pod leaves nothing behind.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from e2e.cluster import DRIVER
from e2e.kube import Kube, Obj
from e2e.node.podresources import list_dynamic_resources
from e2e.node.realnode import RealNode
from e2e.processes import wait_for
from e2e.realpods import StartedPod, cdi_specs, mps_daemons, probe_pod, wait_reported
from e2e.workloads import (
    claim,
    claim_spec,
    claim_template,
    delete_pods,
    pod_claim_name,
    request,
    slices_of,
    spread_config,
    time_slicing_config,
)


def _start(kube: Kube, node: RealNode, namespace: str, name: str, spec: Obj, **kwargs: object) -> StartedPod:
    kube.create(claim_template(name, namespace, spec))
    kube.create(probe_pod(name, namespace, node.name, templates={"gpu": name}, **kwargs))  # type: ignore[arg-type]
    return wait_reported(kube, node, namespace, name)


def _claim_of(kube: Kube, started: StartedPod, pod_claim: str = "gpu") -> Obj:
    name = pod_claim_name(started.pod, pod_claim)
    assert name
    return kube.get("ResourceClaim", name, started.pod["metadata"]["namespace"])


def _uuids(kube: Kube, node: RealNode, claim_obj: Obj) -> list[str]:
    """The UUIDs of the allocated devices, in allocation order, from the node's published slices."""
    attrs = {d["name"]: d.get("attributes", {})
             for s in slices_of(kube, node.name) for d in s["spec"].get("devices", [])}
    out = []
    for result in claim_obj["status"]["allocation"]["devices"]["results"]:
        uuid = _attr(attrs.get(result["device"], {}), "uuid")
        out.append(str(uuid or result["device"]))
    return out


def _attr(attributes: Obj, name: str) -> object:
    """An attribute of tessera's domain, whether the slice spells it qualified or not."""
    value = attributes.get(name) or attributes.get(f"{DRIVER}/{name}") or {}
    return next(iter(value.values()), None)


def _prepares(node: RealNode, claim_uid: str) -> int:
    text = node.plugin_log()
    return sum(1 for line in text.splitlines() if claim_uid in line and '"claim prepared"' in line)


def test_node_is_a_real_kubelet_with_containerd(kube: Kube, real_a100: RealNode, real_dgx: RealNode) -> None:
    for node in (real_a100, real_dgx):
        info = kube.get("Node", node.name)["status"]["nodeInfo"]
        assert info["kubeletVersion"] == "v1.36.3"
        assert info["containerRuntimeVersion"].startswith("containerd://2.")
        assert slices_of(kube, node.name), f"{node.name} published no ResourceSlices"


def test_whole_gpu_seen_from_inside_and_by_podresources(kube: Kube, real_dgx: RealNode, namespace: str) -> None:
    started = _start(kube, real_dgx, namespace, "whole", claim_spec(request()))
    view = started.views["probe"]
    c = _claim_of(kube, started)
    assert view.visible == _uuids(kube, real_dgx, c)
    # CUDA sees what the device nodes give it; no variable narrows it, and an NVIDIA hook adds nothing
    assert view.env["NVIDIA_VISIBLE_DEVICES"] == "void" and "CUDA_VISIBLE_DEVICES" not in view.env
    device = c["status"]["allocation"]["devices"]["results"][0]["device"]
    minor = int(re.sub(r"\D", "", device))
    assert f"/dev/nvidia{minor}" in view.devices and "/dev/nvidiactl" in view.devices
    assert not [d for d in view.devices if re.fullmatch(r"/dev/nvidia\d+", d) and d != f"/dev/nvidia{minor}"]

    held = list_dynamic_resources(real_dgx.podresources_socket, namespace, "whole")["probe"]
    assert [(h.device, h.pool) for h in held] == [(device, real_dgx.name)]
    assert held[0].cdi_ids and all(i.startswith(f"{DRIVER}/claim=") for i in held[0].cdi_ids)
    spec_text = "".join(p.read_text() for p in cdi_specs(real_dgx, c["metadata"]["uid"]))
    assert all(i.split("=", 1)[1] in spec_text for i in held[0].cdi_ids)


def test_two_gpus_on_one_nvlink_island(kube: Kube, real_a100: RealNode, namespace: str) -> None:
    started = _start(kube, real_a100, namespace, "pair", claim_spec(request(count=2), same_island=True))
    c = _claim_of(kube, started)
    devices = [r["device"] for r in c["status"]["allocation"]["devices"]["results"]]
    attrs = {d["name"]: d["attributes"] for s in slices_of(kube, real_a100.name) for d in s["spec"]["devices"]}
    assert len({_attr(attrs[d], "nvlinkIsland") for d in devices}) == 1
    assert sorted(started.views["probe"].visible) == sorted(_uuids(kube, real_a100, c))
    assert len(set(started.views["probe"].visible)) == 2


def test_two_memory_shares_on_one_card(kube: Kube, real_a100: RealNode, namespace: str) -> None:
    spec = claim_spec(request(memory="10Gi"))
    kube.create(claim_template("share", namespace, spec))
    for name in ("share-a", "share-b"):
        kube.create(probe_pod(name, namespace, real_a100.name, templates={"gpu": "share"}))
    a, b = (wait_reported(kube, real_a100, namespace, n) for n in ("share-a", "share-b"))
    va, vb = a.views["probe"], b.views["probe"]
    assert va.visible == vb.visible and len(va.visible) == 1, "first fit puts both shares on one card"
    for view in (va, vb):
        assert view.mps_dir == "/tmp/nvidia-mps" and "/tmp/nvidia-mps/control" in view.mps_files
        assert view.env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    shares = [list_dynamic_resources(real_a100.podresources_socket, namespace, n)["probe"][0]
              for n in ("share-a", "share-b")]
    assert shares[0].device == shares[1].device and shares[0].share_id and shares[0].share_id != shares[1].share_id
    daemons = mps_daemons(real_a100)
    for started in (a, b):
        uid = _claim_of(kube, started)["metadata"]["uid"]
        assert daemons[uid]["limitsMiB"] == [10 * 1024]


def test_twelve_gib_across_four_cards(kube: Kube, real_dgx: RealNode, namespace: str) -> None:
    # The webhook rewrites "12Gi across 4" into 4 distinct GPUs with 3Gi each.
    spec = claim_spec(request("gpus", count=4), config=spread_config("12Gi"))
    started = _start(kube, real_dgx, namespace, "spread", spec)
    view = started.views["probe"]
    c = _claim_of(kube, started)
    assert len(view.visible) == 4 and len(set(view.visible)) == 4
    assert view.visible == _uuids(kube, real_dgx, c)
    limits = mps_daemons(real_dgx)[c["metadata"]["uid"]]
    assert limits["limitsMiB"] == [3 * 1024] * 4
    assert limits["gpuUUIDs"] == view.visible, "the daemon's per-card limits follow the container's device order"


def test_dynamic_mig_1g(kube: Kube, real_dgx: RealNode, namespace: str) -> None:
    spec = claim_spec(request(device_class=f"mig.{DRIVER}",
                              selectors=[f'device.attributes["{DRIVER}"].profile == "1g.10gb"']))
    started = _start(kube, real_dgx, namespace, "mig", spec)
    view = started.views["probe"]
    assert len(view.visible) == 1 and view.visible[0].startswith("MIG-")
    # A MIG device is reached through its parent GPU's node plus the GI and CI capability files.
    assert len([d for d in view.devices if d.startswith("/dev/nvidia-caps/nvidia-cap")]) == 2
    assert len([d for d in view.devices if re.fullmatch(r"/dev/nvidia\d+", d)]) == 1


def test_time_sliced_claim_shared_by_two_containers(kube: Kube, real_a100: RealNode, namespace: str) -> None:
    config = time_slicing_config()
    kube.create(claim("sliced", namespace, claim_spec(request(device_class=f"timeslicing.{DRIVER}"), config=config)))
    kube.create(probe_pod("sliced", namespace, real_a100.name, claims={"gpu": "sliced"},
                          containers={"trainer": ["gpu"], "sidecar": ["gpu"]}))
    started = wait_reported(kube, real_a100, namespace, "sliced")
    trainer, sidecar = started.views["trainer"], started.views["sidecar"]
    assert trainer.visible == sidecar.visible and len(trainer.visible) == 1
    held = list_dynamic_resources(real_a100.podresources_socket, namespace, "sliced")
    assert held["trainer"] == held["sidecar"]


def test_deleted_pod_is_unprepared(kube: Kube, real_a100: RealNode, namespace: str) -> None:
    started = _start(kube, real_a100, namespace, "gone", claim_spec(request(memory="5Gi")))
    uid = _claim_of(kube, started)["metadata"]["uid"]
    assert cdi_specs(real_a100, uid) and uid in mps_daemons(real_a100)
    delete_pods(kube, namespace, ["gone"])
    wait_for(lambda: not cdi_specs(real_a100, uid) and uid not in mps_daemons(real_a100), timeout=60,
             what="NodeUnprepareResources to remove the claim's CDI spec and MPS daemon")
    assert not [t for t in real_a100.running_containers() if t in json.dumps(started.pod)]


def test_kubelet_restart_keeps_pods_and_republishes(kube: Kube, real_a100: RealNode, namespace: str) -> None:
    started = _start(kube, real_a100, namespace, "survivor", claim_spec(request()))
    uid = _claim_of(kube, started)["metadata"]["uid"]
    containers = set(real_a100.running_containers())
    prepared = _prepares(real_a100, uid)
    assert prepared
    before = {s["metadata"]["uid"] for s in slices_of(kube, real_a100.name)}
    real_a100.stop_kubelet()
    real_a100.start_kubelet()
    # kubelet deletes the node's slices when it starts; the plugin must notice and publish new ones.
    wait_for(lambda: (now := {s["metadata"]["uid"] for s in slices_of(kube, real_a100.name)}) and not now & before,
             timeout=60, what="the plugin to republish the slices kubelet deleted at start")
    wait_for(lambda: kube.get("Pod", "survivor", namespace)["status"].get("phase") == "Running", timeout=60,
             what="the pod to be reported Running again")
    time.sleep(3)  # a second prepare, if kubelet were to make one, comes with its first pod sync
    assert containers <= set(real_a100.running_containers()), "containers were restarted"
    assert _prepares(real_a100, uid) == prepared, "kubelet prepared the claim again instead of using its checkpoint"


def test_plugin_restarted_while_pod_admitted(kube: Kube, real_a100: RealNode, namespace: str) -> None:
    assert real_a100.plugin is not None
    real_a100.plugin.stop()
    kube.create(claim_template("late", namespace, claim_spec(request())))
    kube.create(probe_pod("late", namespace, real_a100.name, templates={"gpu": "late"}))
    wait_for(lambda: kube.get("Pod", "late", namespace)["spec"].get("nodeName"), timeout=60, what="pod scheduled")
    time.sleep(2)  # kubelet tries to prepare against the missing plugin
    real_a100.start_plugin()
    started = wait_reported(kube, real_a100, namespace, "late")
    uid = _claim_of(kube, started)["metadata"]["uid"]
    assert len(cdi_specs(real_a100, uid)) == 1
    assert started.views["probe"].visible


def test_failed_prepare_shows_tessera_message_in_pod_events(kube: Kube, real_dgx: RealNode, namespace: str) -> None:
    # Whether a device is a MIG instance is known only once allocated: time-slicing one fails at prepare.
    spec = claim_spec(request(device_class=f"mig.{DRIVER}",
                              selectors=[f'device.attributes["{DRIVER}"].profile == "1g.10gb"']),
                      config=time_slicing_config())
    kube.create(claim_template("sliced-mig", namespace, spec))
    kube.create(probe_pod("sliced-mig", namespace, real_dgx.name, templates={"gpu": "sliced-mig"}))

    def event() -> str | None:
        for e in kube.list("Event", namespace):
            if e["involvedObject"].get("name") == "sliced-mig" and "time-sliced" in e.get("message", ""):
                return str(e["message"])
        return None

    message = wait_for(event, timeout=90, what="kubelet's event with tessera's prepare error")
    assert "MIG devices cannot be time-sliced; use Exclusive or MPS for MIG devices" in message
    assert kube.get("Pod", "sliced-mig", namespace)["status"].get("phase") == "Pending"


@pytest.fixture(autouse=True)
def _pods_gone(kube: Kube, namespace: str) -> object:
    yield None
    delete_pods(kube, namespace)
