"""kubelet's DRA service (v1 and v1beta1): a batch of claims in, one answer per claim out.

This layer decides nothing about GPUs. For each claim kubelet names it GETs the ResourceClaim,
checks that it is the claim kubelet means (uid) and that it is allocated, and hands it to the
DeviceState, which does the work. Rules kubelet imposes on the answer:

- every claim of the request gets exactly one entry, keyed by uid; a failure is that claim's
  `error`, never a gRPC error (which would make kubelet drop the whole batch): whatever DeviceState
  or the GET raises becomes that text in `claim_failure`, the one place that logs it;
- the answer must arrive before kubelet's deadline (45 s), so claims are worked on in parallel,
  and a claim that is not done in time is answered with a retryable error while its work goes on
  in the background (DeviceState is idempotent, so kubelet's retry finds it done or resumes it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc
import structlog

from driver import DRIVER_NAME
from driver.errors import TesseraError
from driver.kubeapi import ApiError, KubeAPI
from driver.names import base_request
from kubeletplugin.kubeletclaims import ClaimRef, PreparedDevice, PrepareResult
from kubeletplugin.metrics import PluginMetrics
from proto.dra.v1 import api_pb2 as v1
from proto.dra.v1 import api_pb2_grpc as v1_grpc
from proto.dra.v1beta1 import api_pb2 as v1beta1
from proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc

log = structlog.get_logger(__name__)

# Answer this long before kubelet's deadline, so the answer still reaches it.
DEADLINE_MARGIN_S = 1.0
# Without a deadline from the caller (tests, grpcurl) a batch still must not hang forever.
DEFAULT_BUDGET_S = 40.0

T = TypeVar("T")


class ClaimPreparer(Protocol):
    """The two decisions the wire layer delegates (kubeletplugin.state.DeviceState implements them).

    Both raise on failure; `claim_failure` turns what they raise into the claim's answer.
    """

    def prepare(self, ref: ClaimRef, claim: dict[str, Any]) -> PrepareResult: ...

    def unprepare(self, ref: ClaimRef) -> None: ...


@dataclass(frozen=True)
class ClaimFailure:
    """Why one claim was not prepared or unprepared: the text kubelet shows, and the metric's reason label."""

    message: str
    reason: str


def describe_get_error(ref: ClaimRef, exc: ApiError) -> ClaimFailure:
    """Turn an apiserver failure on GET claim into the per-claim text kubelet puts in the pod's events."""
    what = f"cannot read ResourceClaim {ref.namespace}/{ref.name}"
    if exc.not_found:
        return ClaimFailure(f"{what}: it does not exist (deleted after scheduling?); kubelet will retry", "not_found")
    if exc.status == 0:
        detail = f" ({exc.message})" if exc.message else ""
        return ClaimFailure(f"{what}: apiserver unreachable{detail}, kubelet will retry", "apiserver")
    if exc.status in (401, 403):
        return ClaimFailure(
            f"{what}: apiserver answered {exc.status} {exc.http_reason}: the plugin's service account needs "
            "'get' on resourceclaims.resource.k8s.io",
            "forbidden",
        )
    if exc.retryable:
        return ClaimFailure(f"{what}: apiserver answered {exc.status} {exc.http_reason}, kubelet will retry",
                            "apiserver")  # fmt: skip
    return ClaimFailure(f"{what}: apiserver answered {exc}", "apiserver")


def check_claim(ref: ClaimRef, claim: Any, *, pool: str | None = None) -> ClaimFailure | None:
    """Why the fetched claim is not the allocated claim kubelet asked about, or None when it is.

    An allocation without a single device of this driver (in this node's pool, when `pool` is given)
    is refused too: answering "no devices" would start the pod without the GPUs it asked for.
    """
    what = f"ResourceClaim {ref.namespace}/{ref.name}"
    if not isinstance(claim, dict):
        return ClaimFailure(f"{what}: the apiserver answered a {type(claim).__name__}, not an object", "malformed")
    metadata = _object(claim, "metadata", what)
    if isinstance(metadata, ClaimFailure):
        return metadata
    uid = str(metadata.get("uid", ""))
    if uid != ref.uid:
        return ClaimFailure(
            f"{what} has uid {uid or '<none>'} but kubelet asked for uid {ref.uid}: the claim was deleted and "
            "re-created; nothing was prepared",
            "claim_replaced",
        )
    status = _object(claim, "status", what)
    if isinstance(status, ClaimFailure):
        return status
    allocation = _object(status, "allocation", f"{what} status")
    if isinstance(allocation, ClaimFailure):
        return allocation
    if not allocation:
        return ClaimFailure(f"{what} is not allocated (status.allocation is empty); nothing was prepared",
                            "not_allocated")  # fmt: skip
    devices = _object(allocation, "devices", f"{what} status.allocation")
    if isinstance(devices, ClaimFailure):
        return devices
    return _check_results(ref, devices.get("results") or [], pool)


