"""tandem's own GPU profile: `tandem profile` on a Llama-3.1-8B-shaped model, as a user would serve it, in
bf16 and FP8, each exported in Dynamo's profiler layout and set beside NVIDIA's vLLM profile.

    python -m bench.gpu_profile --out-dir OUT   # one GPU, about 4 minutes on an H200
    python -m bench.gpu_profile --dry-run       # the same steps on the CPU with a tiny model

The model is random weights at Llama-3.1-8B's shape (bench/_shapes.py; the engine's speed does not depend on
the values). Each variant runs as its own `tandem profile` process (a fresh device, and the command recorded
in the profile is the one that ran), with the serving knobs a GPU user runs: `--decode-step cudaGraphs`,
`--attention triton` (our kernel reading the paged cache in place), the KV cache planned as the worker plans
it, and `--quantization fp8` for the FP8 variant (on GPUs of compute capability 8.9 or more; elsewhere it is
skipped, saying so). Written under OUT:

- `tandem/profiles/<card>-llama-3.1-8b-<variant>-tandem.json`: the profiles, with their provenance (command,
  date, commit, torch, card, knobs, startup phases) and a cold start from the measured phases;
- `dynamo/<same name>/`: each exported for Dynamo's planner and mocker (`tandem profile export-dynamo`;
  replay with the harness's `--profile-dir`);
- `compare-<name>.md`: each beside NVIDIA's H200 vLLM profile (`tandem profile compare`), also printed;
- `gpu_profile.json`: what ran, each step's seconds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tandem.profile import DEFAULT_GPU_PROFILE

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {"bf16": "none", "fp8": "fp8"}  # variant -> --quantization (weights)
FP8_MIN_CAPABILITY = (8, 9)

# What a GPU run measures: NVIDIA's profile goes to 16k-token prompts and 13.5k contexts; these rows cover the
# Azure traces' bulk and the autoscaler's fit, within one H200's time budget.
GPU = {
    "prompt_lengths": "128,512,1024,2048,4096,8192",
    "batches": "1,8,32,64,128,256",
    "contexts": "512,2048,8192",
    "chunk": 2048,
    "max_running_sequences": 256,
    "max_model_len": 16384,
    "decode_steps": 6,
    "repeats": 2,
}
DRY = {
    "prompt_lengths": "16,64",
    "batches": "1,2,4",
    "contexts": "16,64",
    "chunk": 64,
    "max_running_sequences": 8,
    "max_model_len": 256,
    "decode_steps": 2,
    "repeats": 1,
}

# `tandem profile`'s flag for each knob, in command-line order (the chunk also caps a step's batched tokens)
KNOB_FLAGS = (
    ("--prompt-lengths", "prompt_lengths"),
    ("--chunks", "chunk"),
    ("--max-batch-tokens", "chunk"),
    ("--batches", "batches"),
    ("--contexts", "contexts"),
    ("--max-running-sequences", "max_running_sequences"),
    ("--max-model-len", "max_model_len"),
    ("--decode-steps", "decode_steps"),
    ("--repeats", "repeats"),
)


def card_slug(device_name: str) -> str:
    """`NVIDIA H200` -> `h200`; `NVIDIA H100 80GB HBM3` -> `h100`; the file name's card."""
    words = [w for w in device_name.lower().replace("nvidia", "").split() if w]
    return words[0] if words else "gpu"


def profile_name(card: str, variant: str) -> str:
    return f"{card}-llama-3.1-8b-{variant}-tandem"


def profile_argv(model: Path, out: Path, device: str, variant: str, knobs: dict[str, Any], a) -> list[str]:
    """The `tandem profile` command line of one variant."""
    return [
        "--model",
        str(model),
        "--model-name",
        "Llama-3.1-8B shape, random weights" if device == "cuda" else "tiny, random weights",
        "--device",
        device,
        "--dtype",
        "bfloat16" if device == "cuda" else "float32",
        "--quantization",
        VARIANTS[variant],
        "--attention",
        a.attention,
        "--decode-step",
        a.decode_step,
        *(arg for flag, knob in KNOB_FLAGS for arg in (flag, str(knobs[knob]))),
        *(["--num-kv-blocks", str(a.num_kv_blocks)] if a.num_kv_blocks else []),
        *(["--threads", str(a.threads)] if a.threads else []),
        "-o",
        str(out),
    ]


def knobs_for(a: argparse.Namespace) -> dict[str, Any]:
    """What a run measures: the GPU's or the dry run's rows, with the command line's overrides."""
    overrides = {k: getattr(a, k) for k in ("max_running_sequences", "max_model_len") if getattr(a, k)}
    return {**(DRY if a.dry_run else GPU), **overrides}


def fp8_missing(device: str) -> str | None:
    """Why FP8 weights cannot run here, or None."""
    import torch

    if device != "cuda":
        return "FP8 matmuls need a CUDA GPU of compute capability 8.9 or more"
    if torch.cuda.get_device_capability() < FP8_MIN_CAPABILITY:
        return f"{torch.cuda.get_device_name()} is below compute capability 8.9"
    return None


