"""The admission webhook's HTTP side: an aiohttp server on an asyncio loop of its own thread, serving
AdmissionReviews over TLS on one port and kubelet's probes over plain HTTP on another. Nothing here
decides anything about claims; controller.admission does, in a bounded pool of threads.

Why an event loop: every connection, idle or busy, costs a socket and a buffer instead of a thread, so
hostile or slow clients cannot take the places reviews and probes need (docs/reliability.md):
- connections: controller.listener (TLS handshake deadline, a cap with the least proven connection
  closed first, request headers within HEADER_TIMEOUT_S however slowly they come);
- requests: Content-Length required and at most MAX_BODY_BYTES, the body within BODY_TIMEOUT_S, JSON
  nested at most MAX_JSON_DEPTH levels (a 400 naming the depth, before anything recursive runs);
- reviews: controller.reviewqueue admits at most `max_reviews` running and `max_waiting_reviews` more,
  with one client (peer address) holding at most `max_reviews_per_client` of those places and free slots
  handed to clients in turn. A review turned away is answered 429 or 503 with Retry-After, never a
  denial: the apiserver retries within its timeout or applies the webhook's failurePolicy;
- every review has a deadline below the apiserver's webhook timeout (the `timeout` query parameter it
  adds, REVIEW_DEADLINE_S at most). A review that cannot finish in time is a 503 when the controller
  runs with on_deadline "deny" (failurePolicy Fail decides, as on a timeout), and admitted with a
  warning with "allow" (as failurePolicy Ignore would);
- probes: /healthz and /readyz on the probe port (plain HTTP, no client certificate, never behind a
  review); the review port answers them too, for clients that cannot reach the probe port;
- callers: with a client CA (CertificateStore), the TLS handshake requires a certificate it signed, so
  only the apiserver's calls reach a review.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import structlog
from aiohttp import web

from controller.admission import ENDPOINTS, AdmissionHandler, ReviewError, Verdict
from controller.listener import Listener
from controller.reviewqueue import Overloaded, ReviewQueue
from controller.tlsfiles import CertificateStore
from driver.jsondepth import json_depth

log = structlog.get_logger(__name__)

MAX_BODY_BYTES = 3 * 1024 * 1024
MAX_CONNECTIONS = 512  # review port: each TLS connection holds a 256 KiB buffer, so at most 128 MiB
MAX_PROBE_CONNECTIONS = 64
HANDSHAKE_TIMEOUT_S = 5.0
HEADER_TIMEOUT_S = 10.0  # request line and headers, from a connection's start or its previous answer
BODY_TIMEOUT_S = 10.0
MAX_JSON_DEPTH = 100  # real AdmissionReviews nest about 15 levels
MAX_REVIEWS = 4  # reviews evaluating at once: more only share the GIL (2-4 cores per replica)
MAX_WAITING_REVIEWS = 64  # admitted behind them (up to their deadline); more get a 503 at once
REVIEW_DEADLINE_S = 3.0  # the chart's webhook timeoutSeconds is 5
DEADLINE_MARGIN_S = 1.5  # kept free below the apiserver's timeout: queueing, the answer's way back
_TIMEOUT_PARAM = re.compile(r"(?:^|&)timeout=(\d+)s(?:&|$)")

Observer = Callable[[str, str, str, float], None]  # endpoint, kind, outcome, seconds
Result = tuple[int, bytes, str, str, str]  # HTTP status, body, content type, kind, outcome
_DIGITS = re.compile(r"[0-9]{1,12}")  # str.isdigit() also takes "²", which int() then rejects


def parse_json(raw: bytes) -> Any:
    """The request body as JSON; ValueError (a 400) when it is not, or nests deeper than MAX_JSON_DEPTH.

    The depth is measured without recursion before anything recursive (deepcopy, the checks, dumps)
    walks the document.
    """
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise ValueError(f"JSON nested too deeply (the limit is {MAX_JSON_DEPTH} levels)") from None
    depth = json_depth(doc)
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"JSON nested {depth} levels deep, more than the {MAX_JSON_DEPTH} an AdmissionReview "
                         "may have")
    return doc


def status_body(code: int, reason: str, message: str) -> bytes:
    """A metav1.Status: the apiserver's client shows its message in "failed calling webhook ...: <message>"."""
    return json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": message, "reason": reason, "code": code}).encode()


def _text(status: int, text: str, *, close: bool = False) -> web.Response:
    response = web.Response(status=status, text=text)
    if close:
        response.force_close()
    return response


def _listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