def _check_results(ref: ClaimRef, results: Any, pool: str | None) -> ClaimFailure | None:
    what = f"ResourceClaim {ref.namespace}/{ref.name}"
    if not isinstance(results, list):
        return ClaimFailure(f"{what}: status.allocation.devices.results must be a list, got "
                            f"{type(results).__name__}; nothing was prepared", "malformed")  # fmt: skip
    results = [r for r in results if isinstance(r, dict)]
    mine = [r for r in results if r.get("driver") == DRIVER_NAME]
    if not mine:
        others = sorted({str(r.get("driver")) for r in results}) or ["no driver at all"]
        return ClaimFailure(
            f"{what} has no device allocated by {DRIVER_NAME} (its devices come from: {', '.join(others)}); "
            "nothing was prepared",
            "not_this_driver",
        )
    if pool is not None and not any(r.get("pool") == pool for r in mine):
        pools = sorted({str(r.get("pool")) for r in mine})
        return ClaimFailure(
            f"{what} has {DRIVER_NAME} devices only in pool(s) {', '.join(pools)}, none on this node (pool "
            f"{pool}); the pod was placed on the wrong node, delete it so it is scheduled again",
            "not_this_node",
        )
    return None


def _object(parent: dict[str, Any], key: str, where: str) -> dict[str, Any] | ClaimFailure:
    """parent[key] as an object ({} when absent or null); anything else is a malformed claim."""
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        return ClaimFailure(f"{where}: {key} must be an object, got {type(value).__name__}; nothing was prepared",
                            "malformed")  # fmt: skip
    return value


_GERUND = {"prepare": "preparing", "unprepare": "unpreparing"}


def claim_failure(operation: str, ref: ClaimRef, exc: Exception) -> ClaimFailure:
    """The answer kubelet gets for a claim whose `operation` raised `exc`; logged here.

    A TesseraError's text is already written for the user, and its class names the reason; a
    failing disk (OSError) fails the claim alone and kubelet retries; anything else is a bug: an
    internal error, logged with its traceback. Call it from the `except` block, so that the
    traceback is at hand.
    """
    claim = f"{ref.namespace}/{ref.name}"
    bound = log.bind(claim_uid=ref.uid, claim=claim)
    event = f"claim not {operation}d"
    if isinstance(exc, TesseraError):
        bound.warning(event, error=str(exc), reason=exc.reason)
        return ClaimFailure(str(exc), exc.reason)
    if isinstance(exc, OSError):
        # the node's disk (full, read-only, failing)
        if operation == "prepare":
            where = f" ({exc.filename})" if exc.filename else ""
            text = f"cannot prepare claim {claim}: {exc.strerror or exc}{where}; kubelet will retry"
            bound.error(event, error=text, reason="disk")
        else:
            text = str(exc)
            bound.warning(event, error=text, reason="disk")
        return ClaimFailure(text, "disk")
    bound.exception(f"{operation} failed unexpectedly")
    return ClaimFailure(f"internal error {_GERUND[operation]} ResourceClaim {claim}: {exc}", "internal")


def _report(operation: str, ref: ClaimRef, failure: ClaimFailure) -> ClaimFailure:
    """Log a failure found before DeviceState was asked (the claim as fetched, or the apiserver)."""
    log.warning(f"claim not {operation}d", claim_uid=ref.uid, claim=f"{ref.namespace}/{ref.name}",
                error=failure.message, reason=failure.reason)  # fmt: skip
    return failure


def base_request_names(names: Sequence[str]) -> list[str]:
    """Containers reference the main request, so "req/sub" must go back to kubelet as "req" (deduplicated)."""
    out: list[str] = []
    for name in names:
        base = base_request(name)
        if base not in out:
            out.append(base)
    return out


