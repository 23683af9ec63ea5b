"""Which peer may call which method of a worker, from the role its certificate names (tandem.identity).

Mutual TLS proves a caller holds a certificate of the service's CA; this decides what each role may do: only
the router starts work (Prefill, Reserve, StreamTokens, Generate, Abort), only a prefill worker pushes KV
(PushKv, whose last frame commits), and Drain and SetRole come from the operator or from the worker's own pod
over loopback (the preStop hook). A caller whose certificate names several roles (a worker that may flip names
prefill and decode) may call what any of them may. Anything else, and any method this table does not name, is
refused with PERMISSION_DENIED before the servicer runs. Plaintext workers (`security.tls.mode: off`) have no
identities to check and run without it.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from tandem.identity import OPERATOR, Identity, from_sans

log = logging.getLogger(__name__)

ROUTER, PREFILL = frozenset({"router"}), frozenset({"prefill"})
PEERS = frozenset({"router", "prefill", "decode", "colocated", OPERATOR})  # any identity of the service
SELF = "self"  # the worker's own role, calling from its own pod (loopback)

CALLERS: dict[str, frozenset[str]] = {
    "/tandem.v1.PrefillService/Prefill": ROUTER,
    "/tandem.v1.PrefillService/Generate": ROUTER,
    "/tandem.v1.DecodeService/Reserve": ROUTER,
    "/tandem.v1.DecodeService/StreamTokens": ROUTER,
    "/tandem.v1.DecodeService/Generate": ROUTER,
    "/tandem.v1.DecodeService/Abort": ROUTER,
    "/tandem.v1.DecodeService/PushKv": PREFILL,
    "/tandem.v1.ColocatedService/Generate": ROUTER,
    "/tandem.v1.ColocatedService/Abort": ROUTER,
    "/tandem.v1.LifecycleService/Drain": frozenset({OPERATOR, SELF}),
    "/tandem.v1.LifecycleService/SetRole": frozenset({OPERATOR, SELF}),
    **{
        f"/tandem.v1.{s}/{m}": PEERS
        for s in ("PrefillService", "DecodeService", "ColocatedService")
        for m in ("Handshake", "Load")
    },
    "/grpc.health.v1.Health/Check": PEERS,
    "/grpc.health.v1.Health/Watch": PEERS,
}


def is_loopback(peer: str) -> bool:
    """Whether a gRPC peer string (`ipv4:127.0.0.1:5000`, `ipv6:[::1]:5000`) is this host's loopback."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        host = rest.rsplit(":", 1)[0]
    elif kind == "ipv6":
        host = rest.rsplit(":", 1)[0].strip("[]")
    else:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def allowed(method: str, caller: Identity | None, me: Identity, loopback: bool) -> bool:
    """Whether `caller` may call `method` on the worker `me` (pure)."""
    roles = CALLERS.get(method)
    if caller is None or roles is None:
        return False
    if caller.role == OPERATOR:
        return OPERATOR in roles or roles is PEERS
    if caller.service != me.service:
        return False
    if caller.roles & roles:
        return True
    return SELF in roles and loopback and caller.roles == me.roles


def caller_identity(context: grpc.ServicerContext) -> Identity | None:
    sans = [v.decode(errors="replace") for v in context.auth_context().get("peer_uri", [])]
    return from_sans(sans)


class Authorizer(grpc.ServerInterceptor):
    """Refuses, with PERMISSION_DENIED, every call the caller's role may not make on this worker."""

    def __init__(self, me: Identity) -> None:
        self.me = me

    def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        method = details.method

        def check(context: grpc.ServicerContext) -> None:
            caller = caller_identity(context)
            if not allowed(method, caller, self.me, is_loopback(context.peer())):
                who = (
                    f"{caller.describe()} of {caller.service or 'the cluster'}"
                    if caller
                    else "a caller without a tandem identity"
                )
                log.warning("refused %r from %s (%r)", method, who, context.peer())
                context.abort(
                    grpc.StatusCode.PERMISSION_DENIED, f"{who} may not call {method.rsplit('/', 1)[-1]}"
                )

        return checked(handler, check)


def checked(handler: Any, check: Callable[[grpc.ServicerContext], None]) -> Any:
    """`handler` with `check(context)` run before its behaviour, whatever its kind."""
    if handler.unary_unary is not None:
        uu = handler.unary_unary

        def unary_unary(request: Any, context: grpc.ServicerContext) -> Any:
            check(context)
            return uu(request, context)

        return handler._replace(unary_unary=unary_unary)
    if handler.unary_stream is not None:
        us = handler.unary_stream

        def unary_stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            check(context)
            yield from us(request, context)

        return handler._replace(unary_stream=unary_stream)
    if handler.stream_unary is not None:
        su = handler.stream_unary

        def stream_unary(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            check(context)
            return su(requests, context)

        return handler._replace(stream_unary=stream_unary)
    ss = handler.stream_stream

    def stream_stream(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        check(context)
        yield from ss(requests, context)

    return handler._replace(stream_stream=stream_stream)
