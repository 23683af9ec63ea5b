"""Who a peer is on the gRPC hops: the role and service a tandem certificate names, one scheme for the
operator and `tandem up` (which issue certificates) and the workers and router (which check them).

Every certificate carries two names per role: a DNS name `<role>.<service>.tandem.internal`, which a client
asks the server's certificate for (so the router reaches only a real prefill worker of its service, a
prefill worker only a real decode worker), and a URI `spiffe://tandem.internal/service/<service>/role/<role>`,
which a server reads from the client's certificate to decide which methods it may call. The operator's own
identity has the role `operator` and no service. A worker that may change role at runtime (SetRole) holds
one certificate naming prefill, decode and colocated of its service, so it is valid for whichever it has now;
no other combination of roles, and never two services, makes an identity.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DOMAIN = "tandem.internal"
ROLES = ("router", "prefill", "decode", "colocated", "operator")
OPERATOR = "operator"
FLIPPABLE = frozenset(
    {"prefill", "decode", "colocated"}
)  # the roles one worker's certificate may name together
_URI_PREFIX = f"spiffe://{DOMAIN}/"


@dataclass(frozen=True)
class Identity:
    """`role` is the first of the certificate's roles (in ROLES order), `others` the rest (a flippable
    worker's)."""

    role: str
    service: str = ""
    others: frozenset[str] = field(default=frozenset())

    def __post_init__(self) -> None:
        every = frozenset({self.role}) | self.others
        first = min(every, key=lambda r: ROLES.index(r) if r in ROLES else len(ROLES))
        object.__setattr__(self, "role", first)  # one value however the roles were listed: equality holds
        object.__setattr__(self, "others", every - {first})

    @classmethod
    def of(cls, roles: frozenset[str] | set[str] | tuple[str, ...], service: str = "") -> Identity:
        first, *rest = sorted(roles, key=lambda r: ROLES.index(r) if r in ROLES else len(ROLES))
        return cls(first, service, frozenset(rest))

    @property
    def roles(self) -> frozenset[str]:
        return frozenset({self.role}) | self.others

    @property
    def uri(self) -> str:
        return role_uri(self.role, self.service)

    @property
    def dns(self) -> str:
        return peer_name(self.role, self.service)

    @property
    def uris(self) -> list[str]:
        return [role_uri(r, self.service) for r in sorted(self.roles, key=ROLES.index)]

    @property
    def dns_names(self) -> list[str]:
        return [peer_name(r, self.service) for r in sorted(self.roles, key=ROLES.index)]

    def describe(self) -> str:
        return "/".join(sorted(self.roles, key=ROLES.index))


def role_uri(role: str, service: str) -> str:
    if role == OPERATOR:
        return f"{_URI_PREFIX}role/{OPERATOR}"
    return f"{_URI_PREFIX}service/{service}/role/{role}"


def peer_name(role: str, service: str) -> str:
    """The DNS name a certificate of `role` in `service` carries and a client checks."""
    return f"{role}.{service}.{DOMAIN}" if role != OPERATOR else f"{OPERATOR}.{DOMAIN}"


def parse_uri(uri: str) -> Identity | None:
    """The identity a tandem URI names; None for anything else (pure)."""
    if not uri.startswith(_URI_PREFIX):
        return None
    parts = uri[len(_URI_PREFIX) :].split("/")
    if parts == ["role", OPERATOR]:
        return Identity(OPERATOR)
    if (
        len(parts) == 4
        and parts[0] == "service"
        and parts[2] == "role"
        and parts[1]
        and parts[3] in ROLES[:4]
    ):
        return Identity(parts[3], parts[1])
    return None


def from_sans(sans: list[str]) -> Identity | None:
    """The one tandem identity among a certificate's subject alternative names: one role, or the worker
    roles of one service (a worker that may flip); None when none, or any other mix (pure)."""
    found = {i for i in (parse_uri(s) for s in sans) if i is not None}
    if len(found) == 1:
        return found.pop()
    services = {i.service for i in found}
    roles = frozenset(i.role for i in found)
    if (
        len(services) == 1 and roles <= FLIPPABLE
    ):  # prefill and decode alone: a certificate issued before colocated flipped
        return Identity.of(roles, services.pop())
    return None