class DraService:
    """Prepares and unprepares batches of claims against one DeviceState, in parallel and within a deadline."""

    def __init__(
        self,
        api: KubeAPI,
        state: ClaimPreparer,
        *,
        metrics: PluginMetrics | None = None,
        pool: str | None = None,
        max_parallel: int = 8,
        deadline_margin: float = DEADLINE_MARGIN_S,
    ) -> None:
        self._api = api
        self._pool_name = pool
        self._state = state
        self._metrics = metrics
        self._margin = deadline_margin
        self._workers = ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="claim")

    def close(self) -> None:
        """Wait for claim work still running (it must not be cut half-way) and release the workers."""
        self._workers.shutdown(wait=True, cancel_futures=True)

    # -- batches -------------------------------------------------------------------------------
    def prepare_claims(
        self, refs: Sequence[ClaimRef], time_remaining: Callable[[], float | None]
    ) -> dict[str, PrepareResult]:
        abandoned = threading.Event()
        futures = {ref.uid: self._workers.submit(self._prepare_one, ref, abandoned) for ref in refs}
        done = self._await(futures, time_remaining, abandoned)
        results: dict[str, PrepareResult] = {}
        for ref in refs:
            if ref.uid in done:
                results[ref.uid] = done[ref.uid]
            else:
                results[ref.uid] = PrepareResult(error=self._late("prepare", ref, futures[ref.uid]))
        return results

    def unprepare_claims(
        self, refs: Sequence[ClaimRef], time_remaining: Callable[[], float | None]
    ) -> dict[str, str]:
        abandoned = threading.Event()
        futures = {ref.uid: self._workers.submit(self._unprepare_one, ref, abandoned) for ref in refs}
        done = self._await(futures, time_remaining, abandoned)
        return {ref.uid: done[ref.uid] if ref.uid in done else self._late("unprepare", ref, futures[ref.uid])
                for ref in refs}

    def _await(
        self,
        futures: dict[str, Future[T]],
        time_remaining: Callable[[], float | None],
        abandoned: threading.Event,
    ) -> dict[str, T]:
        remaining = time_remaining()
        budget = DEFAULT_BUDGET_S if remaining is None else max(0.0, remaining - self._margin)
        wait_futures(futures.values(), timeout=budget)
        # Claims still fetching will not start preparing: kubelet has its answer and will ask again.
        abandoned.set()
        return {uid: f.result() for uid, f in futures.items() if f.done() and not f.cancelled()}

    def _late(self, operation: str, ref: ClaimRef, future: Future[Any]) -> str:
        started = future.running()
        future.cancel()
        if self._metrics is not None:
            self._metrics.claim_operations.labels(operation=operation, result="error").inc()
            self._metrics.claim_errors.labels(operation=operation, reason="deadline").inc()
        if not started:
            return (
                f"{operation} of ResourceClaim {ref.namespace}/{ref.name} did not start before kubelet's "
                "deadline (the plugin is busy with other claims); kubelet will retry"
            )
        return (
            f"{operation} of ResourceClaim {ref.namespace}/{ref.name} did not finish before kubelet's deadline "
            "(apiserver or device setup slow); it continues in the background and kubelet will retry"
        )

    # -- one claim -----------------------------------------------------------------------------
    def _prepare_one(self, ref: ClaimRef, abandoned: threading.Event) -> PrepareResult:
        start = time.monotonic()
        outcome: PrepareResult | ClaimFailure | dict[str, Any] = self._fetch(ref, abandoned)
        if isinstance(outcome, dict):
            try:
                outcome = self._state.prepare(ref, outcome)
            except Exception as exc:
                outcome = claim_failure("prepare", ref, exc)
        if self._metrics is not None and not abandoned.is_set():
            reason = outcome.reason if isinstance(outcome, ClaimFailure) else ""
            self._metrics.observe_claim("prepare", time.monotonic() - start, reason)
        if isinstance(outcome, ClaimFailure):
            return PrepareResult(error=outcome.message)
        log.info("claim prepared", claim_uid=ref.uid, claim=f"{ref.namespace}/{ref.name}",
                 devices=[d.device_name for d in outcome.devices])  # fmt: skip
        return outcome

    def _fetch(self, ref: ClaimRef, abandoned: threading.Event) -> dict[str, Any] | ClaimFailure:
        """The claim kubelet means, as the apiserver has it, or why it cannot be prepared."""
        try:
            claim = self._api.get_resource_claim(ref.namespace, ref.name)
        except ApiError as exc:
            return _report("prepare", ref, describe_get_error(ref, exc))
        except Exception as exc:
            return claim_failure("prepare", ref, exc)
        if abandoned.is_set():
            return _report("prepare", ref, ClaimFailure(
                f"cannot read ResourceClaim {ref.namespace}/{ref.name}: apiserver did not answer before "
                "kubelet's deadline, kubelet will retry", "deadline"))  # fmt: skip
        failure = check_claim(ref, claim, pool=self._pool_name)
        return claim if failure is None else _report("prepare", ref, failure)

    def _unprepare_one(self, ref: ClaimRef, abandoned: threading.Event) -> str:
        start = time.monotonic()
        failure: ClaimFailure | None = None
        try:
            # No GET: the claim may already be gone from the apiserver; DeviceState works from its checkpoint.
            self._state.unprepare(ref)
        except Exception as exc:
            failure = claim_failure("unprepare", ref, exc)
        if self._metrics is not None and not abandoned.is_set():
            self._metrics.observe_claim("unprepare", time.monotonic() - start, failure.reason if failure else "")
        if failure is not None:
            return failure.message
        log.info("claim unprepared", claim_uid=ref.uid, claim=f"{ref.namespace}/{ref.name}")
        return ""

    # -- gRPC ----------------------------------------------------------------------------------
    def add_to(self, server: grpc.Server) -> None:
        """Serve both kubelet API versions from this service."""
        v1_grpc.add_DRAPluginServicer_to_server(DRAPluginV1(self, self._metrics), server)
        v1beta1_grpc.add_DRAPluginServicer_to_server(DRAPluginV1Beta1(self, self._metrics), server)


