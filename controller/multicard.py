"""The multi-card rewrite: "N GiB across M cards" becomes M per-card requests the scheduler understands.

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
    - {name: gpus-0, exactly: {deviceClassName: gpu.tessera.dev, count: 1, capacity: {requests: {memory: 4Gi}}}}
    - {name: gpus-1, exactly: {deviceClassName: gpu.tessera.dev, count: 1, capacity: {requests: {memory: 4Gi}}}}
    constraints:
    - {requests: [gpus-0, gpus-1], distinctAttribute: gpu.tessera.dev/uuid}
    - {requests: [gpus-0, gpus-1], matchAttribute: gpu.tessera.dev/nvlinkIsland}
    config:
    - requests: [gpus-0, gpus-1]
      opaque: {driver: gpu.tessera.dev, parameters: {apiVersion: gpu.tessera.dev/v1alpha1, kind: GpuConfig}}

Why M separate requests and not one request with count M: in Kubernetes 1.36 `distinctAttribute`
remembers one value per request name (dra-api.md §4.1), so the M shares of a single request could all
land on the same card. M requests of count 1, tied by `distinctAttribute` on the GPU uuid, land on M
different cards; `matchAttribute` on nvlinkIsland keeps them on one NVLink island; pools are per node,
so all of them are on one node. Every other reference to the old name (constraints and config
`requests`) is rewritten to the new names. `totalMemory`/`sameNVLinkIsland` are removed from the
config because the requests and constraints now carry them; the annotation
`gpu.tessera.dev/multi-card` records the original ask. The rewrite is idempotent: a request that
already names `capacity.requests.memory` is never rewritten again.

Rules: the per-card share N/M must be a whole number of GiB (otherwise the two nearest valid totals
are offered); `count: 1` with totalMemory becomes a single share of N; `allocationMode: All` and a
request that also names `capacity.requests.memory` are rejected; inside `firstAvailable` only count 1
(a single share) and `sameNVLinkIsland` are supported, because splitting an alternative into several
subrequests would turn "one of" into "all of".
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.configchecks import DecodedConfig, decode_configs
from controller.findings import DRIVER, Finding, error

GiB = 1 << 30
ANNOTATION = f"{DRIVER}/multi-card"
UUID_ATTRIBUTE = f"{DRIVER}/uuid"
ISLAND_ATTRIBUTE = f"{DRIVER}/nvlinkIsland"
MAX_NAME = 63  # request names are DNS labels

Obj = dict[str, Any]


@dataclass(frozen=True)
class Rewrite:
    """What happened to one request."""

    request: str  # "gpus" or "accel/full"
    cards: int
    per_card: str  # quantity, "" when only an island constraint was added
    same_island: bool
    new_names: tuple[str, ...]
    total: str = ""

    def describe(self) -> str:
        island = ", all on one NVLink island" if self.same_island else ""
        if self.per_card and len(self.new_names) > 1:
            return (
                f'request "{self.request}" ({self.total} across {self.cards} cards) becomes '
                f"{len(self.new_names)} requests {', '.join(self.new_names)} of {self.per_card} each on "
                f"distinct GPUs{island}"
            )
        if self.per_card:
            return f'request "{self.request}" becomes a share of {self.per_card} of one GPU'
        return f'request "{self.request}" keeps its {self.cards} devices on one NVLink island'


@dataclass(frozen=True)
class RewriteResult:
    spec: Obj  # the rewritten ResourceClaimSpec (a copy; the input is never modified)
    rewrites: tuple[Rewrite, ...] = ()
    findings: tuple[Finding, ...] = ()  # errors: the claim must be rejected
    warnings: tuple[str, ...] = field(default=())

    @property
    def changed(self) -> bool:
        return bool(self.rewrites)

    def annotation(self) -> str:
        return json.dumps(
            {
                r.request: {"totalMemory": r.total, "cards": r.cards, "perCard": r.per_card,
                            "sameNVLinkIsland": r.same_island, "requests": list(r.new_names)}
                for r in self.rewrites
            },
            sort_keys=True,
        )


def fmt_bytes(n: int) -> str:
    if n % GiB == 0:
        return f"{n // GiB}Gi"
    if n % (1 << 20) == 0:
        return f"{n >> 20}Mi"
    return str(n)


def _bytes(quantity: str) -> int | None:
    from driver.cel.quantity import Quantity

    try:
        q = Quantity.parse(quantity)
    except ValueError:
        return None
    value = q.value()
    return value if value * 1000 == q.milli_value() else None


def rewrite_claim_spec(spec: Obj, path: str, targets_tessera: Callable[[str], bool]) -> RewriteResult:
    """Apply the multi-card rewrite to a ResourceClaimSpec found at `path` ("spec" or "spec.spec").

    `targets_tessera(class_name)` says whether a request's DeviceClass is one of tessera's.
    """
    from driver.config import config_applies

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
    renames: dict[str, tuple[str, ...]] = {}
    constraints: list[Obj] = []
    new_requests: list[Any] = []
    existing = {str(r.get("name")) for r in devices["requests"] if isinstance(r, dict)}

    def effective(name: str) -> tuple[DecodedConfig | None, DecodedConfig | None]:
        total = island = None
        for c in configs:  # later entries win, as when the node agent merges them
            if config_applies(c.requests, name):
                if c.config.sharing.total_memory:
                    total = c
                if c.config.sharing.same_nvlink_island is not None:
                    island = c
        return total, island

    for i, request in enumerate(devices["requests"]):
        if not isinstance(request, dict):
            new_requests.append(request)
            continue
        name = str(request.get("name", ""))
        rpath = f"{path}.devices.requests[{i}]"
        body = request.get("exactly")
        if isinstance(body, dict):
            if not targets_tessera(str(body.get("deviceClassName", ""))):
                new_requests.append(request)
                continue
            total_cfg, island_cfg = effective(name)
            same_island = bool(island_cfg and island_cfg.config.sharing.same_nvlink_island)
            if total_cfg is None:
                new_requests.append(request)
                if same_island and _multi(body):
                    constraints.append({"requests": [name], "matchAttribute": ISLAND_ATTRIBUTE})
                    rewrites.append(Rewrite(name, _count(body), "", True, (name,)))
                continue
            result = _split(name, body, f"{rpath}.exactly", total_cfg, same_island=same_island, existing=existing)
            if isinstance(result, Finding):
                findings.append(result)
                new_requests.append(request)
                continue
            parts, rewrite = result
            if len(parts) == 1:
                new_requests.append({**request, "exactly": parts[0][1]})
            else:
                new_requests.extend({"name": n, "exactly": b} for n, b in parts)
                renames[name] = rewrite.new_names
                constraints.append({"requests": list(rewrite.new_names), "distinctAttribute": UUID_ATTRIBUTE})
                if same_island:
                    constraints.append({"requests": list(rewrite.new_names), "matchAttribute": ISLAND_ATTRIBUTE})
            rewrites.append(rewrite)
            continue
        subs = request.get("firstAvailable")
        if isinstance(subs, list):
            updated = copy.deepcopy(request)
            for j, sub in enumerate(updated["firstAvailable"]):
                if not isinstance(sub, dict) or not targets_tessera(str(sub.get("deviceClassName", ""))):
                    continue
                ref = f"{name}/{sub.get('name', '')}"
                total_cfg, island_cfg = effective(ref)
                same_island = bool(island_cfg and island_cfg.config.sharing.same_nvlink_island)
                spath = f"{rpath}.firstAvailable[{j}]"
                if total_cfg is not None:
                    if _multi(sub):
                        findings.append(
                            error(
                                spath,
                                f'subrequest "{ref}" asks for {_count(sub)} cards with sharing.totalMemory '
                                f"({total_cfg.path}.sharing.totalMemory), which tessera cannot rewrite inside "
                                "firstAvailable: splitting one alternative into several requests would make them "
                                "all required. Move the multi-card ask to its own `exactly` request (or its own "
                                "claim), or give this subrequest capacity.requests.memory per card",
                            )
                        )
                        continue
                    result = _split(ref, sub, spath, total_cfg, same_island=False, existing=existing)
                    if isinstance(result, Finding):
                        findings.append(result)
                        continue
                    parts, rewrite = result
                    updated["firstAvailable"][j] = {**parts[0][1], "name": sub.get("name")}
                    rewrites.append(rewrite)
                elif same_island and _multi(sub):
                    constraints.append({"requests": [ref], "matchAttribute": ISLAND_ATTRIBUTE})
                    rewrites.append(Rewrite(ref, _count(sub), "", True, (ref,)))
            new_requests.append(updated)
            continue
        new_requests.append(request)

    if findings:
        return RewriteResult(copy.deepcopy(spec), (), tuple(findings))
    if not rewrites:
        return RewriteResult(out)
    devices["requests"] = new_requests
    devices["constraints"] = [_renamed_refs(c, renames) for c in devices.get("constraints") or []] + constraints
    devices["config"] = [_renamed_refs(_stripped(c), renames) for c in devices.get("config") or []]
    if not devices["config"]:
        del devices["config"]
    warnings = tuple(
        f'{r.describe()}; a container that names request "{r.request}" in resources.claims[].request must '
        "name the claim alone instead"
        for r in rewrites
        if len(r.new_names) > 1
    )
    return RewriteResult(out, tuple(rewrites), (), warnings)


def _count(body: Mapping[str, Any]) -> int:
    count = body.get("count", 1)
    return count if isinstance(count, int) else 1


def _multi(body: Mapping[str, Any]) -> bool:
    return body.get("allocationMode") == "All" or _count(body) >= 2


def _split(
    name: str, body: Obj, path: str, cfg: DecodedConfig, *, same_island: bool, existing: set[str]
) -> tuple[list[tuple[str, Obj]], Rewrite] | Finding:
    total_text = str(cfg.config.sharing.total_memory)
    total_path = f"{cfg.path}.sharing.totalMemory"
    if body.get("allocationMode") == "All":
        return error(
            f"{path}.allocationMode",
            f'request "{name}" uses allocationMode All, but sharing.totalMemory ({total_path}) spreads memory '
            "over a known number of cards: use allocationMode ExactCount with count: <number of cards>",
        )
    requested = ((body.get("capacity") or {}).get("requests") or {}) if isinstance(body.get("capacity"), dict) else {}
    if requested:
        return error(
            f"{path}.capacity.requests",
            f'request "{name}" names capacity.requests and its config sets sharing.totalMemory ({total_path}); '
            "use one: totalMemory for a total across count cards, capacity.requests.memory for one share per card",
        )
    total = _bytes(total_text)
    if total is None:
        return error(total_path, f"{total_text} is not a whole number of bytes; write it like 16Gi")
    cards = _count(body)
    if total % (cards * GiB) != 0:
        unit = cards * GiB
        low, high = (total // unit) * unit, (total // unit + 1) * unit
        nearest = f"{fmt_bytes(low)} or {fmt_bytes(high)}" if low else f"{fmt_bytes(high)} (the smallest)"
        return error(
            total_path,
            f"{total_text} across {cards} cards is not a whole number of GiB per card; nearest valid "
            f"totals: {nearest}",
        )
    per_card = fmt_bytes(total // cards)
    share = {k: v for k, v in body.items() if k not in ("count", "capacity")}
    share["count"] = 1
    share["capacity"] = {"requests": {"memory": per_card}}
    if cards == 1:
        return [(name, share)], Rewrite(name, 1, per_card, False, (name,), total_text)
    names = tuple(f"{name}-{k}" for k in range(cards))
    clash = [n for n in names if n in existing]
    if clash:
        return error(
            f"{path}",
            f'request "{name}" would be split into {", ".join(names)}, but this claim already has a request '
            f'named "{clash[0]}"; rename that request',
        )
    if len(names[-1]) > MAX_NAME:
        return error(
            f"{path}",
            f'request name "{name}" is too long to split into "{names[-1]}" (at most {MAX_NAME} characters); '
            "shorten it",
        )
    return [(n, copy.deepcopy(share)) for n in names], Rewrite(name, cards, per_card, same_island, names, total_text)


def _renamed_refs(entry: Any, renames: Mapping[str, tuple[str, ...]]) -> Any:
    if not isinstance(entry, dict) or not isinstance(entry.get("requests"), list) or not renames:
        return entry
    refs: list[str] = []
    for ref in entry["requests"]:
        refs.extend(renames.get(str(ref), (ref,)))
    return {**entry, "requests": refs}


def _stripped(entry: Any) -> Any:
    """The config entry without totalMemory/sameNVLinkIsland (now carried by requests and constraints)."""
    if not isinstance(entry, dict):
        return entry
    opaque = entry.get("opaque")
    if not isinstance(opaque, dict) or opaque.get("driver") != DRIVER:
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
                _request_path(spec, path, r.request),
                f"needs tessera's mutating webhook (/mutate-resourceclaim) to rewrite it ({r.describe()}), and that "
                "did not happen, so the scheduler would ignore sharing.totalMemory/sameNVLinkIsland; install the "
                "MutatingWebhookConfiguration of the tessera chart, or write the per-card requests yourself",
            )
        )
    return findings


def _request_path(spec: Obj, path: str, ref: str) -> str:
    name, _, sub = ref.partition("/")
    for i, request in enumerate((spec.get("devices") or {}).get("requests") or []):
        if isinstance(request, dict) and request.get("name") == name:
            if not sub:
                return f"{path}.devices.requests[{i}]"
            for j, s in enumerate(request.get("firstAvailable") or []):
                if isinstance(s, dict) and s.get("name") == sub:
                    return f"{path}.devices.requests[{i}].firstAvailable[{j}]"
    return f"{path}.devices.requests"
