"""What `tessera explain` and `tessera status` read from the apiserver, once, through tessera's one client
(driver.kubeapi.RealKubeAPI: the kubeconfig kubectl would use, the namespace of its current context).

Everything is read as plain JSON. Nodes, other namespaces' pods, templates, events and DeviceTaintRules
are optional: a user without the right to list them still gets an answer, with what could not be read
left out; the rest must be readable, or the command stops with a ReadError naming the read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from driver import DRIVER_NAME
from driver.errors import TesseraError
from driver.kubeapi import ApiError, KubeConfigError, RealKubeAPI

Obj = dict[str, Any]
PREPARE_FAILED = "FailedPrepareDynamicResources"  # the reason of kubelet's event when a prepare fails


class ReadError(TesseraError):
    """The cluster cannot be reached or refuses a read tessera needs; the message says which."""


def connect(kubeconfig: str | None = None, *, timeout: float = 30.0) -> RealKubeAPI:
    """The client for `kubeconfig` (kubectl's rules), or ReadError saying where the configuration was sought."""
    try:
        return RealKubeAPI(kubeconfig, request_timeout=timeout)
    except KubeConfigError as exc:
        raise ReadError(str(exc)) from exc


def read_together(reads: Mapping[str, Callable[[], Any]]) -> dict[str, Any]:
    """Every read at once, each in its own thread; their results by name. While the apiserver encodes and sends
    one list (92 MB of slices at 1,000 DGX nodes, about a second), the others are fetched and decoded. When
    reads fail, the first failing one in `reads`' order is raised, once all have ended."""
    with ThreadPoolExecutor(max_workers=max(1, len(reads)), thread_name_prefix="read") as pool:
        futures = {name: pool.submit(read) for name, read in reads.items()}
    return {name: future.result() for name, future in futures.items()}


def _items(what: str, call: Callable[[], Obj | None], *, optional: bool = False) -> list[Obj] | None:
    """The list's items; None when an optional read is refused (401, 403) or not served (404)."""
    try:
        listing = call()
    except ApiError as exc:
        if optional and exc.status in (401, 403, 404):
            return None
        reason = f"{exc.status} {exc.http_reason}" if exc.status else exc.message or exc.http_reason
        raise ReadError(f"cannot read {what}: {reason}") from exc
    if listing is None:
        return None
    return [i for i in listing.get("items") or () if isinstance(i, dict)]


def resource_slices(api: RealKubeAPI) -> list[Obj]:
    return _items("resourceslices", lambda: api.list_resource_slices(field_selector=f"spec.driver={DRIVER_NAME}")) \
        or []


def device_classes(api: RealKubeAPI) -> list[Obj]:
    return _items("deviceclasses", api.list_device_classes) or []


def resource_claims(api: RealKubeAPI) -> list[Obj]:
    """Every namespace's claims: allocations anywhere hold devices."""
    return _items("resourceclaims in all namespaces", api.list_resource_claims) or []


def templates(api: RealKubeAPI, namespace: str) -> list[Obj]:
    return _items("resourceclaimtemplates", lambda: api.list_resource_claim_templates(namespace), optional=True) \
        or []


def pods(api: RealKubeAPI, namespace: str | None = None) -> list[Obj] | None:
    """Pods of one namespace, or of all (None when not allowed)."""
    what = f"pods in {namespace}" if namespace else "pods in all namespaces"
    return _items(what, lambda: api.list_pods(namespace), optional=True)


def nodes(api: RealKubeAPI) -> list[Obj] | None:
    return _items("nodes", api.list_nodes, optional=True)


def prepare_events(api: RealKubeAPI, namespace: str, pod: str) -> list[Obj]:
    """kubelet's events about pod `pod` failing to prepare its claims (none when events cannot be read)."""
    selector = f"involvedObject.kind=Pod,involvedObject.name={pod},reason={PREPARE_FAILED}"
    return _items(f"events of pod {pod}", lambda: api.list_events(namespace, selector), optional=True) or []


def taint_rules(api: RealKubeAPI) -> list[Obj] | None:
    """DeviceTaintRules; None when the cluster serves no version of them or they cannot be read."""
    return _items("devicetaintrules", api.list_device_taint_rules, optional=True)
