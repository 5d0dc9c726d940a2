"""The chart's node restriction holds on a real apiserver: a plugin's token writes only its node's slices.

The chart grants the plugin's service account cluster-wide write on ResourceSlices (RBAC cannot say
"only your node") and narrows it with a ValidatingAdmissionPolicy keyed on the node name the
apiserver puts into pod-bound service account tokens. This test renders the chart, applies its
service account, RBAC and policy to the session's control plane, asks the TokenRequest API for a
token bound to a pod on one fake node, and tries, with that token, what a compromised plugin would
try. Writes are dry runs: admission (the policy included) runs, nothing is stored, and the
plugins of the session's nodes are not disturbed.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.cluster import Cluster, NodeAgent
from e2e.kube import Kube, KubeError

NAMESPACE = "tessera-vap"
# Not the session's release: where real nodes run, tessera itself is installed by the chart as `tessera`.
RELEASE = "tessera-vap"
DRIVER = "gpu.tessera.dev"
RBAC_PATHS = {
    "ServiceAccount": f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "Role": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/roles",
    "RoleBinding": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/rolebindings",
    "ValidatingAdmissionPolicy": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
}


@pytest.fixture(scope="module")
def chart_objects() -> list[dict[str, Any]]:
    try:
        from hack.k8stools import RegistryUnreachable, UnsupportedPlatform, ensure_tools
        from tests.builders.helm import render
    except ImportError as exc:
        pytest.skip(f"chart rendering is not available: {exc}")
    try:
        tools = ensure_tools()
    except (RegistryUnreachable, UnsupportedPlatform) as exc:
        pytest.skip(f"helm unavailable: {exc}")
    docs = _render(tools, render)
    wanted = [d for d in docs if d["kind"] in RBAC_PATHS and _is_plugin_object(d)]
    kinds = {d["kind"] for d in wanted}
    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding"} <= kinds, kinds  # fmt: skip
    return wanted


def _render(tools: Any, render: Any) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = render(tools, release=RELEASE)
    for d in docs:  # helm template was run for another namespace; move the namespaced objects here
        if d["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
            d["metadata"]["namespace"] = NAMESPACE
        for subject in d.get("subjects", []):
            if subject.get("kind") == "ServiceAccount":
                subject["namespace"] = NAMESPACE
        if d["kind"] == "ValidatingAdmissionPolicy":
            for cond in d["spec"].get("matchConditions", []):
                cond["expression"] = _retarget(cond["expression"])
    return docs


def _retarget(expression: str) -> str:
    """The policy names the plugin's user with the release namespace; point it at this test's."""
    marker = "system:serviceaccount:"
    start = expression.index(marker) + len(marker)
    end = expression.index(":", start)
    return expression[:start] + NAMESPACE + expression[end:]


def _is_plugin_object(doc: dict[str, Any]) -> bool:
    labels: dict[str, str] = doc.get("metadata", {}).get("labels", {})
    return labels.get("app.kubernetes.io/component") == "kubelet-plugin"


@pytest.fixture(scope="module")
def policy(cluster: Cluster, chart_objects: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    kube = cluster.kube
    kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                "metadata": {"name": NAMESPACE}})  # fmt: skip
    created: list[tuple[str, str]] = []
    try:
        for doc in chart_objects:
            kube.request("POST", RBAC_PATHS[doc["kind"]], doc)
            created.append((RBAC_PATHS[doc["kind"]], doc["metadata"]["name"]))
        sa = next(d for d in chart_objects if d["kind"] == "ServiceAccount")
        yield sa
    finally:
        # the token pods first: the session's nodes must be left empty for the next scenario
        for pod in kube.list("Pod", NAMESPACE):
            kube.delete("Pod", pod["metadata"]["name"], NAMESPACE, grace_seconds=0)
        for path, name in reversed(created):
            with contextlib.suppress(KubeError):
                kube.request("DELETE", f"{path}/{name}")
        kube.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}")


def pod_bound_token(kube: Kube, sa: str, node: str) -> str:
    pod = kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"plugin-{node}", "namespace": NAMESPACE},
        "spec": {"serviceAccountName": sa, "nodeName": node, "automountServiceAccountToken": False,
                 "containers": [{"name": "plugin", "image": "registry.invalid/tessera:test"}]},
    })  # fmt: skip
    review = kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{sa}/token", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 600,
                 "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"],
                                    "uid": pod["metadata"]["uid"]}},
    })  # fmt: skip
    token: str = review["status"]["token"]
    return token


def unbound_token(kube: Kube, sa: str) -> str:
    review = kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{sa}/token", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}})
    token: str = review["status"]["token"]
    return token


def slice_for(node: str, driver: str = DRIVER, name: str = "") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name or f"vap-probe-{node}-{driver.replace('.', '-')}"},
        "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0"}]},
    }  # fmt: skip


def dry_create(kube: Kube, obj: dict[str, Any]) -> None:
    kube.request("POST", "/apis/resource.k8s.io/v1/resourceslices", obj, params={"dryRun": "All"})


def refused(action: Any) -> str:
    with pytest.raises(KubeError) as err:
        action()
    assert err.value.status in (403, 422), err.value
    return str(err.value)


def test_plugin_token_writes_only_its_own_nodes_slices(cluster: Cluster, policy: dict[str, Any],
                                                       a100: NodeAgent, dgx: NodeAgent) -> None:
    admin = cluster.kube
    ca = cluster.control_plane.ca_file  # type: ignore[union-attr]
    sa = policy["metadata"]["name"]
    as_a100 = Kube(admin.server, ca, token=pod_bound_token(admin, sa, a100.name))

    # The policy is enforced once the apiserver's policy informer has it: wait for the first refusal.
    deadline = time.monotonic() + 60
    while True:
        try:
            dry_create(as_a100, slice_for(dgx.name))
        except KubeError as exc:
            if exc.status in (403, 422) and "may only write ResourceSlices" in exc.message:
                break
            raise
        assert time.monotonic() < deadline, "the ValidatingAdmissionPolicy never took effect"
        time.sleep(0.5)

    # its own node, its own driver: allowed (RBAC and the policy agree)
    dry_create(as_a100, slice_for(a100.name))
    # another node's slice: refused, with the node names in the message
    message = refused(lambda: dry_create(as_a100, slice_for(dgx.name)))
    assert f"on node '{a100.name}' may only write ResourceSlices with spec.nodeName '{a100.name}'" in message
    # a slice of another driver on its own node: refused
    message = refused(lambda: dry_create(as_a100, slice_for(a100.name, driver="gpu.evil.example")))
    assert "may only write ResourceSlices of driver gpu.tessera.dev" in message
    # a node-less (pool-wide) slice: refused
    no_node = slice_for(a100.name)
    del no_node["spec"]["nodeName"]
    no_node["spec"]["allNodes"] = True
    refused(lambda: dry_create(as_a100, no_node))

    # the real slices tessera published for the DGX node: neither rewritten nor withdrawn from a100
    (dgx_slice, *_) = [s for s in admin.list("ResourceSlice") if s["spec"].get("nodeName") == dgx.name]
    path = f"/apis/resource.k8s.io/v1/resourceslices/{dgx_slice['metadata']['name']}"
    moved = copy.deepcopy(dgx_slice)
    moved["spec"]["devices"] = moved["spec"]["devices"][:1]
    message = refused(lambda: as_a100.request("PUT", path, moved, params={"dryRun": "All"}))
    assert f"not '{dgx.name}'" in message
    hijacked = copy.deepcopy(dgx_slice)  # taking it over for itself: nodeName is immutable anyway (422)
    hijacked["spec"]["nodeName"] = a100.name
    hijacked["spec"]["pool"]["name"] = a100.name
    refused(lambda: as_a100.request("PUT", path, hijacked, params={"dryRun": "All"}))
    message = refused(lambda: as_a100.request("DELETE", path, params={"dryRun": "All"}))
    assert f"node '{dgx.name}'" in message
    assert admin.get("ResourceSlice", dgx_slice["metadata"]["name"])["spec"] == dgx_slice["spec"]

    # a token of the same service account that is not bound to a pod on a node: refused outright
    unbound = Kube(admin.server, ca, token=unbound_token(admin, sa))
    message = refused(lambda: dry_create(unbound, slice_for(a100.name)))
    assert "carries no node name" in message

    # and RBAC still applies underneath: the plugin may not touch other resources
    with pytest.raises(KubeError) as err:
        as_a100.request("POST", "/apis/resource.k8s.io/v1/deviceclasses",
                        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "x"},
                         "spec": {}}, params={"dryRun": "All"})  # fmt: skip
    assert err.value.status == 403
