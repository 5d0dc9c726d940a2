"""NVIDIA's DRA driver quickstart and demo specs, with only the names translated to tessera's, on real
nodes (kubelet v1.36.3 + containerd): each container sees what NVIDIA's docs say it should.

The specs are in e2e/nvidia_specs/, one file per upstream file of kubernetes-sigs/dra-driver-nvidia-gpu,
each with a header naming its upstream path and every name changed. The translation table (also in
docs/sharing.md, "Coming from NVIDIA's DRA driver"):

    DeviceClass / driver  gpu.nvidia.com                 -> gpu.tessera.dev
    DeviceClass           mig.nvidia.com                 -> mig.gpu.tessera.dev
    attribute domain      device.attributes['gpu.nvidia.com'] -> device.attributes['gpu.tessera.dev']
                          gpu.nvidia.com/parentUUID      -> gpu.tessera.dev/parentUUID
    GpuConfig apiVersion  resource.nvidia.com/v1beta1    -> gpu.tessera.dev/v1alpha1
    GpuConfig fields      timeSlicingConfig, mpsConfig   -> timeSlicing, mps
                          defaultActiveThreadPercentage  -> activeThreadPercentage
                          defaultPinnedDeviceMemoryLimit -> pinnedDeviceMemoryLimit
    extended resource     nvidia.com/gpu                 -> gpu.tessera.dev/gpu

What the e2e harness needs is changed as well, here rather than in the files: the objects go into the
test's namespace, every container runs the probe (e2e/realpods.py, which prints the GPUs, device nodes
and MPS pipe it got) instead of nvidia-smi or nbody (there is no CUDA on simulated GPUs), and the pods
are pinned to a real node and tolerate the e2e taint. gpu-test5 runs in e2e/test_sharing_per_request.py.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
import yaml

from driver.simulated import mig_uuid
from e2e.cluster import DRIVER, Cluster, NodeSpec
from e2e.kube import Kube, KubeError, Obj
from e2e.node.images import WORKLOAD_IMAGE
from e2e.node.realnode import RealNode
from e2e.processes import REPO, wait_for
from e2e.realpods import (
    PROBE_SCRIPT,
    REAL_NODE_TAINT,
    REAL_NODE_TAINT_KEY,
    ContainerView,
    StartedPod,
    mps_daemons,
    wait_reported,
)
from e2e.workloads import consumed_memory, parse_quantity, pod_claim_name, slices_of

SPECS = REPO / "e2e" / "nvidia_specs"
MPS_PIPE = "/tmp/nvidia-mps"
MIG_NAME = re.compile(r"gpu-(?P<gpu>\d+)-mig-(?P<token>[0-9a-z]+)-(?P<placement>\d+)\Z")
# The built-in profile whose GPUs 4-7 are cut like NVIDIA's quickstart machine (mig-parted "half-balanced").
A100_MIG_PROFILE = "a100-pcie-8-mig"


def spec(name: str, namespace: str) -> dict[str, Obj]:
    """The objects of e2e/nvidia_specs/<name>.yaml by "Kind/name", moved into `namespace` (its Namespace dropped)."""
    objs: dict[str, Obj] = {}
    for doc in yaml.safe_load_all((SPECS / f"{name}.yaml").read_text()):
        if not doc or doc["kind"] == "Namespace":
            continue
        doc["metadata"]["namespace"] = namespace
        objs[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return objs


def on_real_node(pod_spec: Obj, node: str) -> Obj:
    """What the harness needs of a pod spec (a Pod's or a Deployment template's): the probe, the node, its taint."""
    for c in pod_spec["containers"]:
        c.pop("args", None)
        c.update({"image": WORKLOAD_IMAGE, "imagePullPolicy": "Never", "command": ["/bin/sh", "-c", PROBE_SCRIPT]})
    pod_spec.update({"nodeSelector": {"kubernetes.io/hostname": node}, "terminationGracePeriodSeconds": 1,
                     "enableServiceLinks": False, "automountServiceAccountToken": False})
    pod_spec.setdefault("tolerations", []).append({"key": REAL_NODE_TAINT_KEY, "operator": "Exists",
                                                   "effect": "NoSchedule"})
    return pod_spec


def create(kube: Kube, objs: dict[str, Obj], node: RealNode) -> None:
    """Create the spec's objects in file order, its pods and Deployments adapted to run on `node`."""
    for obj in objs.values():
        if obj["kind"] == "Pod":
            on_real_node(obj["spec"], node.name)
        elif obj["kind"] == "Deployment":
            on_real_node(obj["spec"]["template"]["spec"], node.name)
        kube.create(obj)


