"""Every attack of the security review, tried for real, as one table: attack / expected / observed.

Against a live `tandem up` stack (real router and worker processes, mutual TLS on by default) it tries
the worker ports without a certificate, with another CA's, each role calling what it must not, a prefill
worker told to dial a target of the caller's choosing, and the router's public port; against a real
control plane with the chart's objects (bench/_security_cluster.py) the tenant escapes and the operator's
own reach. Exit status 1 when any observation differs from what is expected.

    python -m bench.security [--no-cluster]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx

from bench._smoke import add_smoke, smoke_sizes
from bench._stacks import SERVED_NAME, ModelShape, make_model, running_stacks, service_object
from tandem.identity import Identity, peer_name
from tandem.operator.certs import Authority, write_dir
from tandem.v1 import (
    common_pb2,
    decode_pb2,
    decode_pb2_grpc,
    lifecycle_pb2,
    lifecycle_pb2_grpc,
    prefill_pb2,
    prefill_pb2_grpc,
)

SERVICE = "sec"


@dataclass(frozen=True)
class Row:
    attack: str
    expected: str
    observed: str

    @property
    def ok(self) -> bool:
        return self.observed == self.expected


def grpc_outcome(call: Callable[[], object]) -> str:
    """What a gRPC call came to: `answered`, or the status code's name."""
    try:
        call()
    except grpc.RpcError as e:
        return e.code().name  # type: ignore[attr-defined]
    return "answered"


class Dialer:
    """Channels to the stack's workers with one of its roles' certificates, or none, or a stranger's."""

    def __init__(self, certs: Path, stranger: Path) -> None:
        self.certs, self.stranger = certs, stranger

    def __call__(
        self, address: str, to_role: str, as_role: str | None, *, ca_of: str = "router"
    ) -> grpc.Channel:
        name = [("grpc.ssl_target_name_override", peer_name(to_role, SERVICE))]
        ca = (self.certs / ca_of / "ca.crt").read_bytes()
        if as_role is None:
            return grpc.secure_channel(address, grpc.ssl_channel_credentials(ca), name)
        d = self.stranger if as_role == "stranger" else self.certs / as_role
        creds = grpc.ssl_channel_credentials(ca, (d / "tls.key").read_bytes(), (d / "tls.crt").read_bytes())
        return grpc.secure_channel(address, creds, name)


def worker_rows(workers: dict[str, str], dial: Dialer) -> list[Row]:
    prefill, decode = workers["prefill"], workers["decode"]
    load = common_pb2.LoadRequest()
    rows = []

    def call(address: str, to_role: str, as_role: str | None, rpc: Callable[[grpc.Channel], object]) -> str:
        with dial(address, to_role, as_role) as ch:
            return grpc_outcome(lambda: rpc(ch))

    with grpc.insecure_channel(decode) as ch:
        rows.append(
            Row(
                "plaintext client reads a decode worker's load",
                "UNAVAILABLE",
                grpc_outcome(lambda: decode_pb2_grpc.DecodeServiceStub(ch).Load(load, timeout=5)),
            )
        )
    rows.append(
        Row(
            "TLS client without a certificate reads a decode worker's load",
            "UNAVAILABLE",
            call(
                decode, "decode", None, lambda ch: decode_pb2_grpc.DecodeServiceStub(ch).Load(load, timeout=5)
            ),
        )
    )
    rows.append(
        Row(
            "client certificate from another CA (role router) reads load",
            "UNAVAILABLE",
            call(
                decode,
                "decode",
                "stranger",
                lambda ch: decode_pb2_grpc.DecodeServiceStub(ch).Load(load, timeout=5),
            ),
        )
    )
    rows.append(
        Row(
            "router dials a prefill worker as if it were decode (role impersonation)",
            "UNAVAILABLE",
            call(
                prefill,
                "decode",
                "router",
                lambda ch: decode_pb2_grpc.DecodeServiceStub(ch).Load(load, timeout=5),
            ),
        )
    )
    reserve = decode_pb2.ReserveRequest(request_id="x", transfer_id="t", prompt_token_ids=[11, 12, 13])
    for who in ("prefill", "decode"):
        rows.append(
            Row(
                f"{who} certificate reserves KV on a decode worker (router only)",
                "PERMISSION_DENIED",
                call(
                    decode,
                    "decode",
                    who,
                    lambda ch: decode_pb2_grpc.DecodeServiceStub(ch).Reserve(reserve, timeout=5),
                ),
            )
        )
        rows.append(
            Row(
                f"{who} certificate reads another request's token stream",
                "PERMISSION_DENIED",
                call(
                    decode,
                    "decode",
                    who,
                    lambda ch: next(
                        decode_pb2_grpc.DecodeServiceStub(ch).StreamTokens(
                            decode_pb2.StreamTokensRequest(request_id="x"), timeout=5
                        )
                    ),
                ),
            )
        )
    for who in ("router", "decode"):
        rows.append(
            Row(
                f"{who} certificate pushes KV into a decode worker (prefill only)",
                "PERMISSION_DENIED",
                call(
                    decode,
                    "decode",
                    who,
                    lambda ch: ch.stream_unary(
                        "/tandem.v1.DecodeService/PushKv",
                        request_serializer=bytes,
                        response_deserializer=bytes,
                    )(iter([b""]), timeout=5),
                ),
            )
        )
    prefill_request = prefill_pb2.PrefillRequest(
        request_id="x", prompt_token_ids=[11, 12, 13], decode_address=decode
    )
    rows.append(
        Row(
            "decode certificate asks a prefill worker for a prefill (router only)",
            "PERMISSION_DENIED",
            call(
                prefill,
                "prefill",
                "decode",
                lambda ch: prefill_pb2_grpc.PrefillServiceStub(ch).Prefill(prefill_request, timeout=5),
            ),
        )
    )
    for who in ("router", "prefill"):
        rows.append(
            Row(
                f"{who} certificate drains a decode worker (operator or the pod itself only)",
                "PERMISSION_DENIED",
                call(
                    decode,
                    "decode",
                    who,
                    lambda ch: lifecycle_pb2_grpc.LifecycleServiceStub(ch).Drain(
                        lifecycle_pb2.DrainRequest(), timeout=5
                    ),
                ),
            )
        )
    for target in ("unix:/var/run/docker.sock", "169.254.169.254:80"):
        bad = prefill_pb2.PrefillRequest(
            request_id=f"t-{target[:4]}", prompt_token_ids=[11, 12, 13], decode_address=target
        )
        rows.append(
            Row(
                f"router has the prefill worker push KV to {target}",
                "INVALID_ARGUMENT",
                call(
                    prefill,
                    "prefill",
                    "router",
                    lambda ch, bad=bad: prefill_pb2_grpc.PrefillServiceStub(ch).Prefill(bad, timeout=10),
                ),
            )
        )
    return rows


