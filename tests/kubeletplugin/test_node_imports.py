"""The node agent loads no CEL: quantities and versions live outside driver.cel (issue 13).

Each kubelet plugin process would otherwise import the selector parser, type checker and cost model
(and, through them, a CEL engine) just to read `totalMemory` or a consumed capacity.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.paths import REPO

_PROBE = """
import importlib, json, pkgutil, sys
import {module}
if {every}:
    import kubeletplugin
    for info in pkgutil.iter_modules(kubeletplugin.__path__):
        importlib.import_module("kubeletplugin." + info.name)
print(json.dumps(sorted(sys.modules)))
"""


def _modules_loaded_by(module: str, *, every: bool = False) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(module=module, every=every)],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=120,
    ).stdout
    loaded: list[str] = json.loads(out)
    return loaded


@pytest.mark.parametrize("every", [False, True], ids=["kubeletplugin.state", "every kubeletplugin module"])
def test_the_node_agent_does_not_load_the_cel_analyser(every: bool) -> None:
    loaded = _modules_loaded_by("kubeletplugin.state", every=every)
    assert "driver.config" in loaded, "the probe no longer reaches the config decoder"
    assert [m for m in loaded if m == "driver.cel" or m.startswith("driver.cel.")] == []
