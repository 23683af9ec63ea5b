"""Mutual TLS for every gRPC hop (router to workers, prefill to decode), torch-free so the router shares it.

Certificates are cert-manager style files in one directory: `tls.crt` (this process's chain), `tls.key`
and `ca.crt` (the CA every peer's certificate must chain to). Servers require a client certificate from
that CA; clients check the server's against it and, knowing their service, ask it for the name of the role
they mean to reach (tandem.identity), so a certificate of another role or service is refused at the
handshake. Without a directory everything stays plaintext (the spec's `security.tls.mode: off`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from tandem.identity import Identity, from_sans, peer_name

CERT, KEY, CA = "tls.crt", "tls.key", "ca.crt"
# A peer that refused a connection (still starting, or restarted on its address) is redialled within a second.
# gRPC's default backoff grows to minutes: a worker that took 28 s to start was not reached for 15 s more.
RECONNECT_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


@dataclass(frozen=True)
class TlsConfig:
    """This process's certificate, key and the peers' CA (PEM bytes), its service, and the name clients
    expect in a server's certificate (workers are dialled by pod IP, which no certificate names)."""

    cert: bytes
    key: bytes
    ca: bytes
    server_name: str | None = None
    service: str = ""
    directory: Path | None = None  # where the files were read, to read them again when they are renewed

    @classmethod
    def from_dir(cls, directory: str | Path, server_name: str | None = None, service: str = "") -> TlsConfig:
        d = Path(directory)
        missing = [n for n in (CERT, KEY, CA) if not (d / n).is_file()]
        if missing:
            raise FileNotFoundError(f"TLS directory {d} lacks {', '.join(missing)}")
        return cls(
            (d / CERT).read_bytes(),
            (d / KEY).read_bytes(),
            (d / CA).read_bytes(),
            server_name or None,
            service,
            d,
        )

    @classmethod
    def optional(
        cls, directory: str | None, server_name: str | None = None, service: str = ""
    ) -> TlsConfig | None:
        return cls.from_dir(directory, server_name, service) if directory else None

    def identity(self) -> Identity | None:
        """The tandem identity this process's own certificate names (tandem.identity), if any."""
        from cryptography import x509

        cert = x509.load_pem_x509_certificate(self.cert)
        try:
            sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            return None
        return from_sans(sans.get_values_for_type(x509.UniformResourceIdentifier))

    def to(self, role: str) -> TlsConfig:
        """The same credentials, asking the server for the certificate of `role` in this service."""
        return dataclasses.replace(self, server_name=peer_name(role, self.service))

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.ca, require_client_auth=True
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )

    def channel_options(self) -> list[tuple[str, Any]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def add_port(
    server: grpc.Server | aio.Server, address: str, tls: TlsConfig | None, tls_dir: str | None = None
) -> int:
    """Listen on `address`, with mutual TLS when `tls` is given; with `tls_dir` (a synchronous server), the
    files there are read again when they change (cert-manager renews them in place), for new connections."""
    if tls is None:
        return server.add_insecure_port(address)
    if tls_dir is None:
        return server.add_secure_port(address, tls.server_credentials())
    reloader = CertReloader(Path(tls_dir))
    creds = grpc.dynamic_ssl_server_credentials(
        reloader.initial(tls), reloader.fetch, require_client_authentication=True
    )
    return server.add_secure_port(address, creds)


class CertReloader:
    """Serves gRPC core's per-handshake question "has the certificate changed?" from the files' mtimes: a
    new configuration once all three files are readable after a change, None (keep the current) otherwise."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.stamp = self._stamp()
        self.reloads = 0

    def _stamp(self) -> tuple[int, ...]:
        return _stamp(self.directory)

    @staticmethod
    def initial(tls: TlsConfig) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration([(tls.key, tls.cert)], root_certificates=tls.ca)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        stamp = self._stamp()
        if not stamp or stamp == self.stamp:
            return None
        try:
            fresh = TlsConfig.from_dir(self.directory)
        except OSError:
            return None
        self.stamp, self.reloads = stamp, self.reloads + 1
        return self.initial(fresh)


def _stamp(directory: Path) -> tuple[int, ...]:
    """The three files' modification times; () while one is missing (a renewal half written)."""
    try:
        return tuple((directory / n).stat().st_mtime_ns for n in (CERT, KEY, CA))
    except OSError:
        return ()


class ClientCertWatch:
    """The client side of a renewal: gRPC's channel credentials are fixed when a channel is made, so a
    client asks `renewed()` (at most once per `every_s`) and, given a fresh configuration, makes new
    channels for new calls while the calls already open finish on the old ones."""

    def __init__(self, tls: TlsConfig | None, every_s: float = 1.0) -> None:
        self.tls = tls
        self.every_s = every_s
        self.stamp = _stamp(tls.directory) if tls and tls.directory else ()
        self.next_look = 0.0
        self.reloads = 0

    def renewed(self, now: float | None = None) -> TlsConfig | None:
        """The configuration read again when the files changed since the last look, else None."""
        if self.tls is None or self.tls.directory is None:
            return None
        now = time.monotonic() if now is None else now
        if now < self.next_look:
            return None
        self.next_look = now + self.every_s
        stamp = _stamp(self.tls.directory)
        if not stamp or stamp == self.stamp:
            return None
        try:
            fresh = TlsConfig.from_dir(self.tls.directory, self.tls.server_name, self.tls.service)
        except OSError:
            return None
        self.tls, self.stamp, self.reloads = fresh, stamp, self.reloads + 1
        return fresh


def _options(tls: TlsConfig | None, options: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    return [*RECONNECT_OPTIONS, *options, *(tls.channel_options() if tls else [])]


def channel(address: str, tls: TlsConfig | None, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(address, options=_options(tls, options))
    return grpc.secure_channel(address, tls.channel_credentials(), options=_options(tls, options))


def aio_channel(address: str, tls: TlsConfig | None, options: Sequence[tuple[str, Any]] = ()) -> aio.Channel:
    if tls is None:
        return aio.insecure_channel(address, options=_options(tls, options))
    return aio.secure_channel(address, tls.channel_credentials(), options=_options(tls, options))
