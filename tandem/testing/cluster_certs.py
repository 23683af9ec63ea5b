"""The test control plane's certificates: its CA, the API server's serving certificate and the
service-account signing keys (the cryptography package when installed, else the openssl command)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import subprocess
from pathlib import Path

FIRST_SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service's address in the control plane's Service range


def write_certs(d: Path, loopback: str, extra_ip: str | None = None) -> None:
    """A CA, the API server's serving certificate (for its Service names, `loopback`, the first Service IP and
    `extra_ip`), and the service-account key pair."""
    try:
        import cryptography  # noqa: F401
    except ImportError:
        _write_certs_openssl(d, loopback, extra_ip)
        return
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    def key():
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def pem_key(k):
        return k.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )

    now = dt.datetime.now(dt.UTC)
    ca_key = key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tandem-test-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    srv_key = key()
    sans: list[x509.GeneralName] = [
        x509.DNSName(n) for n in ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
    ]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in (loopback, FIRST_SERVICE_IP, extra_ip) if ip]
    srv = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(srv_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (d / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (d / "ca.key").write_bytes(pem_key(ca_key))
    (d / "apiserver.crt").write_bytes(srv.public_bytes(serialization.Encoding.PEM))
    (d / "apiserver.key").write_bytes(pem_key(srv_key))
    sa = key()
    (d / "sa.key").write_bytes(pem_key(sa))
    (d / "sa.pub").write_bytes(
        sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _write_certs_openssl(d: Path, loopback: str, extra_ip: str | None) -> None:
    """The same files through the openssl command, for environments without the cryptography package."""
    ips = ",".join(f"IP:{ip}" for ip in (loopback, FIRST_SERVICE_IP, extra_ip) if ip)
    sans = f"DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,{ips}"
    (d / "san.ext").write_text(f"subjectAltName={sans}\n")
    for cmd in (
        [
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=tandem-test-ca",
        ],
        [
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "apiserver.key",
            "-out",
            "apiserver.csr",
            "-subj",
            "/CN=kube-apiserver",
        ],
        [
            "x509",
            "-req",
            "-in",
            "apiserver.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "apiserver.crt",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ],
        ["genrsa", "-out", "sa.key", "2048"],
        ["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"],
    ):
        subprocess.run(["openssl", *cmd], cwd=d, check=True, capture_output=True)
