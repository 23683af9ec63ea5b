"""`tandem model ...`: model tools; `create-tiny` writes a small random model in Hugging Face format."""

from __future__ import annotations

import argparse
import re

from tandem.worker.devtools.tiny import TINY_ARCHITECTURES, TinySpec, create_tiny_model

_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_size(text: str) -> int:
    """`4096`, `500KB`, `2MiB`, `1GB` -> bytes."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 4096, 500KB, 2MiB)")
    size = int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
    if size <= 0:
        raise argparse.ArgumentTypeError("size must be positive")
    return size


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem model", description="Model tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    tiny = sub.add_parser("create-tiny", help="write a small random-initialised model in Hugging Face format")
    d = TinySpec()
    tiny.add_argument("dir", help="output directory (created if missing)")
    tiny.add_argument("--seed", type=int, default=d.seed)
    tiny.add_argument("--arch", choices=list(TINY_ARCHITECTURES), default=d.arch)
    tiny.add_argument("--layers", type=int, default=d.layers)
    tiny.add_argument("--hidden", type=int, default=d.hidden)
    tiny.add_argument("--heads", type=int, default=d.heads)
    tiny.add_argument("--kv-heads", type=int, default=d.kv_heads)
    tiny.add_argument("--intermediate", type=int, default=d.intermediate)
    tiny.add_argument(
        "--experts", type=int, default=d.experts, help="mixtral, qwen2_moe: routed experts per layer"
    )
    tiny.add_argument(
        "--experts-per-token", type=int, default=d.experts_per_token, help="mixtral, qwen2_moe: top k"
    )
    tiny.add_argument("--max-positions", type=int, default=d.max_positions)
    tiny.add_argument("--tie-embeddings", action="store_true", help="share lm_head with embed_tokens")
    tiny.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default=d.dtype)
    tiny.add_argument("--shard-size", type=parse_size, default=None, help="write shards of at most this size")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "create-tiny":
        spec = TinySpec(
            layers=args.layers,
            hidden=args.hidden,
            heads=args.heads,
            kv_heads=args.kv_heads,
            intermediate=args.intermediate,
            max_positions=args.max_positions,
            arch=args.arch,
            experts=args.experts,
            experts_per_token=args.experts_per_token,
            tie_embeddings=args.tie_embeddings,
            seed=args.seed,
            dtype=args.dtype,
        )
        try:
            path = create_tiny_model(args.dir, spec, shard_size=args.shard_size)
        except ValueError as e:
            print(f"tandem model create-tiny: {e}")
            return 2
        print(
            f"wrote {spec.arch} model ({spec.layers} layers, hidden {spec.hidden}, seed {spec.seed}) to "
            f"{path}"
        )
    return 0