class WebhookServer:
    """Serves the admission endpoints on `host:port` (port 0 picks a free one) until stop(), and the
    probes on `probe` (host, port) when given. Both sockets are bound here, so a port in use raises
    OSError before start()."""

    def __init__(
        self,
        handler: AdmissionHandler,
        certs: CertificateStore,
        host: str = "",
        port: int = 8443,
        *,
        observe: Observer | None = None,
        ready: Callable[[], bool] | None = None,
        max_reviews: int = MAX_REVIEWS,
        max_waiting_reviews: int = MAX_WAITING_REVIEWS,
        max_reviews_per_client: int | None = None,
        review_deadline_s: float = REVIEW_DEADLINE_S,
        probe: tuple[str, int] | None = None,
    ) -> None:
        self.handler = handler
        self.certs = certs
        self._observe = observe
        self._ready = ready
        if review_deadline_s <= 0:
            raise ValueError(f"the review deadline must be positive, got {review_deadline_s}")
        self.review_deadline_s = review_deadline_s
        if max_reviews_per_client is None:
            # one client may fill half the places: another (the apiserver) always finds the other half
            max_reviews_per_client = max(1, (max_reviews + max_waiting_reviews) // 2)
        self.queue = ReviewQueue(max_reviews, max_waiting_reviews, max_reviews_per_client)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_reviews, thread_name_prefix="webhook-review")
        self._sock = _listening_socket(host, port)
        try:
            self._probe_sock = _listening_socket(*probe) if probe is not None else None
        except OSError:
            self._sock.close()
            raise
        self.port = int(self._sock.getsockname()[1])
        self.probe_port = int(self._probe_sock.getsockname()[1]) if self._probe_sock else None
        self.listeners: list[Listener] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="webhook", daemon=True)
        self._thread.start()
        self._started.wait()
        log.info("webhook serving", port=self.port, probe_port=self.probe_port,
                 client_certificate_required=self.certs.requires_client_certificate)

    def stop(self) -> None:
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stopping.set)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._sock.close()
        if self._probe_sock is not None:
            self._probe_sock.close()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        self.listeners = [Listener(self._sock, self._on_review_port, ssl_context=self.certs.serving_context(),
                                   max_connections=MAX_CONNECTIONS, idle_timeout_s=HEADER_TIMEOUT_S,
                                   handshake_timeout_s=HANDSHAKE_TIMEOUT_S, name="webhook")]
        if self._probe_sock is not None:
            self.listeners.append(Listener(self._probe_sock, self._on_probe_port, ssl_context=None,
                                           max_connections=MAX_PROBE_CONNECTIONS, idle_timeout_s=HEADER_TIMEOUT_S,
                                           name="probes"))
        for listener in self.listeners:
            listener.start()
        self._started.set()
        await self._stopping.wait()
        await asyncio.gather(*(listener.close() for listener in self.listeners))

    # -- routing -----------------------------------------------------------------------------------------

    async def _on_probe_port(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.method in ("GET", "HEAD") and request.path in ("/healthz", "/readyz"):
            return self._probe(request.path)
        return _text(HTTPStatus.NOT_FOUND, "not found; the probe port serves GET /healthz and /readyz\n")

    async def _on_review_port(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.method == "POST":
            if request.path not in ENDPOINTS:
                return _text(HTTPStatus.NOT_FOUND, f"unknown path; use one of {', '.join(ENDPOINTS)}\n")
            return await self._review(request)
        if request.method in ("GET", "HEAD") and request.path in ("/healthz", "/readyz"):
            return self._probe(request.path)
        return _text(HTTPStatus.NOT_FOUND, "not found\n")

    def _probe(self, path: str) -> web.Response:
        if path == "/healthz":
            return _text(HTTPStatus.OK, "ok\n")
        ready = self.ready()
        return _text(HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE,
                     "ok\n" if ready else "inventory not synced\n")

    # -- one review --------------------------------------------------------------------------------------

    async def _review(self, request: web.BaseRequest) -> web.StreamResponse:
        endpoint = request.path
        started = time.perf_counter()
        length = request.headers.get("Content-Length")
        if length is None:
            return _text(HTTPStatus.LENGTH_REQUIRED, "Content-Length required\n", close=True)
        if not _DIGITS.fullmatch(length.strip()):  # aiohttp's parser refuses most of these already
            self.observe(endpoint, "", "bad-request", 0.0)
            bad = f"Content-Length {length[:40]!r} is not a number of bytes (ASCII digits)\n"
            return _text(HTTPStatus.BAD_REQUEST, bad, close=True)
        size = int(length)
        if size > MAX_BODY_BYTES:
            # not reading the body: the connection closes instead of draining 3+ MiB
            self.observe(endpoint, "", "too-large", 0.0)
            return _text(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                         f"request body of {size} bytes is over the {MAX_BODY_BYTES}-byte limit\n", close=True)
        peer = request.transport.get_extra_info("peername") if request.transport else None
        client = str(peer[0]) if peer else "unknown"
        deadline = time.monotonic() + self.deadline_for(request.query_string)
        try:
            ticket = self.queue.admit(client)
        except Overloaded as exc:
            return self._overloaded(endpoint, client, exc, started)
        try:
            try:
                raw = await asyncio.wait_for(request.content.readexactly(size), BODY_TIMEOUT_S)
            except (TimeoutError, asyncio.IncompleteReadError):
                self.observe(endpoint, "", "bad-request", time.perf_counter() - started)
                message = f"request body of {size} bytes not received in time ({BODY_TIMEOUT_S:g} s)\n"
                return _text(HTTPStatus.REQUEST_TIMEOUT, message, close=True)
            try:
                await self.queue.start(ticket, deadline)
            except Overloaded as exc:
                return self._overloaded(endpoint, client, exc, started)
            status, body, content_type, kind, outcome = await asyncio.get_running_loop().run_in_executor(
                self._pool, self._evaluate, endpoint, raw, deadline)
        finally:
            self.queue.release(ticket)
        # observed before answering, so a scrape right after the answer already counts it
        self.observe(endpoint, kind, outcome, time.perf_counter() - started)
        return web.Response(status=status, body=body, content_type=content_type)

    def _overloaded(self, endpoint: str, client: str, exc: Overloaded, started: float) -> web.Response:
        outcome = "throttled" if exc.status == HTTPStatus.TOO_MANY_REQUESTS else "overloaded"
        self.observe(endpoint, "", outcome, time.perf_counter() - started)
        log.warning("review turned away", endpoint=endpoint, client=client, status=exc.status, reason=exc.reason)
        reason = "TooManyRequests" if exc.status == HTTPStatus.TOO_MANY_REQUESTS else "ServiceUnavailable"
        response = web.Response(status=exc.status, content_type="application/json", body=status_body(
            exc.status, reason, f"the tessera webhook is overloaded: {exc.reason}; not reviewed"))
        if exc.retry_after_s is not None:
            response.headers["Retry-After"] = str(exc.retry_after_s)
        return response

    def _evaluate(self, endpoint: str, raw: bytes, deadline: float) -> Result:
        """In a review thread: parse, judge, and say how to answer."""
        try:
            body = parse_json(raw)
            response, verdict = self.handler.review(endpoint, body, deadline=deadline)
        except (ValueError, ReviewError) as exc:
            # json.JSONDecodeError and UnicodeDecodeError are ValueErrors too
            return HTTPStatus.BAD_REQUEST, f"bad AdmissionReview: {exc}\n".encode(), "text/plain", "", "bad-request"
        except Exception:
            log.exception("admission handler failed", endpoint=endpoint)
            return HTTPStatus.INTERNAL_SERVER_ERROR, b"internal error\n", "text/plain", "", "error"
        return self._answer(response, verdict)

    @staticmethod
    def _answer(response: dict[str, Any], verdict: Verdict) -> Result:
        if verdict.cut_short and not verdict.allowed:
            # Not finished is not invalid: a 503, so failurePolicy decides (Fail refuses it as it would on a
            # timeout, with this message) and nothing reads it as a judgement of the object.
            return (HTTPStatus.SERVICE_UNAVAILABLE, status_body(503, "ServiceUnavailable", verdict.message),
                    "application/json", verdict.kind, verdict.outcome)
        return HTTPStatus.OK, json.dumps(response).encode(), "application/json", verdict.kind, verdict.outcome

    def deadline_for(self, query: str) -> float:
        """Seconds a review may take: REVIEW_DEADLINE_S, less when the apiserver's `timeout` query
        parameter (the webhook's timeoutSeconds) leaves less room. Accepts a query or a whole path."""
        _, _, query = query.rpartition("?")
        found = _TIMEOUT_PARAM.search(query)
        if found is None:
            return self.review_deadline_s
        return min(self.review_deadline_s, max(0.5, int(found.group(1)) - DEADLINE_MARGIN_S))

    def ready(self) -> bool:
        return self._ready() if self._ready else True

    def observe(self, endpoint: str, kind: str, outcome: str, seconds: float) -> None:
        if self._observe:
            self._observe(endpoint, kind, outcome, seconds)


__all__ = ["MAX_BODY_BYTES", "CertificateStore", "Verdict", "WebhookServer", "json_depth", "parse_json"]
