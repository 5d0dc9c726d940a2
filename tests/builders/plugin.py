"""`tessera kubelet-plugin` as a real process, its configuration, and the claims and readers its tests share."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from kubeletplugin.grpcservers import SocketPaths
from kubeletplugin.kubeletclaims import ClaimRef
from tests.fakes.apiserver import FakeKubeAPI
from tests.paths import REPO

NODE = "node-a"
DRIVER = "gpu.tessera.dev"
START_TIMEOUT_S = 60.0


class PluginProcess:
    """`python -m tessera kubelet-plugin` with JSON logs read back as events."""

    def __init__(self, root: Path, kubeconfig: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.root = root
        self.paths = SocketPaths(root / "kubelet")
        self.cdi_dir = root / "cdi"
        self.state_dir = root / "state"
        self.args = [
            sys.executable, "-m", "tessera", "--log-format", "json", "--log-level", "info", "kubelet-plugin",
            "--node-name", NODE, "--simulate", "mixed", "--kubeconfig", str(kubeconfig),
            "--kubelet-dir", str(self.paths.kubelet_dir), "--cdi-dir", str(self.cdi_dir),
            "--state-dir", str(self.state_dir), "--metrics-addr", "127.0.0.1:0", *extra,
        ]
        self.env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.lines: list[str] = []
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> dict[str, Any]:
        """Start and return the "kubelet plugin running" log event."""
        self.proc = subprocess.Popen(
            self.args, cwd=REPO, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        return self.wait_event("kubelet plugin running")

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self.lines.append(line)
            with contextlib.suppress(json.JSONDecodeError):
                self.events.put(json.loads(line))
        self.events.put({"event": "<exit>"})

    def wait_event(self, name: str, timeout: float = START_TIMEOUT_S) -> dict[str, Any]:
        while True:
            try:
                event = self.events.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no {name!r} log event; output so far:\n{''.join(self.lines)}") from None
            if event.get("event") == name:
                return event
            if event.get("event") == "<exit>":
                raise AssertionError(f"plugin exited before {name!r}:\n{''.join(self.lines)}")

    def wait(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def uid(n: int) -> str:
    return f"5e6f7a8b-9c0d-4e1f-8a2b-{n:012d}"


def add_share_claim(fake: FakeKubeAPI, name: str, claim_uid: str) -> ClaimRef:
    fake.add_claim(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default", "uid": claim_uid},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev"}}]}},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-2",
                             "shareID": "3f2c8a9e-5d41-4b7a-9e2f-6c0d1a2b3c4d",
                             "consumedCapacity": {"memory": "4Gi", "multiprocessors": "8"}},
                        ],
                        "config": [],
                    }
                }
            },
        }
    )
    return ClaimRef("default", name, claim_uid)


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def mps_records(state_dir: Path) -> dict[str, Any]:
    path = state_dir / "fake-mps.json"
    data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    return data


def make_config(root: Path, **overrides: Any) -> Any:
    from kubeletplugin.pluginconfig import PluginConfig

    kwargs: dict[str, Any] = {
        "node_name": NODE,
        "kubelet_dir": root / "kubelet",
        "cdi_dir": root / "cdi",
        "state_dir": root / "state",
        "simulate": "mixed",
        "metrics_addr": "127.0.0.1:0",
        "stop_grace": 2.0,
    }
    kwargs.update(overrides)
    return PluginConfig(**kwargs)