def _tandem(argv: list[str], timeout: float, echo: bool = True) -> tuple[int, float, str]:
    """`tandem profile ARGV` in its own process: exit status (124 past `timeout`), seconds, output."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tandem", "profile", *argv],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
        code, output = done.returncode, done.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout or ""
        code, output = 124, (out.decode(errors="replace") if isinstance(out, bytes) else out)
        output += f"\ntandem profile: stopped after {timeout:g} s (--timeout)\n"
    if echo:
        print(output, file=sys.stderr, end="")
    return code, time.monotonic() - started, output


def run(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    device = "cpu" if a.dry_run else "cuda"
    knobs = knobs_for(a)
    card = "cpu" if a.dry_run else card_slug(torch.cuda.get_device_name())
    out = a.out_dir
    (out / "tandem" / "profiles").mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"device": device, "card": card, "knobs": knobs, "variants": {}}
    with tempfile.TemporaryDirectory(prefix="tandem-gpu-profile-") as tmp:
        started = time.monotonic()
        model = a.model or _write_model(Path(tmp) / ("tiny" if a.dry_run else "llama-3.1-8b-shaped"), device)
        report["model_write_s"] = round(time.monotonic() - started, 1)
        for variant in a.variants:
            name = profile_name(card, variant)
            why = fp8_missing(device) if VARIANTS[variant] == "fp8" else None
            if why:
                report["variants"][variant] = {"skipped": why}
                print(f"{variant}: skipped: {why}", file=sys.stderr)
                continue
            path = out / "tandem" / "profiles" / f"{name}.json"
            argv = profile_argv(model, path, device, variant, knobs, a)
            code, seconds, log = _tandem(argv, a.timeout)
            entry: dict[str, Any] = {"argv": argv, "exit": code, "profile_s": round(seconds, 1)}
            report["variants"][variant] = entry
            if code != 0:
                entry["log_tail"] = log[-3000:]
                continue
            export = out / "dynamo" / name
            entry["export_exit"] = _tandem(["export-dynamo", str(path), "-o", str(export)], 120)[0]
            code, _, table = _tandem(["compare", DEFAULT_GPU_PROFILE, str(path)], 120, echo=False)
            if code == 0:
                (out / f"compare-{name}.md").write_text(table)
                print(f"\n### {name} beside NVIDIA's vLLM profile\n\n{table.strip()}")
    return report


def variant_outcome(entry: dict[str, Any]) -> str:
    if "skipped" in entry:
        return "skipped"
    return "ok" if entry.get("exit") == 0 and entry.get("export_exit") == 0 else "failed"


def summary(report: dict[str, Any], out: Path) -> str:
    """One line per variant: written (with its profile's seconds), skipped (why) or failed."""
    lines = [f"model written in {report['model_write_s']} s"]
    for variant, entry in report["variants"].items():
        outcome = variant_outcome(entry)
        detail = entry["skipped"] if outcome == "skipped" else f"{entry.get('profile_s')} s"
        lines.append(f"{variant}: {outcome} ({detail})")
    return f"profiles under {out}: " + "; ".join(lines)


def _write_model(model_dir: Path, device: str) -> Path:
    if device == "cuda":
        from bench._shapes import write_llama_8b_shaped

        return write_llama_8b_shaped(model_dir, device="cuda")
    from tandem.worker.devtools.tiny import TinySpec, create_tiny_model

    return create_tiny_model(model_dir, TinySpec(layers=2))


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_profile", description=__doc__.splitlines()[0])
    p.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="where the profiles and exports go (default: bench/out/gpu_profile; dry run: a temporary one)",
    )
    p.add_argument("--variants", default="bf16,fp8", help="bf16, fp8 (weights), in this order")
    p.add_argument("--attention", default=None, help="default: triton on a GPU, sdpa on the CPU")
    p.add_argument("--decode-step", default=None, help="default: cudaGraphs on a GPU, eager on the CPU")
    p.add_argument("--model", type=Path, default=None, help="an existing model directory to profile instead")
    p.add_argument("--num-kv-blocks", type=int, default=None, help="default: planned as the worker plans it")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads of each profile")
    p.add_argument("--timeout", type=float, default=420.0, help="seconds one variant's profile may take")
    p.add_argument(
        "--max-running-sequences",
        type=int,
        default=None,
        help=f"the batch cap (default {GPU['max_running_sequences']}; with --max-model-len it sets how many "
        "decode graphs warm-up captures)",
    )
    p.add_argument("--max-model-len", type=int, default=None, help=f"default {GPU['max_model_len']}")
    p.add_argument(
        "--dry-run", action="store_true", help="the same steps on the CPU with a tiny model: checks the code"
    )
    a = p.parse_args(argv)
    a.variants = [v for v in a.variants.split(",") if v]
    unknown = set(a.variants) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    a.attention = a.attention or ("sdpa" if a.dry_run else "triton")
    a.decode_step = a.decode_step or ("eager" if a.dry_run else "cudaGraphs")
    if a.dry_run:
        a.num_kv_blocks, a.threads = a.num_kv_blocks or 64, a.threads or 1
    return a


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    if not a.dry_run:
        import torch

        if not torch.cuda.is_available():
            print("bench/gpu_profile.py needs a CUDA GPU; --dry-run runs it on the CPU", file=sys.stderr)
            return 2
    if a.out_dir is None and a.dry_run:
        with tempfile.TemporaryDirectory(prefix="tandem-gpu-profile-dry-") as tmp:
            a.out_dir = Path(tmp)
            return finish(a)
    a.out_dir = a.out_dir or ROOT / "bench" / "out" / "gpu_profile"
    return finish(a)


def finish(a: argparse.Namespace) -> int:
    report = run(a)
    (a.out_dir / "gpu_profile.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    print("\n" + summary(report, a.out_dir))
    outcomes = [variant_outcome(v) for v in report["variants"].values()]
    return 0 if "ok" in outcomes and "failed" not in outcomes else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
