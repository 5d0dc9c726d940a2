"""The checkpoint's on-disk schema, every format of it, and the conversions: bytes <-> `Checkpoint`.

One JSON document (kubeletplugin/checkpointstore.py keeps it at `<state dir>/checkpoint.json`):

    {"version": 1, "format": 2, "bootID": "<kernel boot id>", "checksum": "sha256:<hex>",
     "claims": {"<uid>": <entry>}}

The checksum covers the canonical JSON of `claims` (sorted keys, no spaces).

Formats:
- format 1: `{"version": 1, "checksum", "claims"}`. No `format` and no `bootID` field.
- format 2: adds `format: 2` and `bootID`. Its entries are format 1's, so it writes `version: 1`.
- format 3: an entry may record several MPS daemons (`mpsDaemons`; one per MPS group of a claim
  whose requests are shared in different ways). `mps` still holds the first, where formats 1 and 2
  look for it. A file is written as `version: 1` while every claim has at most one daemon, which
  formats 1 and 2 read completely; once a claim has two, as `version: 3`: an older build would
  stop only one of them, so it refuses the file and says to roll forward instead of leaking the
  others.

`format` is the format the writer speaks. `version` is the oldest format that can read the file:
the field every tessera build checks, which is why it keeps that name. A build reads every file
whose `version` is at most its own format. A file whose `version` is above it comes from a newer
build: decoding raises CheckpointFromNewerBuild, and the agent refuses to start rather than forget
that build's claims.

An entry, the same in both formats (a reader ignores fields it does not know; an older build's
`cdiSpec` is ignored on purpose, a stored spec is never written back):

    {"uid", "namespace", "name", "state": "PrepareStarted" | "PrepareCompleted" | "UnprepareStarted",
     "devices": [{"requestNames", "poolName", "deviceName", "cdiDeviceIDs", "shareID"}],
     "gpuUses": [{"gpuUUID", "kind"}],
     "allocation": <this node's part of status.allocation> | null,
     "mps": <daemon> | null,  "mpsDaemons": [<daemon>],   (format 3; absent: [mps] when mps is set)
     <daemon> = {"claimUID" (the daemon's id: the claim uid, then <uid>-mps<n>), "pipeDir", "logDir",
                 "shmDir", "gpuUUIDs", "limitsMiB", "activeThreadPercentage"},
     "migs": [{"gpu_uuid", "gpu_index", "gpu_minor", "profile", "placement", "size", "gpu_instance_id",
               "compute_instance_id", "uuid"}],
     "timeSlices": [{"gpuUUID", "interval"}]}

Everything about those bytes is in this module: the records kept elsewhere (an MPS daemon, a MIG
instance, a prepared device) are converted here field by field, so a change to another file's
format never changes the checkpoint's by accident.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from driver.allocation import GpuUse
from driver.errors import NodeStateError
from driver.jsondepth import json_depth
from kubeletplugin.kubeletclaims import PreparedDevice
from kubeletplugin.migmanager import CreatedMig
from kubeletplugin.mps import MpsDaemon

# the format this build writes and the oldest format that can read it (see the module docstring)
FORMAT = 3
READABLE_SINCE = 1  # what a file needs to be read, while every claim has at most one MPS daemon
CHECKPOINT_VERSION = READABLE_SINCE
SEVERAL_DAEMONS_SINCE = 3  # a file with a claim of several MPS daemons
# tessera's own entries nest about ten levels (an allocation's opaque config included)
MAX_DEPTH = 64


class CheckpointError(NodeStateError):
    """The checkpoint file cannot be trusted."""

    reason = "checkpoint"


class CheckpointFromNewerBuild(CheckpointError):
    """The checkpoint was written by a newer tessera whose format this build cannot read; kept as is."""

    reason = "checkpoint_newer_build"


class ClaimState(StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"
    UNPREPARE_STARTED = "UnprepareStarted"


@dataclass(frozen=True)
class ClaimEntry:
    """What the node agent keeps about one claim."""

    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: tuple[PreparedDevice, ...] = ()
    gpu_uses: tuple[GpuUse, ...] = ()
    # this node's part of the claim's status.allocation (other drivers' results and configs nulled, so
    # result indices stay): recovery rebuilds the CDI spec from it after a reboot wiped /var/run/cdi
    allocation: dict[str, Any] | None = None
    mps_daemons: tuple[MpsDaemon, ...] = ()  # one per MPS group of the claim's plan
    migs: tuple[CreatedMig, ...] = field(default=())
    time_slices: tuple[tuple[str, str], ...] = ()  # (GPU UUID, interval) set for this claim

    @property
    def mps(self) -> MpsDaemon | None:
        """The claim's first MPS daemon (the only one formats 1 and 2 know)."""
        return self.mps_daemons[0] if self.mps_daemons else None


