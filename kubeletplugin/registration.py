"""The plugin registration service kubelet's plugin watcher calls on `<driver>-reg.sock`.

kubelet dials the registration socket when it appears, asks GetInfo (with a 1 s deadline), picks the
first entry of `supported_versions` it knows, dials `endpoint`, and reports the outcome through
NotifyRegistrationStatus. GetInfo therefore answers from memory only, never from the apiserver.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import structlog

from driver import DRIVER_NAME
from proto.pluginregistration.v1 import api_pb2 as pb
from proto.pluginregistration.v1 import api_pb2_grpc as pb_grpc

log = structlog.get_logger(__name__)

PLUGIN_TYPE = "DRAPlugin"
# kubelet walks this list in order and takes the first DRA version it knows, so v1 comes first;
# the health alias tells kubelet to open NodeWatchResources on the same endpoint.
SUPPORTED_VERSIONS: tuple[str, ...] = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth")


@dataclass(frozen=True)
class RegistrationStatus:
    """kubelet's last word on our registration."""

    registered: bool
    error: str
    received_at: float  # unix seconds


class RegistrationServicer(pb_grpc.RegistrationServicer):
    """Answers GetInfo with the DRA endpoint and records what kubelet says back."""

    def __init__(
        self,
        endpoint: Path,
        *,
        supported_versions: tuple[str, ...] = SUPPORTED_VERSIONS,
        on_status: Callable[[RegistrationStatus], None] | None = None,
    ) -> None:
        if not endpoint.is_absolute():
            raise ValueError(f"endpoint must be an absolute socket path, got {str(endpoint)!r}")
        if not supported_versions:
            raise ValueError("supported_versions must not be empty: kubelet rejects a plugin that advertises none")
        self._info = pb.PluginInfo(
            type=PLUGIN_TYPE,
            name=DRIVER_NAME,
            # A bare path: kubelet prepends "unix:" itself, so a scheme here would yield a broken target.
            endpoint=str(endpoint),
            supported_versions=list(supported_versions),
        )
        self._on_status = on_status
        self._status: RegistrationStatus | None = None
        self._changed = threading.Condition()

    def add_to(self, server: grpc.Server) -> None:
        pb_grpc.add_RegistrationServicer_to_server(self, server)

    @property
    def status(self) -> RegistrationStatus | None:
        with self._changed:
            return self._status

    def wait_for_status(self, timeout: float) -> RegistrationStatus | None:
        """Block until kubelet has called NotifyRegistrationStatus (or `timeout` passes)."""
        with self._changed:
            self._changed.wait_for(lambda: self._status is not None, timeout)
            return self._status

    def GetInfo(self, request: pb.InfoRequest, context: grpc.ServicerContext) -> pb.PluginInfo:
        log.debug("kubelet asked for plugin info", endpoint=self._info.endpoint)
        reply = pb.PluginInfo()
        reply.CopyFrom(self._info)
        return reply

    def NotifyRegistrationStatus(
        self, request: pb.RegistrationStatus, context: grpc.ServicerContext
    ) -> pb.RegistrationStatusResponse:
        status = RegistrationStatus(
            registered=request.plugin_registered, error=request.error, received_at=time.time()
        )
        if status.registered:
            log.info("kubelet registered the plugin", driver=self._info.name, endpoint=self._info.endpoint)
        else:
            log.error(
                "kubelet refused the plugin registration",
                driver=self._info.name,
                error=status.error,
                advertised=list(self._info.supported_versions),
            )
        with self._changed:
            self._status = status
            self._changed.notify_all()
        if self._on_status is not None:
            self._on_status(status)
        return pb.RegistrationStatusResponse()
