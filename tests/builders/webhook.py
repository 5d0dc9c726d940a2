"""A throwaway certificate authority and an HTTPS client for the webhook server on a real socket."""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import os
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from controller.webhook import WebhookServer


class CA:
    """A throwaway certificate authority that signs server certificates for 127.0.0.1."""

    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tessera test CA")])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name).issuer_name(name).public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )

    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, cert_path: Path, key_path: Path, common_name: str = "tessera-webhook") -> int:
        """Write a server cert/key pair atomically (new inode, as a Secret update does); returns its serial."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        serial = x509.random_serial_number()
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.cert.subject).public_key(key.public_key()).serial_number(serial)
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(self.key, hashes.SHA256())
        )
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        for path, data in ((key_path, key_pem), (cert_path, cert.public_bytes(serialization.Encoding.PEM))):
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return serial


def client_context(ca: CA, **versions) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=ca.pem().decode())
    for attr, value in versions.items():
        setattr(ctx, attr, value)
    return ctx


def connect(server: WebhookServer, ca: CA, **versions) -> http.client.HTTPSConnection:
    return http.client.HTTPSConnection("127.0.0.1", server.port, context=client_context(ca, **versions), timeout=10)


def admission_review(obj: dict) -> dict:
    return {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "6a1c1f8e-0000-4000-8000-00000000beef",
                    "kind": {"group": "resource.k8s.io", "version": "v1", "kind": obj["kind"]},
                    "operation": "CREATE", "name": obj["metadata"]["name"], "object": obj},
    }


def post(conn: http.client.HTTPSConnection, path: str, body: bytes) -> tuple[int, bytes]:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, response.read()


def issue_client(ca: CA, cert_path: Path, key_path: Path, common_name: str = "kube-apiserver") -> None:
    """A client certificate (clientAuth) signed by `ca`, as the apiserver presents to webhooks."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
