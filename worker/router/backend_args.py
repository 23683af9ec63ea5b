"""`tandem router` arguments into the gRPC backend: worker addresses, TLS, conditional disaggregation and
the wake queue's bounds."""

from __future__ import annotations

from tandem.worker.api.tls import TlsConfig
from tandem.worker.router.disaggregation import DisaggregationPolicy
from tandem.worker.router.dispatch import GrpcBackend
from tandem.worker.router.wake_queue import WakeLimits


def build_backend(args) -> GrpcBackend:
    """From `tandem router` arguments."""

    def split(value: str | list[str] | None) -> list[str]:
        if isinstance(value, list):
            return value
        return [a for a in (value or "").split(",") if a]

    addresses = {
        "prefill": split(args.prefill),
        "decode": split(args.decode),
        "colocated": split(args.colocated),
    }
    tls = TlsConfig.optional(getattr(args, "tls_dir", None), service=getattr(args, "service", ""))
    defaults = DisaggregationPolicy()
    policy = DisaggregationPolicy(
        mode=getattr(args, "disaggregation", defaults.mode),
        local_prefill_max_tokens=getattr(args, "local_prefill_max_tokens", defaults.local_prefill_max_tokens),
        prefill_queue_tokens=getattr(args, "prefill_queue_tokens", defaults.prefill_queue_tokens),
        local_prefill_max_tpot_fraction=getattr(
            args, "local_prefill_max_tpot_fraction", defaults.local_prefill_max_tpot_fraction
        ),
        mixed_decode_ratio=getattr(args, "mixed_decode_ratio", defaults.mixed_decode_ratio),
    )
    wake = WakeLimits(
        getattr(args, "max_held", WakeLimits.max_requests),
        getattr(args, "hold_timeout", WakeLimits.timeout_s),
    )
    return GrpcBackend(
        args.mode,
        addresses,
        getattr(args, "workers_file", None),
        lease_ms=args.kv_lease_ms,
        tls=tls,
        disaggregation=policy,
        tpot_slo_s=getattr(args, "slo_tpot_ms", 0.0) / 1000,
        wake=wake,
    )
