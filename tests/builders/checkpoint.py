"""A checkpoint entry with every field set, to check nothing is lost on the way to disk and back."""

from __future__ import annotations

from driver.allocation import GpuUse
from kubeletplugin.checkpoint import ClaimEntry, ClaimState
from kubeletplugin.kubeletclaims import PreparedDevice
from kubeletplugin.migmanager import CreatedMig
from kubeletplugin.mps import MpsDaemon
from tests.builders.claims import UID


def full_entry(uid: str = UID) -> ClaimEntry:
    return ClaimEntry(
        uid=uid,
        namespace="team-a",
        name="claim",
        state=ClaimState.PREPARE_COMPLETED,
        devices=(PreparedDevice(("gpu",), "node-a", "gpu-0", (f"gpu.tessera.dev/claim={uid}-gpu-0",), "3f2c8a9e"),),
        gpu_uses=(GpuUse("GPU-0", "share"),),
        allocation={"devices": {"results": [None, {"request": "gpu", "driver": "gpu.tessera.dev", "pool": "node-a",
                                                   "device": "gpu-0", "shareID": "3f2c8a9e"}], "config": []}},
        mps_daemons=(MpsDaemon(uid, "/s/pipe", "/s/log", "/s/shm", ("GPU-0",), (4096,), 50),),
        migs=(CreatedMig("GPU-1", 1, 1, "1g.10gb", 3, 1, 2, 0, "MIG-x"),),
    )
