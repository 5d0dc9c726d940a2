"""AdmissionReview v1 in, AdmissionReview v1 out: which checks run for which endpoint and operation,
and how findings become `allowed`, `status.message`, `warnings` and a JSONPatch.

- /validate-deviceclass: DeviceClass CREATE, and UPDATE when the spec changed (like the apiserver, an
  unchanged class is not re-judged, so metadata edits of an old class never fail). Selectors compile in
  the new-expressions CEL environment, or in the stored one when an update leaves them as they were.
- /validate-resourceclaim: ResourceClaim and ResourceClaimTemplate CREATE (their spec is immutable, so
  UPDATEs, e.g. status writes and finalizer removal, are always allowed).
- /mutate-resourceclaim: the multi-card rewrite on CREATE; it denies only what it cannot rewrite.

A review may carry a deadline (the server sets one below the apiserver's webhook timeout). Once it
passes, no further selector is evaluated and the review is answered at once, "cut short": denied
when the chart's failurePolicy is Fail (on_deadline="deny": the apiserver would have denied on the
timeout anyway, and no unchecked object gets in), admitted with a warning when it is Ignore
(on_deadline="allow": the apiserver would have admitted it unchecked).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from controller.checks.claims import check_claim_spec
from controller.checks.claimspec import CLAIM_KINDS, claim_spec
from controller.checks.classes import check_device_class
from controller.checks.findings import Finding
from controller.checks.inputs import CheckContext
from controller.checks.multicard import ANNOTATION, rewrite_claim_spec
from controller.cluster.matching import ReviewDeadlineExceeded
from controller.cluster.objects import display_name
from driver.errors import InvalidInputError

log = structlog.get_logger(__name__)

VALIDATE_CLASS = "/validate-deviceclass"
VALIDATE_CLAIM = "/validate-resourceclaim"
MUTATE_CLAIM = "/mutate-resourceclaim"
ENDPOINTS = (VALIDATE_CLASS, VALIDATE_CLAIM, MUTATE_CLAIM)
RESOURCE_GROUP = "resource.k8s.io"

Obj = dict[str, Any]
OnDeadline = Literal["deny", "allow"]
ON_DEADLINE: tuple[OnDeadline, ...] = ("deny", "allow")


class ReviewError(InvalidInputError):
    """The request body is not an AdmissionReview v1 request (answered with HTTP 400)."""


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str = ""
    warnings: tuple[str, ...] = ()
    patch: tuple[Obj, ...] = ()
    kind: str = ""
    cut_short: bool = False

    @property
    def outcome(self) -> str:
        """Label for metrics: cut-short, denied, mutated, warned or allowed."""
        if self.cut_short:
            return "cut-short"
        if not self.allowed:
            return "denied"
        if self.patch:
            return "mutated"
        return "warned" if self.warnings else "allowed"


class AdmissionHandler:
    """Turns one AdmissionReview into a response. `context` is called once per review so every review
    sees the newest inventory snapshot."""

    def __init__(self, context: Callable[[], CheckContext], *, on_deadline: OnDeadline = "deny") -> None:
        if on_deadline not in ON_DEADLINE:
            raise ValueError(f"on_deadline must be one of {', '.join(ON_DEADLINE)}, not {on_deadline!r}")
        self._context = context
        self.on_deadline = on_deadline

    def review(self, endpoint: str, body: Any, *, deadline: float | None = None) -> tuple[Obj, Verdict]:
        """The answer to one AdmissionReview; `deadline` (time.monotonic()) cuts its evaluations short."""
        request = _parse(body)
        started = time.perf_counter()
        try:
            verdict = self._decide(endpoint, request, deadline)
        except ReviewDeadlineExceeded as exc:
            verdict = self.cut_short(request, f"its deadline passed after {exc.evaluations} selector evaluations")
        log.info(
            "admission",
            endpoint=endpoint,
            kind=verdict.kind,
            operation=request.get("operation"),
            namespace=request.get("namespace", ""),
            name=request.get("name") or ((request.get("object") or {}).get("metadata") or {}).get("name", ""),
            outcome=verdict.outcome,
            warnings=len(verdict.warnings),
            seconds=round(time.perf_counter() - started, 4),
        )
        return _response(str(request["uid"]), verdict), verdict

    def unreviewed(self, body: Any, reason: str) -> tuple[Obj, Verdict]:
        """The answer for a review the server could not start in time (`reason` says why)."""
        request = _parse(body)
        verdict = self.cut_short(request, reason)
        log.warning("admission cut short", reason=reason, kind=verdict.kind, outcome=verdict.outcome)
        return _response(str(request["uid"]), verdict), verdict

    def cut_short(self, request: Obj, reason: str) -> Verdict:
        kind_info = request.get("kind") or {}
        kind = str(kind_info.get("kind", "")) if isinstance(kind_info, dict) else ""
        obj = request.get("object")
        name = display_name(obj) if isinstance(obj, dict) else ""
        what = f'{kind} "{name}"'
        if self.on_deadline == "allow":
            note = (f"tessera did not finish checking {what} ({reason}); admitted unchecked, as the webhook's "
                    "failurePolicy Ignore asks")
            return Verdict(True, warnings=(note,), kind=kind, cut_short=True)
        message = (f"tessera could not finish checking {what} ({reason}) and denies it, as the webhook's "
                   "failurePolicy Fail asks: retry, or simplify its selectors if this repeats")
        return Verdict(False, message, kind=kind, cut_short=True)

    def _decide(self, endpoint: str, request: Obj, deadline: float | None = None) -> Verdict:
        if endpoint not in ENDPOINTS:
            raise ReviewError(f"unknown endpoint {endpoint}; tessera serves {', '.join(ENDPOINTS)}")
        kind_info = request.get("kind") or {}
        kind = str(kind_info.get("kind", ""))
        operation = request.get("operation")
        obj = request.get("object")
        if operation not in ("CREATE", "UPDATE") or not isinstance(obj, dict):
            return Verdict(True, kind=kind)
        if kind_info.get("group") != RESOURCE_GROUP:
            note = f"tessera does not check {kind} objects of group {kind_info.get('group')}"
            return Verdict(True, warnings=(note,), kind=kind)
        if kind_info.get("version") != "v1":
            note = f"tessera checks resource.k8s.io/v1 only; this {kind} ({kind_info.get('version')}) was not checked"
            return Verdict(True, warnings=(note,), kind=kind)
        if endpoint == VALIDATE_CLASS:
            if kind != "DeviceClass":
                return Verdict(True, warnings=(f"{VALIDATE_CLASS} expects DeviceClass objects, got {kind}",), kind=kind)
            old = request.get("oldObject")
            if operation == "UPDATE" and isinstance(old, dict) and old.get("spec") == obj.get("spec"):
                return Verdict(True, kind=kind)
            ctx = self._checks(deadline)
            if operation == "UPDATE" and isinstance(old, dict) and _selectors(old) == _selectors(obj):
                # the apiserver compiles selectors an update leaves as they were as stored expressions
                ctx.cel_environment = ctx.cel_environment.stored_expressions()
            return _judged(check_device_class(obj, ctx).findings, kind, display_name(obj))
        if kind not in CLAIM_KINDS:
            note = f"{endpoint} expects ResourceClaim or ResourceClaimTemplate, got {kind}"
            return Verdict(True, warnings=(note,), kind=kind)
        if operation != "CREATE":
            return Verdict(True, kind=kind)
        spec, path = claim_spec(obj, kind)
        ctx = self._checks(deadline)
        if endpoint == MUTATE_CLAIM:
            return _mutation(obj, spec, path, kind, ctx)
        target = _explain_target(obj, kind, str(request.get("namespace") or ""))
        return _judged(check_claim_spec(spec, path, ctx, explain=target).findings, kind, display_name(obj))

    def _checks(self, deadline: float | None) -> CheckContext:
        ctx = self._context()
        ctx.evaluator.deadline = deadline
        return ctx


def _mutation(obj: Obj, spec: Any, path: str, kind: str, ctx: CheckContext) -> Verdict:
    result = rewrite_claim_spec(spec, path, ctx.targets_tessera)
    if result.findings:
        return _judged(result.findings, kind, display_name(obj))
    if not result.changed:
        return Verdict(True, kind=kind)
    pointer = "/spec/devices" if path == "spec" else "/spec/spec/devices"
    patch: list[Obj] = [{"op": "replace", "path": pointer, "value": result.spec["devices"]}]
    annotations = (obj.get("metadata") or {}).get("annotations")
    if isinstance(annotations, dict):
        key = ANNOTATION.replace("~", "~0").replace("/", "~1")
        patch.append({"op": "add", "path": f"/metadata/annotations/{key}", "value": result.annotation()})
    else:
        patch.append({"op": "add", "path": "/metadata/annotations", "value": {ANNOTATION: result.annotation()}})
    return Verdict(True, patch=tuple(patch), kind=kind)


def _selectors(obj: Obj) -> Any:
    """spec.selectors, with a missing list equal to an empty one (as Semantic.DeepEqual has it)."""
    spec = obj.get("spec")
    return (spec.get("selectors") if isinstance(spec, dict) else None) or []


def _explain_target(obj: Obj, kind: str, namespace: str) -> str:
    """What to pass to `tessera explain` for this object: the claim itself, or a pod using the template."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace") or namespace
    flag = f" -n {ns}" if ns else ""
    if kind == "ResourceClaim" and meta.get("name"):
        return f"resourceclaim/{meta['name']}{flag}"
    return f"pod/<a pod using it>{flag}"


