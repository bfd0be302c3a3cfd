"""TLS material for a SuperLink: the file layout `fedhet flower deploy --tls-dir` expects, and self-signed
certificates for trying it out on one machine.

    DIR/ca.crt       the CA certificate (PEM) SuperNodes and `flwr` verify the SuperLink with
    DIR/server.pem   the SuperLink's certificate (PEM), signed by the CA, valid for the SuperLink's address
    DIR/server.key   its private key (PEM)

For real deployments use certificates from your own CA; `make_self_signed` is for 127.0.0.1 / localhost.
It uses `cryptography`, which Flower itself depends on.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from fedhet.errors import FedhetError

CA, CERT, KEY = "ca.crt", "server.pem", "server.key"


@dataclass(frozen=True)
class TlsFiles:
    """Paths of a SuperLink's TLS material."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def in_dir(cls, folder: str | Path) -> TlsFiles:
        folder = Path(folder).resolve()
        files = cls(folder / CA, folder / CERT, folder / KEY)
        missing = [p.name for p in (files.ca, files.cert, files.key) if not p.is_file()]
        if missing:
            raise FedhetError(f"TLS folder {folder} lacks {', '.join(missing)} (expected {CA}, {CERT}, {KEY}); "
                              "create self-signed ones with fedhet.runtimes.flower.tls.make_self_signed")
        return files


def make_self_signed(folder: str | Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
                     days: int = 30) -> TlsFiles:
    """Write a new CA and a server certificate for `hosts` (IP addresses or DNS names) signed by it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedhet test CA")])
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False, data_encipherment=False,
                                            key_agreement=False, encipher_only=False, decipher_only=False),
                              critical=True)
               .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    files = TlsFiles(folder / CA, folder / CERT, folder / KEY)
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption()))
    files.key.chmod(0o600)
    return files
