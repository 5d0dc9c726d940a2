"""NVLink islands: which GPUs of a node reach each other over NVLink, under a stable name.

Both discovery backends (driver.simulated, driver.nvml) finish their GPUs with
`assign_nvlink_islands`, so an island means the same thing whichever backend found it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from driver.model import Gpu


@dataclass(frozen=True)
class NvlinkPlacement:
    """Where one GPU sits in the node's NVLink fabric."""

    island: str
    peers: int


_SWITCH = -1  # union-find key standing for the NVSwitch fabric


def nvlink_placements(
    uuids: Mapping[int, str], links: Iterable[tuple[int, int]], switched: Iterable[int]
) -> dict[int, NvlinkPlacement]:
    """Group GPUs (by index) into NVLink islands: the connected components of the NVLink graph.

    `links` are direct GPU-to-GPU links (bridges), `switched` the GPUs with an active link into an
    NVSwitch; every switched GPU reaches every other switched GPU, so they form one island. A GPU
    with no link is an island of its own. `peers` counts the GPUs reachable in one NVLink hop
    (directly or through the switch), which is what peer-to-peer transfers can use.

    An island's id is derived from its members' UUIDs, so it is stable across restarts and
    re-indexing and distinct across nodes.
    """
    parent: dict[int, int] = {index: index for index in uuids}
    parent[_SWITCH] = _SWITCH

    def find(key: int) -> int:
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    def union(a: int, b: int) -> None:
        root_a, root_b = find(a), find(b)
        if root_a != root_b:
            parent[max(root_a, root_b)] = min(root_a, root_b)

    neighbours: dict[int, set[int]] = {index: set() for index in uuids}
    for a, b in links:
        if a == b:
            continue
        for end in (a, b):
            if end not in uuids:
                raise ValueError(f"NVLink {a}-{b} names GPU {end}, which is not on this node")
        union(a, b)
        neighbours[a].add(b)
        neighbours[b].add(a)
    on_switch = sorted(set(switched))
    for index in on_switch:
        if index not in uuids:
            raise ValueError(f"NVSwitch link names GPU {index}, which is not on this node")
        union(index, _SWITCH)
        neighbours[index].update(other for other in on_switch if other != index)

    members: dict[int, list[int]] = {}
    for index in uuids:
        members.setdefault(find(index), []).append(index)
    island_ids = {root: island_id(uuids[i] for i in group) for root, group in members.items()}
    return {index: NvlinkPlacement(island=island_ids[find(index)], peers=len(neighbours[index])) for index in uuids}


def island_id(member_uuids: Iterable[str]) -> str:
    """A short, stable name for a set of GPUs: order-independent, and it fits an attribute (<= 64 chars)."""
    digest = hashlib.sha256("\n".join(sorted(member_uuids)).encode()).hexdigest()
    return f"nvl-{digest[:16]}"


def assign_nvlink_islands(
    gpus: Sequence[Gpu], links: Iterable[tuple[int, int]], switched: Iterable[int]
) -> tuple[Gpu, ...]:
    """Return `gpus` with `nvlink_island` and `nvlink_peers` filled in from the NVLink graph."""
    placements = nvlink_placements({gpu.index: gpu.uuid for gpu in gpus}, links, switched)
    return tuple(
        dataclasses.replace(gpu, nvlink_island=placements[gpu.index].island, nvlink_peers=placements[gpu.index].peers)
        for gpu in gpus
    )
