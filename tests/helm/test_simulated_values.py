"""helm/values-simulated.yaml, the values the demo and the README install with: one DaemonSet over
simulated nodes of several profiles, chosen by node labels."""

from __future__ import annotations

from typing import Any

import pytest

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


def test_the_plugin_runs_on_the_nodes_that_name_a_profile_and_nowhere_else(tools: ToolPaths) -> None:
    spec = daemonset(render(tools, values=VALUES))["spec"]["template"]["spec"]
    assert "nodeSelector" not in spec  # GPU feature discovery's label is cleared
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": PROFILE_LABEL, "operator": "Exists"}]}]


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
    """`helm upgrade --reuse-values` validates the stored user values again, and there the null that
    removed the default nodeSelector key is still a null: the schema must accept it."""
    import json

    import jsonschema
    import yaml

    schema = json.loads((REPO / "helm" / "tessera" / "values.schema.json").read_text())
    user_values = yaml.safe_load(VALUES[0].read_text())
    reused = {**user_values, "image": {**user_values["image"], "tag": "0.1.0-next"}}
    validator = jsonschema.Draft7Validator(schema)
    validator.validate(reused)
    with pytest.raises(jsonschema.ValidationError, match="1 is not of type"):
        validator.validate({"kubeletPlugin": {"nodeSelector": {"a": 1}}})
