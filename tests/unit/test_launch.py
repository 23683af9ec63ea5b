"""Every engine and kvTransfer field of a spec reaches the process that uses it, through the real parsers."""

from __future__ import annotations

import pytest

from tandem import launch
from tandem.spec import InferenceServiceSpec
from tandem.v1 import common_pb2 as C
from tandem.worker.router.backend_args import build_backend
from tandem.worker.router.main import build_parser, check_args
from tandem.worker.serve.main import parse_args
from tandem.worker.serve.wire import offered_transports

ENGINE = {
    "blockSize": 32,
    "kvCacheMemoryPercent": 70,
    "maxRunningSequences": 12,
    "maxBatchTokens": 1024,
    "prefillChunkTokens": 256,
    "threads": 3,
}


def _spec(engine: dict | None = None, kv: dict | None = None) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate(
        {
            "model": {"source": {"path": "/m"}, "servedName": "tiny", "maxContextLength": 1500},
            "engine": {**ENGINE, **(engine or {})},
            "kvTransfer": {"transport": "shm", "compression": "int8", "leaseMs": 4500, **(kv or {})},
        }
    )


def test_engine_and_kv_transfer_fields_reach_the_worker():
    args = parse_args(launch.worker_argv(_spec(), "svc", "decode", "/m")[1:])
    got = (
        args.block_size,
        args.kv_cache_memory_percent,
        args.num_kv_blocks,
        args.max_running_sequences,
        args.max_batch_tokens,
        args.prefill_chunk_tokens,
        args.threads,
        args.max_model_len,
        args.kv_compression,
        args.kv_transport,
    )
    assert got == (32, 70, None, 12, 1024, 256, 3, 1500, "int8", "shm")


def test_num_kv_blocks_overrides_the_memory_share():
    args = parse_args(
        launch.worker_argv(_spec({"numKvBlocks": 640}, {"transport": "grpc"}), "s", "prefill", "/m")[1:]
    )
    assert (args.num_kv_blocks, args.kv_transport) == (640, "grpc")


def test_lease_reaches_the_router_backend():
    args = build_parser().parse_args(
        launch.router_argv(_spec(), "svc", "/m", workers={"prefill": ["a:1"], "decode": ["b:2"]})[1:]
    )
    assert check_args(args) is None
    assert build_backend(args).lease_ms == 4500
    default = build_parser().parse_args(launch.router_argv(_spec(kv={"leaseMs": 30000}), "svc", "/m")[1:])
    assert build_backend(default).lease_ms == 30000


@pytest.mark.parametrize(
    "transport, device, offered",
    [
        ("auto", "cpu", [C.KV_TRANSPORT_SHM, C.KV_TRANSPORT_GRPC]),
        (
            "auto",
            "cuda:0",
            [C.KV_TRANSPORT_CUDA_IPC, C.KV_TRANSPORT_GRPC],
        ),  # shared memory rings are host memory
        ("grpc", "cpu", [C.KV_TRANSPORT_GRPC]),
        ("shm", "cpu", [C.KV_TRANSPORT_SHM]),
    ],
)
def test_offered_transports(transport, device, offered):
    assert offered_transports(transport, device) == offered


def test_forced_shm_with_a_gpu_cache_is_refused():
    with pytest.raises(ValueError, match="CPU"):
        offered_transports("shm", "cuda:0")


def test_disaggregation_reaches_the_rendered_router_and_the_local_one():
    """router.disaggregation travels spec -> router_argv -> `tandem router`'s parser -> the backend's policy,
    in the operator's router Deployment and in `tandem up`'s router process alike."""
    from pathlib import Path

    from tandem.operator.local.plan import plan
    from tandem.operator.manifests import render
    from tandem.spec import InferenceService, Mode
    from tandem.spec_router import DisaggregationMode

    spec = _spec()
    spec.security.tls = spec.security.tls.model_validate(
        "off"
    )  # the backend would read the pod's certificates
    spec.router.disaggregation = spec.router.disaggregation.model_validate(
        {
            "mode": "conditional",
            "localPrefillMaxTokens": 96,
            "prefillQueueTokens": 3000,
            "localPrefillMaxTpotFraction": 0.75,
        }
    )
    (container,) = render.router_deployment(spec, "svc", "ns", "u")["spec"]["template"]["spec"]["containers"]
    local = plan(
        InferenceService(name="svc", spec=spec), Path("/srv"), port=9000, first_worker_port=9100, cpus=2
    )
    router = next(p for p in local if p.role == "router")
    for argv in (container["args"][1:], router.argv[router.argv.index("router") + 1 :]):
        args = build_parser().parse_args(argv)
        assert check_args(args) is None
        backend = build_backend(args)
        policy = backend.disaggregation
        assert (policy.mode, policy.local_prefill_max_tokens, policy.prefill_queue_tokens) == (
            DisaggregationMode.conditional,
            96,
            3000,
        )
        assert policy.local_prefill_max_tpot_fraction == 0.75
        assert backend.tpot_slo_s == spec.slo.tpot_ms / 1000  # the SLO the TPOT check measures against
    default = build_backend(build_parser().parse_args(launch.router_argv(_spec(), "svc", "/m")[1:]))
    assert default.disaggregation.mode is DisaggregationMode.always
    colocated = _spec().model_copy(update={"mode": Mode.colocated})
    colocated_args = build_parser().parse_args(launch.router_argv(colocated, "svc", "/m")[1:])
    assert (
        colocated_args.disaggregation == DisaggregationMode.always
    )  # the spec's disaggregation is not its business


def test_disaggregation_never_needs_only_decode_workers():
    args = build_parser().parse_args(
        ["--model-dir", "/m", "--served-name", "t", "--disaggregation", "never", "--decode", "b:2"]
    )
    assert check_args(args) is None
    assert "--prefill" in check_args(
        build_parser().parse_args(["--model-dir", "/m", "--served-name", "t", "--decode", "b:2"])
    )
    bad = build_parser().parse_args(
        ["--model-dir", "/m", "--served-name", "t", "--local-prefill-max-tokens", "-1"]
    )
    assert "must be >= 0" in check_args(bad)
