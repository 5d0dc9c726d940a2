"""A throw-away CA for the e2e apiserver's serving certificate and tessera's webhook."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Pki:
    """A throw-away CA for the apiserver's serving cert and tessera's webhook."""

    ca_key: ec.EllipticCurvePrivateKey
    ca_cert: x509.Certificate

    @classmethod
    def create(cls) -> Pki:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tessera-e2e-ca")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    @property
    def ca_pem(self) -> bytes:
        return self.ca_cert.public_bytes(serialization.Encoding.PEM)

    def issue_server(self, common_name: str, dir_: Path, *, ips: tuple[str, ...] = (),
                     names: tuple[str, ...] = ()) -> tuple[Path, Path]:
        """A serving cert for 127.0.0.1/localhost (and `ips`, `names`) signed by the CA; returns (cert, key) paths."""
        import ipaddress

        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in ("localhost", *names)]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", *ips)]
        return self._issue(common_name, (), dir_, x509.oid.ExtendedKeyUsageOID.SERVER_AUTH, sans)

    def issue_client(self, common_name: str, groups: tuple[str, ...], dir_: Path) -> tuple[Path, Path]:
        """A client cert (user `common_name`, `groups` as organizations) signed by the CA; (cert, key) paths."""
        return self._issue(common_name, groups, dir_, x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH, [])

    def _issue(self, common_name: str, groups: tuple[str, ...], dir_: Path, usage: x509.ObjectIdentifier,
               sans: list[x509.GeneralName]) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
                            + [x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.ca_key, hashes.SHA256())
        dir_.mkdir(parents=True, exist_ok=True)
        cert_path, key_path = dir_ / f"{common_name}.crt", dir_ / f"{common_name}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        key_path.chmod(0o600)
        return cert_path, key_path


def write_service_account_key(path: Path) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))
    path.chmod(0o600)