@dataclass(frozen=True)
class Checkpoint:
    """A decoded checkpoint: its entries and what its writer recorded about itself."""

    entries: dict[str, ClaimEntry]
    format: int = FORMAT
    boot_id: str = ""  # the boot the file was written in; "" when the writer did not record one (format 1)


# -- entries <-> JSON ------------------------------------------------------------------------------


def _device_to_json(d: PreparedDevice) -> dict[str, Any]:
    return {"requestNames": list(d.request_names), "poolName": d.pool_name, "deviceName": d.device_name,
            "cdiDeviceIDs": list(d.cdi_device_ids), "shareID": d.share_id}  # fmt: skip


def _device_from_json(data: dict[str, Any]) -> PreparedDevice:
    return PreparedDevice(
        request_names=tuple(str(r) for r in data["requestNames"]),
        pool_name=str(data["poolName"]),
        device_name=str(data["deviceName"]),
        cdi_device_ids=tuple(str(c) for c in data["cdiDeviceIDs"]),
        share_id=str(data.get("shareID", "")),
    )


_MIG_INTS = ("gpu_index", "gpu_minor", "placement", "size", "gpu_instance_id", "compute_instance_id")


def _mig_to_json(m: CreatedMig) -> dict[str, Any]:
    return {"gpu_uuid": m.gpu_uuid, "gpu_index": m.gpu_index, "gpu_minor": m.gpu_minor, "profile": m.profile,
            "placement": m.placement, "size": m.size, "gpu_instance_id": m.gpu_instance_id,
            "compute_instance_id": m.compute_instance_id, "uuid": m.uuid}  # fmt: skip


def _mig_from_json(data: dict[str, Any]) -> CreatedMig:
    ints = {k: int(data[k]) for k in _MIG_INTS}
    return CreatedMig(gpu_uuid=str(data["gpu_uuid"]), profile=str(data["profile"]), uuid=str(data["uuid"]), **ints)


def entry_to_json(e: ClaimEntry) -> dict[str, Any]:
    return {
        "uid": e.uid,
        "namespace": e.namespace,
        "name": e.name,
        "state": e.state.value,
        "devices": [_device_to_json(d) for d in e.devices],
        "gpuUses": [{"gpuUUID": u.gpu_uuid, "kind": u.kind} for u in e.gpu_uses],
        "allocation": e.allocation,
        "mps": e.mps.to_dict() if e.mps else None,
        "mpsDaemons": [m.to_dict() for m in e.mps_daemons],
        "migs": [_mig_to_json(m) for m in e.migs],
        "timeSlices": [{"gpuUUID": u, "interval": i} for u, i in e.time_slices],
    }


