"""Who a peer is on the gRPC hops: the role and service a tandem certificate names, one scheme for the
operator and `tandem up` (which issue certificates) and the workers and router (which check them).

Every certificate carries two names: a DNS name `<role>.<service>.tandem.internal`, which a client asks the
server's certificate for (so the router reaches only a real prefill worker of its service, a prefill worker
only a real decode worker), and a URI `spiffe://tandem.internal/service/<service>/role/<role>`, which a
server reads from the client's certificate to decide which methods it may call. The operator's own
identity has the role `operator` and no service.
"""

from __future__ import annotations

from dataclasses import dataclass

DOMAIN = "tandem.internal"
ROLES = ("router", "prefill", "decode", "colocated", "operator")
OPERATOR = "operator"
_URI_PREFIX = f"spiffe://{DOMAIN}/"


@dataclass(frozen=True)
class Identity:
    role: str
    service: str = ""

    @property
    def uri(self) -> str:
        if self.role == OPERATOR:
            return f"{_URI_PREFIX}role/{OPERATOR}"
        return f"{_URI_PREFIX}service/{self.service}/role/{self.role}"

    @property
    def dns(self) -> str:
        return peer_name(self.role, self.service)


def peer_name(role: str, service: str) -> str:
    """The DNS name a certificate of `role` in `service` carries and a client checks."""
    return f"{role}.{service}.{DOMAIN}" if role != OPERATOR else f"{OPERATOR}.{DOMAIN}"


def parse_uri(uri: str) -> Identity | None:
    """The identity a tandem URI names; None for anything else (pure)."""
    if not uri.startswith(_URI_PREFIX):
        return None
    parts = uri[len(_URI_PREFIX):].split("/")
    if parts == ["role", OPERATOR]:
        return Identity(OPERATOR)
    if len(parts) == 4 and parts[0] == "service" and parts[2] == "role" and parts[1] and parts[3] in ROLES[:4]:
        return Identity(parts[3], parts[1])
    return None


def from_sans(sans: list[str]) -> Identity | None:
    """The one tandem identity among a certificate's subject alternative names; None when none or several."""
    found = {i for i in (parse_uri(s) for s in sans) if i is not None}
    return found.pop() if len(found) == 1 else None
