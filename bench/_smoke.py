"""Every bench's `--smoke`: tiny sizes that run it end to end in seconds on a CPU, so that a bench that stops
running fails CI (tests/integration/test_bench_smoke.py runs each one); a smoke run measures nothing."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

HELP = "tiny sizes, seconds on a CPU: checks that the bench runs end to end; measures nothing"


def add_smoke(p: argparse.ArgumentParser) -> None:
    p.add_argument("--smoke", action="store_true", help=HELP)


def smoke_sizes(args: argparse.Namespace, **sizes: Any) -> argparse.Namespace:
    """With `--smoke`, `sizes` replace the parsed values (by argparse dest)."""
    if args.smoke:
        for name, value in sizes.items():
            setattr(args, name, value)
    return args


def write_tiny_trace(path: Path, rows: int = 40, gap_s: float = 0.3) -> Path:
    """An Azure-format trace (TIMESTAMP,ContextTokens,GeneratedTokens): a request every `gap_s`, prompts of
    20-200 tokens, outputs of 4-40."""
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(rows):
        lines.append(f"2023-11-16 18:15:{i * gap_s + 10:010.7f},{20 + 37 * i % 180},{4 + 11 * i % 36}")
    path.write_text("\n".join(lines) + "\n")
    return path
