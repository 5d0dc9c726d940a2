"""Per-node settings read from the Node's labels, so one DaemonSet can serve nodes of different kinds.

A DaemonSet passes the same flags to every node. Where nodes differ (a cluster of simulated
machines of several profiles, or real nodes whose GPUs run MIG differently), the admin labels each
node and names the label: `--simulate-from-node-label=KEY` takes the node's simulated profile from
the label's value, `--mig-strategy-from-node-label=KEY` its MIG strategy. A node without the label
keeps the plain flag's value (`--simulate`, `--mig-strategy`); a simulated node with neither is an
error, never a silent default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from driver.errors import InvalidInputError
from driver.slices import MIG_STRATEGIES


class NodeLabelError(InvalidInputError):
    """A node label that was named for a setting is missing or holds a value that cannot work."""


@dataclass(frozen=True)
class NodeSettings:
    simulate: str | None
    mig_strategy: str


def settings_from_labels(node: dict[str, Any], *, simulate_label: str, mig_strategy_label: str,
                         simulate: str | None, mig_strategy: str) -> NodeSettings:
    """The node's simulated profile and MIG strategy: its labels where named and present, else the flags."""
    name = node.get("metadata", {}).get("name", "?")
    labels = node.get("metadata", {}).get("labels") or {}
    if simulate_label:
        simulate = labels.get(simulate_label) or simulate
        if not simulate:
            raise NodeLabelError(
                f"--simulate-from-node-label={simulate_label}: node {name} has no such label and --simulate is not "
                f"set; label the node with its profile (kubectl label node {name} {simulate_label}=a100-pcie-4) or "
                "pass --simulate as the default")
    if mig_strategy_label and mig_strategy_label in labels:
        value = labels[mig_strategy_label]
        if value not in MIG_STRATEGIES:
            raise NodeLabelError(
                f"--mig-strategy-from-node-label={mig_strategy_label}: node {name} has {mig_strategy_label}={value!r}; "
                f"the value must be one of {', '.join(MIG_STRATEGIES)} (kubectl label node {name} "
                f"{mig_strategy_label}=static --overwrite)")
        mig_strategy = value
    return NodeSettings(simulate, mig_strategy)
