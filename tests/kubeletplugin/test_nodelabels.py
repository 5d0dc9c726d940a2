"""One DaemonSet over nodes of different kinds: the simulated profile and MIG strategy from node labels."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from tests.builders.plugin import NODE, make_config
from tests.fakes.apiserver import FakeKubeAPI

PROFILE = "gpu.tessera.dev/simulated-profile"
MIG = "gpu.tessera.dev/mig-strategy"


def node(**labels: str) -> dict[str, Any]:
    return {"metadata": {"name": "node-a", "labels": labels}}


def settings(n: dict[str, Any], *, simulate: str | None = None, mig: str = "static") -> Any:
    from kubeletplugin.nodelabels import settings_from_labels

    return settings_from_labels(n, simulate_label=PROFILE, mig_strategy_label=MIG, simulate=simulate,
                                mig_strategy=mig)


def test_labels_choose_the_profile_and_mig_strategy() -> None:
    got = settings(node(**{PROFILE: "dgx-h100-8", MIG: "dynamic"}), simulate="t4-4")
    assert (got.simulate, got.mig_strategy) == ("dgx-h100-8", "dynamic")


def test_a_node_without_the_labels_keeps_the_flags() -> None:
    got = settings(node(), simulate="t4-4", mig="none")
    assert (got.simulate, got.mig_strategy) == ("t4-4", "none")


def test_no_label_and_no_default_profile_is_an_error_that_says_how_to_label() -> None:
    from kubeletplugin.nodelabels import NodeLabelError

    with pytest.raises(NodeLabelError, match=f"kubectl label node node-a {PROFILE}="):
        settings(node())


def test_an_unknown_mig_strategy_value_is_refused_with_the_valid_ones() -> None:
    from kubeletplugin.nodelabels import NodeLabelError

    with pytest.raises(NodeLabelError, match=r"mig-strategy='mixed'; the value must be one of none, static, dynamic"):
        settings(node(**{PROFILE: "t4-4", MIG: "mixed"}))


def test_simulate_from_node_label_and_nvml_exclude_each_other(root: Path) -> None:
    from kubeletplugin.plugin import PluginConfigError

    with pytest.raises(PluginConfigError, match="exclude each other"):
        make_config(root, simulate=None, nvml=True, simulate_label=PROFILE)


def test_the_plugin_publishes_the_labelled_profile(root: Path) -> None:
    from kubeletplugin.plugin import run_plugin

    fake = FakeKubeAPI()
    fake.add_node(NODE)["metadata"]["labels"] = {PROFILE: "t4-4", MIG: "none"}
    stop = threading.Event()
    products: list[str] = []
    strategies: list[str] = []

    def started(plugin: Any) -> None:
        products.extend(d.product_name for d in plugin.inventory.gpus)
        strategies.append(plugin.config.mig_strategy)
        stop.set()

    config = make_config(root, simulate="dgx-h100-8", simulate_label=PROFILE, mig_strategy_label=MIG)
    assert run_plugin(config, api=fake, stop_event=stop, on_started=started) == 0
    assert products and all("T4" in p for p in products), products
    assert strategies == ["none"]


def test_a_node_the_apiserver_cannot_show_stops_the_start_with_exit_1(root: Path) -> None:
    from kubeletplugin.plugin import run_plugin

    assert run_plugin(make_config(root, simulate=None, simulate_label=PROFILE), api=FakeKubeAPI()) == 1
