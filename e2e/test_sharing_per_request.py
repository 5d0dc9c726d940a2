"""Sharing configured per request, on a real node (kubelet v1.36.3 + containerd): one claim mixes
time-slicing and MPS, and each container that names a request sees that request's GPU alone.

The claim and pod are NVIDIA's quickstart gpu-test5 (kubernetes-sigs/dra-driver-nvidia-gpu,
demo/specs/quickstart/v1/gpu-test5.yaml) with only the names translated to tessera's: driver and
DeviceClass `gpu.nvidia.com` -> `gpu.tessera.dev`, `resource.nvidia.com/v1beta1` ->
`gpu.tessera.dev/v1alpha1`, `timeSlicingConfig` -> `timeSlicing`, `mpsConfig` -> `mps`,
`defaultActiveThreadPercentage` -> `activeThreadPercentage`, `defaultPinnedDeviceMemoryLimit` ->
`pinnedDeviceMemoryLimit`. What the e2e harness needs is changed as well: the nbody image (there is no
CUDA on simulated GPUs) becomes the probe that prints what the container got, and the pod is pinned to
the real node. NVIDIA's docs: the two ts containers share one GPU by time-slicing (interval Long), the
two mps containers share another through one MPS daemon (50% of the SMs, 10Gi pinned per client).
"""

from __future__ import annotations

import json

import yaml

from e2e.kube import Kube, Obj
from e2e.node.images import WORKLOAD_IMAGE
from e2e.node.realnode import RealNode
from e2e.realpods import PROBE_SCRIPT, REAL_NODE_TAINT_KEY, cdi_specs, mps_daemons, wait_reported
from e2e.workloads import pod_claim_name, slices_of

GPU_TEST5 = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: multiple-gpus
spec:
  spec:
    devices:
      requests:
      - name: ts-gpu
        exactly:
          deviceClassName: gpu.tessera.dev
      - name: mps-gpu
        exactly:
          deviceClassName: gpu.tessera.dev
      config:
      - requests: ["ts-gpu"]
        opaque:
          driver: gpu.tessera.dev
          parameters:
            apiVersion: gpu.tessera.dev/v1alpha1
            kind: GpuConfig
            sharing:
              strategy: TimeSlicing
              timeSlicing:
                interval: Long
      - requests: ["mps-gpu"]
        opaque:
          driver: gpu.tessera.dev
          parameters:
            apiVersion: gpu.tessera.dev/v1alpha1
            kind: GpuConfig
            sharing:
              strategy: MPS
              mps:
                activeThreadPercentage: 50
                pinnedDeviceMemoryLimit: 10Gi
---
apiVersion: v1
kind: Pod
metadata:
  name: pod0
spec:
  containers:
  - name: ts-ctr0
    resources:
      claims:
      - name: shared-gpus
        request: ts-gpu
  - name: ts-ctr1
    resources:
      claims:
      - name: shared-gpus
        request: ts-gpu
  - name: mps-ctr0
    resources:
      claims:
      - name: shared-gpus
        request: mps-gpu
  - name: mps-ctr1
    resources:
      claims:
      - name: shared-gpus
        request: mps-gpu
  resourceClaims:
  - name: shared-gpus
    resourceClaimTemplateName: multiple-gpus
  tolerations:
  - key: "nvidia.com/gpu"
    operator: "Exists"
    effect: "NoSchedule"
"""


def _on_real_node(pod: Obj, node: RealNode) -> Obj:
    """What the harness needs: the probe instead of nbody, the real node, its taint tolerated."""
    for c in pod["spec"]["containers"]:
        c.update({"image": WORKLOAD_IMAGE, "imagePullPolicy": "Never", "command": ["/bin/sh", "-c", PROBE_SCRIPT]})
    pod["spec"].update({"nodeSelector": {"kubernetes.io/hostname": node.name}, "terminationGracePeriodSeconds": 1,
                        "hostNetwork": True, "enableServiceLinks": False, "automountServiceAccountToken": False})
    pod["spec"]["tolerations"].append({"key": REAL_NODE_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"})
    return pod


def _uuid_of(kube: Kube, node: RealNode, device: str) -> str:
    for s in slices_of(kube, node.name):
        for d in s["spec"].get("devices", []):
            if d["name"] == device:
                return str(next(iter(d["attributes"]["uuid"].values())))
    raise AssertionError(f"{device} is not in {node.name}'s slices")


def test_nvidias_gpu_test5_runs_and_each_container_sees_its_requests_gpu(
    kube: Kube, real_a100: RealNode, namespace: str
) -> None:
    template, pod = yaml.safe_load_all(GPU_TEST5)
    template["metadata"]["namespace"] = pod["metadata"]["namespace"] = namespace
    kube.create(template)
    kube.create(_on_real_node(pod, real_a100))
    started = wait_reported(kube, real_a100, namespace, "pod0")
    claim = kube.get("ResourceClaim", str(pod_claim_name(started.pod, "shared-gpus")), namespace)
    device_of = {r["request"]: r["device"] for r in claim["status"]["allocation"]["devices"]["results"]}
    ts_gpu, mps_gpu = (_uuid_of(kube, real_a100, device_of[r]) for r in ("ts-gpu", "mps-gpu"))
    assert ts_gpu != mps_gpu
    views = started.views
    for name, gpu, device in (("ts-ctr0", ts_gpu, device_of["ts-gpu"]), ("ts-ctr1", ts_gpu, device_of["ts-gpu"]),
                              ("mps-ctr0", mps_gpu, device_of["mps-gpu"]),
                              ("mps-ctr1", mps_gpu, device_of["mps-gpu"])):  # fmt: skip
        view = views[name]
        assert view.visible == [gpu], f"{name} sees {view.visible}"
        nodes = [d for d in view.devices if d.removeprefix("/dev/nvidia").isdigit()]
        assert nodes == [f"/dev/nvidia{device.removeprefix('gpu-')}"], f"{name} has {nodes}"
        assert "CUDA_VISIBLE_DEVICES" not in view.env and view.env["NVIDIA_VISIBLE_DEVICES"] == "void"
        is_mps = name.startswith("mps")
        assert (view.mps_dir == "/tmp/nvidia-mps") is is_mps, f"{name}: MPS pipe {view.mps_dir!r}"
        assert ("CUDA_MPS_PIPE_DIRECTORY" in view.env) is is_mps
    # one daemon, for the MPS request's card only, with NVIDIA's settings; the other card is time-sliced
    uid = claim["metadata"]["uid"]
    daemons = {k: v for k, v in mps_daemons(real_a100).items() if k.startswith(uid)}
    assert list(daemons) == [uid]
    assert (daemons[uid]["gpuUUIDs"], daemons[uid]["limitsMiB"], daemons[uid]["activeThreadPercentage"]) == (
        [mps_gpu], [10 * 1024], 50)
    slices = json.loads((real_a100.state_dir / "fake-timeslice.json").read_text())
    assert slices.get(ts_gpu) == "Long" and slices.get(mps_gpu, "Default") == "Default"
    assert len(cdi_specs(real_a100, uid)) == 1
