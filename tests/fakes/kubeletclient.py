"""A test client that talks to a DRA plugin the way kubelet does, over the real sockets.

kubelet's sequence: find a socket under <kubelet-dir>/plugins_registry (recursively, skipping dot
files and non-sockets), call GetInfo with a 1 s deadline, check the type, pick the first entry of
the plugin's supported_versions that kubelet speaks, answer NotifyRegistrationStatus, then dial the
endpoint ("unix:" + the bare path) and call NodePrepareResources / NodeUnprepareResources with a
45 s deadline, rejecting answers that skip a claim or name an unknown one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from kubeletplugin.kubeletclaims import ClaimRef
from proto.dra.v1 import api_pb2 as v1
from proto.dra.v1 import api_pb2_grpc as v1_grpc
from proto.dra.v1beta1 import api_pb2 as v1beta1
from proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from proto.drahealth.v1alpha1 import api_pb2 as health_pb
from proto.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from proto.pluginregistration.v1 import api_pb2 as reg_pb
from proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc

KUBELET_DRA_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
GET_INFO_DEADLINE_S = 1.0
CALL_DEADLINE_S = 45.0


class KubeletProtocolError(AssertionError):
    """The plugin answered something kubelet would reject."""


@contextlib.contextmanager
def short_tmpdir() -> Iterator[Path]:
    """A temp dir with a short path: pytest's tmp_path can push socket paths past the 107-byte limit."""
    path = Path(tempfile.mkdtemp(prefix="tsr-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class ClaimAnswer:
    """One claim's entry in a NodePrepareResources answer, as plain data."""

    error: str
    devices: list[dict[str, Any]] = field(default_factory=list)


def registration_sockets(kubelet_dir: Path) -> list[Path]:
    """What kubelet's plugin watcher would pick up."""
    found: list[Path] = []
    for root, dirs, files in os.walk(kubelet_dir / "plugins_registry"):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files + dirs:
            path = Path(root) / name
            if not name.startswith(".") and stat.S_ISSOCK(path.lstat().st_mode):
                found.append(path)
    return sorted(found)


class KubeletClient:
    """kubelet's side of registration; `register()` returns a connection to the plugin's DRA endpoint."""

    def __init__(self, kubelet_dir: Path, *, versions: Sequence[str] = KUBELET_DRA_VERSIONS) -> None:
        self.kubelet_dir = kubelet_dir
        self.versions = tuple(versions)

    def get_info(self, socket: Path) -> reg_pb.PluginInfo:
        with grpc.insecure_channel(f"unix:{socket}") as channel:
            info: reg_pb.PluginInfo = reg_grpc.RegistrationStub(channel).GetInfo(
                reg_pb.InfoRequest(), timeout=GET_INFO_DEADLINE_S, wait_for_ready=True
            )
            return info

    def notify(self, socket: Path, registered: bool, error: str = "") -> None:
        with grpc.insecure_channel(f"unix:{socket}") as channel:
            reg_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
                reg_pb.RegistrationStatus(plugin_registered=registered, error=error), timeout=5.0
            )

    def register(self, socket: Path | None = None) -> PluginConnection:
        if socket is None:
            sockets = registration_sockets(self.kubelet_dir)
            if len(sockets) != 1:
                raise KubeletProtocolError(f"expected one registration socket, found {sockets}")
            socket = sockets[0]
        info = self.get_info(socket)
        if info.type != "DRAPlugin":
            self.notify(socket, False, f"no handler registered for plugin type: {info.type}")
            raise KubeletProtocolError(f"unknown plugin type {info.type!r}")
        if not info.supported_versions:
            self.notify(socket, False, "empty list for supported versions")
            raise KubeletProtocolError("plugin advertised no versions")
        chosen = next((v for v in info.supported_versions if v in self.versions), None)
        if chosen is None:
            message = f"none of the versions supported by the plugin {list(info.supported_versions)} are known"
            self.notify(socket, False, message)
            raise KubeletProtocolError(message)
        endpoint = info.endpoint or str(socket)
        self.notify(socket, True)
        return PluginConnection(
            endpoint=endpoint, version=chosen, driver_name=info.name, advertised=tuple(info.supported_versions)
        )


class PluginConnection:
    """kubelet's connection to one registered plugin instance."""

    def __init__(self, endpoint: str, version: str, driver_name: str, advertised: tuple[str, ...]) -> None:
        self.endpoint = endpoint
        self.version = version
        self.driver_name = driver_name
        self.advertised = advertised
        self._channel = grpc.insecure_channel(f"unix:{endpoint}")

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> PluginConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def prepare(
        self, claims: Sequence[ClaimRef], *, version: str | None = None, timeout: float = CALL_DEADLINE_S
    ) -> dict[str, ClaimAnswer]:
        version = version or self.version
        if version == "v1.DRAPlugin":
            resp: Any = v1_grpc.DRAPluginStub(self._channel).NodePrepareResources(
                v1.NodePrepareResourcesRequest(claims=[_v1_claim(c) for c in claims]), timeout=timeout
            )
        elif version == "v1beta1.DRAPlugin":
            resp = v1beta1_grpc.DRAPluginStub(self._channel).NodePrepareResources(
                v1beta1.NodePrepareResourcesRequest(claims=[_v1beta1_claim(c) for c in claims]), timeout=timeout
            )
        else:
            raise ValueError(version)
        _check_keys(claims, resp.claims.keys())
        return {uid: ClaimAnswer(error=entry.error, devices=[_device(d) for d in entry.devices])
                for uid, entry in resp.claims.items()}

    def unprepare(
        self, claims: Sequence[ClaimRef], *, version: str | None = None, timeout: float = CALL_DEADLINE_S
    ) -> dict[str, str]:
        version = version or self.version
        if version == "v1.DRAPlugin":
            resp: Any = v1_grpc.DRAPluginStub(self._channel).NodeUnprepareResources(
                v1.NodeUnprepareResourcesRequest(claims=[_v1_claim(c) for c in claims]), timeout=timeout
            )
        elif version == "v1beta1.DRAPlugin":
            resp = v1beta1_grpc.DRAPluginStub(self._channel).NodeUnprepareResources(
                v1beta1.NodeUnprepareResourcesRequest(claims=[_v1beta1_claim(c) for c in claims]), timeout=timeout
            )
        else:
            raise ValueError(version)
        _check_keys(claims, resp.claims.keys())
        return {uid: entry.error for uid, entry in resp.claims.items()}

    def watch_health(self, timeout: float = 30.0) -> Iterator[list[dict[str, Any]]]:
        """The health stream as kubelet reads it: each message is the driver's full device list."""
        stream = health_grpc.DRAResourceHealthStub(self._channel).NodeWatchResources(
            health_pb.NodeWatchResourcesRequest(), timeout=timeout
        )
        try:
            for message in stream:
                yield [
                    {
                        "pool": d.device.pool_name,
                        "device": d.device.device_name,
                        "health": health_pb.HealthStatus.Name(d.health),
                        "message": d.message,
                        "last_updated_time": d.last_updated_time,
                        "timeout_seconds": d.health_check_timeout_seconds,
                    }
                    for d in message.devices
                ]
        finally:
            stream.cancel()


def _v1_claim(c: ClaimRef) -> v1.Claim:
    return v1.Claim(namespace=c.namespace, name=c.name, uid=c.uid)


def _v1beta1_claim(c: ClaimRef) -> v1beta1.Claim:
    return v1beta1.Claim(namespace=c.namespace, name=c.name, uid=c.uid)


def _device(d: Any) -> dict[str, Any]:
    out = {
        "request_names": list(d.request_names),
        "pool_name": d.pool_name,
        "device_name": d.device_name,
        "cdi_device_ids": list(d.cdi_device_ids),
    }
    if "share_id" in d.DESCRIPTOR.fields_by_name:
        out["share_id"] = d.share_id if d.HasField("share_id") else None
    return out


def _check_keys(claims: Sequence[ClaimRef], keys: Any) -> None:
    wanted = {c.uid for c in claims}
    got = set(keys)
    if wanted - got:
        raise KubeletProtocolError(f"skipped {len(wanted - got)} ResourceClaims: {sorted(wanted - got)}")
    if got - wanted:
        raise KubeletProtocolError(f"returned result for unknown claim UID(s) {sorted(got - wanted)}")
