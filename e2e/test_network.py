"""The cluster's own network (e2e/network.py), without a cluster: what joining a node does to the hub."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from e2e.network import HUB_MAC, PrivateNetwork
from e2e.node.realnode import private_network_unavailable

pytestmark = pytest.mark.skipif(bool(private_network_unavailable()), reason=private_network_unavailable() or "ok")


def _bridge_mac(network: PrivateNetwork) -> str:
    out = subprocess.run([*network.enter(), "ip", "-o", "link", "show", "br0"], capture_output=True, text=True,
                         check=True).stdout
    return out.split("link/ether ", 1)[1].split()[0]


def test_the_hub_keeps_its_address_when_a_port_with_a_lower_one_joins(tmp_path: Path) -> None:
    """A bridge otherwise takes its lowest port's MAC: each node joining could move the hub's address under
    the nodes' ARP entries, and traffic to the control plane (webhook answers, kubelet streams) stalls."""
    network = PrivateNetwork(tmp_path).start()
    try:
        assert _bridge_mac(network) == HUB_MAC
        hub = network.enter()
        subprocess.run([*hub, "ip", "link", "add", "low0", "address", "00:00:00:00:00:01", "type", "veth",
                        "peer", "name", "low1"], check=True)
        subprocess.run([*hub, "ip", "link", "set", "low0", "master", "br0", "up"], check=True)
        assert _bridge_mac(network) == HUB_MAC
    finally:
        network.stop()
