"""The HTTPS server in front of the admission handler: TLS 1.2+, certificate reloaded when its files
change, 3 MiB request limit, `/healthz` and `/readyz`. Nothing here decides anything about claims.

Hostile or broken clients cannot take it down (docs/reliability.md):
- connections are served by a fixed pool of MAX_CONNECTIONS worker threads; up to MAX_PENDING more
  wait in a queue, and a connection beyond that is closed at once instead of getting a thread;
  while any wait, every answer closes its keep-alive connection, so busy clients cannot keep all
  workers and a new connection (a kubelet probe) gets one within a request's time;
- the TLS handshake, the request line and headers, and the body each have a deadline for the whole
  read (not per recv, which a client sending a byte every few seconds would never hit);
- Content-Length must be ASCII digits, and a body nested deeper than MAX_JSON_DEPTH is a 400 naming
  the depth, before anything recursive touches it.

Reviews are CPU work under one GIL, so at most `max_reviews` run at once and `max_waiting` more wait
for a slot; every review has a deadline below the apiserver's webhook timeout (the `timeout` query
parameter the apiserver adds, and REVIEW_DEADLINE_S at most). A review that cannot start, or whose
evaluations reach the deadline, is answered at once as cut short (controller.admission). /healthz and
/readyz never take a review slot, so they answer while reviews queue.

Certificates are re-read lazily: every accepted connection stats the two files and, when either
changed (cert-manager or a Secret update rotates them in place), builds a new SSL context before the
handshake. A half-written pair that does not load keeps the previous context and logs the error.
"""

from __future__ import annotations

import io
import json
import os
import queue
import re
import select
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import structlog

from controller.admission import ENDPOINTS, AdmissionHandler, ReviewError, Verdict
from driver.jsondepth import json_depth

log = structlog.get_logger(__name__)

MAX_BODY_BYTES = 3 * 1024 * 1024
# Worker threads, each serving one connection at a time: twice the 64 concurrent reviews an
# apiserver may send under load, so keep-alive connections leave room for probes. An idle worker
# costs a blocked thread.
MAX_CONNECTIONS = 128
MAX_PENDING = 128  # accepted connections waiting for a worker; more are closed at once
HANDSHAKE_TIMEOUT_S = 5.0
HEADER_TIMEOUT_S = 10.0  # an idle keep-alive connection, then request line and headers
BODY_TIMEOUT_S = 10.0
WRITE_TIMEOUT_S = 10.0  # a client that stops reading the answer
MAX_JSON_DEPTH = 100  # real AdmissionReviews nest about 15 levels
MAX_REVIEWS = 4  # reviews evaluating at once: more only share the GIL (2-4 cores per replica)
MAX_WAITING_REVIEWS = 64  # reviews waiting (up to their deadline) for a slot; more are cut short at once
REVIEW_DEADLINE_S = 3.0  # the chart's webhook timeoutSeconds is 5
DEADLINE_MARGIN_S = 1.5  # kept free below the apiserver's timeout: queueing, the answer's way back
_TIMEOUT_PARAM = re.compile(r"(?:^|&)timeout=(\d+)s(?:&|$)")
_DIGITS = re.compile(r"[0-9]{1,12}")  # str.isdigit() also takes "²", which int() then rejects

Observer = Callable[[str, str, str, float], None]  # endpoint, kind, outcome, seconds


