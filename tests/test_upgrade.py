"""Two plugin instances on one node, as a surge rolling update runs them: the old pod and the new one.

Each instance gets its own sockets (kubelet keeps both registrations and routes to the newest), the
two share one checkpoint, one CDI directory and one state directory, and neither undoes what the
other prepared; exactly one publishes ResourceSlices at a time, and only the last one to stop may
clean up.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubeletplugin.grpcservers import SocketPaths
from tests.fakekube import FakeKubeAPI
from tests.kubeletclient import KubeletClient, registration_sockets, short_tmpdir

NODE = "node-a"
UID_A = "0a1b2c3d-0000-4000-8000-00000000000a"
UID_B = "0a1b2c3d-0000-4000-8000-00000000000b"


@pytest.fixture
def root() -> Iterator[Path]:
    with short_tmpdir() as d:
        yield d


def make_plugin(root: Path, fake: FakeKubeAPI, instance_id: str, **overrides: Any) -> Any:
    from driver.discovery import load_inventory
    from kubeletplugin.plugin import KubeletPlugin, PluginConfig, build_device_state

    kwargs: dict[str, Any] = {
        "node_name": NODE, "kubelet_dir": root / "kubelet", "cdi_dir": root / "cdi", "state_dir": root / "state",
        "simulate": "mixed", "metrics_addr": "127.0.0.1:0", "stop_grace": 2.0, "instance_id": instance_id,
    }  # fmt: skip
    kwargs.update(overrides)
    config = PluginConfig(**kwargs)
    inventory = load_inventory(NODE, simulate="mixed")
    return KubeletPlugin(config, fake, inventory, build_device_state(config, inventory), health_resend_interval=30)


@pytest.fixture
def fake() -> Iterator[FakeKubeAPI]:
    api = FakeKubeAPI()
    api.add_node(NODE)
    yield api
    api.close_watches()


# -- sockets -------------------------------------------------------------------------------------


def test_instance_id_names_both_sockets() -> None:
    paths = SocketPaths(Path("/var/lib/kubelet"), instance_id=UID_A)
    assert paths.registration_socket == Path(f"/var/lib/kubelet/plugins_registry/gpu.tessera.dev-{UID_A}-reg.sock")
    assert paths.dra_socket == Path(f"/var/lib/kubelet/plugins/gpu.tessera.dev/dra-{UID_A}.sock")
    plain = SocketPaths(Path("/var/lib/kubelet"))
    assert (plain.registration_socket.name, plain.dra_socket.name) == ("gpu.tessera.dev-reg.sock", "dra.sock")


@pytest.mark.parametrize("bad", ["../x", "a/b", ".hidden", "a b", "x" * 64])
def test_instance_id_that_cannot_name_a_socket_is_refused(root: Path, bad: str) -> None:
    from kubeletplugin.plugin import PluginConfig, PluginConfigError

    with pytest.raises(PluginConfigError, match="--instance-id"):
        PluginConfig(node_name=NODE, kubelet_dir=root / "kubelet", instance_id=bad)


def test_two_instances_register_separately_and_the_old_one_leaves_only_its_own_sockets(
    root: Path, fake: FakeKubeAPI
) -> None:
    old, new = make_plugin(root, fake, UID_A), make_plugin(root, fake, UID_B)
    try:
        old.start()
        new.start()
        kubelet = KubeletClient(root / "kubelet")
        sockets = registration_sockets(root / "kubelet")
        assert sockets == sorted([old.config.socket_paths.registration_socket,
                                  new.config.socket_paths.registration_socket])  # fmt: skip
        endpoints = {kubelet.get_info(s).endpoint for s in sockets}
        assert endpoints == {str(old.config.socket_paths.dra_socket), str(new.config.socket_paths.dra_socket)}
        old.stop()
        assert registration_sockets(root / "kubelet") == [new.config.socket_paths.registration_socket]
        assert new.config.socket_paths.dra_socket.exists()
        with kubelet.register() as conn:
            assert conn.endpoint == str(new.config.socket_paths.dra_socket)
            assert conn.prepare([]) == {}
    finally:
        fake.close_watches()
        old.stop()
        new.stop()
