"""The multi-card rewrite: "N GiB across M cards" becomes one request of M shares of N/M each.

What the user writes (a ResourceClaim or the spec of a ResourceClaimTemplate):

    requests:
    - name: gpus
      exactly: {deviceClassName: gpu.tessera.dev, count: 2}
    config:
    - requests: [gpus]
      opaque:
        driver: gpu.tessera.dev
        parameters: {apiVersion: gpu.tessera.dev/v1alpha1, kind: GpuConfig,
                     sharing: {totalMemory: 8Gi, sameNVLinkIsland: true}}

What the mutating webhook turns it into:

    requests:
    - {name: gpus, exactly: {deviceClassName: gpu.tessera.dev, count: 2, capacity: {requests: {memory: 4Gi}}}}
    constraints:
    - {requests: [gpus], distinctAttribute: gpu.tessera.dev/uuid}
    - {requests: [gpus], matchAttribute: gpu.tessera.dev/nvlinkIsland}
    config:
    - requests: [gpus]
      opaque: {driver: gpu.tessera.dev, parameters: {apiVersion: gpu.tessera.dev/v1alpha1, kind: GpuConfig}}

Why one request with count M: the scheduler's allocator fills the M slots of one request with M
different devices (each slot starts its search after the device the previous slot took), and a
multi-allocatable GPU is one device however many shares it has left. Against kube-scheduler 1.36.3
(e2e/test_multicard.py) such a request lands on M distinct cards for M = 2, 3, 4 and 8, and stays
Pending rather than doubling up when only one card is free. Keeping the request as written means
containers that name it in `resources.claims[].request` and config entries that name it stay valid.

The `distinctAttribute` on the GPU uuid is belt and braces: the allocator does not need it for one
request today, but it states the intent in the stored claim and keeps the M shares apart should a
later allocator fill the slots of a request the way it fills separate requests, which do share a
card when nothing forbids it (also shown in e2e/test_multicard.py). `matchAttribute` on
nvlinkIsland keeps the cards on one NVLink island; pools are per node, so all of them are on one
node. A constraint the claim already has is not added twice; more than 32 constraints in all (the
apiserver's limit) is an error. `totalMemory`/`sameNVLinkIsland` are removed from the config
because the request and constraints now carry them, which also makes the rewrite idempotent; the
annotation `gpu.tessera.dev/multi-card` records the original ask.

Rules: the per-card share N/M must be a whole number of GiB (otherwise the two nearest valid totals
are offered); `count: 1` with totalMemory becomes a single share of N; `allocationMode: All` and a
request that also names `capacity.requests` are rejected. Inside `firstAvailable` a subrequest is
rewritten the same way, in place, with constraints naming `<request>/<subrequest>` (the apiserver
accepts such references and the allocator applies them only when that alternative is chosen), so
"one of" stays "one of".
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from controller.checks.claimspec import RequestBody, request_path, requests
from controller.checks.configs import DecodedConfig, decode_configs
from controller.checks.findings import Finding, error
from driver import DRIVER_NAME
from driver.quantity import format_bytes, quantity_bytes_or_none

GiB = 1 << 30
ANNOTATION = f"{DRIVER_NAME}/multi-card"
UUID_ATTRIBUTE = f"{DRIVER_NAME}/uuid"
ISLAND_ATTRIBUTE = f"{DRIVER_NAME}/nvlinkIsland"
MAX_CONSTRAINTS = 32  # spec.devices.constraints, as the apiserver validates it

Obj = dict[str, Any]


@dataclass(frozen=True)
class Rewrite:
    """What happened to one request or subrequest."""

    request: str  # "gpus" or "accel/full"
    cards: int  # 0: allocationMode All (island constraint only)
    per_card: str  # quantity, "" when only an island constraint was added
    same_island: bool
    total: str = ""

    def describe(self) -> str:
        island = ", all on one NVLink island" if self.same_island else ""
        if self.per_card and self.cards > 1:
            return (
                f'request "{self.request}" ({self.total} across {self.cards} cards) asks for {self.per_card} '
                f"on each of {self.cards} distinct GPUs{island}"
            )
        if self.per_card:
            return f'request "{self.request}" becomes a share of {self.per_card} of one GPU'
        devices = f"its {self.cards} devices" if self.cards else "all its devices"
        return f'request "{self.request}" keeps {devices} on one NVLink island'

    def constraints(self) -> list[Obj]:
        """The constraints that carry the ask: distinct cards for M shares, one island when asked."""
        out: list[Obj] = []
        if self.per_card and self.cards > 1:
            out.append({"requests": [self.request], "distinctAttribute": UUID_ATTRIBUTE})
        if self.same_island:
            out.append({"requests": [self.request], "matchAttribute": ISLAND_ATTRIBUTE})
        return out


@dataclass(frozen=True)
class RewriteResult:
    spec: Obj  # the rewritten ResourceClaimSpec (a copy; the input is never modified)
    rewrites: tuple[Rewrite, ...] = ()
    findings: tuple[Finding, ...] = ()  # errors: the claim must be rejected

    @property
    def changed(self) -> bool:
        return bool(self.rewrites)

    def annotation(self) -> str:
        return json.dumps(
            {
                r.request: {"totalMemory": r.total, "cards": r.cards, "perCard": r.per_card,
                            "sameNVLinkIsland": r.same_island}
                for r in self.rewrites
            },
            sort_keys=True,
        )


def rewrite_claim_spec(spec: Obj, path: str, targets_tessera: Callable[[str], bool]) -> RewriteResult:
    """Apply the multi-card rewrite to a ResourceClaimSpec found at `path` ("spec" or "spec.spec").

    `targets_tessera(class_name)` says whether a request's DeviceClass is one of tessera's.
    """
    out = copy.deepcopy(spec) if isinstance(spec, dict) else {}
    devices = out.get("devices")
    if not isinstance(devices, dict) or not isinstance(devices.get("requests"), list):
        return RewriteResult(out)
    _, configs = decode_configs(devices.get("config"), f"{path}.devices.config", in_class=False)
    carrying = [c for c in configs if c.config.sharing.total_memory or c.config.sharing.same_nvlink_island is not None]
    if not carrying:
        return RewriteResult(out)

    findings: list[Finding] = []
    rewrites: list[Rewrite] = []
    for request in requests(out, path):
        # the bodies are edited in place, inside the copy `out`
        for body in request.bodies:
            if not targets_tessera(body.class_name):
                continue
            result = _rewrite_body(body, configs)
            if isinstance(result, Finding):
                findings.append(result)
            elif result is not None:
                rewrites.append(result)

    if findings:
        return RewriteResult(copy.deepcopy(spec), (), tuple(findings))
    if not rewrites:
        return RewriteResult(out)
    problem = _add_constraints(devices, path, rewrites)
    if problem is not None:
        return RewriteResult(copy.deepcopy(spec), (), (problem,))
    devices["config"] = [_stripped(c) for c in devices.get("config") or []]
    if not devices["config"]:
        del devices["config"]
    return RewriteResult(out, tuple(rewrites))


def _effective(configs: list[DecodedConfig], name: str) -> tuple[DecodedConfig | None, bool]:
    """The config whose totalMemory applies to request `name`, and whether it asks for one NVLink island."""
    from driver.config import config_applies

    total: DecodedConfig | None = None
    island = False
    for c in configs:  # later entries win, as when the node agent merges them
        if config_applies(c.requests, name):
            if c.config.sharing.total_memory:
                total = c
            if c.config.sharing.same_nvlink_island is not None:
                island = c.config.sharing.same_nvlink_island
    return total, island


def _rewrite_body(request: RequestBody, configs: list[DecodedConfig]) -> Rewrite | Finding | None:
    """Rewrite one tessera request body in place; None when its configs ask for nothing to rewrite."""
    total_cfg, same_island = _effective(configs, request.ref)
    if total_cfg is None:
        if same_island and (request.mode == "All" or request.count >= 2):
            return Rewrite(request.ref, request.count, "", True)
        return None
    result = _share(request, total_cfg, same_island=same_island)
    if isinstance(result, Rewrite):
        request.body["count"] = result.cards
        request.body["capacity"] = {"requests": {"memory": result.per_card}}
    return result


def _add_constraints(devices: Obj, path: str, rewrites: list[Rewrite]) -> Finding | None:
    """Add the rewrites' constraints to `devices` (once each); the error when that cannot be done."""
    existing = devices.get("constraints")
    if existing is not None and not isinstance(existing, list):
        return error(f"{path}.devices.constraints", f"must be a list of constraints, got {type(existing).__name__}")
    constraints = list(existing or [])
    for rewrite in rewrites:
        constraints.extend(c for c in rewrite.constraints() if c not in constraints)
    if len(constraints) > MAX_CONSTRAINTS:
        return error(
            f"{path}.devices.constraints",
            f"the multi-card rewrite needs {len(constraints)} constraints, more than the {MAX_CONSTRAINTS} a "
            "claim may have; split the claim, or drop constraints that repeat what sharing.totalMemory and "
            "sameNVLinkIsland already ask for",
        )
    devices["constraints"] = constraints
    return None


