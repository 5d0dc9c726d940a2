"""Fixtures of the node agent's tests: an apiserver over HTTP, a short socket folder, an in-process plugin."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.builders.plugin import NODE, make_config
from tests.fakes.apiserver import FakeApiServer, FakeKubeAPI
from tests.fakes.kubeletclient import short_tmpdir


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    fake = FakeKubeAPI()
    fake.add_node(NODE)
    server = FakeApiServer(fake)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def root() -> Iterator[Path]:
    with short_tmpdir() as d:
        yield d


@pytest.fixture
def in_process(root: Path) -> Iterator[Any]:
    from driver.discovery import load_inventory
    from kubeletplugin.plugin import KubeletPlugin, build_device_state

    config = make_config(root)
    inventory = load_inventory(NODE, simulate="mixed")
    fake = FakeKubeAPI()
    fake.add_node(NODE)
    plugin = KubeletPlugin(config, fake, inventory, build_device_state(config, inventory), health_resend_interval=30)
    plugin.fake = fake  # type: ignore[attr-defined]
    yield plugin
    fake.close_watches()  # the publisher's watch long-poll would otherwise hold stop() for its join timeout
    plugin.stop()
