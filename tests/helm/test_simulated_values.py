"""helm/values-simulated.yaml, the values the demo and the README install with: one DaemonSet over
simulated nodes of several profiles, chosen by node labels."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from hack.k8stools import RegistryUnreachable, ToolPaths, UnsupportedPlatform, ensure_tools
from tests.builders.helm import render
from tests.paths import REPO

VALUES = (REPO / "helm" / "values-simulated.yaml",)
PROFILE_LABEL = "gpu.tessera.dev/simulated-profile"


@pytest.fixture(scope="module")
def tools() -> ToolPaths:
    try:
        return ensure_tools()
    except (RegistryUnreachable, UnsupportedPlatform) as exc:
        pytest.skip(str(exc))


def daemonset(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    return ds


def plugin_args(docs: list[dict[str, Any]]) -> list[str]:
    args: list[str] = daemonset(docs)["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_each_node_takes_its_profile_and_mig_strategy_from_its_labels(tools: ToolPaths) -> None:
    args = plugin_args(render(tools, values=VALUES))
    assert f"--simulate-from-node-label={PROFILE_LABEL}" in args
    assert "--mig-strategy-from-node-label=gpu.tessera.dev/mig-strategy" in args
    assert "--nvml" not in args and not any(a.startswith("--simulate=") for a in args)


def test_the_plugin_runs_on_gpu_nodes_by_the_label_simulated_nodes_carry_too(tools: ToolPaths) -> None:
    """No null is needed to clear the default nodeSelector: nulls do not survive --reuse-values."""
    spec = daemonset(render(tools, values=VALUES))["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert "affinity" not in spec
    assert None not in _leaves(yaml.safe_load(VALUES[0].read_text()))


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    return [value]


def test_simulated_nodes_need_no_privilege_or_host_driver(tools: ToolPaths) -> None:
    spec = daemonset(render(tools, values=VALUES))["spec"]["template"]["spec"]
    assert spec["containers"][0]["securityContext"]["privileged"] is False
    assert not [v for v in spec["volumes"] if v["name"] in ("dev", "driver-root")]


def test_a_default_profile_is_passed_beside_the_label(tools: ToolPaths) -> None:
    args = plugin_args(render(tools, "kubeletPlugin.simulate=t4-4", values=VALUES))
    assert "--simulate=t4-4" in args and f"--simulate-from-node-label={PROFILE_LABEL}" in args


def test_the_image_is_the_locally_built_one(tools: ToolPaths) -> None:
    container = daemonset(render(tools, values=VALUES))["spec"]["template"]["spec"]["containers"][0]
    assert container["image"].startswith("tessera.local/tessera:")
    assert container["imagePullPolicy"] == "IfNotPresent"


def test_the_schema_keeps_a_removed_default_node_label_valid_on_upgrade() -> None:
    """`helm upgrade --reuse-values` validates the stored user values again: a null that removed a default
    nodeSelector key at install (the way values.yaml documents) must not fail the schema then."""
    import json

    import jsonschema

    schema = json.loads((REPO / "helm" / "tessera" / "values.schema.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    validator.validate({"kubeletPlugin": {"nodeSelector": {"nvidia.com/gpu.present": None}}})
    with pytest.raises(jsonschema.ValidationError, match="1 is not of type"):
        validator.validate({"kubeletPlugin": {"nodeSelector": {"a": 1}}})
