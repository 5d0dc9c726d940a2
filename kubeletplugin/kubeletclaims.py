"""A claim as kubelet names it (ClaimRef) and the node agent's answer for it (PrepareResult of PreparedDevice);
shared by DeviceState and the gRPC layer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClaimRef:
    """A claim as kubelet names it in NodePrepareResources / NodeUnprepareResources."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class PreparedDevice:
    """One allocated device of a prepared claim, as it goes into the gRPC `Device` message."""

    request_names: tuple[str, ...]  # base request names ("req", never "req/sub")
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str = ""


@dataclass(frozen=True)
class PrepareResult:
    """The answer for one claim: the devices, or an error text (then kubelet ignores the devices)."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""
