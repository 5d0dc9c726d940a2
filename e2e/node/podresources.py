"""kubelet's PodResources API, asked the way a monitoring agent on the node asks it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import grpc

from proto.podresources.v1 import api_pb2, api_pb2_grpc


@dataclass(frozen=True)
class ClaimDevice:
    claim: str
    device: str
    pool: str
    cdi_ids: tuple[str, ...]
    share_id: str


def list_dynamic_resources(socket: Path, namespace: str, pod: str) -> dict[str, list[ClaimDevice]]:
    """Per container of `namespace/pod`: the DRA devices kubelet says it holds (`List`)."""
    # A relative unix address keeps deep work dirs under the 108-byte socket path limit.
    cwd = os.getcwd()
    os.chdir(socket.parent)
    try:
        with grpc.insecure_channel(f"unix:{socket.name}") as channel:
            grpc.channel_ready_future(channel).result(timeout=10)
            response = api_pb2_grpc.PodResourcesListerStub(channel).List(api_pb2.ListPodResourcesRequest(), timeout=10)
    finally:
        os.chdir(cwd)
    out: dict[str, list[ClaimDevice]] = {}
    for pr in response.pod_resources:
        if pr.namespace != namespace or pr.name != pod:
            continue
        for container in pr.containers:
            out[container.name] = [
                ClaimDevice(dr.claim_name, cr.device_name, cr.pool_name, tuple(d.name for d in cr.cdi_devices),
                            cr.share_id if cr.HasField("share_id") else "")
                for dr in container.dynamic_resources for cr in dr.claim_resources]
    return out