def _share(request: RequestBody, cfg: DecodedConfig, *, same_island: bool) -> Rewrite | Finding:
    """Check that the request can carry sharing.totalMemory and say how: N/M per card on M cards."""
    name, body, path = request.ref, request.body, request.path
    total_text = str(cfg.config.sharing.total_memory)
    total_path = f"{cfg.path}.sharing.totalMemory"
    if request.mode == "All":
        return error(
            f"{path}.allocationMode",
            f'request "{name}" uses allocationMode All, but sharing.totalMemory ({total_path}) spreads memory '
            "over a known number of cards: use allocationMode ExactCount with count: <number of cards>",
        )
    capacity = body.get("capacity")
    requested = capacity.get("requests") if isinstance(capacity, dict) else None
    if requested:
        return error(
            f"{path}.capacity.requests",
            f'request "{name}" names capacity.requests and its config sets sharing.totalMemory ({total_path}); '
            "use one: totalMemory for a total across count cards, capacity.requests.memory for one share per card",
        )
    total = quantity_bytes_or_none(total_text, whole=True)
    if total is None:
        return error(total_path, f"{total_text} is not a whole number of bytes; write it like 16Gi")
    count = body.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        return error(
            f"{path}.count",
            f'request "{name}" asks for count: {json.dumps(count)}, but sharing.totalMemory ({total_path}) is spread '
            "over count cards: count must be a whole number of cards, at least 1",
        )
    cards = count
    if total % (cards * GiB) != 0:
        unit = cards * GiB
        low, high = (total // unit) * unit, (total // unit + 1) * unit
        nearest = f"{format_bytes(low)} or {format_bytes(high)}" if low else f"{format_bytes(high)} (the smallest)"
        return error(
            total_path,
            f"{total_text} across {cards} cards is not a whole number of GiB per card; nearest valid "
            f"totals: {nearest}",
        )
    return Rewrite(name, cards, format_bytes(total // cards), same_island and cards > 1, total_text)


def _stripped(entry: Any) -> Any:
    """The config entry without totalMemory/sameNVLinkIsland (now carried by the request and constraints)."""
    if not isinstance(entry, dict):
        return entry
    opaque = entry.get("opaque")
    if not isinstance(opaque, dict) or opaque.get("driver") != DRIVER_NAME:
        return entry
    params = opaque.get("parameters")
    sharing = params.get("sharing") if isinstance(params, dict) else None
    if not isinstance(sharing, dict) or not ({"totalMemory", "sameNVLinkIsland"} & set(sharing)):
        return entry
    sharing = {k: v for k, v in sharing.items() if k not in ("totalMemory", "sameNVLinkIsland")}
    assert isinstance(params, dict)
    new_params = {k: v for k, v in params.items() if k != "sharing"}
    if sharing:
        new_params["sharing"] = sharing
    return {**entry, "opaque": {**opaque, "parameters": new_params}}


def pending_findings(spec: Obj, path: str, targets_tessera: Callable[[str], bool]) -> list[Finding]:
    """Errors for a claim the mutating webhook should have rewritten but did not (and for multi-card
    asks that cannot be rewritten at all): the scheduler would otherwise ignore totalMemory silently."""
    result = rewrite_claim_spec(spec, path, targets_tessera)
    findings = list(result.findings)
    for r in result.rewrites:
        findings.append(
            error(
                request_path(spec, path, r.request),
                f"needs tessera's mutating webhook (/mutate-resourceclaim) to rewrite it ({r.describe()}), and that "
                "did not happen, so the scheduler would ignore sharing.totalMemory/sameNVLinkIsland; install the "
                "MutatingWebhookConfiguration of the tessera chart, or write capacity.requests.memory per card "
                "and the constraints yourself",
            )
        )
    return findings
