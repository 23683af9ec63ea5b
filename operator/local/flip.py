"""Change the role of warm workers of a local stack: SetRole on each (in parallel), then the plan and the
router's workers file say the new role, so a crashed worker restarts in the role it had and the pools
count it where it serves. The local backend's actuation of a flip (LocalPools.flip), and `tandem flip -f`."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import grpc

from tandem.identity import OPERATOR, peer_name
from tandem.operator.autoscale.core.flip import flip_waves
from tandem.operator.local.plan import local_tls_root
from tandem.spec import load_file
from tandem.v1 import common_pb2, decode_pb2_grpc, lifecycle_pb2, lifecycle_pb2_grpc, prefill_pb2_grpc

log = logging.getLogger(__name__)
K = TypeVar("K")


def with_role(argv: list[str], role: str) -> list[str]:
    """A worker's command line starting it in `role` (pure)."""
    out = list(argv)
    out[out.index("--role") + 1] = role
    return out


def fewest_running(running: Mapping[K, int | None], count: int) -> list[K]:
    """The `count` workers cheapest to flip (pure): those answering, fewest running sequences first."""
    answering = [k for k, r in running.items() if r is not None]
    return sorted(answering, key=lambda k: running[k] or 0)[: max(0, count)]


ROLE_ENUMS = {
    "prefill": common_pb2.WORKER_ROLE_PREFILL,
    "decode": common_pb2.WORKER_ROLE_DECODE,
    "colocated": common_pb2.WORKER_ROLE_COLOCATED,
}


def set_role(
    chan: grpc.Channel,
    role: str,
    reason: str = "",
    drain_timeout_s: float = 0.0,
    timeout_s: float | None = None,
) -> lifecycle_pb2.SetRoleReply:
    """One SetRole call over `chan`; grpc.RpcError as the worker answered it."""
    request = lifecycle_pb2.SetRoleRequest(
        role=ROLE_ENUMS[role], reason=reason, drain_timeout_s=drain_timeout_s
    )
    wait = timeout_s if timeout_s is not None else (drain_timeout_s or 600.0) + 10.0
    return lifecycle_pb2_grpc.LifecycleServiceStub(chan).SetRole(request, timeout=wait)


def set_roles(
    channels: Mapping[K, grpc.Channel], role: str, reason: str = "", drain_timeout_s: float = 0.0
) -> dict[K, lifecycle_pb2.SetRoleReply | grpc.RpcError]:
    """SetRole on every worker at once (each drains on its own); each one's reply or error."""
    if not channels:
        return {}

    def one(chan: grpc.Channel) -> lifecycle_pb2.SetRoleReply | grpc.RpcError:
        try:
            return set_role(chan, role, reason, drain_timeout_s)
        except grpc.RpcError as e:
            return e

    with ThreadPoolExecutor(max_workers=len(channels), thread_name_prefix="set-role") as pool:
        futures = {k: pool.submit(one, c) for k, c in channels.items()}
        out = {k: f.result() for k, f in futures.items()}
    for k, r in out.items():
        if isinstance(r, grpc.RpcError):
            log.warning("SetRole %s on %s failed: %s %s", role, k, r.code().name, r.details())  # type: ignore[attr-defined]
    return out


def dial_worker(
    address: str, role: str, service: str, tls_root: Path | None, as_role: str = OPERATOR
) -> grpc.Channel:
    """A channel to a worker of `role`: mutual TLS with the stack's certificate of `as_role` under
    `tls_root`, asking for `role`'s certificate; plaintext without a root."""
    if tls_root is None:
        return grpc.insecure_channel(address)
    d = tls_root / as_role
    creds = grpc.ssl_channel_credentials(
        (d / "ca.crt").read_bytes(), (d / "tls.key").read_bytes(), (d / "tls.crt").read_bytes()
    )
    return grpc.secure_channel(
        address, creds, options=[("grpc.ssl_target_name_override", peer_name(role, service))]
    )


def write_workers_file(path: Path, doc: dict[str, list[str]]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)  # the router never reads half a file


def moved(doc: dict[str, list[str]], addresses: Sequence[str], to_role: str) -> dict[str, list[str]]:
    """The workers document with `addresses` listed under `to_role` only (pure)."""
    out = {role: [a for a in listed if a not in addresses] for role, listed in doc.items()}
    out[to_role] = out.get(to_role, []) + [a for a in addresses if a not in out.get(to_role, [])]
    return out


def running_sequences(chan: grpc.Channel, role: str) -> int | None:
    stub = (prefill_pb2_grpc.PrefillServiceStub if role == "prefill" else decode_pb2_grpc.DecodeServiceStub)(
        chan
    )
    try:
        report = stub.Load(common_pb2.LoadRequest(), timeout=2)
    except grpc.RpcError:
        return None
    return None if report.draining else report.running_sequences + report.waiting_sequences


def flip_running_stack(
    spec_file: str,
    run_dir: str,
    from_role: str,
    to_role: str,
    count: int,
    reason: str = "tandem flip",
    dial: Callable[[str, str, str, Path | None], grpc.Channel] = dial_worker,
) -> list[tuple[str, lifecycle_pb2.SetRoleReply]]:
    """`tandem flip -f`: flip `count` workers of the `tandem up` running from `run_dir` and list them under
    their new role in its workers file; (address, reply) for each that flipped."""
    svc = load_file(spec_file)
    state = Path(run_dir)
    workers_file = state / "workers.json"
    doc = json.loads(workers_file.read_text())
    tls_root = local_tls_root(svc, Path.cwd(), state)
    channels = {a: dial(a, from_role, svc.name, tls_root) for a in doc.get(from_role, [])}
    try:
        chosen = fewest_running({a: running_sequences(c, from_role) for a, c in channels.items()}, count)
        if len(chosen) < count:
            raise ValueError(f"{len(chosen)} {from_role} workers answer, {count} asked to flip")
        listed = {a: role for role in ("prefill", "decode", "colocated") for a in doc.get(role, [])}
        if flip_waves(listed, dict.fromkeys(chosen, to_role))[1]:
            raise ValueError(
                f"flipping {count} of the {len(doc.get(from_role, []))} {from_role} workers would "
                f"leave the {from_role} pool with none"
            )
        replies = set_roles({a: channels[a] for a in chosen}, to_role, reason)
    finally:
        for c in channels.values():
            c.close()
    done = [(a, r) for a, r in replies.items() if isinstance(r, lifecycle_pb2.SetRoleReply)]
    write_workers_file(workers_file, moved(doc, [a for a, _ in done], to_role))
    return done
