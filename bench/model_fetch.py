"""Model fetch for N pods: one shared cache folder (`tandem fetch-model`, what modelCache gives a node)
against a folder per pod with the file filter, and against the unfiltered per-pod download the operator used
before (`snapshot_download` of the whole repository), with the real `huggingface_hub` client against a local
server in the Hub's API shape whose bandwidth is capped (a node's share of the uplink).

    python bench/model_fetch.py [--pods 4] [--repeat 3] [--weights-mib 128] [--bandwidth-mib 256]

Each pod is a process started at once with the others; a mode's time runs from the start to the last pod's
exit (process start and the client's import included, as in an init container). The modes of one repeat run
one after another against one server; bytes are what the server sent. Figures: median [min-max] of --repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._smoke import add_smoke, smoke_sizes
from tandem.testing.fake_hub import FakeHub

REPO_ID = "org/bench"
MODES = ("single", "shared", "per-pod", "unfiltered")
UNFILTERED = (
    "from huggingface_hub import snapshot_download as s; import sys; s(sys.argv[1], local_dir=sys.argv[2])"
)


def repository(weights_mib: int) -> dict[str, bytes]:
    """A model repository as the Hub has them: safetensors weights and the same weights as a .bin copy."""
    weights = os.urandom(weights_mib << 20)
    return {
        "config.json": b'{"model_type": "llama"}',
        "generation_config.json": b"{}",
        "tokenizer.json": b"{}",
        "tokenizer_config.json": b"{}",
        "model.safetensors": weights,
        "pytorch_model.bin": weights[::-1],
        "README.md": b"# bench",
    }


def run_mode(mode: str, hub: FakeHub, pods: int, root: Path) -> tuple[float, int]:
    """(seconds until the last pod finished, bytes the server sent) for one mode."""
    env = {
        **os.environ,
        "HF_ENDPOINT": hub.endpoint,
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HOME": str(root / "hf-home"),
    }
    before = sum(hub.served.values())
    n = 1 if mode == "single" else pods
    commands = []
    for i in range(n):
        folder = root / mode / (REPO_ID if mode in ("single", "shared") else f"pod-{i}")
        if mode == "unfiltered":
            commands.append([sys.executable, "-c", UNFILTERED, REPO_ID, str(folder)])
        else:
            commands.append(
                [sys.executable, "-m", "tandem", "fetch-model", REPO_ID, "--dir", str(folder), "--report", ""]
            )
    started = time.monotonic()
    procs = [
        subprocess.Popen(c, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for c in commands
    ]
    for p in procs:
        _, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"{mode}: a fetch failed: {err[-2000:]}")
    return time.monotonic() - started, sum(hub.served.values()) - before


def fmt(values: list[float], unit: str = "s") -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}] {unit}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--weights-mib", type=int, default=128)
    ap.add_argument(
        "--bandwidth-mib", type=float, default=256.0, help="the server's cap, MiB/s, all pods together"
    )
    add_smoke(ap)
    args = smoke_sizes(ap.parse_args(), pods=2, repeat=1, weights_mib=1)
    results: dict[str, dict[str, list[float]]] = {m: {"seconds": [], "mib": []} for m in MODES}
    with FakeHub({REPO_ID: repository(args.weights_mib)}, bandwidth=args.bandwidth_mib * 2**20) as hub:
        for _ in range(args.repeat):
            root = Path(tempfile.mkdtemp(prefix="model-fetch-"))
            try:
                for mode in MODES:
                    seconds, sent = run_mode(mode, hub, args.pods, root)
                    results[mode]["seconds"].append(seconds)
                    results[mode]["mib"].append(sent / 2**20)
            finally:
                shutil.rmtree(root, ignore_errors=True)
    print(
        f"{args.weights_mib} MiB of safetensors (and a .bin copy), server capped at {args.bandwidth_mib:g} "
        f"MiB/s, {args.repeat} repeats, median [min-max]"
    )
    print(f"{'mode':<12} {'pods':>4}  {'time to the last pod':<28} {'served':<24}")
    for mode in MODES:
        n = 1 if mode == "single" else args.pods
        print(
            f"{mode:<12} {n:>4}  {fmt(results[mode]['seconds']):<28} {fmt(results[mode]['mib'], 'MiB'):<24}"
        )
    shared, single = results["shared"]["seconds"], results["single"]["seconds"]
    per_pod, unfiltered = results["per-pod"]["seconds"], results["unfiltered"]["seconds"]
    print(f"shared / single, per repeat: {fmt([a / b for a, b in zip(shared, single, strict=True)], 'x')}")
    print(
        "unfiltered / shared, per repeat: "
        f"{fmt([a / b for a, b in zip(unfiltered, shared, strict=True)], 'x')}"
    )
    print(f"per-pod / shared, per repeat: {fmt([a / b for a, b in zip(per_pod, shared, strict=True)], 'x')}")
    print(json.dumps({"args": vars(args), "results": results}))


if __name__ == "__main__":
    main()
