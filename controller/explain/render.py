"""An Explanation as text for a terminal, or as a JSON-ready dict for tools."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from controller.cluster.capacityfit import quantity
from controller.explain.explain import ClaimReport, Explanation, RequestReport
from controller.explain.funnel import Drop, Funnel, Step
from controller.explain.reasons import Verdict
from controller.explain.search import Pick
from driver.quantity import format_bytes

MAX_NODES_SHOWN = 4


def _per_node(step: Step) -> str:
    nodes = step.per_node
    shown = ", ".join(f"{n}: {c}" for n, c in list(nodes.items())[:MAX_NODES_SHOWN])
    more = f", +{len(nodes) - MAX_NODES_SHOWN} nodes" if len(nodes) > MAX_NODES_SHOWN else ""
    return f"({shown}{more})" if nodes else ""


def _verdict_lines(v: Verdict, indent: str) -> list[str]:
    if v.ok:
        return [f"{indent}=> {v.reason}"] if v.reason else []
    return [f"{indent}=> cannot be allocated, at step {v.step}: {v.reason}", f"{indent}   fix: {v.fix}"]


def _funnel_lines(f: Funnel, indent: str) -> list[str]:
    lines = []
    width = max(len(s.title) for s in f.steps)
    for step in f.steps:
        note = f"  {step.note}" if step.note else ""
        lines.append(f"{indent}{step.title.ljust(width)}  {step.count:>4}  {_per_node(step)}{note}".rstrip())
        if step.count == 0:
            break
    return lines


def _request_lines(r: RequestReport, indent: str, final: Verdict) -> list[str]:
    lines = [f'{indent}request "{r.spec.ref}": {r.spec.describe()}']
    if r.funnel is not None:
        lines += _funnel_lines(r.funnel, indent + "  ")
    if r.verdict == final:
        lines.append(f"{indent}  => no device left at step {r.verdict.step} (see Why below)")
    elif not r.verdict.ok or r.funnel is None:
        lines += _verdict_lines(r.verdict, indent + "  ")
    return lines


def _pick_text(p: Pick) -> str:
    memory = p.consumed.get("memory")
    device_memory = quantity((p.device.capacity("memory") or {}).get("value"))
    share = f" ({format_bytes(memory)} share)" if memory is not None and memory != device_memory else ""
    return f"{p.request} -> {p.device.name}{share}"


def _claim_lines(c: ClaimReport, final: Verdict) -> list[str]:
    head = f"claim {c.ref}" + (f" ({c.origin})" if c.origin else "")
    lines = [head]
    if c.allocated:
        for result in c.allocation:
            consumed = (result.get("consumedCapacity") or {}).get("memory")
            share = f" (memory {consumed})" if consumed else ""
            lines.append(f"  {result.get('request')} -> {result.get('pool')}/{result.get('device')}{share}")
        pods = ", ".join(c.reserved_for) or "no pod yet"
        lines.append(f"  => allocated, reserved for {pods}")
        return lines
    for r in c.requests:
        lines += _request_lines(r, "  ", final)
    for constraint in c.constraints:
        lines.append(f"  constraint: {constraint.describe()}")
    if c.tried:
        what = "all requests and constraints" if c.constraints else "all requests"
        lines.append(f"  {what} together on one node: {len(c.found)} of {len(c.tried)} nodes")
    if c.picks:
        lines.append(f"  on {c.picks[0].device.node} the scheduler would pick: "
                     + "; ".join(_pick_text(p) for p in c.picks))
    failed_in_request = any(not r.verdict.ok and r.verdict == c.verdict for r in c.requests)
    if c.verdict == final and not c.verdict.ok:
        if not failed_in_request:
            lines.append(f"  => cannot be allocated, at step {c.verdict.step} (see Why below)")
    elif not failed_in_request:
        lines += _verdict_lines(c.verdict, "  ")
    return lines


def render_text(e: Explanation) -> str:
    subject = f"{e.kind} {e.ref}"
    if e.phase:
        subject += f": {e.phase}"
    lines = [subject]
    if e.scheduler_message:
        lines.append(f"  scheduler: {e.scheduler_message}")
    if e.scope.why:
        lines.append(f"  nodes: {e.scope.why} -> {', '.join(sorted(e.scope.names or [])) or 'none'}"
                     if e.scope.names is not None else f"  nodes: {e.scope.why}")
    if e.problem:
        lines.append(f"  {e.problem}")
        return "\n".join(lines) + "\n"
    if e.prepare is not None:
        seen = f" ({e.prepare.count} times, last at {e.prepare.last_seen})" if e.prepare.last_seen else ""
        lines.append(f"  kubelet on {e.prepare.node or 'its node'}{seen}: {e.prepare.message}")
    for claim in e.claims:
        lines += ["", *_claim_lines(claim, e.verdict)]
    lines.append("")
    v = e.verdict
    if v.ok:
        lines.append(v.reason)
        if e.kind == "pod" and e.phase == "Pending" and e.scheduler_message:
            lines.append(f"The pod is Pending for another reason; the scheduler says: {e.scheduler_message}")
    else:
        lines.append(f"Why: {v.reason}")
        lines.append(f"Fix: {v.fix}")
    if e.note:
        lines.append(f"Note: {e.note}")
    return "\n".join(lines) + "\n"


def _verdict_json(v: Verdict) -> dict[str, Any]:
    return {"ok": v.ok, "step": v.step or None, "reason": v.reason, "fix": v.fix or None,
            "devices": list(v.devices), "claims": list(v.claims), "pods": list(v.pods), "nodes": list(v.nodes)}


def _step_json(s: Step) -> dict[str, Any]:
    out: dict[str, Any] = {"step": s.name, "title": s.title, "count": s.count, "perNode": s.per_node}
    if s.note:
        out["note"] = s.note
    if s.dropped:
        out["dropped"] = [_drop_json(d) for d in s.dropped[:20]]
        out["droppedCount"] = len(s.dropped)
    return out


def _drop_json(d: Drop) -> dict[str, Any]:
    out: dict[str, Any] = {"device": d.device.ref, "why": d.why,
                           "heldBy": [{"claim": h.claim, "pods": list(h.pods)} for h in d.holders]}
    if d.taint is not None:
        out["taint"] = dict(d.taint)
    if d.counters:
        out["counters"] = [{"counterSet": c.counter_set, "counter": c.counter, "needed": format_bytes(c.needed),
                            "available": format_bytes(max(c.available, Fraction(0))),
                            "heldBy": [{"device": dev.ref, "claim": h.claim, "pods": list(h.pods)}
                                       for dev, h in c.held_by]} for c in d.counters]
    return out


def _request_json(r: RequestReport) -> dict[str, Any]:
    out: dict[str, Any] = {"name": r.spec.ref, "deviceClassName": r.spec.class_name, "mode": r.spec.mode,
                           "count": r.spec.count, "capacity": {n.key: n.text for n in r.spec.needs},
                           "tessera": r.spec.ours, "verdict": _verdict_json(r.verdict)}
    if r.funnel is not None:
        out["steps"] = [_step_json(s) for s in r.funnel.steps]
    return out


def _claim_json(c: ClaimReport) -> dict[str, Any]:
    out: dict[str, Any] = {"claim": c.ref, "origin": c.origin, "allocated": c.allocated,
                           "verdict": _verdict_json(c.verdict)}
    if c.allocated:
        out["allocation"] = [dict(r) for r in c.allocation]
        out["reservedFor"] = list(c.reserved_for)
    else:
        out["requests"] = [_request_json(r) for r in c.requests]
        out["constraints"] = [{"kind": k.kind, "attribute": k.attribute, "requests": list(k.requests)}
                              for k in c.constraints]
        out["picks"] = [_pick_json(p) for p in c.picks]
        out["search"] = {"nodesTried": list(c.tried), "nodesFound": list(c.found)}
    return out


def _pick_json(p: Pick) -> dict[str, Any]:
    return {"request": p.request, "node": p.device.node, "device": p.device.name,
            "consumedCapacity": {k: format_bytes(v) for k, v in p.consumed.items()}}


def render_json(e: Explanation) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": e.kind, "name": e.ref, "phase": e.phase or None,
                           "schedulerMessage": e.scheduler_message or None,
                           "nodeScope": {"why": e.scope.why,
                                         "nodes": sorted(e.scope.names) if e.scope.names is not None else None},
                           "claims": [_claim_json(c) for c in e.claims], "verdict": _verdict_json(e.verdict),
                           "search": {"budgetSeconds": e.search.budget_s, "runs": e.search.runs,
                                      "reused": e.search.reused, "steps": e.search.steps,
                                      "cutShort": e.search.cut_short, "note": e.note or None}}
    if e.problem:
        out["problem"] = e.problem
    if e.prepare is not None:
        out["prepare"] = {"node": e.prepare.node, "message": e.prepare.message, "count": e.prepare.count,
                          "lastSeen": e.prepare.last_seen or None, "claim": e.prepare.claim or None,
                          "agentError": e.prepare.agent_error or None}
    return out
