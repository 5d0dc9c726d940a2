"""The engine of `tessera check`: the webhook's checks run over objects read from files.

Claims go through the multi-card rewrite first, as they would at admission (mutating webhooks run
before validating ones), and the rewritten spec is what gets checked. DeviceClasses found among the
objects are known to the claims checked with them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.checks.claims import check_claim_spec
from controller.checks.claimspec import CLAIM_KINDS, claim_spec
from controller.checks.classes import check_device_class
from controller.checks.findings import Finding, error
from controller.checks.inputs import CheckContext
from controller.checks.multicard import rewrite_claim_spec
from controller.cluster.matching import MatchResult
from controller.cluster.objects import by_name, display_name

Obj = dict[str, Any]
CHECKED_KINDS = ("DeviceClass", *CLAIM_KINDS)


@dataclass(frozen=True)
class ObjectResult:
    source: str  # "file.yaml (document 2)"
    kind: str
    name: str
    findings: tuple[Finding, ...] = ()
    rewrites: tuple[str, ...] = ()
    matches: tuple[tuple[str, MatchResult | None], ...] = ()  # (what, result); None: no inventory
    skipped: str = ""  # why the object was not checked
    targets_tessera: bool = True


@dataclass(frozen=True)
class SourcedObject:
    source: str
    obj: Obj = field(repr=False)


def flatten(documents: Iterable[tuple[str, Any]]) -> list[SourcedObject]:
    """Documents (YAML/JSON) -> objects; `kind: List` (or any `...List`) contributes its items."""
    out: list[SourcedObject] = []
    for source, doc in documents:
        if doc is None:
            continue
        is_list = isinstance(doc, Mapping) and str(doc.get("kind", "")).endswith("List")
        if is_list and isinstance(doc.get("items"), list):
            out.extend(
                SourcedObject(f"{source} item {i}", dict(item))
                for i, item in enumerate(doc["items"])
                if isinstance(item, Mapping)
            )
        elif isinstance(doc, Mapping):
            out.append(SourcedObject(source, dict(doc)))
        else:
            out.append(SourcedObject(source, {"kind": "", "_not_an_object": doc}))
    return out


def check_objects(objects: list[SourcedObject], ctx: CheckContext) -> list[ObjectResult]:
    """Check every object; `ctx.classes` is extended with the DeviceClasses among `objects`."""
    given = by_name(o.obj for o in objects if o.obj.get("kind") == "DeviceClass" and _is_v1(o.obj))
    ctx.classes = {**ctx.classes, **given}
    return [_check_one(item, ctx) for item in objects]


def _is_v1(obj: Obj) -> bool:
    return obj.get("apiVersion") == "resource.k8s.io/v1"


def _check_one(item: SourcedObject, ctx: CheckContext) -> ObjectResult:
    obj = item.obj
    kind = str(obj.get("kind", ""))
    name = display_name(obj)
    if "_not_an_object" in obj:
        return ObjectResult(item.source, "", "", (error("", "this document is not a Kubernetes object (a mapping)"),))
    if kind not in CHECKED_KINDS:
        return ObjectResult(item.source, kind, name, skipped=f"{kind or 'an object without kind'} is not checked")
    if not _is_v1(obj):
        return ObjectResult(
            item.source, kind, name,
            (error("apiVersion", f"tessera checks resource.k8s.io/v1 objects; got {obj.get('apiVersion')!r}"),),
        )
    if kind == "DeviceClass":
        report = check_device_class(obj, ctx)
        return ObjectResult(
            item.source, kind, name, report.findings, matches=(("class", report.match),),
            targets_tessera=report.targets_tessera,
        )
    spec, path = claim_spec(obj, kind)
    if not isinstance(spec, dict):
        return ObjectResult(item.source, kind, name, (error(path, "must be an object (a ResourceClaimSpec)"),))
    rewrite = rewrite_claim_spec(spec, path, ctx.targets_tessera)
    if rewrite.findings:
        return ObjectResult(item.source, kind, name, rewrite.findings)
    claim = check_claim_spec(rewrite.spec, path, ctx)
    return ObjectResult(
        item.source,
        kind,
        name,
        claim.findings,
        tuple(r.describe() for r in rewrite.rewrites),
        tuple((f"request {r.name}", r.match) for r in claim.requests),
        targets_tessera=bool(claim.requests) or bool(claim.findings),
    )
