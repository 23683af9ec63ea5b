"""A throwaway certificate authority and per-role certificates for mutual TLS, made with `cryptography`.

`tandem up` writes one under its run directory; the operator puts one per InferenceService into a Secret.
Each leaf names its role and service the way tandem.identity reads them; with role flips on, a prefill or
decode worker's leaf names both roles (it must be valid for whichever it has after a flip).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tandem.identity import FLIPPABLE, Identity

CERT, KEY, CA = "tls.crt", "tls.key", "ca.crt"
VALID_DAYS = 365


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass(frozen=True)
class Leaf:
    cert: bytes  # PEM
    key: bytes  # PEM
    ca: bytes  # PEM of the authority that signed it


class Authority:
    """A CA whose key lives only in memory: it signs the leaves it is asked for, then is dropped."""

    def __init__(self, cn: str, days: int = VALID_DAYS):
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        self.days = days
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name(cn))
            .issuer_name(_name(cn))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, who: Identity, hosts: tuple[str, ...] = ()) -> Leaf:
        """A leaf for `who`, usable as a server and as a client: each role's DNS name and URI, and `hosts`."""
        import ipaddress

        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in who.dns_names]
        sans += [x509.UniformResourceIdentifier(u) for u in who.uris]
        for h in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                sans.append(x509.DNSName(h))
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(who.dns))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=self.days))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        return Leaf(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key), self.pem)


def write_dir(directory: Path, leaf: Leaf) -> Path:
    """A cert-manager-style directory (tls.crt, tls.key, ca.crt), readable by its owner only."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    for name, data in ((CERT, leaf.cert), (KEY, leaf.key), (CA, leaf.ca)):
        path = directory / name
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.chmod(0o600)
        tmp.replace(path)  # atomic: a process reloading it never reads half a file
    return directory


def worker_identity(role: str, service: str, flippable: bool = False) -> Identity:
    """The identity a process of `role` holds: with role flips on, a worker's names every worker role."""
    return Identity.of(FLIPPABLE, service) if flippable and role in FLIPPABLE else Identity(role, service)


def write_local(root: Path, service: str, roles: tuple[str, ...], flippable: bool = False) -> Path:
    """`tandem up`'s throwaway PKI: `root/<role>/` for each role, and `root/operator/` (the stack's own
    identity, for drains, role flips and load reports), all signed by a CA made now whose key is not kept."""
    ca = Authority(f"tandem up {service}")
    for role in roles:
        write_dir(
            root / role, ca.issue(worker_identity(role, service, flippable), ("localhost", "127.0.0.1"))
        )
    write_dir(root / "operator", ca.issue(Identity("operator")))
    return root


def secret_data(service: str, roles: tuple[str, ...], flippable: bool = False) -> dict[str, str]:
    """The operator's per-service Secret: `ca.crt`, and `<role>.crt` / `<role>.key` for each role, from a
    CA made now whose key is not kept (a new one is issued by deleting the Secret)."""
    ca = Authority(f"tandem {service}")
    data = {CA: ca.pem.decode()}
    for role in roles:
        leaf = ca.issue(worker_identity(role, service, flippable))
        data[f"{role}.crt"], data[f"{role}.key"] = leaf.cert.decode(), leaf.key.decode()
    return data
