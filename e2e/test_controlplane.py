"""The control plane itself, and every ResourceSlice tessera can publish, against the real apiserver."""

from __future__ import annotations

import itertools
import subprocess
import sys
from typing import Any

import pytest

from e2e.cluster import DRIVER, Cluster, create_fake_node
from e2e.kube import Kube, KubeError

PROFILES = ["dgx-h100-8", "a100-pcie-4", "t4-4", "mixed", "h100-16-mig"]
STRATEGIES = ["none", "static", "dynamic"]


def test_apiserver_serves_resource_v1(kube: Kube) -> None:
    resources = {r["name"] for r in kube.request("GET", "/apis/resource.k8s.io/v1")["resources"]}
    assert {"deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices"} <= resources


def test_control_plane_components_stay_up(cluster: Cluster) -> None:
    assert cluster.control_plane is not None
    cluster.control_plane.check_alive()


def test_tessera_device_classes_are_accepted(cluster: Cluster, kube: Kube) -> None:
    names = cluster.apply_device_classes()
    stored = {c["metadata"]["name"] for c in kube.list("DeviceClass")}
    assert DRIVER in stored
    assert set(names) <= stored


def _build_slices(profile: str, strategy: str, node: str) -> list[dict[str, Any]]:
    try:
        from driver.discovery import load_inventory
        from driver.slices import build_slices
    except ImportError as exc:
        pytest.skip(f"driver.slices is not there yet: {exc}")
    return build_slices(load_inventory(node, simulate=profile), mig_strategy=strategy)


@pytest.mark.parametrize(("profile", "strategy"), list(itertools.product(PROFILES, STRATEGIES)))
def test_every_published_slice_is_accepted_by_the_apiserver(kube: Kube, profile: str, strategy: str) -> None:
    """Server-side dry run: full apiserver validation (names, attribute values, counters, limits), nothing stored."""
    node = f"slice-check-{profile}"
    slices = _build_slices(profile, strategy, node)
    assert slices, f"{profile}/{strategy}: no slices"
    errors = []
    for i, body in enumerate(slices):
        obj = {**body, "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice"}
        obj["metadata"] = {**body.get("metadata", {}), "name": f"{node}-{strategy}-{i}"}
        try:
            stored = kube.create(obj, dry_run=True)
        except KubeError as exc:
            errors.append(f"slice {i}: {exc.message}")
            continue
        # Nothing the apiserver knows silently drops a field tessera relies on.
        sent = {d["name"]: d for d in body["spec"].get("devices", [])}
        for dev in stored["spec"].get("devices", []):
            assert set(sent[dev["name"]].get("attributes", {})) == set(dev.get("attributes", {})), dev["name"]
            assert set(sent[dev["name"]].get("capacity", {})) == set(dev.get("capacity", {})), dev["name"]
            assert sent[dev["name"]].get("allowMultipleAllocations") == dev.get("allowMultipleAllocations"), dev["name"]
    assert not errors, f"{profile}/{strategy}: the apiserver rejected:\n" + "\n".join(errors)


@pytest.mark.parametrize(("profile", "strategy"), [("mixed", "static"), ("h100-16-mig", "dynamic")])
def test_tessera_publish_once_stores_the_pool_and_cleanup_removes_it(
    cluster: Cluster, kube: Kube, profile: str, strategy: str
) -> None:
    node = f"publish-{profile}"
    create_fake_node(kube, node)
    base = [sys.executable, "-m", "tessera", "publish", f"--kubeconfig={cluster.kubeconfig}", f"--node-name={node}",
            f"--simulate={profile}", f"--mig-strategy={strategy}", "--once"]
    try:
        proc = subprocess.run(base, capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        stored = kube.list("ResourceSlice", field_selector=f"spec.nodeName={node}")
        built = _build_slices(profile, strategy, node)
        assert sorted(d["name"] for s in stored for d in s["spec"].get("devices", [])) == \
            sorted(d["name"] for s in built for d in s["spec"].get("devices", []))
        for s in stored:
            assert s["spec"]["pool"]["resourceSliceCount"] == len(built)
            assert [o["kind"] for o in s["metadata"].get("ownerReferences", [])] == ["Node"]
        proc = subprocess.run([*base, "--cleanup"], capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert not kube.list("ResourceSlice", field_selector=f"spec.nodeName={node}")
    finally:
        kube.delete("Node", node)
