"""Certificates for tests, made with `cryptography`: a CA, a server certificate for
`SERVER_NAME` and 127.0.0.1, client certificates of the CA (or expired ones), each as PEM files."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVER_NAME = "temporal.tierpoint.test"


@dataclass(frozen=True)
class Pki:
    """PEM files: the CA, the server's certificate and key, a client's certificate and key."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    client_name: str


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(
    subject: str,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    server: bool = False,
    expired: bool = False,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    issuer_name, issuer_key = issuer or (_name(subject), key)
    # An expired certificate's day of validity ended yesterday.
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=2 if expired else 0)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if issuer is None:
        usage = x509.KeyUsage(False, False, False, False, False, True, True, False, False)
        builder = builder.add_extension(usage, critical=True).add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
        )
    else:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
            critical=False,
        )
        purpose = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([purpose]), critical=False)
    if server:
        names = [x509.DNSName(SERVER_NAME), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256()), key


def _write(
    directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path]:
    cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path


def make_pki(directory: Path, client_name: str = "tierpoint") -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = _issue("tierpoint test CA", None)
    server_cert, server_key = _issue(SERVER_NAME, (ca_cert.subject, ca_key), server=True)
    client_cert, client_key = _issue(client_name, (ca_cert.subject, ca_key))
    ca_path, _ = _write(directory, "ca", ca_cert, ca_key)
    server_paths = _write(directory, "server", server_cert, server_key)
    client_paths = _write(directory, "client", client_cert, client_key)
    return Pki(ca_path, *server_paths, *client_paths, client_name)


def issue_client(pki: Pki, stem: str, name: str, *, expired: bool = False) -> tuple[Path, Path]:
    """Another client certificate of `pki`'s CA (expired with `expired`): its PEM files beside
    the CA's, `<stem>.pem` and `<stem>.key`."""
    ca_cert = x509.load_pem_x509_certificate(pki.ca.read_bytes())
    ca_key = serialization.load_pem_private_key(pki.ca.with_suffix(".key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    cert, key = _issue(name, (ca_cert.subject, ca_key), expired=expired)
    return _write(pki.ca.parent, stem, cert, key)
