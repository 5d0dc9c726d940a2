"""The webhook's TLS settings, read from files and re-read when they change: TLS 1.2+, the serving
certificate and key, and optionally the CA that a client certificate must be signed by (the apiserver
presents one when its AdmissionConfiguration gives it a kubeconfig for webhooks; docs/operations.md).

Certificates are re-read lazily: every TLS handshake stats the files and, when one changed
(cert-manager or a Secret update rotates them in place), builds a new SSL context for that handshake
and the ones after it. A half-written set that does not load keeps the previous context and logs why.
"""

from __future__ import annotations

import os
import ssl
import threading
from typing import Any

import structlog

log = structlog.get_logger(__name__)

Stamp = tuple[tuple[int, int, int], ...]


class CertificateStore:
    """The server's SSL context, rebuilt when the certificate, key or client CA file changes."""

    def __init__(self, cert_file: str, key_file: str, client_ca_file: str | None = None) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca_file = client_ca_file
        self._lock = threading.Lock()
        self.reloads = 0
        self._stamp = self._read_stamp()
        self._context = self._load()  # a first set that does not load is fatal: raise
        self._serving: ssl.SSLContext | None = None

    @property
    def requires_client_certificate(self) -> bool:
        return self.client_ca_file is not None

    def _files(self) -> tuple[str, ...]:
        return (self.cert_file, self.key_file, *([self.client_ca_file] if self.client_ca_file else []))

    def _read_stamp(self) -> Stamp:
        stamps = []
        for path in self._files():
            st = os.stat(path)
            stamps.append((st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(stamps)

    def _load(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file is not None:
            try:
                context.load_verify_locations(cafile=self.client_ca_file)
            except ssl.SSLError as exc:
                raise ssl.SSLError(f"{self.client_ca_file} holds no PEM CA certificate to verify clients with "
                                   f"({exc.reason or exc})") from exc
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def context(self) -> ssl.SSLContext:
        """The newest context that loaded."""
        with self._lock:
            try:
                stamp = self._read_stamp()
            except OSError as exc:
                log.error("cannot stat the TLS files; keeping the loaded ones", error=str(exc))
                return self._context
            if stamp != self._stamp:
                try:
                    self._context = self._load()
                    self.reloads += 1
                    log.info("TLS certificate reloaded", cert=self.cert_file, client_ca=self.client_ca_file)
                except (OSError, ssl.SSLError) as exc:
                    log.error("new TLS files do not load; keeping the previous ones", error=str(exc))
                self._stamp = stamp
            return self._context

    def serving_context(self) -> ssl.SSLContext:
        """The context to hand the server once: each handshake switches to context() as it starts (the
        SNI callback runs for every ClientHello, with or without a server name)."""
        if self._serving is None:
            serving = self._load()
            serving.sni_callback = self._switch
            self._serving = serving
        return self._serving

    def _switch(self, connection: Any, _server_name: str | None, _context: ssl.SSLContext) -> None:
        connection.context = self.context()