@pytest.fixture
def deployments(kube: Kube, namespace: str) -> Iterator[None]:
    """Deletes the test's Deployments first, so that their ReplicaSets do not bring pods back while the
    namespace fixture deletes them."""
    yield
    for d in kube.list("Deployment", namespace):
        kube.delete("Deployment", d["metadata"]["name"], namespace)
    wait_for(lambda: not kube.list("ReplicaSet", namespace), timeout=60,
             what="the garbage collector to delete the Deployments' ReplicaSets")


def replicas(kube: Kube, node: RealNode, namespace: str, deployment: Obj) -> list[StartedPod]:
    """Every replica of `deployment` running on `node`, each container having printed its report."""
    want = deployment["spec"]["replicas"]
    selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())

    def created() -> list[Obj] | None:
        pods = kube.list("Pod", namespace, label_selector=selector)
        return pods if len(pods) == want else None

    pods = wait_for(created, timeout=60, what=f"the {want} pods of Deployment {deployment['metadata']['name']}")
    return [wait_reported(kube, node, namespace, p["metadata"]["name"], timeout=120) for p in pods]


def devices_of(kube: Kube, node: RealNode) -> dict[str, Obj]:
    return {d["name"]: d for s in slices_of(kube, node.name) for d in s["spec"].get("devices", [])}


def claim_of(kube: Kube, started: StartedPod, pod_claim: str) -> Obj:
    name = pod_claim_name(started.pod, pod_claim)
    assert name, f"pod {started.pod['metadata']['name']} has no claim {pod_claim!r}"
    return kube.get("ResourceClaim", name, started.pod["metadata"]["namespace"])


def results(claim: Obj) -> list[Obj]:
    found: list[Obj] = claim["status"]["allocation"]["devices"]["results"]
    return found


def gpu_uuids(kube: Kube, node: RealNode, claim: Obj) -> list[str]:
    """The UUIDs of a claim's whole GPUs, in allocation order, from the node's slices."""
    devices = devices_of(kube, node)
    return [str(devices[r["device"]]["attributes"]["uuid"]["string"]) for r in results(claim)]


def gpu_nodes(view: ContainerView) -> list[str]:
    return sorted(d for d in view.devices if re.fullmatch(r"/dev/nvidia\d+", d))


def minor_of(device: str) -> str:
    return f"/dev/nvidia{device.removeprefix('gpu-').split('-', 1)[0]}"


def sees_one_gpu(view: ContainerView, gpu: str, device: str, what: str) -> None:
    assert view.visible == [gpu], f"{what} sees {view.visible}, not {gpu}"
    assert gpu_nodes(view) == [minor_of(device)], f"{what} has device nodes {gpu_nodes(view)}"
    assert not view.mps_dir, f"{what} got an MPS pipe it did not ask for"


# ---- quickstart: whole GPUs --------------------------------------------------------------------------


def test_gpu_test1_two_pods_each_see_a_gpu_of_their_own(kube: Kube, real_a100: RealNode, namespace: str) -> None:
    create(kube, spec("gpu-test1", namespace), real_a100)
    seen = []
    for name in ("pod1", "pod2"):
        started = wait_reported(kube, real_a100, namespace, name)
        claim = claim_of(kube, started, "gpu")
        (gpu,), (result,) = gpu_uuids(kube, real_a100, claim), results(claim)
        sees_one_gpu(started.views["ctr"], gpu, result["device"], f"{name}/ctr")
        seen.append(gpu)
    assert seen[0] != seen[1], "the two pods' claims got the same GPU"


def test_gpu_test2_two_containers_of_one_claim_see_the_same_gpu(
        kube: Kube, real_a100: RealNode, namespace: str) -> None:
    create(kube, spec("gpu-test2", namespace), real_a100)
    started = wait_reported(kube, real_a100, namespace, "pod")
    claim = claim_of(kube, started, "shared-gpu")
    (gpu,), (result,) = gpu_uuids(kube, real_a100, claim), results(claim)
    for ctr in ("ctr0", "ctr1"):
        sees_one_gpu(started.views[ctr], gpu, result["device"], ctr)