def _refs(claims: Sequence[v1.Claim] | Sequence[v1beta1.Claim]) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]


def _time_remaining(context: grpc.ServicerContext) -> Callable[[], float | None]:
    def remaining() -> float | None:
        value = context.time_remaining()
        return None if value is None else float(value)

    return remaining


def _v1_device(device: PreparedDevice) -> v1.Device:
    out = v1.Device(
        request_names=base_request_names(device.request_names),
        pool_name=device.pool_name,
        device_name=device.device_name,
        cdi_device_ids=list(device.cdi_device_ids),
    )
    if device.share_id:
        out.share_id = device.share_id
    return out


def _v1beta1_device(device: PreparedDevice) -> v1beta1.Device:
    # v1beta1 has no share_id: kubelets that speak only v1beta1 predate consumable capacity.
    return v1beta1.Device(
        request_names=base_request_names(device.request_names),
        pool_name=device.pool_name,
        device_name=device.device_name,
        cdi_device_ids=list(device.cdi_device_ids),
    )


class _Timer:
    def __init__(self, metrics: PluginMetrics | None, method: str, api_version: str) -> None:
        self._metrics, self._method, self._version = metrics, method, api_version
        self._start = time.monotonic()

    def done(self) -> None:
        if self._metrics is not None:
            self._metrics.rpc_duration.labels(method=self._method, api_version=self._version).observe(
                time.monotonic() - self._start
            )


class _VersionHandlers:
    """Builds the kubelet's answers in one API version's messages (v1 and v1beta1 differ only there)."""

    def __init__(
        self, service: DraService, metrics: PluginMetrics | None, version: str, pb: Any,
        to_device: Callable[[PreparedDevice], Any],
    ) -> None:
        self._service, self._metrics, self._version = service, metrics, version
        self._pb, self._to_device = pb, to_device

    def prepare(self, request: Any, context: grpc.ServicerContext) -> Any:
        timer = _Timer(self._metrics, "NodePrepareResources", self._version)
        results = self._service.prepare_claims(_refs(request.claims), _time_remaining(context))
        response = self._pb.NodePrepareResourcesResponse()
        for uid, result in results.items():
            entry = response.claims[uid]
            if result.error:
                entry.error = result.error
            else:
                entry.devices.extend(self._to_device(d) for d in result.devices)
        timer.done()
        return response

    def unprepare(self, request: Any, context: grpc.ServicerContext) -> Any:
        timer = _Timer(self._metrics, "NodeUnprepareResources", self._version)
        errors = self._service.unprepare_claims(_refs(request.claims), _time_remaining(context))
        response = self._pb.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            response.claims[uid].error = error
        timer.done()
        return response


class DRAPluginV1(v1_grpc.DRAPluginServicer):
    """/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/*"""

    def __init__(self, service: DraService, metrics: PluginMetrics | None = None) -> None:
        self._handlers = _VersionHandlers(service, metrics, "v1", v1, _v1_device)

    def NodePrepareResources(
        self, request: v1.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1.NodePrepareResourcesResponse:
        response: v1.NodePrepareResourcesResponse = self._handlers.prepare(request, context)
        return response

    def NodeUnprepareResources(
        self, request: v1.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1.NodeUnprepareResourcesResponse:
        response: v1.NodeUnprepareResourcesResponse = self._handlers.unprepare(request, context)
        return response


class DRAPluginV1Beta1(v1beta1_grpc.DRAPluginServicer):
    """/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/*"""

    def __init__(self, service: DraService, metrics: PluginMetrics | None = None) -> None:
        self._handlers = _VersionHandlers(service, metrics, "v1beta1", v1beta1, _v1beta1_device)

    def NodePrepareResources(
        self, request: v1beta1.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1beta1.NodePrepareResourcesResponse:
        response: v1beta1.NodePrepareResourcesResponse = self._handlers.prepare(request, context)
        return response

    def NodeUnprepareResources(
        self, request: v1beta1.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1beta1.NodeUnprepareResourcesResponse:
        response: v1beta1.NodeUnprepareResourcesResponse = self._handlers.unprepare(request, context)
        return response
