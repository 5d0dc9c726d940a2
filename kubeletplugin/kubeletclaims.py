"""A claim as kubelet names it (ClaimRef) and the node agent's answer for it (PrepareResult of PreparedDevice);
shared by DeviceState and the gRPC layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "requestNames": list(self.request_names),
            "poolName": self.pool_name,
            "deviceName": self.device_name,
            "cdiDeviceIDs": list(self.cdi_device_ids),
            "shareID": self.share_id,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PreparedDevice:
        return cls(
            request_names=tuple(str(r) for r in data["requestNames"]),
            pool_name=str(data["poolName"]),
            device_name=str(data["deviceName"]),
            cdi_device_ids=tuple(str(c) for c in data["cdiDeviceIDs"]),
            share_id=str(data.get("shareID", "")),
        )


@dataclass(frozen=True)
class PrepareResult:
    """The answer for one claim: the devices, or an error text (then kubelet ignores the devices)."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""
