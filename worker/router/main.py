"""`tandem router`: load the tokenizer, build the worker-pool backend, serve the OpenAI API with uvicorn."""

from __future__ import annotations

import argparse
import logging
import sys

from tandem.options import RouterOptions
from tandem.spec_router import DisaggregationMode
from tandem.worker.router.limits import RequestLimits


def build_parser() -> argparse.ArgumentParser:
    return RouterOptions.parser()


def check_args(args: RouterOptions | argparse.Namespace) -> str | None:
    """Why the worker addresses cannot serve the mode, or None when they can."""
    if args.max_queued < 1:
        return "--max-queued must be >= 1"
    if args.max_held < 0 or args.hold_timeout <= 0:
        return "--max-held must be >= 0 and --hold-timeout positive"
    if args.kv_lease_ms < 1:
        return "--kv-lease-ms must be >= 1"
    if args.max_body_bytes < 1 or args.body_timeout <= 0:
        return "--max-body-bytes and --body-timeout must be positive"
    if args.max_connections < 1 or args.header_timeout <= 0 or args.keep_alive_timeout <= 0:
        return "--max-connections, --header-timeout and --keep-alive-timeout must be positive"
    if args.local_prefill_max_tokens < 0 or args.prefill_queue_tokens < 0:
        return "--local-prefill-max-tokens and --prefill-queue-tokens must be >= 0"
    if not 0 <= args.local_prefill_max_tpot_fraction <= 1 or not 0 <= args.mixed_decode_ratio <= 1:
        return "--local-prefill-max-tpot-fraction and --mixed-decode-ratio must be in [0, 1]"
    if args.workers_file:
        return None  # the file names the workers, possibly later
    if args.mode == "disaggregated" and args.disaggregation == DisaggregationMode.never and not args.decode:
        return "disaggregation never needs --decode addresses (or --workers-file)"
    if (
        args.mode == "disaggregated"
        and args.disaggregation != DisaggregationMode.never
        and not (args.prefill and args.decode)
    ):
        return "disaggregated mode needs --prefill and --decode addresses (or --workers-file)"
    if args.mode == "colocated" and not args.colocated:
        return "colocated mode needs --colocated addresses (or --workers-file)"
    return None


def main(argv: list[str] | None = None) -> int:
    args = RouterOptions.from_argv(sys.argv[1:] if argv is None else argv)
    problem = check_args(args)
    if problem:
        print(f"tandem router: {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    import uvicorn

    from tandem.slo import Slo
    from tandem.worker.hf.config import ModelConfig, ModelLoadError, served_context_length
    from tandem.worker.hf.tokenizer import Tokenizer
    from tandem.worker.router.app import create_app
    from tandem.worker.router.auth import ApiKeys
    from tandem.worker.router.backend_args import build_backend
    from tandem.worker.router.http_server import ServerLimits, uvicorn_config

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
        slo=Slo(args.slo_ttft_ms, args.slo_tpot_ms, args.slo_percentile),
        api_keys=api_keys,
        protect_metrics=args.protect_metrics,
        public_metrics=args.public_metrics or not args.metrics_port,
        docs=args.docs,
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