def _judged(findings: tuple[Finding, ...] | list[Finding], kind: str, name: str) -> Verdict:
    errors = [f for f in findings if f.severity == "error"]
    warnings = tuple(f"{f.path}: {f.message}" for f in findings if f.severity == "warning")
    if not errors:
        return Verdict(True, warnings=warnings, kind=kind)
    lines = "\n".join(f"{f.path}: {f.message}" for f in errors)
    plural = "s" if len(errors) > 1 else ""
    message = f'tessera rejected {kind} "{name}" ({len(errors)} error{plural}):\n{lines}'
    return Verdict(False, message, warnings, kind=kind)


def _parse(body: Any) -> Obj:
    if not isinstance(body, dict):
        raise ReviewError("body must be a JSON object (an AdmissionReview)")
    if body.get("apiVersion") != "admission.k8s.io/v1" or body.get("kind") != "AdmissionReview":
        raise ReviewError(
            f"expected apiVersion admission.k8s.io/v1 and kind AdmissionReview, got "
            f"{body.get('apiVersion')!r} {body.get('kind')!r}"
        )
    request = body.get("request")
    if not isinstance(request, dict) or not request.get("uid"):
        raise ReviewError("AdmissionReview.request with a uid is required")
    # the apiserver never sends these shapes; anything else would fail deep inside as a 500
    kind = request.get("kind")
    if kind is not None and not isinstance(kind, dict):
        raise ReviewError(f"AdmissionReview.request.kind must be an object (group, version, kind), got {kind!r:.80}")
    for key in ("object", "oldObject"):
        value = request.get(key)
        if value is not None and not isinstance(value, dict):
            raise ReviewError(f"AdmissionReview.request.{key} must be an object, got {type(value).__name__}")
        meta = value.get("metadata") if isinstance(value, dict) else None
        if meta is not None and not isinstance(meta, dict):
            raise ReviewError(f"AdmissionReview.request.{key}.metadata must be an object, got {type(meta).__name__}")
    return request


def _response(uid: str, verdict: Verdict) -> Obj:
    response: Obj = {"uid": uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {"code": 422, "reason": "Invalid", "message": verdict.message}
    if verdict.warnings:
        response["warnings"] = list(verdict.warnings)
    if verdict.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(list(verdict.patch)).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
