"""Names tessera gives to what it publishes: devices, counter sets, ResourceSlices and their labels.

Every name here ends up in an API field with its own grammar (device and counter names are DNS-1123
labels, slice names DNS-1123 subdomains, label values at most 63 characters), so each builder keeps its
output inside that grammar even for node names that are long or unusual.
"""

from __future__ import annotations

import hashlib

from driver import DRIVER_NAME

# Labels on every ResourceSlice tessera writes, so operators (and tessera after a restart) can find them.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "tessera"
DRIVER_LABEL = f"{DRIVER_NAME}/driver"
NODE_LABEL = f"{DRIVER_NAME}/node"

_SLICE_NAME_MAX = 253
_LABEL_VALUE_MAX = 63
# Zero-padded so that lexical order (which the scheduler's first-fit follows) equals publishing order.
_SLICE_INDEX_DIGITS = 3


def base_request(request: str) -> str:
    """The request a container names for an allocation result: "req/sub" (a firstAvailable subrequest) -> "req"."""
    return request.split("/", 1)[0]


def subrequest(request: str) -> str:
    """The firstAvailable subrequest of a result's request name: "req/sub" -> "sub"; "req" -> ""."""
    return request.split("/", 1)[1] if "/" in request else ""


def gpu_device_name(index: int) -> str:
    """`gpu-<index>`: the device that stands for a whole GPU."""
    if index < 0:
        raise ValueError(f"GPU index must be >= 0, got {index}")
    return f"gpu-{index}"


def mig_profile_token(profile: str) -> str:
    """A MIG profile as it appears inside a device name: "1g.10gb" -> "1g10gb", "1g.10gb+me" -> "1g10gbme"."""
    token = "".join(ch for ch in profile.lower() if ch.isalnum())
    if not token:
        raise ValueError(f"MIG profile {profile!r} has no letters or digits to name a device after")
    return token


def mig_device_name(gpu_index: int, profile: str, placement: int) -> str:
    """`gpu-<index>-mig-<profile without dots>-<placement>`, e.g. `gpu-0-mig-1g10gb-0`."""
    if placement < 0:
        raise ValueError(f"MIG placement must be >= 0, got {placement}")
    return f"{gpu_device_name(gpu_index)}-mig-{mig_profile_token(profile)}-{placement}"


def counter_set_name(gpu_index: int) -> str:
    """The shared counter set of one partitionable GPU (dynamic MIG): `gpu-<index>-counters`."""
    return f"{gpu_device_name(gpu_index)}-counters"


def memory_slice_counter(index: int) -> str:
    """The 0/1 counter for one MIG memory slice; overlapping placements conflict through it."""
    return f"memory-slice-{index}"


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def slice_name(node_name: str, index: int) -> str:
    """Deterministic ResourceSlice name `<node>-gpu.tessera.dev-<index, 3 digits>`.

    Deterministic names let a restarted publisher recognise its own slices and update them in place.
    A node name too long to fit the 253-character limit is shortened and disambiguated with a hash
    of the full name, so two long node names sharing a prefix still get different slice names.
    """
    if index < 0:
        raise ValueError(f"slice index must be >= 0, got {index}")
    suffix = f"-{DRIVER_NAME}-{index:0{_SLICE_INDEX_DIGITS}d}"
    if len(node_name) + len(suffix) <= _SLICE_NAME_MAX:
        return node_name + suffix
    tag = "-" + _short_hash(node_name)
    keep = _SLICE_NAME_MAX - len(suffix) - len(tag)
    return node_name[:keep].rstrip("-.") + tag + suffix


def node_label_value(node_name: str) -> str:
    """The node name as a label value (at most 63 characters; longer names are shortened plus a hash)."""
    if len(node_name) <= _LABEL_VALUE_MAX:
        return node_name
    tag = "-" + _short_hash(node_name)
    return node_name[: _LABEL_VALUE_MAX - len(tag)].rstrip("-.") + tag


def slice_labels(node_name: str) -> dict[str, str]:
    """Labels put on every slice of a node's pool."""
    return {
        MANAGED_BY_LABEL: MANAGED_BY_VALUE,
        DRIVER_LABEL: DRIVER_NAME,
        NODE_LABEL: node_label_value(node_name),
    }


def slice_field_selector(node_name: str) -> str:
    """The field selector that lists exactly this driver's slices of one node."""
    return f"spec.nodeName={node_name},spec.driver={DRIVER_NAME}"
