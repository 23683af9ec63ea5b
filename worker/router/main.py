"""`tandem router`: load the tokenizer, build the worker-pool backend, serve the OpenAI API with uvicorn."""

from __future__ import annotations

import argparse
import logging
import sys

from tandem.names import HTTP_PORT
from tandem.spec import DisaggregationMode, DisaggregationSpec
from tandem.worker.kv_transport.handshake import DEFAULT_LEASE_MS
from tandem.worker.router.http_server import (
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_KEEP_ALIVE_S,
    DEFAULT_MAX_CONNECTIONS,
)
from tandem.worker.router.limits import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES, RequestLimits

MODES = ("disaggregated", "colocated")


def _addresses(value: str) -> list[str]:
    """`host:port[,host:port...]` -> a list, empty entries dropped."""
    return [a.strip() for a in value.split(",") if a.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tandem router", description="OpenAI-compatible router for tandem workers"
    )
    p.add_argument("--model-dir", required=True, help="Hugging Face model directory (tokenizer, config)")
    p.add_argument("--served-name", required=True, help="the model name clients send")
    p.add_argument("--service", default="default", help="InferenceService name (metric label)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=HTTP_PORT)
    p.add_argument("--mode", choices=MODES, default="disaggregated")
    p.add_argument(
        "--disaggregation", choices=[m.value for m in DisaggregationMode], default=DisaggregationMode.always.value,
        help="disaggregated mode: every prompt on the prefill pool (always), on its decode worker (never), or by "
        "prompt length and prefill queue (conditional)",
    )  # fmt: skip
    p.add_argument(
        "--local-prefill-max-tokens", type=int, default=DisaggregationSpec().local_prefill_max_tokens,
        help="conditional: prompts of at most this many uncached tokens are prefilled on the decode worker",
    )  # fmt: skip
    p.add_argument(
        "--prefill-queue-tokens", type=int, default=DisaggregationSpec().prefill_queue_tokens,
        help="conditional: past this many queued prompt tokens on every prefill worker, prefill on a decode "
        "worker with room",
    )  # fmt: skip
    p.add_argument(
        "--local-prefill-max-tpot-fraction", type=float,
        default=DisaggregationSpec().local_prefill_max_tpot_fraction,
        help="conditional: no local prefill on a decode worker whose streams' recent TPOT is above this "
        "fraction of --slo-tpot-ms (0: no check)",
    )  # fmt: skip
    p.add_argument("--prefill", type=_addresses, default=[], help="prefill worker addresses, comma-separated")
    p.add_argument("--decode", type=_addresses, default=[], help="decode worker addresses, comma-separated")
    p.add_argument(
        "--colocated", type=_addresses, default=[], help="colocated worker addresses, comma-separated"
    )
    p.add_argument(
        "--workers-file",
        default=None,
        help='JSON {"prefill": [...], "decode": [...], "colocated": [...]}, re-read as it changes',
    )
    p.add_argument("--metrics-port", type=int, default=0, help="also serve /metrics on this port (0: off)")
    p.add_argument("--max-queued", type=int, default=256, help="requests in flight before answering 429")
    p.add_argument(
        "--kv-lease-ms", type=int, default=DEFAULT_LEASE_MS,
        help="how long a decode worker keeps blocks reserved for a KV transfer that has not completed",
    )  # fmt: skip
    p.add_argument(
        "--max-model-len", type=int, default=None,
        help="context length the workers serve (their --max-model-len); default: the model's positions",
    )  # fmt: skip
    p.add_argument(
        "--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="larger request bodies get 413"
    )
    p.add_argument(
        "--body-timeout", type=float, default=DEFAULT_BODY_TIMEOUT_S,
        help="seconds a client may take to send its request body before 408",
    )  # fmt: skip
    p.add_argument(
        "--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
        help="open HTTP connections; past it a request gets 503 with Retry-After",
    )  # fmt: skip
    p.add_argument(
        "--header-timeout", type=float, default=DEFAULT_HEADER_TIMEOUT_S,
        help="seconds a connection may take to send a request's headers before it is closed",
    )  # fmt: skip
    p.add_argument(
        "--keep-alive-timeout", type=float, default=DEFAULT_KEEP_ALIVE_S,
        help="seconds an idle kept-alive connection stays open",
    )  # fmt: skip
    p.add_argument("--slo-ttft-ms", type=float, default=500, help="TTFT target each request is judged against")
    p.add_argument("--slo-tpot-ms", type=float, default=50, help="TPOT target each request is judged against")
    p.add_argument("--slo-percentile", type=float, default=90, help="percent of requests that must meet the targets")
    p.add_argument("--api-keys-file", default=None, help="require Authorization: Bearer <key>; keys one per line")
    p.add_argument(
        "--api-keys-env", default=None, help="require Authorization: Bearer <key>; keys in this environment variable"
    )
    p.add_argument("--protect-metrics", action="store_true", help="/metrics also needs an API key")
    p.add_argument("--tls-dir", default=None, help="mutual TLS to the workers: tls.crt, tls.key, ca.crt")
    p.add_argument("--tls-server-name", default=None, help="name in the workers' certificates (dialled by IP)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p


def check_args(args: argparse.Namespace) -> str | None:
    """Why the worker addresses cannot serve the mode, or None when they can."""
    if args.max_queued < 1:
        return "--max-queued must be >= 1"
    if args.kv_lease_ms < 1:
        return "--kv-lease-ms must be >= 1"
    if args.max_body_bytes < 1 or args.body_timeout <= 0:
        return "--max-body-bytes and --body-timeout must be positive"
    if args.max_connections < 1 or args.header_timeout <= 0 or args.keep_alive_timeout <= 0:
        return "--max-connections, --header-timeout and --keep-alive-timeout must be positive"
    if args.local_prefill_max_tokens < 0 or args.prefill_queue_tokens < 0:
        return "--local-prefill-max-tokens and --prefill-queue-tokens must be >= 0"
    if not 0 <= args.local_prefill_max_tpot_fraction <= 1:
        return "--local-prefill-max-tpot-fraction must be in [0, 1]"
    if args.workers_file:
        return None  # the file names the workers, possibly later
    if args.mode == "disaggregated" and args.disaggregation == DisaggregationMode.never and not args.decode:
        return "disaggregation never needs --decode addresses (or --workers-file)"
    if args.mode == "disaggregated" and args.disaggregation != DisaggregationMode.never and not (
        args.prefill and args.decode
    ):
        return "disaggregated mode needs --prefill and --decode addresses (or --workers-file)"
    if args.mode == "colocated" and not args.colocated:
        return "colocated mode needs --colocated addresses (or --workers-file)"
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    problem = check_args(args)
    if problem:
        print(f"tandem router: {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    import uvicorn

    from tandem.worker.hf.config import ModelConfig, ModelLoadError, served_context_length
    from tandem.worker.hf.tokenizer import Tokenizer
    from tandem.worker.router.app import create_app
    from tandem.worker.router.auth import ApiKeys
    from tandem.worker.router.dispatch import build_backend
    from tandem.worker.router.http_server import ServerLimits, uvicorn_config
    from tandem.worker.router.metrics import Slo

    try:
        api_keys = ApiKeys.from_sources(args.api_keys_file, args.api_keys_env)
    except (OSError, ValueError) as e:
        print(f"tandem router: API keys: {e}", file=sys.stderr)
        return 2
    try:
        tokenizer = Tokenizer.from_dir(args.model_dir)
        positions = ModelConfig.from_dir(args.model_dir).max_position_embeddings
        max_model_len = served_context_length(positions, args.max_model_len)
    except ModelLoadError as e:
        print(f"tandem router: {e}", file=sys.stderr)
        return 2
    app = create_app(
        build_backend(args),
        tokenizer,
        args.served_name,
        service_name=args.service,
        max_queued_requests=args.max_queued,
        max_model_len=max_model_len,
        limits=RequestLimits(args.max_body_bytes, args.body_timeout),
        slo=Slo(args.slo_ttft_ms / 1000, args.slo_tpot_ms / 1000, args.slo_percentile / 100),
        api_keys=api_keys,
        protect_metrics=args.protect_metrics,
    )
    if args.metrics_port:
        from tandem.worker.api.metrics_http import serve_metrics

        serve_metrics(args.metrics_port, args.host, app.state.metrics.registry)
    print(f"tandem router: serving {args.served_name!r} on http://{args.host}:{args.port}/v1", flush=True)
    limits = ServerLimits(args.max_connections, args.header_timeout, args.keep_alive_timeout)
    uvicorn.Server(uvicorn_config(app, args.host, args.port, limits, args.log_level)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
