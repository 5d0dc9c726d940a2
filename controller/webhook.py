"""The HTTPS server in front of the admission handler: TLS 1.2+, certificate reloaded when its files
change, 3 MiB request limit, `/healthz` and `/readyz`. Nothing here decides anything about claims.

Certificates are re-read lazily: every accepted connection stats the two files and, when either
changed (cert-manager or a Secret update rotates them in place), builds a new SSL context before the
handshake. A half-written pair that does not load keeps the previous context and logs the error.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog

from controller.admission import ENDPOINTS, AdmissionHandler, ReviewError, Verdict

log = structlog.get_logger(__name__)

MAX_BODY_BYTES = 3 * 1024 * 1024
READ_TIMEOUT_S = 10.0

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


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], app: WebhookServer) -> None:
        self.app = app
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.address_family = family
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, a DNS round trip nothing here needs.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def get_request(self) -> tuple[Any, Any]:
        sock, addr = self.socket.accept()
        # The handshake happens in the handler's thread (setup()), so a slow client cannot stall accept().
        return self.app.certs.context().wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection failed", client=str(client_address), exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    timeout = READ_TIMEOUT_S
    server_version = "tessera-webhook"
    sys_version = ""
    # Headers and body leave in two writes; with Nagle on, the body waits for the apiserver's delayed
    # ACK of the headers (~40 ms per review, measured by benchmarks.footprint).
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        self.connection.do_handshake()

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
        if length_header is None or not length_header.isdigit():
            self.close_connection = True
            self._send(HTTPStatus.LENGTH_REQUIRED, b"Content-Length required\n", "text/plain")
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
        try:
            body = json.loads(self.rfile.read(length))
            response, verdict = self.server.app.handler.review(endpoint, body)
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
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)


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
    ) -> None:
        self.handler = handler
        self.certs = certs
        self._observe = observe
        self._ready = ready
        self._server = _Server((host, port), self)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def ready(self) -> bool:
        return self._ready() if self._ready else True

    def observe(self, endpoint: str, kind: str, outcome: str, seconds: float) -> None:
        if self._observe:
            self._observe(endpoint, kind, outcome, seconds)

    def start(self) -> None:
        # A short poll interval only bounds how long stop() waits; requests are served as they arrive.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="webhook", daemon=True
        )
        self._thread.start()
        log.info("webhook serving", address=str(self._server.server_address[:2]))

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread:
            self._thread.join(timeout=5)


__all__ = ["MAX_BODY_BYTES", "CertificateStore", "Verdict", "WebhookServer"]