class CertificateStore:
    """The server's SSL context, rebuilt when the certificate or key file changes."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self._lock = threading.Lock()
        self.reloads = 0
        self._stamp = self._read_stamp()
        self._context = self._load()  # a first pair that does not load is fatal: raise

    def _read_stamp(self) -> tuple[tuple[int, int, int], ...]:
        stamps = []
        for path in (self.cert_file, self.key_file):
            st = os.stat(path)
            stamps.append((st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(stamps)

    def _load(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        return context

    def context(self) -> ssl.SSLContext:
        with self._lock:
            try:
                stamp = self._read_stamp()
            except OSError as exc:
                log.error("cannot stat the TLS certificate files; keeping the loaded ones", error=str(exc))
                return self._context
            if stamp != self._stamp:
                try:
                    self._context = self._load()
                    self.reloads += 1
                    log.info("TLS certificate reloaded", cert=self.cert_file)
                except (OSError, ssl.SSLError) as exc:
                    log.error("new TLS certificate does not load; keeping the previous one", error=str(exc))
                self._stamp = stamp
            return self._context


class _Server(HTTPServer):
    """An HTTPServer whose connections are served by a fixed pool of threads (see start_workers)."""

    request_queue_size = 128

    def __init__(self, address: tuple[str, int], app: WebhookServer) -> None:
        self.app = app
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.address_family = family
        self._pending: queue.Queue[tuple[Any, Any] | None] = queue.Queue(MAX_PENDING)
        self._workers: list[threading.Thread] = []
        self.refused = 0
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, a DNS round trip nothing here needs.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def get_request(self) -> tuple[Any, Any]:
        sock, addr = self.socket.accept()
        # The handshake happens in a worker (setup()), so a slow client cannot stall accept().
        return self.app.certs.context().wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def connections_waiting(self) -> bool:
        return not self._pending.empty()

    def start_workers(self) -> None:
        for n in range(MAX_CONNECTIONS):
            worker = threading.Thread(target=self._work, name=f"webhook-conn-{n}", daemon=True)
            worker.start()
            self._workers.append(worker)

    def stop_workers(self) -> None:
        for _ in self._workers:
            try:
                self._pending.put_nowait(None)
            except queue.Full:
                break  # daemon threads; they end with the process
        for worker in self._workers:
            worker.join(timeout=0.5)
        self._workers.clear()

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            self._pending.put_nowait((request, client_address))
        except queue.Full:
            # every worker busy and the queue full: closing now keeps memory and threads bounded,
            # and the client (the apiserver retries) learns at once instead of after its timeout
            self.refused += 1
            log.warning("webhook connection refused: all workers busy", client=str(client_address),
                        workers=MAX_CONNECTIONS, pending=MAX_PENDING)
            self.shutdown_request(request)

    def _work(self) -> None:
        while True:
            item = self._pending.get()
            if item is None:
                return
            request, client_address = item
            try:
                self.finish_request(request, client_address)
            except Exception:
                self.handle_error(request, client_address)
            finally:
                self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection failed", client=str(client_address), exc_info=True)


class _DeadlineReader(io.RawIOBase):
    """Reads from the socket until `handler.read_deadline` (monotonic), however slowly the bytes come."""

    def __init__(self, sock: socket.socket, handler: _Handler) -> None:
        self._sock = sock
        self._handler = handler

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self._handler.read_deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"{self._handler.reading} not received in time")
        self._sock.settimeout(remaining)
        try:
            return self._sock.recv_into(buffer)
        except TimeoutError:
            raise TimeoutError(f"{self._handler.reading} not received in time") from None


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    timeout = HANDSHAKE_TIMEOUT_S
    read_deadline = 0.0
    reading = "request headers"
    server_version = "tessera-webhook"
    sys_version = ""
    # Headers and body leave in two writes; with Nagle on, the body waits for the apiserver's delayed
    # ACK of the headers (~40 ms per review, measured by benchmarks.footprint).
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        _handshake(self.connection, time.monotonic() + HANDSHAKE_TIMEOUT_S)
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, self))

    def handle_one_request(self) -> None:
        # the header deadline also ends a keep-alive connection that stays idle that long
        self.read_deadline = time.monotonic() + HEADER_TIMEOUT_S
        self.reading = "request headers"
        super().handle_one_request()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http", client=self.client_address[0], message=format % args)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._send(HTTPStatus.OK, b"ok\n", "text/plain")
        elif path == "/readyz":
            ready = self.server.app.ready()
            self._send(HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE,
                       b"ok\n" if ready else b"inventory not synced\n", "text/plain")
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")

    def do_POST(self) -> None:
        endpoint = self.path.split("?", 1)[0]
        if endpoint not in ENDPOINTS:
            hint = f"unknown path; use one of {', '.join(ENDPOINTS)}\n"
            self._send(HTTPStatus.NOT_FOUND, hint.encode(), "text/plain")
            return
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            self.close_connection = True
            self._send(HTTPStatus.LENGTH_REQUIRED, b"Content-Length required\n", "text/plain")
            return
        if not _DIGITS.fullmatch(length_header.strip()):
            self.close_connection = True
            self.server.app.observe(endpoint, "", "bad-request", 0.0)
            bad = f"Content-Length {length_header[:40]!r} is not a number of bytes (ASCII digits)\n"
            self._send(HTTPStatus.BAD_REQUEST, bad.encode(), "text/plain")
            return
        length = int(length_header)
        if length > MAX_BODY_BYTES:
            # Not reading the body: close the connection instead of draining 3+ MiB.
            self.close_connection = True
            self.server.app.observe(endpoint, "", "too-large", 0.0)
            too_large = f"request body of {length} bytes is over the {MAX_BODY_BYTES}-byte limit\n"
            self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, too_large.encode(), "text/plain")
            return
        started = time.perf_counter()
        deadline = time.monotonic() + self.server.app.deadline_for(self.path)
        self.read_deadline = time.monotonic() + BODY_TIMEOUT_S
        self.reading = f"request body of {length} bytes"
        try:
            raw = self.rfile.read(length)
        except TimeoutError as exc:
            self.close_connection = True
            self.server.app.observe(endpoint, "", "bad-request", time.perf_counter() - started)
            self._send(HTTPStatus.REQUEST_TIMEOUT, f"{exc} ({BODY_TIMEOUT_S:g} s)\n".encode(), "text/plain")
            return
        try:
            body = parse_json(raw)
            response, verdict = self.server.app.review(endpoint, body, deadline)
        except (ValueError, ReviewError) as exc:
            # json.JSONDecodeError and UnicodeDecodeError are ValueErrors too
            self.server.app.observe(endpoint, "", "bad-request", time.perf_counter() - started)
            self._send(HTTPStatus.BAD_REQUEST, f"bad AdmissionReview: {exc}\n".encode(), "text/plain")
            return
        except Exception:
            log.exception("admission handler failed", endpoint=endpoint)
            self.server.app.observe(endpoint, "", "error", time.perf_counter() - started)
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, b"internal error\n", "text/plain")
            return
        # observed before answering, so a scrape right after the answer already counts it
        self.server.app.observe(endpoint, verdict.kind, verdict.outcome, time.perf_counter() - started)
        self._send(HTTPStatus.OK, json.dumps(response).encode(), "application/json")

    def _send(self, status: HTTPStatus, payload: bytes, content_type: str) -> None:
        self.connection.settimeout(WRITE_TIMEOUT_S)  # the reader left the timeout of its last recv
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        if self.server.connections_waiting():
            # a keep-alive connection would keep this worker while others queue (a kubelet probe
            # opens a new connection each time): announce the close, and the client reconnects
            # behind them
            self.close_connection = True
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)


def _handshake(sock: ssl.SSLSocket, deadline: float) -> None:
    """The TLS handshake, finished before `deadline` or abandoned (TimeoutError)."""
    sock.setblocking(False)
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("TLS handshake not finished in time")
            try:
                sock.do_handshake()
                return
            except ssl.SSLWantReadError:
                select.select([sock], [], [], remaining)
            except ssl.SSLWantWriteError:
                select.select([], [sock], [], remaining)
    finally:
        sock.setblocking(True)


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


class ReviewSlots:
    """At most `running` reviews at once and `waiting` more queued for a slot."""

    def __init__(self, running: int, waiting: int) -> None:
        if running < 1 or waiting < 0:
            raise ValueError(f"need at least 1 running review and no negative queue, got {running}/{waiting}")
        self.running = running
        self.waiting = waiting
        self._slots = threading.BoundedSemaphore(running)
        self._lock = threading.Lock()
        self._queued = 0

    def acquire(self, deadline: float) -> str:
        """"" once a slot is held (release() it), else why none was taken before `deadline`."""
        if self._slots.acquire(blocking=False):
            return ""
        with self._lock:
            if self._queued >= self.waiting:
                return f"{self.running} reviews running and {self.waiting} waiting"
            self._queued += 1
        try:
            if self._slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
                return ""
            return f"no review slot came free before its deadline ({self.running} run at once)"
        finally:
            with self._lock:
                self._queued -= 1

    def release(self) -> None:
        self._slots.release()


class WebhookServer:
    """Serves the admission endpoints on `host:port` (port 0 picks a free one) until stop()."""

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
        review_deadline_s: float = REVIEW_DEADLINE_S,
    ) -> None:
        self.handler = handler
        self.certs = certs
        self._observe = observe
        self._ready = ready
        self.slots = ReviewSlots(max_reviews, max_waiting_reviews)
        if review_deadline_s <= 0:
            raise ValueError(f"the review deadline must be positive, got {review_deadline_s}")
        self.review_deadline_s = review_deadline_s
        self._server = _Server((host, port), self)
        self._thread: threading.Thread | None = None

    def deadline_for(self, path: str) -> float:
        """Seconds a review of `path` may take: REVIEW_DEADLINE_S, less when the apiserver's `timeout`
        query parameter (the webhook's timeoutSeconds) leaves less room."""
        _, _, query = path.partition("?")
        found = _TIMEOUT_PARAM.search(query)
        if found is None:
            return self.review_deadline_s
        return min(self.review_deadline_s, max(0.5, int(found.group(1)) - DEADLINE_MARGIN_S))

    def review(self, endpoint: str, body: Any, deadline: float) -> tuple[dict[str, Any], Verdict]:
        """One review in a slot, or answered at once as cut short when no slot comes free in time."""
        busy = self.slots.acquire(deadline)
        if busy:
            return self.handler.unreviewed(body, busy)
        try:
            return self.handler.review(endpoint, body, deadline=deadline)
        finally:
            self.slots.release()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def ready(self) -> bool:
        return self._ready() if self._ready else True

    def observe(self, endpoint: str, kind: str, outcome: str, seconds: float) -> None:
        if self._observe:
            self._observe(endpoint, kind, outcome, seconds)

    def start(self) -> None:
        self._server.start_workers()
        # A short poll interval only bounds how long stop() waits; requests are served as they arrive.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="webhook", daemon=True
        )
        self._thread.start()
        log.info("webhook serving", address=str(self._server.server_address[:2]))

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._server.stop_workers()
        if self._thread:
            self._thread.join(timeout=5)


__all__ = ["MAX_BODY_BYTES", "CertificateStore", "ReviewSlots", "Verdict", "WebhookServer"]