def test_gpu_test3_two_pods_sharing_one_claim_see_the_same_gpu(
        kube: Kube, real_a100: RealNode, namespace: str) -> None:
    create(kube, spec("gpu-test3", namespace), real_a100)
    started = [wait_reported(kube, real_a100, namespace, name) for name in ("pod1", "pod2")]
    claim = kube.get("ResourceClaim", "single-gpu", namespace)
    (gpu,), (result,) = gpu_uuids(kube, real_a100, claim), results(claim)
    assert sorted(r["uid"] for r in claim["status"]["reservedFor"]) == sorted(p.uid for p in started)
    for p in started:
        sees_one_gpu(p.views["ctr"], gpu, result["device"], f"{p.pod['metadata']['name']}/ctr")


def test_gpu_test7_two_containers_with_a_claim_each_see_different_gpus(
        kube: Kube, real_a100: RealNode, namespace: str) -> None:
    create(kube, spec("gpu-test7", namespace), real_a100)
    started = wait_reported(kube, real_a100, namespace, "gpu-pod")
    seen = []
    for ctr, pod_claim in (("ctr0", "gpu0"), ("ctr1", "gpu1")):
        claim = claim_of(kube, started, pod_claim)
        (gpu,), (result,) = gpu_uuids(kube, real_a100, claim), results(claim)
        sees_one_gpu(started.views[ctr], gpu, result["device"], ctr)
        seen.append(gpu)
    assert seen[0] != seen[1]


def test_gpu_test8_one_container_sees_the_two_gpus_of_its_request(
        kube: Kube, real_a100: RealNode, namespace: str) -> None:
    create(kube, spec("gpu-test8", namespace), real_a100)
    started = wait_reported(kube, real_a100, namespace, "gpu-pod")
    claim = claim_of(kube, started, "twogpus")
    gpus = gpu_uuids(kube, real_a100, claim)
    view = started.views["ctr0"]
    assert len(set(gpus)) == 2 and view.visible == gpus
    assert gpu_nodes(view) == sorted(minor_of(r["device"]) for r in results(claim))


def test_gpu_test_mps_two_containers_share_one_gpu_through_one_mps_daemon(
        kube: Kube, real_a100: RealNode, namespace: str) -> None:
    create(kube, spec("gpu-test-mps", namespace), real_a100)
    started = wait_reported(kube, real_a100, namespace, "test-pod")
    claim = claim_of(kube, started, "shared-gpu")
    (gpu,), (result,) = gpu_uuids(kube, real_a100, claim), results(claim)
    for ctr in ("mps-ctr0", "mps-ctr1"):
        view = started.views[ctr]
        assert view.visible == [gpu] and gpu_nodes(view) == [minor_of(result["device"])], f"{ctr}: {view}"
        assert view.mps_dir == MPS_PIPE and view.env.get("CUDA_MPS_PIPE_DIRECTORY") == MPS_PIPE, f"{ctr}: {view}"
    # NVIDIA's settings, on one daemon for the claim: 50% of the SMs, 10Gi pinned per client
    uid = claim["metadata"]["uid"]
    daemons = {k: v for k, v in mps_daemons(real_a100).items() if k.startswith(uid)}
    assert list(daemons) == [uid]
    assert (daemons[uid]["gpuUUIDs"], daemons[uid]["limitsMiB"], daemons[uid]["activeThreadPercentage"]) == (
        [gpu], [10 * 1024], 50)


def test_gpu_test6_reading_index_is_denied_at_admission_naming_it(
        kube: Kube, controller: Cluster, namespace: str) -> None:
    # NVIDIA no longer publishes `index` (a GPU's index is not stable across reboots); nor does tessera.
    del controller
    objs = spec("gpu-test6", namespace)
    with pytest.raises(KubeError) as denied:
        kube.create(objs["ResourceClaimTemplate/a100"])
    assert denied.value.status in (400, 403, 422), denied.value
    message = denied.value.message
    assert "selectors[0].cel.expression" in message and '"index"' in message, message
    assert "never publishes" in message, message
    assert kube.get_or_none("ResourceClaimTemplate", "a100", namespace) is None


