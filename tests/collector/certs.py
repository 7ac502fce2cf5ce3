"""Throwaway certificates for TLS tests (made at test time with ``cryptography``)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject: str, key, issuer: str, issuer_key, *, ca: bool, server: bool = False):
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(hours=1))
               .not_valid_after(now + dt.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(folder: Path, name: str, cert, key) -> tuple[Path, Path]:
    cert_path, key_path = folder / f"{name}.crt", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return cert_path, key_path


def make_pki(folder: Path) -> dict[str, Path]:
    """A CA, a server cert for 127.0.0.1, a client cert, and an unrelated CA."""
    folder.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("fleetlens test CA", ca_key, "fleetlens test CA", ca_key, ca=True)
    paths["ca"], _ = _write(folder, "ca", ca, ca_key)
    other_key = ec.generate_private_key(ec.SECP256R1())
    other = _cert("other CA", other_key, "other CA", other_key, ca=True)
    paths["other_ca"], _ = _write(folder, "other-ca", other, other_key)
    for name, server in (("server", True), ("client", False)):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert(name, key, "fleetlens test CA", ca_key, ca=False, server=server)
        paths[f"{name}_cert"], paths[f"{name}_key"] = _write(folder, name, cert, key)
    return paths