def router_rows(url: str, workers: dict[str, str], vocab: int) -> list[Row]:
    rows = [kubernetes_router_row()]
    with httpx.Client(base_url=url, timeout=60) as c:
        # `tandem up` binds loopback and gives the router no metrics port of its own: /metrics is on its port
        rows.append(
            Row(
                "GET /metrics on a `tandem up` router (loopback, one port by design)",
                "200",
                str(c.get("/metrics").status_code),
            )
        )
        for path in ("/docs", "/openapi.json"):
            rows.append(Row(f"GET {path} on the router's public port", "404", str(c.get(path).status_code)))
        r = c.post("/v1/completions", json={"model": SERVED_NAME, "prompt": [11, 12, 13], "max_tokens": 2})
        leaked = [
            a for a in workers.values() if any(a in v or a.rsplit(":", 1)[1] in v for v in r.headers.values())
        ]
        rows.append(Row("response headers name a worker's address", "none", ", ".join(leaked) or "none"))
        r = c.post("/v1/completions", json={"model": SERVED_NAME, "prompt": [vocab + 5], "max_tokens": 2})
        rows.append(Row("prompt token id outside the vocabulary", "400", str(r.status_code)))
    return rows


def kubernetes_router_row() -> Row:
    """What the operator renders for a router in Kubernetes: /metrics on the metrics port, not the API's."""
    from tandem.operator.manifests import render
    from tandem.spec import InferenceServiceSpec

    spec = InferenceServiceSpec.model_validate({"model": {"source": {"path": "/m"}, "servedName": "m"}})
    (container,) = render.router_deployment(spec, SERVICE, "ns", "uid")["spec"]["template"]["spec"][
        "containers"
    ]
    argv = container.get("args", [])
    public = "--public-metrics" in argv or not any(a.startswith("--metrics-port") for a in argv)
    return Row("a Kubernetes router serves /metrics on its public port", "no", "yes" if public else "no")


def stack_rows(work: Path) -> list[Row]:
    model = make_model(work / "model", ModelShape(hidden=128, layers=2))
    vocab = int(__import__("json").loads((model / "config.json").read_text())["vocab_size"])
    stranger = write_dir(work / "stranger", Authority("someone else's CA").issue(Identity("router", SERVICE)))
    obj = service_object(SERVICE, model, mode="disaggregated", num_kv_blocks=128)
    with running_stacks({SERVICE: obj}, work / "state") as running:
        stack, url = running[SERVICE]
        workers = {p.role: p.address for p in stack.plans if p.role in ("prefill", "decode")}
        dial = Dialer(work / "state" / SERVICE / "tls", stranger)
        return worker_rows(workers, dial) + router_rows(url, workers, vocab)


def print_table(rows: list[Row]) -> None:
    print("| attack | expected | observed | |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r.attack} | {r.expected} | {r.observed} | {'ok' if r.ok else 'DIFFERS'} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.security", description=__doc__.splitlines()[0])
    p.add_argument("--no-cluster", action="store_true", help="skip the control-plane attacks")
    add_smoke(p)
    args = smoke_sizes(p.parse_args(argv), no_cluster=True)  # bench.operator's smoke runs the control plane
    with tempfile.TemporaryDirectory(prefix="tandem-security-") as tmp:
        rows = stack_rows(Path(tmp))
        if not args.no_cluster:
            from bench._security_cluster import cluster_rows

            rows += cluster_rows(Path(tmp) / "cluster")
    print_table(rows)
    differs = [r for r in rows if not r.ok]
    print(f"\n{len(rows) - len(differs)}/{len(rows)} as expected")
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