# ---- consumable shares ---------------------------------------------------------------------------------


def test_memory_sharing_two_4gi_shares_land_on_one_gpu_each_with_its_own_limit(
        kube: Kube, real_a100: RealNode, namespace: str, deployments: None) -> None:
    del deployments
    objs = spec("memory-sharing", namespace)
    create(kube, objs, real_a100)
    pods = replicas(kube, real_a100, namespace, objs["Deployment/memory-sharing"])
    claims = [claim_of(kube, p, "gpu") for p in pods]
    gpus = {g for c in claims for g in gpu_uuids(kube, real_a100, c)}
    assert len(gpus) == 1, f"the two 4Gi shares landed on {gpus}"
    daemons = mps_daemons(real_a100)
    for p, claim in zip(pods, claims, strict=True):
        (result,) = results(claim)
        assert consumed_memory(result) == 4 * 1024**3
        view = p.views["ctr"]
        assert view.visible == list(gpus) and view.mps_dir == MPS_PIPE, view
        uid = claim["metadata"]["uid"]
        assert (daemons[uid]["gpuUUIDs"], daemons[uid]["limitsMiB"]) == (list(gpus), [4 * 1024])


def test_unlimited_sharing_gives_each_replica_a_whole_gpu(
        kube: Kube, real_a100: RealNode, namespace: str, deployments: None) -> None:
    # tessera has NVIDIA's `memory` mode only: a request that names no memory takes the whole card.
    del deployments
    objs = spec("unlimited-sharing", namespace)
    create(kube, objs, real_a100)
    pods = replicas(kube, real_a100, namespace, objs["Deployment/unlimited-sharing"])
    seen = []
    for p in pods:
        claim = claim_of(kube, p, "gpu")
        (gpu,), (result,) = gpu_uuids(kube, real_a100, claim), results(claim)
        card = parse_quantity(devices_of(kube, real_a100)[result["device"]]["capacity"]["memory"]["value"])
        assert consumed_memory(result) == card, f"{result} did not take the whole card"
        sees_one_gpu(p.views["ctr"], gpu, result["device"], p.pod["metadata"]["name"])
        seen.append(gpu)
    assert len(set(seen)) == 2


def test_integer_sharing_gives_each_replica_a_whole_gpu(
        kube: Kube, real_a100: RealNode, namespace: str, deployments: None) -> None:
    del deployments
    objs = spec("integer-sharing", namespace)
    create(kube, objs, real_a100)
    pods = replicas(kube, real_a100, namespace, objs["Deployment/integer-sharing"])
    seen = {g for p in pods for g in gpu_uuids(kube, real_a100, claim_of(kube, p, "gpu"))}
    assert len(seen) == 4, "four whole-card requests got fewer than four cards"


def test_integer_sharings_four_per_card_is_a_quarter_of_its_memory_on_tessera(
        kube: Kube, real_a100: RealNode, namespace: str, deployments: None) -> None:
    # The tessera spelling of --consumable-shares=4 on a 40 GB card: one field added, 10Gi each.
    del deployments
    objs = spec("integer-sharing", namespace)
    objs["ResourceClaimTemplate/gpu-1share"]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {
        "requests": {"memory": "10Gi"}}
    create(kube, objs, real_a100)
    pods = replicas(kube, real_a100, namespace, objs["Deployment/integer-sharing"])
    claims = [claim_of(kube, p, "gpu") for p in pods]
    assert len({g for c in claims for g in gpu_uuids(kube, real_a100, c)}) == 1
    daemons = mps_daemons(real_a100)
    assert sorted(daemons[c["metadata"]["uid"]]["limitsMiB"][0] for c in claims) == [10 * 1024] * 4


# ---- extended resources --------------------------------------------------------------------------------


def test_gpu_full_one_gpu_by_extended_resource(kube: Kube, real_a100: RealNode, namespace: str) -> None:
    create(kube, spec("gpu-full", namespace), real_a100)
    started = wait_reported(kube, real_a100, namespace, "gpu-full-pod")
    status = started.pod["status"]["extendedResourceClaimStatus"]
    claim = kube.get("ResourceClaim", status["resourceClaimName"], namespace)
    assert [r["exactly"]["deviceClassName"] for r in claim["spec"]["devices"]["requests"]] == [DRIVER]
    assert [(m["containerName"], m["resourceName"]) for m in status["requestMappings"]] == [
        ("cuda-container", f"{DRIVER}/gpu")]
    (gpu,), (result,) = gpu_uuids(kube, real_a100, claim), results(claim)
    sees_one_gpu(started.views["cuda-container"], gpu, result["device"], "cuda-container")


