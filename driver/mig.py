"""MIG profile tables: which partitions a GPU model offers and where each one may be placed.

A placement is expressed in memory slices (8 per GPU on A100 and H100), as NVML reports it
(`nvmlGpuInstancePlacement_t.start/size`). Two instances conflict when their memory-slice ranges
overlap or when together they need more compute slices than the GPU has (7).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

MIB = 1024 * 1024


@dataclass(frozen=True)
class MigProfile:
    name: str  # "1g.10gb"
    compute_slices: int  # the "1g" part
    memory_slices: int  # placement size in memory slices
    memory_bytes: int
    multiprocessors: int
    placements: tuple[int, ...]  # valid first memory slice of each possible instance

    @property
    def device_token(self) -> str:
        """The profile as it appears in a device name (DNS label): "1g.10gb" -> "1g10gb"."""
        return self.name.replace(".", "").replace("+", "")


@dataclass(frozen=True)
class MigLayout:
    """The MIG geometry of one GPU model."""

    memory_slices: int
    compute_slices: int
    profiles: tuple[MigProfile, ...]

    def profile(self, name: str) -> MigProfile:
        for p in self.profiles:
            if p.name == name:
                return p
        known = ", ".join(p.name for p in self.profiles)
        raise KeyError(f"unknown MIG profile {name!r}; this GPU offers: {known}")


def _p(name: str, memory_slices: int, mib: int, sms: int, placements: tuple[int, ...]) -> MigProfile:
    compute = int(name.split("g.", 1)[0])
    return MigProfile(name, compute, memory_slices, mib * MIB, sms, placements)


# NVIDIA H100 80GB (SXM5 and PCIe): 8 memory slices, 7 compute slices, 132 SMs (SXM).
H100_80GB = MigLayout(
    memory_slices=8,
    compute_slices=7,
    profiles=(
        _p("1g.10gb", 1, 9856, 16, (0, 1, 2, 3, 4, 5, 6)),
        _p("1g.20gb", 2, 19968, 16, (0, 2, 4, 6)),
        _p("2g.20gb", 2, 19968, 32, (0, 2, 4)),
        _p("3g.40gb", 4, 40192, 60, (0, 4)),
        _p("4g.40gb", 4, 40192, 64, (0,)),
        _p("7g.80gb", 8, 80896, 132, (0,)),
    ),
)

# NVIDIA A100 40GB (SXM4 and PCIe): 8 memory slices, 7 compute slices, 108 SMs (98 usable under MIG).
A100_40GB = MigLayout(
    memory_slices=8,
    compute_slices=7,
    profiles=(
        _p("1g.5gb", 1, 4864, 14, (0, 1, 2, 3, 4, 5, 6)),
        _p("1g.10gb", 2, 9984, 14, (0, 2, 4, 6)),
        _p("2g.10gb", 2, 9984, 28, (0, 2, 4)),
        _p("3g.20gb", 4, 19968, 42, (0, 4)),
        _p("4g.20gb", 4, 19968, 56, (0,)),
        _p("7g.40gb", 8, 40192, 98, (0,)),
    ),
)

_LAYOUTS: tuple[tuple[str, MigLayout], ...] = (
    ("H100 80GB", H100_80GB),
    ("H100 SXM", H100_80GB),
    ("A100-SXM4-40GB", A100_40GB),
    ("A100-PCIE-40GB", A100_40GB),
    ("A100 40GB", A100_40GB),
)


@lru_cache(maxsize=64)
def layout_for(product_name: str) -> MigLayout | None:
    """The MIG layout for a product name as NVML reports it, or None when tessera has no table for it."""
    lowered = product_name.lower()
    for needle, layout in _LAYOUTS:
        if needle.lower() in lowered:
            return layout
    return None
