"""Which simulated machine each fake node of the scale benchmark is, and what its pods ask for.

Pure functions of their inputs (no cluster), so tests/benchmarks/test_scale_bench.py pins them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from driver import DRIVER_NAME

Obj = dict[str, Any]

# kwok manages exactly the Nodes carrying this annotation (its --manage-nodes-with-annotation-selector).
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_SELECTOR = f"{KWOK_ANNOTATION}=fake"


@dataclass(frozen=True)
class Share:
    """`fraction` of the fleet runs `profile`, published with `mig_strategy`."""

    profile: str
    mig_strategy: str
    fraction: float


# The fleet issue 27 asks for: 60 % DGX H100 with dynamic MIG, 30 % A100 PCIe, 10 % T4.
FLEET: tuple[Share, ...] = (
    Share("dgx-h100-8", "dynamic", 0.6),
    Share("a100-pcie-4", "static", 0.3),
    Share("t4-4", "static", 0.1),
)


def fleet_with(dgx_mig: str) -> tuple[Share, ...]:
    """FLEET with the DGX nodes' MIG strategy replaced (the variant that shows what dynamic MIG costs)."""
    if dgx_mig not in ("none", "static", "dynamic"):
        raise ValueError(f"--dgx-mig must be none, static or dynamic, got {dgx_mig!r}")
    return tuple(Share(s.profile, dgx_mig, s.fraction) if s.profile == "dgx-h100-8" else s for s in FLEET)


def claim_cases(dgx_mig: str) -> tuple[str, ...]:
    """The claim kinds this fleet can satisfy: MIG partitions only exist where DGX nodes publish dynamic MIG."""
    return tuple(c for c in CLAIM_CASES if dgx_mig == "dynamic" or not c.startswith("MIG"))


@dataclass(frozen=True)
class NodePlan:
    name: str
    profile: str
    mig_strategy: str


def apportion(total: int, fractions: Sequence[float]) -> list[int]:
    """Split `total` into whole counts proportional to `fractions` that add up to `total` exactly.

    Largest remainder: floors first, then one more to the shares that lost the most by rounding
    (ties to the earlier share), so 1,000 nodes at 60/30/10 are exactly 600/300/100.
    """
    if total < 0:
        raise ValueError(f"node count must be >= 0, got {total}")
    if not fractions or any(f < 0 for f in fractions) or not math.isclose(sum(fractions), 1.0, abs_tol=1e-9):
        raise ValueError(f"fractions must be >= 0 and add up to 1, got {list(fractions)}")
    exact = [total * f for f in fractions]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(fractions)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def node_name(index: int, width: int = 5) -> str:
    return f"kwok-gpu-{index:0{width}d}"


def plan_nodes(total: int, fleet: Sequence[Share] = FLEET) -> list[NodePlan]:
    """`total` nodes, profiles interleaved (not in blocks) so any prefix of the list has the fleet's mix."""
    counts = apportion(total, [s.fraction for s in fleet])
    placed = [0] * len(fleet)
    plans: list[NodePlan] = []
    for index in range(total):
        # the share furthest behind its quota so far gets this node
        pick = min(range(len(fleet)),
                   key=lambda i: (placed[i] / counts[i] if counts[i] else math.inf, i))
        placed[pick] += 1
        plans.append(NodePlan(node_name(index), fleet[pick].profile, fleet[pick].mig_strategy))
    return plans


def kwok_node(name: str) -> Obj:
    """A Node kwok takes over: it fills in the status, keeps the lease and heartbeats, runs bound pods."""
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {KWOK_ANNOTATION: "fake"},
                     "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                "kubernetes.io/arch": "amd64", "type": "kwok"}},
        "spec": {},
    }


def split(items: Sequence[NodePlan], parts: int) -> list[list[NodePlan]]:
    """Round-robin `items` into `parts` lists (one per publisher process), each with the fleet's mix."""
    if parts < 1:
        raise ValueError(f"publisher process count must be >= 1, got {parts}")
    return [list(items[i::parts]) for i in range(parts)]


# ---------------------------------------------------------------------------------------------
# what the scheduling pods ask for

def _request(device_class: str, count: int = 1, *, memory: str = "") -> Obj:
    exactly: Obj = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    if memory:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {"name": "gpu", "exactly": exactly}


def _spread(total: str) -> list[Obj]:
    """tessera's multi-card form: `total` memory over the request's cards; its webhook rewrites it per card."""
    return [{"requests": ["gpu"], "opaque": {"driver": DRIVER_NAME, "parameters": {
        "apiVersion": f"{DRIVER_NAME}/v1alpha1", "kind": "GpuConfig", "sharing": {"totalMemory": total}}}}]


# The claim spec of each kind of pod (a ResourceClaimTemplate each; the claim controller makes one claim
# per pod from it, and tessera's webhooks review and, for the multi-card case, rewrite every one).
CLAIM_CASES: dict[str, Obj] = {
    "whole GPU": {"devices": {"requests": [_request("gpu.tessera.dev")]}},
    "10Gi share": {"devices": {"requests": [_request("shared.gpu.tessera.dev", memory="10Gi")]}},
    "MIG 1g.10gb": {"devices": {"requests": [_request("mig-1g.10gb.gpu.tessera.dev")]}},
    "20Gi across 2 cards": {"devices": {"requests": [_request("shared.gpu.tessera.dev", 2)],
                                        "config": _spread("20Gi")}},
}


def template_name(case: str) -> str:
    return "t-" + "".join(ch if ch.isalnum() else "-" for ch in case.lower()).strip("-").replace("--", "-")


def pod_cases(pods: int, cases: Sequence[str] = tuple(CLAIM_CASES)) -> list[str]:
    """Which case each of `pods` pods gets: round-robin, so the kinds arrive mixed as in a real queue."""
    if not cases:
        raise ValueError("no claim cases to spread the pods over")
    return [cases[i % len(cases)] for i in range(pods)]