def entry_from_json(data: dict[str, Any]) -> ClaimEntry:
    allocation = data.get("allocation")
    if allocation is not None and not isinstance(allocation, dict):
        raise TypeError(f"allocation must be an object, got {type(allocation).__name__}")
    return ClaimEntry(
        uid=str(data["uid"]),
        namespace=str(data["namespace"]),
        name=str(data["name"]),
        state=ClaimState(data["state"]),
        devices=tuple(_device_from_json(d) for d in data.get("devices", [])),
        gpu_uses=tuple(GpuUse(str(u["gpuUUID"]), str(u["kind"])) for u in data.get("gpuUses", [])),
        allocation=allocation,
        mps_daemons=tuple(MpsDaemon.from_dict(m) for m in data["mpsDaemons"]) if "mpsDaemons" in data
        else (MpsDaemon.from_dict(data["mps"]),) if data.get("mps") else (),
        migs=tuple(_mig_from_json(m) for m in data.get("migs", [])),
        time_slices=tuple((str(t["gpuUUID"]), str(t["interval"])) for t in data.get("timeSlices", [])),
    )


# -- documents <-> bytes ---------------------------------------------------------------------------


def canonical(claims: dict[str, Any]) -> bytes:
    """The bytes the checksum covers."""
    return json.dumps(claims, sort_keys=True, separators=(",", ":")).encode()


def readable_since(entries: dict[str, ClaimEntry]) -> int:
    """The oldest format that reads every entry completely (see the module docstring)."""
    several = any(len(e.mps_daemons) > 1 for e in entries.values())
    return SEVERAL_DAEMONS_SINCE if several else READABLE_SINCE


def encode(entries: dict[str, ClaimEntry], boot_id: str = "") -> bytes:
    """A document of this build's format, readable by the oldest format that can (readable_since)."""
    # the claims are written in their canonical form, the bytes the checksum covers: one dump, and
    # json's C encoder (an indented dump runs the pure-Python one, a third of a prepare's CPU)
    claims = canonical({uid: entry_to_json(e) for uid, e in sorted(entries.items())})
    checksum = "sha256:" + hashlib.sha256(claims).hexdigest()
    head = json.dumps({"version": readable_since(entries), "format": FORMAT, "bootID": boot_id, "checksum": checksum},
                      indent=1)
    return head[:-2].encode() + b',\n "claims": ' + claims + b"\n}\n"


def decode(data: bytes) -> Checkpoint:
    """Parse and verify a checkpoint of any format this build reads; CheckpointError says what is wrong."""
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise CheckpointError(f"not valid JSON (truncated?): {exc}") from None
    except RecursionError:
        raise CheckpointError("nested too deeply to parse") from None
    if not isinstance(doc, dict):
        raise CheckpointError("not a JSON object")
    # what the entries are later compared, copied and re-encoded with recurses too
    if json_depth(doc) > MAX_DEPTH:
        raise CheckpointError(f"nested deeper than {MAX_DEPTH} levels, far more than any checkpoint tessera writes")
    version, written_as = doc.get("version"), doc.get("format", 1)
    if type(version) is not int or type(written_as) is not int or not 1 <= version <= written_as:
        raise CheckpointError(f"version {version!r} / format {written_as!r} are not a checkpoint's")
    if version > FORMAT:
        raise CheckpointFromNewerBuild(
            f"written by a newer tessera (format {written_as}, readable from format {version} on); this build "
            f"reads formats up to {FORMAT}: roll the DaemonSet forward again, or move the file aside to start "
            "empty (kubelet then prepares running pods' claims again)"
        )
    boot_id = doc.get("bootID", "")
    if not isinstance(boot_id, str):
        raise CheckpointError(f"bootID must be a string, got {type(boot_id).__name__}")
    claims = doc.get("claims")
    if not isinstance(claims, dict):
        raise CheckpointError("no claims object")
    expected = "sha256:" + hashlib.sha256(canonical(claims)).hexdigest()
    if doc.get("checksum") != expected:
        raise CheckpointError(f"checksum mismatch (file says {doc.get('checksum')!r}, content is {expected})")
    try:
        entries = {uid: entry_from_json(entry) for uid, entry in claims.items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"malformed claim entry: {exc!r}") from None
    return Checkpoint(entries, written_as, boot_id)
