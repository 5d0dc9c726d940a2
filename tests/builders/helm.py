"""The chart rendered by `helm template` (cached per set of values), for tests that read what it installs."""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from hack.k8stools import ToolPaths
from tests.paths import REPO

CHART = REPO / "helm" / "tessera"
NAMESPACE = "tessera-system"


def helm_template(helm: Path, sets: tuple[str, ...], release: str = "tessera",
                  values: tuple[Path, ...] = ()) -> subprocess.CompletedProcess[str]:
    cmd = [str(helm), "template", release, str(CHART), "--namespace", NAMESPACE]
    for v in values:
        cmd += ["-f", str(v)]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)


@functools.cache
def _render_cached(helm: Path, sets: tuple[str, ...], release: str,
                   values: tuple[Path, ...] = ()) -> tuple[dict[str, Any], ...]:
    proc = helm_template(helm, sets, release, values)
    assert proc.returncode == 0, f"helm template {' '.join(sets)} failed:\n{proc.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(proc.stdout) if doc)


def render(tools: ToolPaths, *sets: str, release: str = "tessera",
           values: tuple[Path, ...] = ()) -> list[dict[str, Any]]:
    # Deep copies keep the cache safe from tests that poke at the objects.
    docs: list[dict[str, Any]] = json.loads(json.dumps(list(_render_cached(tools.helm, tuple(sets), release,
                                                                             values))))
    return docs


def objects(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]