# ---- MIG: gpu-test4 on an A100 node cut like NVIDIA's quickstart machine --------------------------------


@pytest.fixture(scope="module")
def a100_mig_node(cluster: Cluster) -> Iterator[RealNode]:
    """A real node of its own for this module: a100-pcie-8-mig, static MIG, tessera's plugin started by hand."""
    if not cluster.real_nodes:
        pytest.skip("the e2e session runs no real node on this machine (see the real_a100 fixture's reason)")
    node = cluster.real_node(NodeSpec(f"real-a100mig-{uuid.uuid4().hex[:4]}", A100_MIG_PROFILE, "static",
                                      real=True, taints=(REAL_NODE_TAINT,)))
    try:
        node.start()
        wait_for(lambda: slices_of(cluster.kube, node.name), timeout=60, what=f"the slices of {node.name}")
        yield node
    finally:
        node.stop()
        cluster.kube.delete("Node", node.name)


def test_gpu_test4_each_container_sees_its_own_mig_device_all_on_one_gpu(
        kube: Kube, a100_mig_node: RealNode, namespace: str, deployments: None) -> None:
    del deployments
    node = a100_mig_node
    objs = spec("gpu-test4", namespace)
    create(kube, objs, node)
    pods = replicas(kube, node, namespace, objs["Deployment/pod"])
    containers = {f"ctr{i}": r for i, r in enumerate(("mig-1g-5gb-0", "mig-1g-5gb-1", "mig-2g-10gb", "mig-3g-20gb"))}
    profile_of = {"mig-1g-5gb-0": "1g.5gb", "mig-1g-5gb-1": "1g.5gb", "mig-2g-10gb": "2g.10gb",
                  "mig-3g-20gb": "3g.20gb"}
    devices = devices_of(kube, node)
    parents = []
    for p in pods:
        claim = claim_of(kube, p, "mig-devices")
        by_request = {r["request"]: r["device"] for r in results(claim)}
        assert sorted(by_request) == sorted(containers.values())
        parent_uuids = {devices[d]["attributes"]["parentUUID"]["string"] for d in by_request.values()}
        assert len(parent_uuids) == 1, f"matchAttribute parentUUID: the four MIG devices are on {parent_uuids}"
        seen = []
        for ctr, request in containers.items():
            m = MIG_NAME.match(by_request[request])
            assert m, by_request[request]
            gpu, placement = int(m["gpu"]), int(m["placement"])
            assert devices[by_request[request]]["attributes"]["profile"]["string"] == profile_of[request]
            view = p.views[ctr]
            # only its own request's MIG device: the instance's UUID, its parent's node and two capability nodes
            assert view.visible == [mig_uuid(node.name, gpu, profile_of[request], placement)], f"{ctr}: {view}"
            assert gpu_nodes(view) == [f"/dev/nvidia{gpu}"], f"{ctr}: {view.devices}"
            assert len([d for d in view.devices if d.startswith("/dev/nvidia-caps/nvidia-cap")]) == 2, view.devices
            seen += view.visible
        assert len(set(seen)) == 4
        parents.append(parent_uuids.pop())
    # four replicas, four cards: the A100s in MIG mode (GPUs 4-7), each cut into exactly these four instances
    assert len(set(parents)) == 4


def test_every_translated_spec_names_its_source_and_keeps_no_nvidia_name() -> None:
    for path in sorted(SPECS.glob("*.yaml")):
        text = path.read_text()
        head = text.split("\n---", 1)[0]
        assert "# Upstream: kubernetes-sigs/dra-driver-nvidia-gpu@" in head and "# Changed from upstream" in head, path
        # the toleration of NVIDIA's node taint stays: it is the GPU nodes' taint, not a name of NVIDIA's driver
        left = [line for line in text.splitlines() if "nvidia.com" in line and not line.startswith("#")
                and not line.strip().startswith(("- key:", "key:"))]
        assert not left, f"{path.name} still names NVIDIA's driver: {left}"
