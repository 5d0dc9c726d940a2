"""After allocation: kubelet on the pod's node asks tessera's node agent to prepare the claims, and when that
fails it records a `FailedPrepareDynamicResources` event on the pod and retries (kubelet-and-cdi.md 4.1).
A pod in that state is bound and its claims are allocated, so the scheduler has nothing to say; this module
reads kubelet's event and says what the failure is and what to do about it.

kubelet's message is `Failed to prepare dynamic resources: ...`, and what follows says who failed:
- `NodePrepareResources failed for ResourceClaim NAME: TEXT` (1.36; `for claim NS/NAME` before): the node
  agent answered, TEXT is its own message;
- `... not found in the list of registered DRA plugins` (or `... not registered`): no node agent for
  gpu.tessera.dev is registered with kubelet on that node;
- a gRPC error (`rpc error: code = Unavailable`, `DeadlineExceeded`): the node agent did not answer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller.explain.reasons import Verdict
from driver import DRIVER_NAME

Obj = dict[str, Any]
PREPARE_FAILED = "FailedPrepareDynamicResources"
PLUGIN_PODS = "kubectl get pods -A -o wide --field-selector spec.nodeName={node} | grep tessera"
_CLAIM_ERROR = re.compile(r"NodePrepareResources failed for (?:ResourceClaim|claim) ([^\s:]+): (.*)", re.DOTALL)
_NOT_REGISTERED = re.compile(r"not found in the list of registered DRA plugins|is not registered|not connected")
_NO_ANSWER = re.compile(r"code = (Unavailable|DeadlineExceeded)|connection refused|context deadline exceeded")


@dataclass(frozen=True)
class PrepareFailure:
    """kubelet's latest word on why it cannot prepare the pod's claims."""

    node: str
    message: str  # as the event has it
    count: int = 1  # how many times kubelet has said so
    last_seen: str = ""
    claim: str = ""  # the claim kubelet names, namespace/name ("" when the failure is not one claim's)
    agent_error: str = ""  # the node agent's own message inside kubelet's ("" when it was not reached)


def _series(event: Mapping[str, Any]) -> Mapping[str, Any]:
    series = event.get("series")
    return series if isinstance(series, Mapping) else {}


def _when(event: Mapping[str, Any]) -> str:
    series = _series(event)
    return str(series.get("lastObservedTime") or event.get("lastTimestamp") or event.get("eventTime")
               or (event.get("metadata") or {}).get("creationTimestamp") or "")


def _started(pod: Mapping[str, Any]) -> bool:
    """Whether kubelet got past preparing: the pod is no longer Pending, or its sandbox exists."""
    status = pod.get("status") or {}
    if status.get("phase") not in (None, "", "Pending"):
        return True
    return any(c.get("type") == "PodReadyToStartContainers" and c.get("status") == "True"
               for c in status.get("conditions") or () if isinstance(c, Mapping))


def prepare_failure(pod: Mapping[str, Any], events: Iterable[Mapping[str, Any]]) -> PrepareFailure | None:
    """kubelet's latest FailedPrepareDynamicResources event about `pod`, while the pod still waits for it."""
    if _started(pod):
        return None
    meta = pod.get("metadata") or {}
    uid = meta.get("uid")
    mine = [e for e in events if isinstance(e, Mapping) and e.get("reason") == PREPARE_FAILED
            and (e.get("involvedObject") or {}).get("name") == meta.get("name")
            and (not uid or not (e.get("involvedObject") or {}).get("uid") or e["involvedObject"]["uid"] == uid)]
    if not mine:
        return None
    latest = max(mine, key=_when)
    message = str(latest.get("message") or latest.get("note") or "")
    node = str((pod.get("spec") or {}).get("nodeName") or (latest.get("source") or {}).get("host")
               or latest.get("reportingInstance") or "")
    count = int(_series(latest).get("count") or latest.get("count") or 1)
    found = _CLAIM_ERROR.search(message)
    claim = found.group(1) if found else ""
    if claim and "/" not in claim:  # kubelet 1.36 names the claim alone; it is in the pod's namespace
        claim = f"{meta.get('namespace') or ''}/{claim}".lstrip("/")
    return PrepareFailure(node, message, count, _when(latest), claim, found.group(2).strip() if found else "")


def prepare_verdict(failure: PrepareFailure, pod: str) -> Verdict:
    """Why the pod's containers do not start, and tessera's fix."""
    node = failure.node or "its node"
    times = f" ({failure.count} times so far; kubelet keeps retrying)" if failure.count > 1 else \
        " (kubelet keeps retrying)"
    pods = PLUGIN_PODS.format(node=failure.node or "<node>")
    if failure.agent_error:
        reason = (f"every claim is allocated, but kubelet on {node} cannot prepare claim {failure.claim}: tessera's "
                  f"node agent answers \"{failure.agent_error}\"{times}")
        return Verdict(False, "prepare", reason, _agent_fix(failure, pod, pods), nodes=(node,),
                       claims=(failure.claim,), pods=(pod,))
    if _NOT_REGISTERED.search(failure.message):
        return Verdict(False, "prepare", f"every claim is allocated, but no node agent of {DRIVER_NAME} is registered "
                       f"with kubelet on {node}{times}",
                       f"start tessera's kubelet plugin on {node} ({pods}; the DaemonSet's nodeSelector and "
                       "tolerations must admit the node) and check that kubelet registers it (docs/operations.md, "
                       "ResourceSlices are missing)", nodes=(node,), pods=(pod,))
    if _NO_ANSWER.search(failure.message):
        return Verdict(False, "prepare", f"every claim is allocated, but tessera's node agent on {node} does not "
                       f"answer kubelet{times}", f"check that the node agent on {node} runs and is ready ({pods}) "
                       "and read its log", nodes=(node,), pods=(pod,))
    return Verdict(False, "prepare", f"every claim is allocated, but kubelet on {node} cannot prepare them: "
                   f"\"{failure.message}\"{times}", f"read the log of tessera's node agent on {node} ({pods})",
                   nodes=(node,), pods=(pod,))


def _agent_fix(failure: PrepareFailure, pod: str, pods: str) -> str:
    """tessera's fix for its own prepare error (the error's text says what failed; this says what to do)."""
    text = failure.agent_error
    if "out of date" in text or "is not on node" in text:
        return (f"the claim holds devices {failure.node} no longer publishes: delete pod {pod} (and claim "
                f"{failure.claim} if no template made it) so the scheduler allocates again from the node's current "
                f"ResourceSlices (kubectl get resourceslices --field-selector spec.nodeName={failure.node})")
    if "was replaced" in text:
        return "nothing: the claim was deleted and created again, and kubelet's next retry uses the new one"
    if "opaque.parameters" in text or "GpuConfig" in text or "sharing" in text or "strategy" in text:
        return (f"change the claim's GpuConfig (or its DeviceClass's) as the message says; a claim cannot be edited, "
                f"so delete pod {pod} and claim {failure.claim} (or fix their template) and create them again. "
                "`tessera check` finds config errors before a pod is created")
    return (f"the node agent could not set up the GPU: its log on {failure.node} has the details ({pods}; search "
            f"for claim {failure.claim}), and docs/operations.md lists the usual causes")
